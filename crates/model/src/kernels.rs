//! Host building blocks shared by the hand-written inference forward
//! ([`crate::decode`]) and the fused training ops ([`crate::block`],
//! [`crate::attention`], [`crate::head`]): a GEMM over row-major slices (the
//! `gemm` crate candle itself uses), vectorisable dot/axpy, RMSNorm rows, and
//! row-parallel loops on rayon (the pool the GEMM already runs on, so no
//! second pool spins against it on a 2-core machine).
//!
//! Generic over [`Real`] (f32 for training and sampling, f64 for the
//! finite-difference tests). Deterministic for a fixed thread count: work is
//! split by rows and no reduction crosses a split.

use std::mem::MaybeUninit;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

use candle_core::CpuStorage;
use gemm::Parallelism;

/// The float types the fused kernels run in.
pub(crate) trait Real:
    Copy
    + Send
    + Sync
    + 'static
    + PartialOrd
    + std::fmt::Debug
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn max(self, o: Self) -> Self;
    /// The slice a CPU storage holds, if it is of this type.
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    /// `s` as f32 when `Self` is f32 (the SIMD kernels' type; only
    /// x86-64 has them).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// The same, mutably.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]>;
    /// The same, mutably.
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// A CPU storage owning `v`.
    fn storage(v: Vec<Self>) -> CpuStorage;
}

macro_rules! real {
    ($t:ty, $variant:ident, $as_f32:expr, $as_f32_mut:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn max(self, o: Self) -> Self {
                <$t>::max(self, o)
            }
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn as_f32(s: &[Self]) -> Option<&[f32]> {
                $as_f32(s)
            }
            fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
                $as_f32_mut(s)
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn storage(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$variant(v)
            }
        }
    };
}
real!(f32, F32, some_f32, some_f32_mut);
real!(f64, F64, no_f32, no_f32_mut);

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn some_f32(s: &[f32]) -> Option<&[f32]> {
    Some(s)
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn no_f32<T>(_: &[T]) -> Option<&[f32]> {
    None
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn some_f32_mut(s: &mut [f32]) -> Option<&mut [f32]> {
    Some(s)
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn no_f32_mut<T>(_: &mut [T]) -> Option<&mut [f32]> {
    None
}

/// Threads candle (and so these kernels) use: `RAYON_NUM_THREADS` or the
/// cores. Read once: candle's answer parses /proc/cpuinfo on every call,
/// which profiling showed at ~6% of a training step when asked per kernel.
pub(crate) fn num_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| candle_core::utils::get_num_threads().max(1))
}

/// Whether a GEMM may split itself over the threads: yes from the top
/// level, no inside a task that already runs in parallel with others.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Par {
    Threads,
    Single,
}

/// One GEMM over row-major slices, described by its shape and form:
/// `Mm::nt(m, n, k).run(c, a, b)` is `c[m, n] = a[m, k] · b[n, k]ᵀ` (a
/// linear layer, PyTorch's `x @ W.T`), `nn` is `a[m, k] · b[k, n]`, `tn` is
/// `a[k, m]ᵀ · b[k, n]` (a weight gradient `dyᵀ x` summed over k rows).
/// `.add()` accumulates into `c`; `.single()` keeps it on the calling thread
/// (inside a task that already runs beside others).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mm {
    m: usize,
    n: usize,
    k: usize,
    a: Strides,
    b: Strides,
    accumulate: bool,
    par: Par,
    /// The row count that decides between the small-m kernel and the GEMM
    /// (`m` unless [`Mm::routed_as`] says otherwise).
    route_m: usize,
    /// Whether an f32 GEMM rounds its inputs to bf16 ([`crate::gemm_bf16`]).
    bf16: bool,
}

impl Mm {
    fn new(m: usize, n: usize, k: usize, a: Strides, b: Strides) -> Self {
        Self {
            m,
            n,
            k,
            a,
            b,
            accumulate: false,
            par: Par::Threads,
            route_m: m,
            bf16: false,
        }
    }
    /// Runs the GEMM in `precision` where this CPU has it (the small-m
    /// kernel of decode steps stays f32).
    pub(crate) fn precision(self, precision: crate::Precision) -> Self {
        Self {
            bf16: precision == crate::Precision::Bf16,
            ..self
        }
    }
    /// Picks the kernel as for a product of `rows` rows: for `m` rows taken
    /// out of a `rows`-row product, so that each row gets the bits it gets
    /// there (the small-m kernel and the GEMM round differently, and each
    /// gives a row the same bits whatever the other rows are).
    pub(crate) fn routed_as(self, rows: usize) -> Self {
        Self {
            route_m: rows,
            ..self
        }
    }
    /// `a[m, k] · b[n, k]ᵀ`.
    pub(crate) fn nt(m: usize, n: usize, k: usize) -> Self {
        Self::new(m, n, k, row_major(k), col_major(k))
    }
    /// `a[m, k] · b[k, n]`.
    pub(crate) fn nn(m: usize, n: usize, k: usize) -> Self {
        Self::new(m, n, k, row_major(k), row_major(n))
    }
    /// `a[k, m]ᵀ · b[k, n]`.
    pub(crate) fn tn(m: usize, n: usize, k: usize) -> Self {
        Self::new(m, n, k, col_major(m), row_major(n))
    }
    /// [`Mm::nt`] with `b`'s rows `ld` elements apart: one head's keys in
    /// a position-major key cache.
    pub(crate) fn nt_b_rows(m: usize, n: usize, k: usize, ld: usize) -> Self {
        Self::new(m, n, k, row_major(k), Strides { rs: 1, cs: ld })
    }
    /// [`Mm::nn`] with `b`'s rows `ld` elements apart: one head's values in
    /// a position-major value cache.
    pub(crate) fn nn_b_rows(m: usize, n: usize, k: usize, ld: usize) -> Self {
        Self::new(m, n, k, row_major(k), Strides { rs: ld, cs: 1 })
    }
    /// The same product with `a` read through strides `a` (the columns of
    /// one projection inside a fused output, say).
    pub(crate) fn a_strides(self, a: Strides) -> Self {
        Self { a, ..self }
    }
    /// Adds the product to `c` instead of overwriting it.
    pub(crate) fn add(self) -> Self {
        self.add_if(true)
    }
    /// Adds when `accumulate`, else overwrites.
    pub(crate) fn add_if(self, accumulate: bool) -> Self {
        Self { accumulate, ..self }
    }
    /// Runs on the calling thread only.
    pub(crate) fn single(self) -> Self {
        Self {
            par: Par::Single,
            ..self
        }
    }
    /// Whether [`Self::run`] skips the GEMM crate: a dense `nt` product
    /// with few rows (decode steps).
    fn takes_small_nt(&self) -> bool {
        let nt = self.a.cs == 1 && self.b.rs == 1 && self.a.rs == self.k && self.b.cs == self.k;
        nt && self.route_m <= SMALL_M
    }
    /// Computes into `c` (row-major `[m, n]`).
    pub(crate) fn run<T: Real>(self, c: &mut [T], a: &[T], b: &[T]) {
        if self.takes_small_nt() && self.k > 0 {
            assert!(
                a.len() >= self.m * self.k && b.len() >= self.n * self.k,
                "small gemm: inputs too short"
            );
            assert!(c.len() >= self.m * self.n, "small gemm: output too short");
            matmul_nt_small(c, a, b, self);
            return;
        }
        gemm_strided(c, row_major(self.n), a, self.a, b, self.b, self);
    }

    /// [`Mm::run`] into `c` viewed through strides `cst` instead of as a
    /// row-major `[m, n]` (columns of a wider output).
    pub(crate) fn run_strided<T: Real>(self, c: &mut [T], cst: Strides, a: &[T], b: &[T]) {
        gemm_strided(c, cst, a, self.a, b, self.b, self);
    }

