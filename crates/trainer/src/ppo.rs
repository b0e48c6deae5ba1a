//! The PPO update of one RL step: epochs over shuffled mini-batches of a
//! [`PpoBatch`], each taking one optimizer step on the clipped policy loss
//! plus the entropy bonus, KL loss and value loss the config turns on.

use agentrl_algos as algos;
use agentrl_model::{add_grads, clip_grad_norm, AdamW, PolicyModel};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::advantages::Targets;
use crate::batch::{padded, ModelRows, PpoBatch};
#[cfg(doc)]
use crate::config::ActorSection;
use crate::config::TrainConfig;
use crate::TrainError;

/// The optimizers of RL: the actor's over the transformer, and with a critic
/// a second one over the value head at `critic.lr`.
pub struct Optimizers {
    pub actor: AdamW,
    pub critic: Option<AdamW>,
}

impl Optimizers {
    /// Set this step's learning rates.
    pub fn set_lr(&mut self, lr: StepLr) {
        self.actor.set_lr(lr.actor);
        if let Some(c) = &mut self.critic {
            c.set_lr(lr.critic);
        }
    }

    fn step(&mut self, grads: &GradStore) -> Result<(), TrainError> {
        self.actor.step(grads)?;
        if let Some(c) = &mut self.critic {
            c.step(grads)?;
        }
        Ok(())
    }
}

/// The learning rates of one RL step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLr {
    pub actor: f64,
    pub critic: f64,
}

/// The running reference of [`actor.grad_spike_factor`]: an exponential
/// mean of the gradient norms (after `grad_clip`) of the mini-batches applied
/// so far. It lives in the checkpoint's trainer state so that a resumed run
/// judges spikes as the first did.
///
/// [`actor.grad_spike_factor`]: crate::config::ActorSection::grad_spike_factor
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SpikeGuard {
    /// Mean norm so far; `None` before the first applied update.
    pub reference: Option<f64>,
}

impl SpikeGuard {
    /// Weight of the newest norm in the running mean (≈ the last 10 updates).
    pub const NEW_WEIGHT: f64 = 0.1;

    /// Whether a mini-batch whose gradient norm is `norm` is a spike to skip:
    /// above `factor ×` the reference (`factor` 0 = off; never before the
    /// first update).
    pub fn is_spike(&self, norm: f64, factor: f64) -> bool {
        match self.reference {
            Some(r) if factor > 0.0 => norm > factor * r,
            _ => false,
        }
    }

    /// True until the guard has counted an update (always when it is off):
    /// the trainer state then leaves it out.
    pub fn is_unused(&self) -> bool {
        self.reference.is_none()
    }

    /// Count a skipped spike as the threshold itself (at most `grad_clip`,
    /// as applied norms are): the mean then follows a lasting rise in the
    /// norms, each skip lifting it by `1 + NEW_WEIGHT · (factor − 1)`,
    /// rather than skipping every later update. Without this a run whose
    /// norms grow as its rewards start to vary froze for good.
    pub fn observe_spike(&mut self, factor: f64, grad_clip: f64) {
        if let Some(r) = self.reference {
            self.observe((factor * r).min(grad_clip), factor);
        }
    }

    /// Count an applied update whose gradient norm after clipping was
    /// `norm` (nothing when the guard is off, so its state stays empty).
    pub fn observe(&mut self, norm: f64, factor: f64) {
        if factor > 0.0 {
            self.reference = Some(match self.reference {
                Some(r) => (1.0 - Self::NEW_WEIGHT) * r + Self::NEW_WEIGHT * norm,
                None => norm,
            });
        }
    }
}

/// Figures of one update, per mini-batch or (from [`UpdateTotals::mean`])
/// averaged over all of them. Written to `metrics.jsonl` with the step's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateStats {
    /// Entropy of the policy on its own tokens.
    pub entropy: f64,
    /// The KL loss term (0 without `use_kl_loss`).
    pub kl: f64,
    /// Mean `log π_old − log π` over policy tokens.
    pub approx_kl: f64,
    /// Share of policy tokens where the ratio clip was active.
    pub clip_fraction: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Share of mini-batches [`SpikeGuard`] skipped as gradient spikes.
    #[serde(default)]
    pub spike_skipped: f64,
    pub pg_loss: f64,
    /// The value loss term (0 without a critic).
    pub value_loss: f64,
    /// Seconds of the update spent scoring the batch without gradients
    /// first: old log-probs (skipped when one optimizer step takes the
    /// whole batch once), reference log-probs (KL) and old values (GAE).
    #[serde(default)]
    pub scoring_seconds: f64,
}

/// Running sums of [`UpdateStats`] over mini-batches.
#[derive(Debug, Clone, Copy, Default)]
pub struct UpdateTotals {
    minibatches: usize,
    sum: UpdateStats,
}

