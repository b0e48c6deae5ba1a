//! Evaluation of a policy on fixed held-out tasks: success, reward, turns,
//! tokens, invalid actions.

use agentrl_env_core::{Env, EnvError, EnvParams, Split, TaskSpec};
use agentrl_rollout::{run_rollouts, ChatCodec, Policy, RolloutConfig, RolloutError, Trajectory};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Aggregate figures over a set of trajectories.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalStats {
    pub n: usize,
    pub success_rate: f64,
    pub mean_reward: f64,
    pub mean_turns: f64,
    pub mean_env_steps: f64,
    pub mean_generated_tokens: f64,
    /// Invalid actions per policy turn.
    pub invalid_action_rate: f64,
    /// Unparseable replies per policy turn.
    pub format_error_rate: f64,
}

impl EvalStats {
    pub fn of(trajs: &[Trajectory]) -> Self {
        let n = trajs.len();
        if n == 0 {
            return Self::default();
        }
        let nf = n as f64;
        let turns: usize = trajs.iter().map(|t| t.turns.len()).sum();
        let per_turn = |x: usize| {
            if turns == 0 {
                0.0
            } else {
                x as f64 / turns as f64
            }
        };
        Self {
            n,
            success_rate: trajs.iter().filter(|t| t.success).count() as f64 / nf,
            mean_reward: trajs.iter().map(|t| t.score() as f64).sum::<f64>() / nf,
            mean_turns: turns as f64 / nf,
            mean_env_steps: trajs.iter().map(|t| t.env_steps as f64).sum::<f64>() / nf,
            mean_generated_tokens: trajs
                .iter()
                .map(|t| t.generated_tokens() as f64)
                .sum::<f64>()
                / nf,
            invalid_action_rate: per_turn(trajs.iter().map(|t| t.invalid_actions()).sum()),
            format_error_rate: per_turn(trajs.iter().map(|t| t.format_errors()).sum()),
        }
    }
}

/// Builds environments for specs (in-process or remote).
pub type EnvMaker<'a> = dyn Fn(&TaskSpec, &EnvParams) -> Result<Box<dyn Env>, EnvError> + 'a;

/// Play the tasks with seeds `seeds` of `split` once each, in batches of
/// `rollout.n × rollout.env_groups`, with the given sampling temperature
/// (0 = greedy).
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    policy: &mut dyn Policy,
    codec: &dyn ChatCodec,
    make: &EnvMaker<'_>,
    env: &str,
    difficulty: &str,
    params: &EnvParams,
    split: Split,
    seeds: std::ops::Range<u64>,
    rollout: &RolloutConfig,
    temperature: f64,
    seed: u64,
) -> Result<(EvalStats, Vec<Trajectory>), EvalError> {
    let cfg = RolloutConfig {
        temperature,
        ..rollout.clone()
    };
    let batch = (rollout.n * rollout.env_groups).max(1);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut all = Vec::new();
    let mut start = seeds.start;
    while start < seeds.end {
        let end = start.saturating_add(batch as u64).min(seeds.end);
        let mut envs = Vec::new();
        let mut groups = Vec::new();
        for s in start..end {
            let spec = TaskSpec::new(env, split, difficulty, s);
            envs.push(make(&spec, params)?);
            groups.push((s - seeds.start) as usize);
        }
        all.extend(run_rollouts(policy, codec, envs, &groups, &cfg, &mut rng)?);
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
}