    /// The product as a new row-major `[m, n]` buffer (never accumulates).
    /// The GEMM writes every element of a fresh allocation, which is then
    /// not zeroed first: a zeroed buffer of an activation's size cost a
    /// memset pass per product (3% of a training step).
    pub(crate) fn product<T: Real>(self, a: &[T], b: &[T]) -> Vec<T> {
        let mm = self.add_if(false);
        let len = mm.m * mm.n;
        if len == 0 || mm.k == 0 || mm.takes_small_nt() {
            let mut c = vec![T::ZERO; len];
            mm.run(&mut c, a, b);
            return c;
        }
        let mut c: Vec<T> = Vec::with_capacity(len);
        // The GEMM's edge tiles (the last rows, fewer than its register
        // tile's 4–8 columns of the transposed problem, and the last
        // `n mod 16` columns) go through a scratch tile that copies the
        // output in before overwriting it; those few elements are zeroed
        // first so nothing uninitialised is ever read.
        let (m, n) = (mm.m, mm.n);
        let spare = c.spare_capacity_mut();
        let tail_rows = m.min(64);
        for v in &mut spare[(m - tail_rows) * n..len] {
            v.write(T::ZERO);
        }
        let tail_cols = n % 16;
        if tail_cols > 0 {
            for row in spare[..(m - tail_rows) * n].chunks_exact_mut(n) {
                for v in &mut row[n - tail_cols..] {
                    v.write(T::ZERO);
                }
            }
        }
        // SAFETY: `c` has room for `len` elements; `gemm_raw` checks the
        // inputs' bounds and, not accumulating, writes every one of the m·n
        // elements of the row-major output (reading only the zeroed edges
        // above), so all `len` are initialised when the length is set.
        unsafe {
            gemm_raw(c.as_mut_ptr(), len, row_major(mm.n), a, mm.a, b, mm.b, mm);
            c.set_len(len);
        }
        c
    }
}

/// Row and column strides of a matrix view, in elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strides {
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl Strides {
    /// Offset of the last element of a `rows × cols` view (both positive).
    fn last(self, rows: usize, cols: usize) -> usize {
        (rows - 1) * self.rs + (cols - 1) * self.cs
    }
}

fn row_major(cols: usize) -> Strides {
    Strides { rs: cols, cs: 1 }
}

fn col_major(rows: usize) -> Strides {
    Strides { rs: 1, cs: rows }
}

fn gemm_strided<T: Real>(
    c: &mut [T],
    cst: Strides,
    a: &[T],
    ast: Strides,
    b: &[T],
    bst: Strides,
    mm: Mm,
) {
    let Mm {
        m,
        n,
        k,
        accumulate,
        ..
    } = mm;
    if m == 0 || n == 0 {
        return;
    }
    // Bounds: the last element each view reaches must lie inside its slice,
    // which makes the raw-pointer call below sound.
    assert!(c.len() > cst.last(m, n), "gemm: output slice too short");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    c[i * cst.rs + j * cst.cs] = T::ZERO;
                }
            }
        }
        return;
    }
    // SAFETY: `c` is a live, exclusively borrowed slice of `c.len()` elements.
    unsafe { gemm_raw(c.as_mut_ptr(), c.len(), cst, a, ast, b, bst, mm) }
}

/// [`gemm_strided`] into `c_len` elements at `c` (possibly uninitialised
/// when not accumulating: then every element of the `[m, n]` view is
/// written, none read).
///
/// # Safety
/// `c` must be valid for writes (and, when accumulating, reads) of `c_len`
/// elements and must not alias `a` or `b`; `k > 0`, `m, n > 0`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw<T: Real>(
    c: *mut T,
    c_len: usize,
    cst: Strides,
    a: &[T],
    ast: Strides,
    b: &[T],
    bst: Strides,
    mm: Mm,
) {
    let Mm {
        m,
        n,
        k,
        accumulate,
        par,
        bf16,
        ..
    } = mm;
    assert!(m > 0 && n > 0 && k > 0, "gemm: empty product");
    assert!(c_len > cst.last(m, n), "gemm: output slice too short");
    assert!(a.len() > ast.last(m, k), "gemm: lhs slice too short");
    assert!(b.len() > bst.last(k, n), "gemm: rhs slice too short");
    // Only x86-64 has a bf16 GEMM; elsewhere the product stays f32.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bf16;
    #[cfg(target_arch = "x86_64")]
    if bf16 && cst.cs == 1 && crate::gemm_bf16::available() {
        if let (Some(a), Some(b)) = (T::as_f32(a), T::as_f32(b)) {
            // SAFETY: as above; T is f32 (its slices read as f32), and the
            // bf16 GEMM writes every element of c's view when not accumulating.
            unsafe {
                crate::gemm_bf16::gemm(
                    c.cast(),
                    cst.rs,
                    a,
                    ast,
                    b,
                    bst,
                    (m, n, k),
                    accumulate,
                    par == Par::Threads,
                )
            };
            return;
        }
    }
    #[cfg(feature = "openblas")]
    // SAFETY: the asserts above and the caller's guarantees are blas::gemm's.
    if par == Par::Threads
        && unsafe { crate::blas::gemm(c, cst, a, ast, b, bst, (m, n, k), accumulate) }
    {
        return;
    }
    let threads = num_threads();
    let par = match par {
        Par::Threads if threads > 1 => Parallelism::Rayon(threads),
        _ => Parallelism::None,
    };
    // SAFETY: the asserts above keep every element gemm touches inside the
    // buffers; the caller guarantees `c` is writable and does not alias `a`
    // or `b`. gemm supports f32 and f64, the only `Real` types; with
    // `accumulate` false it does not read `c`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            cst.cs as isize,
            cst.rs as isize,
            accumulate,
            a.as_ptr(),
            ast.cs as isize,
            ast.rs as isize,
            b.as_ptr(),
            bst.cs as isize,
            bst.rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
}

/// Whether the CPU runs AVX2 and FMA (checked once). The workspace builds
/// for the x86-64 baseline (SSE2), where LLVM leaves the decode loops
/// scalar, so those have AVX2 versions ([`simd`]) picked at run time.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// Whether the CPU runs AVX-512F (checked once): then the elementwise
/// exp/SwiGLU loops of [`simd`] take sixteen lanes at a time ([`simd512`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| has_avx2() && std::arch::is_x86_feature_detected!("avx512f"))
}

/// Whether the CPU runs AVX-512F and DQ (checked once): then the decode's
/// small-m product pairs two eight-lane accumulators in each register
/// ([`simd512::small_block_f32`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512dq() -> bool {
    static DQ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DQ.get_or_init(|| has_avx512() && std::arch::is_x86_feature_detected!("avx512dq"))
}

/// Σ a·b with eight independent accumulators.
#[inline]
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [T::ZERO; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = T::ZERO;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += *x * *y;
    }
    let s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]);
    s + tail
}

/// `y += alpha · x`.
#[inline]
pub(crate) fn axpy<T: Real>(y: &mut [T], alpha: T, x: &[T]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += alpha * *b;
    }
}

/// Rows of `a` below which [`Mm::nt`] skips the GEMM crate: decode steps
/// multiply a handful of rows by every weight, and the GEMM would repack
/// the whole weight matrix for them each time.
const SMALL_M: usize = 32;

/// Output columns per parallel task of the small-m product.
const SMALL_M_COLS: usize = 64;

