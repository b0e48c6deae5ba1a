//! Fused kernels with their own backward passes for the memory-bound steps
//! of training: causal softmax over attention scores, log-softmax over
//! logits, RMSNorm, RoPE and SwiGLU's product.
//!
//! candle's own fused versions have no `bwd` and cut the gradient; these
//! implement `CustomOp::bwd` with the analytic gradients (checked against
//! finite differences in tests/model/gradients.rs and against the composite ops in
//! this file's tests). Each runs on the CPU in f32/f64; the causal softmax,
//! RMSNorm and SwiGLU also on a GPU in f32/bf16/f16 (`kernels/*.cu`, the
//! `cuda` feature). Elsewhere the callers fall back to compositions of
//! differentiable candle ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

use crate::kernels::Real;

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// Rows below this many elements are processed on one thread.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// Runs `f(first_row, inputs_rows, output_rows)` over the `width`-wide rows
/// of `dst` and of each of `inputs` (shaped like `dst`), splitting the rows
/// across candle's thread count when large. Rows are independent, so the
/// split does not change the result.
fn par_rows<T: Copy + Send + Sync, F>(inputs: &[&[T]], dst: &mut [T], width: usize, f: F)
where
    F: Fn(usize, &[&[T]], &mut [T]) + Sync,
{
    let rows = dst.len() / width.max(1);
    let threads = candle_core::utils::get_num_threads().max(1);
    if dst.len() < PAR_MIN_ELEMS || threads == 1 || rows < 2 {
        f(0, inputs, dst);
        return;
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (k, dc) in dst.chunks_mut(per * width).enumerate() {
            let start = k * per * width;
            let part: Vec<&[T]> = inputs.iter().map(|x| &x[start..start + dc.len()]).collect();
            let f = &f;
            s.spawn(move || f(k * per, &part, dc));
        }
    });
}

pub(crate) fn contiguous_slice<'a, T>(v: &'a [T], l: &Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("fused op needs a contiguous input"),
    }
}

/// A fused op: its CPU work written once for f32 and f64, and for the ops
/// that train, its backward pass. [`Fused`] makes it a candle op.
trait HostKernel: Send + Sync {
    /// candle's name for the op.
    const NAME: &'static str;

    /// The output of the op for its contiguous inputs, all of one float
    /// type; `dims` are the first input's.
    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T>;

    /// The output's shape for the first input's `dims`, or why the op does
    /// not apply to them: by default the input's shape.
    fn out_shape(&self, dims: &[usize]) -> Result<Shape> {
        Ok(Shape::from(dims))
    }

    /// The gradient of a one-input op (candle's `CustomOp1::bwd`).
    fn bwd1(&self, _arg: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        candle_core::bail!("{} has no backward pass", Self::NAME)
    }

    /// The op on CUDA inputs (the same contract as [`HostKernel::run`]),
    /// for the kernels that have a GPU version in `kernels/`.
    #[cfg(feature = "cuda")]
    fn cuda(&self, _inputs: &[(&CudaStorage, &Layout)], _dims: &[usize]) -> Result<CudaStorage> {
        candle_core::bail!("{} has no CUDA kernel", Self::NAME)
    }

    /// The gradients of a two-input op (candle's `CustomOp2::bwd`).
    fn bwd2(&self, _args: [&Tensor; 2], _res: &Tensor, _grad: &Tensor) -> Result<Grads2> {
        candle_core::bail!("{} has no backward pass", Self::NAME)
    }

    /// The gradients of a three-input op (candle's `CustomOp3::bwd`).
    fn bwd3(&self, _args: [&Tensor; 3], _res: &Tensor, _grad: &Tensor) -> Result<Grads3> {
        candle_core::bail!("{} has no backward pass", Self::NAME)
    }
}

/// The gradients of a two-input op, one per input.
type Grads2 = (Option<Tensor>, Option<Tensor>);

/// The gradients of a three-input op, one per input.
type Grads3 = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// A [`HostKernel`] as a candle op of one, two or three inputs.
struct Fused<K>(K);

/// The inputs as contiguous `T` slices, or `None` when one is not `T`.
fn typed_inputs<'a, T: Real>(args: &[(&'a CpuStorage, &Layout)]) -> Result<Option<Vec<&'a [T]>>> {
    let mut out = Vec::with_capacity(args.len());
    for (storage, layout) in args {
        let Some(v) = T::slice(storage) else {
            return Ok(None);
        };
        out.push(contiguous_slice(v, layout)?);
    }
    Ok(Some(out))
}

impl<K: HostKernel> Fused<K> {
    /// Runs the kernel on CPU inputs that are all f32 or all f64.
    fn cpu(&self, args: &[(&CpuStorage, &Layout)]) -> Result<(CpuStorage, Shape)> {
        let dims = args[0].1.dims();
        let shape = self.0.out_shape(dims)?;
        if let Some(xs) = typed_inputs::<f32>(args)? {
            return Ok((f32::storage(self.0.run(&xs, dims)), shape));
        }
        if let Some(xs) = typed_inputs::<f64>(args)? {
            return Ok((f64::storage(self.0.run(&xs, dims)), shape));
        }
        candle_core::bail!("{}: f32/f64 only, every input the same", K::NAME)
    }
}

impl<K: HostKernel> CustomOp1 for Fused<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.cpu(&[(s, l)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let shape = self.0.out_shape(l.dims())?;
        Ok((self.0.cuda(&[(s, l)], l.dims())?, shape))
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        self.0.bwd1(arg, res, grad_res)
    }
}

