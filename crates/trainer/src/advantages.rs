//! Per-token advantages for a batch of trajectories, by the configured
//! estimator. Thin glue: the math is in `agentrl_algos`.
//!
//! Every row here is in the *shifted* frame of next-token log-probs (see
//! [`crate::batch`]). Rewards are placed on the last policy token of a turn
//! (or of the trajectory), never on an observation token.

use agentrl_algos::{self as algos, AdvEstimator};
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

/// The rewards the estimators see: the trajectories' own, and with KL in the
/// reward β·KL to the reference taken off every policy token
/// ([`algos::kl_in_reward`]), so that a trajectory's return, a turn's reward
/// and the token rewards all carry the same penalty.
struct Rewards<'a> {
    trajs: &'a [Trajectory],
    masks: &'a [Vec<f32>],
    /// Per-token KL rows and β.
    kl: Option<(&'a [Vec<f32>], f32)>,
}

impl Rewards<'_> {
    /// Per-token rewards: each turn's reward on that turn's last token
    /// (`per_turn`), or the whole return on the trajectory's last policy token.
    fn per_token(&self, per_turn: bool) -> Result<Vec<Vec<f32>>, algos::AlgoError> {
        let rows: Vec<Vec<f32>> = self
            .trajs
            .iter()
            .map(|t| shift(&t.token_rewards(per_turn)))
            .collect();
        match self.kl {
            None => Ok(rows),
            Some((kl, coef)) => algos::kl_in_reward(&rows, kl, self.masks, coef),
        }
    }

    /// The return of each trajectory.
    fn returns(&self) -> Result<Vec<f32>, algos::AlgoError> {
        match self.kl {
            None => Ok(self.trajs.iter().map(Trajectory::score).collect()),
            Some(_) => Ok(self
                .per_token(false)?
                .iter()
                .map(|row| row.iter().sum())
                .collect()),
        }
    }

    /// The reward of each turn of each trajectory.
    fn per_turn(&self) -> Result<Vec<Vec<f32>>, algos::AlgoError> {
        if self.kl.is_none() {
            return Ok(self
                .trajs
                .iter()
                .map(|t| t.turns.iter().map(|x| x.reward()).collect())
                .collect());
        }
        let rows = self.per_token(true)?;
        Ok(self
            .trajs
            .iter()
            .zip(&rows)
            .map(|(t, row)| {
                t.turns
                    .iter()
                    // Token i of the turn sits at entry i − 1 of a shifted row.
                    .map(|x| (x.start.max(1)..x.end).filter_map(|i| row.get(i - 1)).sum())
                    .collect()
            })
            .collect())
    }
}

