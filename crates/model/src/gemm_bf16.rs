//! A GEMM in bfloat16 with f32 sums, for CPUs with AVX512-BF16 (AMD Zen 4
//! and later, Intel Cooper Lake and Sapphire Rapids and later).
//!
//! `c[m, n] (+)= a[m, k] · b[k, n]` with `a` and `b` rounded to bf16 (to
//! nearest, ties to even) and every product summed in f32: what PyTorch's
//! bf16 autocast does to a linear layer's inputs. `vdpbf16ps` does twice the
//! multiply-adds of an f32 FMA per instruction, and the packed operands are
//! half the bytes.
//!
//! Both operands are packed first (converted while packing, so master
//! weights stay f32): rows in strips of the kernel's width, k in pairs (one
//! pair of bf16 per 32-bit lane, as `vdpbf16ps` reads them). The output is
//! cut into blocks fixed by the shape alone and each block's sums run in
//! one order, so a product's bits do not depend on the thread count.

use std::sync::OnceLock;

use super::kernels::{num_threads, par_chunks_mut, Strides, PAR_MIN_WORK};

/// Rows of `a` per kernel call (each broadcast against the `b` strip).
const MR: usize = 6;
/// Columns of `b` per kernel call: four sixteen-lane registers.
const NR: usize = 64;
/// At most this many k-pairs per pass over a block of `c` (a 64-column
/// strip of `b` is then 32 KiB, inside a 48 KiB L1).
const KC: usize = 128;
/// Rows and columns of `c` per task.
const MC: usize = 16 * MR;
const NC: usize = 8 * NR;

/// Whether this CPU runs the kernel (AVX-512F, BW and BF16; checked once).
pub(crate) fn available() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    })
}

/// `x` rounded to bfloat16 (to nearest, ties to even; a NaN stays a NaN),
/// as its 16 bits: the rounding `vcvtne2ps2bf16` does.
pub(crate) fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// The f32 a bfloat16 stands for (exact).
#[cfg(test)]
pub(crate) fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to bfloat16 and back.
#[cfg(test)]
pub(crate) fn round_bf16(x: f32) -> f32 {
    from_bf16(to_bf16(x))
}

/// The bf16 pair `(x[2p], x[2p + 1])` of a k-line read by `at` (zero past `k`).
fn pair(at: impl Fn(usize) -> f32, p: usize, k: usize) -> u32 {
    let h = |l: usize| if l < k { to_bf16(at(l)) } else { 0 };
    u32::from(h(2 * p)) | u32::from(h(2 * p + 1)) << 16
}

/// The broadcast operand `a`: 32-bit lanes holding the bf16 pair
/// `(a[i, 2p], a[i, 2p + 1])` (low half first) at `data[i·rs + p·ps]`, its
/// rows padded with zeros to a multiple of [`MR`]. Packing keeps `a`'s own
/// order (rows, or k-lines, contiguous), so it is a streaming conversion.
struct Lhs {
    data: Vec<u32>,
    rs: usize,
    ps: usize,
}

/// Converts the `[rows, k]` view `x` (element `(i, l)` at `i·rs + l·cs`).
fn pack_lhs(x: &[f32], st: Strides, rows: usize, k: usize) -> Lhs {
    let pairs = k.div_ceil(2);
    let padded = rows.next_multiple_of(MR);
    let mut data = vec![0u32; padded * pairs];
    let work = rows * k;
    if st.rs == 1 && st.cs != 1 {
        // k-lines contiguous (a weight gradient's `dyᵀ`): pair-major.
        par_chunks_mut(&mut data, padded, work, |p, out| {
            // SAFETY: AVX-512 BF16 is present (the caller's check); lines
            // 2p and 2p + 1 hold `rows` elements each inside `x`.
            unsafe { simd::interleave_lines(x, st.cs, p, k, rows, out) }
        });
        return Lhs {
            data,
            rs: 1,
            ps: padded,
        };
    }
    par_chunks_mut(&mut data[..rows * pairs], pairs, work, |i, out| {
        if st.cs == 1 {
            // SAFETY: as above; row i's k elements lie inside `x`.
            unsafe { simd::convert_line(&x[i * st.rs..i * st.rs + k], out) }
        } else {
            for (p, v) in out.iter_mut().enumerate() {
                *v = pair(|l| x[i * st.rs + l * st.cs], p, k);
            }
        }
    });
    Lhs {
        data,
        rs: pairs,
        ps: 1,
    }
}

