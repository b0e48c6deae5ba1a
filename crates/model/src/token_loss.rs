//! The loss end of the LM head where the CPU's fused path does not run: for
//! logits `[.., V]` and target ids `[..]`, each row's log-prob of its target
//! and the entropy of its next-token distribution, differentiably.
//!
//! On a GPU this is one op with its own backward (`kernels/token_loss.cu`):
//! it reads the logits once forward and once backward. The composite it
//! replaces there (log-softmax, gather, exp·mul·sum) makes about a dozen
//! passes over `[N, V]` tensors and keeps several alive for the backward;
//! with Qwen2.5's 151,936-word vocabulary each is 2.5 GB at 4,096 tokens in
//! f32. Elsewhere the composite stays: it is the reference the op is tested
//! against.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

/// `(logprobs, entropy)`, each shaped like `targets`: `logprobs = log
/// softmax(logits)[target]`, `entropy = -Σ p log p`, both differentiable with
/// respect to `logits`. `targets` holds u32 ids below V. On a GPU both are
/// f32 whatever the logits' dtype (as PyTorch's losses upcast bf16 logits);
/// elsewhere in the logits' dtype.
pub fn token_logprobs_entropy(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    if logits.device().is_cuda() {
        return fused(logits, targets);
    }
    composite(logits, targets)
}

/// The same through [`TokenLoss`] (on the host in tests).
fn fused(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let out = TokenLoss::apply(logits, targets)?;
    // grad: narrow + squeeze pass the gradient to their column of the op's output.
    let column = |i| out.narrow(D::Minus1, i, 1)?.squeeze(D::Minus1);
    Ok((column(0)?, column(1)?))
}

/// The same from candle's differentiable ops.
fn composite(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    // grad: fused log-softmax with its own bwd on the CPU, composite elsewhere (crate::ops).
    let logp = crate::ops::log_softmax(logits)?;
    // grad: gather's backward scatters the gradient into the target column.
    let logprobs = logp.gather(&targets.unsqueeze(D::Minus1)?, D::Minus1)?;
    // grad: exp, mul and sum differentiate; entropy = -Σ softmax · log_softmax.
    let entropy = (logp.exp()? * &logp)?.sum(D::Minus1)?.neg()?;
    Ok((logprobs.squeeze(D::Minus1)?, entropy))
}

/// Per row of logits: `(log p(target), H, logsumexp)` → `[.., 3]`, f64 for
/// f64 logits and f32 for any other float type. The logsumexp is what the
/// backward needs; callers see the first two.
struct TokenLoss;

/// The backward of [`TokenLoss`]: `(logits, targets, aux)` with `aux[.., 6]`
/// the forward's three outputs then their three upstream gradients →
/// `dlogits`.
struct TokenLossGrad;

impl TokenLoss {
    fn apply(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let logits = logits.contiguous()?;
        let targets = targets.contiguous()?;
        let (rows, _) = rows_and_width(logits.dims())?;
        if targets.dtype() != DType::U32 || targets.elem_count() != rows {
            candle_core::bail!(
                "token loss: {} {:?} targets for logits {:?} (one u32 per row)",
                targets.elem_count(),
                targets.dtype(),
                logits.dims()
            )
        }
        logits.apply_op2(&targets, TokenLoss)
    }
}

/// `(rows, V)` of logits `[.., V]`.
fn rows_and_width(dims: &[usize]) -> Result<(usize, usize)> {
    match dims.split_last() {
        Some((&v, lead)) if v > 0 => Ok((lead.iter().product(), v)),
        _ => candle_core::bail!("token loss: logits {dims:?} need a non-empty last dimension"),
    }
}

/// `[.., V]` → `[.., k]`.
fn rows_shape(dims: &[usize], k: usize) -> Shape {
    let mut d = dims.to_vec();
    if let Some(last) = d.last_mut() {
        *last = k;
    }
    Shape::from(d)
}

/// `$f` on the contiguous values `$layout` picks out of `$storage`, for
/// each CPU float type (the host arithmetic of both ops is in f64).
macro_rules! on_host {
    ($storage:expr, $layout:expr, $f:ident, $($arg:expr),*) => {
        match $storage {
            CpuStorage::F32(x) => CpuStorage::F32($f(slice(x, $layout)?, $($arg),*)),
            CpuStorage::F64(x) => CpuStorage::F64($f(slice(x, $layout)?, $($arg),*)),
            CpuStorage::BF16(x) => CpuStorage::BF16($f(slice(x, $layout)?, $($arg),*)),
            CpuStorage::F16(x) => CpuStorage::F16($f(slice(x, $layout)?, $($arg),*)),
            other => candle_core::bail!("token loss: logits of {:?}", other.dtype()),
        }
    };
}

