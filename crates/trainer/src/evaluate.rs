//! Evaluation of an actor (a model, the expert, random play) on fixed
//! held-out tasks: success, reward, turns, tokens, invalid actions.

use std::ops::Range;

use agentrl_env_core::{Env, EnvError, EnvParams, Split, TaskSpec};
pub use agentrl_rollout::EvalStats;
use agentrl_rollout::{play_episodes, Actor, ChatCodec, RolloutConfig, RolloutError, Trajectory};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Builds environments for specs (in-process or remote).
pub type EnvMaker<'a> = dyn Fn(&TaskSpec, &EnvParams) -> Result<Box<dyn Env>, EnvError> + 'a;

/// The tasks an evaluation plays, and how.
pub struct EvalPlan<'a> {
    /// Makes each task's environment.
    pub make: &'a EnvMaker<'a>,
    pub env: &'a str,
    pub difficulty: &'a str,
    pub params: &'a EnvParams,
    pub split: Split,
    /// Task indices inside the split.
    pub seeds: Range<u64>,
    /// Plays of each task (a group of that many episodes; 1 for a plain
    /// success rate, k for avg@k / pass@k).
    pub samples: usize,
    /// Plays conversations in this codec (a model actor); `None` plays
    /// without text (scripted actors).
    pub codec: Option<&'a dyn ChatCodec>,
    /// Turn budget and reply format; `n × env_groups` episodes play at once.
    pub rollout: &'a RolloutConfig,
    /// Seed of the sampling stream shared by each batch.
    pub seed: u64,
}

/// Play every task of `plan` `plan.samples` times with `actor`; the
/// trajectories of task `seeds.start + i` are in group `i`.
pub fn evaluate(
    actor: &mut dyn Actor,
    plan: &EvalPlan<'_>,
) -> Result<(EvalStats, Vec<Trajectory>), EvalError> {
    if plan.seeds.is_empty() {
        return Err(EvalError::NoTasks);
    }
    if plan.samples == 0 {
        return Err(EvalError::NoSamples);
    }
    let batch = (plan.rollout.n * plan.rollout.env_groups).max(1);
    // Whole groups per batch: at least one task, all its samples together.
    let tasks_per_batch = (batch / plan.samples).max(1) as u64;
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed);
    let mut all = Vec::new();
    let mut start = plan.seeds.start;
    while start < plan.seeds.end {
        let end = start.saturating_add(tasks_per_batch).min(plan.seeds.end);
        let mut envs = Vec::new();
        let mut groups = Vec::new();
        for s in start..end {
            let spec = TaskSpec::new(plan.env, plan.split, plan.difficulty, s);
            for _ in 0..plan.samples {
                envs.push((plan.make)(&spec, plan.params)?);
                groups.push((s - plan.seeds.start) as usize);
            }
        }
        all.extend(play_episodes(
            actor,
            plan.codec,
            &mut envs,
            &groups,
            plan.rollout,
            &mut rng,
        )?);
        start = end;
    }
    Ok((EvalStats::of(&all), all))
}

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    /// The plan's seed range is empty: figures over no task would be zeros.
    #[error("no tasks to evaluate (the seed range is empty)")]
    NoTasks,
    /// Zero plays per task.
    #[error("no samples per task to evaluate")]
    NoSamples,
}