impl<K: HostKernel> CustomOp2 for Fused<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu(&[(s1, l1), (s2, l2)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let shape = self.0.out_shape(l1.dims())?;
        Ok((self.0.cuda(&[(s1, l1), (s2, l2)], l1.dims())?, shape))
    }

    fn bwd(&self, a: &Tensor, b: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Grads2> {
        self.0.bwd2([a, b], res, grad_res)
    }
}

impl<K: HostKernel> candle_core::CustomOp3 for Fused<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu(&[(s1, l1), (s2, l2), (s3, l3)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let shape = self.0.out_shape(l1.dims())?;
        Ok((
            self.0.cuda(&[(s1, l1), (s2, l2), (s3, l3)], l1.dims())?,
            shape,
        ))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<Grads3> {
        self.0.bwd3([a, b, c], res, grad_res)
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
pub(crate) struct ScoreRows<'a> {
    pub t: usize,
    pub s: usize,
    pub rows_per_batch: usize,
    pub pads: &'a [usize],
    /// `Some(l)`: every row sees keys up to `l` instead of the causal
    /// bound (a decode step over a whole cache, `crate::fixed_step`).
    pub last: Option<usize>,
}

/// Softmax of rows `first_row..` of scores `src` into `dst`, each row over
/// the keys `g` lets it see; the others get exactly 0.
pub(crate) fn causal_softmax_rows<T: Real>(
    first_row: usize,
    src: &[T],
    dst: &mut [T],
    g: ScoreRows,
) {
    let (t, s) = (g.t, g.s);
    for (k, (x, y)) in src.chunks(s).zip(dst.chunks_mut(s)).enumerate() {
        let row = first_row + k;
        let i = row % t;
        let lo = g.pads.get(row / g.rows_per_batch).copied().unwrap_or(0);
        let hi = g.last.map_or(i + s - t + 1, |l| l + 1).min(s);
        if lo >= hi {
            y.iter_mut().for_each(|v| *v = T::ZERO);
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
            let e = (x[j] - m).exp();
            y[j] = e;
            sum += e.to_f64();
        }
        let inv = T::from_f64(1.0 / sum);
        for v in &mut y[lo..hi] {
            *v *= inv;
        }
        let (head, rest) = y.split_at_mut(lo);
        for v in head.iter_mut().chain(&mut rest[hi - lo..]) {
            *v = T::ZERO;
        }
    }
}

impl HostKernel for CausalSoftmax {
    const NAME: &'static str = "agentrl-causal-softmax";

    fn out_shape(&self, dims: &[usize]) -> Result<Shape> {
        if dims.len() < 2 {
            candle_core::bail!("causal softmax needs [.., T, S]")
        }
        let (t, s) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        if s < t {
            candle_core::bail!("causal softmax: {s} keys < {t} queries")
        }
        Ok(Shape::from(dims))
    }

    fn bwd1(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(softmax_bwd(res, grad_res)?))
    }

    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        let (t, s) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        // `left_padded_causal_softmax` has checked that pads match dims[0].
        let rows = inputs[0].len() / s.max(1);
        let g = ScoreRows {
            t,
            s,
            rows_per_batch: rows / dims[0].max(1),
            pads: &self.pads,
            last: None,
        };
        let mut y = vec![T::ZERO; inputs[0].len()];
        par_rows(inputs, &mut y, s, |r, x, y| {
            causal_softmax_rows(r, x[0], y, g)
        });
        y
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], dims: &[usize]) -> Result<CudaStorage> {
        let (t, s) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let rows = dims.iter().product::<usize>() / s.max(1);
        softmax_on_gpu::causal(inputs[0], &self.pads, t, s, rows / dims[0].max(1))
    }
}

/// `dx = p ⊙ (g − Σ_j g_j p_j)` row by row; masked keys have p = 0 and get 0.
struct SoftmaxBwd;

fn softmax_bwd_rows<T: Real>(p: &[T], g: &[T], dx: &mut [T], s: usize) {
    for ((pr, gr), dr) in p.chunks(s).zip(g.chunks(s)).zip(dx.chunks_mut(s)) {
        let dot: f64 = pr
            .iter()
            .zip(gr)
            .map(|(a, b)| a.to_f64() * b.to_f64())
            .sum();
        let dot = T::from_f64(dot);
        for j in 0..s {
            dr[j] = pr[j] * (gr[j] - dot);
        }
    }
}

impl HostKernel for SoftmaxBwd {
    const NAME: &'static str = "agentrl-softmax-bwd";

    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        let s = *dims.last().unwrap_or(&1);
        let mut dx = vec![T::ZERO; inputs[0].len()];
        par_rows(inputs, &mut dx, s, |_, pg, dx| {
            softmax_bwd_rows(pg[0], pg[1], dx, s)
        });
        dx
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], dims: &[usize]) -> Result<CudaStorage> {
        softmax_on_gpu::backward(inputs[0], inputs[1], *dims.last().unwrap_or(&1))
    }
}

/// [`CausalSoftmax`] and [`SoftmaxBwd`] by the kernels of `kernels/softmax.cu`.
#[cfg(feature = "cuda")]
pub(crate) mod softmax_on_gpu {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    use crate::cuda::{launch, on_float_slice, row_blocks, upload_pads, view, SOFTMAX};

    /// Rows of `s` scores, `t` queries per (batch, head), `rows_per_batch`
    /// rows per batch element, the first `pads[b]` keys of element b masked.
    pub fn causal(
        (x, layout): (&CudaStorage, &Layout),
        pads: &[usize],
        t: usize,
        s: usize,
        rows_per_batch: usize,
    ) -> Result<CudaStorage> {
        let dev = x.device();
        let pads_on_gpu = upload_pads(dev, pads)?;
        let shape = Shape {
            t,
            s,
            rows_per_batch,
            n_pads: pads.len(),
        };
        on_float_slice!(&x.slice, "causal softmax", |v, suffix| {
            forward(dev, suffix, v, layout, &pads_on_gpu, shape)
        })
    }