/// `c[m, n] (+)= a[m, k] · b[n, k]ᵀ` for small m: each row of `b` is read
/// once and dotted with every row of `a`, four rows of `b` at a time.
fn matmul_nt_small<T: Real>(c: &mut [T], a: &[T], b: &[T], mm: Mm) {
    let (m, n, k) = (mm.m, mm.n, mm.k);
    let blocks = n.div_ceil(SMALL_M_COLS);
    let work = match mm.par {
        Par::Threads => m * n * k * 2,
        Par::Single => 0,
    };
    let parts = par_map(blocks, work, |blk| {
        let j0 = blk * SMALL_M_COLS;
        let j1 = (j0 + SMALL_M_COLS).min(n);
        small_block(a, &b[j0 * k..j1 * k], m, k)
    });
    for (blk, part) in parts.into_iter().enumerate() {
        let j0 = blk * SMALL_M_COLS;
        let w = part.len() / m.max(1);
        for r in 0..m {
            let dst = &mut c[r * n + j0..r * n + j0 + w];
            let src = &part[r * w..(r + 1) * w];
            if mm.accumulate {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += *s);
            } else {
                dst.copy_from_slice(src);
            }
        }
    }
}

/// `a[m, k] · b[w, k]ᵀ` as a new `[m, w]` block (AVX2 for f32 when the CPU has it).
fn small_block<T: Real>(a: &[T], b: &[T], m: usize, k: usize) -> Vec<T> {
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(a32), Some(b32)) = (has_avx2(), T::as_f32(a), T::as_f32(b)) {
        let w = b.len() / k.max(1);
        let mut out = vec![0f32; m * w];
        // SAFETY: AVX2 and FMA (and for the sixteen-lane form AVX-512F and
        // DQ) were detected; the kernels index within a[..m·k], b[..w·k]
        // and out[..m·w], which the asserts in Mm::run guarantee.
        unsafe {
            match has_avx512dq() {
                true => simd512::small_block_f32(a32, b32, m, k, &mut out),
                false => simd::small_block_f32(a32, b32, m, k, &mut out),
            }
        };
        return out.into_iter().map(|x| T::from_f64(x as f64)).collect();
    }
    let w = b.len() / k.max(1);
    let mut out = vec![T::ZERO; m * w];
    for r in 0..m {
        for j in 0..w {
            out[r * w + j] = dot(&a[r * k..(r + 1) * k], &b[j * k..(j + 1) * k]);
        }
    }
    out
}

