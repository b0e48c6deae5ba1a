//! AdamW with saveable state, and global gradient-norm clipping.
//!
//! candle-nn's `AdamW` keeps its moments private, which makes bit-for-bit
//! resume impossible; this one exposes and (de)serialises them. On the CPU
//! (f32/f64) each parameter is updated in one multi-threaded pass that reads
//! the gradient and rewrites θ, m and v in place (built from candle ops it
//! was ten passes and as many allocations per parameter); elsewhere it falls
//! back to candle ops with the same arithmetic.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Device, InplaceOp2, Layout, Tensor, Var};

use crate::checkpoint::write_tensors_exact;
use crate::host::{storage_slice, tensor_from, with_slices};
use crate::kernels::{num_threads, par_map, Real, PAR_MIN_WORK};
use crate::ModelError;

/// AdamW hyper-parameters (PyTorch's defaults: β = (0.9, 0.999), ε = 1e-8, weight decay 0.01).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator ε.
    pub eps: f64,
    /// Decoupled weight decay λ (θ ← θ − lr·λ·θ each step).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// AdamW (Loshchilov & Hutter) exactly as PyTorch's `torch.optim.AdamW`:
/// `θ ← θ(1 − lr·λ)`, `m ← β1 m + (1−β1) g`, `v ← β2 v + (1−β2) g²`,
/// `θ ← θ − lr · (m / (1−β1ᵗ)) / (sqrt(v / (1−β2ᵗ)) + ε)`.
#[derive(Debug)]
pub struct AdamW {
    vars: Vec<Var>,
    m: Vec<Moment>,
    v: Vec<Moment>,
    step: u64,
    config: AdamWConfig,
}

/// One moment buffer: host memory updated in place for CPU f32/f64
/// parameters, a tensor for any other device or dtype.
#[derive(Debug)]
enum Moment {
    F32(Vec<f32>),
    F64(Vec<f64>),
    Tensor(Tensor),
}

impl Moment {
    /// Holds `t` (shaped like `var`) in the form `var` is updated with.
    fn for_var(t: Tensor, var: &Var) -> candle_core::Result<Self> {
        let t = t.to_dtype(var.dtype())?.to_device(var.device())?;
        if !var.device().is_cpu() || !var.is_contiguous() {
            return Ok(Moment::Tensor(t));
        }
        Ok(match var.dtype() {
            DType::F32 => Moment::F32(t.flatten_all()?.to_vec1()?),
            DType::F64 => Moment::F64(t.flatten_all()?.to_vec1()?),
            _ => Moment::Tensor(t),
        })
    }

    /// The moment as a tensor of `var`'s shape (a copy for host buffers).
    fn to_tensor(&self, var: &Var) -> candle_core::Result<Tensor> {
        match self {
            Moment::F32(v) => tensor_from(v.clone(), var.shape().clone()).to_device(var.device()),
            Moment::F64(v) => tensor_from(v.clone(), var.shape().clone()).to_device(var.device()),
            Moment::Tensor(t) => Ok(t.clone()),
        }
    }
}

/// The scalars of one AdamW step.
#[derive(Debug, Clone, Copy)]
struct StepConsts {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    decay: f64,
    bc1: f64,
    bc2: f64,
}

/// θ.inplace_op2(g): the whole AdamW update of one parameter in one pass,
/// θ, m and v rewritten in place.
struct FusedUpdate<'a, T> {
    m: Mutex<&'a mut [T]>,
    v: Mutex<&'a mut [T]>,
    c: StepConsts,
}

/// Elements per parallel chunk of the update.
const ADAM_CHUNK: usize = 1 << 14;

fn adam_chunk<T: Real>(theta: &mut [T], m: &mut [T], v: &mut [T], g: &[T], c: StepConsts) {
    let f = T::from_f64;
    let (b1, b2, nb1, nb2) = (f(c.beta1), f(c.beta2), f(1.0 - c.beta1), f(1.0 - c.beta2));
    let (bc1, bc2, eps, lr, keep) = (
        f(c.bc1),
        f(c.bc2),
        f(c.eps),
        f(c.lr),
        f(1.0 - c.lr * c.decay),
    );
    for (((t, m), v), &g) in theta.iter_mut().zip(m).zip(v).zip(g) {
        *m = *m * b1 + g * nb1;
        *v = *v * b2 + g * g * nb2;
        let update = (*m / bc1) / ((*v / bc2).sqrt() + eps);
        *t = *t * keep - update * lr;
    }
}