/// The vector operand `b` as `[n, k]` rows: strips of [`NR`] rows, each
/// `[pairs][NR]` lanes, so a kernel step loads four registers in a row.
struct Rhs {
    data: Vec<u32>,
    pairs: usize,
}

impl Rhs {
    /// Strip `s` from k-pair `p` on.
    fn at(&self, s: usize, p: usize) -> *const u32 {
        self.data[(s * self.pairs + p) * NR..].as_ptr()
    }
}

/// Packs the `[rows, k]` view `x` (element `(j, l)` at `j·rs + l·cs`).
fn pack_rhs(x: &[f32], st: Strides, rows: usize, k: usize) -> Rhs {
    let pairs = k.div_ceil(2);
    let mut data = vec![0u32; rows.div_ceil(NR) * pairs * NR];
    par_chunks_mut(&mut data, pairs * NR, rows * k, |s, out| {
        let j0 = s * NR;
        let live = NR.min(rows - j0);
        // SAFETY: AVX-512 BF16 is present (the caller's check); the strip's
        // rows lie inside `x`.
        unsafe {
            if st.rs == 1 {
                for (p, lanes) in out.chunks_exact_mut(NR).enumerate() {
                    simd::interleave_lines(&x[j0..], st.cs, p, k, live, lanes);
                }
            } else if st.cs == 1 {
                simd::transpose_strip(x, st.rs, j0, live, k, out);
            } else {
                for (p, lanes) in out.chunks_exact_mut(NR).enumerate() {
                    for (r, v) in lanes.iter_mut().enumerate().take(live) {
                        *v = pair(|l| x[(j0 + r) * st.rs + l * st.cs], p, k);
                    }
                }
            }
        }
    });
    Rhs { data, pairs }
}

/// The output pointer, shared by the tasks that write disjoint blocks of it.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each task writes its own block of `c` and reads no other.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The element `offset` past the start (a method, so that closures
    /// capture the whole `Out`, not its raw pointer).
    fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// A weight `w: [n_out, n_in]` (a linear layer's, `y = x · wᵀ`) packed
/// once for many products ([`PackedWeight::apply`]): the decode steps of a
/// generation read half the bytes of the f32 weight, already in the
/// kernel's order.
pub(crate) struct PackedWeight {
    rhs: Rhs,
    n_out: usize,
    n_in: usize,
}

impl PackedWeight {
    /// Packs `w` (row-major `[n_out, n_in]`). [`available`] must be true.
    pub(crate) fn new(w: &[f32], n_out: usize, n_in: usize) -> Self {
        Self::stacked(&[(w, n_out)], n_in)
    }

    /// Packs the weights `parts` (each `(w, n_out)`, row-major
    /// `[n_out, n_in]`) stacked into one `[Σ n_out, n_in]`: one product
    /// then gives each row every part's outputs side by side, with the bits
    /// of the parts' own products (a sum's order depends on `n_in` alone).
    pub(crate) fn stacked(parts: &[(&[f32], usize)], n_in: usize) -> Self {
        assert!(available(), "bf16 weights need AVX512-BF16");
        for (w, n_out) in parts {
            assert!(w.len() >= n_out * n_in, "packed weight: slice too short");
        }
        let st = Strides { rs: n_in, cs: 1 };
        let n_out = parts.iter().map(|p| p.1).sum();
        // Parts of whole strips pack alone and their strips line up; others
        // are copied into one matrix first.
        let rhs = if parts[..parts.len().saturating_sub(1)]
            .iter()
            .all(|p| p.1 % NR == 0)
        {
            let mut data = Vec::new();
            for (w, rows) in parts {
                data.extend(pack_rhs(w, st, *rows, n_in).data);
            }
            Rhs {
                data,
                pairs: n_in.div_ceil(2),
            }
        } else {
            let whole: Vec<f32> = parts
                .iter()
                .flat_map(|(w, rows)| w[..rows * n_in].iter().copied())
                .collect();
            pack_rhs(&whole, st, n_out, n_in)
        };
        Self { rhs, n_out, n_in }
    }

    /// `y[rows, n_out] (+)= x[rows, n_in] · wᵀ`, both row-major.
    pub(crate) fn apply(&self, y: &mut [f32], x: &[f32], accumulate: bool) {
        self.apply_rows(y, x, self.n_in, accumulate);
    }

