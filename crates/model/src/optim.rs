//! AdamW with saveable state, and global gradient-norm clipping.
//!
//! candle-nn's `AdamW` keeps its moments private, which makes bit-for-bit
//! resume impossible; this one exposes and (de)serialises them.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use crate::checkpoint::write_tensors_exact;
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
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    step: u64,
    config: AdamWConfig,
}

impl AdamW {
    /// An optimizer over `vars` (their order defines the saved state's layout;
    /// [`crate::PolicyModel::trainable_vars`] gives a stable order).
    pub fn new(vars: Vec<Var>, config: AdamWConfig) -> Result<Self, ModelError> {
        let m = vars
            .iter()
            .map(|v| v.as_tensor().zeros_like())
            .collect::<candle_core::Result<Vec<_>>>()?;
        let v = m.clone();
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
        for ((var, m), v) in self
            .vars
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let next_m = ((&*m * c.beta1)? + (g * (1.0 - c.beta1))?)?;
            let next_v = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let denom = ((&next_v / bc2)?.sqrt()? + c.eps)?;
            let update = ((&next_m / bc1)? / denom)?;
            let theta = var.as_tensor();
            let decayed = (theta * (1.0 - c.lr * c.weight_decay))?;
            let next = (decayed - (update * c.lr)?)?;
            var.set(&next)?;
            *m = next_m;
            *v = next_v;
        }
        Ok(())
    }

    /// Saves step, m and v (exact bits) to a safetensors file.
    pub fn save_state(&self, path: &Path) -> Result<(), ModelError> {
        let mut t = BTreeMap::new();
        for (i, (m, v)) in self.m.iter().zip(&self.v).enumerate() {
            t.insert(format!("m.{i:05}"), m.clone());
            t.insert(format!("v.{i:05}"), v.clone());
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
                out.push(x.to_dtype(var.dtype())?.to_device(var.device())?);
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

/// Scales the gradients of `vars` in `grads` so that their global L2 norm is
/// at most `max_norm` (PyTorch's `clip_grad_norm_`: factor
/// `max_norm / (norm + 1e-6)` when that is below 1) and returns the norm
/// before clipping. Variables without a gradient count as zero.
pub fn clip_grad_norm(
    grads: &mut GradStore,
    vars: &[Var],
    max_norm: f64,
) -> Result<f64, ModelError> {
    let mut sq = 0f64;
    for var in vars {
        if let Some(g) = grads.get(var.as_tensor()) {
            sq += g
                .to_dtype(DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?;
        }
    }
    let norm = sq.sqrt();
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for var in vars {
            if let Some(g) = grads.get(var.as_tensor()) {
                let scaled = (g * coef)?;
                grads.insert(var.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}
