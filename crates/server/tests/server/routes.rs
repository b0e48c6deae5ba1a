//! The real server on a loopback port, driven over HTTP.

use std::time::Duration;

use crate::common::{serve, start, start_with, test_config, Api};
use agentrl_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, kind: &str) {
    assert_eq!(status, expected, "body: {body}");
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no error message in {body}"
    );
    assert_eq!(body["kind"], kind, "body: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers() {
    let (server, api) = serve().await;

    let (s, v) = api.get("/health").await;
    assert_eq!(s, 200);
    assert_eq!(v["status"], "ok");
    assert_eq!(v["sessions"], 0);
    let (s, v) = api.get("/envs").await;
    assert_eq!(s, 200);
    assert!(v.as_array().unwrap().iter().any(|e| e["name"] == "counter"));
    let (s, v) = api.get("/openapi.json").await;
    assert_eq!(s, 200);
    assert_eq!(v["openapi"], "3.0.3");
    assert!(v["paths"]["/{env}/step"]["post"].is_object());
    let (s, v) = api.get("/").await;
    assert_eq!(s, 200);
    assert!(v["envs"].as_array().unwrap().contains(&json!("counter")));
    let (s, v) = api.get("/counter").await;
    assert_eq!(s, 200);
    assert_eq!(v["difficulties"], json!(["easy", "hard"]));

    // Top level, env in the body.
    let (s, v) = api
        .create(json!({"env": "counter", "seed": 3, "difficulty": "hard"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let id = v["id"].as_u64().unwrap();
    assert_eq!(
        v["spec"],
        json!({"env": "counter", "split": "train", "difficulty": "hard", "seed": 3})
    );
    assert!(v["observation"].as_str().unwrap().starts_with("value 0"));
    assert!(v["instructions"]
        .as_str()
        .unwrap()
        .contains("Reach the target"));
    assert_eq!(v["max_steps"], 20);

    let (s, v) = api.step(id, "inc").await;
    assert_eq!(s, 200, "{v}");
    assert!(v["observation"].as_str().unwrap().starts_with("value 1"));
    assert!(v["reward"].is_f64());
    assert_eq!(v["done"], false);
    assert_eq!(v["steps"], 1);
    assert_eq!(v["info"]["effective"], true);
    assert_eq!(v["info"]["extra"]["value"], 1);

    let (s, v) = api.get(&format!("/observation?id={id}")).await;
    assert_eq!(s, 200);
    assert!(v.as_str().unwrap().starts_with("value 1"));
    let (s, v) = api.get(&format!("/available_actions?id={id}")).await;
    assert_eq!(s, 200);
    assert_eq!(v, json!(["inc", "noop", "add 2", "dec"]));
    let (s, v) = api.get(&format!("/instructions?id={id}")).await;
    assert_eq!(s, 200);
    assert!(v.as_str().unwrap().contains("Reach the target"));
    let (s, v) = api.get(&format!("/expert_action?id={id}")).await;
    assert_eq!(s, 200);
    assert!(v["action"] == "inc" || v["action"] == "dec");

    let (s, v) = api.post("/step_batch", json!([{"id": id, "action": "noop"}, {"id": id, "action": "jump"}, {"id": 999_999, "action": "inc"}])).await;
    assert_eq!(s, 200);
    let r = v.as_array().unwrap();
    assert_eq!(r[0]["code"], 200);
    assert_eq!(r[0]["ok"]["steps"], 2);
    assert_eq!(r[1]["code"], 400);
    assert_eq!(r[1]["err"]["kind"], "invalid_action");
    assert_eq!(r[2]["code"], 404);

    // Reset to the same task, then to another seed (AgentGym's data_idx).
    let (s, v) = api.post("/reset", json!({"id": id})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["steps"], 0);
    assert!(v["observation"].as_str().unwrap().starts_with("value 0"));
    let (s, v) = api
        .post(
            "/reset",
            json!({"id": id, "data_idx": 11, "difficulty": "easy"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["spec"]["seed"], 11);
    assert_eq!(v["spec"]["difficulty"], "easy");
    assert_eq!(v["max_steps"], 10);

    let (s, v) = api.post("/close", json!({"id": id})).await;
    assert_eq!(s, 200);
    assert_eq!(v["closed"], true);
    assert_eq!(server.live_sessions(), 0);

    // The same under /{env}/, as an AgentGym client uses it.
    let (s, v) = api.post("/counter/create", json!({})).await;
    assert_eq!(s, 200);
    let id = v["id"].as_u64().unwrap();
    let (s, _) = api
        .post("/counter/reset", json!({"id": id, "data_idx": 2}))
        .await;
    assert_eq!(s, 200);
    let (s, v) = api
        .post("/counter/step", json!({"id": id, "action": "add 2"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = api
        .post("/counter/step_batch", json!([{"id": id, "action": "noop"}]))
        .await;
    assert_eq!(s, 200);
    for route in [
        "observation",
        "available_actions",
        "instructions",
        "expert_action",
    ] {
        let (s, v) = api.get(&format!("/counter/{route}?id={id}")).await;
        assert_eq!(s, 200, "{route}: {v}");
    }
    let (s, _) = api.post("/counter/close", json!({"id": id})).await;
    assert_eq!(s, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentgym_style_create_without_body_or_content_type_works() {
    let (server, api) = serve().await;
    // requests.post(f"{base}/create") sends no body and no content type.
    let r = api
        .client
        .post(api.url("/counter/create"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let id = v["id"].as_u64().unwrap();
    assert_eq!(v["spec"]["split"], "train");
    assert_eq!(v["spec"]["seed"], 0);
    // A second session gets another id, also across environments.
    let (_, w) = api.create(json!({"env": "counter"})).await;
    assert_ne!(w["id"].as_u64().unwrap(), id);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_the_right_4xx_with_a_json_error() {
    let (server, api) = serve().await;
    let id = api.counter_session(2).await;

    // Malformed JSON.
    let r = api
        .client
        .post(api.url("/step"))
        .header("content-type", "application/json")
        .body("{\"id\": ")
        .send()
        .await
        .unwrap();
    let s = r.status();
    assert_error(
        s,
        &r.json().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    // Wrong shape, missing field, unknown field.
    let (s, v) = api.post("/step", json!({"id": "x", "action": "inc"})).await;
    assert_error(s, &v, StatusCode::UNPROCESSABLE_ENTITY, "bad_request");
    let (s, v) = api.post("/step", json!({"id": id})).await;
    assert_error(s, &v, StatusCode::UNPROCESSABLE_ENTITY, "bad_request");
    let (s, v) = api.create(json!({"env": "counter", "sed": 4})).await;
    assert_error(s, &v, StatusCode::UNPROCESSABLE_ENTITY, "bad_request");
    // Unknown id.
    let (s, v) = api.step(123_456, "inc").await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = api.get("/observation?id=123456").await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = api.post("/close", json!({"id": 123_456})).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    // Bad query.
    let (s, v) = api.get("/observation?id=abc").await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "bad_request");
    let (s, v) = api.get("/observation").await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "bad_request");
    // Wrong environment name: unknown route prefix, unknown in body, mismatched session.
    let (s, v) = api.post("/nosuchenv/create", json!({})).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = api.create(json!({"env": "nosuchenv"})).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = api
        .post("/nosuchenv/step", json!({"id": id, "action": "inc"}))
        .await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = api.post("/counter/create", json!({"env": "other"})).await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "bad_request");
    let (s, v) = api.create(json!({})).await;
    if server_serves_more_than_one(&api).await {
        assert_error(s, &v, StatusCode::BAD_REQUEST, "bad_request");
    }
    // Bad spec: difficulty, split, seed/data_idx conflict, out-of-range seed, unknown param.
    let (s, v) = api
        .create(json!({"env": "counter", "difficulty": "nightmare"}))
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_spec");
    let (s, v) = api.create(json!({"env": "counter", "split": "dev"})).await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "bad_request");
    let (s, v) = api
        .create(json!({"env": "counter", "seed": 1, "data_idx": 2}))
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "bad_request");
    let (s, v) = api
        .create(json!({"env": "counter", "seed": 1u64 << 40}))
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_spec");
    let (s, v) = api
        .create(json!({"env": "counter", "params": {"colour": 1}}))
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_spec");
    let (s, v) = api
        .post("/reset", json!({"id": id, "difficulty": "nightmare"}))
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_spec");

    // Invalid action text: 400 with the reason; the session counted it and stays usable.
    let (s, v) = api.step(id, "jump").await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_action");
    assert_eq!(v["action_error"]["type"], "unknown");
    assert_eq!(v["status"]["invalid_actions"], 1);
    let (s, v) = api.step(id, "dec").await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_action");
    assert_eq!(v["action_error"]["type"], "not_possible");
    assert_eq!(v["status"]["invalid_actions"], 2);
    let (s, v) = api.step(id, "noop").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["invalid_actions"], 2);
    // Step after done (max_steps = 2).
    let (s, v) = api.step(id, "noop").await;
    assert_eq!(s, 200);
    assert_eq!(v["done"], true);
    let (s, v) = api.step(id, "noop").await;
    assert_error(s, &v, StatusCode::CONFLICT, "episode_over");

    // Unknown route and wrong method are JSON too.
    let (s, v) = api.get("/no/such/route").await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = api.get("/step").await;
    assert_error(s, &v, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");

    // A panicking environment is a 500 for that request, not a dead server.
    let (s, v) = api.create(json!({"env": "counter"})).await;
    assert_eq!(s, 200);
    let boom = v["id"].as_u64().unwrap();
    let (s, v) = api.step(boom, "boom").await;
    assert_error(s, &v, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    let (s, _) = api.get("/health").await;
    assert_eq!(s, 200);
    server.shutdown().await.unwrap();
}

async fn server_serves_more_than_one(api: &Api) -> bool {
    let (_, v) = api.get("/envs").await;
    v.as_array().map_or(0, Vec::len) > 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_sessions_step_in_parallel() {
    let server = start_with(|c| c.max_sessions = 2000).await;
    let api = Api::new(&server);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u64 {
        let api = api.clone();
        tasks.spawn(async move {
            let (s, v) = api
                .create(json!({"env": "counter", "seed": i, "params": {"max_steps": 100}}))
                .await;
            assert_eq!(s, 200, "{v}");
            let id = v["id"].as_u64().unwrap();
            for k in 1..=5u64 {
                let (s, v) = api.step(id, "noop").await;
                assert_eq!(s, 200, "{v}");
                assert_eq!(v["steps"], k);
            }
            id
        });
    }
    let mut ids = Vec::new();
    while let Some(r) = tasks.join_next().await {
        ids.push(r.unwrap());
    }
    assert_eq!(server.live_sessions(), 1000);
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1000, "ids must be unique");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_steps_on_one_session_are_serialised() {
    let (server, api) = serve().await;
    let id = api.counter_session(1000).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let api = api.clone();
        tasks.spawn(async move { api.step(id, "noop").await });
    }
    let mut seen = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (s, v) = r.unwrap();
        assert_eq!(s, 200);
        seen.push(v["steps"].as_u64().unwrap());
    }
    // Each step saw a distinct counter value: no two ran on the env at once.
    seen.sort_unstable();
    assert_eq!(seen, (1..=64).collect::<Vec<_>>());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_reaped_after_the_ttl() {
    let config = ServerConfig {
        ttl: Duration::from_millis(300),
        reap_interval: Some(Duration::from_millis(50)),
        ..test_config()
    };
    let server = start(config).await;
    let api = Api::new(&server);
    let idle = api.counter_session(1000).await;
    let busy = api.counter_session(1000).await;
    // Keep one session busy past the TTL; leave the other idle.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (s, _) = api.step(busy, "noop").await;
        assert_eq!(s, 200);
    }
    let (s, v) = api.step(idle, "noop").await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(server.live_sessions(), 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(server.live_sessions(), 0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_beyond_the_session_cap_is_503_until_one_closes() {
    let server = start_with(|c| c.max_sessions = 3).await;
    let api = Api::new(&server);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (s, v) = api.create(json!({"env": "counter"})).await;
        assert_eq!(s, 200);
        ids.push(v["id"].as_u64().unwrap());
    }
    let r = api
        .client
        .post(api.url("/create"))
        .json(&json!({"env": "counter"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers().get("retry-after").unwrap(), "1");
    let s = r.status();
    assert_error(
        s,
        &r.json().await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "full",
    );
    let (s, _) = api.post("/close", json!({"id": ids[0]})).await;
    assert_eq!(s, 200);
    let (s, _) = api.create(json!({"env": "counter"})).await;
    assert_eq!(s, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_413_with_a_json_error() {
    let server = start_with(|c| c.body_limit = 1024).await;
    let api = Api::new(&server);
    let (_, v) = api.create(json!({"env": "counter"})).await;
    let id = v["id"].as_u64().unwrap();
    let big = "x".repeat(4096);
    // With a Content-Length (rejected before reading) ...
    let (s, v) = api.step(id, &big).await;
    assert_error(s, &v, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    // ... and chunked without one (rejected while reading).
    let payload = format!("{{\"id\": {id}, \"action\": \"{big}\"}}");
    let (s, v) = raw_chunked_post(server.local_addr(), "/step", &payload).await;
    assert_error(s, &v, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    // A body under the limit still works.
    let (s, _) = api.step(id, "inc").await;
    assert_eq!(s, 200);
    server.shutdown().await.unwrap();
}

/// POST a body with `Transfer-Encoding: chunked` (no Content-Length) over a
/// raw connection; returns the status and the JSON body.
async fn raw_chunked_post(
    addr: std::net::SocketAddr,
    path: &str,
    body: &str,
) -> (StatusCode, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    // The server may answer and close before reading everything; ignore write errors.
    let _ = sock.write_all(req.as_bytes()).await;
    let mut out = Vec::new();
    let _ = sock.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let code: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    // The answer itself may be chunked: take the JSON object inside.
    let json = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let start = rest.find('{').unwrap();
        let end = rest.rfind('}').unwrap();
        &rest[start..=end]
    } else {
        rest
    };
    (
        StatusCode::from_u16(code).unwrap(),
        serde_json::from_str(json).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_required_when_configured() {
    let server = start_with(|c| c.token = Some("s3cret".into())).await;
    let api = Api::new(&server);
    let (s, v) = api.create(json!({"env": "counter"})).await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "unauthorized");
    let create_with = |token: &str| {
        let req = api.client.post(api.url("/create")).bearer_auth(token);
        req.json(&json!({"env": "counter"})).send()
    };
    let r = create_with("wrong").await.unwrap();
    assert_eq!(r.headers().get("www-authenticate").unwrap(), "Bearer");
    assert_eq!(r.status(), 401);
    let (s, v) = api.get("/envs").await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "unauthorized");
    let r = create_with("s3cret").await.unwrap();
    assert_eq!(r.status(), 200);
    // Liveness stays open.
    let (s, v) = api.get("/health").await;
    assert_eq!(s, 200);
    assert_eq!(v["sessions"], 1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let (server, api) = serve().await;
    let (_, v) = api.create(json!({"env": "counter"})).await;
    let id = v["id"].as_u64().unwrap();
    // "slow" takes 300 ms inside the env.
    let slow = {
        let api = api.clone();
        tokio::spawn(async move { api.step(id, "slow").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown().await.unwrap();
    let (s, v) = slow.await.unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["steps"], 1);
    // And the listener is gone.
    assert!(api.client.get(api.url("/health")).send().await.is_err());
}
