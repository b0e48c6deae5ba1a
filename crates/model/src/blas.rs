//! OpenBLAS for the large products of a training step (cargo feature
//! `openblas`, linking the system's `libopenblas`).
//!
//! Why: profiling put the gemm crate's micro-kernel at 73–83% of a training
//! step, and on the AVX2 host OpenBLAS's sgemm ran the step's shapes about
//! 1.25× faster (the weight gradients' `tn` products most of all). The gemm
//! crate stays the default and keeps the small and per-task products, where
//! it is the faster of the two.
//!
//! OpenBLAS is told to use one thread; we split each product ourselves into
//! chunks whose boundaries depend only on its shape, and run them on rayon's
//! pool. So a product's bits do not depend on the thread count, and no
//! second thread pool spins against rayon's on a 2-core machine.

use std::any::TypeId;
use std::ffi::c_int;
use std::sync::OnceLock;

use super::kernels::{par_map, Real, Strides};

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

#[link(name = "openblas")]
extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn cblas_sgemm(
        layout: c_int,
        trans_a: c_int,
        trans_b: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
    #[allow(clippy::too_many_arguments)]
    fn cblas_dgemm(
        layout: c_int,
        trans_a: c_int,
        trans_b: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f64,
        a: *const f64,
        lda: c_int,
        b: *const f64,
        ldb: c_int,
        beta: f64,
        c: *mut f64,
        ldc: c_int,
    );
    fn openblas_set_num_threads(threads: c_int);
    fn openblas_get_corename() -> *const std::ffi::c_char;
}

/// Products with fewer multiply-adds than this stay on the gemm crate
/// (OpenBLAS measured slower on attention's 64-wide blocks).
const MIN_MACS: usize = 1 << 21;

/// Rows (or columns) per chunk: at least this many, and at most eight chunks.
const MIN_CHUNK: usize = 128;
const MAX_CHUNKS: usize = 8;

/// A matrix operand as CBLAS describes it (row-major storage).
#[derive(Clone, Copy)]
struct Operand {
    trans: c_int,
    ld: usize,
}

/// How a `[rows, cols]` view with strides `st` reads as a row-major CBLAS
/// operand, if it does.
fn operand(st: Strides, rows: usize, cols: usize) -> Option<Operand> {
    if st.cs == 1 && st.rs >= cols.max(1) {
        Some(Operand {
            trans: NO_TRANS,
            ld: st.rs,
        })
    } else if st.rs == 1 && st.cs >= rows.max(1) {
        Some(Operand {
            trans: TRANS,
            ld: st.cs,
        })
    } else {
        None
    }
}

/// Raw pointers that cross into rayon's tasks; each task writes a disjoint
/// block of `c`.
#[derive(Clone, Copy)]
struct Ptrs<T> {
    c: *mut T,
    a: *const T,
    b: *const T,
}
// SAFETY: the tasks only read `a` and `b` and write disjoint blocks of `c`.
unsafe impl<T> Send for Ptrs<T> {}
unsafe impl<T> Sync for Ptrs<T> {}

