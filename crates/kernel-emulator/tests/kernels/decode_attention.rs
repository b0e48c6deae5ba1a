use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{bf16, launch, Grid, Shared};

use crate::*;

/// One decode step's attention in f64: query (b, h) over keys
/// `pads[b] ..= min(last, cap - 1)` of kv head h / (heads / kv), zeros
/// where there are none; `[B, heads, hd]`.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (b, heads, kv, cap, hd): (usize, usize, usize, usize, usize),
    pads: &[u32],
    last: u32,
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; b * heads * hd];
    for bi in 0..b {
        for h in 0..heads {
            let g = h / (heads / kv);
            let lo = pads.get(bi).map_or(0, |&p| p as usize);
            let keys: Vec<usize> = (lo..=(last as usize).min(cap - 1)).collect();
            if keys.is_empty() {
                continue;
            }
            let row = |j: usize| ((bi * kv + g) * cap + j) * hd;
            let qi = (bi * heads + h) * hd;
            let s: Vec<f64> = keys
                .iter()
                .map(|&j| scale * (0..hd).map(|c| q[qi + c] * k[row(j) + c]).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (n, &j) in keys.iter().enumerate() {
                let p = (s[n] - m).exp() / total;
                for c in 0..hd {
                    out[qi + c] += p * v[row(j) + c];
                }
            }
        }
    }
    out
}

/// q `[B, heads, hd]` as the kernel reads it with a bias `[heads, hd]` and
/// tables `[B, hd]` (cos, then sin): biased, then rotated, in f64.
fn prepared_q(
    q: &[f64],
    bias: &[f64],
    cs: &[f64],
    (b, heads, hd): (usize, usize, usize),
) -> Vec<f64> {
    let half = hd / 2;
    let mut out = q.to_vec();
    for bi in 0..b {
        for h in 0..heads {
            let row = &mut out[(bi * heads + h) * hd..][..hd];
            for (c, x) in row.iter_mut().enumerate() {
                *x += bias[h * hd + c];
            }
            for j in 0..half {
                let (co, si) = (cs[bi * hd + j], cs[bi * hd + half + j]);
                let (a, e) = (row[j], row[half + j]);
                row[j] = a * co - e * si;
                row[half + j] = e * co + a * si;
            }
        }
    }
    out
}

/// The kernel's signature, in either storage type.
type Kernel<T> = unsafe extern "C" fn(
    *const T,
    *const T,
    *const T,
    *mut T,
    *const u32,
    i32,
    *const u32,
    i32,
    i32,
    i32,
    i32,
    f32,
    *const T,
    *const T,
    i32,
);

/// q's bias and rotary tables for a launch that prepares q (flags 3).
struct QueryPrep<T> {
    bias: Vec<T>,
    cs: Vec<T>,
}

/// One launch of `kernel` on `q, k, v` (a block of 8 warps per head and
/// batch element), returning its output (`nan` wherever it wrote nothing).
#[allow(clippy::too_many_arguments)]
fn run<T: Copy>(
    kernel: Kernel<T>,
    nan: T,
    [mut q, mut k, mut v]: [Vec<T>; 3],
    prep: Option<QueryPrep<T>>,
    (b, heads, kv, cap, hd): (usize, usize, usize, usize, usize),
    pads: &[u32],
    last: u32,
    scale: f32,
) -> Vec<T> {
    let flags = if prep.is_some() { 3 } else { 0 };
    let (mut bias, mut cs) = match prep {
        Some(p) => (p.bias, p.cs),
        None => (vec![nan], vec![nan]),
    };
    let (bp, cp) = (Shared::of(&mut bias), Shared::of(&mut cs));
    let mut out = vec![nan; b * heads * hd];
    let (mut pads, mut last) = (pads.to_vec(), vec![last]);
    let (qp, kp, vp, op) = (
        Shared::of(&mut q),
        Shared::of(&mut k),
        Shared::of(&mut v),
        Shared::of(&mut out),
    );
    let (pp, lp) = (Shared::of(&mut pads), Shared::of(&mut last));
    let grid = Grid {
        grid: [heads as u32, b as u32, 1],
        block: [256, 1, 1],
    };
    let n_pads = pads.len() as i32;
    // SAFETY: q and out hold B·heads·hd values, k and v B·kv·cap·hd, pads
    // B (or none), last 1.
    unsafe {
        launch(grid, || {
            kernel(
                qp.ptr(),
                kp.ptr(),
                vp.ptr(),
                op.ptr(),
                pp.ptr(),
                n_pads,
                lp.ptr(),
                heads as i32,
                kv as i32,
                cap as i32,
                hd as i32,
                scale,
                bp.ptr(),
                cp.ptr(),
                flags,
            )
        })
        .unwrap();
    }
    out
}

