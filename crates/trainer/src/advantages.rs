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
    Ok(targets)
}