    #[derive(Clone, Copy)]
    struct Shape {
        t: usize,
        s: usize,
        rows_per_batch: usize,
        n_pads: usize,
    }

    fn forward<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        x: &CudaSlice<T>,
        layout: &Layout,
        pads: &CudaSlice<u32>,
        sh: Shape,
    ) -> Result<CudaStorage> {
        let x = view(x, layout, "causal softmax scores")?;
        let n = layout.shape().elem_count();
        // SAFETY: the kernel writes every element of every row.
        let y = unsafe { dev.alloc::<T>(n)? };
        let cfg = row_blocks(n / sh.s.max(1), sh.s)?;
        let (n_pads, t, s, rpb) = (
            sh.n_pads as i32,
            sh.t as i32,
            sh.s as i32,
            sh.rows_per_batch as i32,
        );
        // causal_softmax_T(x, y, pads, n_pads, t, s, rows_per_batch): one block per row of s.
        launch!(
            dev,
            SOFTMAX,
            &format!("causal_softmax_{suffix}"),
            cfg,
            &x,
            &y,
            pads,
            &n_pads,
            &t,
            &s,
            &rpb
        )?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }

    /// Rows of `s` scores, one query each, `rows_per_batch` rows per batch
    /// element, element b's row seeing keys `pads[b] ..= *last` (`last` a
    /// one-element u32 buffer on the device).
    pub fn decode(
        (x, layout): (&CudaStorage, &Layout),
        (last, last_layout): (&CudaStorage, &Layout),
        pads: &[usize],
        s: usize,
        rows_per_batch: usize,
    ) -> Result<CudaStorage> {
        let dev = x.device();
        let pads_on_gpu = upload_pads(dev, pads)?;
        let last = view(
            u32::as_cuda_slice(last)?,
            last_layout,
            "decode softmax bound",
        )?;
        let sh = Shape {
            t: 1,
            s,
            rows_per_batch,
            n_pads: pads.len(),
        };
        on_float_slice!(&x.slice, "decode softmax", |v, suffix| {
            decode_typed(dev, suffix, (v, layout), &pads_on_gpu, &last, sh)
        })
    }

    fn decode_typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        (x, layout): (&CudaSlice<T>, &Layout),
        pads: &CudaSlice<u32>,
        last: &CudaView<'_, u32>,
        sh: Shape,
    ) -> Result<CudaStorage> {
        let x = view(x, layout, "decode softmax scores")?;
        let n = layout.shape().elem_count();
        // SAFETY: the kernel writes every element of every row.
        let y = unsafe { dev.alloc::<T>(n)? };
        let cfg = row_blocks(n / sh.s.max(1), sh.s)?;
        let (n_pads, s, rpb) = (sh.n_pads as i32, sh.s as i32, sh.rows_per_batch as i32);
        // decode_softmax_T(x, y, pads, n_pads, last, s, rows_per_batch):
        // one block per row of s.
        launch!(
            dev,
            SOFTMAX,
            &format!("decode_softmax_{suffix}"),
            cfg,
            &x,
            &y,
            pads,
            &n_pads,
            last,
            &s,
            &rpb
        )?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }

    /// `dx = p ⊙ (g − Σ p g)` over rows of `s`.
    pub fn backward(
        (p, pl): (&CudaStorage, &Layout),
        (g, gl): (&CudaStorage, &Layout),
        s: usize,
    ) -> Result<CudaStorage> {
        let dev = p.device();
        on_float_slice!(&p.slice, "softmax backward", |v, suffix| {
            backward_typed(dev, suffix, (v, pl), (g, gl), s)
        })
    }

    fn backward_typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        (p, pl): (&CudaSlice<T>, &Layout),
        (g, gl): (&CudaStorage, &Layout),
        s: usize,
    ) -> Result<CudaStorage> {
        let p = view(p, pl, "softmax probabilities")?;
        let g = view(T::as_cuda_slice(g)?, gl, "softmax gradient")?;
        let n = pl.shape().elem_count();
        if gl.shape().elem_count() != n {
            candle_core::bail!("softmax backward: probabilities and gradient differ in size")
        }
        // SAFETY: the kernel writes every element of every row.
        let dx = unsafe { dev.alloc::<T>(n)? };
        let cfg = row_blocks(n / s.max(1), s)?;
        let s = s as i32;
        // softmax_bwd_T(p, g, dx, s): one block per row of s.
        launch!(
            dev,
            SOFTMAX,
            &format!("softmax_bwd_{suffix}"),
            cfg,
            &p,
            &g,
            &dx,
            &s
        )?;
        Ok(CudaStorage::wrap_cuda_slice(dx, dev.clone()))
    }
}

fn softmax_bwd(p: &Tensor, g: &Tensor) -> Result<Tensor> {
    let g = g.contiguous()?;
    if fused_or_gpu_ok(p) && g.dtype() == p.dtype() {
        p.apply_op2_no_bwd(&g, &Fused(SoftmaxBwd))
    } else {
        let dot = (&g * p)?.sum_keepdim(candle_core::D::Minus1)?;
        g.broadcast_sub(&dot)? * p
    }
}

fn fused_ok(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64) && t.is_contiguous()
}

/// [`fused_ok`], or a contiguous f32/bf16/f16 tensor on a GPU, for the ops
/// with a CUDA kernel (the causal softmax, RMSNorm and their backward, a
/// projection's bias).
pub(crate) fn fused_or_gpu_ok(t: &Tensor) -> bool {
    fused_ok(t)
        || (cfg!(feature = "cuda")
            && t.device().is_cuda()
            && matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
            && t.is_contiguous())
}

