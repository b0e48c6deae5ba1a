//! Per-token advantages for a batch of trajectories, by the configured
//! estimator. Thin glue: the math is in `agentrl_algos`.
//!
//! Every row here is in the *shifted* frame of next-token log-probs: entry `t`
//! belongs to token `t + 1` of the trajectory (the token predicted from the
//! prefix ending at `t`), which is also where the critic's value `V(prefix_t)`
//! lives. Rewards are placed on the last policy token of a turn (or of the
//! trajectory), never on an observation token.

use agentrl_algos as algos;
use agentrl_rollout::Trajectory;

use crate::batch::shift;
use crate::config::AlgorithmSection;

/// What the policy (and critic) train on.
pub struct Targets {
    /// Advantage per shifted position (0 off the loss mask).
    pub advantages: Vec<Vec<f32>>,
    /// Value targets per shifted position (GAE only).
    pub returns: Option<Vec<Vec<f32>>>,
}

/// Loss mask rows in the shifted frame.
pub fn shifted_masks(trajs: &[Trajectory]) -> Vec<Vec<f32>> {
    trajs
        .iter()
        .map(|t| t.loss_mask.iter().skip(1).map(|&m| m as f32).collect())
        .collect()
}

/// Compute advantages. `values` (shifted frame) is required for `gae`.
pub fn compute(
    alg: &AlgorithmSection,
    trajs: &[Trajectory],
    values: Option<&[Vec<f32>]>,
) -> Result<Targets, algos::AlgoError> {
    let masks = shifted_masks(trajs);
    let groups: Vec<usize> = trajs.iter().map(|t| t.group).collect();
    let scores: Vec<f32> = trajs.iter().map(Trajectory::score).collect();
    let targets = match alg.adv_estimator.as_str() {
        "grpo" => {
            let a = algos::grpo(&scores, &groups, alg.norm_adv_by_std_in_grpo, 1e-6)?;
            Targets {
                advantages: algos::sequence_to_tokens(&a, &masks)?,
                returns: None,
            }
        }
        "rloo" => {
            let a = algos::rloo(&scores, &groups)?;
            Targets {
                advantages: algos::sequence_to_tokens(&a, &masks)?,
                returns: None,
            }
        }
        "reinforce_plus_plus" => {
            let rewards: Vec<Vec<f32>> = trajs
                .iter()
                .map(|t| shift(&t.token_rewards(false)))
                .collect();
            let a = algos::reinforce_plus_plus(&rewards, &masks, alg.gamma)?;
            Targets {
                advantages: a,
                returns: None,
            }
        }
        "gae" => {
            let rewards: Vec<Vec<f32>> = trajs
                .iter()
                .map(|t| shift(&t.token_rewards(true)))
                .collect();
            let values = values.ok_or_else(|| algos::AlgoError::InvalidParam {
                name: "adv_estimator",
                reason: "gae needs critic values (a value head)".into(),
            })?;
            let out = algos::gae(&rewards, values, &masks, alg.gamma, alg.lam, true)?;
            Targets {
                advantages: out.advantages,
                returns: Some(out.returns),
            }
        }
        "gigpo" => {
            let keys: Vec<Vec<u64>> = trajs
                .iter()
                .map(|t| t.turns.iter().map(|x| x.state_key).collect())
                .collect();
            let step_rewards: Vec<Vec<f32>> = trajs
                .iter()
                .map(|t| t.turns.iter().map(|x| x.reward()).collect())
                .collect();
            let per_turn = algos::gigpo(
                &scores,
                &groups,
                &keys,
                &step_rewards,
                alg.gamma,
                alg.gigpo_step_weight,
                alg.norm_adv_by_std_in_grpo,
            )?;
            // Turn ids in the shifted frame, like every other row here.
            let turn_ids: Vec<Vec<i32>> = trajs
                .iter()
                .map(|t| t.turn_ids().into_iter().skip(1).collect())
                .collect();
            let advantages = algos::turns_to_tokens(&per_turn, &turn_ids)?;
            Targets {
                advantages,
                returns: None,
            }
        }
        other => {
            return Err(algos::AlgoError::InvalidParam {
                name: "adv_estimator",
                reason: format!("unknown estimator '{other}'"),
            });
        }
    };
    let mut targets = targets;
    if !alg.credit_malformed_turns {
        no_credit_for_malformed_turns(trajs, &mut targets.advantages);
    }
    Ok(targets)
}

/// Clamp the advantage of every token of an unparseable reply to at most 0:
/// an episode that succeeded despite a malformed turn must not teach the
/// malformed turn. Rows are in the shifted frame (entry `i - 1` is token `i`).
pub fn no_credit_for_malformed_turns(trajs: &[Trajectory], advantages: &mut [Vec<f32>]) {
    for (t, row) in trajs.iter().zip(advantages.iter_mut()) {
        for turn in t.turns.iter().filter(|x| x.format_error) {
            for i in turn.start.max(1)..turn.end {
                if let Some(a) = row.get_mut(i - 1) {
                    *a = a.min(0.0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::{Split, TaskSpec};
    use agentrl_rollout::Turn;

    fn turn(start: usize, end: usize, reward: f32, format_error: bool) -> Turn {
        Turn {
            start,
            end,
            reply: String::new(),
            actions: vec![],
            env_reward: reward,
            penalty: if format_error { -0.1 } else { 0.0 },
            format_error,
            invalid_actions: 0,
            state_key: 0,
        }
    }

    /// Tokens: 0-1 prompt, 2-3 reply 1 (malformed), 4 observation, 5-6 reply 2.
    fn episode(group: usize, reward: f32) -> Trajectory {
        Trajectory {
            spec: TaskSpec::new("t", Split::Train, "easy", 0),
            group,
            tokens: vec![0; 7],
            loss_mask: vec![0, 0, 1, 1, 0, 1, 1],
            sample_logprobs: vec![0.0; 7],
            turns: vec![turn(2, 4, 0.0, true), turn(5, 7, reward, false)],
            success: reward > 0.0,
            env_done: true,
            truncated: false,
            env_steps: 1,
        }
    }

    #[test]
    fn a_successful_episode_does_not_reinforce_its_malformed_turn() {
        // Group of two scoring 0.9 and -0.1: GRPO gives one positive and one
        // negative advantage; only the signs matter here.
        let trajs = vec![episode(0, 1.0), episode(0, 0.0)];
        let alg = AlgorithmSection::default();
        let t = compute(&alg, &trajs, None).unwrap();
        let (good, bad) = (&t.advantages[0], &t.advantages[1]);
        // Shifted frame: reply 1 = entries 1, 2; reply 2 = entries 4, 5.
        assert_eq!(&good[1..3], &[0.0, 0.0], "malformed turn got credit");
        assert!(good[4] > 0.0 && good[5] > 0.0);
        assert!(bad[1] < 0.0 && bad[2] < 0.0, "blame still reaches it");
        assert!(bad[4] < 0.0);
        assert_eq!(good[0], 0.0);
        assert_eq!(good[3], 0.0, "observation token");

        let credit = AlgorithmSection {
            credit_malformed_turns: true,
            ..AlgorithmSection::default()
        };
        let t = compute(&credit, &trajs, None).unwrap();
        assert!(t.advantages[0][1] > 0.0);
    }
}