/// Runs the f32 or bf16 kernel (`bf16`) on random inputs and checks it;
/// with `prepare`, q comes raw with a bias and rotary tables to apply.
fn check(
    dims: (usize, usize, usize, usize, usize),
    pads: &[u32],
    last: u32,
    bf16: bool,
    prepare: bool,
) {
    let (b, heads, kv, cap, hd) = dims;
    let scale = 0.125f32;
    let (q, k, v) = (
        random(b * heads * hd, 2.0, 1),
        random(b * kv * cap * hd, 2.0, 2),
        random(b * kv * cap * hd, 2.0, 3),
    );
    let bias = random(heads * hd, 1.0, 4);
    // Each row's own position's angles: cos, then sin.
    let cs: Vec<f32> = (0..b)
        .flat_map(|bi| {
            let angles: Vec<f64> = (0..hd / 2)
                .map(|j| (37 + 11 * bi) as f64 / 10_000f64.powf(2.0 * j as f64 / hd as f64))
                .collect();
            let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
            let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
            [cos, sin].concat()
        })
        .collect();
    let (got, inputs, prep) = if bf16 {
        let inputs = [to_bf16(&q), to_bf16(&k), to_bf16(&v)];
        let read = inputs.each_ref().map(|x| bf16_f64(x));
        let prep = QueryPrep {
            bias: to_bf16(&bias),
            cs: to_bf16(&cs),
        };
        let read_prep = [bf16_f64(&prep.bias), bf16_f64(&prep.cs)];
        let out = run(
            decode_attention_bf16,
            bf16::from_f32(f32::NAN),
            inputs,
            prepare.then_some(prep),
            dims,
            pads,
            last,
            scale,
        );
        (bf16_f64(&out), read, read_prep)
    } else {
        let read = [f64s(&q), f64s(&k), f64s(&v)];
        let read_prep = [f64s(&bias), f64s(&cs)];
        let prep = QueryPrep { bias, cs };
        let out = run(
            decode_attention_f32,
            f32::NAN,
            [q, k, v],
            prepare.then_some(prep),
            dims,
            pads,
            last,
            scale,
        );
        (f64s(&out), read, read_prep)
    };
    let q = match prepare {
        true => prepared_q(&inputs[0], &prep[0], &prep[1], (b, heads, hd)),
        false => inputs[0].clone(),
    };
    let want = reference(
        &q,
        &inputs[1],
        &inputs[2],
        dims,
        pads,
        last,
        f64::from(scale),
    );
    // bf16: the output's rounding; f32: sums over up to a few hundred keys.
    assert_close(
        "decode attention",
        &got,
        &want,
        if bf16 { 1e-2 } else { 1e-5 },
    );
}

#[test]
fn decode_attention_in_f32_with_pads_and_grouped_heads() {
    // Row 1's pad of 9 leaves it keys 9..=40; row 2 sees none (pad past last).
    check((3, 4, 2, 48, 64), &[0, 9, 41], 40, false, false);
}

#[test]
fn decode_attention_applies_the_query_bias_and_rotation_as_it_reads_q() {
    check((3, 4, 2, 48, 64), &[0, 9, 41], 40, false, true);
    check((2, 2, 1, 90, 128), &[5, 0], 80, true, true);
}

#[test]
fn decode_attention_over_a_long_cache_in_bf16() {
    // 700 keys: every warp walks more than one chunk; last is past the
    // cache (clamped); head dim 16 leaves half of each warp's lanes idle.
    check((2, 2, 1, 700, 16), &[3, 0], 900, true, false);
    check((1, 2, 2, 300, 128), &[], 257, true, false);
}
