//! `agentrl serve`: every registered environment over HTTP (AgentGym's
//! env-server routes), until ctrl-c or SIGTERM; in-flight requests finish.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use agentrl_server::{
    default_max_builds, registry_descriptors, serve_until, ServerConfig, DEFAULT_PORT,
};
use anyhow::Context;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to bind; loopback by default (use 0.0.0.0 with --token to expose it).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Serve only these environments (comma-separated); default: all registered.
    #[arg(long, value_delimiter = ',')]
    envs: Option<Vec<String>>,
    /// Require `Authorization: Bearer TOKEN` on every route but /health
    /// (default: $AGENTRL_SERVER_TOKEN, which keeps it out of `ps`).
    #[arg(long)]
    token: Option<String>,
    /// Most live sessions; `create` answers 503 beyond.
    #[arg(long, default_value_t = 4096)]
    max_sessions: usize,
    /// Close sessions idle for this many seconds.
    #[arg(long, default_value_t = 600)]
    ttl_secs: u64,
    /// Largest request body in bytes (413 beyond); at least 1.
    #[arg(long, default_value_t = 1 << 20)]
    body_limit: usize,
    /// Open connections at most; over it, a new client waits while the
    /// connection idle the longest (at least 1 s) is closed to make room.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Seconds a connection has to send a whole request head, from opening
    /// or from its previous answer (closes slowloris and idle connections).
    #[arg(long, default_value_t = 30)]
    header_timeout_secs: u64,
    /// Seconds one request may take, body included (503 kind=timeout beyond).
    #[arg(long, default_value_t = 30)]
    request_timeout_secs: u64,
    /// An env param set by the operator, `[ENV.]KEY=VALUE` (repeatable): file
    /// paths and cache directories, which a request may not send, or defaults
    /// that a request's params override. KEY alone applies to every served
    /// env that has it. VALUE is JSON or a bare string. `ENV.difficulty=NAME`
    /// sets the difficulty of ENV's sessions whose client names none (as
    /// AgentGym's clients cannot), e.g. `babyai.difficulty=hard`.
    #[arg(long = "env-param", value_name = "[ENV.]KEY=VALUE")]
    env_params: Vec<String>,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Task builds (create, reset to another task, the expert's search)
    /// running at once; more requests wait in line, and a request whose
    /// client hangs up leaves the line or stops its build (default: one per
    /// core, at most 4).
    #[arg(long)]
    max_builds: Option<usize>,
    /// MiB that the data envs share may hold at once: WebShop's catalogs,
    /// SearchQA's corpora and their indexes, built once per size and shared
    /// by every session over them. A create that needs more while open
    /// sessions hold the rest answers 503 `busy` (with Retry-After).
    #[arg(long, default_value_t = 512)]
    shared_data_mib: usize,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let descriptors = registry_descriptors(args.envs.as_deref())?;
    let config = ServerConfig {
        addr: SocketAddr::new(args.host, args.port),
        token: args.token.or_else(|| {
            std::env::var("AGENTRL_SERVER_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
        }),
        max_sessions: args.max_sessions,
        ttl: Duration::from_secs(args.ttl_secs),
        body_limit: args.body_limit,
        max_connections: args.max_connections,
        header_timeout: Duration::from_secs(args.header_timeout_secs),
        request_timeout: Duration::from_secs(args.request_timeout_secs),
        env_params: args.env_params,
        max_builds: args.max_builds.unwrap_or_else(default_max_builds),
        shared_data_limit: Some(args.shared_data_mib.saturating_mul(1 << 20)),
        ..ServerConfig::default()
    };
    if !args.host.is_loopback() && config.token.is_none() {
        eprintln!(
            "warning: serving on {} without --token: anyone who can reach it can use it",
            args.host
        );
    }
    let names: Vec<&str> = descriptors.iter().map(|d| d.name).collect();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(w) = args.workers {
        rt.worker_threads(w.max(1));
    }
    let rt = rt
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(serve_until(config, descriptors, shutdown_signal(), |addr| {
        println!("agentrl serve: listening on http://{addr} (envs: {})", names.join(", "));
        println!("  AgentGym base URL per env: http://{addr}/<env>   health: http://{addr}/health   ctrl-c to stop");
    }))?;
    println!("agentrl serve: stopped");
    Ok(())
}

/// ctrl-c, or SIGTERM on Unix (what `docker stop` and systemd send).
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("agentrl: shutting down, draining in-flight requests");
}
