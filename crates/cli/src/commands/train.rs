//! `agentrl train [CONFIG.toml] [key=value …] [--out RUN_DIR] [--resume RUN_DIR]`

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentrl_trainer::run_dir::RunDir;
use agentrl_trainer::{Progress, TrainConfig, Trainer, DEFAULT_CONFIG};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct TrainArgs {
    /// A TOML config (default: the embedded FrozenLake run, configs/default.toml), then
    /// `section.key=value` overrides.
    #[arg(value_name = "CONFIG_OR_OVERRIDE")]
    args: Vec<String>,
    /// Run directory (default: `runs/<name>-<timestamp>`); it must not exist or
    /// be empty (an existing run is continued with --resume).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue a killed run from its latest checkpoint.
    #[arg(long, conflicts_with = "out")]
    resume: Option<PathBuf>,
    /// Check the config as a start does (values, env params, model
    /// directory, device, env servers), print it resolved, and exit.
    #[arg(long)]
    print_config: bool,
    /// No progress bars (log lines only).
    #[arg(long)]
    quiet: bool,
}

/// indicatif bars on stderr, one per phase.
pub struct Bars {
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl Bars {
    /// Bars, or log lines only with `quiet`.
    pub fn new(quiet: bool) -> Self {
        Self { bar: None, quiet }
    }
}

impl Progress for Bars {
    fn message(&mut self, text: &str) {
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }
    fn phase(&mut self, name: &str, total: usize) {
        if self.quiet {
            eprintln!("{name}: {total} steps");
            return;
        }
        let b = ProgressBar::new(total as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{prefix:>4} [{bar:30}] {pos}/{len} {elapsed_precise} (eta {eta}) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_prefix(name.to_string());
        b.enable_steady_tick(Duration::from_millis(500));
        self.bar = Some(b);
    }
    fn advance(&mut self, done: usize, text: &str) {
        match &self.bar {
            Some(b) => {
                b.set_position(done as u64);
                b.set_message(text.to_string());
            }
            None if !text.is_empty() => eprintln!("  {done}: {text}"),
            None => {}
        }
    }
    fn finish_phase(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish();
        }
    }
}

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let mut bars = Bars::new(args.quiet);
    let mut trainer = if let Some(dir) = &args.resume {
        anyhow::ensure!(
            args.args.is_empty(),
            "--resume takes no config or overrides: the run's config.toml is used"
        );
        eprintln!("resuming {}", dir.display());
        let t = Trainer::resume(dir).with_context(|| format!("cannot resume {}", dir.display()))?;
        eprintln!(
            "resuming after step {} of {}",
            t.state.step, t.cfg.trainer.total_training_steps
        );
        t
    } else {
        let cfg = load_config(&args.args)?;
        // What a start checks besides the values (the model directory, the
        // device, the env servers), before anything is printed or written.
        cfg.validate_for_new_run()?;
        if args.print_config {
            print!("{}", cfg.to_toml()?);
            return Ok(());
        }
        let out = args.out.clone().unwrap_or_else(|| {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            PathBuf::from("runs").join(format!("{}-{ts}", cfg.name))
        });
        RunDir::check_new(&out).with_context(|| {
            format!(
                "--out {}: a new run is not written into an existing one; continue that run with `agentrl train --resume {}`, or choose another directory",
                out.display(),
                out.display()
            )
        })?;
        eprintln!("run directory: {}", out.display());
        Trainer::start(cfg, &out, &mut bars)?
    };
    let summary = trainer.train(&mut bars)?;
    println!(
        "{}/{}: held-out success {:.1}% -> {:.1}% ({:+.1} points) after {} RL steps in {:.0}s",
        summary.env,
        summary.difficulty,
        100.0 * summary.before.success_rate,
        100.0 * summary.after.success_rate,
        100.0 * (summary.after.success_rate - summary.before.success_rate),
        summary.steps,
        summary.wall_seconds
    );
    if let (Some(b), Some(a)) = (&summary.before_greedy, &summary.after_greedy) {
        println!(
            "greedy (temperature 0): {:.1}% -> {:.1}% ({:+.1} points)",
            100.0 * b.success_rate,
            100.0 * a.success_rate,
            100.0 * (a.success_rate - b.success_rate)
        );
    }
    if let Some(best) = &summary.best {
        println!(
            "best validation: {:.1}% at step {} ({})",
            100.0 * best.success_rate,
            best.step,
            summary.run_dir.join("checkpoints").join("best").display()
        );
    }
    println!(
        "summary: {}",
        summary.run_dir.join("summary.json").display()
    );
    Ok(())
}

/// The config named by `args`: an optional TOML path first (anything without
/// `=`), then `section.key=value` overrides; the embedded default without a path.
pub fn load_config(args: &[String]) -> anyhow::Result<TrainConfig> {
    load_config_or(args, DEFAULT_CONFIG)
}

/// [`load_config`] with the TOML text `default` in place of the embedded
/// default.
pub fn load_config_or(args: &[String], default: &str) -> anyhow::Result<TrainConfig> {
    let (config, overrides) = match args.split_first() {
        Some((first, rest)) if !first.contains('=') => (Some(PathBuf::from(first)), rest),
        _ => (None, args),
    };
    Ok(TrainConfig::load_or(config.as_deref(), default, overrides)?)
}