impl UpdateTotals {
    /// Count one mini-batch.
    pub fn add(&mut self, s: &UpdateStats) {
        self.minibatches += 1;
        let t = &mut self.sum;
        t.entropy += s.entropy;
        t.kl += s.kl;
        t.approx_kl += s.approx_kl;
        t.clip_fraction += s.clip_fraction;
        t.grad_norm += s.grad_norm;
        t.spike_skipped += s.spike_skipped;
        t.pg_loss += s.pg_loss;
        t.value_loss += s.value_loss;
    }

    /// The mean over the mini-batches counted (all zero when none was).
    pub fn mean(&self) -> UpdateStats {
        if self.minibatches == 0 {
            return UpdateStats::default();
        }
        let n = self.minibatches as f64;
        let s = &self.sum;
        UpdateStats {
            entropy: s.entropy / n,
            kl: s.kl / n,
            approx_kl: s.approx_kl / n,
            clip_fraction: s.clip_fraction / n,
            grad_norm: s.grad_norm / n,
            spike_skipped: s.spike_skipped / n,
            pg_loss: s.pg_loss / n,
            value_loss: s.value_loss / n,
            scoring_seconds: 0.0,
        }
    }
}

/// Every PPO epoch over `batch` in mini-batches of `actor.ppo_mini_batch_size`,
/// shuffled by `rng`; one optimizer step per mini-batch, on the gradients
/// of its micro-batches ([`ActorSection::micro_batch`]) added up. `is_weights`: per
/// trajectory, the truncated importance weight of each token (shifted
/// frame) multiplying its policy loss, for rollouts a server generated.
/// `guard` skips gradient spikes (`actor.grad_spike_factor`).
#[allow(clippy::too_many_arguments)]
pub fn ppo_update(
    model: &PolicyModel,
    opts: &mut Optimizers,
    batch: &PpoBatch,
    targets: &Targets,
    is_weights: Option<&[Vec<f32>]>,
    cfg: &TrainConfig,
    rng: &mut ChaCha8Rng,
    guard: &mut SpikeGuard,
) -> Result<UpdateStats, TrainError> {
    let (grad_clip, factor) = (cfg.actor.grad_clip, cfg.actor.grad_spike_factor);
    let vars = model.trainable_vars()?;
    let mut order: Vec<usize> = (0..batch.trajs.len()).collect();
    let mut totals = UpdateTotals::default();
    for _ in 0..cfg.actor.ppo_epochs {
        order.shuffle(rng);
        for chunk in order.chunks(cfg.actor.ppo_mini_batch_size.max(1)) {
            let parts: Vec<MicroBatch> = chunk
                .chunks(cfg.actor.micro_batch())
                .map(|rows| MicroBatch::new(batch, rows))
                .collect();
            let whole = Totals::of(&parts);
            let mut stats = UpdateStats::default();
            let mut grads: Option<GradStore> = None;
            for part in &parts {
                let share = whole.share(part, cfg.actor.loss_agg_mode);
                let (loss, part_stats) =
                    micro_batch_loss(model, batch, targets, is_weights, cfg, part)?;
                stats.add_share(&part_stats, share);
                let part_grads = (loss * share.loss)?.backward()?;
                grads = Some(add_grads(grads, part_grads, &vars)?);
            }
            let Some(mut grads) = grads else { continue };
            stats.grad_norm = clip_grad_norm(&mut grads, &vars, grad_clip)?;
            if guard.is_spike(stats.grad_norm, factor) {
                stats.spike_skipped = 1.0;
                guard.observe_spike(factor, grad_clip);
            } else {
                guard.observe(stats.grad_norm.min(grad_clip), factor);
                opts.step(&grads)?;
            }
            totals.add(&stats);
        }
    }
    Ok(totals.mean())
}

/// The trajectories of one forward and backward pass: a mini-batch, or with
/// `actor.ppo_micro_batch_size` a part of one.
struct MicroBatch<'a> {
    /// Their indices in the batch.
    rows: &'a [usize],
    model_rows: ModelRows,
    /// The loss mask of each model row: every term of the loss reads the
    /// policy's tokens alone, so the head skips the observations.
    scored: Vec<Vec<f32>>,
    /// Policy tokens (what `token-mean` and the ratio figures average over).
    tokens: f64,
}

impl<'a> MicroBatch<'a> {
    fn new(batch: &PpoBatch, rows: &'a [usize]) -> Self {
        let model_rows = ModelRows::of(rows.iter().map(|&i| &batch.trajs[i]));
        let scored = model_rows.split(rows.iter().map(|&i| &batch.masks[i]));
        let tokens = scored.iter().flatten().map(|&m| m as f64).sum();
        Self {
            rows,
            model_rows,
            scored,
            tokens,
        }
    }

