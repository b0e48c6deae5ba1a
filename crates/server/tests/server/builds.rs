//! Task builds are tied to their request (issue 47): a client that hangs up
//! or times out cancels its build, and at most `max_builds` builds run at
//! once while the rest wait in line.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use agentrl_env_core::{build_cancelled, Env, EnvDescriptor, EnvError, EnvParams, TaskSpec};
use agentrl_server::{ServerConfig, ServerHandle};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common::{all_descriptors, counter_factory, test_config, Api};

/// What the builds of one test's "waiter" sessions did.
#[derive(Default)]
struct Gate {
    /// Builds finish once this is set.
    open: AtomicBool,
    running: AtomicUsize,
    /// The most builds that ran at once.
    peak: AtomicUsize,
    /// Builds that saw their cancellation and stopped.
    cancelled: AtomicUsize,
}

/// Each test's gate, by the name its requests send as the `gate` param
/// (tests run in parallel in one process).
static GATES: LazyLock<Mutex<HashMap<String, Arc<Gate>>>> = LazyLock::new(Default::default);

fn gate(name: &str) -> Arc<Gate> {
    let mut gates = GATES.lock().unwrap();
    Arc::clone(gates.entry(name.to_string()).or_default())
}

/// A build that waits until its gate opens or it is cancelled (a build
/// that is never cancelled gives up after a minute, and the test that
/// waited on it fails).
fn waiter_factory(spec: &TaskSpec, params: &EnvParams) -> Result<Box<dyn Env>, EnvError> {
    let name = params
        .get("gate")
        .and_then(Value::as_str)
        .ok_or_else(|| agentrl_env_core::param_error("waiter", "gate", "required"))?;
    let g = gate(name);
    let now = g.running.fetch_add(1, Ordering::SeqCst) + 1;
    g.peak.fetch_max(now, Ordering::SeqCst);
    let give_up = Instant::now() + Duration::from_secs(60);
    let outcome = loop {
        if build_cancelled() {
            g.cancelled.fetch_add(1, Ordering::SeqCst);
            break Err(EnvError::cancelled("waiter"));
        }
        if g.open.load(Ordering::SeqCst) {
            break counter_factory(spec, &EnvParams::new());
        }
        if Instant::now() > give_up {
            break Err(EnvError::generation(
                "waiter",
                "never cancelled nor released",
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    g.running.fetch_sub(1, Ordering::SeqCst);
    outcome
}

fn waiter_descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: "waiter",
        summary: "test env: a build that waits for its gate",
        difficulties: &["easy"],
        default_max_turns: 10,
        request_params: &["gate"],
        operator_params: &[],
        factory: waiter_factory,
    }
}

async fn start(change: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    let mut config = test_config();
    change(&mut config);
    let mut descriptors = all_descriptors();
    descriptors.push(waiter_descriptor());
    agentrl_server::spawn(config, descriptors).await.unwrap()
}

/// `/health`'s build counters: (running, waiting).
async fn builds(api: &Api) -> (u64, u64) {
    let (_, v) = api.get("/health").await;
    (
        v["builds_running"].as_u64().unwrap(),
        v["builds_waiting"].as_u64().unwrap(),
    )
}

/// Wait until `/health` shows `want`; the last reading otherwise.
async fn wait_for_builds(api: &Api, want: (u64, u64)) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = builds(api).await;
        if got == want || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Send a create for a waiter session on a raw connection (no answer read).
async fn send_create(addr: std::net::SocketAddr, gate: &str) -> TcpStream {
    let body = json!({"env": "waiter", "params": {"gate": gate}}).to_string();
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /create HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_cancels_its_build() {
    let server = start(|_| {}).await;
    let api = Api::new(&server);
    let g = gate("hang-up");
    let conn = send_create(server.local_addr(), "hang-up").await;
    assert_eq!(wait_for_builds(&api, (1, 0)).await, (1, 0));
    drop(conn);
    // Without cancellation the build would wait a minute for its gate.
    assert_eq!(wait_for_builds(&api, (0, 0)).await, (0, 0));
    assert_eq!(g.cancelled.load(Ordering::SeqCst), 1);
    assert_eq!(server.live_sessions(), 0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_times_out_cancels_its_build() {
    let server = start(|c| c.request_timeout = Duration::from_millis(300)).await;
    let api = Api::new(&server);
    let g = gate("timeout");
    let (s, v) = api
        .create(json!({"env": "waiter", "params": {"gate": "timeout"}}))
        .await;
    assert_eq!(
        (s.as_u16(), v["kind"].as_str()),
        (503, Some("timeout")),
        "{v}"
    );
    assert_eq!(wait_for_builds(&api, (0, 0)).await, (0, 0));
    assert_eq!(g.cancelled.load(Ordering::SeqCst), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_builds_run_and_the_rest_wait_in_line() {
    let server = start(|c| c.max_builds = 2).await;
    let api = Api::new(&server);
    let g = gate("line");
    let mut creates = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let api = api.clone();
        creates.spawn(async move {
            api.create(json!({"env": "waiter", "params": {"gate": "line"}}))
                .await
        });
    }
    assert_eq!(wait_for_builds(&api, (2, 3)).await, (2, 3));
    // A client waiting in line that hangs up leaves it, without a build.
    let left = send_create(server.local_addr(), "line").await;
    assert_eq!(wait_for_builds(&api, (2, 4)).await, (2, 4));
    drop(left);
    assert_eq!(wait_for_builds(&api, (2, 3)).await, (2, 3));
    // A slot is taken before its build thread starts: let both builds begin
    // before the gate opens, or the first may finish before the second starts.
    let deadline = Instant::now() + Duration::from_secs(30);
    while g.running.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    g.open.store(true, Ordering::SeqCst);
    while let Some(answer) = creates.join_next().await {
        let (s, v) = answer.unwrap();
        assert_eq!(s, 200, "{v}");
    }
    assert_eq!(g.peak.load(Ordering::SeqCst), 2);
    assert_eq!(g.cancelled.load(Ordering::SeqCst), 0);
    assert_eq!(server.live_sessions(), 5);
    assert_eq!(builds(&api).await, (0, 0));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn max_builds_of_zero_is_a_configuration_error() {
    let mut config = test_config();
    config.max_builds = 0;
    let err = agentrl_server::spawn(config, all_descriptors())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("max_builds"), "{err}");
}
