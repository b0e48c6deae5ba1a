use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{bf16, launch, Grid, Shared, Sizes, Strides};

use crate::*;

/// One attention problem: `heads` query heads over `kv` key/value heads,
/// `t` queries after `s - t` cached keys, row b's first `pads[b]` keys
/// padding.
struct Case {
    b: usize,
    heads: usize,
    kv: usize,
    t: usize,
    s: usize,
    hd: usize,
    pads: Vec<u32>,
}

/// The kernels' signatures, one instantiation per head dim.
type Forward = unsafe extern "C" fn(
    *const bf16,
    *const bf16,
    *const bf16,
    *mut bf16,
    *mut f32,
    *const u32,
    Sizes,
    Strides,
    Strides,
    Strides,
    Strides,
);
type KeyGrads = unsafe extern "C" fn(
    *const bf16,
    *const bf16,
    *const bf16,
    *const bf16,
    *const f32,
    *const f32,
    *mut bf16,
    *mut bf16,
    *const u32,
    Sizes,
    Strides,
    Strides,
    Strides,
    Strides,
    Strides,
    Strides,
);
type KeyGradsPerHead = unsafe extern "C" fn(
    *const bf16,
    *const bf16,
    *const bf16,
    *const bf16,
    *const f32,
    *const f32,
    *mut f32,
    *mut f32,
    *const u32,
    Sizes,
    Strides,
    Strides,
    Strides,
    Strides,
    Strides,
    Strides,
);
type QueryGrads = unsafe extern "C" fn(
    *const bf16,
    *const bf16,
    *const bf16,
    *const bf16,
    *const f32,
    *const f32,
    *mut bf16,
    *const u32,
    Sizes,
    Strides,
    Strides,
    Strides,
    Strides,
    Strides,
);

/// Where element (b, h, i, d) of a view lives.
fn at(st: Strides, b: usize, h: usize, i: usize, d: usize) -> usize {
    (b as i64 * st.b + h as i64 * st.h + i as i64 * st.i) as usize + d
}

/// The attention's output `[B, H, T, D]`, log-sum-exps `[B, H, T]` and, for
/// `dout`, the gradients of q `[B, H, T, D]`, k and v `[B, G, S, D]`, in f64
/// from the definition: p = softmax over the keys row i sees.
struct Reference {
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn reference(c: &Case, q: &[f64], k: &[f64], v: &[f64], dout: &[f64], scale: f64) -> Reference {
    let (hd, rep, off) = (c.hd, c.heads / c.kv, c.s - c.t);
    let qi = |b: usize, h: usize, i: usize| ((b * c.heads + h) * c.t + i) * hd;
    let kj = |b: usize, g: usize, j: usize| ((b * c.kv + g) * c.s + j) * hd;
    let mut r = Reference {
        o: vec![0.0; c.b * c.heads * c.t * hd],
        lse: vec![f64::NEG_INFINITY; c.b * c.heads * c.t],
        dq: vec![0.0; c.b * c.heads * c.t * hd],
        dk: vec![0.0; c.b * c.kv * c.s * hd],
        dv: vec![0.0; c.b * c.kv * c.s * hd],
    };
    for b in 0..c.b {
        let lo = c.pads.get(b).map_or(0, |&p| p as usize);
        for h in 0..c.heads {
            let g = h / rep;
            for i in 0..c.t {
                let keys: Vec<usize> = (lo..=(i + off).min(c.s - 1)).collect();
                if keys.is_empty() {
                    continue;
                }
                let dot = |x: &[f64], a: usize, y: &[f64], e: usize| -> f64 {
                    (0..hd).map(|d| x[a + d] * y[e + d]).sum()
                };
                let sc: Vec<f64> = keys
                    .iter()
                    .map(|&j| scale * dot(q, qi(b, h, i), k, kj(b, g, j)))
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = sc.iter().map(|x| (x - m).exp() / l).collect();
                r.lse[(b * c.heads + h) * c.t + i] = m + l.ln();
                for (n, &j) in keys.iter().enumerate() {
                    for d in 0..hd {
                        r.o[qi(b, h, i) + d] += p[n] * v[kj(b, g, j) + d];
                    }
                }
                // dP_j = dO·v_j, dS_j = p_j (dP_j − Σ p dP), scaled back.
                let dp: Vec<f64> = keys
                    .iter()
                    .map(|&j| dot(dout, qi(b, h, i), v, kj(b, g, j)))
                    .collect();
                let mean: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (n, &j) in keys.iter().enumerate() {
                    let ds = p[n] * (dp[n] - mean) * scale;
                    for d in 0..hd {
                        r.dq[qi(b, h, i) + d] += ds * k[kj(b, g, j) + d];
                        r.dk[kj(b, g, j) + d] += ds * q[qi(b, h, i) + d];
                        r.dv[kj(b, g, j) + d] += p[n] * dout[qi(b, h, i) + d];
                    }
                }
            }
        }
    }
    r
}

/// Panics unless max |got − want| ≤ tol · max |want| (and nothing is NaN).
#[track_caller]
fn assert_relative(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want.iter().fold(0.0f64, |a, w| a.max(w.abs()));
    assert!(scale > 0.0, "{what}: an all-zero reference tests nothing");
    for (n, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{n}]: {g} against {w} (scale {scale})"
        );
    }
}

