//! GRPO and Dr.GRPO group-relative advantages.

use crate::error::Result;
use crate::stats::{all_equal, check_len, group_members, mean, unbiased_std};

/// verl's default ε in the GRPO denominator.
pub const GRPO_EPS: f32 = 1e-6;

/// GRPO advantage per trajectory:
///
/// ```text
/// A_i = (R_i − mean_g) / (std_g + ε)      norm_by_std = true  (GRPO)
/// A_i =  R_i − mean_g                     norm_by_std = false (Dr.GRPO)
/// ```
///
/// where `g = group_ids[i]` and mean/std are over the group's scores. std is
/// the unbiased (n − 1) estimate, verl's `torch.std` convention.
///
/// Differences from verl, on purpose:
/// - a group of size 1 gets advantage 0 (verl uses mean 0, std 1, which
///   turns a lone sample's raw score into its advantage);
/// - a group whose scores are all equal gets exactly 0 (not a rounding
///   residue of `R − mean`), so such groups carry no gradient at all.
///
/// # Errors
/// [`crate::AlgoError::LengthMismatch`] if the slices differ in length,
/// [`crate::AlgoError::InvalidParam`] if `eps` is negative or not finite.
pub fn grpo(scores: &[f32], group_ids: &[usize], norm_by_std: bool, eps: f32) -> Result<Vec<f32>> {
    check_len("group_ids", scores.len(), group_ids.len())?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(crate::AlgoError::InvalidParam {
            name: "eps",
            reason: format!("must be finite and >= 0, got {eps}"),
        });
    }
    let mut adv = vec![0.0f32; scores.len()];
    for members in group_members(group_ids).values() {
        let xs: Vec<f64> = members.iter().map(|&i| scores[i] as f64).collect();
        if xs.len() < 2 || all_equal(&xs) {
            continue; // stays 0
        }
        let mu = mean(&xs);
        let denom = if norm_by_std {
            unbiased_std(&xs) + eps as f64
        } else {
            1.0
        };
        for (&i, &x) in members.iter().zip(&xs) {
            adv[i] = ((x - mu) / denom) as f32;
        }
    }
    Ok(adv)
}

#[cfg(test)]
// Hand-computed values such as 0.707106 = 1/(1.414214 + ε) are not 1/√2.
#[allow(clippy::approx_constant)]
mod tests {
    use super::*;

    use crate::testing::close;

    #[test]
    fn grpo_zero_advantage_when_rewards_equal() {
        // 0.1 is not exactly representable; R − mean could leave a residue.
        let adv = grpo(&[0.1, 0.1, 0.1, 0.7, 0.7], &[0, 0, 0, 1, 1], true, GRPO_EPS).unwrap();
        assert_eq!(adv, vec![0.0; 5]);
        let adv = grpo(&[0.1, 0.1, 0.1], &[3, 3, 3], false, GRPO_EPS).unwrap();
        assert_eq!(adv, vec![0.0; 3]);
    }

    #[test]
    fn grpo_and_dr_grpo_values_on_two_groups() {
        // group 0: [1, 0, 0, 1]  mean 0.5, deviations ±0.5
        //   unbiased var = (4 × 0.25) / 3 = 1/3, std = 0.577350
        //   GRPO   A = ±0.5 / (0.577350 + 1e-6) = ±0.866024
        //   DrGRPO A = ±0.5
        // group 1: [2, 0, 1]  mean 1, deviations (1, −1, 0)
        //   unbiased var = 2 / 2 = 1, std = 1
        //   GRPO   A = (1, −1, 0) / 1.000001 = (0.999999, −0.999999, 0)
        //   DrGRPO A = (1, −1, 0)
        // interleaved ids check that grouping is by id, not by position.
        let scores = [1.0, 2.0, 0.0, 0.0, 0.0, 1.0, 1.0];
        let ids = [0, 1, 0, 1, 0, 1, 0];
        let a = grpo(&scores, &ids, true, GRPO_EPS).unwrap();
        close(
            &a,
            &[
                0.866024, 0.999999, -0.866024, -0.999999, -0.866024, 0.0, 0.866024,
            ],
            1e-5,
        );
        let d = grpo(&scores, &ids, false, GRPO_EPS).unwrap();
        close(&d, &[0.5, 1.0, -0.5, -1.0, -0.5, 0.0, 0.5], 1e-6);
    }

    #[test]
    fn grpo_singleton_group_gets_zero() {
        let a = grpo(&[5.0, 1.0, 3.0], &[7, 8, 8], true, GRPO_EPS).unwrap();
        // group 8: [1, 3] mean 2, std sqrt(2) → ∓1/1.414215 = ∓0.707106
        close(&a, &[0.0, -0.707106, 0.707106], 1e-5);
    }

    #[test]
    fn grpo_rejects_length_mismatch() {
        assert!(grpo(&[1.0, 2.0], &[0], true, GRPO_EPS).is_err());
    }
}
