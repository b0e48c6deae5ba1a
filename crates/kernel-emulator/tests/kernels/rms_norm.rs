use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Grid, Shared};

use crate::*;

const EPS: f32 = 1e-6;

fn inv_rms(x: &[f32]) -> f64 {
    let ms = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
    1.0 / (ms + f64::from(EPS)).sqrt()
}

#[test]
fn rms_norm_forward_and_both_backwards() {
    let (rows, d) = (9, 1100);
    let (mut x, mut w, mut g) = (
        random(rows * d, 2.0, 4),
        random(d, 1.5, 5),
        random(rows * d, 1.0, 6),
    );
    let (mut want_y, mut want_dx, mut want_dw) =
        (vec![0f64; rows * d], vec![0f64; rows * d], vec![0f64; d]);
    for r in 0..rows {
        let (xr, gr) = (&x[r * d..][..d], &g[r * d..][..d]);
        let ir = inv_rms(xr);
        let dot: f64 = (0..d)
            .map(|j| f64::from(gr[j]) * f64::from(w[j]) * f64::from(xr[j]))
            .sum();
        for j in 0..d {
            let (xj, wj, gj) = (f64::from(xr[j]), f64::from(w[j]), f64::from(gr[j]));
            want_y[r * d + j] = xj * ir * wj;
            want_dx[r * d + j] = ir * gj * wj - xj * ir.powi(3) * dot / d as f64;
            want_dw[j] += gj * xj * ir;
        }
    }
    let (mut y, mut dx, mut dw) = (
        vec![f32::NAN; rows * d],
        vec![f32::NAN; rows * d],
        vec![f32::NAN; d],
    );
    let (xp, wp, gp) = (Shared::of(&mut x), Shared::of(&mut w), Shared::of(&mut g));
    let (yp, dxp, dwp) = (Shared::of(&mut y), Shared::of(&mut dx), Shared::of(&mut dw));
    let d32 = d as i32;
    // SAFETY (all three): x, g, y, dx hold rows × d values, w and dw d.
    unsafe {
        launch(row_blocks(rows, d), || {
            rms_norm_fwd_f32(xp.ptr(), wp.ptr(), yp.ptr(), d32, EPS)
        })
    }
    .unwrap();
    unsafe {
        launch(row_blocks(rows, d), || {
            rms_norm_bwd_x_f32(xp.ptr(), wp.ptr(), gp.ptr(), dxp.ptr(), d32, EPS)
        })
    }
    .unwrap();
    // The model crate's split: chunks of `per` rows into f32 partials, then a
    // thread per column over the chunks.
    let per = 4;
    let chunks = rows.div_ceil(per);
    let mut partial = vec![0f32; chunks * d];
    let pp = Shared::of(&mut partial);
    unsafe {
        launch(
            Grid {
                grid: [chunks as u32, 1, 1],
                ..row_blocks(rows, d)
            },
            || {
                rms_norm_bwd_w_partial_f32(
                    xp.ptr(),
                    gp.ptr(),
                    pp.ptr(),
                    rows as i32,
                    d32,
                    EPS,
                    per as i32,
                )
            },
        )
    }
    .unwrap();
    unsafe {
        launch(Grid::linear(d.div_ceil(256) as u32, 256), || {
            rms_norm_bwd_w_sum_f32(pp.ptr(), dwp.ptr(), chunks as i32, d32)
        })
    }
    .unwrap();
    assert_close("rms y", &f64s(&y), &want_y, 1e-5);
    assert_close("rms dx", &f64s(&dx), &want_dx, 1e-5);
    assert_close("rms dw", &f64s(&dw), &want_dw, 1e-5);

    let (mut xb, mut wb) = (to_bf16(&x), to_bf16(&w));
    let mut yb = vec![bf16::NAN; rows * d];
    let (xp, wp, yp) = (
        Shared::of(&mut xb),
        Shared::of(&mut wb),
        Shared::of(&mut yb),
    );
    // SAFETY: as above.
    unsafe {
        launch(row_blocks(rows, d), || {
            rms_norm_fwd_bf16(xp.ptr(), wp.ptr(), yp.ptr(), d32, EPS)
        })
    }
    .unwrap();
    assert_close("rms y bf16", &bf16_f64(&yb), &want_y, 2e-2);
}
