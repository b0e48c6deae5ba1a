//! Losses on candle tensors of shape `[B, T]` (B sequences, T token
//! positions, f32), with a loss mask that is 1 exactly on the policy tokens
//! to train on. Every op used here has a backward pass in candle
//! (`exp`, `mul`, `maximum`/`minimum` — which is what `clamp` is —,
//! `where_cond`, `sum`, `div`), so gradients flow to `logprobs` / `values`.

use candle_core::{DType, Device, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};

/// Denominator floor for masked means, as verl's `masked_mean` (`+ 1e-8`):
/// an all-zero mask gives 0 instead of NaN.
const MASK_EPS: f64 = 1e-8;

/// How a `[B, T]` loss matrix becomes a scalar (verl `loss_agg_mode`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum LossAgg {
    /// `Σ_{b,t} m·ℓ / Σ_{b,t} m`: every policy token weighs the same
    /// (long replies weigh more). RAGEN / DAPO default.
    #[default]
    #[serde(rename = "token-mean")]
    TokenMean,
    /// `(1/B) Σ_b Σ_t m·ℓ`: sum over a reply's tokens, mean over replies
    /// (Dr.GRPO-style, no per-length normalisation).
    #[serde(rename = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// `(1/B) Σ_b (Σ_t m·ℓ / Σ_t m)`: every reply weighs the same
    /// (original GRPO). A row with no policy token contributes 0.
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
}

config_names!(LossAgg, "loss_agg_mode", "token-mean, seq-mean-token-sum, seq-mean-token-mean", {
    TokenMean => "token-mean",
    SeqMeanTokenSum => "seq-mean-token-sum",
    SeqMeanTokenMean => "seq-mean-token-mean",
});

/// KL estimator between the policy and a frozen reference, per token
/// (Schulman, "Approximating KL divergence"; verl `kl_loss_type`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum KlKind {
    /// k1 = log π − log π_ref (unbiased, high variance, can be negative).
    #[serde(rename = "kl", alias = "k1")]
    Kl,
    /// k2 = ½ (log π − log π_ref)².
    #[serde(rename = "mse", alias = "k2")]
    Mse,
    /// k3 = π_ref/π − log(π_ref/π) − 1 (unbiased, low variance, ≥ 0).
    #[default]
    #[serde(rename = "low_var_kl", alias = "k3")]
    LowVarKl,
}

config_names!(KlKind, "kl_loss_type", "kl (k1), mse (k2), low_var_kl (k3)", {
    Kl => "kl" | "k1",
    Mse => "mse" | "k2",
    LowVarKl => "low_var_kl" | "k3",
});

fn check_same_2d(what: &str, a: &Tensor, b: &Tensor) -> Result<(usize, usize)> {
    let (ba, ta) = a.dims2()?;
    let (bb, tb) = b.dims2()?;
    if (ba, ta) != (bb, tb) {
        return Err(AlgoError::LengthMismatch {
            what: format!("{what} shape [{bb}, {tb}] vs [{ba}, {ta}]"),
            expected: ba * ta,
            got: bb * tb,
        });
    }
    Ok((ba, ta))
}

/// Aggregates a `[B, T]` loss matrix into a scalar with the given mode
/// (verl `agg_loss`; formulas on [`LossAgg`]). Differentiable in `loss_mat`.
///
/// # Errors
/// Shape mismatch or a non-2-D input.
pub fn aggregate(loss_mat: &Tensor, mask: &Tensor, agg: LossAgg) -> Result<Tensor> {
    check_same_2d("mask", loss_mat, mask)?;
    let mask = mask.to_dtype(loss_mat.dtype())?.detach();
    let masked = loss_mat.mul(&mask)?;
    let out = match agg {
        LossAgg::TokenMean => masked
            .sum_all()?
            .broadcast_div(&(mask.sum_all()? + MASK_EPS)?)?,
        LossAgg::SeqMeanTokenSum => masked.sum(1)?.mean_all()?,
        LossAgg::SeqMeanTokenMean => masked
            .sum(1)?
            .div(&mask.sum(1)?.maximum(MASK_EPS)?)?
            .mean_all()?,
    };
    Ok(out)
}

