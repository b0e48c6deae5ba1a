//! Host f32 building blocks shared by the hand-written inference forward
//! ([`crate::decode`]) and the fused training ops ([`crate::ops`]): a GEMM
//! over row-major slices (the `gemm` crate candle itself uses), vectorisable
//! dot/axpy, and a helper that splits independent work items over the
//! threads candle uses.
//!
//! Every function here is deterministic for a fixed thread count: work is
//! split by rows and no reduction crosses a split.

use gemm::Parallelism;

/// Threads candle (and so these kernels) use: `RAYON_NUM_THREADS` or the cores.
pub(crate) fn num_threads() -> usize {
    candle_core::utils::get_num_threads().max(1)
}

/// `c[m, n] (+)= a · bᵀ` for row-major `a: [m, k]` and `b: [n, k]` (the
/// PyTorch `x @ W.T` of a linear layer); `accumulate` adds to `c`.
pub(crate) fn matmul_nt(
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
) {
    gemm_strided(
        c,
        Strides { rs: n, cs: 1 },
        a,
        Strides { rs: k, cs: 1 },
        b,
        Strides { rs: 1, cs: k },
        (m, n, k),
        accumulate,
    );
}

/// Row and column strides of a matrix view, in elements.
#[derive(Clone, Copy)]
struct Strides {
    rs: usize,
    cs: usize,
}

#[allow(clippy::too_many_arguments)]
fn gemm_strided(
    c: &mut [f32],
    cst: Strides,
    a: &[f32],
    ast: Strides,
    b: &[f32],
    bst: Strides,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    // Bounds: the last element each view reaches must lie inside its slice,
    // which makes the raw-pointer call below sound.
    let last = |s: Strides, rows: usize, cols: usize| (rows - 1) * s.rs + (cols - 1) * s.cs;
    assert!(c.len() > last(cst, m, n), "gemm: output slice too short");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    c[i * cst.rs + j * cst.cs] = 0.0;
                }
            }
        }
        return;
    }
    assert!(a.len() > last(ast, m, k), "gemm: lhs slice too short");
    assert!(b.len() > last(bst, k, n), "gemm: rhs slice too short");
    let threads = num_threads();
    let par = if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: the asserts above keep every element gemm touches inside the
    // slices; `c` is borrowed mutably and does not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            cst.cs as isize,
            cst.rs as isize,
            accumulate,
            a.as_ptr(),
            ast.cs as isize,
            ast.rs as isize,
            b.as_ptr(),
            bst.cs as isize,
            bst.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// Σ a·b with eight independent accumulators (so the compiler vectorises it).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    let s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]);
    s + tail
}

/// `y += alpha · x`.
#[inline]
pub(crate) fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += alpha * b;
    }
}

/// SiLU `x · σ(x)`.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Runs `f(item_index, chunk)` for each `width`-wide chunk of `out`,
/// spreading the chunks over the threads when there are enough of them and
/// `work` (a rough count of operations in all) is large enough to pay for it.
pub(crate) fn par_chunks_mut<F>(out: &mut [f32], width: usize, work: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    use rayon::prelude::*;
    let width = width.max(1);
    if num_threads() > 1 && work >= PAR_MIN_WORK && out.len() > width {
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(width).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// Below this many operations a parallel split costs more than it saves.
pub(crate) const PAR_MIN_WORK: usize = 1 << 15;

/// RMSNorm of each `d`-wide row of `x` into `y`: `x / sqrt(mean(x²) + ε) · w`.
pub(crate) fn rms_norm_rows(y: &mut [f32], x: &[f32], w: &[f32], d: usize, eps: f32) {
    for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
        let ms = dot(xr, xr) / d as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, a), g) in yr.iter_mut().zip(xr).zip(w) {
            *o = a * r * g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        // a: [m, k], b: [n, k]
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[j * k + l]).sum();
            }
        }
        c
    }

    fn seq(n: usize, s: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * s).sin() * 3.0).round() / 4.0)
            .collect()
    }

    #[test]
    fn gemm_agrees_with_a_naive_product() {
        let (m, n, k) = (7, 5, 11);
        let a = seq(m * k, 0.37);
        let b = seq(n * k, 0.91);
        let want = naive(&a, &b, m, n, k);
        let mut c = vec![1f32; m * n];
        matmul_nt(&mut c, &a, &b, m, n, k, false);
        assert_eq!(c, want);
    }

    #[test]
    fn dot_matches_a_plain_sum() {
        let a = seq(19, 0.3);
        let b = seq(19, 0.7);
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - want).abs() < 1e-5);
    }
}