impl<T: Real> InplaceOp2 for FusedUpdate<'_, T> {
    fn name(&self) -> &'static str {
        "agentrl-adamw"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<()> {
        use rayon::prelude::*;
        let g = storage_slice::<T>(gs, gl, "adamw gradient")?;
        let Some((a, b)) = dst_l.contiguous_offsets() else {
            candle_core::bail!("adamw: the parameter must be contiguous")
        };
        let theta = &mut T::slice_mut(dst)
            .ok_or_else(|| candle_core::Error::Msg("adamw: parameter dtype".into()))?[a..b];
        let mut m = self
            .m
            .lock()
            .map_err(|_| candle_core::Error::Msg("adamw: lock poisoned".into()))?;
        let mut v = self
            .v
            .lock()
            .map_err(|_| candle_core::Error::Msg("adamw: lock poisoned".into()))?;
        if theta.len() != g.len() || theta.len() != m.len() || theta.len() != v.len() {
            candle_core::bail!("adamw: parameter, gradient and moments differ in size")
        }
        let c = self.c;
        if num_threads() > 1 && theta.len() * 8 >= PAR_MIN_WORK {
            theta
                .par_chunks_mut(ADAM_CHUNK)
                .zip(m.par_chunks_mut(ADAM_CHUNK))
                .zip(v.par_chunks_mut(ADAM_CHUNK))
                .zip(g.par_chunks(ADAM_CHUNK))
                .for_each(|(((t, m), v), g)| adam_chunk(t, m, v, g, c));
        } else {
            adam_chunk(theta, &mut m, &mut v, g, c);
        }
        Ok(())
    }
}

impl AdamW {
    /// An optimizer over `vars` (their order defines the saved state's layout;
    /// [`crate::PolicyModel::trainable_vars`] gives a stable order).
    pub fn new(vars: Vec<Var>, config: AdamWConfig) -> Result<Self, ModelError> {
        let zeros = || {
            vars.iter()
                .map(|v| Moment::for_var(v.as_tensor().zeros_like()?, v))
                .collect::<candle_core::Result<Vec<_>>>()
        };
        let (m, v) = (zeros()?, zeros()?);
        Ok(Self {
            vars,
            m,
            v,
            step: 0,
            config,
        })
    }

    /// The current hyper-parameters.
    pub fn config(&self) -> AdamWConfig {
        self.config
    }

