//! Fused CPU kernels with their own backward passes for the three
//! memory-bound steps of training: causal softmax over attention scores,
//! log-softmax over logits and RMSNorm.
//!
//! candle's own fused versions have no `bwd` and cut the gradient; these
//! implement `CustomOp::bwd` with the analytic gradients (checked against
//! finite differences in tests/gradients.rs and against the composite ops in
//! this file's tests). On non-CPU devices or non-f32/f64 dtypes the callers
//! fall back to compositions of differentiable candle ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Rows below this many elements are processed on one thread.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// Runs `f(row_index, input_rows, output_rows)` over `rows` rows of width
/// `width`, splitting the rows across candle's thread count when large.
fn par_rows<T: Copy + Send + Sync, F>(src: &[T], dst: &mut [T], width: usize, f: F)
where
    F: Fn(usize, &[T], &mut [T]) + Sync,
{
    let rows = src.len() / width.max(1);
    let threads = candle_core::utils::get_num_threads().max(1);
    if src.len() < PAR_MIN_ELEMS || threads == 1 || rows < 2 {
        f(0, src, dst);
        return;
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (k, (sc, dc)) in src
            .chunks(per * width)
            .zip(dst.chunks_mut(per * width))
            .enumerate()
        {
            let f = &f;
            s.spawn(move || f(k * per, sc, dc));
        }
    });
}

fn contiguous_slice<'a, T>(v: &'a [T], l: &Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("fused op needs a contiguous input"),
    }
}

trait Float: Copy + Send + Sync + PartialOrd + 'static {
    fn zero() -> Self;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn exp(self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}
impl Float for f32 {
    fn zero() -> Self {
        0.0
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
}
impl Float for f64 {
    fn zero() -> Self {
        0.0
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
}

// ---------------------------------------------------------------- softmax

/// Softmax over the last dim of `[B, .., T, S]` scores where query row i of
/// batch element b may see keys `pads[b]..=i + (S - T)` (causal with a cache
/// of S - T earlier keys, the first `pads[b]` keys being left padding; no
/// pads = none). Masked keys get probability exactly 0 and are never passed
/// to `exp` (an underflowing `expf` takes libm's slow path); a row with no
/// visible key (a padding query) is all zeros.
struct CausalSoftmax {
    pads: Vec<usize>,
}

/// The kernel's view of one score tensor: rows of `s` keys, `t` queries per
/// (batch, head), `rows_per_batch` rows per batch element.
#[derive(Clone, Copy)]
struct ScoreRows<'a> {
    t: usize,
    s: usize,
    rows_per_batch: usize,
    pads: &'a [usize],
}

fn causal_softmax_rows<T: Float>(first_row: usize, src: &[T], dst: &mut [T], g: ScoreRows) {
    let (t, s) = (g.t, g.s);
    for (k, (x, y)) in src.chunks(s).zip(dst.chunks_mut(s)).enumerate() {
        let row = first_row + k;
        let i = row % t;
        let lo = g.pads.get(row / g.rows_per_batch).copied().unwrap_or(0);
        let hi = (i + s - t + 1).min(s);
        if lo >= hi {
            y.iter_mut().for_each(|v| *v = T::zero());
            continue;
        }
        let mut m = x[lo];
        for &v in &x[lo + 1..hi] {
            if v > m {
                m = v;
            }
        }
        let mut sum = 0f64;
        for j in lo..hi {
            let e = x[j].sub(m).exp();
            y[j] = e;
            sum += e.to_f64();
        }
        let inv = T::from_f64(1.0 / sum);
        for v in &mut y[lo..hi] {
            *v = v.mul(inv);
        }
        let (head, rest) = y.split_at_mut(lo);
        for v in head.iter_mut().chain(&mut rest[hi - lo..]) {
            *v = T::zero();
        }
    }
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "agentrl-causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        if dims.len() < 2 {
            candle_core::bail!("causal softmax needs [.., T, S]")
        }
        let (t, s) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        if s < t {
            candle_core::bail!("causal softmax: {s} keys < {t} queries")
        }
        // `left_padded_causal_softmax` has checked that pads match dims[0].
        let rows = layout.shape().elem_count() / s.max(1);
        let g = ScoreRows {
            t,
            s,
            rows_per_batch: rows / dims[0].max(1),
            pads: &self.pads,
        };
        let out = match storage {
            CpuStorage::F32(v) => {
                let x = contiguous_slice(v, layout)?;
                let mut y = vec![0f32; x.len()];
                par_rows(x, &mut y, s, |r, a, b| causal_softmax_rows(r, a, b, g));
                CpuStorage::F32(y)
            }
            CpuStorage::F64(v) => {
                let x = contiguous_slice(v, layout)?;
                let mut y = vec![0f64; x.len()];
                par_rows(x, &mut y, s, |r, a, b| causal_softmax_rows(r, a, b, g));
                CpuStorage::F64(y)
            }
            _ => candle_core::bail!("causal softmax: f32/f64 only"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(softmax_bwd(res, grad_res)?))
    }
}

