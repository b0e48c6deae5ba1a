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

/// A decode step's keys `[B, heads, D]` with a bias `[heads, D]` (or none)
/// added and rotated by each row's tables `[B, D]` (cos, then sin), in f64.
fn step_reference(
    x: &[f64],
    bias: Option<&[f64]>,
    cs: &[f64],
    (b, heads, d): (usize, usize, usize),
) -> Vec<f64> {
    let half = d / 2;
    let mut out = vec![f64::NAN; x.len()];
    for bi in 0..b {
        for h in 0..heads {
            let r = (bi * heads + h) * d;
            for j in 0..half {
                let add = |c: usize| bias.map_or(0.0, |v| v[h * d + c]);
                let (a, e) = (x[r + j] + add(j), x[r + half + j] + add(half + j));
                let (c, s) = (cs[bi * d + j], cs[bi * d + half + j]);
                out[r + j] = a * c - e * s;
                out[r + half + j] = e * c + a * s;
            }
        }
    }
    out
}

/// `rope_step`'s signature, in either storage type.
type StepKernel<T> = unsafe extern "C" fn(*const T, *const T, *const T, *mut T, u32, u32, u32, i32);

/// One launch of a `rope_step` kernel over `grid` on `x [B, heads, D]`,
/// `bias [heads, D]` and `cs [B, D]`; its output (`nan` wherever it wrote
/// nothing).
fn run_step<T: Copy>(
    kernel: StepKernel<T>,
    nan: T,
    [mut x, mut bias, mut cs]: [Vec<T>; 3],
    (b, heads, d): (usize, usize, usize),
    flags: i32,
    grid: Grid,
) -> Vec<T> {
    let mut out = vec![nan; x.len()];
    let (xp, bp, cp, op) = (
        Shared::of(&mut x),
        Shared::of(&mut bias),
        Shared::of(&mut cs),
        Shared::of(&mut out),
    );
    // SAFETY: x and out hold B·heads·D values, bias heads·D, cs B·D.
    unsafe {
        launch(grid, || {
            kernel(
                xp.ptr(),
                bp.ptr(),
                cp.ptr(),
                op.ptr(),
                b as u32,
                heads as u32,
                d as u32,
                flags,
            )
        })
    }
    .unwrap();
    out
}

#[test]
fn rope_step_adds_the_bias_and_rotates_each_row_at_its_own_position() {
    let dims = (3usize, 2usize, 64usize);
    let (b, heads, d) = dims;
    let x = random(b * heads * d, 2.0, 71);
    let bias = random(heads * d, 1.0, 72);
    // Row b at position 5 + 40·b: cos, then sin.
    let cs: Vec<f32> = (0..b)
        .flat_map(|bi| {
            let (c, s) = tables(5 + 40 * bi + 1, d / 2);
            let at = (5 + 40 * bi) * d / 2;
            [c[at..].to_vec(), s[at..].to_vec()].concat()
        })
        .collect();
    let (x64, bias64, cs64) = (f64s(&x), f64s(&bias), f64s(&cs));
    for flags in [1, 0] {
        let inputs = [x.clone(), bias.clone(), cs.clone()];
        let out = run_step(
            rope_step_f32,
            f32::NAN,
            inputs,
            dims,
            flags,
            Grid::linear(2, 64),
        );
        let bias = (flags == 1).then_some(&bias64[..]);
        let want = step_reference(&x64, bias, &cs64, dims);
        let what = format!("rope step, flags {flags}");
        assert_close(&what, &f64s(&out), &want, 1e-5);
    }
    // bf16 storage: rounded once at the end.
    let inputs = [to_bf16(&x), to_bf16(&bias), to_bf16(&cs)];
    let read = inputs.each_ref().map(|v| bf16_f64(v));
    let want = step_reference(&read[0], Some(&read[1]), &read[2], dims);
    let nan = bf16::from_f32(f32::NAN);
    let out = run_step(rope_step_bf16, nan, inputs, dims, 1, Grid::linear(3, 32));
    assert_close("rope step bf16", &bf16_f64(&out), &want, 2e-2);
}
