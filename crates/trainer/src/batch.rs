//! The PPO batch of one RL step, built once: the kept trajectories, their
//! loss masks and the no-grad scores the targets and the update need.
//!
//! Every row here is in the *shifted* frame of next-token log-probs: entry
//! `t` of a row scores token `t + 1` of the trajectory (the token predicted
//! from the prefix ending at `t`), which is also where the critic's value
//! `V(prefix_t)` lives.

use std::ops::Range;

use agentrl_model::PolicyModel;
use agentrl_rollout::trajectory::{join_shifted, split_shifted};
use agentrl_rollout::Trajectory;
use candle_core::{Device, Tensor};

use crate::TrainError;

/// What the update trains on.
pub struct PpoBatch {
    /// The kept trajectories (moved in, never copied).
    pub trajs: Vec<Trajectory>,
    /// Loss-mask rows: 1 on the tokens the policy generated.
    pub masks: Vec<Vec<f32>>,
    /// Log-probs under the policy that sampled, scored before the first
    /// optimizer step. `None` when the update is one pass over fresh samples
    /// and nothing else needs them: that pass's own detached log-probs are
    /// then exactly the old ones.
    pub old_logprobs: Option<Vec<Vec<f32>>>,
    /// Value-head outputs before the update (GAE's critic).
    pub old_values: Option<Vec<Vec<f32>>>,
    /// Log-probs under the frozen reference policy (KL loss or KL in the reward).
    pub ref_logprobs: Option<Vec<Vec<f32>>>,
}

/// Which no-grad passes a batch needs.
pub struct Scoring<'a> {
    /// Score the old log-probs (and, with a value head, the old values).
    pub old: bool,
    /// Score the reference log-probs with this model.
    pub reference: Option<&'a PolicyModel>,
    /// Sequences per forward pass.
    pub chunk: usize,
}

impl PpoBatch {
    /// Build the batch: masks once, then the requested no-grad passes.
    pub fn build(
        trajs: Vec<Trajectory>,
        model: &PolicyModel,
        scoring: &Scoring<'_>,
    ) -> Result<Self, TrainError> {
        let masks: Vec<Vec<f32>> = trajs.iter().map(shifted_mask).collect();
        let (old_logprobs, old_values) = if scoring.old {
            let rows = score_rows(model, &trajs, &masks, scoring.chunk)?;
            (Some(rows.logprobs), rows.values)
        } else {
            (None, None)
        };
        let ref_logprobs = match scoring.reference {
            Some(r) => Some(score_rows(r, &trajs, &masks, scoring.chunk)?.logprobs),
            None => None,
        };
        Ok(Self {
            trajs,
            masks,
            old_logprobs,
            old_values,
            ref_logprobs,
        })
    }

    /// Per-token k1 estimate `log π_old − log π_ref` (for KL in the reward);
    /// `None` unless both log-prob rows were scored.
    pub fn reference_kl(&self) -> Option<Vec<Vec<f32>>> {
        let (old, reference) = (self.old_logprobs.as_ref()?, self.ref_logprobs.as_ref()?);
        Some(
            old.iter()
                .zip(reference)
                .map(|(o, r)| o.iter().zip(r).map(|(o, r)| o - r).collect())
                .collect(),
        )
    }
}

/// Log-prob rows and, with a value head, value rows of some trajectories.
struct ScoredRows {
    logprobs: Vec<Vec<f32>>,
    values: Option<Vec<Vec<f32>>>,
}

/// No-grad pass of `model` over `trajs` in chunks of `chunk` sequences, each
/// row trimmed to its trajectory's length. Log-probs are scored where
/// `masks` (the policy's tokens) say, as the update scores them, and are 0
/// elsewhere: the same packing, so an unchanged policy's old log-probs are
/// the update's own.
fn score_rows(
    model: &PolicyModel,
    trajs: &[Trajectory],
    masks: &[Vec<f32>],
    chunk: usize,
) -> Result<ScoredRows, TrainError> {
    let mut logprobs = Vec::with_capacity(trajs.len());
    let mut values = Vec::new();
    let chunk = chunk.max(1);
    for (part, part_masks) in trajs.chunks(chunk).zip(masks.chunks(chunk)) {
        let rows = ModelRows::of(part.iter());
        let scored = rows.split(part_masks.iter());
        let out = model.scored_logprobs(&rows.seqs, &scored)?;
        logprobs.extend(rows.join(out.logprobs.detach().to_vec2::<f32>()?));
        if let Some(v) = out.values {
            values.extend(rows.join(v.detach().to_vec2::<f32>()?));
        }
    }
    let values = (!values.is_empty()).then_some(values);
    Ok(ScoredRows { logprobs, values })
}

