use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Shared};

use crate::*;

#[test]
fn adamw_updates_theta_and_both_moments() {
    let n = 1000;
    let (lr, b1, b2, eps, wd) = (1e-2f32, 0.9f32, 0.999f32, 1e-8f32, 0.1f32);
    let (bc1, bc2) = (1.0 - b1.powi(3), 1.0 - b2.powi(3));
    let mut theta = random(n, 1.0, 10);
    let mut g = random(n, 0.5, 11);
    let mut mv: Vec<f32> = random(n, 0.1, 12)
        .into_iter()
        .chain(random(n, 0.1, 13).iter().map(|v| v.abs()))
        .collect();
    let (theta0, mv0) = (theta.clone(), mv.clone());
    let (tp, gp, mp) = (
        Shared::of(&mut theta),
        Shared::of(&mut g),
        Shared::of(&mut mv),
    );
    let keep = 1.0 - lr * wd;
    // SAFETY: θ and g hold n values, mv 2n.
    unsafe {
        launch(elementwise_blocks(n), || {
            adamw_f32(
                tp.ptr(),
                gp.ptr(),
                mp.ptr(),
                n as u64,
                lr,
                b1,
                b2,
                eps,
                keep,
                bc1,
                bc2,
            )
        })
    }
    .unwrap();
    for i in 0..n {
        let gi = f64::from(g[i]);
        let m = f64::from(mv0[i]) * f64::from(b1) + gi * (1.0 - f64::from(b1));
        let v = f64::from(mv0[n + i]) * f64::from(b2) + gi * gi * (1.0 - f64::from(b2));
        let update = (m / f64::from(bc1)) / ((v / f64::from(bc2)).sqrt() + f64::from(eps));
        let want = f64::from(theta0[i]) * f64::from(keep) - update * f64::from(lr);
        assert_close("adamw θ", &[f64::from(theta[i])], &[want], 1e-5);
        assert_close("adamw m", &[f64::from(mv[i])], &[m], 1e-6);
        assert_close("adamw v", &[f64::from(mv[n + i])], &[v], 1e-6);
    }
}
