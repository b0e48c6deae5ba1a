//! The evaluation matrix: one policy on every (environment, difficulty)
//! cell, each task of the held-out split played `samples` times, with
//! avg@k / pass@k and their intervals, turns, tokens, invalid-action and
//! format-error rates, and the failure labels of the unsuccessful plays.

use std::ops::Range;

use agentrl_env_core::{EnvError, EnvParams, Split};
use agentrl_rollout::{
    ExpertActor, FailureCounts, PolicyActor, RandomActor, RolloutConfig, SamplingParams, Trajectory,
};
use serde::{Deserialize, Serialize};

use crate::evaluate::{evaluate, EnvMaker, EvalError, EvalPlan, EvalStats};
use crate::local_policy::LocalPolicy;
use crate::pass_at_k::{avg_at_k, pass_at_k, Estimate, EstimateError, TaskOutcomes};
use crate::policy_dir::TrainedPolicy;

/// Episodes a model plays at once in an evaluation (whole tasks: every
/// sample of a task in the same batch).
pub const EVAL_BATCH: usize = 64;

/// Who plays the matrix.
pub enum Player<'a> {
    /// The environment's expert solver (deterministic: its k samples agree).
    Expert,
    /// A uniformly random valid action a turn; each sample of a task draws
    /// from its own stream.
    Random { seed: u64 },
    /// A trained model, sampling at `temperature` (0 = greedy), under the
    /// rollout settings it was trained with.
    Model {
        policy: &'a TrainedPolicy,
        temperature: f64,
    },
}

/// One column of the matrix: an environment at a difficulty, with its params.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub env: String,
    pub difficulty: String,
    pub params: EnvParams,
}

/// The tasks every cell plays and how the figures are taken.
pub struct MatrixPlan<'a> {
    /// Makes the environments of a cell (in-process or on a server).
    pub make: &'a EnvMaker<'a>,
    pub split: Split,
    /// Task indices inside the split (the same in every cell).
    pub seeds: Range<u64>,
    /// Plays of each task (n of the pass@k estimator; at least `k`).
    pub samples: usize,
    /// The k of avg@k and pass@k.
    pub k: usize,
    /// Seed of the sampling streams.
    pub seed: u64,
}

/// The figures of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellFigures {
    pub env: String,
    pub difficulty: String,
    pub split: String,
    /// Tasks played.
    pub tasks: usize,
    /// Plays of each task.
    pub samples: usize,
    pub k: usize,
    /// Mean success of one play, over tasks (avg@k), with its 95% interval.
    pub avg_at_k: Estimate,
    /// Unbiased pass@k over tasks, with its 95% interval.
    pub pass_at_k: Estimate,
    pub mean_reward: f64,
    pub mean_turns: f64,
    pub mean_generated_tokens: f64,
    /// Invalid actions per turn.
    pub invalid_action_rate: f64,
    /// Unparseable replies per turn.
    pub format_error_rate: f64,
    /// Failure labels of the unsuccessful plays.
    pub failures: FailureCounts,
}

/// What the matrix's intervals are, for reports.
pub const INTERVAL_METHOD: &str =
    "95% Student-t interval over per-task values (tasks are the independent units)";

/// Why a cell could not be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("{cell}: {source}")]
    Estimate { cell: String, source: EstimateError },
}

/// Play `cell` with `player` as `plan` says and take its figures; also
/// returns the trajectories (grouped by task: group `i` is task
/// `seeds.start + i`).
pub fn evaluate_cell(
    player: &Player<'_>,
    cell: &Cell,
    plan: &MatrixPlan<'_>,
) -> Result<(CellFigures, Vec<Trajectory>), MatrixError> {
    let scripted = RolloutConfig::scripted();
    let base = EvalPlan {
        make: plan.make,
        env: &cell.env,
        difficulty: &cell.difficulty,
        params: &cell.params,
        split: plan.split,
        seeds: plan.seeds.clone(),
        samples: plan.samples,
        codec: None,
        rollout: &scripted,
        seed: plan.seed,
    };
    let (stats, trajs, max_turns) = match player {
        Player::Expert => {
            let (s, t) = evaluate(&mut ExpertActor::new(1, 0.0), &base)?;
            (s, t, scripted.max_turns)
        }
        Player::Random { seed } => {
            let (s, t) = evaluate(&mut RandomActor::new(*seed), &base)?;
            (s, t, scripted.max_turns)
        }
        Player::Model {
            policy,
            temperature,
        } => {
            let rollout = RolloutConfig {
                n: 1,
                env_groups: EVAL_BATCH,
                ..policy.rollout.clone()
            };
            let sampling = SamplingParams {
                temperature: *temperature,
                ..rollout.sampling(policy.tokenizer.im_end_id())
            };
            let mut local = LocalPolicy::with_cache_reuse(&policy.model, rollout.kv_cache_reuse);
            let plan = EvalPlan {
                codec: Some(&policy.tokenizer),
                rollout: &rollout,
                ..base
            };
            let (s, t) = evaluate(&mut PolicyActor::new(&mut local, sampling), &plan)?;
            (s, t, rollout.max_turns)
        }
    };
    let figures = cell_figures(cell, plan, &stats, &trajs, max_turns)?;
    Ok((figures, trajs))
}