/// Token-mean of `x` over the mask as a plain number (for diagnostics).
fn masked_mean_f32(x: &Tensor, mask: &Tensor) -> Result<f32> {
    let x = x.to_dtype(DType::F32)?.detach();
    let mask = mask.to_dtype(DType::F32)?.detach();
    let num = x.mul(&mask)?.sum_all()?.to_scalar::<f32>()?;
    let den = mask.sum_all()?.to_scalar::<f32>()?;
    Ok(if den > 0.0 { num / den } else { 0.0 })
}

/// PPO clip ranges (verl `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PpoClip {
    /// ε_low: the ratio is clipped below at `1 − ε_low`.
    pub clip_ratio_low: f32,
    /// ε_high: the ratio is clipped above at `1 + ε_high`.
    pub clip_ratio_high: f32,
    /// Dual-clip bound c (> 1) for negative advantages; `None` disables it.
    pub clip_ratio_c: Option<f32>,
}

impl Default for PpoClip {
    /// StarPO-S: ε_low 0.2, ε_high 0.28 (clip-higher), dual clip c = 3.
    fn default() -> Self {
        PpoClip {
            clip_ratio_low: 0.2,
            clip_ratio_high: 0.28,
            clip_ratio_c: Some(3.0),
        }
    }
}

impl PpoClip {
    fn validate(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.clip_ratio_low) {
            return Err(AlgoError::InvalidParam {
                name: "clip_ratio_low",
                reason: format!("must be in [0, 1), got {}", self.clip_ratio_low),
            });
        }
        if !(self.clip_ratio_high >= 0.0 && self.clip_ratio_high.is_finite()) {
            return Err(AlgoError::InvalidParam {
                name: "clip_ratio_high",
                reason: format!("must be finite and >= 0, got {}", self.clip_ratio_high),
            });
        }
        if let Some(c) = self.clip_ratio_c {
            // verl asserts c > 1: with c <= 1 the bound would cut below the
            // unclipped objective at ratio 1.
            if !(c > 1.0 && c.is_finite()) {
                return Err(AlgoError::InvalidParam {
                    name: "clip_ratio_c",
                    reason: format!("must be finite and > 1, got {c}"),
                });
            }
        }
        Ok(())
    }
}

/// Result of [`ppo_policy_loss`]: the scalar loss plus diagnostics.
#[derive(Debug, Clone)]
pub struct PolicyLoss {
    /// Scalar loss to minimise (differentiable in `logprobs`).
    pub loss: Tensor,
    /// Share of policy tokens where the ε clip was active (verl `pg_clipfrac`).
    pub clip_fraction: f32,
    /// Share of policy tokens where the dual clip was active
    /// (verl `pg_clipfrac_lower`); 0 without dual clip.
    pub clip_fraction_lower: f32,
    /// Mean over policy tokens of `log π_old − log π` (k1; verl `ppo_kl`).
    pub approx_kl: f32,
}