/// `c[m, n] (+)= a[m, k] · b[k, n]` through OpenBLAS when the product is
/// large, `c` is row-major and both inputs read as CBLAS operands; returns
/// whether it did (false: the caller runs the gemm crate).
///
/// # Safety
/// As [`super::kernels`]' `gemm_raw`: every element the views reach lies in
/// its buffer, `c` is writable and aliases neither input, and `m, n, k > 0`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<T: Real>(
    c: *mut T,
    cst: Strides,
    a: &[T],
    ast: Strides,
    b: &[T],
    bst: Strides,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) -> bool {
    let is_f32 = TypeId::of::<T>() == TypeId::of::<f32>();
    if !is_f32 && TypeId::of::<T>() != TypeId::of::<f64>() {
        return false;
    }
    if m * n * k < MIN_MACS || cst.cs != 1 || cst.rs < n {
        return false;
    }
    let (Some(opa), Some(opb)) = (operand(ast, m, k), operand(bst, k, n)) else {
        return false;
    };
    let fits = |v: usize| c_int::try_from(v).is_ok();
    if ![m, n, k, opa.ld, opb.ld, cst.rs].into_iter().all(fits) {
        return false;
    }
    if !vector_kernel() {
        return false;
    }
    // Split the longer side of c into chunks fixed by the shape alone.
    let split_rows = m >= n;
    let len = if split_rows { m } else { n };
    let chunk = len
        .div_ceil(MAX_CHUNKS)
        .max(MIN_CHUNK)
        .next_multiple_of(16)
        .min(len);
    let ptrs = Ptrs {
        c,
        a: a.as_ptr(),
        b: b.as_ptr(),
    };
    let beta = if accumulate { T::ONE } else { T::ZERO };
    par_map(len.div_ceil(chunk), m * n * k, |i| {
        let p = ptrs;
        let start = i * chunk;
        let width = chunk.min(len - start);
        // SAFETY: the chunk's rows (or columns) of c, a (or b) lie inside
        // the caller's views; chunks write disjoint blocks of c.
        unsafe {
            let (cp, ap, bp, mm, nn) = if split_rows {
                (
                    p.c.add(start * cst.rs),
                    p.a.add(start * ast.rs),
                    p.b,
                    width,
                    n,
                )
            } else {
                (p.c.add(start), p.a, p.b.add(start * bst.cs), m, width)
            };
            call(opa, opb, (mm, nn, k), ap, bp, beta, cp, cst.rs, is_f32);
        }
    });
    true
}

/// One CBLAS call in `T`'s precision (f32 or f64, checked by the caller).
#[allow(clippy::too_many_arguments)]
unsafe fn call<T: Real>(
    opa: Operand,
    opb: Operand,
    (m, n, k): (usize, usize, usize),
    a: *const T,
    b: *const T,
    beta: T,
    c: *mut T,
    ldc: usize,
    is_f32: bool,
) {
    // Every dimension and stride was checked to fit a c_int.
    let (m, n, k) = (m as c_int, n as c_int, k as c_int);
    let (lda, ldb, ldc) = (opa.ld as c_int, opb.ld as c_int, ldc as c_int);
    // One argument list for both precisions; only the function and the
    // scalar type differ.
    macro_rules! cblas {
        ($gemm:ident, $t:ty) => {
            $gemm(
                ROW_MAJOR,
                opa.trans,
                opb.trans,
                m,
                n,
                k,
                1.0,
                a.cast(),
                lda,
                b.cast(),
                ldb,
                beta.to_f64() as $t,
                c.cast(),
                ldc,
            )
        };
    }
    if is_f32 {
        cblas!(cblas_sgemm, f32);
    } else {
        cblas!(cblas_dgemm, f64);
    }
}