/// Hand-vectorised f32 kernels (AVX2 + FMA), for the loops LLVM leaves scalar.
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd {
    use std::arch::x86_64::*;

    /// Σ of the eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_hadd_ps(s, s);
        _mm_cvtss_f32(_mm_hadd_ps(s, s))
    }

    /// Σ a·b over `n` elements from raw pointers.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `a` and `b` must hold `n` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot_ptr(a: *const f32, b: *const f32, n: usize) -> f32 {
        let n16 = n / 16 * 16;
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut c = 0;
        while c < n16 {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(c)), _mm256_loadu_ps(b.add(c)), s0);
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.add(c + 8)),
                _mm256_loadu_ps(b.add(c + 8)),
                s1,
            );
            c += 16;
        }
        let mut s = hsum(_mm256_add_ps(s0, s1));
        while c < n {
            s += *a.add(c) * *b.add(c);
            c += 1;
        }
        s
    }

    /// `y += alpha · x` over `n` elements.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `y` and `x` must hold `n` elements.
    #[cfg(test)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy_ptr(y: *mut f32, alpha: f32, x: *const f32, n: usize) {
        let al = _mm256_set1_ps(alpha);
        let n8 = n / 8 * 8;
        let mut c = 0;
        while c < n8 {
            let v = _mm256_fmadd_ps(al, _mm256_loadu_ps(x.add(c)), _mm256_loadu_ps(y.add(c)));
            _mm256_storeu_ps(y.add(c), v);
            c += 8;
        }
        while c < n {
            *y.add(c) += alpha * *x.add(c);
            c += 1;
        }
    }

    /// `scores[j] = q · k[j·stride ..][..n]` for `j < len`: one query
    /// against a block of cached keys, each score the bits of
    /// [`dot_ptr`] (inlined here, so a key costs no call).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `scores` must hold `len` elements,
    /// `q` `n`, and `k` `(len − 1)·stride + n`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot_rows_ptr(
        scores: *mut f32,
        q: *const f32,
        k: *const f32,
        stride: usize,
        len: usize,
        n: usize,
    ) {
        for j in 0..len {
            *scores.add(j) = dot_ptr(q, k.add(j * stride), n);
        }
    }

    /// `o += Σ_j p[j] · v[j·stride ..][..n]` over `j < len` in order, with
    /// `o` held in registers across the keys: every element gets the
    /// same fused multiply-adds in the same order as `len` calls of
    /// [`axpy_ptr`], so the same bits, without loading and storing `o`
    /// once per key.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `o` must hold `n` elements, `p`
    /// `len`, and `v` `(len − 1)·stride + n`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy_rows_ptr(
        o: *mut f32,
        p: *const f32,
        v: *const f32,
        stride: usize,
        len: usize,
        n: usize,
    ) {
        let mut c = 0;
        while c + 32 <= n {
            let mut a0 = _mm256_loadu_ps(o.add(c));
            let mut a1 = _mm256_loadu_ps(o.add(c + 8));
            let mut a2 = _mm256_loadu_ps(o.add(c + 16));
            let mut a3 = _mm256_loadu_ps(o.add(c + 24));
            for j in 0..len {
                let al = _mm256_set1_ps(*p.add(j));
                let row = v.add(j * stride + c);
                a0 = _mm256_fmadd_ps(al, _mm256_loadu_ps(row), a0);
                a1 = _mm256_fmadd_ps(al, _mm256_loadu_ps(row.add(8)), a1);
                a2 = _mm256_fmadd_ps(al, _mm256_loadu_ps(row.add(16)), a2);
                a3 = _mm256_fmadd_ps(al, _mm256_loadu_ps(row.add(24)), a3);
            }
            _mm256_storeu_ps(o.add(c), a0);
            _mm256_storeu_ps(o.add(c + 8), a1);
            _mm256_storeu_ps(o.add(c + 16), a2);
            _mm256_storeu_ps(o.add(c + 24), a3);
            c += 32;
        }
        while c + 8 <= n {
            let mut a = _mm256_loadu_ps(o.add(c));
            for j in 0..len {
                let row = v.add(j * stride + c);
                a = _mm256_fmadd_ps(_mm256_set1_ps(*p.add(j)), _mm256_loadu_ps(row), a);
            }
            _mm256_storeu_ps(o.add(c), a);
            c += 8;
        }
        while c < n {
            for j in 0..len {
                *o.add(c) += *p.add(j) * *v.add(j * stride + c);
            }
            c += 1;
        }
    }

    /// [`exp8`]'s constants, shared with its sixteen-lane form in
    /// [`super::simd512`], which must give the same bits: the clamp, ln 2
    /// split into a high and a low part, and Cephes' `expf` polynomial from
    /// its highest degree down.
    pub(super) const EXP_HI: f32 = 88.722_84;
    pub(super) const EXP_LO: f32 = -87.336_55;
    pub(super) const LN2_HI: f32 = 0.693_359_4;
    pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
    pub(super) const EXP_POLY: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];

    /// e^x in eight lanes: x = n·ln2 + r with |r| ≤ ln2/2, e^r by a
    /// degree-6 polynomial (Cephes' `expf` coefficients, relative error
    /// below 2e-7 over the f32 range), 2^n put into the exponent bits.
    /// Inputs below −87.3 give 0 (so −∞ gives 0), above 88.7 give +∞, NaN
    /// stays NaN.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp8(x: __m256) -> __m256 {
        let hi = _mm256_set1_ps(EXP_HI);
        let lo = _mm256_set1_ps(EXP_LO);
        // max/min return their second operand when one is NaN: NaN stays.
        let xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        // r = x − n·ln2 in two steps (ln2 split into a high and a low part).
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        let r2 = _mm256_mul_ps(r, r);
        let er = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
        // 2^n: n + 127 in the exponent field. n ∈ [−126, 128]; 2^128 is
        // built as 2 · 2^127 so the field never overflows.
        let n1 = _mm256_min_ps(n, _mm256_set1_ps(127.0));
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n1),
            _mm256_set1_epi32(127),
        ));
        let scale = _mm256_castsi256_ps(bits);
        let extra = _mm256_add_ps(_mm256_set1_ps(1.0), _mm256_sub_ps(n, n1));
        let y = _mm256_mul_ps(_mm256_mul_ps(er, scale), extra);
        // Below the clamp: 0 (e^x underflows); above it: +∞.
        let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, lo), y);
        _mm256_blendv_ps(
            y,
            _mm256_set1_ps(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi),
        )
    }

    /// σ(x) = 1 / (1 + e^−x) in eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sigmoid8(x: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(one, _mm256_add_ps(one, e))
    }

    /// `x ← e^(x − m)`, returning Σ of the results.
    ///
    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp_shifted_sum_f32(xs: &mut [f32], m: f32) -> f32 {
        let n8 = xs.len() / 8 * 8;
        let p = xs.as_mut_ptr();
        let mv = _mm256_set1_ps(m);
        let (mut c, mut acc) = (0, _mm256_setzero_ps());
        if super::has_avx512() {
            // SAFETY: AVX-512F was detected; it stays within the slice.
            let (done, lanes) = unsafe { super::simd512::exp_shifted_sum_f32(p, xs.len(), m) };
            (c, acc) = (done, _mm256_loadu_ps(lanes.as_ptr()));
        }
        while c < n8 {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(c)), mv));
            _mm256_storeu_ps(p.add(c), e);
            acc = _mm256_add_ps(acc, e);
            c += 8;
        }
        let mut sum = hsum(acc);
        for x in &mut xs[n8..] {
            *x = scalar_exp(*x - m);
            sum += *x;
        }
        sum
    }

    /// One lane of [`exp8`], for the tails, so every element of a slice
    /// gets the same function.
    #[target_feature(enable = "avx2,fma")]
    fn scalar_exp(x: f32) -> f32 {
        _mm256_cvtss_f32(exp8(_mm256_set1_ps(x)))
    }

    /// `out = g·σ(g)·u`, elementwise over `n` lanes. `out` may be `gate`
    /// itself: each lane is read before it is written.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; the three pointers hold `n` elements.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn swiglu_f32(out: *mut f32, gate: *const f32, up: *const f32, n: usize) {
        let n8 = n / 8 * 8;
        let mut c = 0;
        if super::has_avx512() {
            // SAFETY: AVX-512F was detected; the caller's pointers hold n elements.
            c = unsafe { super::simd512::swiglu_f32(out, gate, up, n) };
        }
        while c < n8 {
            let g = _mm256_loadu_ps(gate.add(c));
            let s = sigmoid8(g);
            let v = _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(up.add(c)));
            _mm256_storeu_ps(out.add(c), v);
            c += 8;
        }
        for i in n8..n {
            let g = *gate.add(i);
            let s = 1.0 / (1.0 + scalar_exp(-g));
            *out.add(i) = g * s * *up.add(i);
        }
    }

    /// Backward of [`swiglu_f32`]: `dg ← da·u·σ(1 + g(1 − σ))`, `du = da·g·σ`.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; the three slices have equal lengths
    /// and `du` has room for as many elements (written, never read).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn swiglu_bwd_f32(dg: &mut [f32], du: *mut f32, gate: &[f32], up: &[f32]) {
        let n = dg.len();
        let n8 = n / 8 * 8;
        let (pa, pb, pg, pu) = (dg.as_mut_ptr(), du, gate.as_ptr(), up.as_ptr());
        let one = _mm256_set1_ps(1.0);
        let mut c = 0;
        if super::has_avx512() {
            // SAFETY: AVX-512F was detected; all four hold n elements.
            c = unsafe { super::simd512::swiglu_bwd_f32(pa, pb, pg, pu, n) };
        }
        while c < n8 {
            let g = _mm256_loadu_ps(pg.add(c));
            let u = _mm256_loadu_ps(pu.add(c));
            let da = _mm256_loadu_ps(pa.add(c));
            let s = sigmoid8(g);
            _mm256_storeu_ps(pb.add(c), _mm256_mul_ps(_mm256_mul_ps(da, g), s));
            // 1 + g(1 − σ)
            let f = _mm256_fmadd_ps(g, _mm256_sub_ps(one, s), one);
            let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(da, u), s), f);
            _mm256_storeu_ps(pa.add(c), v);
            c += 8;
        }
        for i in n8..n {
            let (g, u, da) = (gate[i], up[i], dg[i]);
            let s = 1.0 / (1.0 + scalar_exp(-g));
            *pb.add(i) = da * g * s;
            dg[i] = da * u * s * (1.0 + g * (1.0 - s));
        }
    }

    /// Σ a·b over `k` elements as [`small_block_f32`]'s register tile sums
    /// one output: one eight-lane accumulator, then the scalar tail.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `a` and `b` must hold `k` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_dot_ptr(a: *const f32, b: *const f32, k: usize) -> f32 {
        let k8 = k / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < k8 {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(c)), _mm256_loadu_ps(b.add(c)), acc);
            c += 8;
        }
        tile_sum(acc, a, b, k8, k)
    }

    /// One register tile output: its eight-lane accumulator's sum, then
    /// the scalar tail `k8..k` of `a · b`.
    ///
    /// # Safety
    /// AVX2 must be available; `a` and `b` must hold `k` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_sum(
        acc: __m256,
        a: *const f32,
        b: *const f32,
        k8: usize,
        k: usize,
    ) -> f32 {
        let mut s = hsum(acc);
        for cc in k8..k {
            s += *a.add(cc) * *b.add(cc);
        }
        s
    }

    /// The outputs of `out[m, w] = a[m, k] · b[w, k]ᵀ` outside the 2 × 4
    /// tile region (rows past `m / 2 · 2`, columns past `w / 4 · 4`), each a
    /// [`dot_ptr`]: the same bits whichever small-m kernel did the tiles.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `a` holds m·k, `b` w·k and `out` m·w
    /// elements.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn small_block_edges(
        a: *const f32,
        b: *const f32,
        m: usize,
        w: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let (m2, w4) = (m / 2 * 2, w / 4 * 4);
        for r in 0..m {
            let cols = if r < m2 { w4..w } else { 0..w };
            for j in cols {
                out[r * w + j] = dot_ptr(a.add(r * k), b.add(j * k), k);
            }
        }
    }

    /// `out[m, w] = a[m, k] · b[w, k]ᵀ` with a 2 × 4 register tile.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `a` holds m·k, `b` w·k and `out` m·w elements.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn small_block_f32(
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let w = b.len() / k.max(1);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let k8 = k / 8 * 8;
        let (m2, w4) = (m / 2 * 2, w / 4 * 4);
        for j in (0..w4).step_by(4) {
            let b0 = pb.add(j * k);
            let (b1, b2, b3) = (b0.add(k), b0.add(2 * k), b0.add(3 * k));
            for r in (0..m2).step_by(2) {
                let (x0, x1) = (pa.add(r * k), pa.add((r + 1) * k));
                let mut acc = [_mm256_setzero_ps(); 8];
                let mut c = 0;
                while c < k8 {
                    let u = _mm256_loadu_ps(x0.add(c));
                    let v = _mm256_loadu_ps(x1.add(c));
                    for (q, bq) in [b0, b1, b2, b3].into_iter().enumerate() {
                        let y = _mm256_loadu_ps(bq.add(c));
                        acc[q] = _mm256_fmadd_ps(u, y, acc[q]);
                        acc[4 + q] = _mm256_fmadd_ps(v, y, acc[4 + q]);
                    }
                    c += 8;
                }
                for (q, bq) in [b0, b1, b2, b3].into_iter().enumerate() {
                    out[r * w + j + q] = tile_sum(acc[q], x0, bq, k8, k);
                    out[(r + 1) * w + j + q] = tile_sum(acc[4 + q], x1, bq, k8, k);
                }
            }
        }
        // Leftover rows of `a` and of `b`.
        small_block_edges(pa, pb, m, w, k, out);
    }
}