    /// [`PackedWeight::apply`] with `x`'s rows `stride` elements apart
    /// (its first `n_in` read): a projection's input inside a wider row.
    pub(crate) fn apply_rows(&self, y: &mut [f32], x: &[f32], stride: usize, accumulate: bool) {
        if self.n_out == 0 || self.n_in == 0 || x.len() < self.n_in {
            return;
        }
        assert!(
            stride >= self.n_in,
            "packed weight: row stride below the width"
        );
        let rows = (x.len() - self.n_in) / stride + 1;
        assert!(
            y.len() >= rows * self.n_out,
            "packed weight: output too short"
        );
        let st = Strides { rs: stride, cs: 1 };
        let a = pack_lhs(x, st, rows, self.n_in);
        let dims = (rows, self.n_out, self.n_in);
        // SAFETY: `stacked` checked the CPU; `y` holds the `[rows, n_out]` output.
        unsafe {
            run(
                y.as_mut_ptr(),
                self.n_out,
                &a,
                &self.rhs,
                dims,
                accumulate,
                true,
            )
        }
    }
}

/// `c[m, n] (+)= a[m, k] · b[k, n]` in bf16 with f32 sums; `c` row-major
/// with row stride `ldc`. Parallel over blocks of `c` when `threads`.
///
/// # Safety
/// [`available`] is true; `c` is valid for writes (and reads when
/// `accumulate`) of the `[m, n]` view with row stride `ldc ≥ n`, and
/// aliases neither input; the views of `a` and `b` lie inside them;
/// `m, n, k > 0`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    c: *mut f32,
    ldc: usize,
    a: &[f32],
    ast: Strides,
    b: &[f32],
    bst: Strides,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    threads: bool,
) {
    let pa = pack_lhs(a, ast, m, k);
    // b as a `[n, k]` operand: element (j, l) is b's (l, j).
    let bt = Strides {
        rs: bst.cs,
        cs: bst.rs,
    };
    let pb = pack_rhs(b, bt, n, k);
    // SAFETY: the caller's guarantees.
    unsafe { run(c, ldc, &pa, &pb, (m, n, k), accumulate, threads) }
}

/// The product of packed operands into `c` (see [`gemm`]).
///
/// # Safety
/// As [`gemm`]'s, with `pa` and `pb` packed from `[m, k]` and `[n, k]`.
unsafe fn run(
    c: *mut f32,
    ldc: usize,
    pa: &Lhs,
    pb: &Rhs,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    threads: bool,
) {
    let pairs = pb.pairs;
    // k in equal blocks of at most KC pairs: fixed by the shape, so each
    // output's sums run in one order however the blocks of c are cut.
    let kblocks = pairs.div_ceil(KC);
    let kc = pairs.div_ceil(kblocks);
    // Blocks of c: MC rows by up to NC columns, narrower when there are few
    // rows (a decode step) so that every thread gets work.
    let (mb, strips) = (m.div_ceil(MC), n.div_ceil(NR));
    let want = 4 * num_threads();
    let nc = NR * (strips * mb).div_ceil(want).clamp(1, NC / NR);
    let nb = n.div_ceil(nc);
    let out = Out(c);
    let block = |t: usize| {
        let (i0, j0) = ((t / nb) * MC, (t % nb) * nc);
        let (i1, j1) = ((i0 + MC).min(m), (j0 + nc).min(n));
        for p0 in (0..pairs).step_by(kc) {
            let len = kc.min(pairs - p0);
            let add = accumulate || p0 > 0;
            for j in (j0..j1).step_by(NR) {
                let bp = pb.at(j / NR, p0);
                for i in (i0..i1).step_by(MR) {
                    let ap = pa.data[i * pa.rs + p0 * pa.ps..].as_ptr();
                    let tile = (MR.min(m - i), NR.min(n - j));
                    // SAFETY: the packed operands hold MR padded rows from
                    // i and NR lanes from strip j / NR for `len` pairs from
                    // p0; the caller's `c` holds this block.
                    unsafe {
                        let cp = out.at(i * ldc + j);
                        simd::kernel((ap, pa.rs, pa.ps), bp, len, (cp, ldc), tile, add);
                    }
                }
            }
        }
    };
    let tasks = mb * nb;
    if threads && num_threads() > 1 && tasks > 1 && m * n * k >= PAR_MIN_WORK {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(block);
    } else {
        (0..tasks).for_each(block);
    }
}