/// Compute advantages. `values` (the critic's, shifted frame) is required
/// for `gae`; `reference_kl` (per-token KL to the reference) puts
/// `alg.kl_coef ·` KL into the reward.
pub fn compute(
    alg: &AlgorithmSection,
    trajs: &[Trajectory],
    masks: &[Vec<f32>],
    values: Option<&[Vec<f32>]>,
    reference_kl: Option<&[Vec<f32>]>,
) -> Result<Targets, algos::AlgoError> {
    let rewards = Rewards {
        trajs,
        masks,
        kl: reference_kl.map(|k| (k, alg.kl_coef)),
    };
    let groups: Vec<usize> = trajs.iter().map(|t| t.group).collect();
    let mut targets = match alg.adv_estimator {
        AdvEstimator::Grpo | AdvEstimator::Rloo => {
            let scores = rewards.returns()?;
            let a = if alg.adv_estimator == AdvEstimator::Grpo {
                algos::grpo(&scores, &groups, alg.norm_adv_by_std_in_grpo, 1e-6)?
            } else {
                algos::rloo(&scores, &groups)?
            };
            Targets {
                advantages: algos::sequence_to_tokens(&a, masks)?,
                returns: None,
            }
        }
        AdvEstimator::ReinforcePlusPlus => Targets {
            advantages: algos::reinforce_plus_plus(&rewards.per_token(false)?, masks, alg.gamma)?,
            returns: None,
        },
        AdvEstimator::Gae => {
            let values = values.ok_or_else(|| algos::AlgoError::InvalidParam {
                name: "adv_estimator",
                reason: "gae needs critic values (a value head)".into(),
            })?;
            let out = algos::gae(
                &rewards.per_token(true)?,
                values,
                masks,
                alg.gamma,
                alg.lam,
                true,
            )?;
            Targets {
                advantages: out.advantages,
                returns: Some(out.returns),
            }
        }
        AdvEstimator::Gigpo => {
            let keys: Vec<Vec<u64>> = trajs
                .iter()
                .map(|t| t.turns.iter().map(|x| x.state_key).collect())
                .collect();
            let per_turn = algos::gigpo(
                &rewards.returns()?,
                &groups,
                &keys,
                &rewards.per_turn()?,
                alg.gamma,
                alg.gigpo_step_weight,
                alg.norm_adv_by_std_in_grpo,
            )?;
            // Turn ids in the shifted frame, like every other row here.
            let turn_ids: Vec<Vec<i32>> = trajs
                .iter()
                .map(|t| t.turn_ids().into_iter().skip(1).collect())
                .collect();
            Targets {
                advantages: algos::turns_to_tokens(&per_turn, &turn_ids)?,
                returns: None,
            }
        }
    };
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
            observation: String::new(),
            perception: None,
        }
    }

    /// Tokens: 0-1 prompt, 2-3 reply 1 (malformed), 4 observation, 5-6 reply 2.
    fn episode(group: usize, reward: f32) -> Trajectory {
        Trajectory {
            tokens: vec![0; 7],
            loss_mask: vec![0, 0, 1, 1, 0, 1, 1],
            turns: vec![turn(2, 4, 0.0, true), turn(5, 7, reward, false)],
            success: reward > 0.0,
            env_done: true,
            env_steps: 1,
            ..Trajectory::new(TaskSpec::new("t", Split::Train, "easy", 0), group)
        }
    }

    fn masks(trajs: &[Trajectory]) -> Vec<Vec<f32>> {
        trajs.iter().map(crate::batch::shifted_mask).collect()
    }

    #[test]
    fn a_successful_episode_does_not_reinforce_its_malformed_turn() {
        // Group of two scoring 0.9 and -0.1: GRPO gives one positive and one
        // negative advantage; only the signs matter here.
        let trajs = vec![episode(0, 1.0), episode(0, 0.0)];
        let masks = masks(&trajs);
        let alg = AlgorithmSection::default();
        let t = compute(&alg, &trajs, &masks, None, None).unwrap();
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
        let t = compute(&credit, &trajs, &masks, None, None).unwrap();
        assert!(t.advantages[0][1] > 0.0);
    }

    #[test]
    fn kl_in_the_reward_charges_returns_turns_and_tokens_alike() {
        // Score 0.9 (−0.1 format penalty, +1 at the end); KL 0.5 on every
        // shifted entry, β = 0.1: each of the 4 policy tokens costs 0.05,
        // the observation and prompt entries nothing.
        let trajs = vec![episode(0, 1.0)];
        let masks = masks(&trajs);
        let kl = vec![vec![0.5; 6]];
        let rewards = Rewards {
            trajs: &trajs,
            masks: &masks,
            kl: Some((&kl, 0.1)),
        };
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        let returns = rewards.returns().unwrap();
        assert!(close(returns[0], 0.7), "{returns:?}");
        let turns = rewards.per_turn().unwrap();
        assert!(
            close(turns[0][0], -0.2) && close(turns[0][1], 0.9),
            "{turns:?}"
        );
        let tokens = rewards.per_token(false).unwrap();
        assert!(close(tokens[0].iter().sum(), returns[0]));
        assert_eq!(tokens[0][3], 0.0, "the observation token is not charged");
        // Without KL the trajectory's own rewards pass through untouched.
        let plain = Rewards {
            kl: None,
            ..rewards
        };
        assert_eq!(plain.returns().unwrap(), vec![trajs[0].score()]);
    }
}