/// `dx = p ⊙ (g − Σ_j g_j p_j)` row by row; masked keys have p = 0 and get 0.
struct SoftmaxBwd;

fn softmax_bwd_rows<T: Float>(p: &[T], g: &[T], dx: &mut [T], s: usize) {
    for ((pr, gr), dr) in p.chunks(s).zip(g.chunks(s)).zip(dx.chunks_mut(s)) {
        let dot: f64 = pr
            .iter()
            .zip(gr)
            .map(|(a, b)| a.to_f64() * b.to_f64())
            .sum();
        let dot = T::from_f64(dot);
        for j in 0..s {
            dr[j] = pr[j].mul(gr[j].sub(dot));
        }
    }
}

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "agentrl-softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        p: &CpuStorage,
        pl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let s = *pl.dims().last().unwrap_or(&1);
        let out = match (p, g) {
            (CpuStorage::F32(p), CpuStorage::F32(g)) => {
                let (p, g) = (contiguous_slice(p, pl)?, contiguous_slice(g, gl)?);
                let mut dx = vec![0f32; p.len()];
                two_input_rows(p, g, &mut dx, s, softmax_bwd_rows);
                CpuStorage::F32(dx)
            }
            (CpuStorage::F64(p), CpuStorage::F64(g)) => {
                let (p, g) = (contiguous_slice(p, pl)?, contiguous_slice(g, gl)?);
                let mut dx = vec![0f64; p.len()];
                two_input_rows(p, g, &mut dx, s, softmax_bwd_rows);
                CpuStorage::F64(dx)
            }
            _ => candle_core::bail!("softmax bwd: f32/f64 only, same dtype"),
        };
        Ok((out, pl.shape().clone()))
    }
}

/// Splits rows of two same-shaped inputs and one output across threads.
fn two_input_rows<T: Copy + Send + Sync>(
    a: &[T],
    b: &[T],
    dst: &mut [T],
    width: usize,
    f: fn(&[T], &[T], &mut [T], usize),
) {
    let rows = a.len() / width.max(1);
    let threads = candle_core::utils::get_num_threads().max(1);
    if a.len() < PAR_MIN_ELEMS || threads == 1 || rows < 2 {
        f(a, b, dst, width);
        return;
    }
    let per = rows.div_ceil(threads) * width;
    std::thread::scope(|s| {
        for ((ac, bc), dc) in a.chunks(per).zip(b.chunks(per)).zip(dst.chunks_mut(per)) {
            s.spawn(move || f(ac, bc, dc, width));
        }
    });
}

fn softmax_bwd(p: &Tensor, g: &Tensor) -> Result<Tensor> {
    let g = g.contiguous()?;
    if fused_ok(p) && g.dtype() == p.dtype() {
        p.apply_op2_no_bwd(&g, &SoftmaxBwd)
    } else {
        let dot = (&g * p)?.sum_keepdim(candle_core::D::Minus1)?;
        g.broadcast_sub(&dot)? * p
    }
}

fn fused_ok(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64) && t.is_contiguous()
}

/// Causal softmax of attention scores `[.., T, S]` (query i sees keys
/// `..= i + S - T`), differentiable. Fused on CPU; elsewhere an additive
/// mask plus [`crate::qwen2::softmax_last_dim`].
pub fn causal_softmax(scores: &Tensor) -> Result<Tensor> {
    left_padded_causal_softmax(scores, &[])
}

