//! GiGPO: group-in-group advantages (episode level + anchor-state step level).

use std::collections::BTreeMap;

use super::grpo::{grpo, GRPO_EPS};
use super::reinforce::check_unit_interval;
use crate::error::{AlgoError, Result};
use crate::stats::{all_equal, check_len, check_ragged, mean, unbiased_std};

/// GiGPO advantage per step (turn) of each trajectory (Feng et al. 2025,
/// verl-agent):
///
/// ```text
/// A_E(i)     = GRPO advantage of episode_scores[i] within group_ids[i]
/// G(i, t)    = Σ_{k ≥ t} γ^{k−t} · step_rewards[i][k]     (return from step t)
/// step group = all (i, t) with the same group id and the same step_keys[i][t]
///              (an "anchor state" met by several trajectories of one task)
/// A_S(i, t)  = (G(i,t) − mean_S) / (std_S + ε)   or   G(i,t) − mean_S
/// A(i, t)    = A_E(i) + ω · A_S(i, t)
/// ```
///
/// `step_keys[i][t]` identifies the environment state *before* step `t`
/// (e.g. a `stable_hash` of the observation); `step_rewards[i][t]` is the
/// reward of that step, with the outcome on the last step. std is unbiased
/// (n − 1) with ε = [`GRPO_EPS`]; `norm_by_std` selects GRPO or Dr.GRPO
/// scaling at both levels. A singleton step group, or one whose returns are
/// all equal, gets `A_S = 0` (verl-agent keeps a singleton's raw return,
/// which mixes an unbaselined return into the advantage). A state visited
/// twice by one trajectory counts twice in its step group, as in verl-agent.
///
/// # Errors
/// Length mismatches between the inputs, and γ outside [0, 1] or a
/// non-finite ω ([`AlgoError::InvalidParam`]).
pub fn gigpo(
    episode_scores: &[f32],
    group_ids: &[usize],
    step_keys: &[Vec<u64>],
    step_rewards: &[Vec<f32>],
    gamma: f32,
    step_weight: f32,
    norm_by_std: bool,
) -> Result<Vec<Vec<f32>>> {
    check_len("group_ids", episode_scores.len(), group_ids.len())?;
    check_len("step_keys", episode_scores.len(), step_keys.len())?;
    check_ragged("step_rewards", step_keys, step_rewards)?;
    check_unit_interval("gamma", gamma)?;
    if !step_weight.is_finite() {
        return Err(AlgoError::InvalidParam {
            name: "step_weight",
            reason: format!("must be finite, got {step_weight}"),
        });
    }

    let episode_adv = grpo(episode_scores, group_ids, norm_by_std, GRPO_EPS)?;

    // Discounted return from every step.
    let step_returns: Vec<Vec<f64>> = step_rewards
        .iter()
        .map(|rs| {
            let mut out = vec![0.0f64; rs.len()];
            let mut running = 0.0f64;
            for t in (0..rs.len()).rev() {
                running = rs[t] as f64 + gamma as f64 * running;
                out[t] = running;
            }
            out
        })
        .collect();

    // Step groups keyed by (task group, anchor state); BTreeMap keeps the
    // iteration order, and hence float summation order, deterministic.
    let mut step_groups: BTreeMap<(usize, u64), Vec<(usize, usize)>> = BTreeMap::new();
    for (i, keys) in step_keys.iter().enumerate() {
        for (t, &key) in keys.iter().enumerate() {
            step_groups
                .entry((group_ids[i], key))
                .or_default()
                .push((i, t));
        }
    }

    let mut adv: Vec<Vec<f32>> = step_keys
        .iter()
        .enumerate()
        .map(|(i, keys)| vec![episode_adv[i]; keys.len()])
        .collect();
    for members in step_groups.values() {
        let xs: Vec<f64> = members.iter().map(|&(i, t)| step_returns[i][t]).collect();
        if xs.len() < 2 || all_equal(&xs) {
            continue; // A_S = 0
        }
        let mu = mean(&xs);
        let denom = if norm_by_std {
            unbiased_std(&xs) + GRPO_EPS as f64
        } else {
            1.0
        };
        for (&(i, t), &x) in members.iter().zip(&xs) {
            let a_s = (x - mu) / denom;
            adv[i][t] = (episode_adv[i] as f64 + step_weight as f64 * a_s) as f32;
        }
    }
    Ok(adv)
}

#[cfg(test)]
// Hand-computed values such as 0.707106 = 0.5/(0.707107 + ε) are not 1/√2.
#[allow(clippy::approx_constant)]
mod tests {
    use super::*;

    use crate::testing::close_rows as close;

    // Group 0: traj 0 visits states 10 → 20 → 30 and wins (reward 1 on its
    // last step); traj 1 visits 10 → 40 and fails. Both start in anchor
    // state 10. Group 1: traj 2 also starts in a state keyed 10, but belongs
    // to another task, so it must not join group 0's step group.
    type Example = (Vec<f32>, Vec<usize>, Vec<Vec<u64>>, Vec<Vec<f32>>);

    fn example() -> Example {
        (
            vec![1.0, 0.0, 0.5],
            vec![0, 0, 1],
            vec![vec![10, 20, 30], vec![10, 40], vec![10]],
            vec![vec![0.0, 0.0, 1.0], vec![0.0, 0.0], vec![0.5]],
        )
    }

    /// GiGPO on [`example`] with γ = 0.9.
    fn on_example(step_weight: f32, norm_by_std: bool) -> Vec<Vec<f32>> {
        let (s, g, k, r) = example();
        gigpo(&s, &g, &k, &r, 0.9, step_weight, norm_by_std).unwrap()
    }

    #[test]
    fn gigpo_dr_variant_adds_anchor_state_advantage() {
        // Episode level (Dr.GRPO): group 0 [1, 0], mean 0.5 → A_E = +0.5, −0.5;
        //   group 1 singleton → 0.
        // Step returns, γ = 0.9: traj 0: G = 0.81, 0.9, 1.0; traj 1: 0, 0; traj 2: 0.5
        // Step group (0, 10) = {0.81, 0}: mean 0.405 → A_S = +0.405, −0.405;
        //   every other step group is a singleton → A_S = 0.
        // ω = 0.5: traj 0 step 0: 0.5 + 0.5·0.405 = 0.7025; traj 1 step 0: −0.7025
        let a = on_example(0.5, false);
        close(
            &a,
            &[vec![0.7025, 0.5, 0.5], vec![-0.7025, -0.5], vec![0.0]],
            1e-6,
        );
    }

    #[test]
    fn gigpo_std_normalised_both_levels() {
        // A_E: ±0.5 / (std 0.7071068 + 1e-6) = ±0.7071058
        // A_S at state 10: ±0.405 / (std 0.5727565 + 1e-6) = ±0.7071055
        // ω = 1: traj 0 step 0: 1.4142113; traj 1 step 0: −1.4142113
        let a = on_example(1.0, true);
        close(
            &a,
            &[
                vec![1.414211, 0.707106, 0.707106],
                vec![-1.414211, -0.707106],
                vec![0.0],
            ],
            1e-5,
        );
    }

    #[test]
    fn gigpo_rejects_ragged_mismatch() {
        let (s, g, k, mut r) = example();
        r[1].pop();
        assert!(gigpo(&s, &g, &k, &r, 0.9, 1.0, true).is_err());
    }
}