/// Causal softmax of attention scores `[.., T, S]` (query i sees keys
/// `..= i + S - T`), differentiable. Fused on CPU; elsewhere an additive
/// mask plus `softmax_last_dim`.
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
    if fused_or_gpu_ok(&scores) {
        let op = CausalSoftmax {
            pads: pads.to_vec(),
        };
        return scores.apply_op1(Fused(op));
    }
    let (t, s) = (scores.dims()[n - 2], scores.dims()[n - 1]);
    if t == 1 && pads.iter().all(|&p| p == 0) {
        // One query at the last position sees every key: nothing to mask,
        // and no mask to build on the host and copy to a device per layer.
        return crate::qwen2::softmax_last_dim(&scores);
    }
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

fn log_softmax_rows<T: Real>(x: &[T], y: &mut [T], v: usize) {
    for (xr, yr) in x.chunks(v).zip(y.chunks_mut(v)) {
        let mut m = xr[0];
        for &a in &xr[1..] {
            if a > m {
                m = a;
            }
        }
        let sum: f64 = xr.iter().map(|&a| (a - m).exp().to_f64()).sum();
        let lse = T::from_f64(m.to_f64() + sum.ln());
        for (&a, b) in xr.iter().zip(yr.iter_mut()) {
            *b = a - lse;
        }
    }
}

impl HostKernel for LogSoftmax {
    const NAME: &'static str = "agentrl-log-softmax";

    fn bwd1(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        // dx = g − softmax(x) · Σ g, with softmax(x) = exp(y).
        let g = grad_res.contiguous()?;
        if fused_ok(res) && g.dtype() == res.dtype() {
            return Ok(Some(res.apply_op2_no_bwd(&g, &Fused(LogSoftmaxBwd))?));
        }
        let sum = g.sum_keepdim(candle_core::D::Minus1)?;
        Ok(Some((&g - res.exp()?.broadcast_mul(&sum)?)?))
    }

    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        let v = *dims.last().unwrap_or(&1);
        let mut y = vec![T::ZERO; inputs[0].len()];
        par_rows(inputs, &mut y, v, |_, x, y| log_softmax_rows(x[0], y, v));
        y
    }
}

struct LogSoftmaxBwd;

fn log_softmax_bwd_rows<T: Real>(y: &[T], g: &[T], dx: &mut [T], v: usize) {
    for ((yr, gr), dr) in y.chunks(v).zip(g.chunks(v)).zip(dx.chunks_mut(v)) {
        let sum = T::from_f64(gr.iter().map(|a| a.to_f64()).sum::<f64>());
        for j in 0..v {
            dr[j] = gr[j] - yr[j].exp() * sum;
        }
    }
}

impl HostKernel for LogSoftmaxBwd {
    const NAME: &'static str = "agentrl-log-softmax-bwd";

    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        let v = *dims.last().unwrap_or(&1);
        let mut dx = vec![T::ZERO; inputs[0].len()];
        par_rows(inputs, &mut dx, v, |_, yg, dx| {
            log_softmax_bwd_rows(yg[0], yg[1], dx, v)
        });
        dx
    }
}

/// Log-softmax over the last dimension, differentiable. Fused on CPU;
/// elsewhere `x − (m + log Σ exp(x − m))` with the max m detached.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let x = x.contiguous()?;
    if fused_ok(&x) {
        return x.apply_op1(Fused(LogSoftmax));
    }
    Ok(crate::qwen2::log_softmax_last_dim(&x)?.0)
}

// ---------------------------------------------------------------- RMSNorm

/// `y = x · r · w` with `r = 1 / sqrt(mean(x²) + ε)` per row of `x: [.., d]`.
struct RmsNorm {
    eps: f64,
}

/// `1 / sqrt(mean(x²) + ε)` of one row, in f64.
fn inv_rms<T: Real>(xr: &[T], eps: f64) -> f64 {
    let ms: f64 = xr.iter().map(|a| a.to_f64() * a.to_f64()).sum::<f64>() / xr.len() as f64;
    1.0 / (ms + eps).sqrt()
}

fn rms_rows<T: Real>(x: &[T], w: &[T], y: &mut [T], d: usize, eps: f64) {
    for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
        let r = T::from_f64(inv_rms(xr, eps));
        for j in 0..d {
            yr[j] = xr[j] * r * w[j];
        }
    }
}

/// `dx = r·(g⊙w) − x · r³ · Σ(g⊙w⊙x) / d` per row.
fn rms_bwd_x_rows<T: Real>(x: &[T], w: &[T], g: &[T], dx: &mut [T], d: usize, eps: f64) {
    for ((xr, gr), dr) in x.chunks(d).zip(g.chunks(d)).zip(dx.chunks_mut(d)) {
        let r = inv_rms(xr, eps);
        let dot: f64 = (0..d)
            .map(|j| gr[j].to_f64() * w[j].to_f64() * xr[j].to_f64())
            .sum();
        let c = T::from_f64(r * r * r * dot / d as f64);
        let r = T::from_f64(r);
        for j in 0..d {
            dr[j] = r * (gr[j] * w[j]) - xr[j] * c;
        }
    }
}

/// `dw = Σ_rows g ⊙ x · r`.
fn rms_bwd_w<T: Real>(x: &[T], g: &[T], d: usize, eps: f64) -> Vec<T> {
    let mut acc = vec![0f64; d];
    for (xr, gr) in x.chunks(d).zip(g.chunks(d)) {
        let r = inv_rms(xr, eps);
        for j in 0..d {
            acc[j] += gr[j].to_f64() * xr[j].to_f64() * r;
        }
    }
    acc.into_iter().map(T::from_f64).collect()
}

impl HostKernel for RmsNorm {
    const NAME: &'static str = "agentrl-rms-norm";