fn slice<'a, T>(v: &'a [T], l: &Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("token loss: inputs must be contiguous"),
    }
}

fn host_targets<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [u32]> {
    match s {
        CpuStorage::U32(t) => slice(t, l),
        other => candle_core::bail!("token loss: targets of {:?}, not u32", other.dtype()),
    }
}

impl CustomOp2 for TokenLoss {
    fn name(&self) -> &'static str {
        "agentrl-token-loss"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        /// Each row's three outputs, in f64.
        fn run<T: candle_core::WithDType>(x: &[T], targets: &[u32], v: usize) -> Vec<f64> {
            let mut out = Vec::with_capacity(targets.len() * 3);
            for (r, &target) in targets.iter().enumerate() {
                let row = &x[r * v..(r + 1) * v];
                let (lp, h, lse) = host_row(row, target as usize);
                out.extend([lp, h, lse]);
            }
            out
        }
        let (_, v) = rows_and_width(l1.dims())?;
        let targets = host_targets(s2, l2)?;
        let narrow = |out: Vec<f64>| CpuStorage::F32(out.into_iter().map(|x| x as f32).collect());
        // f64 stays f64; every other float type gives f32.
        let out = match s1 {
            CpuStorage::F64(x) => CpuStorage::F64(run(slice(x, l1)?, targets, v)),
            CpuStorage::F32(x) => narrow(run(slice(x, l1)?, targets, v)),
            CpuStorage::BF16(x) => narrow(run(slice(x, l1)?, targets, v)),
            CpuStorage::F16(x) => narrow(run(slice(x, l1)?, targets, v)),
            other => candle_core::bail!("token loss: logits of {:?}", other.dtype()),
        };
        Ok((out, rows_shape(l1.dims(), 3)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, v) = rows_and_width(l1.dims())?;
        let out = cuda::launch(cuda::Pass::Forward, s1, l1, s2, l2, None, rows, v)?;
        Ok((out, rows_shape(l1.dims(), 3)))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let aux = Tensor::cat(&[res, &grad_res.to_dtype(res.dtype())?], D::Minus1)?.contiguous()?;
        let dlogits = logits.apply_op3_no_bwd(targets, &aux, &TokenLossGrad)?;
        Ok((Some(dlogits), None))
    }
}

/// `(log p(target), H, logsumexp)` of one row in f64.
fn host_row<T: candle_core::WithDType>(row: &[T], target: usize) -> (f64, f64, f64) {
    let m = row
        .iter()
        .map(|x| x.to_f64())
        .fold(f64::NEG_INFINITY, f64::max);
    let (mut s, mut t) = (0.0, 0.0);
    for x in row {
        let d = x.to_f64() - m;
        let e = d.exp();
        s += e;
        t += e * d;
    }
    let lse = m + s.ln();
    let lp = row.get(target).map_or(f64::NAN, |x| x.to_f64() - lse);
    (lp, s.ln() - t / s, lse)
}

impl CustomOp3 for TokenLossGrad {
    fn name(&self) -> &'static str {
        "agentrl-token-loss-grad"
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
        fn run<T: candle_core::WithDType>(
            x: &[T],
            targets: &[u32],
            aux: &[f64],
            v: usize,
        ) -> Vec<T> {
            let mut dx = Vec::with_capacity(targets.len() * v);
            for (r, &target) in targets.iter().enumerate() {
                let a = &aux[r * 6..(r + 1) * 6];
                let (h, lse, g_lp, g_h, g_l) = (a[1], a[2], a[3], a[4], a[5]);
                for (j, xj) in x[r * v..(r + 1) * v].iter().enumerate() {
                    let lp = xj.to_f64() - lse;
                    let p = lp.exp();
                    let mut g = (g_l - g_lp) * p - g_h * p * (lp + h);
                    if j == target as usize {
                        g += g_lp;
                    }
                    dx.push(T::from_f64(g));
                }
            }
            dx
        }
        let (_, v) = rows_and_width(l1.dims())?;
        let targets = host_targets(s2, l2)?;
        let aux = host_aux(s3, l3)?;
        let out = on_host!(s1, l1, run, targets, &aux, v);
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, v) = rows_and_width(l1.dims())?;
        let out = cuda::launch(
            cuda::Pass::Backward,
            s1,
            l1,
            s2,
            l2,
            Some((s3, l3)),
            rows,
            v,
        )?;
        Ok((out, l1.shape().clone()))
    }
}

