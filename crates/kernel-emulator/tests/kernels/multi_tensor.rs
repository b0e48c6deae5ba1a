//! `multi_tensor.cu`: tables of host addresses stand in for device ones.

use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Grid, Shared};

use crate::*;

/// A small chunk, so that the 5-, 3001- and 70000-element tensors make
/// many blocks and chunks end inside and at the end of a tensor.
const CHUNK: u64 = 1024;
const SIZES: [usize; 3] = [5, 3001, 70000];

/// The `chunks` table: (tensor, first element) per block.
fn chunks(sizes: &[usize]) -> Vec<u64> {
    let mut c = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        for start in (0..n as u64).step_by(CHUNK as usize) {
            c.extend([k as u64, start]);
        }
    }
    c
}

fn grid(chunks: &[u64]) -> Grid {
    Grid::linear((chunks.len() / 2) as u32, 256)
}

#[test]
fn sum_of_squares_and_scaling_cover_every_element_once() {
    let mut gs: Vec<Vec<f32>> = SIZES
        .iter()
        .enumerate()
        .map(|(k, &n)| random(n, 2.0, 20 + k as u64))
        .collect();
    let want: f64 = gs
        .iter()
        .flatten()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum();
    let before = gs.clone();
    let mut table: Vec<u64> = gs
        .iter_mut()
        .flat_map(|g| [g.as_mut_ptr() as u64, g.len() as u64])
        .collect();
    let mut ch = chunks(&SIZES);
    let mut partial = vec![f32::NAN; ch.len() / 2];
    let (tp, cp, pp) = (
        Shared::of(&mut table),
        Shared::of(&mut ch),
        Shared::of(&mut partial),
    );
    // SAFETY: the table's addresses cover each tensor's n values.
    unsafe {
        launch(grid(&ch), || {
            multi_sum_squares_f32(tp.ptr(), cp.ptr(), CHUNK, pp.ptr())
        })
    }
    .unwrap();
    let got: f64 = partial.iter().map(|&p| f64::from(p)).sum();
    assert_close("Σ g²", &[got], &[want], 1e-6);

    unsafe {
        launch(grid(&ch), || {
            multi_scale_f32(tp.ptr(), cp.ptr(), CHUNK, 0.25)
        })
    }
    .unwrap();
    for (g, g0) in gs.iter().zip(&before) {
        let want: Vec<f64> = g0.iter().map(|&x| f64::from(x) * 0.25).collect();
        assert_close("scaled g", &f64s(g), &want, 1e-7);
    }
}

#[test]
fn adamw_updates_every_tensor_in_one_launch() {
    let (lr, b1, b2, eps, wd) = (1e-2f32, 0.9f32, 0.999f32, 1e-8f32, 0.1f32);
    let (bc1, bc2) = (1.0 - b1.powi(2), 1.0 - b2.powi(2));
    let keep = 1.0 - lr * wd;
    let mut bufs: Vec<[Vec<f32>; 4]> = SIZES
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let s = 30 + 4 * k as u64;
            let v = random(n, 0.1, s + 3).iter().map(|x| x.abs()).collect();
            [
                random(n, 1.0, s),
                random(n, 0.5, s + 1),
                random(n, 0.1, s + 2),
                v,
            ]
        })
        .collect();
    let before = bufs.clone();
    let mut table: Vec<u64> = bufs
        .iter_mut()
        .flat_map(|[t, g, m, v]| {
            let n = t.len() as u64;
            [
                t.as_mut_ptr() as u64,
                g.as_mut_ptr() as u64,
                m.as_mut_ptr() as u64,
                v.as_mut_ptr() as u64,
                n,
            ]
        })
        .collect();
    let mut ch = chunks(&SIZES);
    let (tp, cp) = (Shared::of(&mut table), Shared::of(&mut ch));
    // SAFETY: each row's four addresses cover its n values.
    unsafe {
        launch(grid(&ch), || {
            multi_adamw_f32(tp.ptr(), cp.ptr(), CHUNK, lr, b1, b2, eps, keep, bc1, bc2)
        })
    }
    .unwrap();
    let f = f64::from;
    for ([t, _, m, v], [t0, g, m0, v0]) in bufs.iter().zip(&before) {
        for i in 0..t.len() {
            let gi = f(g[i]);
            let mw = f(m0[i]) * f(b1) + gi * (1.0 - f(b1));
            let vw = f(v0[i]) * f(b2) + gi * gi * (1.0 - f(b2));
            let tw = f(t0[i]) * f(keep) - f(lr) * (mw / f(bc1)) / ((vw / f(bc2)).sqrt() + f(eps));
            assert_close("θ", &[f(t[i])], &[tw], 1e-5);
            assert_close("m", &[f(m[i])], &[mw], 1e-6);
            assert_close("v", &[f(v[i])], &[vw], 1e-6);
        }
    }
}

#[test]
fn adamw_in_bf16_computes_in_f32_and_rounds_each_stored_value_once() {
    let n = 2500;
    let (lr, b1, b2, eps) = (1e-3f32, 0.9f32, 0.999f32, 1e-8f32);
    let (t0, g, m0) = (
        to_bf16(&random(n, 1.0, 40)),
        to_bf16(&random(n, 0.5, 41)),
        to_bf16(&random(n, 0.1, 42)),
    );
    let v0 = to_bf16(
        &random(n, 0.1, 43)
            .iter()
            .map(|x| x.abs())
            .collect::<Vec<_>>(),
    );
    let (mut t, mut gg, mut m, mut v) = (t0.clone(), g.clone(), m0.clone(), v0.clone());
    let mut table = vec![
        t.as_mut_ptr() as u64,
        gg.as_mut_ptr() as u64,
        m.as_mut_ptr() as u64,
        v.as_mut_ptr() as u64,
        n as u64,
    ];
    let mut ch = chunks(&[n]);
    let (tp, cp) = (Shared::of(&mut table), Shared::of(&mut ch));
    // SAFETY: the four addresses cover n values each.
    unsafe {
        launch(grid(&ch), || {
            multi_adamw_bf16(tp.ptr(), cp.ptr(), CHUNK, lr, b1, b2, eps, 1.0, 0.1, 0.001)
        })
    }
    .unwrap();
    for i in 0..n {
        let gi = g[i].to_f32();
        let mw = m0[i].to_f32() * b1 + gi * (1.0 - b1);
        let vw = v0[i].to_f32() * b2 + gi * gi * (1.0 - b2);
        let tw = t0[i].to_f32() - (mw / 0.1) / ((vw / 0.001).sqrt() + eps) * lr;
        // The kernel's f32 result, stored once to bf16.
        assert_eq!(m[i], bf16::from_f32(mw), "m[{i}]");
        assert_eq!(v[i], bf16::from_f32(vw), "v[{i}]");
        assert_eq!(t[i], bf16::from_f32(tw), "θ[{i}]");
    }
}
