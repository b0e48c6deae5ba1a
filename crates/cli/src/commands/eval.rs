//! `agentrl eval`: run a policy on N tasks of one environment and report
//! success rate, mean reward and mean steps; with `--envs`, `--k` or several
//! difficulties, the evaluation matrix (see [`matrix`]).

use std::path::PathBuf;
use std::str::FromStr;

use agentrl_env_client::DataIdxRanges;
use agentrl_env_core::{EnvParams, Split, TaskSpec, SPLIT_STRIDE};
use agentrl_model::{PolicyModel, Precision};
use agentrl_policy_client::OpenAiPolicy;
use agentrl_rollout::{
    EvalStats, ExpertActor, Policy, PolicyActor, RandomActor, RolloutConfig, SamplingParams,
    Trajectory,
};
use agentrl_trainer::config::{Endpoints, EnvProtocol, EnvSection, PolicySection};
use agentrl_trainer::evaluate::EnvMaker;
use agentrl_trainer::remote_env::remote_maker;
use agentrl_trainer::{evaluate, EvalPlan, LocalPolicy, PolicySettings};
use anyhow::Context;
use serde::Serialize;

use super::play::{make_spec, parse_params};
use crate::commands::device::DeviceArg;

mod matrix;

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
    /// `expert`, `random`, a run directory (its latest checkpoint), a model directory or a GGUF file.
    #[arg(long, default_value = "expert")]
    policy: String,
    /// Environment name (see `agentrl envs`); with --endpoint, any name the
    /// server serves (e.g. `sciworld` on an AgentGym server).
    #[arg(long, required_unless_present = "envs", conflicts_with = "envs")]
    env: Option<String>,
    /// Several environments, comma-separated: the evaluation matrix, one
    /// row per environment and difficulty.
    #[arg(long, value_delimiter = ',')]
    envs: Option<Vec<String>>,
    /// avg@k and pass@k with k samples of every task (the matrix).
    #[arg(long)]
    k: Option<usize>,
    /// Samples drawn per task for pass@k's unbiased estimator (default: k).
    #[arg(long, requires = "k")]
    samples: Option<usize>,
    /// URL of an env server to play on (default: in-process); several
    /// `agentrl serve` URLs comma-separated spread the episodes over them.
    #[arg(long)]
    endpoint: Option<String>,
    /// How to talk to --endpoint: `agentrl` (`agentrl serve`) or `agentgym`
    /// (AgentGym's env servers; task indices are their `data_idx`).
    #[arg(long, default_value = "agentrl", value_parser = parse_protocol)]
    protocol: EnvProtocol,
    /// agentgym: the prompt's instructions (AgentGym keeps them client-side);
    /// default: those of the run given as --policy.
    #[arg(long)]
    instructions_file: Option<PathBuf>,
    /// agentgym: a regular expression of invalid-action answers (repeatable;
    /// default: the env's known messages).
    #[arg(long = "invalid-pattern", value_name = "REGEX")]
    invalid_patterns: Vec<String>,
    /// agentgym: multiplies every reward (SciWorld: 0.01).
    #[arg(long)]
    reward_scale: Option<f64>,
    /// Difficulty level (default: the environment's first); in the matrix,
    /// several, comma-separated.
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
    /// Environment parameter as KEY=VALUE (JSON value); repeatable. In the
    /// matrix, ENV.KEY=VALUE for one environment; a bare KEY goes to every
    /// environment that has it.
    #[arg(long = "param", value_name = "KEY=VALUE")]
    params: Vec<String>,
    /// Sampling temperature of a model policy (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// A model policy's rollout setting as KEY=VALUE (a `[rollout]` key;
    /// repeatable), over the run's own or the defaults: `prefill=true`
    /// (RAGEN's `<think>` pre-fill), `response_length=128`.
    #[arg(long = "rollout", value_name = "KEY=VALUE")]
    rollout: Vec<String>,
    /// Where a model policy's weights run (`cuda`: GPU 0, a build with the
    /// `cuda` feature); the environments stay on the host.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu, conflicts_with = "policy_endpoint")]
    device: DeviceArg,
    /// The precision of a model policy's large products on the CPU: `f32`,
    /// or `bf16` (AVX512-BF16; see `model.precision`). Default: the run's
    /// `model.precision` where this CPU has it, else f32.
    #[arg(long, value_name = "f32|bf16", conflicts_with = "policy_endpoint")]
    precision: Option<Precision>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Write every played trajectory to this file, one JSON object a line
    /// (its task, turns with replies and actions, tokens, outcome; in the
    /// matrix, with its failure labels).
    #[arg(long, value_name = "FILE")]
    trajectories: Option<PathBuf>,
    /// Generate with the model an OpenAI-compatible server serves (vLLM,
    /// SGLang, `agentrl serve-policy`) at this URL; --policy then names the
    /// directory whose tokenizer and settings it is played with (its
    /// weights are not loaded).
    #[arg(long, value_name = "URL")]
    policy_endpoint: Option<String>,
    /// The served model's name (default: the only one the server lists).
    #[arg(long, requires = "policy_endpoint")]
    policy_model: Option<String>,
    /// The NAME of the environment variable holding the server's API key.
    #[arg(long, requires = "policy_endpoint", value_name = "VAR")]
    policy_api_key_env: Option<String>,
    /// Requests to the server in flight at once, at most.
    #[arg(long, requires = "policy_endpoint", default_value_t = PolicySection::default().max_in_flight)]
    policy_max_in_flight: usize,
    /// Retries of a request after a connection error, a timeout or a 5xx.
    #[arg(long, requires = "policy_endpoint", default_value_t = PolicySection::default().max_retries)]
    policy_max_retries: u32,
    /// Milliseconds before the first retry (doubling on each, up to 10 s).
    #[arg(long, requires = "policy_endpoint", default_value_t = PolicySection::default().retry_backoff_ms)]
    policy_retry_backoff_ms: u64,
}