    fn bwd2(&self, [x, w]: [&Tensor; 2], _res: &Tensor, grad_res: &Tensor) -> Result<Grads2> {
        let g = grad_res.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &g, &Fused(RmsNormBwdX { eps: self.eps }))?;
        let dw = x.apply_op2_no_bwd(&g, &Fused(RmsNormBwdW { eps: self.eps }))?;
        Ok((Some(dx), Some(dw)))
    }

    /// Inputs `x` and `w`.
    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        let (d, w) = (*dims.last().unwrap_or(&1), inputs[1]);
        let mut y = vec![T::ZERO; inputs[0].len()];
        par_rows(&inputs[..1], &mut y, d, |_, x, y| {
            rms_rows(x[0], w, y, d, self.eps)
        });
        y
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], dims: &[usize]) -> Result<CudaStorage> {
        rms_on_gpu::run(rms_on_gpu::Pass::Forward, inputs, dims, self.eps)
    }
}

struct RmsNormBwdX {
    eps: f64,
}

impl HostKernel for RmsNormBwdX {
    const NAME: &'static str = "agentrl-rms-norm-bwd-x";

    /// Inputs `x`, `w` and the gradient `g`.
    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        let (d, w) = (*dims.last().unwrap_or(&1), inputs[1]);
        let mut dx = vec![T::ZERO; inputs[0].len()];
        par_rows(&[inputs[0], inputs[2]], &mut dx, d, |_, xg, dx| {
            rms_bwd_x_rows(xg[0], w, xg[1], dx, d, self.eps)
        });
        dx
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], dims: &[usize]) -> Result<CudaStorage> {
        rms_on_gpu::run(rms_on_gpu::Pass::BackwardX, inputs, dims, self.eps)
    }
}

struct RmsNormBwdW {
    eps: f64,
}

impl HostKernel for RmsNormBwdW {
    const NAME: &'static str = "agentrl-rms-norm-bwd-w";

    fn out_shape(&self, dims: &[usize]) -> Result<Shape> {
        Ok(Shape::from(*dims.last().unwrap_or(&1)))
    }

    /// Inputs `x` and the gradient `g`.
    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        rms_bwd_w(inputs[0], inputs[1], *dims.last().unwrap_or(&1), self.eps)
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], dims: &[usize]) -> Result<CudaStorage> {
        rms_on_gpu::run(rms_on_gpu::Pass::BackwardW, inputs, dims, self.eps)
    }
}

/// [`RmsNorm`], [`RmsNormBwdX`] and [`RmsNormBwdW`] by the kernels of
/// `kernels/rms_norm.cu`.
#[cfg(feature = "cuda")]
mod rms_on_gpu {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    use crate::cuda::{launch, on_float_slice, row_blocks, view, RMS_NORM};

    /// Row chunks whose dw partials the last kernel sums (fixed: the same
    /// bits whatever the GPU).
    const CHUNKS: usize = 128;

    /// Which op: `y` from (x, w); `dx` from (x, w, g); `dw` from (x, g).
    #[derive(Clone, Copy)]
    pub enum Pass {
        Forward,
        BackwardX,
        BackwardW,
    }

