//! `agentrl bench envs`: single-thread steps per second of each environment
//! with random valid actions through the episode loop, resets included.

use std::time::{Duration, Instant};

use agentrl_env_core::{Env, EnvParams, Split, TaskSpec};
use agentrl_rollout::{
    play_episodes, EpisodeTally, EvalStats, RandomActor, RolloutConfig, RolloutError,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Arguments of `agentrl bench envs`.
#[derive(clap::Args)]
pub struct BenchEnvsArgs {
    /// Seconds of stepping per environment.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Only this environment (default: every registered one).
    #[arg(long)]
    env: Option<String>,
    /// Difficulty (default: each environment's first).
    #[arg(long)]
    difficulty: Option<String>,
    /// Distinct tasks the benchmark cycles through.
    #[arg(long, default_value_t = 8)]
    tasks: u64,
    /// Print one JSON object per environment instead of a table.
    #[arg(long)]
    json: bool,
}

/// The targets (steps/s on one core), printed beside the figures.
fn target(env: &str) -> Option<f64> {
    match env {
        "frozenlake" => Some(1_000_000.0),
        "sokoban" => Some(300_000.0),
        _ => None,
    }
}

/// Throughput of one environment.
struct Measured {
    /// What was played.
    played: EpisodeTally,
    elapsed: Duration,
    /// CPU time this thread spent, where the OS tells us (Linux): on a busy
    /// machine wall time understates single-core throughput.
    cpu: Option<Duration>,
}

/// Nanoseconds this thread has run on a CPU (Linux schedstat), if known.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Play `envs` with random valid actions through the episode loop (one
/// episode each per round, resets included) until `budget` has passed.
fn measure(
    envs: &mut [Box<dyn Env>],
    budget: Duration,
    seed: u64,
) -> Result<Measured, RolloutError> {
    let cfg = RolloutConfig::scripted();
    let groups: Vec<usize> = (0..envs.len()).collect();
    // Random play draws from its own per-episode streams.
    let mut unused = ChaCha8Rng::seed_from_u64(seed);
    let mut tally = EpisodeTally::default();
    let start = Instant::now();
    let cpu_start = thread_cpu_ns();
    let mut round = 0u64;
    // Checking the clock every round is cheap next to a round.
    while round == 0 || start.elapsed() < budget {
        // A fresh seed a round: each round plays the tasks differently.
        let mut actor = RandomActor::new(seed.wrapping_add(round));
        let trajs = play_episodes(&mut actor, None, envs, &groups, &cfg, &mut unused)?;
        tally.add(&trajs);
        round += 1;
    }
    let elapsed = start.elapsed();
    let cpu = match (cpu_start, thread_cpu_ns()) {
        (Some(a), Some(b)) if b > a => Some(Duration::from_nanos(b - a)),
        _ => None,
    };
    Ok(Measured {
        played: tally,
        elapsed,
        cpu,
    })
}

/// Run the benchmark and print steps/s per environment.
pub fn run(args: BenchEnvsArgs) -> anyhow::Result<()> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        anyhow::bail!("--seconds must be positive");
    }
    let descriptors = match &args.env {
        Some(name) => vec![agentrl_envs::find(name)?],
        None => agentrl_envs::descriptors(),
    };
    if cfg!(debug_assertions) {
        eprintln!("note: debug build; use `cargo run --release -p agentrl -- bench envs` for real figures");
    }
    if !args.json {
        println!(
            "{:12} {:10} {:>12} {:>14} {:>12} {:>9}  steps/cpu-s vs target",
            "env", "difficulty", "steps/s", "steps/cpu-s", "episodes/s", "steps/ep"
        );
    }
    for d in descriptors {
        let difficulty = match &args.difficulty {
            Some(x) => x.clone(),
            None => d
                .difficulties
                .first()
                .map(|s| s.to_string())
                .unwrap_or_default(),
        };
        let made: Result<Vec<Box<dyn Env>>, _> = (0..args.tasks.max(1))
            .map(|seed| {
                d.create(
                    &TaskSpec::new(d.name, Split::Train, difficulty.clone(), seed),
                    &EnvParams::new(),
                )
            })
            .collect();
        let mut envs = match made {
            Ok(e) => e,
            Err(e) => {
                eprintln!("{}: skipped ({e})", d.name);
                continue;
            }
        };
        let m = measure(&mut envs, Duration::from_secs_f64(args.seconds), 0)?;
        let secs = m.elapsed.as_secs_f64();
        let stats: EvalStats = m.played.stats();
        let steps = m.played.env_steps as f64;
        let sps = steps / secs;
        let eps = stats.n as f64 / secs;
        let per_ep = stats.mean_env_steps;
        // Single-core throughput: steps per second of CPU time (falls back to wall time).
        let cpu_sps = m.cpu.map_or(sps, |c| steps / c.as_secs_f64());
        if args.json {
            let row = serde_json::json!({
                "env": d.name, "difficulty": difficulty, "steps_per_s": sps,
                "steps_per_cpu_s": cpu_sps, "episodes_per_s": eps,
                "steps_per_episode": per_ep, "success_rate": stats.success_rate,
                "target_steps_per_s": target(d.name),
            });
            println!("{row}");
        } else {
            let vs = target(d.name)
                .map(|t| format!("{:.2}× of {:.0}", cpu_sps / t, t))
                .unwrap_or_else(|| "-".to_string());
            println!(
                "{:12} {:10} {:>12.0} {:>14.0} {:>12.0} {:>9.1}  {vs}",
                d.name, difficulty, sps, cpu_sps, eps, per_ep
            );
        }
    }
    Ok(())
}
