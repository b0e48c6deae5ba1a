//! Starting and stopping the policy server: configuration, the model
//! thread, graceful shutdown, and a background runner for synchronous callers.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agentrl_connections::{BackgroundRuntime, ConnectionLimits, Hardening};
use agentrl_model::PolicyModel;
use agentrl_tokenizer::ChatTokenizer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::batcher::{BatchLimits, GenerationStats, Generator};
use crate::error::ServerError;
use crate::plan::ModelLimits;
use crate::routes::{router, AppState};

/// The default port, vLLM's.
pub const DEFAULT_PORT: u16 = 8000;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct PolicyServerConfig {
    /// Where to listen; loopback by default. Port 0 lets the OS pick one.
    pub addr: SocketAddr,
    /// The model's name in `/v1/models` and in requests' `model`.
    pub served_model_name: String,
    /// When set, every `/v1` route needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// How requests are batched for the model.
    pub batch: BatchLimits,
    /// Largest accepted request body in bytes; larger bodies get 413.
    pub body_limit: usize,
    /// Open connections at most (see `agentrl-connections`).
    pub max_connections: usize,
    /// Time a connection has to send a whole request head.
    pub header_timeout: Duration,
    /// Time one request may take, generation included; beyond it 503.
    pub request_timeout: Duration,
    /// How long shutdown waits for in-flight requests.
    pub drain_timeout: Duration,
}

impl Default for PolicyServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            served_model_name: "agentrl".into(),
            api_key: None,
            batch: BatchLimits::default(),
            // Token-id prompts of a long context: 128k ids are about 1 MB of JSON.
            body_limit: 8 << 20,
            max_connections: 512,
            header_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

impl PolicyServerConfig {
    fn validate(&self) -> Result<(), ServerError> {
        let bad = |m: &str| Err(ServerError::Config(m.to_string()));
        if self.served_model_name.trim().is_empty() {
            return bad("the served model name must not be empty");
        }
        if self.api_key.as_deref().is_some_and(str::is_empty) {
            return bad("the API key must not be empty");
        }
        if self.batch.max_batch_sequences == 0 {
            return bad("max_batch_sequences must be at least 1");
        }
        if self.batch.max_queued == 0 {
            return bad("max_queued must be at least 1");
        }
        if self.body_limit == 0 {
            return bad("the body limit must be at least 1 byte");
        }
        if self.max_connections == 0 {
            return bad("max_connections must be at least 1");
        }
        if self.header_timeout.is_zero() || self.request_timeout.is_zero() {
            return bad("the header and request timeouts must be positive");
        }
        Ok(())
    }
}

/// The model and tokenizer a server answers with.
pub struct ServedModel {
    pub model: PolicyModel,
    pub tokenizer: ChatTokenizer,
}

impl ServedModel {
    /// What requests are checked against.
    fn limits(&self) -> ModelLimits {
        let eos_ids = match self.tokenizer.generation_config().get("eos_token_id") {
            Some(serde_json::Value::Array(ids)) => ids
                .iter()
                .filter_map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect(),
            _ => self.tokenizer.stop_ids(),
        };
        ModelLimits {
            vocab_size: self.model.config.vocab_size,
            max_model_len: self.model.config.max_position_embeddings,
            eos_ids,
            max_token_bytes: crate::bounds::max_token_bytes(&self.tokenizer),
        }
    }
}

/// A running server (started with [`spawn`]).
pub struct PolicyServerHandle {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    drain_timeout: Duration,
    stats: GenerationStats,
}

impl PolicyServerHandle {
    /// The bound address (the real port when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ip:port`, the root URL for clients.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The model thread's counts: sequences under way, tokens generated.
    pub fn stats(&self) -> GenerationStats {
        self.stats.clone()
    }

    /// Stop accepting, let in-flight requests finish (up to the drain timeout).
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            // The receiver is gone only if the server already stopped.
            let _ = tx.send(());
        }
        if tokio::time::timeout(self.drain_timeout, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("in-flight requests did not finish within the drain timeout");
            self.task.abort();
        }
    }
}

/// Bind and start serving in the current tokio runtime.
pub async fn spawn(
    config: PolicyServerConfig,
    served: ServedModel,
) -> Result<PolicyServerHandle, ServerError> {
    let (tx, rx) = oneshot::channel::<()>();
    let (addr, task, stats) = start(config.clone(), served, async move {
        // A dropped sender also means stop.
        let _ = rx.await;
    })
    .await?;
    Ok(PolicyServerHandle {
        addr,
        shutdown: Some(tx),
        task,
        drain_timeout: config.drain_timeout,
        stats,
    })
}

/// Serve until `signal` completes (e.g. ctrl-c), then drain and return.
pub async fn serve_until(
    config: PolicyServerConfig,
    served: ServedModel,
    signal: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let (addr, task, _) = start(config, served, signal).await?;
    on_ready(addr);
    task.await
        .map_err(|e| ServerError::Io(std::io::Error::other(e.to_string())))
}

async fn start(
    config: PolicyServerConfig,
    served: ServedModel,
    signal: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, JoinHandle<()>, GenerationStats), ServerError> {
    config.validate()?;
    if !config.addr.ip().is_loopback() && config.api_key.is_none() {
        tracing::warn!(addr = %config.addr, "serving a policy on a non-loopback address without an API key");
    }
    let limits = served.limits();
    let listener = agentrl_connections::bind(config.addr).await?;
    let addr = listener.local_addr()?;
    let ServedModel { model, tokenizer } = served;
    // The thread ends when the state (the queue's sender) is dropped.
    let (generator, _model_thread) = Generator::start(model, config.batch)?;
    let stats = generator.stats();
    let state = Arc::new(AppState {
        name: config.served_model_name.clone(),
        tokenizer: Arc::new(tokenizer),
        limits,
        generator,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        adapters: Default::default(),
    });
    let app = router(
        state,
        Hardening {
            body_limit: config.body_limit,
            request_timeout: config.request_timeout,
            bearer_token: config.api_key.clone(),
        },
    );
    let conn_limits = ConnectionLimits {
        max_connections: config.max_connections,
        header_timeout: config.header_timeout,
    };
    let task = tokio::spawn(agentrl_connections::serve(
        listener,
        app,
        conn_limits,
        signal,
    ));
    Ok((addr, task, stats))
}

/// A server on its own tokio runtime, for synchronous code (tests, a
/// rollout that wants a policy over loopback). Dropping it shuts it down.
/// Do not drop it inside an async context.
pub struct BackgroundPolicyServer {
    server: BackgroundRuntime<PolicyServerHandle>,
}

impl BackgroundPolicyServer {
    /// Start on a new multi-threaded runtime with `worker_threads` workers.
    pub fn start(
        config: PolicyServerConfig,
        served: ServedModel,
        worker_threads: usize,
    ) -> Result<Self, ServerError> {
        let server = BackgroundRuntime::start(worker_threads, "agentrl-policy-server", || {
            spawn(config, served)
        })?;
        Ok(Self { server })
    }

    /// `http://ip:port`.
    pub fn base_url(&self) -> String {
        self.server
            .handle()
            .map(PolicyServerHandle::base_url)
            .unwrap_or_default()
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.handle().map(PolicyServerHandle::local_addr)
    }

    /// The model thread's counts (see [`PolicyServerHandle::stats`]).
    pub fn stats(&self) -> Option<GenerationStats> {
        self.server.handle().map(PolicyServerHandle::stats)
    }
}

impl Drop for BackgroundPolicyServer {
    fn drop(&mut self) {
        self.server.stop(PolicyServerHandle::shutdown);
    }
}