    /// Sets the learning rate (for schedules).
    pub fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        self.config.lr
    }

    /// Number of steps taken.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The variables being optimised.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// One update from `grads`; variables without a gradient are left alone
    /// (their moments do not decay, as in PyTorch where `p.grad is None`).
    pub fn step(&mut self, grads: &GradStore) -> Result<(), ModelError> {
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        let consts = StepConsts {
            lr: c.lr,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            decay: c.weight_decay,
            bc1,
            bc2,
        };
        let on_device = self.device_step(grads, consts)?;
        for (((var, m), v), done) in self
            .vars
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
            .zip(on_device)
        {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            if done {
                continue;
            }
            let theta = var.as_tensor();
            match (m, v) {
                (Moment::F32(m), Moment::F32(v)) => fused_step::<f32>(theta, g, m, v, consts)?,
                (Moment::F64(m), Moment::F64(v)) => fused_step::<f64>(theta, g, m, v, consts)?,
                (Moment::Tensor(m), Moment::Tensor(v)) => {
                    let next_m = ((&*m * c.beta1)? + (g * (1.0 - c.beta1))?)?;
                    let next_v = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
                    let denom = ((&next_v / bc2)?.sqrt()? + c.eps)?;
                    let update = ((&next_m / bc1)? / denom)?;
                    let decayed = (theta * (1.0 - c.lr * c.weight_decay))?;
                    let next = (decayed - (update * c.lr)?)?;
                    var.set(&next)?;
                    *m = next_m;
                    *v = next_v;
                }
                _ => {
                    return Err(ModelError::InvalidInput(
                        "adamw: moments of different kinds".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    /// The variables updated in one launch per dtype on a CUDA device
    /// (`kernels/multi_tensor.cu`): those with a gradient, on CUDA, whose θ,
    /// gradient and moments share one float dtype. All `false` elsewhere.
    fn device_step(&self, grads: &GradStore, c: StepConsts) -> Result<Vec<bool>, ModelError> {
        #[cfg(feature = "cuda")]
        {
            let mut done = vec![false; self.vars.len()];
            let mut picked = Vec::new();
            for (i, ((var, m), v)) in self.vars.iter().zip(&self.m).zip(&self.v).enumerate() {
                let (Moment::Tensor(m), Moment::Tensor(v), Some(g)) =
                    (m, v, grads.get(var.as_tensor()))
                else {
                    continue;
                };
                let theta = var.as_tensor();
                let fits = theta.device().is_cuda()
                    && crate::multi_tensor::supports(theta.dtype())
                    && [g, m, v]
                        .iter()
                        .all(|t| t.dtype() == theta.dtype() && t.dims() == theta.dims())
                    && [theta, m, v].iter().all(|t| t.is_contiguous());
                if fits {
                    picked.push((i, [theta, m, v], g.contiguous()?));
                }
            }
            let rows: Vec<[&Tensor; 4]> = picked
                .iter()
                .map(|(_, [theta, m, v], g)| [*theta, g, *m, *v])
                .collect();
            let f = |x: f64| x as f32;
            let scalars = crate::multi_tensor::AdamWScalars {
                lr: f(c.lr),
                beta1: f(c.beta1),
                beta2: f(c.beta2),
                eps: f(c.eps),
                keep: f(1.0 - c.lr * c.decay),
                bc1: f(c.bc1),
                bc2: f(c.bc2),
            };
            if !rows.is_empty() && crate::multi_tensor::adamw(&rows, scalars)? {
                for (i, _, _) in &picked {
                    done[*i] = true;
                }
            }
            Ok(done)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (grads, c);
            Ok(vec![false; self.vars.len()])
        }
    }

    /// Saves step, m and v (exact bits) to a safetensors file.
    pub fn save_state(&self, path: &Path) -> Result<(), ModelError> {
        let mut t = BTreeMap::new();
        for (i, ((m, v), var)) in self.m.iter().zip(&self.v).zip(&self.vars).enumerate() {
            t.insert(format!("m.{i:05}"), m.to_tensor(var)?);
            t.insert(format!("v.{i:05}"), v.to_tensor(var)?);
        }
        // The step as two u32 halves: safetensors has no u64 candle can read back everywhere.
        let halves = [(self.step >> 32) as u32, self.step as u32];
        t.insert("step".to_string(), Tensor::new(&halves, &Device::Cpu)?);
        write_tensors_exact(path, &t)
    }

    /// Restores state saved by [`AdamW::save_state`] for the same variables.
    pub fn load_state(&mut self, path: &Path) -> Result<(), ModelError> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        let mut t = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| {
            ModelError::CorruptFile {
                path: path.to_path_buf(),
                msg: e.to_string(),
            }
        })?;
        let bad = |msg: String| ModelError::OptimizerState {
            path: path.to_path_buf(),
            msg,
        };
        let step = t
            .remove("step")
            .ok_or_else(|| bad("no `step` tensor".into()))?
            .to_vec1::<u32>()
            .map_err(|e| bad(format!("`step`: {e}")))?;
        let [hi, lo] = step.as_slice() else {
            return Err(bad("`step` must hold 2 values".into()));
        };
        let mut ms = Vec::with_capacity(self.vars.len());
        let mut vs = Vec::with_capacity(self.vars.len());
        for (i, var) in self.vars.iter().enumerate() {
            for (prefix, out) in [("m", &mut ms), ("v", &mut vs)] {
                let name = format!("{prefix}.{i:05}");
                let x = t
                    .remove(&name)
                    .ok_or_else(|| bad(format!("missing `{name}`")))?;
                if x.dims() != var.dims() {
                    return Err(bad(format!(
                        "`{name}` has shape {:?}, variable {i} has {:?}",
                        x.dims(),
                        var.dims()
                    )));
                }
                out.push(Moment::for_var(x, var)?);
            }
        }
        if !t.is_empty() {
            return Err(bad(format!(
                "{} more tensors than the {} variables need",
                t.len(),
                self.vars.len()
            )));
        }
        self.m = ms;
        self.v = vs;
        self.step = ((*hi as u64) << 32) | *lo as u64;
        Ok(())
    }
}

/// `sum` with `more`'s gradient of each of `vars` added (`more` itself when
/// there is no sum yet): the gradients of a batch taken in several backward
/// passes (micro-batches), each of whose losses was scaled by its share of
/// the batch's.
pub fn add_grads(
    sum: Option<GradStore>,
    more: GradStore,
    vars: &[Var],
) -> Result<GradStore, ModelError> {
    let Some(mut sum) = sum else {
        return Ok(more);
    };
    for var in vars {
        if let Some(g) = more.get(var.as_tensor()) {
            let total = match sum.get(var.as_tensor()) {
                Some(s) => (s + g)?,
                None => g.clone(),
            };
            sum.insert(var.as_tensor(), total);
        }
    }
    Ok(sum)
}

/// Scales the gradients of `vars` in `grads` so that their global L2 norm is
/// at most `max_norm` (PyTorch's `clip_grad_norm_`: factor
/// `max_norm / (norm + 1e-6)` when that is below 1) and returns the norm
/// before clipping. Variables without a gradient count as zero. On a CUDA
/// device the gradients are summed and scaled in place by one launch each
/// (`kernels/multi_tensor.cu`), so `grads` must own them.
pub fn clip_grad_norm(
    grads: &mut GradStore,
    vars: &[Var],
    max_norm: f64,
) -> Result<f64, ModelError> {
    let mut sq = 0f64;
    let mut off_host = Vec::new();
    for var in vars {
        if let Some(g) = grads.get(var.as_tensor()) {
            match host_sum_of_squares(g)? {
                Some(s) => sq += s,
                None => off_host.push(g.clone()),
            }
        }
    }
    let multi = multi_tensor_grads(&off_host);
    if let Some(s) = multi_tensor_sum_of_squares(&multi)? {
        sq += s;
        off_host.retain(|g| !multi.iter().any(|m| m.id() == g.id()));
    }
    // Off the CPU the per-parameter sums stay on the device and are read
    // back once: a read per parameter would wait for the device each time.
    if !off_host.is_empty() {
        let sums = off_host
            .iter()
            .map(device_sum_of_squares)
            .collect::<candle_core::Result<Vec<_>>>()?;
        sq += Tensor::stack(&sums, 0)?.sum_all()?.to_scalar::<f64>()?;
    }
    let norm = sq.sqrt();
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        let in_place = multi_tensor_scale(&multi, coef)?;
        for var in vars {
            if let Some(g) = grads.get(var.as_tensor()) {
                if in_place && multi.iter().any(|m| m.id() == g.id()) {
                    continue;
                }
                let scaled = scale(g, coef)?;
                grads.insert(var.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}

/// The gradients of `gs` that the multi-tensor kernels take (contiguous,
/// on a CUDA device, f32/bf16/f16); none without the `cuda` feature.
fn multi_tensor_grads(gs: &[Tensor]) -> Vec<Tensor> {
    #[cfg(feature = "cuda")]
    {
        gs.iter()
            .filter(|g| {
                g.device().is_cuda()
                    && g.is_contiguous()
                    && crate::multi_tensor::supports(g.dtype())
            })
            .cloned()
            .collect()
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = gs;
        Vec::new()
    }
}

/// Σ g² over `gs` by one launch per dtype; `None` for no tensors or where
/// the kernels do not apply.
fn multi_tensor_sum_of_squares(gs: &[Tensor]) -> candle_core::Result<Option<f64>> {
    if gs.is_empty() {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    {
        let refs: Vec<&Tensor> = gs.iter().collect();
        crate::multi_tensor::sum_of_squares(&refs)
    }
    #[cfg(not(feature = "cuda"))]
    Ok(None)
}

/// `gs` scaled by `coef` in place by one launch per dtype; `false` (nothing
/// changed) for no tensors or where the kernels do not apply.
fn multi_tensor_scale(gs: &[Tensor], coef: f64) -> candle_core::Result<bool> {
    if gs.is_empty() {
        return Ok(false);
    }
    #[cfg(feature = "cuda")]
    {
        let refs: Vec<&Tensor> = gs.iter().collect();
        crate::multi_tensor::scale_in_place(&refs, coef)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = coef;
        Ok(false)
    }
}

/// Σ g² in f64 by one host pass, for f32/f64 gradients on the CPU; `None`
/// for the others (see [`device_sum_of_squares`]).
fn host_sum_of_squares(g: &Tensor) -> candle_core::Result<Option<f64>> {
    fn host<T: Real>(g: &Tensor) -> candle_core::Result<f64> {
        // Partial sums over fixed chunks, added in order: the same result
        // for any thread count.
        with_slices::<T, _>(&[g], "gradient", |v| {
            let g = v[0];
            let chunks = g.len().div_ceil(ADAM_CHUNK);
            par_map(chunks, g.len() * 2, |i| {
                let c = &g[i * ADAM_CHUNK..((i + 1) * ADAM_CHUNK).min(g.len())];
                c.iter().map(|&x| x.to_f64() * x.to_f64()).sum::<f64>()
            })
            .iter()
            .sum::<f64>()
        })
    }
    match (g.device().is_cpu(), g.dtype()) {
        (true, DType::F32) => host::<f32>(g).map(Some),
        (true, DType::F64) => host::<f64>(g).map(Some),
        _ => Ok(None),
    }
}

/// Σ g² as a 0-d f64 tensor on `g`'s device, summed row by row first: a
/// whole-tensor sum is one reduction block on a GPU, which for the
/// embedding's 136M entries took most of a clipping step.
fn device_sum_of_squares(g: &Tensor) -> candle_core::Result<Tensor> {
    let cols = g.dims().last().copied().unwrap_or(1).max(1);
    let rows = g.elem_count() / cols;
    g.to_dtype(DType::F64)?
        .reshape((rows, cols))?
        .sqr()?
        .sum(1)?
        .sum_all()
}

/// `g · coef` as a new tensor: one host pass on the CPU (f32/f64).
fn scale(g: &Tensor, coef: f64) -> candle_core::Result<Tensor> {
    fn host<T: Real>(g: &Tensor, coef: f64) -> candle_core::Result<Tensor> {
        let c = T::from_f64(coef);
        use rayon::prelude::*;
        let v = with_slices::<T, _>(&[g], "gradient", |v| {
            if num_threads() > 1 && v[0].len() * 2 >= PAR_MIN_WORK {
                v[0].par_iter().map(|&x| x * c).collect::<Vec<T>>()
            } else {
                v[0].iter().map(|&x| x * c).collect::<Vec<T>>()
            }
        })?;
        Ok(tensor_from(v, g.shape().clone()))
    }
    match (g.device().is_cpu(), g.dtype()) {
        (true, DType::F32) => host::<f32>(g, coef),
        (true, DType::F64) => host::<f64>(g, coef),
        _ => g * coef,
    }
}

/// One parameter's fused update (θ, m, v in place).
fn fused_step<T: Real>(
    theta: &Tensor,
    g: &Tensor,
    m: &mut [T],
    v: &mut [T],
    c: StepConsts,
) -> candle_core::Result<()> {
    let g = g.contiguous()?;
    theta.inplace_op2(
        &g,
        &FusedUpdate {
            m: Mutex::new(m),
            v: Mutex::new(v),
            c,
        },
    )
}