/// The kernel OpenBLAS picked for this CPU (`OPENBLAS_CORETYPE` overrides it).
pub(crate) fn core_name() -> String {
    // SAFETY: OpenBLAS returns a static NUL-terminated string.
    unsafe {
        let p = openblas_get_corename();
        if p.is_null() {
            return "unknown".into();
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// OpenBLAS's kernels with 256-bit (or wider) FMA.
const VECTOR_KERNELS: &[&str] = &["haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"];

/// Whether OpenBLAS runs an AVX2-or-wider kernel, checked once (and its
/// threads set to one). A build that does not know the CPU falls back to an
/// SSE kernel about 4× slower than the gemm crate (Debian's 0.3.21 on a
/// recent Xeon picked "Prescott"): then every product stays on the gemm crate.
pub(crate) fn vector_kernel() -> bool {
    static VECTOR: OnceLock<bool> = OnceLock::new();
    *VECTOR.get_or_init(|| {
        // SAFETY: a plain setter of OpenBLAS's thread count.
        unsafe { openblas_set_num_threads(1) };
        let core = core_name().to_ascii_lowercase();
        VECTOR_KERNELS.contains(&core.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Mm;

    /// Multiples of 1/4 in [-0.75, 0.75]: every product and sum here is
    /// exact, so any summation order gives the same bits.
    fn quarters<T: Real>(n: usize, s: f64) -> Vec<T> {
        (0..n)
            .map(|i| T::from_f64(((i as f64 * s).sin() * 3.0).round() / 4.0))
            .collect()
    }

    /// `a[m, k] · b[n, k]ᵀ`, plainly.
    fn naive<T: Real>(a: &[T], b: &[T], m: usize, n: usize, k: usize) -> Vec<T> {
        let mut c = vec![T::ZERO; m * n];
        for i in 0..m {
            for j in 0..n {
                for l in 0..k {
                    c[i * n + j] += a[i * k + l] * b[j * k + l];
                }
            }
        }
        c
    }

    fn transpose<T: Real>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
        (0..rows * cols)
            .map(|i| x[(i % rows) * cols + i / rows])
            .collect()
    }

    /// The three forms through `Mm` (so through the dispatch in the
    /// kernels) against the plain product, overwriting and accumulating.
    fn forms_agree<T: Real>() {
        // 300 rows: chunks of 128, 128 and 44 along m; 500 columns: four
        // chunks along n, the last of 116.
        for (m, n, k) in [(300, 200, 40), (150, 500, 30)] {
            assert!(m * n * k >= MIN_MACS);
            let a: Vec<T> = quarters(m * k, 0.37);
            let b: Vec<T> = quarters(n * k, 0.91);
            let want = naive(&a, &b, m, n, k);
            let twice: Vec<T> = want.iter().map(|&x| x + x).collect();
            let bt = transpose(&b, n, k); // [k, n]
            let at = transpose(&a, m, k); // [k, m]
            assert_eq!(Mm::nt(m, n, k).product(&a, &b), want, "nt {m}x{n}x{k}");
            assert_eq!(Mm::nn(m, n, k).product(&a, &bt), want, "nn {m}x{n}x{k}");
            assert_eq!(Mm::tn(m, n, k).product(&at, &bt), want, "tn {m}x{n}x{k}");
            let mut c = vec![T::ONE; m * n];
            Mm::nt(m, n, k).run(&mut c, &a, &b);
            assert_eq!(c, want, "nt run");
            Mm::tn(m, n, k).add().run(&mut c, &at, &bt);
            assert_eq!(c, twice, "tn add");
        }
    }

    #[test]
    fn the_three_forms_agree_with_a_plain_product_in_f32_and_f64() {
        forms_agree::<f32>();
        forms_agree::<f64>();
    }

    #[test]
    fn large_products_take_openblas_and_small_or_odd_ones_or_an_sse_kernel_do_not() {
        let (m, n, k) = (256, 128, 64);
        let a: Vec<f32> = quarters(m * k, 0.3);
        let b: Vec<f32> = quarters(n * k, 0.7);
        let mut c = vec![0f32; m * n];
        let rm = |cols| Strides { rs: cols, cs: 1 };
        let cm = |rows| Strides { rs: 1, cs: rows };
        let mut run = |dims: (usize, usize, usize), cst: Strides| unsafe {
            gemm(c.as_mut_ptr(), cst, &a, rm(k), &b, cm(k), dims, false)
        };
        // Where OpenBLAS runs an SSE kernel, nothing takes it.
        assert_eq!(run((m, n, k), rm(n)), vector_kernel(), "{}", core_name());
        assert!(!run((m, n / 2, k), rm(n)), "below MIN_MACS");
        assert!(!run((m, n, k), cm(m)), "column-major output");
    }

    #[test]
    fn the_bits_do_not_depend_on_the_thread_count() {
        // Values whose sums round: the chunks are fixed by the shape, so one
        // thread and two give the same bits.
        let (m, n, k) = (700, 300, 96);
        let a: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.618).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 1.414).cos()).collect();
        let on = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| Mm::nt(m, n, k).product(&a, &b))
        };
        let one = on(1);
        assert_eq!(one, on(2));
        let want = naive(&a, &b, m, n, k);
        for (x, y) in one.iter().zip(&want) {
            assert!((x - y).abs() < 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}