/// [`causal_softmax`] of `[B, .., T, S]` scores whose batch element b starts
/// with `pads[b]` padding keys that no query sees (left-padded prompts in
/// batched generation); empty `pads` means no padding. Differentiable.
pub fn left_padded_causal_softmax(scores: &Tensor, pads: &[usize]) -> Result<Tensor> {
    let scores = scores.contiguous()?;
    let n = scores.rank();
    if !pads.is_empty() && (n < 3 || scores.dims()[0] != pads.len()) {
        candle_core::bail!(
            "causal softmax: {} pads for scores {:?}",
            pads.len(),
            scores.dims()
        )
    }
    if fused_ok(&scores) {
        return scores.apply_op1(CausalSoftmax {
            pads: pads.to_vec(),
        });
    }
    let (t, s) = (scores.dims()[n - 2], scores.dims()[n - 1]);
    let neg = crate::qwen2::mask_value(scores.dtype());
    let (batch, mut shape) = match pads.is_empty() {
        true => (vec![0], vec![]),
        false => (pads.to_vec(), vec![pads.len()]),
    };
    let m: Vec<f32> = batch
        .iter()
        .flat_map(|&lo| {
            (0..t).flat_map(move |i| {
                (0..s).map(move |j| if lo <= j && j <= i + s - t { 0.0 } else { neg })
            })
        })
        .collect();
    if !pads.is_empty() {
        shape.extend(std::iter::repeat_n(1, n - 3));
    }
    shape.extend([t, s]);
    let mask = Tensor::from_vec(m, shape, scores.device())?.to_dtype(scores.dtype())?;
    crate::qwen2::softmax_last_dim(&scores.broadcast_add(&mask)?)
}

// ------------------------------------------------------------ log-softmax

/// `y = x − logsumexp(x)` over the last dim.
struct LogSoftmax;

fn log_softmax_rows<T: Float>(_r: usize, x: &[T], y: &mut [T], v: usize) {
    for (xr, yr) in x.chunks(v).zip(y.chunks_mut(v)) {
        let mut m = xr[0];
        for &a in &xr[1..] {
            if a > m {
                m = a;
            }
        }
        let sum: f64 = xr.iter().map(|a| a.sub(m).exp().to_f64()).sum();
        let lse = T::from_f64(m.to_f64() + sum.ln());
        for (a, b) in xr.iter().zip(yr.iter_mut()) {
            *b = a.sub(lse);
        }
    }
}

impl CustomOp1 for LogSoftmax {
    fn name(&self) -> &'static str {
        "agentrl-log-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let v = *layout.dims().last().unwrap_or(&1);
        let out = match storage {
            CpuStorage::F32(s) => {
                let x = contiguous_slice(s, layout)?;
                let mut y = vec![0f32; x.len()];
                par_rows(x, &mut y, v, |r, a, b| log_softmax_rows(r, a, b, v));
                CpuStorage::F32(y)
            }
            CpuStorage::F64(s) => {
                let x = contiguous_slice(s, layout)?;
                let mut y = vec![0f64; x.len()];
                par_rows(x, &mut y, v, |r, a, b| log_softmax_rows(r, a, b, v));
                CpuStorage::F64(y)
            }
            _ => candle_core::bail!("log-softmax: f32/f64 only"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        // dx = g − softmax(x) · Σ g, with softmax(x) = exp(y).
        let g = grad_res.contiguous()?;
        if fused_ok(res) && g.dtype() == res.dtype() {
            return Ok(Some(res.apply_op2_no_bwd(&g, &LogSoftmaxBwd)?));
        }
        let sum = g.sum_keepdim(candle_core::D::Minus1)?;
        Ok(Some((&g - res.exp()?.broadcast_mul(&sum)?)?))
    }
}

struct LogSoftmaxBwd;

fn log_softmax_bwd_rows<T: Float>(y: &[T], g: &[T], dx: &mut [T], v: usize) {
    for ((yr, gr), dr) in y.chunks(v).zip(g.chunks(v)).zip(dx.chunks_mut(v)) {
        let sum = T::from_f64(gr.iter().map(|a| a.to_f64()).sum::<f64>());
        for j in 0..v {
            dr[j] = gr[j].sub(yr[j].exp().mul(sum));
        }
    }
}

impl CustomOp2 for LogSoftmaxBwd {
    fn name(&self) -> &'static str {
        "agentrl-log-softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        y: &CpuStorage,
        yl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let v = *yl.dims().last().unwrap_or(&1);
        let out = match (y, g) {
            (CpuStorage::F32(y), CpuStorage::F32(g)) => {
                let (y, g) = (contiguous_slice(y, yl)?, contiguous_slice(g, gl)?);
                let mut dx = vec![0f32; y.len()];
                two_input_rows(y, g, &mut dx, v, log_softmax_bwd_rows);
                CpuStorage::F32(dx)
            }
            (CpuStorage::F64(y), CpuStorage::F64(g)) => {
                let (y, g) = (contiguous_slice(y, yl)?, contiguous_slice(g, gl)?);
                let mut dx = vec![0f64; y.len()];
                two_input_rows(y, g, &mut dx, v, log_softmax_bwd_rows);
                CpuStorage::F64(dx)
            }
            _ => candle_core::bail!("log-softmax bwd: f32/f64 only, same dtype"),
        };
        Ok((out, yl.shape().clone()))
    }
}

