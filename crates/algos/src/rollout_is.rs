//! Truncated importance sampling for the rollout/trainer mismatch (verl's
//! TIS, "Your efficient RL framework secretly brings you off-policy RL
//! training", Yao et al. 2025).
//!
//! When an inference server generates the rollouts, the tokens come from
//! the server's computation of the policy (its kernels, its precision, its
//! batching) while the loss scores them with the trainer's own. The
//! per-token ratio between the two corrects the policy gradient for the
//! difference; it is truncated at a cap so that one token the server found
//! far less likely than the trainer does cannot dominate the batch:
//!
//! ```text
//! w_t = min(exp(clamp(log π_old(t) − log π_rollout(t), −20, 20)), cap)
//! ```
//!
//! `π_old` is the trainer's policy before the update (the local model's
//! score of the sampled tokens), `π_rollout` the server's log-prob of the
//! token it sampled. The weight multiplies each token's PPO loss (see
//! [`crate::ppo_policy_loss`]); it is a constant (no gradient).

use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};
use crate::stats::check_len;

/// What the correction saw on the policy tokens of one batch (written to
/// `metrics.jsonl` as `rollout_is`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutIsStats {
    /// Mean of the untruncated ratio `exp(log π_old − log π_rollout)`.
    pub mean_ratio: f64,
    /// Its largest value.
    pub max_ratio: f64,
    /// Its smallest value.
    pub min_ratio: f64,
    /// Share of policy tokens whose ratio was above the cap (truncated).
    pub clipped_fraction: f64,
    /// Mean of `|log π_old − log π_rollout|`.
    pub mean_abs_logp_diff: f64,
    /// Policy tokens measured.
    pub tokens: usize,
}

