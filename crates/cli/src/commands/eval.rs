//! `agentrl eval`: run a policy on N tasks of one environment and report
//! success rate, mean reward and mean steps.

use std::path::PathBuf;
use std::str::FromStr;

use agentrl_env_core::{EnvParams, TaskSpec, SPLIT_STRIDE};
use agentrl_rollout::{
    EvalStats, ExpertActor, PolicyActor, RandomActor, RolloutConfig, SamplingParams,
};
use agentrl_trainer::{evaluate, EvalPlan, LocalPolicy, TrainedPolicy};
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
    /// Seed of the random policy's choices (of a model's sampling).
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

/// Task indices `start..start + n`, which must lie inside a split
/// (`0..SPLIT_STRIDE`).
fn task_range(start: u64, n: u64) -> anyhow::Result<std::ops::Range<u64>> {
    match start.checked_add(n) {
        Some(end) if end <= SPLIT_STRIDE => Ok(start..end),
        _ => anyhow::bail!(
            "--seed-start {start} with --n {n} runs past the split: task indices are 0..{SPLIT_STRIDE}"
        ),
    }
}

/// What `agentrl eval` reports: the tasks, the policy and its figures.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub env: String,
    pub difficulty: String,
    pub split: String,
    pub policy: String,
    #[serde(flatten)]
    pub stats: EvalStats,
}

/// Evaluate `kind` on `tasks` (seeds, env params, sampling) with the one
/// episode loop: the expert and random play are scripted actors played
/// without a conversation; a model plays conversations with the reply
/// format and limits it was trained under.
fn evaluate_policy(
    kind: &PolicyKind,
    args: &EvalArgs,
    template: &TaskSpec,
    params: &EnvParams,
) -> anyhow::Result<EvalStats> {
    let make = |spec: &TaskSpec, params: &EnvParams| agentrl_envs::make_env(spec, params);
    let scripted = RolloutConfig::scripted();
    let plan = EvalPlan {
        make: &make,
        env: &template.env,
        difficulty: &template.difficulty,
        params,
        split: template.split,
        seeds: task_range(args.seed_start, args.n)?,
        codec: None,
        rollout: &scripted,
        seed: args.policy_seed,
    };
    let stats = match kind {
        PolicyKind::Expert => evaluate(&mut ExpertActor::new(1, 0.0), &plan)?.0,
        PolicyKind::Random => evaluate(&mut RandomActor::new(args.policy_seed), &plan)?.0,
        PolicyKind::Model(path) => {
            let policy = TrainedPolicy::open(path)?;
            // A run directory evaluated on its own environment keeps the env
            // params it was trained with (e.g. a not-slippery FrozenLake)
            // unless given others.
            let params = match &policy.config {
                Some(c) if params.is_empty() && c.env.name == template.env => &c.env.params,
                _ => params,
            };
            // Batches of 64 tasks, one sample each.
            let rollout = RolloutConfig {
                n: 1,
                env_groups: 64,
                ..policy.rollout.clone()
            };
            let sampling = SamplingParams {
                temperature: args.temperature,
                ..rollout.sampling(policy.tokenizer.im_end_id())
            };
            let mut local = LocalPolicy::with_cache_reuse(&policy.model, rollout.kv_cache_reuse);
            let plan = EvalPlan {
                params,
                codec: Some(&policy.tokenizer),
                rollout: &rollout,
                ..plan
            };
            evaluate(&mut PolicyActor::new(&mut local, sampling), &plan)?.0
        }
    };
    Ok(stats)
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
    task_range(args.seed_start, args.n)?;
    let template = make_spec(
        &args.env,
        args.difficulty.as_deref(),
        &args.split,
        args.seed_start,
    )?;
    let params = parse_params(&args.params)?;
    let report = EvalReport {
        env: template.env.clone(),
        difficulty: template.difficulty.clone(),
        split: template.split.to_string(),
        policy: match &kind {
            PolicyKind::Expert => "expert".to_string(),
            PolicyKind::Random => "random".to_string(),
            PolicyKind::Model(p) => p.display().to_string(),
        },
        stats: evaluate_policy(&kind, &args, &template, &params)?,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let s = &report.stats;
        println!(
            "{} {}/{} ({} tasks from seed {}), policy {}:",
            report.env, report.split, report.difficulty, s.n, args.seed_start, report.policy
        );
        println!("  success rate  {:.3}", s.success_rate);
        println!("  mean reward   {:.3}", s.mean_reward);
        println!("  mean steps    {:.2}", s.mean_env_steps);
        println!("  mean turns    {:.2}", s.mean_turns);
        println!("  invalid rate  {:.3}", s.invalid_action_rate);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ranges_stay_inside_a_split() {
        assert_eq!(task_range(0, 100).unwrap(), 0..100);
        assert_eq!(
            task_range(SPLIT_STRIDE - 1, 1).unwrap(),
            SPLIT_STRIDE - 1..SPLIT_STRIDE
        );
        let e = task_range(u64::MAX, 100).unwrap_err().to_string();
        assert!(e.contains("--seed-start 18446744073709551615"), "{e}");
        assert!(task_range(SPLIT_STRIDE - 1, 2).is_err());
    }

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