/// Log-softmax over the last dimension, differentiable. Fused on CPU;
/// elsewhere `x − (m + log Σ exp(x − m))` with the max m detached.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let x = x.contiguous()?;
    if fused_ok(&x) {
        return x.apply_op1(LogSoftmax);
    }
    Ok(crate::qwen2::log_softmax_last_dim(&x)?.0)
}

// ---------------------------------------------------------------- RMSNorm

/// `y = x · r · w` with `r = 1 / sqrt(mean(x²) + ε)` per row of `x: [.., d]`.
struct RmsNorm {
    eps: f64,
}

fn rms_rows<T: Float>(x: &[T], w: &[T], y: &mut [T], d: usize, eps: f64) {
    for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
        let ms: f64 = xr.iter().map(|a| a.to_f64() * a.to_f64()).sum::<f64>() / d as f64;
        let r = T::from_f64(1.0 / (ms + eps).sqrt());
        for j in 0..d {
            yr[j] = xr[j].mul(r).mul(w[j]);
        }
    }
}

/// `dx = r·(g⊙w) − x · r³ · Σ(g⊙w⊙x) / d` per row.
fn rms_bwd_x_rows<T: Float>(x: &[T], w: &[T], g: &[T], dx: &mut [T], d: usize, eps: f64) {
    for ((xr, gr), dr) in x.chunks(d).zip(g.chunks(d)).zip(dx.chunks_mut(d)) {
        let ms: f64 = xr.iter().map(|a| a.to_f64() * a.to_f64()).sum::<f64>() / d as f64;
        let r = 1.0 / (ms + eps).sqrt();
        let dot: f64 = (0..d)
            .map(|j| gr[j].to_f64() * w[j].to_f64() * xr[j].to_f64())
            .sum();
        let c = T::from_f64(r * r * r * dot / d as f64);
        let r = T::from_f64(r);
        for j in 0..d {
            dr[j] = r.mul(gr[j].mul(w[j])).sub(xr[j].mul(c));
        }
    }
}

/// `dw = Σ_rows g ⊙ x · r`.
fn rms_bwd_w<T: Float>(x: &[T], g: &[T], d: usize, eps: f64) -> Vec<T> {
    let mut acc = vec![0f64; d];
    for (xr, gr) in x.chunks(d).zip(g.chunks(d)) {
        let ms: f64 = xr.iter().map(|a| a.to_f64() * a.to_f64()).sum::<f64>() / d as f64;
        let r = 1.0 / (ms + eps).sqrt();
        for j in 0..d {
            acc[j] += gr[j].to_f64() * xr[j].to_f64() * r;
        }
    }
    acc.into_iter().map(T::from_f64).collect()
}

