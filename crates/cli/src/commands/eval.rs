//! `agentrl eval`: run a policy on N tasks of one environment and report
//! success rate, mean reward and mean steps.

use std::path::PathBuf;
use std::str::FromStr;

use agentrl_env_core::{stable_hash, Env, StepError, TaskSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::play::{make_spec, parse_params};

/// Which policy acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyKind {
    /// The environment's expert solver.
    Expert,
    /// A uniformly random choice among the currently available actions.
    Random,
    /// A trained model directory.
    Model(PathBuf),
}

impl FromStr for PolicyKind {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "expert" => PolicyKind::Expert,
            "random" => PolicyKind::Random,
            path => PolicyKind::Model(PathBuf::from(path)),
        })
    }
}

/// Arguments of `agentrl eval`.
#[derive(clap::Args)]
pub struct EvalArgs {
    /// `expert`, `random`, a run directory (its latest checkpoint) or a model directory.
    #[arg(long, default_value = "expert")]
    policy: String,
    /// Environment name (see `agentrl envs`).
    #[arg(long)]
    env: String,
    /// Difficulty level (default: the environment's first).
    #[arg(long)]
    difficulty: Option<String>,
    /// Seed split: train, val or test.
    #[arg(long, default_value = "val")]
    split: String,
    /// Number of tasks.
    #[arg(long, default_value_t = 100)]
    n: u64,
    /// First task index; tasks are seed-start .. seed-start + n of the split.
    #[arg(long, default_value_t = 0)]
    seed_start: u64,
    /// Seed of the random policy's choices.
    #[arg(long, default_value_t = 0)]
    policy_seed: u64,
    /// Environment parameter as KEY=VALUE (JSON value); repeatable.
    #[arg(long = "param", value_name = "KEY=VALUE")]
    params: Vec<String>,
    /// Sampling temperature of a model policy (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// One finished (or abandoned) episode.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeResult {
    pub seed: u64,
    pub success: bool,
    pub reward: f64,
    pub steps: usize,
    pub invalid_actions: usize,
}

/// Aggregate over the tasks.
#[derive(Debug, Clone, Serialize)]
pub struct EvalSummary {
    pub env: String,
    pub difficulty: String,
    pub split: String,
    pub policy: String,
    pub n: usize,
    pub success_rate: f64,
    pub mean_reward: f64,
    pub mean_steps: f64,
    pub invalid_action_rate: f64,
}

/// Something that picks the next action text for an env, or gives up (`None`).
type Chooser<'a> = Box<dyn FnMut(&mut dyn Env) -> Option<String> + 'a>;

/// Play one episode with `choose`. Invalid actions are counted and play goes
/// on; a bound on attempts guards against a policy that never acts validly.
pub fn run_episode(env: &mut dyn Env, choose: &mut Chooser<'_>) -> EpisodeResult {
    env.reset();
    let mut reward = 0.0;
    let attempts_cap = env.max_steps().saturating_mul(4).saturating_add(16);
    let mut attempts = 0;
    while !env.is_done() && attempts < attempts_cap {
        attempts += 1;
        let Some(action) = choose(env) else { break };
        match env.step(&action) {
            Ok(step) => reward += step.reward,
            Err(StepError::InvalidAction(_)) => {}
            Err(StepError::EpisodeOver) => break,
        }
    }
    EpisodeResult {
        seed: env.spec().seed,
        success: env.is_success(),
        reward,
        steps: env.steps(),
        invalid_actions: env.invalid_actions(),
    }
}

/// The action chooser of a policy for the task `spec`.
fn chooser(
    kind: &PolicyKind,
    policy_seed: u64,
    spec: &TaskSpec,
) -> anyhow::Result<Chooser<'static>> {
    match kind {
        PolicyKind::Expert => Ok(Box::new(|env: &mut dyn Env| env.expert_action())),
        PolicyKind::Random => {
            // One stream per task, so a task's random play does not depend on
            // which other tasks ran before it.
            let abs = spec.absolute_seed()?;
            let seed = stable_hash(&[
                b"random-policy",
                &policy_seed.to_le_bytes(),
                &abs.to_le_bytes(),
            ]);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            Ok(Box::new(move |env: &mut dyn Env| {
                let actions = env.available_actions();
                if actions.is_empty() {
                    return None;
                }
                let i = rng.random_range(0..actions.len());
                actions.into_iter().nth(i)
            }))
        }
        PolicyKind::Model(path) => anyhow::bail!(
            "{} is a model: it plays whole conversations, not single actions",
            path.display()
        ),
    }
}