/// Runs the forward and the three backward kernels on `c` in bf16, with q
/// `[B, H, T, D]`, k `[B, G, S, D]`, v stored as `[B, S, G, D]` (a
/// transposed view, as the model hands it over), the output and its
/// gradient as `[B, T, H, D]`; checks all against [`reference`].
fn check(c: &Case, seed: u64) {
    let (hd, scale) = (c.hd, 1.0 / (c.hd as f32).sqrt());
    let warps = if hd == 64 { 4 } else { 2 };
    let q_st = Strides {
        b: (c.heads * c.t * hd) as i64,
        h: (c.t * hd) as i64,
        i: hd as i64,
    };
    let k_st = Strides {
        b: (c.kv * c.s * hd) as i64,
        h: (c.s * hd) as i64,
        i: hd as i64,
    };
    let v_st = Strides {
        b: (c.s * c.kv * hd) as i64,
        h: hd as i64,
        i: (c.kv * hd) as i64,
    };
    let o_st = Strides {
        b: (c.t * c.heads * hd) as i64,
        h: hd as i64,
        i: (c.heads * hd) as i64,
    };
    let (nq, nk) = (c.b * c.heads * c.t * hd, c.b * c.kv * c.s * hd);
    let mut q = to_bf16(&random(nq, 1.0, seed));
    let mut k = to_bf16(&random(nk, 1.0, seed + 1));
    let mut v = to_bf16(&random(nk, 1.0, seed + 2));
    let mut dout = to_bf16(&random(nq, 1.0, seed + 3));
    let mut pads = c.pads.clone();
    let nan = bf16::from_f32(f32::NAN);
    let (mut o, mut dq) = (vec![nan; nq], vec![nan; nq]);
    let (mut dk, mut dv) = (vec![nan; nk], vec![nan; nk]);
    let (mut dk2, mut dv2) = (vec![nan; nk], vec![nan; nk]);
    let per_head_n = c.b * c.heads * c.s * hd;
    let (mut dk_heads, mut dv_heads) = (vec![f32::NAN; per_head_n], vec![f32::NAN; per_head_n]);
    let per_head = Strides {
        b: (c.heads * c.s * hd) as i64,
        h: (c.s * hd) as i64,
        i: hd as i64,
    };
    let rows = c.b * c.heads * c.t;
    let (mut lse, mut delta) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
    let z = Sizes {
        heads: c.heads as i32,
        kv_heads: c.kv as i32,
        t: c.t as i32,
        s: c.s as i32,
        n_pads: pads.len() as i32,
        scale,
    };
    let (qp, kp, vp, dop) = (
        Shared::of(&mut q),
        Shared::of(&mut k),
        Shared::of(&mut v),
        Shared::of(&mut dout),
    );
    let (op, dqp, dkp, dvp) = (
        Shared::of(&mut o),
        Shared::of(&mut dq),
        Shared::of(&mut dk),
        Shared::of(&mut dv),
    );
    let (dk2p, dv2p, dkhp, dvhp) = (
        Shared::of(&mut dk2),
        Shared::of(&mut dv2),
        Shared::of(&mut dk_heads),
        Shared::of(&mut dv_heads),
    );
    let (lp, dlp, pp) = (
        Shared::of(&mut lse),
        Shared::of(&mut delta),
        Shared::of(&mut pads),
    );
    let (b, h, g) = (c.b as u32, c.heads as u32, c.kv as u32);
    let grid = |blocks: usize, heads: u32, threads: u32| Grid {
        grid: [blocks as u32, heads, b],
        block: [threads, 1, 1],
    };
    let fwd = grid(c.t.div_ceil(16 * warps), h, 32 * warps as u32);
    let (dkdv, dqg) = (
        grid(c.s.div_ceil(32), g, 128),
        grid(c.t.div_ceil(32), h, 128),
    );
    // SAFETY: every buffer holds what its strides address for these sizes;
    // lse and delta hold B·H·T values, pads B.
    unsafe {
        let (fwd_k, dkdv_k, dkdv_heads_k, dq_k): (Forward, KeyGrads, KeyGradsPerHead, QueryGrads) =
            match hd {
                64 => (
                    flash_fwd_bf16_hd64,
                    flash_dkdv_bf16_hd64,
                    flash_dkdv_heads_bf16_hd64,
                    flash_dq_bf16_hd64,
                ),
                _ => (
                    flash_fwd_bf16_hd128,
                    flash_dkdv_bf16_hd128,
                    flash_dkdv_heads_bf16_hd128,
                    flash_dq_bf16_hd128,
                ),
            };
        launch(fwd, || {
            fwd_k(
                qp.ptr(),
                kp.ptr(),
                vp.ptr(),
                op.ptr(),
                lp.ptr(),
                pp.ptr(),
                z,
                q_st,
                k_st,
                v_st,
                o_st,
            )
        })
        .unwrap();
        launch(grid(c.t.div_ceil(4), h, 128), || {
            flash_delta_bf16(
                op.ptr(),
                dop.ptr(),
                dlp.ptr(),
                c.heads as i32,
                c.t as i32,
                hd as i32,
                o_st,
                o_st,
            )
        })
        .unwrap();
        launch(dkdv, || {
            dkdv_k(
                qp.ptr(),
                kp.ptr(),
                vp.ptr(),
                dop.ptr(),
                lp.ptr(),
                dlp.ptr(),
                dkp.ptr(),
                dvp.ptr(),
                pp.ptr(),
                z,
                q_st,
                k_st,
                v_st,
                o_st,
                k_st,
                k_st,
            )
        })
        .unwrap();
        // The same gradients per query head, then summed over each group.
        launch(grid(c.s.div_ceil(32), h, 128), || {
            dkdv_heads_k(
                qp.ptr(),
                kp.ptr(),
                vp.ptr(),
                dop.ptr(),
                lp.ptr(),
                dlp.ptr(),
                dkhp.ptr(),
                dvhp.ptr(),
                pp.ptr(),
                z,
                q_st,
                k_st,
                v_st,
                o_st,
                per_head,
                per_head,
            )
        })
        .unwrap();
        launch(Grid::linear(3, 256), || {
            flash_sum_heads_bf16(
                dkhp.ptr(),
                dvhp.ptr(),
                dk2p.ptr(),
                dv2p.ptr(),
                c.b as i32,
                z,
                hd as i32,
                k_st,
                k_st,
            )
        })
        .unwrap();
        launch(dqg, || {
            dq_k(
                qp.ptr(),
                kp.ptr(),
                vp.ptr(),
                dop.ptr(),
                lp.ptr(),
                dlp.ptr(),
                dqp.ptr(),
                pp.ptr(),
                z,
                q_st,
                k_st,
                v_st,
                o_st,
                q_st,
            )
        })
        .unwrap();
    }
    // The f64 reference on the same bf16 values, every tensor in the
    // canonical layouts [B, H, T, D] and [B, G, S, D].
    let canon = |src: &[bf16], st: Strides, heads: usize, rows: usize| -> Vec<f64> {
        let mut out = Vec::with_capacity(c.b * heads * rows * hd);
        for bi in 0..c.b {
            for hi in 0..heads {
                for i in 0..rows {
                    for d in 0..hd {
                        out.push(f64::from(src[at(st, bi, hi, i, d)].to_f32()));
                    }
                }
            }
        }
        out
    };
    let want = reference(
        c,
        &bf16_f64(&q),
        &bf16_f64(&k),
        &canon(&v, v_st, c.kv, c.s),
        &canon(&dout, o_st, c.heads, c.t),
        f64::from(scale),
    );
    // bf16 outputs, and p and dS rounded to bf16 before their products.
    assert_relative("o", &canon(&o, o_st, c.heads, c.t), &want.o, 1e-2);
    assert_relative("dq", &bf16_f64(&dq), &want.dq, 2e-2);
    assert_relative("dk", &bf16_f64(&dk), &want.dk, 2e-2);
    assert_relative("dv", &bf16_f64(&dv), &want.dv, 2e-2);
    assert_relative("dk summed per head", &bf16_f64(&dk2), &want.dk, 2e-2);
    assert_relative("dv summed per head", &bf16_f64(&dv2), &want.dv, 2e-2);
    for (n, (&got, &w)) in lse.iter().zip(&want.lse).enumerate() {
        let ok = if w == f64::NEG_INFINITY {
            got == f32::NEG_INFINITY
        } else {
            (f64::from(got) - w).abs() <= 1e-4 * (1.0 + w.abs())
        };
        assert!(ok, "lse[{n}]: {got} against {w}");
    }
    // A row that sees no key: zeros out, no gradient.
    for (n, &w) in want.lse.iter().enumerate() {
        if w == f64::NEG_INFINITY {
            let (bi, hi, i) = (n / (c.heads * c.t), n / c.t % c.heads, n % c.t);
            for d in 0..hd {
                assert_eq!(
                    o[at(o_st, bi, hi, i, d)].to_f32(),
                    0.0,
                    "padding row output"
                );
                assert_eq!(dq[at(q_st, bi, hi, i, d)].to_f32(), 0.0, "padding row dq");
            }
        }
    }
}

#[test]
fn flash_attention_in_bf16_at_head_dim_64_with_pads_and_grouped_heads() {
    // Causal training shape: partial tiles (40 rows), a padded row whose
    // first 7 queries see nothing, two query heads per kv head.
    check(
        &Case {
            b: 2,
            heads: 4,
            kv: 2,
            t: 40,
            s: 40,
            hd: 64,
            pads: vec![0, 7],
        },
        71,
    );
}

#[test]
fn flash_attention_after_cached_keys_at_head_dim_64() {
    // A prefill after 33 cached keys: every query sees them all.
    check(
        &Case {
            b: 2,
            heads: 2,
            kv: 1,
            t: 19,
            s: 52,
            hd: 64,
            pads: vec![3, 36],
        },
        72,
    );
}

#[test]
fn flash_attention_in_bf16_at_head_dim_128() {
    // One cached key: query 31 is the first to see key 32, a tile edge.
    check(
        &Case {
            b: 1,
            heads: 2,
            kv: 1,
            t: 37,
            s: 38,
            hd: 128,
            pads: vec![5],
        },
        73,
    );
}
