use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{bf16, launch, Grid, Shared};

use crate::*;

/// Token ids with repeats (a prompt shared across a batch) and an id that
/// appears once, over a table of `v` rows.
fn ids(n: usize, v: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| if i % 7 == 3 { v - 1 } else { (i * 5) % 11 })
        .collect()
}

/// Σ of g's rows per id, in f64: the gradient of the gather.
fn scatter_sum(ids: &[u32], g: &[f64], v: usize, d: usize) -> Vec<f64> {
    let mut dw = vec![0f64; v * d];
    for (k, &id) in ids.iter().enumerate() {
        for c in 0..d {
            dw[id as usize * d + c] += g[k * d + c];
        }
    }
    dw
}

/// Both f32 kernels on a table `w` of `v` rows of `d`: the gathered rows
/// (a grid of 3 × 64, strided) and the table's gradient from `g` (one
/// block of 32 per token, so d > 32 has each thread sum several columns).
fn run_f32(
    w: &mut [f32],
    tokens: &mut [u32],
    g: &mut [f32],
    v: usize,
    d: usize,
) -> (Vec<f32>, Vec<f32>) {
    let n = tokens.len();
    let (mut out, mut dw) = (vec![f32::NAN; n * d], vec![0f32; v * d]);
    let (wp, ip, gp, op, dp) = (
        Shared::of(w),
        Shared::of(tokens),
        Shared::of(g),
        Shared::of(&mut out),
        Shared::of(&mut dw),
    );
    let (n32, d32, v32) = (n as u32, d as u32, v as u32);
    // SAFETY: w holds v·d values, out and g n·d, dw v·d (zeroed), ids n.
    unsafe {
        launch(Grid::linear(3, 64), || {
            embedding_fwd_f32(wp.ptr(), ip.ptr(), op.ptr(), n as u64, d32, v32)
        })
    }
    .unwrap();
    unsafe {
        launch(Grid::linear(n32, 32), || {
            embedding_bwd_f32(ip.ptr(), gp.ptr(), dp.ptr(), n32, d32, v32)
        })
    }
    .unwrap();
    (out, dw)
}

#[test]
fn embedding_gathers_rows_and_sums_their_gradient_per_id() {
    // d past one block's width: each thread sums several columns.
    let (v, d, n) = (40usize, 70usize, 50usize);
    let mut w = random(v * d, 1.0, 41);
    let mut tokens = ids(n, v as u32);
    let mut g = random(n * d, 1.0, 42);
    let (out, dw) = run_f32(&mut w, &mut tokens, &mut g, v, d);
    let want_out: Vec<f64> = (0..n * d)
        .map(|i| f64::from(w[tokens[i / d] as usize * d + i % d]))
        .collect();
    assert_close("embedding rows", &f64s(&out), &want_out, 0.0);
    let want_dw = scatter_sum(&tokens, &f64s(&g), v, d);
    assert_close("embedding gradient", &f64s(&dw), &want_dw, 1e-6);
}

#[test]
fn embedding_gradient_in_bf16_rounds_once_per_row() {
    // One id repeated 64 times: a bf16 running sum would round at every
    // term, the kernel's f32 sum rounds once.
    let (v, d, n) = (4usize, 32usize, 64usize);
    let mut tokens = vec![2u32; n];
    let mut g = to_bf16(&random(n * d, 1.0, 43));
    let mut dw = vec![bf16::ZERO; v * d];
    let (ip, gp, dp) = (
        Shared::of(&mut tokens),
        Shared::of(&mut g),
        Shared::of(&mut dw),
    );
    // SAFETY: ids and g cover n tokens, dw v·d zeroed values.
    unsafe {
        launch(Grid::linear(n as u32, 32), || {
            embedding_bwd_bf16(ip.ptr(), gp.ptr(), dp.ptr(), n as u32, d as u32, v as u32)
        })
    }
    .unwrap();
    let want = scatter_sum(&tokens, &bf16_f64(&g), v, d);
    let got = bf16_f64(&dw);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        // Half a bf16 step of the result (its f32 sum is exact enough).
        assert!(
            (a - b).abs() <= b.abs() / 256.0 + 1e-6,
            "dw[{i}]: {a} against {b}"
        );
    }
    // Rows of ids no token has stay zero.
    assert!(got[..2 * d].iter().chain(&got[3 * d..]).all(|&x| x == 0.0));
}

#[test]
fn an_id_past_the_table_reads_as_nan_and_adds_no_gradient() {
    let (v, d) = (3usize, 32usize);
    let mut w = random(v * d, 1.0, 44);
    let mut tokens = vec![1u32, 7];
    let mut g = random(2 * d, 1.0, 45);
    let (out, dw) = run_f32(&mut w, &mut tokens, &mut g, v, d);
    assert!(out[..d].iter().zip(&w[d..2 * d]).all(|(a, b)| a == b));
    assert!(out[d..].iter().all(|x| x.is_nan()));
    assert!(dw[d..2 * d].iter().zip(&g[..d]).all(|(a, b)| a == b));
    assert!(dw[..d].iter().chain(&dw[2 * d..]).all(|&x| x == 0.0));
}
