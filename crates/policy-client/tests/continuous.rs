//! `OpenAiPolicy::generate_continuous` against a double whose answers
//! depend only on the prompt and the seed and come back after delays that
//! reorder them: every run plays the same dialogues, greedy ones equal the
//! lock-step turns', at most `max_in_flight` requests are in flight, and a
//! refused request ends the batch with its error.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrl_policy_client::{OpenAiOptions, OpenAiPolicy};
use agentrl_rollout::{generate_in_lockstep, Followup, Generation, Policy, SamplingParams};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

mod loopback;

#[derive(Default)]
struct Double {
    /// Refuse every request whose prompt is this long.
    refuse_len: Option<usize>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Every request's (prompt, seed), in arrival order.
    seen: Mutex<Vec<(Vec<u64>, Option<u64>)>>,
}

fn start(double: Double) -> (SocketAddr, Arc<Double>) {
    let double = Arc::new(double);
    let app = Router::new()
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object": "list", "data": [{"id": "m"}]})) }),
        )
        .route("/v1/completions", post(completion))
        .with_state(Arc::clone(&double));
    (loopback::serve(app), double)
}

/// A token from the prompt and the seed, then the stop token 2; answered
/// after 0, 4 or 8 ms by the prompt's length, so a batch's answers arrive
/// out of order.
async fn completion(State(d): State<Arc<Double>>, Json(req): Json<Value>) -> Response {
    let prompt: Vec<u64> = req["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let seed = req["seed"].as_u64();
    d.seen.lock().unwrap().push((prompt.clone(), seed));
    let now = d.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    d.max_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(4 * (prompt.len() % 3) as u64)).await;
    d.in_flight.fetch_sub(1, Ordering::SeqCst);
    if d.refuse_len == Some(prompt.len()) {
        let error =
            json!({"error": {"message": "refused", "type": "x", "param": null, "code": null}});
        return (StatusCode::BAD_REQUEST, Json(error)).into_response();
    }
    let mix = prompt.iter().fold(seed.unwrap_or(7), |h, &t| {
        h.wrapping_mul(31).wrapping_add(t)
    });
    let token = 10 + mix % 50;
    Json(json!({
        "id": "x", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": "", "finish_reason": "stop",
                     "token_ids": [token, 2],
                     "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25]}}]
    }))
    .into_response()
}

fn policy(addr: SocketAddr, max_in_flight: usize) -> OpenAiPolicy {
    OpenAiPolicy::connect(OpenAiOptions {
        max_in_flight,
        max_retries: 0,
        ..OpenAiOptions::new(format!("http://{addr}"))
    })
    .unwrap()
}

fn params(temperature: f64) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 4,
        temperature,
        stop_tokens: vec![2],
        ..SamplingParams::default()
    }
}

/// Six dialogues of 1 to 3 turns: each goes on with its context, the
/// answer and an observation of its own.
const TURNS: [usize; 6] = [3, 1, 2, 3, 2, 1];

type Dialogues = Vec<Vec<Generation>>;

fn first_prompts() -> Vec<Vec<u32>> {
    (0..TURNS.len() as u32).map(|i| vec![1, i + 3]).collect()
}

/// A continuous batch of the dialogues, or with `lockstep` the default
/// lock-step batch.
fn play(
    policy: &mut OpenAiPolicy,
    temperature: f64,
    seed: u64,
    lockstep: bool,
) -> Result<Dialogues, String> {
    let mut contexts = first_prompts();
    let mut dialogues: Dialogues = vec![Vec::new(); TURNS.len()];
    let mut next = |i: usize, g: Generation| {
        contexts[i].extend(&g.tokens);
        dialogues[i].push(g);
        if dialogues[i].len() == TURNS[i] {
            return Followup::Done;
        }
        contexts[i].push(40 + i as u32);
        Followup::Continue(contexts[i].clone())
    };
    let rng = &mut ChaCha8Rng::seed_from_u64(seed);
    let prompts = first_prompts();
    let params = params(temperature);
    let played = match lockstep {
        true => generate_in_lockstep(policy, prompts, &params, rng, &mut next),
        false => policy.generate_continuous(prompts, &params, rng, &mut next),
    };
    played.map_err(|e| e.to_string())?;
    Ok(dialogues)
}

#[test]
fn answers_in_any_order_give_the_same_dialogues_every_run() {
    let (addr, d) = start(Double::default());
    let mut p = policy(addr, 3);
    let a = play(&mut p, 1.0, 5, false).unwrap();
    let mut first: Vec<_> = std::mem::take(&mut *d.seen.lock().unwrap());
    assert_eq!(a, play(&mut p, 1.0, 5, false).unwrap());
    let mut second: Vec<_> = std::mem::take(&mut *d.seen.lock().unwrap());
    // The same requests, each with the same seed, whatever their order.
    first.sort();
    second.sort();
    assert_eq!(first, second);
    assert_eq!(first.len(), TURNS.iter().sum::<usize>());
    // A seed per sequence and turn.
    let mut seeds: Vec<u64> = first.iter().map(|(_, s)| s.unwrap()).collect();
    seeds.sort();
    seeds.dedup();
    assert_eq!(seeds.len(), first.len());
    assert_ne!(
        a,
        play(&mut p, 1.0, 6, false).unwrap(),
        "the rollout seed draws"
    );
}

#[test]
fn greedy_dialogues_are_the_lockstep_turns() {
    let (addr, d) = start(Double::default());
    let mut p = policy(addr, 4);
    let continuous = play(&mut p, 0.0, 0, false).unwrap();
    assert_eq!(continuous, play(&mut p, 0.0, 0, true).unwrap());
    assert!(d
        .seen
        .lock()
        .unwrap()
        .iter()
        .all(|(_, seed)| seed.is_none()));
}

#[test]
fn at_most_max_in_flight_requests_are_in_flight() {
    let (addr, d) = start(Double::default());
    play(&mut policy(addr, 2), 1.0, 0, false).unwrap();
    assert_eq!(d.max_in_flight.load(Ordering::SeqCst), 2);
}

#[test]
fn a_refused_request_ends_the_batch_with_its_error() {
    // Second turns' prompts are 5 tokens long.
    let (addr, _) = start(Double {
        refuse_len: Some(5),
        ..Double::default()
    });
    let e = play(&mut policy(addr, 3), 1.0, 0, false).unwrap_err();
    assert!(e.contains("400") && e.contains("refused"), "{e}");
}