/// The truncated importance weights of every token (1 off the mask) and
/// their statistics over the policy tokens (formula in the module docs).
/// Rows are ragged; `old`, `rollout` and `mask` must have the same shape,
/// and the mask must be 0 or 1.
///
/// # Errors
/// A cap below 1 or not finite, shape mismatches, a mask entry other than
/// 0 or 1, a non-finite log-prob on a policy token.
pub fn truncated_is_weights(
    old: &[Vec<f32>],
    rollout: &[Vec<f32>],
    mask: &[Vec<f32>],
    cap: f32,
) -> Result<(Vec<Vec<f32>>, RolloutIsStats)> {
    if !(cap.is_finite() && cap >= 1.0) {
        return Err(AlgoError::InvalidParam {
            name: "rollout_is_cap",
            reason: format!("must be finite and >= 1, got {cap}"),
        });
    }
    for (what, rows) in [("rollout log-probs", rollout), ("mask", mask)] {
        check_len(&format!("{what} rows"), old.len(), rows.len())?;
    }
    let mut weights = Vec::with_capacity(old.len());
    let (mut sum, mut abs_diff, mut clipped, mut tokens) = (0f64, 0f64, 0usize, 0usize);
    let (mut max, mut min) = (f64::NEG_INFINITY, f64::INFINITY);
    for (seq, ((o, r), m)) in old.iter().zip(rollout).zip(mask).enumerate() {
        for (what, row) in [("rollout log-probs", r), ("mask", m)] {
            check_len(&format!("{what} of sequence {seq}"), o.len(), row.len())?;
        }
        let mut row = Vec::with_capacity(o.len());
        for (pos, ((&o, &r), &m)) in o.iter().zip(r).zip(m).enumerate() {
            if m == 0.0 {
                row.push(1.0);
                continue;
            }
            if m != 1.0 {
                return Err(AlgoError::InvalidMask { seq, pos, value: m });
            }
            if !(o.is_finite() && r.is_finite()) {
                return Err(AlgoError::InvalidParam {
                    name: "rollout_logprobs",
                    reason: format!(
                        "log-probs at sequence {seq}, position {pos} are not finite: trainer {o}, rollout {r}"
                    ),
                });
            }
            let diff = o as f64 - r as f64;
            let ratio = diff.clamp(-20.0, 20.0).exp();
            sum += ratio;
            abs_diff += diff.abs();
            max = max.max(ratio);
            min = min.min(ratio);
            tokens += 1;
            if ratio > cap as f64 {
                clipped += 1;
            }
            row.push(ratio.min(cap as f64) as f32);
        }
        weights.push(row);
    }
    let stats = match tokens {
        0 => RolloutIsStats::default(),
        n => RolloutIsStats {
            mean_ratio: sum / n as f64,
            max_ratio: max,
            min_ratio: min,
            clipped_fraction: clipped as f64 / n as f64,
            mean_abs_logp_diff: abs_diff / n as f64,
            tokens: n,
        },
    };
    Ok((weights, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::close_rows;

    #[test]
    fn weights_are_the_ratio_truncated_at_the_cap_and_one_off_the_mask() {
        // Sequence 0: Δ = old − rollout = 0, ln 1.5, ln 4 (above cap 2), and a
        // masked entry (Δ = 5, ignored). Sequence 1: Δ = −ln 2, then masked.
        let ln = f32::ln;
        let old = vec![
            vec![-1.0, -1.0 + ln(1.5), -2.0 + ln(4.0), 0.0],
            vec![-3.0 - ln(2.0), -0.5],
        ];
        let rollout = vec![vec![-1.0, -1.0, -2.0, -5.0], vec![-3.0, -0.1]];
        let mask = vec![vec![1.0, 1.0, 1.0, 0.0], vec![1.0, 0.0]];
        let (w, s) = truncated_is_weights(&old, &rollout, &mask, 2.0).unwrap();
        close_rows(&w, &[vec![1.0, 1.5, 2.0, 1.0], vec![0.5, 1.0]], 1e-5);
        // Ratios of the 4 policy tokens: 1, 1.5, 4, 0.5.
        assert_eq!(s.tokens, 4);
        assert!((s.mean_ratio - 7.0 / 4.0).abs() < 1e-5, "{s:?}");
        assert!((s.max_ratio - 4.0).abs() < 1e-5 && (s.min_ratio - 0.5).abs() < 1e-5);
        assert_eq!(s.clipped_fraction, 0.25);
        let mean_abs = (0.0 + 1.5f64.ln() + 4f64.ln() + 2f64.ln()) / 4.0;
        assert!((s.mean_abs_logp_diff - mean_abs).abs() < 1e-5, "{s:?}");
    }

    #[test]
    fn equal_log_probs_give_weight_one_and_no_clipping() {
        let lp = vec![vec![-0.3, -2.0, -0.7]];
        let (w, s) = truncated_is_weights(&lp, &lp, &[vec![1.0, 1.0, 0.0]], 1.0).unwrap();
        assert_eq!(w, vec![vec![1.0, 1.0, 1.0]]);
        assert_eq!(
            (s.mean_ratio, s.max_ratio, s.clipped_fraction),
            (1.0, 1.0, 0.0)
        );
        assert_eq!((s.mean_abs_logp_diff, s.tokens), (0.0, 2));
    }

    #[test]
    fn a_huge_gap_is_clamped_before_exp_and_no_tokens_give_zeros() {
        let (w, s) =
            truncated_is_weights(&[vec![0.0]], &[vec![-1000.0]], &[vec![1.0]], 3.0).unwrap();
        assert_eq!(w, vec![vec![3.0]]);
        assert!((s.max_ratio - 20f64.exp()).abs() / 20f64.exp() < 1e-9);
        assert_eq!(s.clipped_fraction, 1.0);
        let (_, none) =
            truncated_is_weights(&[vec![0.0]], &[vec![0.0]], &[vec![0.0]], 2.0).unwrap();
        assert_eq!(none, RolloutIsStats::default());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let one = vec![vec![0.0]];
        for cap in [0.5, f32::NAN, f32::INFINITY] {
            assert!(truncated_is_weights(&one, &one, &[vec![1.0]], cap).is_err());
        }
        let e = truncated_is_weights(&one, &[vec![0.0, 0.0]], &[vec![1.0]], 2.0).unwrap_err();
        assert!(e.to_string().contains("sequence 0"), "{e}");
        assert!(truncated_is_weights(&one, &[], &[], 2.0).is_err());
        assert!(matches!(
            truncated_is_weights(&one, &one, &[vec![0.5]], 2.0),
            Err(AlgoError::InvalidMask { .. })
        ));
        assert!(truncated_is_weights(&one, &[vec![f32::NAN]], &[vec![1.0]], 2.0).is_err());
    }
}