/// Sixteen-lane (AVX-512F) forms of [`simd`]'s exp and SwiGLU loops: the
/// same operations lane for lane, so every element gets the same bits as
/// on eight lanes, and sums keep the eight-lane order (each 16-lane block
/// is added as its low then its high half). Each handles the whole 16-lane
/// blocks of its input and returns how far it got; the eight-lane loop
/// does the rest. Profiling the default run's warm start put these loops
/// at an eighth of its time.
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd512 {
    use std::arch::x86_64::*;

    use super::simd::{
        small_block_edges, tile_dot_ptr, tile_sum, EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO,
    };

    /// [`super::simd::small_block_f32`] with the same bits, twice the lanes:
    /// each register holds the eight-lane accumulators of one row of `a`
    /// against two rows of `b` (the row's eight values broadcast to both
    /// halves), in a 4 × 8 tile. Every output in the eight-lane kernel's
    /// 2 × 4 tile region gets its one-accumulator sum, and every other
    /// output its [`super::simd::dot_ptr`], as there.
    ///
    /// # Safety
    /// AVX-512F, AVX-512DQ, AVX2 and FMA must be available; `a` holds m·k,
    /// `b` w·k and `out` m·w elements.
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
    pub(crate) unsafe fn small_block_f32(
        a: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let w = b.len() / k.max(1);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let k8 = k / 8 * 8;
        // The eight-lane kernel's tile region, and the part of it this
        // kernel's larger tile covers.
        let (m2, w4) = (m / 2 * 2, w / 4 * 4);
        let (m4, w8) = (m / 4 * 4, w / 8 * 8);
        for j in (0..w8).step_by(8) {
            let bq = |q: usize| pb.add((j + q) * k);
            for r in (0..m4).step_by(4) {
                let mut acc = [_mm512_setzero_ps(); 16];
                let mut c = 0;
                while c < k8 {
                    let mut pair = [_mm512_setzero_ps(); 4];
                    for (p, y) in pair.iter_mut().enumerate() {
                        let lo = _mm512_castps256_ps512(_mm256_loadu_ps(bq(2 * p).add(c)));
                        *y = _mm512_insertf32x8::<1>(lo, _mm256_loadu_ps(bq(2 * p + 1).add(c)));
                    }
                    for i in 0..4 {
                        let x = _mm512_broadcast_f32x8(_mm256_loadu_ps(pa.add((r + i) * k + c)));
                        for (p, y) in pair.iter().enumerate() {
                            acc[4 * i + p] = _mm512_fmadd_ps(x, *y, acc[4 * i + p]);
                        }
                    }
                    c += 8;
                }
                for i in 0..4 {
                    let x = pa.add((r + i) * k);
                    for p in 0..4 {
                        let v = acc[4 * i + p];
                        let halves = [_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v)];
                        for (h, half) in halves.into_iter().enumerate() {
                            let q = 2 * p + h;
                            out[(r + i) * w + j + q] = tile_sum(half, x, bq(q), k8, k);
                        }
                    }
                }
            }
        }
        // The rest of the eight-lane kernel's tile region, output by output.
        for r in 0..m2 {
            let cols = if r < m4 { w8..w4 } else { 0..w4 };
            for j in cols {
                out[r * w + j] = tile_dot_ptr(pa.add(r * k), pb.add(j * k), k);
            }
        }
        // Outside it, as there.
        small_block_edges(pa, pb, m, w, k, out);
    }

    /// [`super::simd::exp8`] on sixteen lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let hi = _mm512_set1_ps(EXP_HI);
        let lo = _mm512_set1_ps(EXP_LO);
        let xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let r2 = _mm512_mul_ps(r, r);
        let er = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
        let n1 = _mm512_min_ps(n, _mm512_set1_ps(127.0));
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n1),
            _mm512_set1_epi32(127),
        ));
        let scale = _mm512_castsi512_ps(bits);
        let extra = _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_sub_ps(n, n1));
        let y = _mm512_mul_ps(_mm512_mul_ps(er, scale), extra);
        let y = _mm512_maskz_mov_ps(!_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, lo), y);
        _mm512_mask_mov_ps(
            y,
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, hi),
            _mm512_set1_ps(f32::INFINITY),
        )
    }

    /// σ(x) on sixteen lanes, as [`super::simd`]'s `sigmoid8`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sigmoid16(x: __m512) -> __m512 {
        let one = _mm512_set1_ps(1.0);
        let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_div_ps(one, _mm512_add_ps(one, e))
    }

    /// The low and the high eight lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn halves(v: __m512) -> (__m256, __m256) {
        let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
        (_mm512_castps512_ps256(v), _mm256_castpd_ps(hi))
    }

    /// `x ← e^(x − m)` over the whole 16-lane blocks of `n` elements at `p`;
    /// returns the count done and the eight-lane partial sums.
    ///
    /// # Safety
    /// AVX-512F must be available; `p` holds `n` elements.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn exp_shifted_sum_f32(p: *mut f32, n: usize, m: f32) -> (usize, [f32; 8]) {
        let n16 = n / 16 * 16;
        let mv = _mm512_set1_ps(m);
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < n16 {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(c)), mv));
            _mm512_storeu_ps(p.add(c), e);
            let (lo, hi) = halves(e);
            acc = _mm256_add_ps(_mm256_add_ps(acc, lo), hi);
            c += 16;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        (n16, lanes)
    }

    /// [`super::simd::swiglu_f32`] over the whole 16-lane blocks; returns the count done.
    ///
    /// # Safety
    /// AVX-512F must be available; the three pointers hold `n` elements.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn swiglu_f32(
        out: *mut f32,
        gate: *const f32,
        up: *const f32,
        n: usize,
    ) -> usize {
        let n16 = n / 16 * 16;
        let mut c = 0;
        while c < n16 {
            let g = _mm512_loadu_ps(gate.add(c));
            let s = sigmoid16(g);
            let v = _mm512_mul_ps(_mm512_mul_ps(g, s), _mm512_loadu_ps(up.add(c)));
            _mm512_storeu_ps(out.add(c), v);
            c += 16;
        }
        n16
    }

    /// [`super::simd::swiglu_bwd_f32`] over the whole 16-lane blocks (`dg`
    /// in place, `du` written); returns the count done.
    ///
    /// # Safety
    /// AVX-512F must be available; the four pointers hold `n` elements.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn swiglu_bwd_f32(
        dg: *mut f32,
        du: *mut f32,
        gate: *const f32,
        up: *const f32,
        n: usize,
    ) -> usize {
        let n16 = n / 16 * 16;
        let one = _mm512_set1_ps(1.0);
        let mut c = 0;
        while c < n16 {
            let g = _mm512_loadu_ps(gate.add(c));
            let u = _mm512_loadu_ps(up.add(c));
            let da = _mm512_loadu_ps(dg.add(c));
            let s = sigmoid16(g);
            _mm512_storeu_ps(du.add(c), _mm512_mul_ps(_mm512_mul_ps(da, g), s));
            let f = _mm512_fmadd_ps(g, _mm512_sub_ps(one, s), one);
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(da, u), s), f);
            _mm512_storeu_ps(dg.add(c), v);
            c += 16;
        }
        n16
    }
}

