//! Starting and stopping the server: configuration, the reaper task, graceful
//! shutdown, and a background runner for synchronous callers.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agentrl_connections::{BackgroundRuntime, ConnectionLimits, Hardening};
use agentrl_env_core::{EnvDescriptor, Split, TaskSpec};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::builds::Builds;
use crate::error::ServerError;
use crate::params::OperatorParams;
use crate::routes::{router, AppState};
use crate::sessions::SessionStore;

/// The default port, AgentGym's first env-server port.
pub const DEFAULT_PORT: u16 = 36001;

/// The largest connection cap accepted (far above any descriptor limit).
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen; loopback by default. Port 0 lets the OS pick one.
    pub addr: SocketAddr,
    /// When set, every route but `/health` needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Live sessions at most; `create` answers 503 beyond.
    pub max_sessions: usize,
    /// A session unused for this long is closed by the reaper.
    pub ttl: Duration,
    /// How often the reaper looks; `None`: a quarter of the TTL, within 100 ms..30 s.
    pub reap_interval: Option<Duration>,
    /// Largest accepted request body in bytes; larger bodies get 413.
    pub body_limit: usize,
    /// Open connections at most; a client over the cap waits while the
    /// oldest open connections are asked to close once idle.
    pub max_connections: usize,
    /// Time a connection has to send a whole request head, from opening or
    /// from its previous response: closes slowloris and idle connections.
    pub header_timeout: Duration,
    /// Time one request may take, body included; beyond it 503 `timeout`.
    pub request_timeout: Duration,
    /// The operator's env params, `[ENV.]KEY=VALUE` each (file paths, cache
    /// directories, defaults): requests' params lie over them, and a
    /// request may not set the operator-only ones.
    pub env_params: Vec<String>,
    /// How long shutdown waits for in-flight requests before giving up on them.
    pub drain_timeout: Duration,
    /// Task builds (create, a reset to another task) and expert searches
    /// running at once; more wait in line. Each may hold up to ~100 MB
    /// while it runs (Sokoban's solver at its work budget).
    pub max_builds: usize,
    /// When set, the process-wide budget of the data envs share
    /// ([`agentrl_env_core::SHARED_DATA`]: catalogs, corpora, their
    /// indexes), in bytes; a create that needs more answers 503 `busy`.
    pub shared_data_limit: Option<usize>,
}

/// The default of [`ServerConfig::max_builds`]: one per core, at most 4
/// (4 builds at their work budget stay near 400 MB).
pub fn default_max_builds() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            token: None,
            max_sessions: 4096,
            ttl: Duration::from_secs(600),
            reap_interval: None,
            body_limit: 1 << 20,
            // Below the usual 1024-descriptor soft limit, with room for the
            // index files and the rest of the process.
            max_connections: 512,
            header_timeout: Duration::from_secs(30),
            // Under HttpEnv's 60 s client timeout, so the client hears why.
            request_timeout: Duration::from_secs(30),
            env_params: Vec::new(),
            drain_timeout: Duration::from_secs(10),
            max_builds: default_max_builds(),
            shared_data_limit: None,
        }
    }
}