mod simd {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// A mask of the first `n` (at most 16) lanes.
    fn first(n: usize) -> __mmask16 {
        if n >= 16 {
            !0
        } else {
            (1u16 << n) - 1
        }
    }

    /// The register tile: rows `0..rows` and columns `0..cols` of
    /// `c (+)= a · b_strip` over `pairs` k-pairs, `a`'s lane (r, p) at
    /// `r·rs + p·ps`.
    ///
    /// # Safety
    /// AVX-512F/BW/BF16; `a` holds MR rows of `pairs` lanes, `b`
    /// `pairs · NR` lanes; `c`'s rows `0..rows`, columns `0..cols` (row
    /// stride `ldc`) are valid.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn kernel(
        (a, rs, ps): (*const u32, usize, usize),
        b: *const u32,
        pairs: usize,
        (c, ldc): (*mut f32, usize),
        (rows, cols): (usize, usize),
        add: bool,
    ) {
        const Q: usize = NR / 16;
        let mut acc = [[_mm512_setzero_ps(); Q]; MR];
        for p in 0..pairs {
            let bp = b.add(p * NR);
            let bv: [__m512bh; Q] = std::array::from_fn(|q| {
                std::mem::transmute(_mm512_loadu_si512(bp.add(16 * q).cast()))
            });
            let ap = a.add(p * ps);
            for (r, row) in acc.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(r * rs) as i32));
                for (q, v) in row.iter_mut().enumerate() {
                    *v = _mm512_dpbf16_ps(*v, av, bv[q]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate().take(rows) {
            let cr = c.add(r * ldc);
            for (q, v) in row.iter().enumerate() {
                let left = cols.saturating_sub(16 * q);
                if left == 0 {
                    break;
                }
                let (mask, at) = (first(left), cr.add(16 * q));
                let sum = if add {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), *v)
                } else {
                    *v
                };
                _mm512_mask_storeu_ps(at, mask, sum);
            }
        }
    }

    /// 32 floats (16 in `lo`, 16 in `hi`) as 32 bf16 in order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn convert(lo: __m512, hi: __m512) -> __m512i {
        // SAFETY: same size, every bit pattern valid.
        unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) }
    }

    /// Floats `l..l + 32` of `line` (zeros past its end) as 16 bf16 pairs.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pairs_at(line: *const f32, l: usize, k: usize) -> __m512i {
        let left = k - l;
        let lo = _mm512_maskz_loadu_ps(first(left), line.add(l));
        let hi = _mm512_maskz_loadu_ps(first(left.saturating_sub(16)), line.add(l + 16.min(left)));
        convert(lo, hi)
    }

    /// `line`'s k floats as bf16 pairs into `out` (`k.div_ceil(2)` lanes).
    ///
    /// # Safety
    /// AVX-512F/BW/BF16.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn convert_line(line: &[f32], out: &mut [u32]) {
        let k = line.len();
        let mut l = 0;
        while l < k {
            let v = pairs_at(line.as_ptr(), l, k);
            let n = (k - l).div_ceil(2).min(16);
            _mm512_mask_storeu_epi32(out[l / 2..].as_mut_ptr().cast(), first(n), v);
            l += 32;
        }
    }

    /// Pair `p` of `rows` consecutive elements on two k-lines (`2p` and
    /// `2p + 1`, `cs` apart; the second zeros past `k`): lane i of `out` gets
    /// `(line0[i], line1[i])`.
    ///
    /// # Safety
    /// AVX-512F/BW/BF16; both lines' `rows` elements lie inside `x`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn interleave_lines(
        x: &[f32],
        cs: usize,
        p: usize,
        k: usize,
        rows: usize,
        out: &mut [u32],
    ) {
        // Lane j of the result: bf16 j of the first line, then of the second.
        let idx: [u16; 32] = std::array::from_fn(|t| ((t % 2) * 16 + t / 2) as u16);
        let idx = _mm512_loadu_si512(idx.as_ptr().cast());
        let l0 = x[2 * p * cs..].as_ptr();
        let l1 = (2 * p + 1 < k).then(|| x[(2 * p + 1) * cs..].as_ptr());
        let mut i = 0;
        while i < rows {
            let m = first(rows - i);
            let a = _mm512_maskz_loadu_ps(m, l0.add(i));
            let b = match l1 {
                Some(l1) => _mm512_maskz_loadu_ps(m, l1.add(i)),
                None => _mm512_setzero_ps(),
            };
            let v = _mm512_permutexvar_epi16(idx, convert(a, b));
            _mm512_mask_storeu_epi32(out[i..].as_mut_ptr().cast(), m, v);
            i += 16;
        }
    }

    /// Packs rows `j0..j0 + live` of a view contiguous along k (row stride
    /// `rs`) into a strip `[pairs][NR]`: sixteen rows by sixteen pairs at a
    /// time, converted and transposed in registers.
    ///
    /// # Safety
    /// AVX-512F/BW/BF16; each row's `k` elements lie inside `x`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn transpose_strip(
        x: &[f32],
        rs: usize,
        j0: usize,
        live: usize,
        k: usize,
        out: &mut [u32],
    ) {
        let pairs = k.div_ceil(2);
        for block in (0..live).step_by(16) {
            let mut l = 0;
            while l < k {
                let mut v: [__m512i; 16] = std::array::from_fn(|r| {
                    if block + r < live {
                        pairs_at(x[(j0 + block + r) * rs..].as_ptr(), l, k)
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                transpose16(&mut v);
                let p0 = l / 2;
                for (q, lanes) in v.iter().enumerate().take((pairs - p0).min(16)) {
                    let at = out[(p0 + q) * NR + block..].as_mut_ptr();
                    _mm512_storeu_si512(at.cast(), *lanes);
                }
                l += 32;
            }
        }
    }

    /// Transposes sixteen rows of sixteen 32-bit lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn transpose16(r: &mut [__m512i; 16]) {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for i in 0..4 {
            let b = 4 * i;
            r[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
            r[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
            r[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
            r[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
        }
        for h in 0..2 {
            let b = 8 * h;
            for i in 0..4 {
                t[b + i] = _mm512_shuffle_i32x4::<0x88>(r[b + i], r[b + i + 4]);
                t[b + i + 4] = _mm512_shuffle_i32x4::<0xdd>(r[b + i], r[b + i + 4]);
            }
        }
        for i in 0..8 {
            r[i] = _mm512_shuffle_i32x4::<0x88>(t[i], t[i + 8]);
            r[i + 8] = _mm512_shuffle_i32x4::<0xdd>(t[i], t[i + 8]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * s).sin() * 1.7).collect()
    }

    /// `a[m, k] · b[k, n]` over bf16-rounded inputs, summed in f64.
    fn reference(
        a: &[f32],
        ast: Strides,
        b: &[f32],
        bst: Strides,
        (m, n, k): (usize, usize, usize),
    ) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|l| {
                        let x = round_bf16(a[i * ast.rs + l * ast.cs]) as f64;
                        x * round_bf16(b[l * bst.rs + j * bst.cs]) as f64
                    })
                    .sum();
            }
        }
        c
    }

    #[test]
    fn sixteen_by_sixteen_lanes_transpose() {
        if !available() {
            return;
        }
        use std::arch::x86_64::*;
        let x: Vec<u32> = (0..256).collect();
        let mut t = [[0u32; 16]; 16];
        unsafe {
            let mut v: [__m512i; 16] =
                std::array::from_fn(|r| _mm512_loadu_si512(x[16 * r..].as_ptr().cast()));
            simd::transpose16(&mut v);
            for (row, reg) in t.iter_mut().zip(v) {
                _mm512_storeu_si512(row.as_mut_ptr().cast(), reg);
            }
        }
        for (i, row) in t.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                assert_eq!(*v, (16 * j + i) as u32, "at {i}, {j}");
            }
        }
    }

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to even (1).
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to even.
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(to_bf16(1.0 + 1.5 / 256.0), 0x3f81);
        assert_eq!(to_bf16(-2.5), 0xc020);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
    }

    #[test]
    fn every_layout_and_edge_matches_the_rounded_product() {
        if !available() {
            eprintln!("no AVX512-BF16 here: the kernel is not run");
            return;
        }
        let row = |cols: usize| Strides { rs: cols, cs: 1 };
        let col = |rows: usize| Strides { rs: 1, cs: rows };
        // Odd k, rows and columns past the tiles, several k blocks.
        for (m, n, k) in [(1, 1, 1), (7, 65, 3), (13, 130, 300), (100, 600, 257)] {
            let a = seq(m * k, 0.37);
            let b = seq(k * n, 0.91);
            for (ast, bst) in [
                (row(k), col(k)), // nt: a linear layer
                (row(k), row(n)), // nn
                (col(m), row(n)), // tn: a weight gradient
                (Strides { rs: 2 * k, cs: 2 }, Strides { rs: 3 * n, cs: 3 }),
            ] {
                let span = |st: Strides, r: usize, c: usize| (r - 1) * st.rs + (c - 1) * st.cs + 1;
                let a = seq(span(ast, m, k), 0.37);
                let b = seq(span(bst, k, n), 0.91);
                let want = reference(&a, ast, &b, bst, (m, n, k));
                let start: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.5).collect();
                for accumulate in [false, true] {
                    let mut c = start.clone();
                    unsafe {
                        gemm(
                            c.as_mut_ptr(),
                            n,
                            &a,
                            ast,
                            &b,
                            bst,
                            (m, n, k),
                            accumulate,
                            true,
                        )
                    };
                    for (i, (got, want)) in c.iter().zip(&want).enumerate() {
                        let want = want + if accumulate { start[i] as f64 } else { 0.0 };
                        let tol = 1e-5 * (k as f64).sqrt() * (1.0 + want.abs());
                        assert!(
                            (*got as f64 - want).abs() <= tol,
                            "{m}x{n}x{k} {ast:?} {bst:?} acc {accumulate} at {i}: {got} vs {want}"
                        );
                    }
                }
            }
            let _ = (a, b);
        }
    }

    #[test]
    fn the_bits_do_not_depend_on_the_thread_count() {
        if !available() {
            return;
        }
        let (m, n, k) = (300, 700, 400);
        let (a, b) = (seq(m * k, 0.618), seq(k * n, 1.414));
        let run = |threads| {
            let mut c = vec![0f32; m * n];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| unsafe {
                let row = |cols| Strides { rs: cols, cs: 1 };
                gemm(
                    c.as_mut_ptr(),
                    n,
                    &a,
                    row(k),
                    &b,
                    row(n),
                    (m, n, k),
                    false,
                    true,
                )
            });
            c
        };
        let one = run(1);
        assert!(one
            .iter()
            .zip(run(2))
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    /// Stacked weights give each part's own product bit for bit, whether
    /// the parts fill whole strips (packed alone) or not (copied first),
    /// and a strided input reads only its rows' first `n_in` elements.
    #[test]
    fn stacked_weights_give_each_parts_bits() {
        if !available() {
            return;
        }
        let (rows, n_in) = (37, 150);
        let x = seq(rows * n_in, 0.37);
        for outs in [[128, 64, 64], [96, 40, 40]] {
            let ws: Vec<Vec<f32>> = outs
                .iter()
                .enumerate()
                .map(|(p, &o)| seq(o * n_in, 0.11 + p as f32))
                .collect();
            let parts: Vec<(&[f32], usize)> = ws.iter().map(Vec::as_slice).zip(outs).collect();
            let total: usize = outs.iter().sum();
            let mut stacked = vec![0f32; rows * total];
            PackedWeight::stacked(&parts, n_in).apply(&mut stacked, &x, false);
            let mut col = 0;
            for (w, o) in parts {
                let mut alone = vec![0f32; rows * o];
                PackedWeight::new(w, o, n_in).apply(&mut alone, &x, false);
                for (r, row) in alone.chunks_exact(o).enumerate() {
                    let got = &stacked[r * total + col..r * total + col + o];
                    assert!(row.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()));
                }
                col += o;
            }
        }
        // x's rows inside rows twice as wide.
        let wide: Vec<f32> = x
            .chunks_exact(n_in)
            .flat_map(|r| r.iter().chain(r))
            .copied()
            .collect();
        let w = seq(70 * n_in, 0.5);
        let pw = PackedWeight::new(&w, 70, n_in);
        let (mut a, mut b) = (vec![1f32; rows * 70], vec![1f32; rows * 70]);
        pw.apply(&mut a, &x, true);
        pw.apply_rows(
            &mut b,
            &wide[..(rows - 1) * 2 * n_in + n_in],
            2 * n_in,
            true,
        );
        assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
