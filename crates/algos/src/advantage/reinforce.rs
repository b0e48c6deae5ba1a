//! REINFORCE++: discounted return-to-go, whitened over the batch.

use crate::error::Result;
use crate::stats::{check_masks, check_ragged, check_rewards_on_policy, masked_whiten};

/// REINFORCE++ advantage per token (Hu 2025; verl's `reinforce_plus_plus`):
///
/// ```text
/// G_t = r_t + γ · G_next(t)        for policy tokens t (mask 1), backwards
/// A   = whiten(G) over all mask-1 tokens of the batch, 0 where mask = 0
/// ```
///
/// `next(t)` is the next *policy* token of the same sequence (G = 0 after the
/// last one). Observation tokens between turns are skipped: the running
/// return passes through them unchanged and undiscounted, so turn 1 still
/// sees turn 2's rewards. (verl resets the running return at every mask-0
/// token, which is right for trailing padding in single-turn RL but cuts a
/// multi-turn chain at the first observation; we do not copy that.)
///
/// γ discounts per policy token, as in verl. Whitening uses the unbiased
/// variance with a 1e-8 floor ([`masked_whiten`]).
///
/// # Errors
/// Length or mask errors, [`crate::AlgoError::RewardOnNonPolicyToken`] for a
/// non-zero reward on a mask-0 token (it would be lost), and
/// [`crate::AlgoError::InvalidParam`] for γ outside [0, 1].
pub fn reinforce_plus_plus(
    token_rewards: &[Vec<f32>],
    masks: &[Vec<f32>],
    gamma: f32,
) -> Result<Vec<Vec<f32>>> {
    check_ragged("masks", token_rewards, masks)?;
    check_masks(masks)?;
    check_rewards_on_policy(token_rewards, masks)?;
    check_unit_interval("gamma", gamma)?;
    let returns: Vec<Vec<f32>> = token_rewards
        .iter()
        .zip(masks)
        .map(|(r, m)| {
            let mut ret = vec![0.0f32; r.len()];
            let mut running = 0.0f64;
            for t in (0..r.len()).rev() {
                if m[t] == 1.0 {
                    running = r[t] as f64 + gamma as f64 * running;
                    ret[t] = running as f32;
                }
            }
            ret
        })
        .collect();
    masked_whiten(&returns, masks)
}

/// Checks a discount / λ parameter lies in [0, 1].
pub(crate) fn check_unit_interval(name: &'static str, x: f32) -> Result<()> {
    if (0.0..=1.0).contains(&x) {
        Ok(())
    } else {
        Err(crate::AlgoError::InvalidParam {
            name,
            reason: format!("must be in [0, 1], got {x}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reinforce_pp_skips_observation_tokens_and_whitens() {
        // seq 0: [obs, p, p | obs, obs | p, p], turn-1 penalty −0.1 on its
        // last token (pos 2), outcome 1.0 on the last policy token (pos 6).
        // seq 1: [obs, p, p], reward 0.5 on pos 2.  γ = 0.9.
        // Returns over policy tokens, backwards, observation tokens skipped:
        //   seq 0: G6 = 1.0; G5 = 0.9·1.0 = 0.9; G2 = −0.1 + 0.9·0.9 = 0.71;
        //          G1 = 0.9·0.71 = 0.639
        //   seq 1: G2 = 0.5; G1 = 0.45
        // Whitening over the 6 values [0.639, 0.71, 0.9, 1.0, 0.45, 0.5]:
        //   mean = 4.199 / 6 = 0.6998333
        //   Σ(x−mean)² = 0.2363208, unbiased var = 0.0472642, std = 0.2174033
        //   A = (x − mean) / std
        let rewards = vec![
            vec![0.0, 0.0, -0.1, 0.0, 0.0, 0.0, 1.0],
            vec![0.0, 0.0, 0.5],
        ];
        let masks = vec![vec![0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], vec![0.0, 1.0, 1.0]];
        let a = reinforce_plus_plus(&rewards, &masks, 0.9).unwrap();
        let want = [
            vec![0.0, -0.279818, 0.046764, 0.0, 0.0, 0.920716, 1.380691],
            vec![0.0, -1.14917, -0.919183],
        ];
        for (row, w) in a.iter().zip(want.iter()) {
            for (x, y) in row.iter().zip(w) {
                assert!((x - y).abs() < 1e-4, "{a:?}");
            }
        }
    }

    #[test]
    fn reinforce_pp_rejects_reward_on_observation_token() {
        let r = vec![vec![0.0, 1.0, 0.0]];
        let m = vec![vec![1.0, 0.0, 1.0]];
        assert!(matches!(
            reinforce_plus_plus(&r, &m, 1.0),
            Err(crate::AlgoError::RewardOnNonPolicyToken { seq: 0, pos: 1, .. })
        ));
    }
}