/// The `[policy]` section the `--policy-*` flags make, if --policy-endpoint is given.
fn policy_section(args: &EvalArgs) -> Option<PolicySection> {
    let endpoint = args.policy_endpoint.clone()?;
    Some(PolicySection {
        endpoint,
        model: args.policy_model.clone().unwrap_or_default(),
        api_key_env: args.policy_api_key_env.clone().unwrap_or_default(),
        max_in_flight: args.policy_max_in_flight,
        max_retries: args.policy_max_retries,
        retry_backoff_ms: args.policy_retry_backoff_ms,
        // Only training writes adapters for the server to load.
        adapter_dir: String::new(),
    })
}

fn parse_protocol(s: &str) -> Result<EnvProtocol, String> {
    match s {
        "agentrl" => Ok(EnvProtocol::Agentrl),
        "agentgym" => Ok(EnvProtocol::Agentgym),
        other => Err(format!("unknown protocol '{other}' (agentrl or agentgym)")),
    }
}

/// The `[env]` section of a remote evaluation: the flags over the run's own
/// section when `--policy` is a run trained on the same env and protocol.
fn remote_section(
    args: &EvalArgs,
    name: &str,
    endpoint: &str,
    run: Option<&EnvSection>,
) -> anyhow::Result<EnvSection> {
    let mut env = match run {
        Some(r) if r.name == name && r.protocol == args.protocol => r.clone(),
        _ => EnvSection {
            name: name.to_string(),
            difficulty: String::new(),
            endpoint: Default::default(),
            train_tasks: 0,
            params: Default::default(),
            protocol: args.protocol,
            instructions: String::new(),
            instructions_file: String::new(),
            invalid_action_patterns: None,
            reward_scale: 1.0,
            data_idx: DataIdxRanges::default(),
        },
    };
    env.endpoint = Endpoints::parse_list(endpoint);
    if let Some(f) = &args.instructions_file {
        env.instructions = String::new();
        env.instructions_file = f.display().to_string();
    }
    if !args.invalid_patterns.is_empty() {
        env.invalid_action_patterns = Some(args.invalid_patterns.clone());
    }
    if let Some(s) = args.reward_scale {
        env.reward_scale = s;
    }
    if args.protocol == EnvProtocol::Agentgym
        && env.instructions.trim().is_empty()
        && env.instructions_file.is_empty()
    {
        anyhow::bail!(
            "--protocol agentgym needs --instructions-file (AgentGym's servers keep no prompt), or a --policy run trained on {name} with its instructions"
        );
    }
    Ok(env)
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
) -> anyhow::Result<(EvalStats, Vec<Trajectory>)> {
    let policy = match kind {
        PolicyKind::Model(path) => Some(PolicySettings::open(path)?),
        _ => None,
    };
    let local = |spec: &TaskSpec, params: &EnvParams| agentrl_envs::make_env(spec, params);
    let remote: Option<Box<EnvMaker<'static>>> = match &args.endpoint {
        None => None,
        Some(url) => {
            let run_env = policy
                .as_ref()
                .and_then(|p| p.config.as_ref())
                .map(|c| &c.env);
            let section = remote_section(args, &template.env, url, run_env)?;
            // The task indices are the server's own (its data_idx for AgentGym).
            Some(remote_maker(&section, DataIdxRanges::identity())?)
        }
    };
    let make: &EnvMaker<'_> = match &remote {
        Some(m) => m.as_ref(),
        None => &local,
    };
    let scripted = RolloutConfig::scripted();
    let plan = EvalPlan {
        make,
        env: &template.env,
        difficulty: &template.difficulty,
        params,
        split: template.split,
        seeds: task_range(args.seed_start, args.n)?,
        samples: 1,
        codec: None,
        rollout: &scripted,
        seed: args.policy_seed,
    };
    let played = match kind {
        PolicyKind::Expert if args.protocol == EnvProtocol::Agentgym => anyhow::bail!(
            "AgentGym's servers have no expert: evaluate a model (--policy RUN_DIR) or random play"
        ),
        PolicyKind::Expert => evaluate(&mut ExpertActor::new(1, 0.0), &plan)?,
        PolicyKind::Random => evaluate(&mut RandomActor::new(args.policy_seed), &plan)?,
        PolicyKind::Model(path) => {
            let policy = policy.with_context(|| format!("{} was not opened", path.display()))?;
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
                ..agentrl_trainer::override_rollout(&policy.rollout, &args.rollout)?
            };
            let sampling = SamplingParams {
                temperature: args.temperature,
                ..rollout.sampling(policy.tokenizer.im_end_id())
            };
            // Served elsewhere, or the checkpoint's own weights.
            let model;
            let mut generator: Box<dyn Policy + '_> = match policy_section(args) {
                Some(section) => {
                    let remote = OpenAiPolicy::connect(section.client_options()?)?;
                    Box::new(remote)
                }
                None => {
                    let mut loaded =
                        PolicyModel::load(&policy.checkpoint, false, &args.device.open()?)?;
                    let precision = args.precision.unwrap_or_else(|| {
                        let run = policy.config.as_ref();
                        run.map_or(Precision::F32, |c| c.model.precision_here())
                    });
                    loaded.set_precision(precision)?;
                    model = loaded;
                    Box::new(LocalPolicy::with_cache_reuse(
                        &model,
                        rollout.kv_cache_reuse,
                    ))
                }
            };
            let plan = EvalPlan {
                params,
                codec: Some(&policy.tokenizer),
                rollout: &rollout,
                ..plan
            };
            evaluate(&mut PolicyActor::new(generator.as_mut(), sampling), &plan)?
        }
    };
    Ok(played)
}