    /// Model rows (the sequences the `seq-mean-*` modes average over).
    fn sequences(&self) -> f64 {
        self.scored.len() as f64
    }
}

/// A micro-batch's weight in its mini-batch: its loss (an average over its
/// own sequences or tokens) times `loss` is its part of the mini-batch's
/// loss, so the parts' gradients add up to the whole's; `tokens` weighs
/// its token-mean figures.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shares {
    loss: f64,
    tokens: f64,
}

/// The sequences and tokens of a whole mini-batch.
struct Totals {
    sequences: f64,
    tokens: f64,
}

impl Totals {
    fn of(parts: &[MicroBatch]) -> Self {
        Totals {
            sequences: parts.iter().map(MicroBatch::sequences).sum(),
            tokens: parts.iter().map(|p| p.tokens).sum(),
        }
    }

    /// The shares of `part`, one of the parts counted.
    fn share(&self, part: &MicroBatch, agg: algos::LossAgg) -> Shares {
        let ratio = |n: f64, total: f64| if total > 0.0 { n / total } else { 0.0 };
        let tokens = ratio(part.tokens, self.tokens);
        let loss = match agg {
            algos::LossAgg::TokenMean => tokens,
            algos::LossAgg::SeqMeanTokenSum | algos::LossAgg::SeqMeanTokenMean => {
                ratio(part.sequences(), self.sequences)
            }
        };
        Shares { loss, tokens }
    }
}

impl UpdateStats {
    /// Add a micro-batch's figures at its share of the mini-batch.
    fn add_share(&mut self, part: &UpdateStats, share: Shares) {
        self.entropy += share.loss * part.entropy;
        self.kl += share.loss * part.kl;
        self.pg_loss += share.loss * part.pg_loss;
        self.value_loss += share.loss * part.value_loss;
        self.approx_kl += share.tokens * part.approx_kl;
        self.clip_fraction += share.tokens * part.clip_fraction;
    }
}

/// The loss of the micro-batch `part` of `batch` (differentiable, averaged
/// over the part alone) and its figures (all but the gradient norm).
fn micro_batch_loss(
    model: &PolicyModel,
    batch: &PpoBatch,
    targets: &Targets,
    is_weights: Option<&[Vec<f32>]>,
    cfg: &TrainConfig,
    part: &MicroBatch,
) -> Result<(Tensor, UpdateStats), TrainError> {
    let (actor, critic) = (&cfg.actor, &cfg.critic);
    let agg = actor.loss_agg_mode;
    let (rows, model_rows, scored) = (part.rows, &part.model_rows, &part.scored);
    let out = model.scored_logprobs(&model_rows.seqs, scored)?;
    let width = out.logprobs.dim(1)?;
    let tensor = |src: &[Vec<f32>]| -> candle_core::Result<Tensor> {
        let picked = model_rows.split(rows.iter().map(|&i| &src[i]));
        padded(&picked, width, &model.device)
    };
    let mask = padded(scored, width, &model.device)?;
    let old = match &batch.old_logprobs {
        Some(o) => tensor(o)?,
        None => out.logprobs.detach(),
    };
    let weights = is_weights.map(&tensor).transpose()?;
    let policy = algos::ppo_policy_loss(
        &out.logprobs,
        &old,
        &tensor(&targets.advantages)?,
        &mask,
        &algos::PpoClip {
            clip_ratio_low: actor.clip_ratio_low,
            clip_ratio_high: actor.clip_ratio_high,
            clip_ratio_c: (actor.clip_ratio_c > 1.0).then_some(actor.clip_ratio_c),
        },
        agg,
        weights.as_ref(),
    )?;
    let mut stats = UpdateStats {
        pg_loss: scalar(&policy.loss)?,
        approx_kl: policy.approx_kl as f64,
        clip_fraction: policy.clip_fraction as f64,
        ..UpdateStats::default()
    };
    let mut loss = policy.loss.clone();
    let entropy = algos::aggregate(&out.entropy, &mask, agg)?;
    stats.entropy = scalar(&entropy)?;
    if actor.entropy_coeff != 0.0 {
        loss = (loss - (&entropy * actor.entropy_coeff as f64)?)?;
    }
    if let (Some(r), true) = (
        &batch.ref_logprobs,
        actor.use_kl_loss && actor.kl_loss_coef > 0.0,
    ) {
        let per_token = algos::kl_penalty(&out.logprobs, &tensor(r)?, actor.kl_loss_type)?;
        let kl = algos::aggregate(&per_token, &mask, agg)?;
        stats.kl = scalar(&kl)?;
        loss = (loss + (kl * actor.kl_loss_coef as f64)?)?;
    }
    if let (Some(values), Some(returns), Some(old_values)) =
        (&out.values, &targets.returns, &batch.old_values)
    {
        let value = algos::value_loss(
            &values.narrow(1, 0, width)?,
            &tensor(old_values)?,
            &tensor(returns)?,
            &mask,
            critic.cliprange_value,
            agg,
        )?
        .loss;
        stats.value_loss = scalar(&value)?;
        loss = (loss + (value * critic.value_loss_coef as f64)?)?;
    }
    Ok((loss, stats))
}

