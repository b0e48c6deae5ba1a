use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Grid, Shared};

use crate::*;

fn sigmoid(a: f64) -> f64 {
    1.0 / (1.0 + (-a).exp())
}

#[test]
fn swiglu_forward_and_backward_over_a_strided_grid() {
    let n = 3000;
    let (mut a, mut b, mut g) = (random(n, 6.0, 7), random(n, 2.0, 8), random(n, 1.0, 9));
    let (mut y, mut out) = (vec![f32::NAN; n], vec![f32::NAN; 2 * n]);
    let (ap, bp, gp, yp, op) = (
        Shared::of(&mut a),
        Shared::of(&mut b),
        Shared::of(&mut g),
        Shared::of(&mut y),
        Shared::of(&mut out),
    );
    // Fewer threads than elements: the grid-stride loop covers the rest.
    let grid = Grid::linear(3, 256);
    // SAFETY: a, b, g, y hold n values, out 2n.
    unsafe {
        launch(grid, || {
            swiglu_fwd_f32(ap.ptr(), bp.ptr(), yp.ptr(), n as u64)
        })
    }
    .unwrap();
    unsafe {
        launch(grid, || {
            swiglu_bwd_f32(ap.ptr(), bp.ptr(), gp.ptr(), op.ptr(), n as u64)
        })
    }
    .unwrap();
    let (mut want_y, mut want_out) = (vec![0f64; n], vec![0f64; 2 * n]);
    for i in 0..n {
        let (av, bv, gv) = (f64::from(a[i]), f64::from(b[i]), f64::from(g[i]));
        let s = sigmoid(av);
        want_y[i] = av * s * bv;
        want_out[i] = gv * bv * s * (1.0 + av * (1.0 - s));
        want_out[n + i] = gv * av * s;
    }
    assert_close("swiglu y", &f64s(&y), &want_y, 1e-5);
    assert_close("swiglu da|db", &f64s(&out), &want_out, 1e-5);
}