    pub fn run(
        pass: Pass,
        inputs: &[(&CudaStorage, &Layout)],
        dims: &[usize],
        eps: f64,
    ) -> Result<CudaStorage> {
        let d = *dims.last().unwrap_or(&1);
        let rows = dims.iter().product::<usize>() / d.max(1);
        let dev = inputs[0].0.device();
        on_float_slice!(&inputs[0].0.slice, "rms norm", |x, suffix| {
            typed(
                dev,
                suffix,
                pass,
                (x, inputs[0].1),
                &inputs[1..],
                rows,
                d,
                eps as f32,
            )
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        pass: Pass,
        (x, xl): (&CudaSlice<T>, &Layout),
        rest: &[(&CudaStorage, &Layout)],
        rows: usize,
        d: usize,
        eps: f32,
    ) -> Result<CudaStorage> {
        let x = view(x, xl, "rms norm input")?;
        let other = |k: usize, what: &str| -> Result<_> {
            let (s, l) = rest[k];
            view(T::as_cuda_slice(s)?, l, what)
        };
        let cfg = row_blocks(rows, d)?;
        let d32 = d as i32;
        let out = match pass {
            Pass::Forward => {
                let w = other(0, "rms norm weight")?;
                // SAFETY: the kernel writes every element of every row.
                let y = unsafe { dev.alloc::<T>(rows * d)? };
                // rms_norm_fwd_T(x, w, y, d, eps): one block per row.
                launch!(
                    dev,
                    RMS_NORM,
                    &format!("rms_norm_fwd_{suffix}"),
                    cfg,
                    &x,
                    &w,
                    &y,
                    &d32,
                    &eps
                )?;
                y
            }
            Pass::BackwardX => {
                let (w, g) = (other(0, "rms norm weight")?, other(1, "rms norm gradient")?);
                // SAFETY: the kernel writes every element of every row.
                let dx = unsafe { dev.alloc::<T>(rows * d)? };
                // rms_norm_bwd_x_T(x, w, g, dx, d, eps): one block per row.
                launch!(
                    dev,
                    RMS_NORM,
                    &format!("rms_norm_bwd_x_{suffix}"),
                    cfg,
                    &x,
                    &w,
                    &g,
                    &dx,
                    &d32,
                    &eps
                )?;
                dx
            }
            Pass::BackwardW => {
                let g = other(0, "rms norm gradient")?;
                let per = rows.div_ceil(CHUNKS).max(1);
                let chunks = rows.div_ceil(per).max(1);
                let partial = dev.alloc_zeros::<f32>(chunks * d)?;
                let (rows32, per32, chunks32) = (rows as i32, per as i32, chunks as i32);
                let cfg_partial = LaunchConfig {
                    grid_dim: (chunks as u32, 1, 1),
                    ..cfg
                };
                // rms_norm_bwd_w_partial_T(x, g, partial, rows, d, eps, per):
                // block c sums rows c·per.. into partial[c].
                launch!(
                    dev,
                    RMS_NORM,
                    &format!("rms_norm_bwd_w_partial_{suffix}"),
                    cfg_partial,
                    &x,
                    &g,
                    &partial,
                    &rows32,
                    &d32,
                    &eps,
                    &per32
                )?;
                // SAFETY: one thread per column writes each of the d values.
                let dw = unsafe { dev.alloc::<T>(d)? };
                let cfg_sum = LaunchConfig {
                    grid_dim: (d.div_ceil(256) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // rms_norm_bwd_w_sum_T(partial, dw, chunks, d): thread j sums column j.
                launch!(
                    dev,
                    RMS_NORM,
                    &format!("rms_norm_bwd_w_sum_{suffix}"),
                    cfg_sum,
                    &partial,
                    &dw,
                    &chunks32,
                    &d32
                )?;
                dw
            }
        };
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

/// Fused RMSNorm `x / sqrt(mean(x²) + ε) · w` over the last dim with its own
/// backward (for x and w), on CPU f32/f64 or GPU f32/bf16/f16 contiguous
/// input; `None` elsewhere so the caller uses the composite.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Option<Result<Tensor>> {
    if fused_or_gpu_ok(x)
        && fused_or_gpu_ok(w)
        && x.dtype() == w.dtype()
        && x.device().same_device(w.device())
    {
        Some(x.apply_op2(w, Fused(RmsNorm { eps })))
    } else {
        None
    }
}

// ----------------------------------------------------------------- SwiGLU

/// `silu(a) ⊙ b` for the MLP's gate (before its activation) and up
/// projections, with its own backward.
struct Swiglu;

fn silu_f64(a: f64) -> (f64, f64) {
    let s = 1.0 / (1.0 + (-a).exp());
    (a * s, s)
}

impl HostKernel for Swiglu {
    const NAME: &'static str = "agentrl-swiglu";

    fn bwd2(&self, [a, b]: [&Tensor; 2], _res: &Tensor, grad_res: &Tensor) -> Result<Grads2> {
        let g = grad_res.contiguous()?;
        // grad: [da; db] in one buffer, each half a view.
        let both = a.apply_op3_no_bwd(b, &g, &Fused(SwigluBwd))?;
        Ok((Some(both.get(0)?), Some(both.get(1)?)))
    }

    /// Inputs `a` and `b`.
    fn run<T: Real>(&self, inputs: &[&[T]], _dims: &[usize]) -> Vec<T> {
        let (a, b) = (inputs[0], inputs[1]);
        a.iter()
            .zip(b)
            .map(|(&a, &b)| T::from_f64(silu_f64(a.to_f64()).0 * b.to_f64()))
            .collect()
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], _dims: &[usize]) -> Result<CudaStorage> {
        swiglu_on_gpu::run(false, inputs)
    }
}

/// `[da; db]` (shape `[2, ..]`) from `a`, `b` and the gradient `g` of
/// [`Swiglu`]'s output.
struct SwigluBwd;

impl HostKernel for SwigluBwd {
    const NAME: &'static str = "agentrl-swiglu-bwd";

    fn out_shape(&self, dims: &[usize]) -> Result<Shape> {
        let mut d = vec![2];
        d.extend_from_slice(dims);
        Ok(Shape::from(d))
    }

    fn run<T: Real>(&self, inputs: &[&[T]], _dims: &[usize]) -> Vec<T> {
        let (a, b, g) = (inputs[0], inputs[1], inputs[2]);
        let n = a.len();
        let mut out = vec![T::ZERO; 2 * n];
        for i in 0..n {
            let (av, gv) = (a[i].to_f64(), g[i].to_f64());
            let (silu, s) = silu_f64(av);
            out[i] = T::from_f64(gv * b[i].to_f64() * s * (1.0 + av * (1.0 - s)));
            out[n + i] = T::from_f64(gv * silu);
        }
        out
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], _dims: &[usize]) -> Result<CudaStorage> {
        swiglu_on_gpu::run(true, inputs)
    }
}

/// `silu(a) ⊙ b` as one op with its own backward, on CPU f32/f64 or GPU
/// f32/bf16/f16 contiguous inputs of one shape; `None` elsewhere (the
/// caller uses candle's `silu` and `mul`).
pub fn swiglu(a: &Tensor, b: &Tensor) -> Option<Result<Tensor>> {
    let (a, b) = match (a.contiguous(), b.contiguous()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Some(Err(e)),
    };
    let fits = fused_or_gpu_ok(&a)
        && a.dtype() == b.dtype()
        && a.dims() == b.dims()
        && a.device().same_device(b.device());
    fits.then(|| a.apply_op2(&b, Fused(Swiglu)))
}

/// [`Swiglu`] and [`SwigluBwd`] by the kernels of `kernels/swiglu.cu`.
#[cfg(feature = "cuda")]
mod swiglu_on_gpu {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    use crate::cuda::{elementwise_blocks, launch, on_float_slice, view, SWIGLU};

    /// The forward from (a, b), or with `backward` `[da; db]` from (a, b, g).
    pub fn run(backward: bool, inputs: &[(&CudaStorage, &Layout)]) -> Result<CudaStorage> {
        let dev = inputs[0].0.device();
        on_float_slice!(&inputs[0].0.slice, "swiglu", |a, suffix| {
            typed(dev, suffix, backward, (a, inputs[0].1), &inputs[1..])
        })
    }

    fn typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        backward: bool,
        (a, al): (&CudaSlice<T>, &Layout),
        rest: &[(&CudaStorage, &Layout)],
    ) -> Result<CudaStorage> {
        let n = al.shape().elem_count();
        let a = view(a, al, "swiglu gate")?;
        let other = |k: usize, what: &str| -> Result<_> {
            let (s, l) = rest[k];
            if l.shape().elem_count() != n {
                candle_core::bail!("swiglu: {what} differs in size from the gate")
            }
            view(T::as_cuda_slice(s)?, l, what)
        };
        let b = other(0, "up projection")?;
        let cfg = elementwise_blocks(n);
        let n64 = n as u64;
        let out = if backward {
            let g = other(1, "gradient")?;
            // SAFETY: the kernel writes da[i] and db[i] for every i < n.
            let out = unsafe { dev.alloc::<T>(2 * n)? };
            // swiglu_bwd_T(a, b, g, out, n): grid-strided over n.
            launch!(
                dev,
                SWIGLU,
                &format!("swiglu_bwd_{suffix}"),
                cfg,
                &a,
                &b,
                &g,
                &out,
                &n64
            )?;
            out
        } else {
            // SAFETY: the kernel writes y[i] for every i < n.
            let y = unsafe { dev.alloc::<T>(n)? };
            // swiglu_fwd_T(a, b, y, n): grid-strided over n.
            launch!(
                dev,
                SWIGLU,
                &format!("swiglu_fwd_{suffix}"),
                cfg,
                &a,
                &b,
                &y,
                &n64
            )?;
            y
        };
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

// ------------------------------------------------------------------- RoPE

/// Rotary embedding (rotate-half convention) fused with the head transpose
/// and a scale, of inputs `(x, cos, sin)` with tables `[T, D/2]`:
/// `[B, T, H, D]` → `[B, H, T, D]`,
/// `out = scale · [x1·cos − x2·sin, x2·cos + x1·sin]`. With `adjoint` it is
/// the transpose map (its own gradient): `[B, H, T, D]` → `[B, T, H, D]`,
/// `dx = scale · [g1·cos + g2·sin, g2·cos − g1·sin]`. On a GPU
/// `kernels/rope.cu`; the tables are inputs (constants, no gradient) so
/// they stay on the device.
#[derive(Clone, Copy)]
struct RopeHeads {
    scale: f64,
    adjoint: bool,
}

impl HostKernel for RopeHeads {
    const NAME: &'static str = "agentrl-rope-heads";

    fn out_shape(&self, dims: &[usize]) -> Result<Shape> {
        if dims.len() != 4 || !dims[3].is_multiple_of(2) {
            candle_core::bail!("rope: expected [B, T, H, D] with even D, got {dims:?}")
        }
        Ok(Shape::from((dims[0], dims[2], dims[1], dims[3])))
    }

    fn bwd3(
        &self,
        [_x, cos, sin]: [&Tensor; 3],
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<Grads3> {
        let adj = RopeHeads {
            adjoint: !self.adjoint,
            ..*self
        };
        let dx = grad_res.contiguous()?.apply_op3(cos, sin, Fused(adj))?;
        Ok((Some(dx), None, None))
    }

    fn run<T: Real>(&self, inputs: &[&[T]], dims: &[usize]) -> Vec<T> {
        let (x, cos, sin) = (inputs[0], inputs[1], inputs[2]);
        let mut out = vec![T::ZERO; x.len()];
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
                let cs = &cos[ti * half..(ti + 1) * half];
                let sn = &sin[ti * half..(ti + 1) * half];
                for hi in 0..h {
                    let (src, dst) = if self.adjoint {
                        (bhtd(bi, hi, ti), bthd(bi, ti, hi))
                    } else {
                        (bthd(bi, ti, hi), bhtd(bi, hi, ti))
                    };
                    for i in 0..half {
                        let a = x[src + i].to_f64();
                        let e = x[src + half + i].to_f64();
                        let (c, s) = (cs[i].to_f64(), sn[i].to_f64());
                        let (o1, o2) = if self.adjoint {
                            (a * c + e * s, e * c - a * s)
                        } else {
                            (a * c - e * s, e * c + a * s)
                        };
                        out[dst + i] = T::from_f64(o1 * self.scale);
                        out[dst + half + i] = T::from_f64(o2 * self.scale);
                    }
                }
            }
        }
        out
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, inputs: &[(&CudaStorage, &Layout)], dims: &[usize]) -> Result<CudaStorage> {
        rope_on_gpu::run(*self, inputs, dims)
    }
}

/// [`RopeHeads`] by the kernels of `kernels/rope.cu`.
#[cfg(feature = "cuda")]
mod rope_on_gpu {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    use super::RopeHeads;
    use crate::cuda::{elementwise_blocks, launch, on_float_slice, view, ROPE};

    /// `inputs` are (x, cos, sin); `dims` are x's.
    pub fn run(
        op: RopeHeads,
        inputs: &[(&CudaStorage, &Layout)],
        dims: &[usize],
    ) -> Result<CudaStorage> {
        let dev = inputs[0].0.device();
        on_float_slice!(&inputs[0].0.slice, "rope", |x, suffix| {
            typed(dev, suffix, op, (x, inputs[0].1), &inputs[1..], dims)
        })
    }

    fn typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        op: RopeHeads,
        (x, xl): (&CudaSlice<T>, &Layout),
        tables: &[(&CudaStorage, &Layout)],
        dims: &[usize],
    ) -> Result<CudaStorage> {
        let n = xl.shape().elem_count();
        let x = view(x, xl, "rope input")?;
        let table = |k: usize, what: &str| -> Result<_> {
            let (s, l) = tables[k];
            view(T::as_cuda_slice(s)?, l, what)
        };
        let (cos, sin) = (table(0, "rope cos")?, table(1, "rope sin")?);
        let (b, t, h) = if op.adjoint {
            (dims[0], dims[2], dims[1])
        } else {
            (dims[0], dims[1], dims[2])
        };
        let as_u32 = |v: usize| -> Result<u32> {
            u32::try_from(v)
                .map_err(|_| candle_core::Error::Msg(format!("rope: {dims:?} is too large")))
        };
        let (b, t, h, d) = (as_u32(b)?, as_u32(t)?, as_u32(h)?, as_u32(dims[3])?);
        let scale = op.scale as f32;
        let adjoint = i32::from(op.adjoint);
        // SAFETY: the kernel writes both values of every pair, so all n.
        let out = unsafe { dev.alloc::<T>(n)? };
        // rope_heads_T(x, cos, sin, out, b, t, h, d, scale, adjoint):
        // grid-strided over the n / 2 pairs.
        launch!(
            dev,
            ROPE,
            &format!("rope_heads_{suffix}"),
            elementwise_blocks(n / 2),
            &x,
            &cos,
            &sin,
            &out,
            &b,
            &t,
            &h,
            &d,
            &scale,
            &adjoint
        )?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

/// Rotates `x: [B, T, H, D]` with tables `cos, sin: [T, D/2]` (the same
/// positions for every sequence), scales by `scale` and returns
/// `[B, H, T, D]` contiguous, differentiably (the tables are constants);
/// `None` when neither the fused CPU kernel nor the GPU one applies (other
/// dtypes, or per-sequence tables).
pub fn rope_to_heads(x: &Tensor, cos: &Tensor, sin: &Tensor, scale: f64) -> Option<Result<Tensor>> {
    let x = match x.contiguous() {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    let dims = x.dims();
    let fits = fused_or_gpu_ok(&x)
        && dims.len() == 4
        && dims[3].is_multiple_of(2)
        && [cos, sin].iter().all(|tab| {
            tab.dims() == [dims[1], dims[3] / 2]
                && tab.dtype() == x.dtype()
                && tab.device().same_device(x.device())
        });
    if !fits {
        return None;
    }
    Some((|| {
        let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
        let op = RopeHeads {
            scale,
            adjoint: false,
        };
        x.apply_op3(&cos, &sin, Fused(op))
    })())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Values uniform in [-3, 3) of `shape`, from `seed` (f64, CPU).
    pub(crate) fn rand_tensor(shape: &[usize], seed: u64) -> Tensor {
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

    /// max |a − b| over every element.
    pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
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
    pub(crate) fn weighted_grad(y: &Tensor, w: &Tensor, x: &Var) -> Tensor {
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
            let (gf, gc) = (weighted_grad(&fused, &w, &x), weighted_grad(&comp, &w, &x));
            assert!(max_abs_diff(&gf, &gc) < 1e-12);
        }
    }

    #[test]
    fn unfused_causal_softmax_matches_the_fused_one_with_and_without_a_mask() {
        // F32 scores take the fused kernel; a bf16 copy takes the composite
        // path, including its mask-free shortcut for one query without pads.
        for (t, s, pads) in [(1, 6, vec![0, 0]), (1, 6, vec![0, 2]), (4, 6, vec![0, 0])] {
            let x = rand_tensor(&[2, 3, t, s], 8).to_dtype(DType::F32).unwrap();
            let fused = left_padded_causal_softmax(&x, &pads).unwrap();
            let half = x.to_dtype(DType::BF16).unwrap();
            let comp = left_padded_causal_softmax(&half, &pads)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let d = max_abs_diff(
                &fused.to_dtype(DType::F64).unwrap(),
                &comp.to_dtype(DType::F64).unwrap(),
            );
            assert!(d < 1e-2, "t {t} pads {pads:?}: {d}");
        }
    }

    #[test]
    fn fused_log_softmax_and_its_gradient_match_the_composite() {
        let x = Var::from_tensor(&rand_tensor(&[4, 6, 9], 3)).unwrap();
        let w = rand_tensor(&[4, 6, 9], 4);
        let fused = log_softmax(x.as_tensor()).unwrap();
        let (comp, _) = crate::qwen2::log_softmax_last_dim(x.as_tensor()).unwrap();
        assert!(max_abs_diff(&fused, &comp) < 1e-12);
        let (gf, gc) = (weighted_grad(&fused, &w, &x), weighted_grad(&comp, &w, &x));
        assert!(max_abs_diff(&gf, &gc) < 1e-12);
    }

    #[test]
    fn fused_swiglu_and_its_gradients_match_silu_times_up() {
        let a = Var::from_tensor(&rand_tensor(&[3, 5, 8], 8)).unwrap();
        let b = Var::from_tensor(&rand_tensor(&[3, 5, 8], 9)).unwrap();
        let c = rand_tensor(&[3, 5, 8], 10);
        let fused = swiglu(a.as_tensor(), b.as_tensor()).unwrap().unwrap();
        let comp = (a.as_tensor().silu().unwrap() * b.as_tensor()).unwrap();
        assert!(max_abs_diff(&fused, &comp) < 1e-12);
        for v in [&a, &b] {
            let (x, y) = (weighted_grad(&fused, &c, v), weighted_grad(&comp, &c, v));
            assert!(max_abs_diff(&x, &y) < 1e-12);
        }
        let other = rand_tensor(&[3, 5, 7], 11);
        assert!(
            swiglu(a.as_tensor(), &other).is_none(),
            "shapes differ: no fused op"
        );
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
        for v in [&x, &w] {
            let (a, b) = (weighted_grad(&fused, &c, v), weighted_grad(&comp, &c, v));
            assert!(max_abs_diff(&a, &b) < 1e-12);
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
        let (gf, gc) = (weighted_grad(&fused, &w, &x), weighted_grad(&comp, &w, &x));
        assert!(max_abs_diff(&gf, &gc) < 1e-12);
    }
}