fn scalar(t: &Tensor) -> candle_core::Result<f64> {
    Ok(t.to_scalar::<f32>()? as f64)
}

/// The trainable variables of the value head and of everything else (with
/// a LoRA adapter, its A and B), by name.
pub fn split_value_head(model: &PolicyModel) -> Result<(Vec<Var>, Vec<Var>), TrainError> {
    use agentrl_model::qwen2::{VALUE_HEAD_BIAS, VALUE_HEAD_WEIGHT};
    let (head, rest): (Vec<_>, Vec<_>) = model
        .trainable_named_vars()?
        .into_iter()
        .partition(|(name, _)| name == VALUE_HEAD_WEIGHT || name == VALUE_HEAD_BIAS);
    let vars = |v: Vec<(String, Var)>| v.into_iter().map(|(_, v)| v).collect();
    Ok((vars(head), vars(rest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_average_each_figure_over_minibatches() {
        let mut t = UpdateTotals::default();
        assert_eq!(t.mean(), UpdateStats::default());
        t.add(&UpdateStats {
            entropy: 1.0,
            grad_norm: 2.0,
            value_loss: 4.0,
            ..UpdateStats::default()
        });
        t.add(&UpdateStats {
            entropy: 3.0,
            pg_loss: -1.0,
            ..UpdateStats::default()
        });
        let m = t.mean();
        assert_eq!(
            (m.entropy, m.grad_norm, m.value_loss, m.pg_loss, m.kl),
            (2.0, 1.0, 2.0, -0.5, 0.0)
        );
    }

    #[test]
    fn the_spike_guard_is_inert_when_off() {
        let mut g = SpikeGuard::default();
        g.observe(0.1, 0.0);
        assert_eq!(g.reference, None);
        assert!(g.is_unused());
        let g = SpikeGuard {
            reference: Some(0.1),
        };
        assert!(!g.is_spike(100.0, 0.0));
    }

    #[test]
    fn the_spike_guard_skips_norms_above_a_multiple_of_the_running_mean() {
        let factor = 3.0;
        let mut g = SpikeGuard::default();
        // No history yet: nothing is a spike; the first norm starts the mean.
        assert!(!g.is_spike(100.0, factor));
        g.observe(0.1, factor);
        assert_eq!(g.reference, Some(0.1));
        assert!(!g.is_unused());
        assert!(g.is_spike(0.31, factor));
        assert!(!g.is_spike(0.29, factor));
        // 0.9 · 0.1 + 0.1 · 0.2 = 0.11 → spikes are above 0.33.
        g.observe(0.2, factor);
        assert!((g.reference.unwrap() - 0.11).abs() < 1e-12);
        assert!(g.is_spike(0.34, factor));
        assert!(!g.is_spike(0.32, factor));
    }

    #[test]
    fn a_lasting_rise_in_the_norms_is_skipped_only_a_few_times() {
        let (factor, clip) = (3.0, 1.0);
        let mut g = SpikeGuard {
            reference: Some(0.1),
        };
        // A skip counts as the threshold: 0.9 · 0.1 + 0.1 · 0.3 = 0.12.
        g.observe_spike(factor, clip);
        assert!((g.reference.unwrap() - 0.12).abs() < 1e-12);
        // Norms that stay at 0.7 (7× the old mean) are applied again once
        // the mean has risen past 0.7 / 3: 0.1 · 1.2^k > 0.2334 at k = 5.
        let mut g = SpikeGuard {
            reference: Some(0.1),
        };
        let mut skips = 0;
        while g.is_spike(0.7, factor) {
            g.observe_spike(factor, clip);
            skips += 1;
            assert!(skips < 100, "the guard never lets the new norms through");
        }
        assert_eq!(skips, 5);
        // The threshold counted is clipped like applied norms are.
        let mut g = SpikeGuard {
            reference: Some(0.5),
        };
        g.observe_spike(factor, clip);
        assert!((g.reference.unwrap() - (0.45 + 0.1)).abs() < 1e-12);
        // Off or before any update: nothing to follow.
        let mut g = SpikeGuard::default();
        g.observe_spike(factor, clip);
        assert!(g.is_unused());
    }
}
