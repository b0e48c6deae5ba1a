//! Test doubles of AgentGym's TextCraft, BabyAI and SciWorld env servers:
//! the routes, fields, status codes, error bodies and messages their real
//! servers answer in the recorded transcripts
//! (`crates/server/tests/data/agentgym/*.json`), over small made-up tasks.
//! Every request is logged so tests can check what a client sent.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// Which AgentGym server the double plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    TextCraft,
    BabyAi,
    SciWorld,
}

/// SciWorld's last `data_idx` (4639 tasks).
pub const SCIWORLD_TASKS: u64 = 4639;

#[derive(Debug, Default)]
struct Session {
    data_idx: Option<u64>,
    score: f64,
    done: bool,
    /// TextCraft: the part is in the inventory; SciWorld: the focus is on.
    progress: bool,
}

#[derive(Default)]
struct Sessions {
    next: u64,
    open: HashMap<u64, Session>,
}

/// One server's state and request log.
pub struct Double {
    kind: Kind,
    sessions: Mutex<Sessions>,
    /// `(route, body)` of every request, in order (`GET` routes: the query).
    pub log: Mutex<Vec<(String, Value)>>,
}

/// A double running on a loopback port until dropped.
pub struct DoubleServer {
    pub addr: SocketAddr,
    pub state: Arc<Double>,
    _rt: tokio::runtime::Runtime,
}

impl DoubleServer {
    pub fn start(kind: Kind) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(Double {
            kind,
            sessions: Mutex::default(),
            log: Mutex::default(),
        });
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/create", post(create))
            .route("/reset", post(reset))
            .route("/step", post(step))
            .route("/observation", get(observation))
            .route("/close", post(close))
            .with_state(Arc::clone(&state));
        rt.spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            state,
            _rt: rt,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bodies sent to `route`, in order.
    pub fn sent(&self, route: &str) -> Vec<Value> {
        self.state
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == route)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// The `data_idx` of every reset.
    pub fn reset_indices(&self) -> Vec<u64> {
        self.sent("reset")
            .iter()
            .map(|b| b["data_idx"].as_u64().unwrap())
            .collect()
    }

    /// Sessions still open.
    pub fn open_sessions(&self) -> usize {
        self.state.sessions.lock().unwrap().open.len()
    }

    /// Forget session `id`, as a server restart would.
    pub fn forget(&self, id: u64) {
        self.state.sessions.lock().unwrap().open.remove(&id);
    }
}

/// FastAPI's answer to a missing body field.
fn missing(loc: &[&str], input: Value) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(json!({"detail": [{"type": "missing", "loc": loc, "msg": "Field required", "input": input}]})),
    )
        .into_response()
}

fn ok(v: Value) -> Response {
    Json(v).into_response()
}

fn not_valid(id: &Value) -> Response {
    ok(json!({"error": format!("The id {id} is not valid.")}))
}

fn body_json(bytes: &Bytes) -> Option<Value> {
    if bytes.is_empty() {
        None
    } else {
        serde_json::from_slice(bytes).ok()
    }
}

const BABYAI_ACTIONS: &str = r#"Available actions: ["turn left", "turn right", "go to red ball 1", "check available actions"]"#;

fn textcraft_observation(idx: u64) -> String {
    format!("Crafting commands:\ncraft 1 item{idx} using 1 part{idx}\n\nGoal: craft item{idx}.")
}

async fn create(State(d): State<Arc<Double>>, bytes: Bytes) -> Response {
    let body = body_json(&bytes);
    d.log
        .lock()
        .unwrap()
        .push(("create".into(), body.clone().unwrap_or(Value::Null)));
    let mut s = d.sessions.lock().unwrap();
    let id = s.next;
    s.next += 1;
    match d.kind {
        Kind::TextCraft => {
            // `CreateRequestBody`: a body is required; the new env plays data_idx = id.
            if body.is_none() {
                return missing(&["body"], Value::Null);
            }
            s.open.insert(
                id,
                Session {
                    data_idx: Some(id),
                    ..Session::default()
                },
            );
            ok(
                json!({"id": id, "observation": textcraft_observation(id), "done": false, "reward": 0}),
            )
        }
        Kind::BabyAi | Kind::SciWorld => {
            s.open.insert(id, Session::default());
            ok(json!({ "id": id }))
        }
    }
}

