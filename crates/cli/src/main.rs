//! `agentrl`: train LLM agents with multi-turn reinforcement learning.
//!
//! Each subcommand lives in its own module under `commands/`; this file only
//! parses the command line and dispatches.

mod commands;
#[cfg(test)]
mod doc_commands;

use clap::{Parser, Subcommand};

// candle allocates a fresh buffer for every op result; with glibc's malloc the
// large ones are mmapped and unmapped each time, and page faults took half of a
// training run's wall time. mimalloc keeps and reuses those pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc's `mi_option_e` (the same in v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keep freed pages instead of returning them to the OS after 10 ms: each
/// step reallocates the same large buffers, and a returned page comes back as
/// a page fault that zeroes it (a fifth of a training step's time).
/// `MIMALLOC_PURGE_DELAY` in the environment still wins.
fn keep_freed_pages() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer option of the allocator; it is read,
        // not cached, wherever mimalloc decides whether to purge.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

#[derive(Parser)]
#[command(
    name = "agentrl",
    version,
    about = "Train LLM agents with multi-turn reinforcement learning"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List environments, their difficulties and seed splits.
    Envs(commands::envs::EnvsArgs),
    /// Play an environment in the terminal (actions from stdin, one per line).
    Play(commands::play::PlayArgs),
    /// Evaluate a policy (expert, random, or a trained model) on an environment.
    Eval(Box<commands::eval::EvalArgs>),
    /// Train a policy: SFT warm start then RL (default: embedded tiny setup).
    Train(commands::train::TrainArgs),
    /// The configuration reference (--reference), or a resolved config as TOML.
    Config(commands::config::ConfigArgs),
    /// Generate text with a model directory (chat template, sampling).
    Generate(commands::generate::GenerateArgs),
    /// Write a policy's LoRA adapter merged into its base weights, as a plain Hugging Face checkpoint.
    MergeLora(commands::merge_lora::MergeLoraArgs),
    /// Serve environments over HTTP (AgentGym's env-server protocol).
    Serve(commands::serve::ServeArgs),
    /// Serve a model over an OpenAI-compatible API (completions with token ids and log-probs).
    ServePolicy(commands::serve_policy::ServePolicyArgs),
    /// Benchmarks: environments, model, server.
    Bench(commands::bench::BenchArgs),
    /// report.md and a self-contained report.html (PNG plots) of a run, sequence or study.
    Report(commands::report::ReportArgs),
    /// Sequential multi-environment training and its forgetting table.
    Sequence(commands::sequence::SequenceArgs),
    /// Studies that train several runs and compare them (the Echo Trap).
    Study(commands::study::StudyArgs),
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", render_error(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error as `main` returning it would print it, without the backtrace:
/// anyhow captures one whenever `RUST_BACKTRACE` is set (common on
/// developers' machines), and the errors that reach here are about the
/// user's input (a config value, a missing file, a server that does not
/// answer), where a stack trace only buries the message. A panic, a bug,
/// still prints its backtrace.
fn render_error(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    let causes: Vec<String> = e.chain().skip(1).map(ToString::to_string).collect();
    if !causes.is_empty() {
        text.push_str("\n\nCaused by:");
        for (i, cause) in causes.iter().enumerate() {
            if causes.len() == 1 {
                text.push_str(&format!("\n    {cause}"));
            } else {
                text.push_str(&format!("\n    {i}: {cause}"));
            }
        }
    }
    text
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // A long-lived env server gives freed memory back (its RSS then follows
    // its live sessions and caches); the tensor commands keep it.
    if !matches!(cli.command, Command::Serve(_)) {
        keep_freed_pages();
    }
    match cli.command {
        Command::Envs(a) => commands::envs::run(a),
        Command::Play(a) => commands::play::run(a),
        Command::Eval(a) => commands::eval::run(*a),
        Command::Train(a) => commands::train::run(a),
        Command::Config(a) => commands::config::run(a),
        Command::Generate(a) => commands::generate::run(a),
        Command::MergeLora(a) => commands::merge_lora::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::ServePolicy(a) => commands::serve_policy::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Report(a) => commands::report::run(a),
        Command::Sequence(a) => commands::sequence::run(a),
        Command::Study(a) => commands::study::run(a),
    }
}