/// PPO clipped policy loss with separate ε_low / ε_high and optional dual
/// clip — verl's `compute_policy_loss` (vanilla), term for term:
///
/// ```text
/// r      = exp(clamp(log π − log π_old, −20, 20))
/// ℓ1     = −A · r
/// ℓ2     = −A · clamp(r, 1 − ε_low, 1 + ε_high)
/// ℓclip  = max(ℓ1, ℓ2)                       = −min(r·A, clip(r)·A)
/// ℓ3     = −A · c                             (dual clip, Ye et al. 2020)
/// ℓ      = A < 0 ? min(ℓclip, ℓ3) : ℓclip     (ℓ = ℓclip without dual clip)
/// loss   = aggregate(ℓ, mask, agg)
/// ```
///
/// The dual clip caps the loss of a negative-advantage token whose ratio
/// exploded at `c · |A|`, so one stale sample cannot dominate the batch.
/// `old_logprobs` and `advantages` are treated as constants (detached).
///
/// `token_weights`, when given, multiply each token's loss by a constant
/// weight before aggregation, `ℓ_t ← w_t · ℓ_t` (verl's truncated importance
/// sampling of rollouts generated elsewhere: the weights of
/// [`crate::truncated_is_weights`]); the diagnostics are those of the
/// unweighted terms. `None` weighs every token 1.
///
/// # Errors
/// Shape mismatches (weights included), invalid clip parameters, tensor
/// errors.
pub fn ppo_policy_loss(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: &PpoClip,
    agg: LossAgg,
    token_weights: Option<&Tensor>,
) -> Result<PolicyLoss> {
    clip.validate()?;
    if let Some(w) = token_weights {
        check_same_2d("token_weights", logprobs, w)?;
    }
    check_same_2d("old_logprobs", logprobs, old_logprobs)?;
    check_same_2d("advantages", logprobs, advantages)?;
    check_same_2d("mask", logprobs, mask)?;
    let old = old_logprobs.detach();
    let adv = advantages.detach();

    let log_ratio = logprobs.sub(&old)?.clamp(-20f32, 20f32)?;
    let approx_kl = -masked_mean_f32(&log_ratio, mask)?;
    let ratio = log_ratio.exp()?;
    let neg_adv = adv.neg()?;
    let pg1 = neg_adv.mul(&ratio)?;
    let clipped_ratio = ratio.clamp(1.0 - clip.clip_ratio_low, 1.0 + clip.clip_ratio_high)?;
    let pg2 = neg_adv.mul(&clipped_ratio)?;
    let clip_pg = pg1.maximum(&pg2)?;
    let clip_fraction = masked_mean_f32(&pg2.gt(&pg1)?, mask)?;

    let (pg, clip_fraction_lower) = match clip.clip_ratio_c {
        Some(c) => {
            let pg3 = neg_adv.affine(c as f64, 0.0)?;
            let dual = clip_pg.minimum(&pg3)?;
            let neg = adv.lt(0f32)?;
            let lower_hits = clip_pg
                .gt(&pg3)?
                .to_dtype(DType::F32)?
                .mul(&neg.to_dtype(DType::F32)?)?;
            (
                neg.where_cond(&dual, &clip_pg)?,
                masked_mean_f32(&lower_hits, mask)?,
            )
        }
        None => (clip_pg, 0.0),
    };
    let pg = match token_weights {
        Some(w) => pg.mul(&w.to_dtype(pg.dtype())?.detach())?,
        None => pg,
    };
    Ok(PolicyLoss {
        loss: aggregate(&pg, mask, agg)?,
        clip_fraction,
        clip_fraction_lower,
        approx_kl,
    })
}

/// Per-token KL estimate between the policy and the reference (verl
/// `kl_penalty`), `d = log π − log π_ref`:
///
/// ```text
/// k1 (kl)         = d
/// k2 (mse)        = ½ d²
/// k3 (low_var_kl) = clamp(exp(−d') + d' − 1, −10, 10),  d' = clamp(d, −20, 20)
/// ```
///
/// Use it as a loss (`aggregate(kl, mask, agg) · kl_loss_coef`) or subtract
/// `coef · k` from the token rewards (KL in reward). Differentiable in
/// `logprobs`; `ref_logprobs` is detached.
///
/// # Errors
/// Shape mismatch or tensor errors.
pub fn kl_penalty(logprobs: &Tensor, ref_logprobs: &Tensor, kind: KlKind) -> Result<Tensor> {
    check_same_2d("ref_logprobs", logprobs, ref_logprobs)?;
    let d = logprobs.sub(&ref_logprobs.detach())?;
    let out = match kind {
        KlKind::Kl => d,
        KlKind::Mse => d.sqr()?.affine(0.5, 0.0)?,
        KlKind::LowVarKl => {
            // verl computes kl = ref − logp = −d, then ratio − kl − 1.
            let kl = d.neg()?.clamp(-20f32, 20f32)?;
            kl.exp()?
                .sub(&kl)?
                .affine(1.0, -1.0)?
                .clamp(-10f32, 10f32)?
        }
    };
    Ok(out)
}