async fn reset(State(d): State<Arc<Double>>, Json(b): Json<Value>) -> Response {
    d.log.lock().unwrap().push(("reset".into(), b.clone()));
    let Some(id) = b.get("id").and_then(Value::as_u64) else {
        return missing(&["body", "id"], b);
    };
    let idx = match (b.get("data_idx").and_then(Value::as_u64), d.kind) {
        (Some(i), _) => i,
        (None, Kind::TextCraft) => 0,
        (None, _) => return missing(&["body", "data_idx"], b),
    };
    let mut s = d.sessions.lock().unwrap();
    let Some(sess) = s.open.get_mut(&id) else {
        return not_valid(&b["id"]);
    };
    match d.kind {
        Kind::TextCraft => {
            *sess = Session {
                data_idx: Some(idx),
                ..Session::default()
            };
            ok(
                json!({"id": id, "observation": textcraft_observation(idx), "done": false, "reward": 0}),
            )
        }
        Kind::BabyAi => {
            *sess = Session {
                data_idx: Some(idx),
                ..Session::default()
            };
            ok(json!({
                "observation": format!("Your goal: go to the red ball\nIn front of you in this room, you can see several objects: There is a red ball 1 {} steps in front of you.\n{BABYAI_ACTIONS}", idx % 5 + 1),
                "reward": 0, "score": 0, "deleted": false, "done": false
            }))
        }
        Kind::SciWorld => {
            if idx >= SCIWORLD_TASKS {
                return ok(json!({"error": "list index out of range"}));
            }
            *sess = Session {
                data_idx: Some(idx),
                ..Session::default()
            };
            ok(json!({
                "task_name": "find-non-living-thing", "var_num": idx,
                "task_description": format!("Your task is to find a(n) non-living thing (variation {idx}). First, focus on the thing. Then, move it to the red box in the kitchen."),
                "observation": "This room is called the hallway. In it, you see: \n\tthe agent\n\ta picture\n",
                "reward": 0, "score": 0, "deleted": false, "done": false
            }))
        }
    }
}

async fn step(State(d): State<Arc<Double>>, Json(b): Json<Value>) -> Response {
    d.log.lock().unwrap().push(("step".into(), b.clone()));
    let (Some(id), Some(action)) = (
        b.get("id").and_then(Value::as_u64),
        b.get("action").and_then(Value::as_str),
    ) else {
        return missing(&["body", "action"], b);
    };
    let mut s = d.sessions.lock().unwrap();
    let Some(sess) = s.open.get_mut(&id) else {
        return not_valid(&b["id"]);
    };
    let Some(idx) = sess.data_idx else {
        return ok(json!({"error": "'ScienceWorldEnv' object has no attribute 'variationIdx'"}));
    };
    if sess.done && d.kind != Kind::TextCraft {
        return ok(json!({"error": format!("The task with environment {id} has finished.")}));
    }
    match d.kind {
        // TextCraft has no terminal state: after done it keeps answering.
        Kind::TextCraft => {
            let part = format!("part{idx}");
            let (obs, reward, done) = if action == format!("get 1 {part}") {
                sess.progress = true;
                (format!("Got 1 {part}"), 0, false)
            } else if action == format!("craft 1 item{idx} using 1 {part}") && sess.progress {
                let first = !sess.done;
                sess.done = true;
                (
                    format!("Crafted 1 minecraft:item{idx}"),
                    i32::from(first),
                    first,
                )
            } else if action == "inventory" {
                (
                    "Inventory: You are not carrying anything.".to_string(),
                    0,
                    false,
                )
            } else {
                (format!("Could not execute {action}"), 0, false)
            };
            ok(json!({"observation": obs, "reward": reward, "done": done}))
        }
        Kind::BabyAi => {
            let (obs, reward, done) = match action {
                "go to red ball 1" => (
                    format!("There is a red ball 1 right in front of you 1 steps away.\n The task is completed.\n{BABYAI_ACTIONS}"),
                    0.859375,
                    true,
                ),
                "turn left" | "turn right" => (
                    format!("You see a wall 2 steps away.\n{BABYAI_ACTIONS}"),
                    0.0,
                    false,
                ),
                _ => (
                    format!("The action is not recognized. Please check valid actions.\n{BABYAI_ACTIONS}"),
                    0.0,
                    false,
                ),
            };
            sess.done = done;
            sess.score = reward;
            ok(json!({"observation": obs, "reward": reward, "score": reward, "done": done}))
        }
        Kind::SciWorld => {
            let before = sess.score;
            let obs = match action {
                "focus on picture" => {
                    sess.progress = true;
                    sess.score = 50.0;
                    "You focus on the picture."
                }
                "move picture to red box" if sess.progress => {
                    sess.score = 100.0;
                    sess.done = true;
                    "You move the picture to the red box."
                }
                "focus on agent" => {
                    sess.score = -100.0;
                    sess.done = true;
                    "You focus on the agent."
                }
                "look around" => "This room is called the hallway.",
                _ => "No known action matches that input.",
            };
            ok(json!({
                "observation": obs, "reward": sess.score - before,
                "score": sess.score, "done": sess.done
            }))
        }
    }
}

async fn observation(
    State(d): State<Arc<Double>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    d.log
        .lock()
        .unwrap()
        .push(("observation".into(), json!(q.clone())));
    let id: Option<u64> = q.get("id").and_then(|i| i.parse().ok());
    let s = d.sessions.lock().unwrap();
    match id.and_then(|i| s.open.get(&i)) {
        Some(sess) => ok(json!(format!("observation of task {:?}", sess.data_idx))),
        None => ok(json!({"error": "unknown id"})),
    }
}

async fn close(State(d): State<Arc<Double>>, Json(b): Json<Value>) -> Response {
    d.log.lock().unwrap().push(("close".into(), b.clone()));
    let id = b.get("id").and_then(Value::as_u64).unwrap_or(u64::MAX);
    let removed = d.sessions.lock().unwrap().open.remove(&id).is_some();
    match (removed, d.kind) {
        // SciWorld's close of an unknown id raises: a plain-text 500.
        (false, Kind::SciWorld) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error").into_response()
        }
        (removed, _) => ok(json!(removed)),
    }
}
