//! `agentrl bench envs`: single-thread steps per second of each environment
//! with random valid actions, resets included.

use std::time::{Duration, Instant};

use agentrl_env_core::{Env, EnvParams, Split, TaskSpec};
use rand::{Rng, SeedableRng};
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
    steps: u64,
    episodes: u64,
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

/// Step random available actions through `envs` in turn (one episode each,
/// reset included) until `budget` has passed.
fn measure(envs: &mut [Box<dyn Env>], budget: Duration, seed: u64) -> Measured {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut steps, mut episodes) = (0u64, 0u64);
    let start = Instant::now();
    let cpu_start = thread_cpu_ns();
    'outer: loop {
        for env in envs.iter_mut() {
            env.reset();
            episodes += 1;
            while !env.is_done() {
                let actions = env.available_actions();
                if actions.is_empty() {
                    break;
                }
                let a = &actions[rng.random_range(0..actions.len())];
                if env.step(a).is_ok() {
                    steps += 1;
                }
            }
            // Checking the clock every episode is cheap next to an episode.
            if start.elapsed() >= budget {
                break 'outer;
            }
        }
    }
    let elapsed = start.elapsed();
    let cpu = match (cpu_start, thread_cpu_ns()) {
        (Some(a), Some(b)) if b > a => Some(Duration::from_nanos(b - a)),
        _ => None,
    };
    Measured {
        steps,
        episodes,
        elapsed,
        cpu,
    }
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
        let m = measure(&mut envs, Duration::from_secs_f64(args.seconds), 0);
        let secs = m.elapsed.as_secs_f64();
        let sps = m.steps as f64 / secs;
        let eps = m.episodes as f64 / secs;
        let per_ep = m.steps as f64 / m.episodes.max(1) as f64;
        // Single-core throughput: steps per second of CPU time (falls back to wall time).
        let cpu_sps = m.cpu.map_or(sps, |c| m.steps as f64 / c.as_secs_f64());
        if args.json {
            let row = serde_json::json!({
                "env": d.name, "difficulty": difficulty, "steps_per_s": sps,
                "steps_per_cpu_s": cpu_sps, "episodes_per_s": eps,
                "steps_per_episode": per_ep, "target_steps_per_s": target(d.name),
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