/// The aux rows as f64 (f32 or f64, the forward's output type).
fn host_aux(s: &CpuStorage, l: &Layout) -> Result<Vec<f64>> {
    fn f<T: candle_core::WithDType>(v: &[T], l: &Layout) -> Result<Vec<f64>> {
        Ok(slice(v, l)?.iter().map(|x| x.to_f64()).collect())
    }
    Ok(match s {
        CpuStorage::F32(v) => f(v, l)?,
        CpuStorage::F64(v) => f(v, l)?,
        CpuStorage::BF16(v) => f(v, l)?,
        CpuStorage::F16(v) => f(v, l)?,
        other => candle_core::bail!("token loss grad: aux of {:?}", other.dtype()),
    })
}

/// Launching the kernels of `kernels/token_loss.cu`.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    use crate::cuda::{launch, on_float_slice, row_blocks, view, TOKEN_LOSS};

    /// Which kernel: the forward (`[rows, 3]` out) or the backward (`[rows, V]`).
    #[derive(Clone, Copy)]
    pub enum Pass {
        Forward,
        Backward,
    }

    /// Runs `pass` over `rows` rows of `v` logits; `aux` is the backward's
    /// `[rows, 6]` input.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        pass: Pass,
        logits: &CudaStorage,
        logits_layout: &Layout,
        targets: &CudaStorage,
        targets_layout: &Layout,
        aux: Option<(&CudaStorage, &Layout)>,
        rows: usize,
        v: usize,
    ) -> Result<CudaStorage> {
        let job = Job {
            pass,
            targets: view(
                targets.as_cuda_slice::<u32>()?,
                targets_layout,
                "token loss targets",
            )?,
            aux,
            rows,
            v,
            dev: logits.device(),
        };
        on_float_slice!(&logits.slice, "token loss logits", |x, suffix| {
            job.run(suffix, x, logits_layout)
        })
    }

    struct Job<'a> {
        pass: Pass,
        targets: CudaView<'a, u32>,
        aux: Option<(&'a CudaStorage, &'a Layout)>,
        rows: usize,
        v: usize,
        dev: &'a CudaDevice,
    }

    impl Job<'_> {
        fn run<T: DeviceRepr + CudaDType>(
            &self,
            suffix: &str,
            logits: &CudaSlice<T>,
            layout: &Layout,
        ) -> Result<CudaStorage> {
            let x = view(logits, layout, "token loss logits")?;
            // Whole warps (the block merge needs them), up to 1024 per row.
            let cfg = row_blocks(self.rows, self.v)?;
            let v = self.v as i32;
            // The kernels take (logits, targets, [aux,] out, v): `rows`
            // rows of v logits, rows targets, rows × 6 f32 aux values; the
            // forward writes rows × 3 f32, the backward rows × v of T.
            match (self.pass, self.aux) {
                (Pass::Backward, Some((s, l))) => {
                    let aux = view(f32::as_cuda_slice(s)?, l, "token loss aux")?;
                    // SAFETY: one block per row writes each of its v gradients.
                    let dx = unsafe { self.dev.alloc::<T>(self.rows * self.v)? };
                    launch!(
                        self.dev,
                        TOKEN_LOSS,
                        &format!("token_loss_bwd_{suffix}"),
                        cfg,
                        &x,
                        &self.targets,
                        &aux,
                        &dx,
                        &v
                    )?;
                    Ok(CudaStorage::wrap_cuda_slice(dx, self.dev.clone()))
                }
                (Pass::Forward, None) => {
                    // SAFETY: one block per row writes its 3 outputs.
                    let out = unsafe { self.dev.alloc::<f32>(self.rows * 3)? };
                    launch!(
                        self.dev,
                        TOKEN_LOSS,
                        &format!("token_loss_fwd_{suffix}"),
                        cfg,
                        &x,
                        &self.targets,
                        &out,
                        &v
                    )?;
                    Ok(CudaStorage::wrap_cuda_slice(out, self.dev.clone()))
                }
                _ => candle_core::bail!("token loss: the backward needs its aux rows"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const V: usize = 37;

    /// Logits `[2, 3, V]` (one row shifted by +900, where an unshifted exp
    /// would overflow), in-range targets and two random output weights.
    fn inputs(dtype: DType, seed: u64) -> (Var, Tensor, Tensor, Tensor) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut x: Vec<f64> = (0..6 * V).map(|_| rng.random_range(-4.0..4.0)).collect();
        x[V..2 * V].iter_mut().for_each(|v| *v += 900.0);
        let t: Vec<u32> = (0..6).map(|_| rng.random_range(0..V as u32)).collect();
        let w = |rng: &mut ChaCha8Rng| {
            let w: Vec<f64> = (0..6).map(|_| rng.random_range(-1.0..1.0)).collect();
            Tensor::from_vec(w, (2, 3), &Device::Cpu)?.to_dtype(dtype)
        };
        let logits = Tensor::from_vec(x, (2, 3, V), &Device::Cpu).and_then(|x| x.to_dtype(dtype));
        (
            Var::from_tensor(&logits.unwrap()).unwrap(),
            Tensor::from_vec(t, (2, 3), &Device::Cpu).unwrap(),
            w(&mut rng).unwrap(),
            w(&mut rng).unwrap(),
        )
    }

    type Path = fn(&Tensor, &Tensor) -> Result<(Tensor, Tensor)>;

    /// Log-probs, entropies and the gradient of `Σ w1·lp + w2·H` as f64.
    fn run(path: Path, dtype: DType, seed: u64) -> [Vec<f64>; 3] {
        let (x, t, w1, w2) = inputs(dtype, seed);
        let (lp, h) = path(x.as_tensor(), &t).unwrap();
        // The op's outputs are f32 for bf16 logits.
        let (w1, w2) = (
            w1.to_dtype(lp.dtype()).unwrap(),
            w2.to_dtype(lp.dtype()).unwrap(),
        );
        let loss = ((&lp * &w1).unwrap().sum_all().unwrap()
            + (&h * &w2).unwrap().sum_all().unwrap())
        .unwrap();
        let grads = loss.backward().unwrap();
        let flat = |t: &Tensor| {
            t.to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        [flat(&lp), flat(&h), flat(grads.get(x.as_tensor()).unwrap())]
    }

    fn max_diff(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn the_op_and_its_gradient_match_the_composite() {
        // f32: a few units in the last place of the +900 row's logits (6e-5).
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-4)] {
            for seed in 0..3 {
                let op = run(fused, dtype, seed);
                let reference = run(composite, dtype, seed);
                for (what, a, b) in [("log-probs", 0, 0), ("entropy", 1, 1), ("gradient", 2, 2)] {
                    let d = max_diff(&op[a], &reference[b]);
                    assert!(d < tol, "{dtype:?} seed {seed}: {what} differ by {d}");
                }
                assert!(op[0].iter().all(|v| v.is_finite() && *v <= 0.0));
            }
        }
    }

    #[test]
    fn the_op_in_bf16_stays_near_the_f64_values() {
        let op = run(fused, DType::BF16, 7);
        let reference = run(composite, DType::F64, 7);
        // bf16 logits round the inputs themselves (8 mantissa bits; the +900
        // row by up to 2), so compare the rows that are not shifted.
        let rows = [0, 2, 3, 4, 5];
        for r in rows {
            for (k, name) in [(0, "log-prob"), (1, "entropy")] {
                let d = (op[k][r] - reference[k][r]).abs();
                assert!(d < 0.1, "row {r}: {name} off by {d}");
            }
        }
        let grad_rows = |g: &[f64]| -> Vec<f64> {
            rows.iter()
                .flat_map(|&r| g[r * V..(r + 1) * V].to_vec())
                .collect()
        };
        let d = max_diff(&grad_rows(&op[2]), &grad_rows(&reference[2]));
        assert!(d < 0.05, "bf16 gradient off by {d}");
    }

    #[test]
    fn mismatched_targets_are_refused_with_their_shape() {
        let (x, _, _, _) = inputs(DType::F32, 0);
        let t = Tensor::zeros(5, DType::U32, &Device::Cpu).unwrap();
        let err = fused(x.as_tensor(), &t).unwrap_err().to_string();
        assert!(err.contains("5") && err.contains("targets"), "{err}");
        let t = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let err = fused(x.as_tensor(), &t).unwrap_err().to_string();
        assert!(err.contains("u32"), "{err}");
    }
}
