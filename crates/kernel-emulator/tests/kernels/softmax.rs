use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Shared};

use crate::*;

/// The causal, left-padded softmax of one row (the kernel's contract).
fn reference(x: &[f32], t: usize, s: usize, rows_per_batch: usize, pads: &[u32]) -> Vec<f64> {
    let mut y = vec![0f64; x.len()];
    for (row, (xr, yr)) in x.chunks(s).zip(y.chunks_mut(s)).enumerate() {
        let i = row % t;
        let lo = pads.get(row / rows_per_batch).map_or(0, |&p| p as usize);
        let hi = (i + s - t + 1).min(s);
        if lo >= hi {
            continue;
        }
        let m = xr[lo..hi]
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(v.into()));
        let sum: f64 = xr[lo..hi].iter().map(|&v| (f64::from(v) - m).exp()).sum();
        for j in lo..hi {
            yr[j] = (f64::from(xr[j]) - m).exp() / sum;
        }
    }
    y
}

#[test]
fn causal_softmax_with_pads_and_a_cache() {
    // 2 batch elements × 3 heads × t = 5 queries over s = 70 keys (65 cached),
    // the second element padded by 68 (its first queries see nothing).
    let (b, h, t, s) = (2, 3, 5, 70);
    let rows = b * h * t;
    let pads = [3u32, 68];
    let x = random(rows * s, 4.0, 1);
    let want = reference(&x, t, s, h * t, &pads);
    let (mut xs, mut pads_buf) = (x.clone(), pads.to_vec());
    let mut y = vec![f32::NAN; rows * s];
    let (xp, yp, pp) = (
        Shared::of(&mut xs),
        Shared::of(&mut y),
        Shared::of(&mut pads_buf),
    );
    let (t32, s32, rpb) = (t as i32, s as i32, (h * t) as i32);
    // SAFETY: x and y hold rows × s values, pads one per batch element.
    unsafe {
        launch(row_blocks(rows, s), || {
            causal_softmax_f32(xp.ptr(), yp.ptr(), pp.ptr(), 2, t32, s32, rpb)
        })
    }
    .unwrap();
    assert_close("softmax f32", &f64s(&y), &want, 1e-6);
    assert!(
        y[(b * h * t - t) * s..][..s].iter().all(|&v| v == 0.0),
        "a padded query's row"
    );

    let mut xb = to_bf16(&x);
    let want_b = reference(
        &bf16_f64(&xb).iter().map(|&v| v as f32).collect::<Vec<_>>(),
        t,
        s,
        h * t,
        &pads,
    );
    let mut yb = vec![bf16::NAN; rows * s];
    let (xp, yp) = (Shared::of(&mut xb), Shared::of(&mut yb));
    // SAFETY: as above.
    unsafe {
        launch(row_blocks(rows, s), || {
            causal_softmax_bf16(xp.ptr(), yp.ptr(), pp.ptr(), 2, t32, s32, rpb)
        })
    }
    .unwrap();
    assert_close("softmax bf16", &bf16_f64(&yb), &want_b, 4e-3);
}

#[test]
fn softmax_backward_is_p_times_g_minus_its_mean() {
    let (rows, s) = (7, 1100); // more keys than a block has threads
    let logits = random(rows * s, 3.0, 2);
    let mut p: Vec<f32> = reference(&logits, 1, s, 1, &[])
        .iter()
        .map(|&v| v as f32)
        .collect();
    let mut g = random(rows * s, 1.0, 3);
    let mut want = vec![0f64; rows * s];
    for r in 0..rows {
        let (pr, gr) = (&p[r * s..][..s], &g[r * s..][..s]);
        let dot: f64 = pr
            .iter()
            .zip(gr)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        for j in 0..s {
            want[r * s + j] = f64::from(pr[j]) * (f64::from(gr[j]) - dot);
        }
    }
    let mut dx = vec![f32::NAN; rows * s];
    let (pp, gp, dp) = (Shared::of(&mut p), Shared::of(&mut g), Shared::of(&mut dx));
    // SAFETY: p, g and dx hold rows × s values.
    unsafe {
        launch(row_blocks(rows, s), || {
            softmax_bwd_f32(pp.ptr(), gp.ptr(), dp.ptr(), s as i32)
        })
    }
    .unwrap();
    assert_close("softmax backward", &f64s(&dx), &want, 1e-6);
}

#[test]
fn decode_softmax_sees_keys_from_the_pad_to_the_device_held_last() {
    // 2 batch elements × 3 heads, one query each, over a cache of 90 keys of
    // which positions ..= 61 are written; element 1 is padded by 10.
    let (b, h, s) = (2, 3, 90);
    let rows = b * h;
    let pads = [0u32, 10];
    let mut last = vec![61u32];
    let x = random(rows * s, 4.0, 60);
    let mut want = vec![0f64; rows * s];
    for r in 0..rows {
        let lo = pads[r / h] as usize;
        let xr = &x[r * s..][..s];
        let m = xr[lo..=61]
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(v.into()));
        let z: f64 = xr[lo..=61].iter().map(|&v| (f64::from(v) - m).exp()).sum();
        for j in lo..=61 {
            want[r * s + j] = (f64::from(xr[j]) - m).exp() / z;
        }
    }
    let (mut xs, mut pads_buf) = (x.clone(), pads.to_vec());
    let mut y = vec![f32::NAN; rows * s];
    let (xp, yp, pp, lp) = (
        Shared::of(&mut xs),
        Shared::of(&mut y),
        Shared::of(&mut pads_buf),
        Shared::of(&mut last),
    );
    // SAFETY: x and y hold rows × s values, pads one per batch element, last one.
    unsafe {
        launch(row_blocks(rows, s), || {
            decode_softmax_f32(
                xp.ptr(),
                yp.ptr(),
                pp.ptr(),
                2,
                lp.ptr(),
                s as i32,
                h as i32,
            )
        })
    }
    .unwrap();
    assert_close("decode softmax", &f64s(&y), &want, 1e-6);
}