/// Evaluate a trained model (run directory or model directory) through the
/// rollout engine, with the reply format and limits it was trained under.
fn evaluate_model(
    path: &std::path::Path,
    template: &TaskSpec,
    params: &agentrl_env_core::EnvParams,
    seed_start: u64,
    n: u64,
    temperature: f64,
    policy_seed: u64,
) -> anyhow::Result<EvalSummary> {
    use agentrl_rollout::RolloutConfig;
    use agentrl_trainer::LocalPolicy;
    let policy = agentrl_trainer::TrainedPolicy::open(path)?;
    // A run directory evaluated on its own environment keeps the env params
    // it was trained with (e.g. a not-slippery FrozenLake) unless given others.
    let params = match &policy.config {
        Some(c) if params.is_empty() && c.env.name == template.env => &c.env.params,
        _ => params,
    };
    // Batches of 64 tasks, one sample each.
    let cfg = RolloutConfig {
        n: 1,
        env_groups: 64,
        ..policy.rollout.clone()
    };
    let mut local = LocalPolicy {
        model: &policy.model,
    };
    let make = |spec: &TaskSpec, params: &agentrl_env_core::EnvParams| {
        agentrl_envs::make_env(spec, params)
    };
    let (stats, _) = agentrl_trainer::evaluate(
        &mut local,
        &policy.tokenizer,
        &make,
        &template.env,
        &template.difficulty,
        params,
        template.split,
        seed_start..seed_start.saturating_add(n),
        &cfg,
        temperature,
        policy_seed,
    )?;
    Ok(EvalSummary {
        env: template.env.clone(),
        difficulty: template.difficulty.clone(),
        split: template.split.to_string(),
        policy: path.display().to_string(),
        n: stats.n,
        success_rate: stats.success_rate,
        mean_reward: stats.mean_reward,
        mean_steps: stats.mean_env_steps,
        invalid_action_rate: stats.invalid_action_rate,
    })
}

/// Evaluate `kind` on tasks `seed_start .. seed_start + n`.
pub fn evaluate(
    kind: &PolicyKind,
    template: &TaskSpec,
    params: &agentrl_env_core::EnvParams,
    seed_start: u64,
    n: u64,
    policy_seed: u64,
) -> anyhow::Result<(EvalSummary, Vec<EpisodeResult>)> {
    let mut results = Vec::new();
    for seed in seed_start..seed_start.saturating_add(n) {
        let spec = TaskSpec {
            seed,
            ..template.clone()
        };
        let mut env = agentrl_envs::make_env(&spec, params)?;
        let mut choose = chooser(kind, policy_seed, &spec)?;
        results.push(run_episode(env.as_mut(), &mut choose));
    }
    let count = results.len().max(1) as f64;
    let steps: usize = results.iter().map(|r| r.steps).sum();
    let invalid: usize = results.iter().map(|r| r.invalid_actions).sum();
    let summary = EvalSummary {
        env: template.env.clone(),
        difficulty: template.difficulty.clone(),
        split: template.split.to_string(),
        policy: match kind {
            PolicyKind::Expert => "expert".to_string(),
            PolicyKind::Random => "random".to_string(),
            PolicyKind::Model(p) => p.display().to_string(),
        },
        n: results.len(),
        success_rate: results.iter().filter(|r| r.success).count() as f64 / count,
        mean_reward: results.iter().map(|r| r.reward).sum::<f64>() / count,
        mean_steps: steps as f64 / count,
        invalid_action_rate: if steps + invalid == 0 {
            0.0
        } else {
            invalid as f64 / (steps + invalid) as f64
        },
    };
    Ok((summary, results))
}

/// Run the evaluation and print it.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    let kind: PolicyKind = match args.policy.parse() {
        Ok(k) => k,
        Err(never) => match never {},
    };
    if args.n == 0 {
        anyhow::bail!("--n must be at least 1");
    }
    let template = make_spec(
        &args.env,
        args.difficulty.as_deref(),
        &args.split,
        args.seed_start,
    )?;
    let params = parse_params(&args.params)?;
    let summary = match &kind {
        PolicyKind::Model(path) => evaluate_model(
            path,
            &template,
            &params,
            args.seed_start,
            args.n,
            args.temperature,
            args.policy_seed,
        )?,
        _ => {
            evaluate(
                &kind,
                &template,
                &params,
                args.seed_start,
                args.n,
                args.policy_seed,
            )?
            .0
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{} {}/{} ({} tasks from seed {}), policy {}:",
            summary.env,
            summary.split,
            summary.difficulty,
            summary.n,
            args.seed_start,
            summary.policy
        );
        println!("  success rate  {:.3}", summary.success_rate);
        println!("  mean reward   {:.3}", summary.mean_reward);
        println!("  mean steps    {:.2}", summary.mean_steps);
        println!("  invalid rate  {:.3}", summary.invalid_action_rate);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_kind_parses_keywords_and_paths() {
        assert_eq!("expert".parse::<PolicyKind>().unwrap(), PolicyKind::Expert);
        assert_eq!("random".parse::<PolicyKind>().unwrap(), PolicyKind::Random);
        assert_eq!(
            "runs/x/ckpt".parse::<PolicyKind>().unwrap(),
            PolicyKind::Model(PathBuf::from("runs/x/ckpt"))
        );
    }
}
