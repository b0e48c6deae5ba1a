//! `agentrl serve-policy`: a local model (a model directory or a run's
//! checkpoint) behind an OpenAI-compatible API, until ctrl-c or SIGTERM.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use agentrl_policy_server::{
    serve_until, BatchLimits, PolicyServerConfig, ServedModel, DEFAULT_PORT,
};
use agentrl_trainer::TrainedPolicy;
use anyhow::Context;

use super::serve::shutdown_signal;

#[derive(clap::Args)]
pub struct ServePolicyArgs {
    /// A model directory, a GGUF file, a run directory (its latest
    /// checkpoint) or one of a run's checkpoints (`RUN/checkpoints/best`),
    /// as `eval --policy` takes.
    #[arg(long)]
    model: PathBuf,
    /// Address to bind; loopback by default (use 0.0.0.0 with --api-key to expose it).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// The model's name in /v1/models and requests (default: --model as given, as vLLM does).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on every /v1 route
    /// (default: $AGENTRL_POLICY_API_KEY, which keeps it out of `ps`).
    #[arg(long)]
    api_key: Option<String>,
    /// Sequences (prompts × n) per model call at most.
    #[arg(long, default_value_t = BatchLimits::default().max_batch_sequences)]
    max_batch_sequences: usize,
    /// Milliseconds an idle model waits for more requests before it starts a batch.
    #[arg(long, default_value_t = BatchLimits::default().window.as_millis() as u64)]
    batch_window_ms: u64,
    /// Requests waiting for the model at most (503 beyond).
    #[arg(long, default_value_t = BatchLimits::default().max_queued)]
    max_queued: usize,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = PolicyServerConfig::default().body_limit)]
    body_limit: usize,
    /// Open connections at most.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Seconds one request may take, generation included (503 beyond).
    #[arg(long, default_value_t = 600)]
    request_timeout_secs: u64,
    /// Tokio worker threads (they only move bytes: the model has its own thread).
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

pub fn run(args: ServePolicyArgs) -> anyhow::Result<()> {
    let policy = TrainedPolicy::open(&args.model)
        .with_context(|| format!("loading the model of {}", args.model.display()))?;
    let name = args
        .served_model_name
        .unwrap_or_else(|| args.model.display().to_string());
    let config = PolicyServerConfig {
        addr: SocketAddr::new(args.host, args.port),
        served_model_name: name.clone(),
        api_key: args.api_key.or_else(|| {
            std::env::var("AGENTRL_POLICY_API_KEY")
                .ok()
                .filter(|k| !k.is_empty())
        }),
        batch: BatchLimits {
            max_batch_sequences: args.max_batch_sequences,
            window: Duration::from_millis(args.batch_window_ms),
            max_queued: args.max_queued,
        },
        body_limit: args.body_limit,
        max_connections: args.max_connections,
        request_timeout: Duration::from_secs(args.request_timeout_secs),
        ..PolicyServerConfig::default()
    };
    if !args.host.is_loopback() && config.api_key.is_none() {
        eprintln!(
            "warning: serving on {} without --api-key: anyone who can reach it can use it",
            args.host
        );
    }
    let served = ServedModel {
        model: policy.model,
        tokenizer: policy.tokenizer,
    };
    let checkpoint = policy.checkpoint.display().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(serve_until(config, served, shutdown_signal(), |addr| {
        println!("agentrl serve-policy: listening on http://{addr} (model {name:?} from {checkpoint})");
        println!("  OpenAI base URL: http://{addr}/v1   routes: GET /v1/models[/{{id}}], POST /v1/completions, POST /v1/chat/completions (stream, tools, logprobs)   ctrl-c to stop");
    }))?;
    println!("agentrl serve-policy: stopped");
    Ok(())
}