/// The figures of a cell's trajectories (`stats` their [`EvalStats`]).
pub fn cell_figures(
    cell: &Cell,
    plan: &MatrixPlan<'_>,
    stats: &EvalStats,
    trajs: &[Trajectory],
    max_turns: usize,
) -> Result<CellFigures, MatrixError> {
    let outcomes = task_outcomes(trajs);
    let named = |source| MatrixError::Estimate {
        cell: format!("{}/{}", cell.env, cell.difficulty),
        source,
    };
    let mut failures = FailureCounts::default();
    failures.add(trajs, max_turns);
    Ok(CellFigures {
        env: cell.env.clone(),
        difficulty: cell.difficulty.clone(),
        split: plan.split.to_string(),
        tasks: outcomes.len(),
        samples: plan.samples,
        k: plan.k,
        avg_at_k: avg_at_k(&outcomes).map_err(named)?,
        pass_at_k: pass_at_k(&outcomes, plan.k).map_err(named)?,
        mean_reward: stats.mean_reward,
        mean_turns: stats.mean_turns,
        mean_generated_tokens: stats.mean_generated_tokens,
        invalid_action_rate: stats.invalid_action_rate,
        format_error_rate: stats.format_error_rate,
        failures,
    })
}

/// Plays and successes of each group, in group order.
pub fn task_outcomes(trajs: &[Trajectory]) -> Vec<TaskOutcomes> {
    let mut by_group = std::collections::BTreeMap::<usize, TaskOutcomes>::new();
    for t in trajs {
        let o = by_group.entry(t.group).or_insert(TaskOutcomes {
            samples: 0,
            successes: 0,
        });
        o.samples += 1;
        o.successes += usize::from(t.success);
    }
    by_group.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::TaskSpec;

    fn make(
        spec: &TaskSpec,
        params: &EnvParams,
    ) -> Result<Box<dyn agentrl_env_core::Env>, EnvError> {
        agentrl_envs::make_env(spec, params)
    }

    fn plan<'a>(make: &'a EnvMaker<'a>, samples: usize, k: usize) -> MatrixPlan<'a> {
        MatrixPlan {
            make,
            split: Split::Val,
            seeds: 0..6,
            samples,
            k,
            seed: 0,
        }
    }

    fn frozenlake() -> Cell {
        let mut params = EnvParams::new();
        params.insert("is_slippery".into(), false.into());
        Cell {
            env: "frozenlake".into(),
            difficulty: "easy".into(),
            params,
        }
    }

    #[test]
    fn the_expert_solves_every_task_every_time() {
        let (f, trajs) = evaluate_cell(&Player::Expert, &frozenlake(), &plan(&make, 3, 2)).unwrap();
        assert_eq!((f.tasks, f.samples, trajs.len()), (6, 3, 18));
        assert_eq!(f.avg_at_k.mean, 1.0);
        assert_eq!(f.pass_at_k.mean, 1.0);
        // Every task solved: the exact interval of 6 of 6, [0.025^(1/6), 1].
        assert_eq!(f.avg_at_k.ci95, Some([0.025f64.powf(1.0 / 6.0), 1.0]));
        assert_eq!((f.failures.episodes, f.failures.failed), (18, 0));
        // Three plays of each task, grouped by task.
        for (i, t) in trajs.iter().enumerate() {
            assert_eq!(t.group, i / 3);
            assert_eq!(t.spec.seed, (i / 3) as u64);
        }
    }

    #[test]
    fn random_samples_of_a_task_differ_and_figures_agree_with_the_counts() {
        let p = plan(&make, 8, 8);
        let (f, trajs) = evaluate_cell(&Player::Random { seed: 1 }, &frozenlake(), &p).unwrap();
        // Each sample of a task has its own stream: the plays of one task
        // are not all the same.
        let first: Vec<&Trajectory> = trajs.iter().filter(|t| t.group == 0).collect();
        assert!(first.iter().any(|t| t.turns != first[0].turns));
        let outcomes = task_outcomes(&trajs);
        let avg: f64 = outcomes
            .iter()
            .map(|o| o.successes as f64 / 8.0)
            .sum::<f64>()
            / 6.0;
        assert!((f.avg_at_k.mean - avg).abs() < 1e-12);
        let any: f64 = outcomes.iter().filter(|o| o.successes > 0).count() as f64 / 6.0;
        assert!(
            (f.pass_at_k.mean - any).abs() < 1e-12,
            "n == k: any success"
        );
        assert!(f.pass_at_k.mean >= f.avg_at_k.mean);
        let failed = trajs.iter().filter(|t| !t.success).count();
        assert_eq!(f.failures.failed, failed);
        // The same plan plays the same figures.
        let (again, _) = evaluate_cell(&Player::Random { seed: 1 }, &frozenlake(), &p).unwrap();
        assert_eq!(f, again);
    }

    #[test]
    fn too_few_samples_for_k_is_an_error_naming_the_cell() {
        let e = evaluate_cell(&Player::Expert, &frozenlake(), &plan(&make, 2, 4))
            .unwrap_err()
            .to_string();
        assert!(e.contains("frozenlake/easy") && e.contains("pass@4"), "{e}");
    }
}
