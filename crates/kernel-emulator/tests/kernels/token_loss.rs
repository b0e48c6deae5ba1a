use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Shared};

use crate::*;

/// The forward kernel's signature, in either storage type.
type Forward<T> = unsafe extern "C" fn(*const T, *const u32, *mut f32, i32);

/// `kernel` over the rows of `v` logits in `x`: each row's (log p(target),
/// H, logsumexp) in f32.
fn forward<T: Copy>(kernel: Forward<T>, x: &mut [T], targets: &mut [u32], v: usize) -> Vec<f32> {
    let rows = targets.len();
    let mut out = vec![f32::NAN; rows * 3];
    let (xp, tp, op) = (Shared::of(x), Shared::of(targets), Shared::of(&mut out));
    // SAFETY: x holds rows × v logits, targets one per row, out 3 per row.
    unsafe {
        launch(row_blocks(rows, v), || {
            kernel(xp.ptr(), tp.ptr(), op.ptr(), v as i32)
        })
    }
    .unwrap();
    out
}

/// A row's logsumexp in f64.
fn logsumexp(row: &[f64]) -> f64 {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + row.iter().map(|a| (a - m).exp()).sum::<f64>().ln()
}

#[test]
fn token_loss_forward_and_backward() {
    let (rows, v) = (5, 1500);
    let mut x = random(rows * v, 8.0, 14);
    let mut targets: Vec<u32> = vec![0, 1499, 700, 3, 5000]; // the last is out of range
    let out = forward(token_loss_fwd_f32, &mut x, &mut targets, v);
    let upstream = [
        (0.7f32, -0.3f32, 0.2f32),
        (1.0, 0.0, 0.0),
        (0.0, 1.0, 0.0),
        (0.0, 0.0, 1.0),
        (0.0, 0.5, 0.0),
    ];
    let mut aux = Vec::new();
    let mut want_dx = vec![0f64; rows * v];
    for r in 0..rows {
        let xr: Vec<f64> = x[r * v..][..v].iter().map(|&a| f64::from(a)).collect();
        let lse = logsumexp(&xr);
        let p: Vec<f64> = xr.iter().map(|a| (a - lse).exp()).collect();
        let h: f64 = -p.iter().zip(&xr).map(|(p, a)| p * (a - lse)).sum::<f64>();
        let t = targets[r] as usize;
        let lp = if t < v { xr[t] - lse } else { f64::NAN };
        assert_close("log p", &[f64::from(out[r * 3])], &[lp], 1e-5);
        assert_close("entropy", &[f64::from(out[r * 3 + 1])], &[h], 1e-5);
        assert_close("logsumexp", &[f64::from(out[r * 3 + 2])], &[lse], 1e-6);
        let (g_lp, g_h, g_l) = upstream[r];
        aux.extend([out[r * 3], out[r * 3 + 1], out[r * 3 + 2], g_lp, g_h, g_l]);
        for j in 0..v {
            let mut d = f64::from(g_l - g_lp) * p[j] - f64::from(g_h) * p[j] * ((xr[j] - lse) + h);
            if j == t {
                d += f64::from(g_lp);
            }
            want_dx[r * v + j] = d;
        }
    }
    let mut dx = vec![f32::NAN; rows * v];
    let (xp, tp) = (Shared::of(&mut x), Shared::of(&mut targets));
    let (ap, dp) = (Shared::of(&mut aux), Shared::of(&mut dx));
    // SAFETY: aux holds 6 values a row, dx rows × v.
    unsafe {
        launch(row_blocks(rows, v), || {
            token_loss_bwd_f32(xp.ptr(), tp.ptr(), ap.ptr(), dp.ptr(), v as i32)
        })
    }
    .unwrap();
    assert_close("token loss dx", &f64s(&dx), &want_dx, 1e-5);
}

#[test]
fn token_loss_of_bf16_logits_gives_f32_outputs() {
    // Logits near 12, where bf16's spacing is 2⁻⁴: a logsumexp or log-prob
    // stored in bf16 would be off by up to 0.03.
    let (rows, v) = (3, 700);
    let shifted: Vec<f32> = random(rows * v, 3.0, 15).iter().map(|x| x + 12.0).collect();
    let mut x = to_bf16(&shifted);
    let mut targets: Vec<u32> = vec![0, 699, 350];
    let out = forward(token_loss_fwd_bf16, &mut x, &mut targets, v);
    let xs = bf16_f64(&x);
    for r in 0..rows {
        let xr = &xs[r * v..][..v];
        let lse = logsumexp(xr);
        let lp = xr[targets[r] as usize] - lse;
        assert_close("bf16 logsumexp", &[f64::from(out[r * 3 + 2])], &[lse], 1e-6);
        assert_close("bf16 log p", &[f64::from(out[r * 3])], &[lp], 1e-5);
    }
}