/// σ(x), the logistic function.
#[inline]
pub(crate) fn sigmoid<T: Real>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

/// SiLU `x · σ(x)`.
#[inline]
pub(crate) fn silu<T: Real>(x: T) -> T {
    x * sigmoid(x)
}

/// `x ← exp(x − m)` over the slice; returns Σ of the results. The f32 path
/// runs eight lanes at a time (AVX2 + FMA) with [`simd::exp8`]: libm's
/// scalar `expf` was a tenth of a training step's non-GEMM time.
pub(crate) fn exp_shifted_sum<T: Real>(xs: &mut [T], m: T) -> T {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        if let Some(x32) = T::as_f32_mut(xs) {
            let m32 = m.to_f64() as f32;
            // SAFETY: AVX2 and FMA were detected; the kernel stays within the slice.
            return T::from_f64(unsafe { simd::exp_shifted_sum_f32(x32, m32) } as f64);
        }
    }
    let mut sum = T::ZERO;
    for x in xs.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    sum
}

/// `out = silu(gate) ⊙ up`, elementwise (AVX2 for f32 when the CPU has it);
/// writes every element of `out` without reading it.
pub(crate) fn swiglu_into<T: Real>(out: &mut [MaybeUninit<T>], gate: &[T], up: &[T]) {
    let n = out.len().min(gate.len()).min(up.len());
    let (out, gate, up) = (&mut out[..n], &gate[..n], &up[..n]);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        if let (Some(g), Some(u)) = (T::as_f32(gate), T::as_f32(up)) {
            // SAFETY: AVX2 and FMA were detected; T is f32 (its inputs read as
            // f32), so `out` holds n f32 slots, which the kernel only writes.
            unsafe { simd::swiglu_f32(out.as_mut_ptr().cast(), g.as_ptr(), u.as_ptr(), n) };
            return;
        }
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        o.write(silu(g) * u);
    }
}

/// `gate ← silu(gate) ⊙ up` in place, f32 (the decode path's buffers).
pub(crate) fn swiglu_in_place(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected; both slices hold n elements and
        // the kernel reads each lane of `gate` before writing it.
        let g = gate.as_mut_ptr();
        unsafe { simd::swiglu_f32(g, g, up.as_ptr(), n) };
        return;
    }
    for (a, &b) in gate[..n].iter_mut().zip(&up[..n]) {
        *a = silu(*a) * b;
    }
}

/// Backward of [`swiglu_into`]: turns `da` (in `dg`) into d gate in place and
/// writes d up (without reading it): `dg = da·u·σ(g)(1 + g(1 − σ(g)))`,
/// `du = da·silu(g)`.
pub(crate) fn swiglu_bwd_into<T: Real>(
    dg: &mut [T],
    du: &mut [MaybeUninit<T>],
    gate: &[T],
    up: &[T],
) {
    let n = dg.len().min(du.len()).min(gate.len()).min(up.len());
    let (dg, du, gate, up) = (&mut dg[..n], &mut du[..n], &gate[..n], &up[..n]);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        if let (Some(g), Some(u)) = (T::as_f32(gate), T::as_f32(up)) {
            if let Some(a) = T::as_f32_mut(dg) {
                // SAFETY: AVX2 and FMA were detected; T is f32, all four hold
                // n elements, and the kernel only writes `du`.
                unsafe { simd::swiglu_bwd_f32(a, du.as_mut_ptr().cast(), g, u) };
                return;
            }
        }
    }
    for (((a, b), &g), &u) in dg.iter_mut().zip(du.iter_mut()).zip(gate).zip(up) {
        let sg = sigmoid(g);
        let da = *a;
        b.write(da * g * sg);
        *a = da * u * sg * (T::ONE + g * (T::ONE - sg));
    }
}

/// A new `len`-element buffer that `fill(i, chunk)` writes in `width`-wide
/// chunks over the threads (split as [`par_chunks_mut`] splits), with no
/// zeroing pass first: zeroing an activation-sized buffer ran on one thread
/// while the other waited, 3–7% of a training step.
///
/// # Safety
/// `fill` must write every element of each chunk it is given. Debug builds
/// (the tests) fill the buffer with NaN first, so a missed element shows as
/// a NaN instead of as undefined behaviour.
pub(crate) unsafe fn par_fill<T, F>(len: usize, width: usize, work: usize, fill: F) -> Vec<T>
where
    T: Real,
    F: Fn(usize, &mut [MaybeUninit<T>]) + Sync + Send,
{
    let mut buf = Vec::with_capacity(len);
    let spare = &mut buf.spare_capacity_mut()[..len];
    if cfg!(debug_assertions) {
        for x in spare.iter_mut() {
            x.write(T::from_f64(f64::NAN));
        }
    }
    par_chunks_mut(spare, width, work, fill);
    // SAFETY: the caller's `fill` wrote all `len` elements.
    unsafe { buf.set_len(len) };
    buf
}

/// Copies `src` into `dst` (of the same length).
pub(crate) fn write_slice<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "write_slice: lengths differ");
    // SAFETY: equal lengths; `MaybeUninit<T>` has `T`'s layout; the two
    // borrows cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
}

