//! `agentrl bench rollout`: the rollout phase of a training step (B tasks × G
//! samples, every turn to the end) with each dialogue's KV cache kept between
//! turns and with every turn re-encoded, on the same seeds; or, with
//! `--rl-steps N`, N whole RL steps of the config (rollout, the no-grad
//! scoring, the update) with each phase's time. `--device cuda` runs the
//! policy on GPU 0.

use std::path::PathBuf;
use std::time::Instant;

use agentrl_env_core::{Env, Split, TaskSpec};
use agentrl_model::ProfiledRange;
use agentrl_rollout::{run_rollouts, RolloutConfig, Trajectory};
use agentrl_tokenizer::ChatTokenizer;
use agentrl_trainer::bootstrap::starting_policy;
use agentrl_trainer::config::TrainDevice;
use agentrl_trainer::trainer::env_maker;
use agentrl_trainer::{LocalPolicy, PromptTokens, Silent, TrainConfig, TrainedPolicy, Trainer};

use crate::commands::device::DeviceArg;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Arguments of `agentrl bench rollout`.
#[derive(clap::Args)]
pub struct BenchRolloutArgs {
    /// A trained policy (run or model directory) to roll out; default: the
    /// config's starting policy (fresh tokenizer and random weights, whose
    /// replies run to the token budget every turn).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// A TOML config (default: the embedded default), then `section.key=value` overrides.
    args: Vec<String>,
    /// Rollout phases measured per mode (the figures are their total).
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Where the policy runs (with `--rl-steps`, the trainer's device).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Sample through the graph decoder (what a GPU runs: left-padded
    /// batches, fixed-shape steps, the KV cache kept as rows of each call's
    /// batch caches) even on the CPU, whose own decoder is the host one:
    /// that path's reuse and trajectories, checked without a GPU.
    #[arg(long, conflicts_with = "rl_steps")]
    graph_decode: bool,
    /// Also play the phases with continuous batching (an episode's next
    /// turn starts as soon as its reply ends, the cache kept), against the
    /// lock-step turns with the cache kept. Both modes above play lock-step.
    #[arg(long, conflicts_with = "rl_steps")]
    continuous: bool,
    /// Time N whole RL steps of the config instead (rollout, the no-grad
    /// scoring of old and reference log-probs, the update), in a temporary
    /// run directory after the run's start (its first evaluation included).
    #[arg(long, value_name = "N", conflicts_with = "policy")]
    rl_steps: Option<usize>,
}

/// One RL step's phases, in seconds.
#[derive(Debug, Clone, Serialize)]
struct StepPhases {
    step: usize,
    rollout: f64,
    /// The no-grad scoring of the kept trajectories (part of the update).
    scoring: f64,
    /// The PPO epochs (the update without the scoring).
    update: f64,
    total: f64,
    /// Mean tokens the policy generated per trajectory.
    generated_tokens: f64,
}

/// What `agentrl bench rollout --rl-steps N --json` prints.
#[derive(Debug, Clone, Serialize)]
struct RlStepReport {
    env: String,
    device: &'static str,
    parameters: u64,
    steps: Vec<StepPhases>,
    /// Per phase, the median over the steps.
    median: StepPhases,
}

/// One mode's figures.
#[derive(Debug, Clone, Serialize)]
struct ModeFigures {
    seconds: f64,
    trajectories_per_s: f64,
    /// Tokens the policy generated, per second.
    generated_tokens_per_s: f64,
    /// Prompt tokens the model encoded / served from a kept cache.
    prompt_tokens_encoded: usize,
    prompt_tokens_reused: usize,
}

/// What `agentrl bench rollout --json` prints.
#[derive(Debug, Clone, Serialize)]
struct RolloutReport {
    env: String,
    tasks: usize,
    group_size: usize,
    mean_turns: f64,
    cache_reuse: ModeFigures,
    re_encode: ModeFigures,
    /// Wall-time ratio re-encode / reuse.
    speedup: f64,
    /// Both modes played the same tokens (float rounding could, rarely, flip a draw).
    same_trajectories: bool,
    /// `--continuous`: continuous batching with the cache kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    continuous: Option<ModeFigures>,
    /// Wall-time ratio lock-step / continuous, both with the cache kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    continuous_speedup: Option<f64>,
}

/// Play `repeats` rollout phases of `cfg` with `reuse` on or off.
fn measure(
    cfg: &TrainConfig,
    rollout: &RolloutConfig,
    tokenizer: &ChatTokenizer,
    model: &agentrl_model::PolicyModel,
    reuse: bool,
    repeats: usize,
) -> anyhow::Result<(ModeFigures, Vec<Trajectory>)> {
    let make = env_maker(cfg)?;
    let mut all = Vec::new();
    let mut used = PromptTokens::default();
    let start = Instant::now();
    for r in 0..repeats {
        let mut envs: Vec<Box<dyn Env>> = Vec::new();
        let mut groups = Vec::new();
        for g in 0..rollout.env_groups {
            let seed = (r * rollout.env_groups + g) as u64;
            let spec = TaskSpec::new(&cfg.env.name, Split::Train, &cfg.env.difficulty, seed);
            for _ in 0..rollout.n {
                envs.push(make(&spec, &cfg.env.params)?);
                groups.push(g);
            }
        }
        let mut policy = LocalPolicy::with_cache_reuse(model, reuse);
        let mut rng = ChaCha8Rng::seed_from_u64(r as u64);
        all.extend(run_rollouts(
            &mut policy,
            tokenizer,
            envs,
            &groups,
            rollout,
            &mut rng,
        )?);
        let p = policy.prompt_tokens();
        used.reused += p.reused;
        used.encoded += p.encoded;
    }
    let seconds = start.elapsed().as_secs_f64();
    let generated: usize = all.iter().map(Trajectory::generated_tokens).sum();
    Ok((
        ModeFigures {
            seconds,
            trajectories_per_s: all.len() as f64 / seconds,
            generated_tokens_per_s: generated as f64 / seconds,
            prompt_tokens_encoded: used.encoded,
            prompt_tokens_reused: used.reused,
        },
        all,
    ))
}

/// Run the benchmark and print it.
pub fn run(args: BenchRolloutArgs) -> anyhow::Result<()> {
    if args.repeats == 0 {
        anyhow::bail!("--repeats must be at least 1");
    }
    let cfg = crate::commands::train::load_config(&args.args)?;
    if cfg!(debug_assertions) {
        eprintln!("note: debug build; use `cargo run --release -p agentrl -- bench rollout` for real figures");
    }
    if let Some(steps) = args.rl_steps {
        return rl_steps(cfg, steps, args.device, args.json);
    }
    let dev = args.device.open()?;
    let (tokenizer, mut model, rollout) = match &args.policy {
        Some(path) => {
            let p = TrainedPolicy::open_on(path, &dev)?;
            (p.tokenizer, p.model, p.rollout)
        }
        None => {
            let make = env_maker(&cfg)?;
            let (tok, model) = starting_policy(&cfg, make.as_ref(), false, &dev)?;
            (tok, model, cfg.rollout.clone())
        }
    };
    if args.graph_decode {
        model.set_graph_decode(true);
    }
    let lockstep = RolloutConfig {
        continuous_batching: false,
        ..rollout.clone()
    };
    let (reuse, reused_trajs) = measure(&cfg, &lockstep, &tokenizer, &model, true, args.repeats)?;
    let (fresh, fresh_trajs) = measure(&cfg, &lockstep, &tokenizer, &model, false, args.repeats)?;
    let continuous = match args.continuous {
        true => {
            let rollout = RolloutConfig {
                continuous_batching: true,
                ..rollout.clone()
            };
            Some(measure(&cfg, &rollout, &tokenizer, &model, true, args.repeats)?.0)
        }
        false => None,
    };
    let same = reused_trajs.len() == fresh_trajs.len()
        && reused_trajs
            .iter()
            .zip(&fresh_trajs)
            .all(|(a, b)| a.tokens == b.tokens && a.loss_mask == b.loss_mask);
    let turns: usize = fresh_trajs.iter().map(|t| t.turns.len()).sum();
    let report = RolloutReport {
        env: format!("{}/{}", cfg.env.name, cfg.env.difficulty),
        tasks: rollout.env_groups,
        group_size: rollout.n,
        mean_turns: turns as f64 / fresh_trajs.len().max(1) as f64,
        speedup: fresh.seconds / reuse.seconds,
        continuous_speedup: continuous.as_ref().map(|c| reuse.seconds / c.seconds),
        continuous,
        cache_reuse: reuse,
        re_encode: fresh,
        same_trajectories: same,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{}: {} tasks x {} samples x {} phases, {:.1} turns per episode",
        report.env, report.tasks, report.group_size, args.repeats, report.mean_turns
    );
    let modes = [
        ("KV cache kept across turns", Some(&report.cache_reuse)),
        ("every turn re-encoded", Some(&report.re_encode)),
        ("continuous batching", report.continuous.as_ref()),
    ];
    for (name, m) in modes.into_iter().filter_map(|(n, m)| Some((n, m?))) {
        println!(
            "{name:28} {:7.2} s  {:8.1} trajectories/s  {:8.0} generated tokens/s  prompt tokens encoded {} (reused {})",
            m.seconds,
            m.trajectories_per_s,
            m.generated_tokens_per_s,
            m.prompt_tokens_encoded,
            m.prompt_tokens_reused
        );
    }
    println!(
        "speed-up {:.2}x; same trajectories: {}",
        report.speedup, report.same_trajectories
    );
    if let Some(x) = report.continuous_speedup {
        println!("continuous batching against lock-step turns (both with the cache kept): {x:.2}x");
    }
    Ok(())
}

/// `--rl-steps`: `steps` RL steps of `cfg` on `device` in a temporary run
/// directory, each phase timed.
fn rl_steps(
    mut cfg: TrainConfig,
    steps: usize,
    device: DeviceArg,
    json: bool,
) -> anyhow::Result<()> {
    if steps == 0 {
        anyhow::bail!("--rl-steps must be at least 1");
    }
    cfg.trainer.device = match device {
        DeviceArg::Cpu => TrainDevice::Cpu,
        DeviceArg::Cuda => TrainDevice::Cuda,
    };
    cfg.trainer.total_training_steps = cfg.trainer.total_training_steps.max(steps);
    let dir = tempfile::tempdir()?;
    let env = format!("{}/{}", cfg.env.name, cfg.env.difficulty);
    let mut trainer = Trainer::start(cfg, &dir.path().join("run"), &mut Silent)?;
    let mut phases = Vec::with_capacity(steps);
    for step in 1..=steps {
        // Each RL step is one profiled range (bench/kernel-profile).
        let profiled = ProfiledRange::start(&trainer.model.device)?;
        let m = trainer.rl_step(step)?;
        profiled.end()?;
        let scoring = m.update.scoring_seconds;
        phases.push(StepPhases {
            step,
            rollout: m.rollout_seconds,
            scoring,
            update: m.update_seconds - scoring,
            total: m.rollout_seconds + m.update_seconds,
            generated_tokens: m.generated_tokens,
        });
    }
    let median = |f: fn(&StepPhases) -> f64| {
        let mut v: Vec<f64> = phases.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let report = RlStepReport {
        env,
        device: device.name(),
        parameters: trainer.model.config.parameter_count().unwrap_or(0),
        median: StepPhases {
            step: 0,
            rollout: median(|p| p.rollout),
            scoring: median(|p| p.scoring),
            update: median(|p| p.update),
            total: median(|p| p.total),
            generated_tokens: median(|p| p.generated_tokens),
        },
        steps: phases,
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{}: {} RL steps on {}, a policy of {} parameters",
        report.env, steps, report.device, report.parameters
    );
    println!("step   rollout s  scoring s   update s    total s  generated tokens/trajectory");
    for p in report.steps.iter().chain([&report.median]) {
        let name = match p.step {
            0 => "median".to_string(),
            n => n.to_string(),
        };
        println!(
            "{name:>6} {:10.2} {:10.2} {:10.2} {:10.2} {:10.1}",
            p.rollout, p.scoring, p.update, p.total, p.generated_tokens
        );
    }
    Ok(())
}