/// Some trajectories as the model reads them: every sequence of each
/// (one, or one per turn with a history window) as a row of one batch.
/// Per-trajectory rows in the shifted frame are cut into per-sequence rows
/// on the way in ([`ModelRows::split`]) and joined on the way out
/// ([`ModelRows::join`]).
pub struct ModelRows {
    /// The model's input rows.
    pub seqs: Vec<Vec<u32>>,
    /// Each trajectory's sequence ranges (in its own token indices).
    ranges: Vec<Vec<Range<usize>>>,
}

impl ModelRows {
    /// The sequences of `trajs`, in order.
    pub fn of<'t>(trajs: impl Iterator<Item = &'t Trajectory>) -> Self {
        let mut seqs = Vec::new();
        let mut ranges = Vec::new();
        for t in trajs {
            let r = t.sequence_ranges();
            seqs.extend(r.iter().map(|r| t.tokens[r.clone()].to_vec()));
            ranges.push(r);
        }
        Self { seqs, ranges }
    }

    /// Per-trajectory shifted rows (in the order given to [`ModelRows::of`])
    /// cut into the model's per-sequence rows.
    pub fn split<'r>(&self, rows: impl Iterator<Item = &'r Vec<f32>>) -> Vec<Vec<f32>> {
        rows.zip(&self.ranges)
            .flat_map(|(row, r)| split_shifted(row, r))
            .collect()
    }

    /// The model's per-sequence output rows (padded to any width) joined
    /// into per-trajectory shifted rows, 0 between sequences.
    pub fn join(&self, mut seq_rows: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
        let mut rows = seq_rows.drain(..);
        self.ranges
            .iter()
            .map(|ranges| {
                let parts = ranges
                    .iter()
                    .map(|r| {
                        let mut row = rows.next().unwrap_or_default();
                        row.truncate(r.len().saturating_sub(1));
                        row
                    })
                    .collect();
                join_shifted(parts, 0.0)
            })
            .collect()
    }
}

/// A trajectory's loss mask in the shifted frame.
pub fn shifted_mask(t: &Trajectory) -> Vec<f32> {
    t.loss_mask.iter().skip(1).map(|&m| m as f32).collect()
}

/// Take each turn's thought out of a shifted loss-mask row: the reply's
/// tokens up to and including its first `thought_end` (`</think>`) score
/// 0. A reply without one keeps its mask (there is no thought to spare).
pub fn mask_thoughts(t: &Trajectory, mask: &mut [f32], thought_end: u32) {
    for turn in &t.turns {
        let end = turn.end.min(t.tokens.len());
        let Some(close) = (turn.start..end).find(|&k| t.tokens[k] == thought_end) else {
            continue;
        };
        // Token k is scored at shifted index k - 1.
        for k in turn.start.max(1)..=close {
            if let Some(m) = mask.get_mut(k - 1) {
                *m = 0.0;
            }
        }
    }
}

/// Right-pad ragged rows into a `[rows, width]` f32 tensor.
pub fn padded(rows: &[Vec<f32>], width: usize, device: &Device) -> candle_core::Result<Tensor> {
    let mut flat = vec![0f32; rows.len() * width];
    for (r, row) in rows.iter().enumerate() {
        let n = row.len().min(width);
        flat[r * width..r * width + n].copy_from_slice(&row[..n]);
    }
    Tensor::from_vec(flat, (rows.len(), width), device)
}

/// Drop the first element of a per-token row so it lines up with next-token
/// log-probs (the first token is never predicted).
pub fn shift(row: &[f32]) -> Vec<f32> {
    row.iter().skip(1).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_fills_with_zeros() {
        let t = padded(&[vec![1.0, 2.0], vec![3.0]], 3, &Device::Cpu).unwrap();
        assert_eq!(
            t.to_vec2::<f32>().unwrap(),
            vec![vec![1.0, 2.0, 0.0], vec![3.0, 0.0, 0.0]]
        );
    }

    /// Two turns: prompt [1, 2], reply [10 <think>, 5, 11 </think>, 7, 99],
    /// prompt [3], reply [8, 99] with no thought end.
    #[test]
    fn thoughts_leave_the_mask_and_answers_stay() {
        use agentrl_env_core::{Split, TaskSpec};
        use agentrl_rollout::Turn;
        let tokens = vec![1, 2, 10, 5, 11, 7, 99, 3, 8, 99];
        let loss_mask = vec![0, 0, 1, 1, 1, 1, 1, 0, 1, 1];
        let turn = |start, end| Turn {
            start,
            end,
            ..Turn::default()
        };
        let t = Trajectory {
            tokens,
            loss_mask,
            turns: vec![turn(2, 7), turn(8, 10)],
            ..Trajectory::new(TaskSpec::new("bandit", Split::Train, "easy", 0), 0)
        };
        let mut mask = shifted_mask(&t);
        mask_thoughts(&t, &mut mask, 11);
        // Shifted: entry k scores token k + 1.
        assert_eq!(mask, vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
    }

    #[test]
    fn shift_aligns_with_next_token() {
        assert_eq!(shift(&[0.0, 1.0, 1.0]), vec![1.0, 1.0]);
    }
}
