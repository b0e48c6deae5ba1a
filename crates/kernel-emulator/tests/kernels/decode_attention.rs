use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Grid, Shared};

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

/// Runs the f32 or bf16 kernel (`bf16`) on random inputs and checks it.
fn check(dims: (usize, usize, usize, usize, usize), pads: &[u32], last: u32, bf16: bool) {
    let (b, heads, kv, cap, hd) = dims;
    let scale = 0.125f32;
    let (q, k, v) = (
        random(b * heads * hd, 2.0, 1),
        random(b * kv * cap * hd, 2.0, 2),
        random(b * kv * cap * hd, 2.0, 3),
    );
    let mut pads = pads.to_vec();
    let mut last_buf = vec![last];
    let grid = Grid {
        grid: [heads as u32, b as u32, 1],
        block: [256, 1, 1],
    };
    let args = (
        pads.len() as i32,
        heads as i32,
        kv as i32,
        cap as i32,
        hd as i32,
    );
    let (pp, lp) = (Shared::of(&mut pads), Shared::of(&mut last_buf));
    let (got, inputs) = if bf16 {
        let (mut qb, mut kb, mut vb) = (to_bf16(&q), to_bf16(&k), to_bf16(&v));
        let mut out = to_bf16(&vec![f32::NAN; b * heads * hd]);
        let (qp, kp, vp, op) = (
            Shared::of(&mut qb),
            Shared::of(&mut kb),
            Shared::of(&mut vb),
            Shared::of(&mut out),
        );
        // SAFETY: q and out hold B·heads·hd values, k and v B·kv·cap·hd,
        // pads B, last 1.
        unsafe {
            launch(grid, || {
                decode_attention_bf16(
                    qp.ptr(),
                    kp.ptr(),
                    vp.ptr(),
                    op.ptr(),
                    pp.ptr(),
                    args.0,
                    lp.ptr(),
                    args.1,
                    args.2,
                    args.3,
                    args.4,
                    scale,
                )
            })
            .unwrap();
        }
        let inputs = [bf16_f64(&qb), bf16_f64(&kb), bf16_f64(&vb)];
        (bf16_f64(&out), inputs)
    } else {
        let (mut qf, mut kf, mut vf) = (q.clone(), k.clone(), v.clone());
        let mut out = vec![f32::NAN; b * heads * hd];
        let (qp, kp, vp, op) = (
            Shared::of(&mut qf),
            Shared::of(&mut kf),
            Shared::of(&mut vf),
            Shared::of(&mut out),
        );
        // SAFETY: as above.
        unsafe {
            launch(grid, || {
                decode_attention_f32(
                    qp.ptr(),
                    kp.ptr(),
                    vp.ptr(),
                    op.ptr(),
                    pp.ptr(),
                    args.0,
                    lp.ptr(),
                    args.1,
                    args.2,
                    args.3,
                    args.4,
                    scale,
                )
            })
            .unwrap();
        }
        (f64s(&out), [f64s(&q), f64s(&k), f64s(&v)])
    };
    let want = reference(
        &inputs[0],
        &inputs[1],
        &inputs[2],
        dims,
        &pads,
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