/// Every trajectory as one JSON line.
fn write_trajectories(path: &std::path::Path, trajs: &[Trajectory]) -> anyhow::Result<()> {
    let mut text = String::new();
    for t in trajs {
        text.push_str(&serde_json::to_string(t)?);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The difficulty of `env` (`given`, or the default of the env or its
/// server), checked against the env when agentrl ships it.
fn cell_difficulty(args: &EvalArgs, env: &str, given: Option<&str>) -> anyhow::Result<String> {
    match (&args.endpoint, agentrl_envs::find(env)) {
        (None, _) | (Some(_), Ok(_)) => Ok(make_spec(env, given, &args.split, 0)?.difficulty),
        // An env agentrl does not ship: the server knows its levels.
        (Some(_), Err(_)) => match (given, args.protocol) {
            (Some(d), _) => Ok(d.to_string()),
            (None, EnvProtocol::Agentgym) => Ok("default".to_string()),
            (None, EnvProtocol::Agentrl) => anyhow::bail!(
                "--env {env} is not an agentrl environment: give its --difficulty on the server"
            ),
        },
    }
}

/// The policy `--policy` names.
fn policy_kind(args: &EvalArgs) -> PolicyKind {
    match args.policy.parse() {
        Ok(k) => k,
        Err(never) => match never {},
    }
}

/// Run the evaluation and print it.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    if args.n == 0 {
        anyhow::bail!("--n must be at least 1");
    }
    task_range(args.seed_start, args.n)?;
    if args.policy_endpoint.is_some() && !matches!(policy_kind(&args), PolicyKind::Model(_)) {
        anyhow::bail!(
            "--policy-endpoint needs --policy RUN_DIR or MODEL_DIR: the tokenizer and settings the served model is played with (its weights are not loaded)"
        );
    }
    if args.endpoint.is_none() && args.protocol == EnvProtocol::Agentgym {
        anyhow::bail!("--protocol agentgym needs --endpoint (the AgentGym server's URL)");
    }
    let several_difficulties = args.difficulty.as_deref().is_some_and(|d| d.contains(','));
    let env = match (&args.env, &args.envs) {
        (Some(env), None) if args.k.is_none() && !several_difficulties => env.clone(),
        _ if args.policy_endpoint.is_some() => anyhow::bail!(
            "--policy-endpoint plays one --env at a time (the matrix, --envs/--k, plays local policies)"
        ),
        _ => return matrix::run(&args),
    };
    let kind = policy_kind(&args);
    let split: Split = args.split.parse()?;
    let difficulty = cell_difficulty(&args, &env, args.difficulty.as_deref())?;
    let template = TaskSpec::new(&env, split, difficulty, args.seed_start);
    let params = parse_params(&args.params)?;
    let (stats, trajectories) = evaluate_policy(&kind, &args, &template, &params)?;
    let report = EvalReport {
        env: template.env.clone(),
        difficulty: template.difficulty.clone(),
        split: template.split.to_string(),
        policy: match (&kind, &args.policy_endpoint) {
            (PolicyKind::Expert, _) => "expert".to_string(),
            (PolicyKind::Random, _) => "random".to_string(),
            (PolicyKind::Model(p), None) => p.display().to_string(),
            (PolicyKind::Model(p), Some(url)) => format!("{url} (tokenizer of {})", p.display()),
        },
        stats,
    };
    if let Some(path) = &args.trajectories {
        write_trajectories(path, &trajectories)?;
    }
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
