use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{bf16, launch, Grid, Shared};

use crate::*;

/// The rotation of `x` (`[B, T, H, D]`, or `[B, H, T, D]` for the adjoint)
/// by the tables `[T, D/2]`, in f64: the kernel's formula, written out.
#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    cos: &[f64],
    sin: &[f64],
    (b, t, h, d): (usize, usize, usize, usize),
    scale: f64,
    adjoint: bool,
) -> Vec<f64> {
    let half = d / 2;
    let mut out = vec![f64::NAN; x.len()];
    for bi in 0..b {
        for ti in 0..t {
            for hi in 0..h {
                let bthd = ((bi * t + ti) * h + hi) * d;
                let bhtd = ((bi * h + hi) * t + ti) * d;
                let (src, dst) = if adjoint { (bhtd, bthd) } else { (bthd, bhtd) };
                for j in 0..half {
                    let (c, s) = (cos[ti * half + j], sin[ti * half + j]);
                    let (a, e) = (x[src + j], x[src + half + j]);
                    let (o1, o2) = if adjoint {
                        (a * c + e * s, e * c - a * s)
                    } else {
                        (a * c - e * s, e * c + a * s)
                    };
                    out[dst + j] = o1 * scale;
                    out[dst + half + j] = o2 * scale;
                }
            }
        }
    }
    out
}

/// Angles as the model builds them: position p times 1/θ^(2j/D).
fn tables(t: usize, half: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for p in 0..t {
        for j in 0..half {
            let a = p as f64 / 10_000f64.powf(2.0 * j as f64 / (2 * half) as f64);
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

#[test]
fn rope_heads_and_its_adjoint_in_f32() {
    let dims @ (b, t, h, d) = (2, 5, 3, 8);
    let n = b * t * h * d;
    let (mut cos, mut sin) = tables(t, d / 2);
    let mut x = random(n, 2.0, 31);
    let (mut y, mut back) = (vec![f32::NAN; n], vec![f32::NAN; n]);
    let (xp, cp, sp, yp, bp) = (
        Shared::of(&mut x),
        Shared::of(&mut cos),
        Shared::of(&mut sin),
        Shared::of(&mut y),
        Shared::of(&mut back),
    );
    let scale = 0.25f32;
    // Fewer threads than pairs: the grid-stride loop covers the rest.
    let grid = Grid::linear(2, 32);
    let (b32, t32, h32, d32) = (b as u32, t as u32, h as u32, d as u32);
    // SAFETY: x, y and back hold n values, the tables t·d/2.
    unsafe {
        launch(grid, || {
            rope_heads_f32(
                xp.ptr(),
                cp.ptr(),
                sp.ptr(),
                yp.ptr(),
                b32,
                t32,
                h32,
                d32,
                scale,
                0,
            )
        })
    }
    .unwrap();
    unsafe {
        launch(grid, || {
            rope_heads_f32(
                yp.ptr(),
                cp.ptr(),
                sp.ptr(),
                bp.ptr(),
                b32,
                t32,
                h32,
                d32,
                1.0,
                1,
            )
        })
    }
    .unwrap();
    let (cos, sin) = (f64s(&cos), f64s(&sin));
    let want_y = reference(&f64s(&x), &cos, &sin, dims, 0.25, false);
    assert_close("rope y", &f64s(&y), &want_y, 1e-6);
    let want_back = reference(&f64s(&y), &cos, &sin, dims, 1.0, true);
    assert_close("rope adjoint", &f64s(&back), &want_back, 1e-6);
    // A rotation's adjoint is its inverse: back is x scaled.
    let scaled: Vec<f64> = f64s(&x).iter().map(|v| v * 0.25).collect();
    assert_close("rope adjoint ∘ rope", &f64s(&back), &scaled, 1e-6);
}

#[test]
fn rope_heads_in_bf16_rounds_once() {
    let dims @ (b, t, h, d) = (1, 4, 2, 64);
    let n = b * t * h * d;
    let (cos, sin) = tables(t, d / 2);
    let (mut cos, mut sin) = (to_bf16(&cos), to_bf16(&sin));
    let mut x = to_bf16(&random(n, 3.0, 32));
    let mut y = vec![bf16::from_f32(f32::NAN); n];
    let (xp, cp, sp, yp) = (
        Shared::of(&mut x),
        Shared::of(&mut cos),
        Shared::of(&mut sin),
        Shared::of(&mut y),
    );
    // SAFETY: x and y hold n values, the tables t·d/2.
    unsafe {
        launch(Grid::linear(1, 64), || {
            rope_heads_bf16(
                xp.ptr(),
                cp.ptr(),
                sp.ptr(),
                yp.ptr(),
                1,
                4,
                2,
                64,
                0.125,
                0,
            )
        })
    }
    .unwrap();
    // The f32 arithmetic on the bf16 inputs, rounded once at the store:
    // within half a bf16 step (2⁻⁹ relative) of the f64 result.
    let want = reference(
        &bf16_f64(&x),
        &bf16_f64(&cos),
        &bf16_f64(&sin),
        dims,
        0.125,
        false,
    );
    assert_close("rope bf16", &bf16_f64(&y), &want, 1.0 / 256.0);
}
