//! Spreading trajectory- or turn-level advantages onto tokens.

use crate::error::{AlgoError, Result};
use crate::stats::{check_len, check_masks, check_ragged};

/// Token advantages from one advantage per sequence:
/// `out[i][t] = adv[i] · mask[i][t]` (verl's `scores.unsqueeze(-1) *
/// response_mask`), so every policy token of trajectory `i` gets `adv[i]`
/// and observation tokens get 0.
///
/// # Errors
/// Length mismatch or a mask entry other than 0/1.
pub fn sequence_to_tokens(adv: &[f32], masks: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
    check_len("masks", adv.len(), masks.len())?;
    check_masks(masks)?;
    Ok(adv
        .iter()
        .zip(masks)
        .map(|(&a, m)| m.iter().map(|&m| a * m).collect())
        .collect())
}

/// Token advantages from one advantage per turn (e.g. [`gigpo()`](super::gigpo())):
/// `out[i][t] = turn_adv[i][turn_ids[i][t]]` for policy tokens, 0 where the
/// turn id is −1.
///
/// # Errors
/// [`AlgoError::InvalidTurnId`] for an id below −1 or with no entry in
/// `turn_adv[i]`; length mismatch between the outer slices.
pub fn turns_to_tokens(turn_adv: &[Vec<f32>], turn_ids: &[Vec<i32>]) -> Result<Vec<Vec<f32>>> {
    check_len("turn_ids", turn_adv.len(), turn_ids.len())?;
    turn_ids
        .iter()
        .zip(turn_adv)
        .enumerate()
        .map(|(seq, (ids, adv))| {
            ids.iter()
                .enumerate()
                .map(|(pos, &k)| {
                    if k == -1 {
                        return Ok(0.0);
                    }
                    usize::try_from(k)
                        .ok()
                        .and_then(|k| adv.get(k).copied())
                        .ok_or_else(|| AlgoError::InvalidTurnId {
                            seq,
                            pos,
                            turn_id: k,
                            reason: format!("sequence has {} turn advantages", adv.len()),
                        })
                })
                .collect()
        })
        .collect()
}

/// KL in the reward (verl `use_kl_in_reward`): `r'_t = r_t − β · kl_t` on
/// policy tokens, unchanged (0) elsewhere, where `kl_t` is a per-token
/// estimate from [`crate::kl_penalty`] under the *rollout* log-probs. β = 0
/// returns the rewards unchanged, and the caller can then skip the
/// reference forward pass entirely.
///
/// # Errors
/// Shape or mask errors; [`AlgoError::InvalidParam`] for a non-finite β.
pub fn kl_in_reward(
    token_rewards: &[Vec<f32>],
    kl: &[Vec<f32>],
    masks: &[Vec<f32>],
    coef: f32,
) -> Result<Vec<Vec<f32>>> {
    check_ragged("kl", token_rewards, kl)?;
    check_ragged("masks", token_rewards, masks)?;
    check_masks(masks)?;
    if !coef.is_finite() {
        return Err(AlgoError::InvalidParam {
            name: "kl_coef",
            reason: format!("must be finite, got {coef}"),
        });
    }
    Ok(token_rewards
        .iter()
        .zip(kl)
        .zip(masks)
        .map(|((r, k), m)| {
            r.iter()
                .zip(k)
                .zip(m)
                .map(|((&r, &k), &m)| if m == 1.0 { r - coef * k } else { r })
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_advantage_lands_only_on_policy_tokens() {
        let out = sequence_to_tokens(&[2.0, -1.0], &[vec![0.0, 1.0, 1.0], vec![1.0, 0.0]]).unwrap();
        assert_eq!(out, vec![vec![0.0, 2.0, 2.0], vec![-1.0, 0.0]]);
    }

    #[test]
    fn turn_advantage_maps_by_turn_id() {
        let out = turns_to_tokens(&[vec![0.3, -0.7]], &[vec![-1, 0, 0, -1, 1]]).unwrap();
        assert_eq!(out, vec![vec![0.0, 0.3, 0.3, 0.0, -0.7]]);
        assert!(turns_to_tokens(&[vec![0.3]], &[vec![0, 1]]).is_err());
    }

    #[test]
    fn kl_in_reward_penalises_policy_tokens_only() {
        // β = 0.1: policy tokens r − 0.1·kl: 0 − 0.1·0.5 = −0.05; 1 − 0.1·2 = 0.8
        // the observation token keeps its (zero) reward whatever its kl.
        let out = kl_in_reward(
            &[vec![0.0, 0.0, 1.0]],
            &[vec![0.5, 7.0, 2.0]],
            &[vec![1.0, 0.0, 1.0]],
            0.1,
        )
        .unwrap();
        let want = [-0.05, 0.0, 0.8];
        for (x, y) in out[0].iter().zip(want) {
            assert!((x - y).abs() < 1e-6, "{out:?}");
        }
    }
}
