//! `agentrl merge-lora`: a policy with a LoRA adapter written as a plain
//! Hugging Face checkpoint, the adapter merged into the base weights.

use std::path::PathBuf;

use agentrl_trainer::TrainedPolicy;
use anyhow::{bail, Context};

/// Arguments of `agentrl merge-lora`.
#[derive(clap::Args)]
pub struct MergeLoraArgs {
    /// A run directory (its latest checkpoint), one of a run's checkpoints
    /// (`RUN/checkpoints/best`) or a model directory with an `adapter/`.
    #[arg(long)]
    policy: PathBuf,
    /// Where to write the merged checkpoint (config.json, model.safetensors,
    /// tokenizer files); must not exist or be empty.
    #[arg(long)]
    out: PathBuf,
}

/// Runs `agentrl merge-lora`.
pub fn run(args: MergeLoraArgs) -> anyhow::Result<()> {
    let out = &args.out;
    let occupied = out.is_dir()
        && std::fs::read_dir(out)
            .with_context(|| format!("reading {}", out.display()))?
            .next()
            .is_some();
    if occupied || out.is_file() {
        bail!("{} exists and is not an empty directory", out.display());
    }
    let policy = TrainedPolicy::open(&args.policy)
        .with_context(|| format!("loading the policy of {}", args.policy.display()))?;
    let Some(adapter) = policy.model.lora() else {
        bail!(
            "{} has no LoRA adapter (no {}/adapter/adapter_config.json): nothing to merge",
            args.policy.display(),
            policy.checkpoint.display()
        );
    };
    let c = adapter.config();
    policy
        .model
        .save_merged(out)
        .with_context(|| format!("writing the merged model to {}", out.display()))?;
    policy
        .tokenizer
        .save(out)
        .with_context(|| format!("writing the tokenizer to {}", out.display()))?;
    println!(
        "merged the LoRA adapter of {} (r {}, alpha {}, {}) into {}",
        policy.checkpoint.display(),
        c.r,
        c.alpha,
        c.target_modules
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", "),
        out.display()
    );
    Ok(())
}