/// Result of [`value_loss`].
#[derive(Debug, Clone)]
pub struct ValueLoss {
    /// Scalar loss (differentiable in `values`).
    pub loss: Tensor,
    /// Share of policy tokens where the clipped term was the larger one
    /// (verl `vf_clipfrac`).
    pub clip_fraction: f32,
}

/// Clipped value loss (verl `compute_value_loss`):
///
/// ```text
/// V_clip = clamp(V, V_old − c, V_old + c)
/// ℓ      = max((V − R)², (V_clip − R)²)
/// loss   = ½ · aggregate(ℓ, mask, agg)
/// ```
///
/// # Errors
/// Shape mismatches, a negative or non-finite `cliprange_value`, tensor errors.
pub fn value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    mask: &Tensor,
    cliprange_value: f32,
    agg: LossAgg,
) -> Result<ValueLoss> {
    if !(cliprange_value >= 0.0 && cliprange_value.is_finite()) {
        return Err(AlgoError::InvalidParam {
            name: "cliprange_value",
            reason: format!("must be finite and >= 0, got {cliprange_value}"),
        });
    }
    check_same_2d("old_values", values, old_values)?;
    check_same_2d("returns", values, returns)?;
    check_same_2d("mask", values, mask)?;
    let old = old_values.detach();
    let ret = returns.detach();
    let c = cliprange_value as f64;
    let v_clip = values.clamp(&old.affine(1.0, -c)?, &old.affine(1.0, c)?)?;
    let l1 = values.sub(&ret)?.sqr()?;
    let l2 = v_clip.sub(&ret)?.sqr()?;
    let clip_fraction = masked_mean_f32(&l2.gt(&l1)?, mask)?;
    let loss = aggregate(&l1.maximum(&l2)?, mask, agg)?.affine(0.5, 0.0)?;
    Ok(ValueLoss {
        loss,
        clip_fraction,
    })
}

/// Entropy term: `aggregate(entropy, mask, agg)`. The trainer *subtracts*
/// `entropy_coeff ·` this from the loss (maximising entropy).
///
/// # Errors
/// Shape mismatch or tensor errors.
pub fn entropy_bonus(entropy: &Tensor, mask: &Tensor, agg: LossAgg) -> Result<Tensor> {
    aggregate(entropy, mask, agg)
}

/// Per-position entropy of the softmax over the last axis:
/// `H = logsumexp(z) − Σ_v softmax(z)_v · z_v`, for logits `[B, T, V]` →
/// `[B, T]`. The max is subtracted first for stability (H is shift
/// invariant, and the max is detached so it adds no gradient path).
///
/// # Errors
/// Tensor errors (e.g. a rank other than 3).
pub fn entropy_from_logits(logits: &Tensor) -> Result<Tensor> {
    logits.dims3()?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let z = logits.broadcast_sub(&max)?;
    let lse = z.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let p = z.broadcast_sub(&lse)?.exp()?;
    let h = lse.squeeze(D::Minus1)?.sub(&p.mul(&z)?.sum(D::Minus1)?)?;
    Ok(h)
}

/// Packs a ragged batch into a `[B, T_max]` f32 tensor, padding with 0
/// (padding positions must have mask 0, which this also gives for masks).
///
/// # Errors
/// Tensor creation errors.
pub fn ragged_to_tensor(rows: &[Vec<f32>], device: &Device) -> Result<Tensor> {
    let t_max = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut flat = Vec::with_capacity(rows.len() * t_max);
    for r in rows {
        flat.extend_from_slice(r);
        flat.extend(std::iter::repeat_n(0.0f32, t_max - r.len()));
    }
    Ok(Tensor::from_vec(flat, (rows.len(), t_max), device)?)
}

#[cfg(test)]
mod tests;