/// Splits the rows of `x` (and `g`) across threads; `w` is shared.
fn rows3<T: Copy + Send + Sync, F>(x: &[T], w: &[T], g: &[T], dst: &mut [T], d: usize, f: F)
where
    F: Fn(&[T], &[T], &[T], &mut [T]) + Sync,
{
    let rows = x.len() / d.max(1);
    let threads = candle_core::utils::get_num_threads().max(1);
    if x.len() < PAR_MIN_ELEMS || threads == 1 || rows < 2 {
        f(x, w, g, dst);
        return;
    }
    let per = rows.div_ceil(threads) * d;
    std::thread::scope(|s| {
        for ((xc, gc), dc) in x.chunks(per).zip(g.chunks(per)).zip(dst.chunks_mut(per)) {
            let f = &f;
            s.spawn(move || f(xc, w, gc, dc));
        }
    });
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "agentrl-rms-norm"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = *xl.dims().last().unwrap_or(&1);
        let eps = self.eps;
        let out = match (x, w) {
            (CpuStorage::F32(x), CpuStorage::F32(w)) => {
                let (x, w) = (contiguous_slice(x, xl)?, contiguous_slice(w, wl)?);
                let mut y = vec![0f32; x.len()];
                rows3(x, w, x, &mut y, d, |a, w, _, o| rms_rows(a, w, o, d, eps));
                CpuStorage::F32(y)
            }
            (CpuStorage::F64(x), CpuStorage::F64(w)) => {
                let (x, w) = (contiguous_slice(x, xl)?, contiguous_slice(w, wl)?);
                let mut y = vec![0f64; x.len()];
                rows3(x, w, x, &mut y, d, |a, w, _, o| rms_rows(a, w, o, d, eps));
                CpuStorage::F64(y)
            }
            _ => candle_core::bail!("rms norm: f32/f64 only, same dtype"),
        };
        Ok((out, xl.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad_res.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &g, &RmsNormBwdX { eps: self.eps })?;
        let dw = x.apply_op2_no_bwd(&g, &RmsNormBwdW { eps: self.eps })?;
        Ok((Some(dx), Some(dw)))
    }
}

struct RmsNormBwdX {
    eps: f64,
}

impl candle_core::CustomOp3 for RmsNormBwdX {
    fn name(&self) -> &'static str {
        "agentrl-rms-norm-bwd-x"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = *xl.dims().last().unwrap_or(&1);
        let eps = self.eps;
        let out = match (x, w, g) {
            (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(g)) => {
                let (x, w) = (contiguous_slice(x, xl)?, contiguous_slice(w, wl)?);
                let g = contiguous_slice(g, gl)?;
                let mut dx = vec![0f32; x.len()];
                rows3(x, w, g, &mut dx, d, |a, w, g, o| {
                    rms_bwd_x_rows(a, w, g, o, d, eps)
                });
                CpuStorage::F32(dx)
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(g)) => {
                let (x, w) = (contiguous_slice(x, xl)?, contiguous_slice(w, wl)?);
                let g = contiguous_slice(g, gl)?;
                let mut dx = vec![0f64; x.len()];
                rows3(x, w, g, &mut dx, d, |a, w, g, o| {
                    rms_bwd_x_rows(a, w, g, o, d, eps)
                });
                CpuStorage::F64(dx)
            }
            _ => candle_core::bail!("rms norm bwd: f32/f64 only, same dtype"),
        };
        Ok((out, xl.shape().clone()))
    }
}

struct RmsNormBwdW {
    eps: f64,
}

impl CustomOp2 for RmsNormBwdW {
    fn name(&self) -> &'static str {
        "agentrl-rms-norm-bwd-w"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = *xl.dims().last().unwrap_or(&1);
        let out = match (x, g) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => CpuStorage::F32(rms_bwd_w(
                contiguous_slice(x, xl)?,
                contiguous_slice(g, gl)?,
                d,
                self.eps,
            )),
            (CpuStorage::F64(x), CpuStorage::F64(g)) => CpuStorage::F64(rms_bwd_w(
                contiguous_slice(x, xl)?,
                contiguous_slice(g, gl)?,
                d,
                self.eps,
            )),
            _ => candle_core::bail!("rms norm bwd: f32/f64 only, same dtype"),
        };
        Ok((out, Shape::from(d)))
    }
}

/// Fused RMSNorm `x / sqrt(mean(x²) + ε) · w` over the last dim with its own
/// backward (for x and w), on CPU f32/f64 contiguous input; `None` elsewhere
/// so the caller uses the composite.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Option<Result<Tensor>> {
    if fused_ok(x) && fused_ok(w) && x.dtype() == w.dtype() {
        Some(x.apply_op2(w, RmsNorm { eps }))
    } else {
        None
    }
}

// ------------------------------------------------------------------- RoPE

