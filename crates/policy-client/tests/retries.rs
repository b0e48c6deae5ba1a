//! `OpenAiPolicy` against scripted test doubles: 5xx answers are retried
//! until one succeeds, a server that never recovers ends in an error naming
//! the endpoint and the last failure, a 4xx is final, a server without
//! `return_token_ids` is named as such, and at most `max_in_flight`
//! requests are in flight.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentrl_policy_client::{OpenAiOptions, OpenAiPolicy};
use agentrl_rollout::{Policy, SamplingParams};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

mod loopback;

/// What the double answers to the n-th completion request (0-based).
type Script = fn(usize) -> Response;

struct Double {
    script: Script,
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    delay: Duration,
}

/// A double on its own runtime thread; its address and shared counters.
fn start(script: Script, delay: Duration) -> (SocketAddr, Arc<Double>) {
    let double = Arc::new(Double {
        script,
        requests: AtomicUsize::new(0),
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(0),
        delay,
    });
    let app = Router::new()
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object": "list", "data": [{"id": "m"}]})) }),
        )
        .route("/v1/completions", post(completion))
        .with_state(Arc::clone(&double));
    (loopback::serve(app), double)
}

async fn completion(State(d): State<Arc<Double>>, Json(req): Json<Value>) -> Response {
    let n = d.requests.fetch_add(1, Ordering::SeqCst);
    let now = d.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    d.max_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(d.delay).await;
    d.in_flight.fetch_sub(1, Ordering::SeqCst);
    assert_eq!(req["return_token_ids"], true);
    (d.script)(n)
}

/// A valid one-choice answer: tokens [7, 2] (2 is the stop token).
fn ok() -> Response {
    Json(json!({
        "id": "x", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": "", "finish_reason": "stop",
                     "token_ids": [7, 2],
                     "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25]}}]
    }))
    .into_response()
}

fn status(code: StatusCode) -> Response {
    (
        code,
        Json(json!({"error": {"message": "scripted", "type": "x", "param": "max_tokens", "code": null}})),
    )
        .into_response()
}

fn options(addr: SocketAddr) -> OpenAiOptions {
    OpenAiOptions {
        max_retries: 3,
        backoff: Duration::from_millis(1),
        ..OpenAiOptions::new(format!("http://{addr}"))
    }
}

/// Greedy, four tokens, stopping at id 2.
fn params() -> SamplingParams {
    SamplingParams {
        stop_tokens: vec![2],
        ..SamplingParams::greedy(4)
    }
}

fn generate(
    opts: OpenAiOptions,
    prompts: usize,
) -> Result<Vec<agentrl_rollout::Generation>, String> {
    let mut p = OpenAiPolicy::connect(opts).map_err(|e| e.to_string())?;
    p.generate(
        &vec![vec![1, 2, 3]; prompts],
        &params(),
        &mut ChaCha8Rng::seed_from_u64(0),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn server_errors_are_retried_until_an_answer() {
    let (addr, d) = start(
        |n| match n {
            0 => status(StatusCode::INTERNAL_SERVER_ERROR),
            1 => status(StatusCode::SERVICE_UNAVAILABLE),
            _ => ok(),
        },
        Duration::ZERO,
    );
    let g = generate(options(addr), 1).unwrap();
    assert_eq!((g[0].tokens.clone(), g[0].stopped), (vec![7, 2], true));
    assert_eq!(g[0].logprobs, vec![-0.5, -0.25]);
    assert_eq!(d.requests.load(Ordering::SeqCst), 3);
}

#[test]
fn a_server_that_never_recovers_is_named_with_its_last_failure() {
    let (addr, d) = start(|_| status(StatusCode::BAD_GATEWAY), Duration::ZERO);
    let e = generate(options(addr), 1).unwrap_err();
    assert!(e.contains(&format!("http://{addr}/v1/completions")), "{e}");
    assert!(e.contains("after 4 attempts") && e.contains("502"), "{e}");
    assert_eq!(d.requests.load(Ordering::SeqCst), 4);
}

#[test]
fn a_refusal_is_final() {
    let (addr, d) = start(|_| status(StatusCode::BAD_REQUEST), Duration::ZERO);
    let e = generate(options(addr), 1).unwrap_err();
    assert!(
        e.contains("400") && e.contains("(param: max_tokens)"),
        "{e}"
    );
    assert_eq!(d.requests.load(Ordering::SeqCst), 1);
}

#[test]
fn no_server_at_all_ends_in_an_error_naming_it() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let e = OpenAiPolicy::connect(options(addr))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("http://{addr}/v1/models")), "{e}");
    assert!(e.contains("after 4 attempts"), "{e}");
}

#[test]
fn a_server_without_token_ids_is_named() {
    let (addr, _) = start(
        |_| {
            Json(
                json!({"id": "x", "object": "text_completion", "created": 0, "model": "m",
                        "choices": [{"index": 0, "text": "hi", "finish_reason": "length",
                                     "logprobs": {"tokens": ["hi"], "token_logprobs": [-1.0]}}]}),
            )
            .into_response()
        },
        Duration::ZERO,
    );
    let e = generate(options(addr), 1).unwrap_err();
    assert!(e.contains("return_token_ids"), "{e}");
}

#[test]
fn at_most_max_in_flight_requests_run_at_once() {
    let (addr, d) = start(|_| ok(), Duration::from_millis(30));
    let opts = OpenAiOptions {
        max_in_flight: 3,
        ..options(addr)
    };
    let g = generate(opts, 10).unwrap();
    assert_eq!(g.len(), 10);
    assert_eq!(d.requests.load(Ordering::SeqCst), 10);
    assert_eq!(d.max_in_flight.load(Ordering::SeqCst), 3);
}
