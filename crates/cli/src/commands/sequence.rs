//! `agentrl sequence [CONFIG] [key=value …] --stages ENV[:DIFFICULTY[:STEPS]],… [--k 4] [--tasks 32] [--out DIR]`
//!
//! Sequential multi-environment training: one run per stage, each starting
//! from the previous stage's final policy; the start and every stage's end
//! evaluated on every stage's environment (avg@k on held-out validation
//! seeds), and the forgetting table (`forgetting.md`, `matrix.jsonl`).

use std::path::PathBuf;

use agentrl_env_core::{EnvParams, TaskSpec};
use agentrl_trainer::sequence::{forgetting_markdown, run_sequence, SequenceEval, SequenceStage};
use agentrl_trainer::trainer::env_maker;

use super::train::{load_config_or, Bars};
use agentrl_trainer::FORMAT_ONLY_CONFIG;

#[derive(clap::Args)]
pub struct SequenceArgs {
    /// A TOML config (default: configs/frozenlake-format-only.toml, embedded), then
    /// `section.key=value` overrides, applied to every stage.
    #[arg(value_name = "CONFIG_OR_OVERRIDE")]
    args: Vec<String>,
    /// The stages in order, comma-separated: `ENV[:DIFFICULTY[:STEPS]]`.
    #[arg(long, value_delimiter = ',', required = true)]
    stages: Vec<String>,
    /// RL steps of a stage that names none (default: the config's
    /// trainer.total_training_steps).
    #[arg(long)]
    steps: Option<usize>,
    /// Samples per validation task for avg@k.
    #[arg(long, default_value_t = 4)]
    k: usize,
    /// Validation tasks per environment (seeds 0..tasks of the val split).
    #[arg(long, default_value_t = 32)]
    tasks: u64,
    /// Sequence directory (default: `runs/sequence-<timestamp>`); must not exist or be empty.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

pub fn run(args: SequenceArgs) -> anyhow::Result<()> {
    let base = load_config_or(&args.args, FORMAT_ONLY_CONFIG)?;
    let default_steps = args.steps.unwrap_or(base.trainer.total_training_steps);
    let stages = args
        .stages
        .iter()
        .map(|s| SequenceStage::parse(s, default_steps).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(args.k >= 1, "--k must be at least 1");
    anyhow::ensure!(args.tasks >= 1, "--tasks must be at least 1");
    let out = super::study::new_output_dir(args.out.as_ref(), "sequence", "sequence")?;
    let remote = match base.env.endpoint.is_empty() {
        true => None,
        false => Some(env_maker(&base)?),
    };
    let local = |spec: &TaskSpec, params: &EnvParams| agentrl_envs::make_env(spec, params);
    let eval = SequenceEval {
        make: match &remote {
            Some(m) => m.as_ref(),
            None => &local,
        },
        tasks: args.tasks,
        k: args.k,
        temperature: base.trainer.val_temperature,
        seed: base.trainer.seed,
    };
    let mut bars = Bars::new(args.quiet);
    let (summaries, rows) = run_sequence(&base, &stages, &out, &eval, &mut bars)?;
    for (stage, s) in stages.iter().zip(&summaries) {
        println!(
            "{}: validation {:.1}% -> {:.1}% in {} steps ({})",
            stage.key(),
            100.0 * s.before.success_rate,
            100.0 * s.after.success_rate,
            s.steps,
            s.run_dir.display()
        );
    }
    println!(
        "\navg@{} on {} validation tasks per env:\n",
        args.k, args.tasks
    );
    print!("{}", forgetting_markdown(&rows));
    println!(
        "\n{} and {}",
        out.join("forgetting.md").display(),
        out.join("matrix.jsonl").display()
    );
    Ok(())
}