/// Rotary embedding (rotate-half convention) fused with the head transpose
/// and a scale: `[B, T, H, D]` → `[B, H, T, D]`,
/// `out = scale · [x1·cos − x2·sin, x2·cos + x1·sin]`. With `adjoint` it is
/// the transpose map (its own gradient): `[B, H, T, D]` → `[B, T, H, D]`,
/// `dx = scale · [g1·cos + g2·sin, g2·cos − g1·sin]`.
#[derive(Clone)]
struct RopeHeads {
    /// `[T, D/2]`, row-major.
    cos: Vec<f64>,
    sin: Vec<f64>,
    scale: f64,
    adjoint: bool,
}

impl RopeHeads {
    fn run<T: Float>(&self, x: &[T], dims: &[usize]) -> Vec<T> {
        let mut out = vec![T::zero(); x.len()];
        // dims are the input's: [B, T, H, D] forward, [B, H, T, D] adjoint.
        let (b, d) = (dims[0], dims[3]);
        let (t, h) = if self.adjoint {
            (dims[2], dims[1])
        } else {
            (dims[1], dims[2])
        };
        let half = d / 2;
        let bthd = |bi: usize, ti: usize, hi: usize| ((bi * t + ti) * h + hi) * d;
        let bhtd = |bi: usize, hi: usize, ti: usize| ((bi * h + hi) * t + ti) * d;
        for bi in 0..b {
            for ti in 0..t {
                let cs = &self.cos[ti * half..(ti + 1) * half];
                let sn = &self.sin[ti * half..(ti + 1) * half];
                for hi in 0..h {
                    let (src, dst) = if self.adjoint {
                        (bhtd(bi, hi, ti), bthd(bi, ti, hi))
                    } else {
                        (bthd(bi, ti, hi), bhtd(bi, hi, ti))
                    };
                    for i in 0..half {
                        let a = x[src + i].to_f64();
                        let c = x[src + half + i].to_f64();
                        let (o1, o2) = if self.adjoint {
                            (a * cs[i] + c * sn[i], c * cs[i] - a * sn[i])
                        } else {
                            (a * cs[i] - c * sn[i], c * cs[i] + a * sn[i])
                        };
                        out[dst + i] = T::from_f64(o1 * self.scale);
                        out[dst + half + i] = T::from_f64(o2 * self.scale);
                    }
                }
            }
        }
        out
    }
}

impl CustomOp1 for RopeHeads {
    fn name(&self) -> &'static str {
        "agentrl-rope-heads"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        if dims.len() != 4 || !dims[3].is_multiple_of(2) {
            candle_core::bail!("rope: expected [B, T, H, D] with even D, got {dims:?}")
        }
        let t = if self.adjoint { dims[2] } else { dims[1] };
        if self.cos.len() != t * dims[3] / 2 {
            candle_core::bail!("rope: tables do not fit {dims:?}")
        }
        let out = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(self.run(contiguous_slice(v, layout)?, dims)),
            CpuStorage::F64(v) => CpuStorage::F64(self.run(contiguous_slice(v, layout)?, dims)),
            _ => candle_core::bail!("rope: f32/f64 only"),
        };
        let shape = Shape::from((dims[0], dims[2], dims[1], dims[3]));
        Ok((out, shape))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let adj = RopeHeads {
            adjoint: !self.adjoint,
            ..self.clone()
        };
        Ok(Some(grad_res.contiguous()?.apply_op1(adj)?))
    }
}

