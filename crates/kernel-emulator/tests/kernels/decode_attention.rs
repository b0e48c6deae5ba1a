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
);

/// One launch of `kernel` on `q, k, v` (a block of 8 warps per head and
/// batch element), returning its output (`nan` wherever it wrote nothing).
fn run<T: Copy>(
    kernel: Kernel<T>,
    nan: T,
    [mut q, mut k, mut v]: [Vec<T>; 3],
    (b, heads, kv, cap, hd): (usize, usize, usize, usize, usize),
    pads: &[u32],
    last: u32,
    scale: f32,
) -> Vec<T> {
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
            )
        })
        .unwrap();
    }
    out
}

/// Runs the f32 or bf16 kernel (`bf16`) on random inputs and checks it.
fn check(dims: (usize, usize, usize, usize, usize), pads: &[u32], last: u32, bf16: bool) {
    let (b, heads, kv, cap, hd) = dims;
    let scale = 0.125f32;
    let (q, k, v) = (
        random(b * heads * hd, 2.0, 1),
        random(b * kv * cap * hd, 2.0, 2),
        random(b * kv * cap * hd, 2.0, 3),
    );
    let (got, inputs) = if bf16 {
        let inputs = [to_bf16(&q), to_bf16(&k), to_bf16(&v)];
        let read = inputs.each_ref().map(|x| bf16_f64(x));
        let out = run(
            decode_attention_bf16,
            bf16::from_f32(f32::NAN),
            inputs,
            dims,
            pads,
            last,
            scale,
        );
        (bf16_f64(&out), read)
    } else {
        let read = [f64s(&q), f64s(&k), f64s(&v)];
        let out = run(
            decode_attention_f32,
            f32::NAN,
            [q, k, v],
            dims,
            pads,
            last,
            scale,
        );
        (f64s(&out), read)
    };
    let want = reference(
        &inputs[0],
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
    check((3, 4, 2, 48, 64), &[0, 9, 41], 40, false);
}

#[test]
fn decode_attention_over_a_long_cache_in_bf16() {
    // 700 keys: every warp walks more than one chunk; last is past the
    // cache (clamped); head dim 16 leaves half of each warp's lanes idle.
    check((2, 2, 1, 700, 16), &[3, 0], 900, true);
    check((1, 2, 2, 300, 128), &[], 257, true);
}
