//! `agentrl bench rollout`: the rollout phase of a training step (B tasks × G
//! samples, every turn to the end) with each dialogue's KV cache kept between
//! turns and with every turn re-encoded, on the same seeds.

use std::path::PathBuf;
use std::time::Instant;

use agentrl_env_core::{Env, Split, TaskSpec};
use agentrl_rollout::{run_rollouts, RolloutConfig, Trajectory};
use agentrl_tokenizer::ChatTokenizer;
use agentrl_trainer::bootstrap::starting_policy;
use agentrl_trainer::trainer::env_maker;
use agentrl_trainer::{LocalPolicy, PromptTokens, TrainConfig, TrainedPolicy};
use candle_core::Device;
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
    let (tokenizer, model, rollout) = match &args.policy {
        Some(path) => {
            let p = TrainedPolicy::open(path)?;
            (p.tokenizer, p.model, p.rollout)
        }
        None => {
            let make = env_maker(&cfg)?;
            let (tok, model) = starting_policy(&cfg, make.as_ref(), false, &Device::Cpu)?;
            (tok, model, cfg.rollout.clone())
        }
    };
    let (reuse, reused_trajs) = measure(&cfg, &rollout, &tokenizer, &model, true, args.repeats)?;
    let (fresh, fresh_trajs) = measure(&cfg, &rollout, &tokenizer, &model, false, args.repeats)?;
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
    for (name, m) in [
        ("KV cache kept across turns", &report.cache_reuse),
        ("every turn re-encoded", &report.re_encode),
    ] {
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
    Ok(())
}