/// Rotates `x: [B, T, H, D]` with tables `cos, sin: [T, D/2]` (the same
/// positions for every sequence), scales by `scale` and returns
/// `[B, H, T, D]` contiguous, differentiably; `None` when the fused CPU
/// kernel does not apply (other device/dtype or per-sequence tables).
pub fn rope_to_heads(x: &Tensor, cos: &Tensor, sin: &Tensor, scale: f64) -> Option<Result<Tensor>> {
    let x = match x.contiguous() {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    if !fused_ok(&x) || cos.rank() != 2 {
        return None;
    }
    let host = |t: &Tensor| -> Result<Vec<f64>> {
        t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
    };
    Some((|| {
        let op = RopeHeads {
            cos: host(cos)?,
            sin: host(sin)?,
            scale,
            adjoint: false,
        };
        x.apply_op1(op)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn rand_tensor(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let v: Vec<f64> = (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 11) as f64 / (1u64 << 53) as f64) * 6.0 - 3.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// d(Σ y ⊙ w)/dx: the gradient a fused op and its composite must agree on.
    fn weighted_grad(y: &Tensor, w: &Tensor, x: &Var) -> Tensor {
        let g = (y * w).unwrap().sum_all().unwrap().backward().unwrap();
        g.get(x.as_tensor()).unwrap().clone()
    }

    fn rows_of(t: &Tensor) -> Vec<Vec<f64>> {
        t.flatten_to(2).unwrap().to_vec2::<f64>().unwrap()
    }

    #[test]
    fn left_padded_softmax_and_its_gradient_match_an_additive_mask() {
        // Batch 3 × heads 2; pads 0, 2 and 4; (t, s) = (4, 4) is a prefill
        // (row 0..3 of the 4-padded sequence see nothing), (1, 6) a decode step.
        for (t, s) in [(4, 4), (1, 6)] {
            let pads = [0usize, 2, 4];
            let x = Var::from_tensor(&rand_tensor(&[3, 2, t, s], 3)).unwrap();
            let w = rand_tensor(&[3, 2, t, s], 4);
            let fused = left_padded_causal_softmax(x.as_tensor(), &pads).unwrap();
            let neg = crate::qwen2::mask_value(DType::F64) as f64;
            let visible = |b: usize, i: usize, j: usize| pads[b] <= j && j <= i + s - t;
            let m: Vec<f64> = (0..3)
                .flat_map(|b| {
                    (0..t).flat_map(move |i| {
                        (0..s).map(move |j| if visible(b, i, j) { 0.0 } else { neg })
                    })
                })
                .collect();
            let mask = Tensor::from_vec(m, (3, 1, t, s), &Device::Cpu).unwrap();
            let comp = crate::qwen2::softmax_last_dim(&x.as_tensor().broadcast_add(&mask).unwrap())
                .unwrap();
            let (rows, want) = (rows_of(&fused), rows_of(&comp));
            for (r, (got, want)) in rows.iter().zip(&want).enumerate() {
                let (b, i) = (r / (2 * t), r % t);
                if (0..s).any(|j| visible(b, i, j)) {
                    for j in 0..s {
                        assert!((got[j] - want[j]).abs() < 1e-12, "row {r} key {j}");
                        if !visible(b, i, j) {
                            assert_eq!(got[j], 0.0, "masked key {j} of row {r}");
                        }
                    }
                } else {
                    // A padding query sees no key: zeros, not NaN.
                    assert!(got.iter().all(|&p| p == 0.0), "row {r}: {got:?}");
                }
            }
            // Gradients agree wherever the row sees a key (the padding
            // queries' outputs are never used).
            let gf = rows_of(&weighted_grad(&fused, &w, &x));
            let gc = rows_of(&weighted_grad(&comp, &w, &x));
            for (r, (a, b_)) in gf.iter().zip(&gc).enumerate() {
                let (b, i) = (r / (2 * t), r % t);
                if (0..s).any(|j| visible(b, i, j)) {
                    for j in 0..s {
                        assert!((a[j] - b_[j]).abs() < 1e-12, "grad row {r} key {j}");
                    }
                }
            }
        }
        let x = rand_tensor(&[2, 1, 3, 3], 5);
        assert!(
            left_padded_causal_softmax(&x, &[0, 1, 2]).is_err(),
            "pads per batch element"
        );
    }

    #[test]
    fn fused_causal_softmax_and_its_gradient_match_the_composite() {
        for (t, s) in [(5, 5), (3, 7), (1, 4)] {
            let x = Var::from_tensor(&rand_tensor(&[2, 3, t, s], 1)).unwrap();
            let w = rand_tensor(&[2, 3, t, s], 2);
            let fused = causal_softmax(x.as_tensor()).unwrap();
            let neg = crate::qwen2::mask_value(DType::F64);
            let m: Vec<f64> = (0..t)
                .flat_map(|i| (0..s).map(move |j| if j <= i + s - t { 0.0 } else { neg as f64 }))
                .collect();
            let mask = Tensor::from_vec(m, (t, s), &Device::Cpu).unwrap();
            let comp = crate::qwen2::softmax_last_dim(&x.as_tensor().broadcast_add(&mask).unwrap())
                .unwrap();
            assert!(max_abs_diff(&fused, &comp) < 1e-12);
            let gf = (&fused * &w)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let gc = (&comp * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let (gf, gc) = (
                gf.get(x.as_tensor()).unwrap(),
                gc.get(x.as_tensor()).unwrap(),
            );
            assert!(max_abs_diff(gf, gc) < 1e-12);
        }
    }

    #[test]
    fn fused_log_softmax_and_its_gradient_match_the_composite() {
        let x = Var::from_tensor(&rand_tensor(&[4, 6, 9], 3)).unwrap();
        let w = rand_tensor(&[4, 6, 9], 4);
        let fused = log_softmax(x.as_tensor()).unwrap();
        let (comp, _) = crate::qwen2::log_softmax_last_dim(x.as_tensor()).unwrap();
        assert!(max_abs_diff(&fused, &comp) < 1e-12);
        let gf = (&fused * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gc = (&comp * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let (gf, gc) = (
            gf.get(x.as_tensor()).unwrap(),
            gc.get(x.as_tensor()).unwrap(),
        );
        assert!(max_abs_diff(gf, gc) < 1e-12);
    }

    #[test]
    fn fused_rms_norm_and_its_gradients_match_the_composite() {
        let x = Var::from_tensor(&rand_tensor(&[3, 5, 8], 5)).unwrap();
        let w = Var::from_tensor(&rand_tensor(&[8], 6)).unwrap();
        let c = rand_tensor(&[3, 5, 8], 7);
        let eps = 1e-6;
        let fused = rms_norm(x.as_tensor(), w.as_tensor(), eps)
            .unwrap()
            .unwrap();
        let xt = x.as_tensor();
        let inv = xt
            .sqr()
            .unwrap()
            .mean_keepdim(candle_core::D::Minus1)
            .unwrap()
            .affine(1.0, eps)
            .unwrap()
            .sqrt()
            .unwrap()
            .recip()
            .unwrap();
        let comp = xt
            .broadcast_mul(&inv)
            .unwrap()
            .broadcast_mul(w.as_tensor())
            .unwrap();
        assert!(max_abs_diff(&fused, &comp) < 1e-12);
        let gf = (&fused * &c)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gc = (&comp * &c).unwrap().sum_all().unwrap().backward().unwrap();
        for v in [&x, &w] {
            let (a, b) = (
                gf.get(v.as_tensor()).unwrap(),
                gc.get(v.as_tensor()).unwrap(),
            );
            assert!(max_abs_diff(a, b) < 1e-12);
        }
    }

    #[test]
    fn fused_rope_heads_and_its_gradient_match_the_composite() {
        let (b, t, h, d) = (2, 5, 3, 8);
        let x = Var::from_tensor(&rand_tensor(&[b, t, h, d], 8)).unwrap();
        let cos = rand_tensor(&[t, d / 2], 9);
        let sin = rand_tensor(&[t, d / 2], 10);
        let w = rand_tensor(&[b, h, t, d], 11);
        let scale = 0.35;
        let fused = rope_to_heads(x.as_tensor(), &cos, &sin, scale)
            .unwrap()
            .unwrap();
        let xt = x.as_tensor();
        let (c, s) = (
            cos.reshape((1, t, 1, d / 2)).unwrap(),
            sin.reshape((1, t, 1, d / 2)).unwrap(),
        );
        let x1 = xt.narrow(3, 0, d / 2).unwrap();
        let x2 = xt.narrow(3, d / 2, d / 2).unwrap();
        let r1 = (x1.broadcast_mul(&c).unwrap() - x2.broadcast_mul(&s).unwrap()).unwrap();
        let r2 = (x2.broadcast_mul(&c).unwrap() + x1.broadcast_mul(&s).unwrap()).unwrap();
        let comp = Tensor::cat(&[&r1, &r2], 3)
            .unwrap()
            .affine(scale, 0.0)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        assert_eq!(fused.dims(), &[b, h, t, d]);
        assert!(max_abs_diff(&fused, &comp) < 1e-12);
        let gf = (&fused * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gc = (&comp * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let (gf, gc) = (
            gf.get(x.as_tensor()).unwrap(),
            gc.get(x.as_tensor()).unwrap(),
        );
        assert!(max_abs_diff(gf, gc) < 1e-12);
    }
}
