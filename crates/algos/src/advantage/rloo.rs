//! RLOO: REINFORCE with a leave-one-out baseline.

use crate::error::Result;
use crate::stats::{all_equal, check_len, group_members};

/// RLOO advantage per trajectory (Ahmadian et al. 2024, verl's `rloo`):
///
/// ```text
/// A_i = R_i − (1 / (n − 1)) · Σ_{j ∈ g, j ≠ i} R_j  =  n / (n − 1) · (R_i − mean_g)
/// ```
///
/// A group of size 1 has no "others" and gets 0 (verl leaves the raw score);
/// a group of equal scores gets exactly 0.
///
/// # Errors
/// [`crate::AlgoError::LengthMismatch`] if the slices differ in length.
pub fn rloo(scores: &[f32], group_ids: &[usize]) -> Result<Vec<f32>> {
    check_len("group_ids", scores.len(), group_ids.len())?;
    let mut adv = vec![0.0f32; scores.len()];
    for members in group_members(group_ids).values() {
        let xs: Vec<f64> = members.iter().map(|&i| scores[i] as f64).collect();
        if xs.len() < 2 || all_equal(&xs) {
            continue;
        }
        let total: f64 = xs.iter().sum();
        let others = (xs.len() - 1) as f64;
        for (&i, &x) in members.iter().zip(&xs) {
            adv[i] = (x - (total - x) / others) as f32;
        }
    }
    Ok(adv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rloo_leave_one_out_on_group_of_three() {
        // group [1, 0, 0.5]:
        //   A_0 = 1   − (0 + 0.5)/2 =  0.75
        //   A_1 = 0   − (1 + 0.5)/2 = −0.75
        //   A_2 = 0.5 − (1 + 0)/2   =  0
        // singleton group 9 → 0
        let a = rloo(&[1.0, 0.0, 0.5, 4.0], &[2, 2, 2, 9]).unwrap();
        let want = [0.75, -0.75, 0.0, 0.0];
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-6, "{a:?}");
        }
    }

    #[test]
    fn rloo_zero_when_rewards_equal() {
        assert_eq!(rloo(&[0.3, 0.3, 0.3], &[0, 0, 0]).unwrap(), vec![0.0; 3]);
    }
}
