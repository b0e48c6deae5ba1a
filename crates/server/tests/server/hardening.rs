//! What a hostile or careless client must not be able to do (issue 18):
//! reach the server's files through env params, pin a core with a hopeless
//! generator setting, guess other clients' session ids, or hold connections
//! open without sending a request; and what an operator may set.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use agentrl_server::{ServerConfig, ServerError};
use common::{start, start_with, test_config, Api};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a connection must be idle before it may be closed to make room
/// (the server's `EVICT_IDLE_AFTER`).
const EVICT_IDLE_AFTER: Duration = Duration::from_millis(1100);

/// A client that gives up after 10 s: a request the server never answers
/// fails the test instead of hanging it.
fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

// ---------------------------------------------------------------- params

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_and_cache_params_are_refused_from_requests() {
    let server = start(test_config()).await;
    let api = Api::with_client(&server, client());
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("written-by-a-client");
    let target = target.to_str().unwrap();
    for (env, params) in [
        (
            "searchqa",
            json!({"corpus": "/etc/passwd", "qa_file": "/etc/passwd"}),
        ),
        ("searchqa", json!({"cache_dir": target})),
        ("webshop", json!({"data_dir": "/etc"})),
        ("webshop", json!({"cache_dir": target, "catalog_size": 100})),
        ("textcraft", json!({"data_dir": "/etc"})),
    ] {
        let (s, v) = api.create(json!({"env": env, "params": params})).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{env} {params}: {v}");
        assert_eq!(v["kind"], "forbidden_param", "{v}");
        let key = params.as_object().unwrap().keys().next().unwrap().clone();
        let msg = v["error"].as_str().unwrap();
        assert!(
            msg.contains(&format!("'{key}'")) && msg.contains("--env-param"),
            "{msg}"
        );
    }
    // Nothing reached the filesystem.
    assert!(!std::path::Path::new(target).exists());
    assert_eq!(server.live_sessions(), 0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_params_are_refused_with_the_keys_a_client_may_send() {
    let server = start(test_config()).await;
    let api = Api::with_client(&server, client());
    let (s, v) = api
        .create(json!({"env": "frozenlake", "params": {"sise": 4}}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("'sise'") && msg.contains("frozen_prob"),
        "{msg}"
    );
    // GET /envs lists them too.
    let (_, envs) = api.get("/envs").await;
    let envs = envs.as_array().unwrap();
    let searchqa = envs.iter().find(|e| e["name"] == "searchqa").unwrap();
    assert_eq!(
        searchqa["request_params"],
        json!(["corpus_size", "retry_wrong_answer", "top_k", "max_steps"])
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_params_lie_under_the_request_params() {
    let server =
        start_with(|c| c.env_params = vec!["frozenlake.size=5".into(), "is_slippery=false".into()])
            .await;
    let api = Api::with_client(&server, client());
    let rows = |v: &Value| v["observation"].as_str().unwrap().lines().count();
    let (s, v) = api.create(json!({"env": "frozenlake"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(rows(&v), 5, "the operator's size: {v}");
    let (s, v) = api
        .create(json!({"env": "frozenlake", "params": {"size": 3}}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(rows(&v), 3, "the request's size wins: {v}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_operator_params_stop_the_server_at_start() {
    for (setting, says) in [
        (
            "textcraft.data_dir=/nonexistent/agentrl",
            "/nonexistent/agentrl",
        ),
        ("frozenlake.size=99", "size"),
        ("chess.size=3", "not a served environment"),
    ] {
        let err = agentrl_server::spawn(
            ServerConfig {
                env_params: vec![setting.into()],
                ..test_config()
            },
            common::all_descriptors(),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("{setting} was accepted"));
        assert!(matches!(err, ServerError::EnvParam(_)), "{err}");
        assert!(err.to_string().contains(says), "{setting}: {err}");
    }
}

// ---------------------------------------------------------------- generators

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hopeless_generator_setting_fails_fast_instead_of_pinning_a_core() {
    let server = start(test_config()).await;
    let api = Api::with_client(&server, client());
    let t = Instant::now();
    let (s, v) = api
        .create(json!({"env": "frozenlake", "params": {"frozen_prob": 1e-9, "size": 16}}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("raise frozen_prob"),
        "{v}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    server.shutdown().await.unwrap();
}

// ---------------------------------------------------------------- session ids

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ids_cannot_be_guessed_from_ones_own() {
    let server = start(test_config()).await;
    let api = Api::with_client(&server, client());
    // Other clients' sessions, before and after the attacker's own.
    let mut ids = Vec::new();
    for seed in 0..21 {
        let (s, v) = api.create(json!({"env": "counter", "seed": seed})).await;
        assert_eq!(s, 200, "{v}");
        ids.push(v["id"].as_u64().unwrap());
    }
    assert!(
        ids.iter().all(|&id| id < 1 << 53),
        "JSON-safe integers: {ids:?}"
    );
    let own = ids[10];
    // The attacker tries the neighbours of its own id and small numbers.
    let mut guesses: Vec<u64> = (1..=20)
        .flat_map(|d| [own + d, own.wrapping_sub(d)])
        .collect();
    guesses.extend(0..100);
    guesses.retain(|&g| g != own);
    for guess in guesses {
        let (s, _) = api.post("/close", json!({"id": guess})).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "guessed {guess}");
    }
    assert_eq!(server.live_sessions(), 21);
    server.shutdown().await.unwrap();
}

// ---------------------------------------------------------------- connections

/// Whether the server closed `conn` within `within` (EOF, a reset, or an
/// answer it sent before closing).
async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(50), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    false
}

async fn server_with(
    change: impl FnOnce(&mut ServerConfig),
) -> (agentrl_server::ServerHandle, SocketAddr) {
    let server = start_with(change).await;
    let addr = server.local_addr();
    (server, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_connection_is_closed_at_the_header_timeout() {
    let (server, addr) = server_with(|c| c.header_timeout = Duration::from_millis(400)).await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // One more header line every 100 ms, never the blank line.
    let t = Instant::now();
    let mut closed = false;
    while t.elapsed() < Duration::from_secs(4) {
        if conn.write_all(b"X-Slow: 1\r\n").await.is_err()
            || closed_within(&mut conn, Duration::from_millis(100)).await
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "still open after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_before_and_between_requests() {
    let (server, addr) = server_with(|c| c.header_timeout = Duration::from_millis(400)).await;
    // Opened and never used.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(2)).await);
    // Kept alive after an answer, then left idle.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(closed_within(&mut kept, Duration::from_secs(2)).await);
    server.shutdown().await.unwrap();
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// The first bytes the server answers on `conn`, within `within`.
async fn answer(conn: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    match tokio::time::timeout(within, conn.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => Some(buf[..n].to_vec()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_the_oldest_idle_connection_makes_room() {
    let (server, addr) = server_with(|c| {
        c.max_connections = 2;
        c.header_timeout = Duration::from_secs(20);
    })
    .await;
    // Two idle connections hold both slots (1,000 of them used to exhaust
    // the server's descriptors).
    let mut oldest = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut newer = TcpStream::connect(addr).await.unwrap();
    // Both idle past the eviction threshold, the oldest the longest.
    tokio::time::sleep(EVICT_IDLE_AFTER).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(HEALTH).await.unwrap();
    let got = answer(&mut third, Duration::from_secs(3)).await;
    assert!(got.is_some_and(|a| a.starts_with(b"HTTP/1.1 200")));
    assert!(closed_within(&mut oldest, Duration::from_secs(1)).await);
    assert!(!closed_within(&mut newer, Duration::from_millis(300)).await);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_a_client_waits_for_a_busy_connection_to_finish() {
    let (server, addr) = server_with(|c| c.max_connections = 2).await;
    let slow_create = |ms: u64| {
        let body = format!(r#"{{"env": "counter", "params": {{"build_ms": {ms}}}}}"#);
        format!(
            "POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(slow_create(800).as_bytes()).await.unwrap();
        busy.push(c);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(HEALTH).await.unwrap();
    let got = answer(&mut third, Duration::from_secs(5)).await;
    assert!(got.is_some_and(|a| a.starts_with(b"HTTP/1.1 200")));
    // Queued until a busy connection answered and then stayed idle long
    // enough to be closed: busy connections are never cut.
    assert!(
        t.elapsed() > Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    for mut c in busy {
        let got = answer(&mut c, Duration::from_secs(3)).await;
        assert!(got.is_some_and(|a| a.starts_with(b"HTTP/1.1 200")));
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_times_out_and_leaves_no_session() {
    let (server, addr) = server_with(|c| c.request_timeout = Duration::from_millis(300)).await;
    let api = Api::with_client(&server, client());
    // A build that outlasts the timeout.
    let t = Instant::now();
    let (s, v) = api
        .create(json!({"env": "counter", "params": {"build_ms": 1500}}))
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["kind"], "timeout", "{v}");
    assert!(
        t.elapsed() < Duration::from_millis(1200),
        "{:?}",
        t.elapsed()
    );
    // The build finishes in the background and is dropped, not kept.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server.live_sessions(), 0);
    // A body that never arrives in full.
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf))
        .await
        .expect("answered at the request timeout")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 503"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn zero_limits_are_configuration_errors() {
    for config in [
        ServerConfig {
            body_limit: 0,
            ..test_config()
        },
        ServerConfig {
            max_connections: 0,
            ..test_config()
        },
        ServerConfig {
            header_timeout: Duration::ZERO,
            ..test_config()
        },
        ServerConfig {
            request_timeout: Duration::ZERO,
            ..test_config()
        },
    ] {
        let err = agentrl_server::spawn(config, common::all_descriptors())
            .await
            .err()
            .expect("a zero limit must be refused");
        assert!(matches!(err, ServerError::Config(_)), "{err}");
    }
}