impl ServerConfig {
    fn reap_every(&self) -> Duration {
        self.reap_interval.unwrap_or_else(|| {
            (self.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
        })
    }

    fn validate(&self) -> Result<(), ServerError> {
        if self.max_sessions == 0 {
            return Err(ServerError::Config(
                "max_sessions must be at least 1".into(),
            ));
        }
        if self.ttl.is_zero() {
            return Err(ServerError::Config(
                "the session TTL must be positive".into(),
            ));
        }
        if self.token.as_deref().is_some_and(str::is_empty) {
            return Err(ServerError::Config("the token must not be empty".into()));
        }
        if self.body_limit == 0 {
            return Err(ServerError::Config(
                "the body limit must be at least 1 byte (an empty body is read as {})".into(),
            ));
        }
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.max_connections) {
            return Err(ServerError::Config(format!(
                "max_connections must be between 1 and {MAX_CONNECTIONS_LIMIT}"
            )));
        }
        if self.max_builds == 0 {
            return Err(ServerError::Config("max_builds must be at least 1".into()));
        }
        if self.header_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(ServerError::Config(
                "the header and request timeouts must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// The registry's environments, all of them or those named (in registry order).
pub fn registry_descriptors(names: Option<&[String]>) -> Result<Vec<EnvDescriptor>, ServerError> {
    select(agentrl_envs::descriptors(), names)
}

/// `all` restricted to `names` (unknown names are an error).
pub fn select(
    all: Vec<EnvDescriptor>,
    names: Option<&[String]>,
) -> Result<Vec<EnvDescriptor>, ServerError> {
    let Some(names) = names else { return Ok(all) };
    let available = all.iter().map(|d| d.name).collect::<Vec<_>>().join(", ");
    for n in names {
        if !all.iter().any(|d| d.name == n) {
            return Err(ServerError::UnknownEnv {
                name: n.clone(),
                available,
            });
        }
    }
    Ok(all
        .into_iter()
        .filter(|d| names.iter().any(|n| n == d.name))
        .collect())
}

/// A running server (started with [`spawn`]).
pub struct ServerHandle {
    addr: SocketAddr,
    state: Arc<AppState>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServerError>>,
    drain_timeout: Duration,
}

impl ServerHandle {
    /// The bound address (the real port when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ip:port`, the base URL for clients.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Live sessions right now.
    pub fn live_sessions(&self) -> usize {
        self.state.sessions.len()
    }

    /// Stop accepting connections, let in-flight requests finish (up to the
    /// drain timeout), then return.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            // The receiver is gone only if the server already stopped.
            let _ = tx.send(());
        }
        match tokio::time::timeout(self.drain_timeout, &mut self.task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(ServerError::Io(std::io::Error::other(join.to_string()))),
            Err(_) => {
                tracing::warn!("in-flight requests did not finish within the drain timeout");
                self.task.abort();
                Ok(())
            }
        }
    }
}

/// Bind and start serving in the current tokio runtime.
pub async fn spawn(
    config: ServerConfig,
    descriptors: Vec<EnvDescriptor>,
) -> Result<ServerHandle, ServerError> {
    let (tx, rx) = oneshot::channel::<()>();
    let (addr, state, task) = start(config.clone(), descriptors, async move {
        // A dropped sender also means stop.
        let _ = rx.await;
    })
    .await?;
    Ok(ServerHandle {
        addr,
        state,
        shutdown: Some(tx),
        task,
        drain_timeout: config.drain_timeout,
    })
}

/// Serve until `signal` completes (e.g. ctrl-c), then drain and return.
pub async fn serve_until(
    config: ServerConfig,
    descriptors: Vec<EnvDescriptor>,
    signal: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let (addr, _state, task) = start(config, descriptors, signal).await?;
    on_ready(addr);
    task.await
        .map_err(|e| ServerError::Io(std::io::Error::other(e.to_string())))?
}

async fn start(
    config: ServerConfig,
    descriptors: Vec<EnvDescriptor>,
    signal: impl Future<Output = ()> + Send + 'static,
) -> Result<
    (
        SocketAddr,
        Arc<AppState>,
        JoinHandle<Result<(), ServerError>>,
    ),
    ServerError,
> {
    config.validate()?;
    if descriptors.is_empty() {
        return Err(ServerError::NoEnvs);
    }
    if !config.addr.ip().is_loopback() && config.token.is_none() {
        tracing::warn!(addr = %config.addr, "serving on a non-loopback address without --token");
    }
    if let Some(limit) = config.shared_data_limit {
        agentrl_env_core::SHARED_DATA.set_limit(limit);
    }
    let operator_params = OperatorParams::parse(&config.env_params, &descriptors)?;
    check_operator_params(&operator_params, &descriptors).await?;
    let envs: BTreeMap<&'static str, EnvDescriptor> =
        descriptors.into_iter().map(|d| (d.name, d)).collect();
    let state = Arc::new(AppState {
        envs,
        sessions: SessionStore::new(config.max_sessions),
        operator_params,
        builds: Builds::new(config.max_builds),
    });
    let listener = agentrl_connections::bind(config.addr).await?;
    let addr = listener.local_addr()?;
    let app = router(
        Arc::clone(&state),
        Hardening {
            body_limit: config.body_limit,
            request_timeout: config.request_timeout,
            bearer_token: config.token.clone(),
        },
    );
    let limits = ConnectionLimits {
        max_connections: config.max_connections,
        header_timeout: config.header_timeout,
    };

    let reaper = {
        let state = Arc::clone(&state);
        let ttl = config.ttl;
        let every = config.reap_every();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let n = state.sessions.reap(ttl);
                if n > 0 {
                    tracing::info!(reaped = n, "closed idle sessions");
                }
            }
        })
    };

    let task = tokio::spawn(async move {
        agentrl_connections::serve(listener, app, limits, signal).await;
        reaper.abort();
        Ok(())
    });
    Ok((addr, state, task))
}

/// Build one task of each env the operator set params for, so that a bad
/// path or value stops the server at start instead of failing every client.
async fn check_operator_params(
    params: &OperatorParams,
    descriptors: &[EnvDescriptor],
) -> Result<(), ServerError> {
    for (name, env_params) in params.iter() {
        let Some(desc) = descriptors.iter().find(|d| d.name == name).cloned() else {
            continue;
        };
        let difficulty = params.default_difficulty(&desc);
        let spec = TaskSpec::new(name, Split::Train, difficulty, 0);
        let env_params = env_params.clone();
        let built = tokio::task::spawn_blocking(move || desc.create(&spec, &env_params).map(drop))
            .await
            .map_err(|e| ServerError::EnvParam(format!("{name}: building a task panicked: {e}")))?;
        built.map_err(|e| ServerError::EnvParam(format!("{name}: {e}")))?;
    }
    Ok(())
}

/// A server on its own tokio runtime, for synchronous code (tests, benches,
/// a rollout that wants in-process HTTP). Dropping it shuts the server down.
/// Do not drop it inside an async context.
pub struct BackgroundServer {
    server: BackgroundRuntime<ServerHandle>,
}

impl BackgroundServer {
    /// Start on a new multi-threaded runtime with `worker_threads` workers.
    pub fn start(
        config: ServerConfig,
        descriptors: Vec<EnvDescriptor>,
        worker_threads: usize,
    ) -> Result<Self, ServerError> {
        let server = BackgroundRuntime::start(worker_threads, "agentrl-server", || {
            spawn(config, descriptors)
        })?;
        Ok(Self { server })
    }

    fn handle(&self) -> Option<&ServerHandle> {
        self.server.handle()
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.handle().map(ServerHandle::local_addr)
    }

    /// `http://ip:port`.
    pub fn base_url(&self) -> String {
        self.handle()
            .map(ServerHandle::base_url)
            .unwrap_or_default()
    }

    /// Live sessions right now.
    pub fn live_sessions(&self) -> usize {
        self.handle().map_or(0, ServerHandle::live_sessions)
    }

    /// Shut down and wait for in-flight requests.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ServerError> {
        self.server.stop(ServerHandle::shutdown).unwrap_or(Ok(()))
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!(error = %e, "server shutdown failed");
        }
    }
}
