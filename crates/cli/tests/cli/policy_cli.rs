//! `agentrl serve-policy` and `agentrl eval --policy-endpoint`, as a user
//! runs them (the built binary): a tiny run's checkpoint served on loopback
//! plays the same greedy episodes through the server as in-process, also
//! through a double that drops every third connection and answers 500 to
//! every fourth request.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::Value;

use crate::common::{
    agentrl, agentrl_line, failure_stderr, json_stdout, tiny_frozenlake_config, train, Served,
};
use crate::loopback;

/// A seconds-long run: an expert warm start on 3×3 FrozenLake and one RL
/// step, after which greedy play wins 5 of the 12 maps played below with 4
/// distinct move sequences: the comparison sees wins and losses. Its
/// `[sft]`, `[rollout]` and `[trainer]`; the env and model are
/// [`tiny_frozenlake_config`]'s.
const RUN_SECTIONS: &str = r#"[sft]
demos = 48
epochs = 8
lr = 1e-2
batch_size = 8
expert_noise = 0.0
[rollout]
n = 2
env_groups = 2
max_turns = 5
max_actions_per_turn = 1
max_actions = 5
response_length = 12
[trainer]
total_training_steps = 1
test_freq = 0
save_freq = 0
val_tasks = 4
"#;

/// The trained run, made once per test binary.
fn run_dir() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("policy_cli");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            tiny_frozenlake_config("policy-test", 400, RUN_SECTIONS),
        )
        .unwrap();
        let run = dir.join("run");
        train(config.to_str().unwrap(), &[], &run);
        run
    })
}

/// `agentrl serve-policy` for `model` on a free loopback port, serving it
/// as "tiny"; killed when dropped.
fn serve_policy(model: &Path) -> Served {
    let model = model.to_str().unwrap();
    Served::command(
        "serve-policy",
        &["--served-model-name", "tiny", "--model", model],
    )
}

/// `agentrl eval --json --trajectories FILE` with `extra` flags: the report
/// and the trajectories.
fn eval(extra: &[&str], trajectories: &Path) -> (Value, Vec<Value>) {
    let paths = [run_dir().to_str().unwrap(), trajectories.to_str().unwrap()];
    let line = "eval --env frozenlake --n 12 --json";
    let tail = [&["--policy", paths[0], "--trajectories", paths[1]], extra].concat();
    let report = json_stdout(&agentrl_line(line, &tail));
    let trajs = std::fs::read_to_string(trajectories)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (report, trajs)
}

/// What must agree between two evaluations of the same greedy policy.
fn outcome(report: &Value) -> Value {
    let mut r = report.clone();
    r.as_object_mut().unwrap().remove("policy");
    r
}

/// Per task: its spec, success, each turn's actions and the tokens played.
fn episodes(trajs: &[Value]) -> Vec<(Value, Value, Vec<Value>, Value)> {
    trajs
        .iter()
        .map(|t| {
            let actions = t["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|turn| turn["actions"].clone())
                .collect();
            (
                t["spec"].clone(),
                t["success"].clone(),
                actions,
                t["tokens"].clone(),
            )
        })
        .collect()
}

#[test]
fn eval_through_serve_policy_plays_the_local_greedy_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let (local, local_trajs) = eval(&[], &dir.path().join("local.jsonl"));
    let server = serve_policy(run_dir());
    let (remote, remote_trajs) = eval(
        &["--policy-endpoint", &server.url, "--policy-model", "tiny"],
        &dir.path().join("remote.jsonl"),
    );
    assert_eq!(outcome(&remote), outcome(&local));
    assert_eq!(episodes(&remote_trajs), episodes(&local_trajs));
    assert_eq!(local_trajs.len(), 12);
    // Neither all wins nor all losses: the comparison means something.
    let wins = local_trajs.iter().filter(|t| t["success"] == true).count();
    assert!(0 < wins && wins < 12, "{wins} of 12 tasks won");
    assert!(remote["policy"].as_str().unwrap().contains(&server.url));
}

/// Counts of what the flaky double did.
#[derive(Default)]
struct Flaky {
    connections: AtomicUsize,
    dropped: AtomicUsize,
    requests: AtomicUsize,
    failed: AtomicUsize,
    upstream: String,
}

/// Forward a request upstream, except every fourth, which answers 500.
async fn forward(
    State(f): State<Arc<Flaky>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if f.requests.fetch_add(1, Ordering::SeqCst) % 4 == 3 {
        f.failed.fetch_add(1, Ordering::SeqCst);
        let body = r#"{"error":{"message":"flaky double","type":"server_error","param":null,"code":null}}"#;
        return (StatusCode::INTERNAL_SERVER_ERROR, body).into_response();
    }
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{uri}", f.upstream))
        .body(body);
    if let Some(v) = headers.get(header::CONTENT_TYPE) {
        req = req.header(header::CONTENT_TYPE, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let kind = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut out = (status, resp.bytes().await.unwrap()).into_response();
    if let Some(v) = kind {
        out.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    out
}

/// Serve `flaky` on loopback from a thread of its own: one request per
/// connection, every third connection read and dropped unanswered.
fn start_flaky(flaky: Arc<Flaky>) -> SocketAddr {
    let app = Router::new()
        .fallback(forward)
        .with_state(Arc::clone(&flaky));
    loopback::spawn(move |listener| async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            if flaky.connections.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
                flaky.dropped.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = stream.readable().await;
                    let _ = stream.try_read(&mut buf);
                    drop(stream);
                });
                continue;
            }
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

#[test]
fn eval_loses_no_trajectory_to_dropped_connections_and_500s() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_policy(run_dir());
    let (healthy, healthy_trajs) = eval(
        &["--policy-endpoint", &server.url],
        &dir.path().join("healthy.jsonl"),
    );
    let flaky = Arc::new(Flaky {
        upstream: server.url.clone(),
        ..Flaky::default()
    });
    let proxy = start_flaky(Arc::clone(&flaky));
    let (through, through_trajs) = eval(
        &[
            "--policy-endpoint",
            &format!("http://{proxy}"),
            "--policy-max-retries",
            "10",
            "--policy-retry-backoff-ms",
            "5",
        ],
        &dir.path().join("flaky.jsonl"),
    );
    assert_eq!(outcome(&through), outcome(&healthy));
    assert_eq!(episodes(&through_trajs), episodes(&healthy_trajs));
    assert_eq!(through_trajs.len(), 12);
    assert!(
        flaky.dropped.load(Ordering::SeqCst) > 0,
        "no connection dropped"
    );
    assert!(flaky.failed.load(Ordering::SeqCst) > 0, "no 500 answered");
}

#[test]
fn eval_names_a_policy_endpoint_without_a_policy_directory() {
    let out = agentrl_line(
        "eval --env frozenlake --policy-endpoint http://127.0.0.1:9",
        &[],
    );
    let err = failure_stderr(&out);
    assert!(err.contains("--policy-endpoint needs --policy"), "{err}");
}

#[test]
fn train_refuses_a_policy_endpoint() {
    let err = failure_stderr(&agentrl(&[
        "train",
        "policy.endpoint=\"http://127.0.0.1:8000\"",
    ]));
    assert!(
        err.contains("policy.endpoint") && err.contains("LoRA"),
        "{err}"
    );
}
