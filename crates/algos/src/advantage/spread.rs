//! Spreading trajectory- or turn-level advantages onto tokens.

use crate::error::{AlgoError, Result};
use crate::stats::{check_len, check_masks};

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

/// Token advantages from one advantage per turn (e.g. [`super::gigpo`]):
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
}