/// `s` as initialised values.
///
/// # Safety
/// Every element of `s` has been written.
pub(crate) unsafe fn assume_written<T>(s: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: the caller guarantees every element is initialised;
    // `MaybeUninit<T>` has `T`'s layout.
    unsafe { &mut *(s as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// Below this many operations a parallel split costs more than it saves.
pub(crate) const PAR_MIN_WORK: usize = 1 << 15;

/// Runs `f(item_index, chunk)` for each `width`-wide chunk of `out`,
/// spreading the chunks over the threads when `work` (a rough count of
/// operations in all) is large enough to pay for it.
pub(crate) fn par_chunks_mut<T, F>(out: &mut [T], width: usize, work: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync + Send,
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

/// [`par_chunks_mut`] whose calls each return a value, collected in chunk order.
pub(crate) fn par_chunks_map<T, R, F>(out: &mut [T], width: usize, work: usize, f: F) -> Vec<R>
where
    T: Send,
    R: Send,
    F: Fn(usize, &mut [T]) -> R + Sync + Send,
{
    use rayon::prelude::*;
    let width = width.max(1);
    if num_threads() > 1 && work >= PAR_MIN_WORK && out.len() > width {
        out.par_chunks_mut(width)
            .enumerate()
            .map(|(i, c)| f(i, c))
            .collect()
    } else {
        out.chunks_mut(width)
            .enumerate()
            .map(|(i, c)| f(i, c))
            .collect()
    }
}

/// [`par_chunks_mut`] over two outputs chunked alike (`wa` and `wb` wide).
pub(crate) fn par_chunks2_mut<T, F>(
    a: &mut [T],
    wa: usize,
    b: &mut [T],
    wb: usize,
    work: usize,
    f: F,
) where
    T: Send,
    F: Fn(usize, &mut [T], &mut [T]) + Sync + Send,
{
    use rayon::prelude::*;
    let (wa, wb) = (wa.max(1), wb.max(1));
    if num_threads() > 1 && work >= PAR_MIN_WORK && a.len() > wa {
        a.par_chunks_mut(wa)
            .zip(b.par_chunks_mut(wb))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    } else {
        a.chunks_mut(wa)
            .zip(b.chunks_mut(wb))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    }
}

/// Runs `f(i)` for `i in 0..n` on the threads (when `work` pays for it),
/// collecting the results in order.
pub(crate) fn par_map<R, F>(n: usize, work: usize, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize) -> R + Sync + Send,
{
    use rayon::prelude::*;
    if num_threads() > 1 && work >= PAR_MIN_WORK && n > 1 {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// RMSNorm of each `d`-wide row of `x` into `y`: `x · r · w` with
/// `r = 1 / sqrt(mean(x²) + ε)`; returns nothing, writes `r` per row into
/// `inv` when given.
pub(crate) fn rms_norm_rows<T: Real>(
    y: &mut [T],
    x: &[T],
    w: &[T],
    d: usize,
    eps: T,
    inv: Option<&mut [T]>,
) {
    let rows = x.len() / d;
    let mut sink = [T::ZERO];
    let mut inv = inv;
    for r in 0..rows {
        let xr = &x[r * d..(r + 1) * d];
        let ms = dot(xr, xr) / T::from_f64(d as f64);
        let rr = T::ONE / (ms + eps).sqrt();
        let slot = match inv.as_deref_mut() {
            Some(v) => &mut v[r],
            None => &mut sink[0],
        };
        *slot = rr;
        for ((o, a), g) in y[r * d..(r + 1) * d].iter_mut().zip(xr).zip(w) {
            *o = *a * rr * *g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decode's sixteen-lane small-m product gives the eight-lane one's
    /// bits, for shapes with and without whole tiles and a scalar tail.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sixteen_lane_small_products_give_the_eight_lane_bits() {
        if !has_avx512dq() {
            return;
        }
        let mut rng = 0x2545_f491_u32;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            (rng as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        for m in [1, 2, 3, 4, 5, 7, 8, 16, 17] {
            for w in [1, 3, 4, 7, 8, 12, 17, 64] {
                for k in [3, 8, 13, 64, 70] {
                    let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
                    let b: Vec<f32> = (0..w * k).map(|_| next()).collect();
                    let (mut eight, mut sixteen) = (vec![0f32; m * w], vec![1f32; m * w]);
                    // SAFETY: AVX-512F/DQ (and so AVX2/FMA) detected above;
                    // the buffers hold m·k, w·k and m·w elements.
                    unsafe {
                        simd::small_block_f32(&a, &b, m, k, &mut eight);
                        simd512::small_block_f32(&a, &b, m, k, &mut sixteen);
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&eight), bits(&sixteen), "m {m} w {w} k {k}");
                }
            }
        }
    }

    /// The block forms of attention's dot products and updates give the
    /// bits of one `dot_ptr` / `axpy_ptr` call per key, for head sizes
    /// with and without a 32-wide, 8-wide and scalar part.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn attention_blocks_give_the_bits_of_one_call_per_key() {
        if !has_avx2() {
            return;
        }
        let mut rng = 0x9e37_79b9_u32;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            (rng as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        for n in [3, 8, 24, 40, 64, 71] {
            for len in [1, 5, 128] {
                let stride = n + 5;
                let k: Vec<f32> = (0..(len - 1) * stride + n).map(|_| next()).collect();
                let q: Vec<f32> = (0..n).map(|_| next()).collect();
                let p: Vec<f32> = (0..len).map(|_| next()).collect();
                let o0: Vec<f32> = (0..n).map(|_| next()).collect();
                let (mut scores, mut one_by_one) = (vec![0f32; len], vec![0f32; len]);
                let (mut o, mut o_ref) = (o0.clone(), o0.clone());
                // SAFETY: AVX2 detected above; every buffer holds what is read.
                unsafe {
                    simd::dot_rows_ptr(scores.as_mut_ptr(), q.as_ptr(), k.as_ptr(), stride, len, n);
                    simd::axpy_rows_ptr(o.as_mut_ptr(), p.as_ptr(), k.as_ptr(), stride, len, n);
                    for j in 0..len {
                        one_by_one[j] = simd::dot_ptr(q.as_ptr(), k.as_ptr().add(j * stride), n);
                        simd::axpy_ptr(o_ref.as_mut_ptr(), p[j], k.as_ptr().add(j * stride), n);
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&scores), bits(&one_by_one), "dot n {n} len {len}");
                assert_eq!(bits(&o), bits(&o_ref), "axpy n {n} len {len}");
                assert_ne!(bits(&o), bits(&o0), "n {n} len {len}: nothing was added");
            }
        }
    }

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

    /// Rows picked out of a product and routed as the whole product get
    /// the bits they get there: the LM head computes the scored rows alone
    /// and a run must keep its bits (the small-m kernel, which 5 rows
    /// would take on their own, sums in another order).
    #[test]
    fn rows_routed_as_the_whole_product_keep_its_bits() {
        let (n_rows, vocab, k) = (300, 70, 200);
        let a: Vec<f32> = (0..n_rows * k).map(|i| (i as f32 * 0.377).sin()).collect();
        let b: Vec<f32> = (0..vocab * k).map(|i| (i as f32 * 0.911).cos()).collect();
        let whole = Mm::nt(n_rows, vocab, k).product(&a, &b);
        let picked = [3usize, 64, 65, 200, 299];
        let rows: Vec<f32> = picked
            .iter()
            .flat_map(|&r| a[r * k..(r + 1) * k].to_vec())
            .collect();
        let part = Mm::nt(picked.len(), vocab, k)
            .routed_as(n_rows)
            .product(&rows, &b);
        for (i, &r) in picked.iter().enumerate() {
            let (got, want) = (
                &part[i * vocab..(i + 1) * vocab],
                &whole[r * vocab..(r + 1) * vocab],
            );
            let same = got
                .iter()
                .zip(want)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "row {r}: {:?} vs {:?}", &got[..4], &want[..4]);
        }
    }

    #[test]
    fn the_three_gemm_layouts_agree_with_a_naive_product() {
        // 7 rows take the small-m path of `nt`, 40 and 101 the GEMM crate
        // (101 × 37: edge tiles in both directions).
        for (m, n, k) in [(7, 5, 11), (40, 70, 19), (101, 37, 23)] {
            let a = seq(m * k, 0.37);
            let b = seq(n * k, 0.91);
            let want = naive(&a, &b, m, n, k);
            for par in [true, false] {
                let mm = |f: fn(usize, usize, usize) -> Mm| {
                    if par {
                        f(m, n, k)
                    } else {
                        f(m, n, k).single()
                    }
                };
                let mut c = vec![1f32; m * n];
                mm(Mm::nt).run(&mut c, &a, &b);
                assert_eq!(c, want, "nt {m}x{n}x{k}");
                assert_eq!(mm(Mm::nt).product(&a, &b), want, "nt product {m}x{n}x{k}");
                mm(Mm::nt).add().run(&mut c, &a, &b);
                let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
                assert_eq!(c, twice, "nt add {m}x{n}x{k}");
                // b as [k, n]
                let bt: Vec<f32> = (0..k * n).map(|i| b[(i % n) * k + i / n]).collect();
                let mut c2 = vec![0f32; m * n];
                mm(Mm::nn).run(&mut c2, &a, &bt);
                assert_eq!(c2, want);
                assert_eq!(mm(Mm::nn).product(&a, &bt), want, "nn product");
                // a as [k, m]: the product, then accumulating onto c2: 2 × want
                let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
                assert_eq!(mm(Mm::tn).product(&at, &bt), want, "tn product");
                mm(Mm::tn).add().run(&mut c2, &at, &bt);
                assert_eq!(c2, twice);
            }
        }
    }

    #[test]
    fn vector_exp_is_within_two_parts_in_ten_million_of_libm() {
        // A sweep over the whole finite range plus the edges the clamp handles.
        let mut xs: Vec<f32> = (0..20_000).map(|i| -90.0 + i as f32 * 0.009).collect();
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 88.7, -87.3, -100.0, 100.0]);
        let mut got = xs.clone();
        let sum = exp_shifted_sum(&mut got, 0.0);
        let mut want_sum = 0f64;
        for (&x, &e) in xs.iter().zip(&got) {
            let want = (x as f64).exp();
            want_sum += e as f64;
            if x < -87.336_55 {
                assert_eq!(e, 0.0, "e^{x} below the clamp");
            } else if x > 88.722_84 {
                assert_eq!(e, f32::INFINITY, "e^{x} above the clamp");
            } else if want > f32::MIN_POSITIVE as f64 {
                let rel = ((e as f64 - want) / want).abs();
                assert!(rel < 2e-7, "e^{x}: {e} vs {want} (relative {rel:e})");
            }
        }
        assert!(sum.is_infinite() && want_sum.is_infinite());
        let mut special = [f32::NEG_INFINITY, f32::NAN, 3.0];
        exp_shifted_sum(&mut special, 1.0);
        assert_eq!(special[0], 0.0);
        assert!(special[1].is_nan());
        assert!((special[2] - 2f32.exp()).abs() < 1e-6);
    }

    #[test]
    fn vector_swiglu_and_its_backward_match_the_scalar_formulas() {
        // 37 lanes: four full vectors and a five-lane tail.
        let g = seq(37, 0.83).iter().map(|x| x * 9.0).collect::<Vec<_>>();
        let u = seq(37, 0.41);
        let da = seq(37, 0.29);
        let mut out = vec![MaybeUninit::uninit(); 37];
        swiglu_into(&mut out, &g, &u);
        // SAFETY: swiglu_into writes every element.
        let out = unsafe { assume_written(&mut out) };
        let mut in_place = g.clone();
        swiglu_in_place(&mut in_place, &u);
        let (mut dg, mut du) = (da.clone(), vec![MaybeUninit::uninit(); 37]);
        swiglu_bwd_into(&mut dg, &mut du, &g, &u);
        // SAFETY: swiglu_bwd_into writes every element of du.
        let du = unsafe { assume_written(&mut du) };
        for i in 0..37 {
            let (gi, ui, di) = (g[i] as f64, u[i] as f64, da[i] as f64);
            let s = 1.0 / (1.0 + (-gi).exp());
            let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs());
            assert!(close(out[i], gi * s * ui), "swiglu lane {i}");
            assert_eq!(in_place[i], out[i], "in place lane {i}");
            assert!(close(du[i], di * gi * s), "d up lane {i}");
            assert!(
                close(dg[i], di * ui * s * (1.0 + gi * (1.0 - s))),
                "d gate lane {i}"
            );
        }
    }

    #[test]
    fn par_fill_gives_each_chunk_its_own_slots_in_order_on_any_thread_count() {
        // 1000 elements in chunks of 64 (the last 40), enough work to split.
        let fill = |i: usize, chunk: &mut [MaybeUninit<f64>]| {
            for (j, x) in chunk.iter_mut().enumerate() {
                x.write((i * 64 + j) as f64);
            }
        };
        let want: Vec<f64> = (0..1000).map(|v| v as f64).collect();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            // SAFETY: `fill` writes every element of its chunk.
            let got = pool.install(|| unsafe { par_fill(1000, 64, PAR_MIN_WORK, fill) });
            assert_eq!(got, want, "{threads} threads");
        }
        // Nothing to fill.
        // SAFETY: there is no element to write.
        let empty: Vec<f64> = unsafe { par_fill(0, 64, 0, fill) };
        assert!(empty.is_empty());
    }

    /// The sixteen-lane loops give the eight-lane loops' bits: a slice of 8
    /// runs the AVX2 loop, a slice of 16 (the same 8 values twice) the
    /// AVX-512 one; the exp sums keep the eight-lane order too.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sixteen_lane_exp_and_swiglu_give_the_eight_lane_bits() {
        if !has_avx512() {
            eprintln!("no AVX-512F here: nothing to compare");
            return;
        }
        let mut xs: Vec<f32> = (0..104).map(|i| (i as f32 * 0.77).sin() * 40.0).collect();
        xs.extend([0.0, -0.0, 1e-30, -90.0, 89.0, f32::NEG_INFINITY, 3.5, -3.5]);
        // The whole slice (six 16-lane blocks, one 8-lane one, nothing
        // infinite in it): its sum adds lane j's elements j, j + 8, … in order.
        let finite = &xs[..104];
        let mut all = finite.to_vec();
        // SAFETY: AVX2 and FMA come with AVX-512F.
        let sum = unsafe { simd::exp_shifted_sum_f32(&mut all, 0.25) };
        let mut lanes = [0f32; 8];
        for (i, e) in all.iter().enumerate() {
            lanes[i % 8] += e;
        }
        assert_eq!(sum.to_bits(), hsum_f32(&lanes).to_bits());
        for block in xs.chunks_exact(8) {
            let twice: Vec<f32> = block.iter().chain(block).copied().collect();
            let up: Vec<f32> = block.iter().map(|x| 0.5 - x * 0.01).collect();
            let up2: Vec<f32> = up.iter().chain(&up).copied().collect();
            // exp with its sum.
            let (mut e8, mut e16) = (block.to_vec(), twice.clone());
            // SAFETY: AVX2 and FMA come with AVX-512F here.
            let (s8, s16) = unsafe {
                (
                    simd::exp_shifted_sum_f32(&mut e8, 0.25),
                    simd::exp_shifted_sum_f32(&mut e16, 0.25),
                )
            };
            assert_eq!(bits(&e8), bits(&e16[..8]), "exp of {block:?}");
            assert_eq!(bits(&e8), bits(&e16[8..]), "exp of {block:?}");
            // The 16-lane sum is the 8-lane sum's lanes, each added twice in order.
            let mut lanes = [0f32; 8];
            for (i, e) in e16.iter().enumerate() {
                lanes[i % 8] += e;
            }
            let mut want = [0f32; 8];
            for (w, e) in want.iter_mut().zip(&e8) {
                *w += e;
            }
            assert!(s8.to_bits() == hsum_f32(&want).to_bits() || s8.is_nan());
            assert!(s16.to_bits() == hsum_f32(&lanes).to_bits() || s16.is_nan());
            // SwiGLU and its backward.
            let (mut o8, mut o16) = (vec![0f32; 8], vec![0f32; 16]);
            // SAFETY: as above; the pointers hold 8 and 16 elements.
            unsafe {
                simd::swiglu_f32(o8.as_mut_ptr(), block.as_ptr(), up.as_ptr(), 8);
                simd::swiglu_f32(o16.as_mut_ptr(), twice.as_ptr(), up2.as_ptr(), 16);
            }
            assert_eq!(bits(&o8), bits(&o16[..8]), "swiglu of {block:?}");
            assert_eq!(bits(&o8), bits(&o16[8..]), "swiglu of {block:?}");
            let (mut dg8, mut dg16) = (up.clone(), up2.clone());
            let (mut du8, mut du16) = (vec![0f32; 8], vec![0f32; 16]);
            // SAFETY: as above.
            unsafe {
                simd::swiglu_bwd_f32(&mut dg8, du8.as_mut_ptr(), block, &o8);
                simd::swiglu_bwd_f32(&mut dg16, du16.as_mut_ptr(), &twice, &o16);
            }
            for half in [&dg16[..8], &dg16[8..]] {
                assert_eq!(bits(&dg8), bits(half), "swiglu dg of {block:?}");
            }
            for half in [&du16[..8], &du16[8..]] {
                assert_eq!(bits(&du8), bits(half), "swiglu du of {block:?}");
            }
        }
    }

    /// Σ of eight lanes in [`simd`]'s `hsum` order: halves, then pairs.
    fn hsum_f32(l: &[f32; 8]) -> f32 {
        let s: Vec<f32> = (0..4).map(|i| l[i] + l[i + 4]).collect();
        let (a, b) = (s[0] + s[1], s[2] + s[3]);
        a + b
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn dot_matches_a_plain_sum() {
        let a = seq(19, 0.3);
        let b = seq(19, 0.7);
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - want).abs() < 1e-5);
    }
}
