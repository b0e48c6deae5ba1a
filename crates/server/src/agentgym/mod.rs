//! AgentGym's env-server dialect on the `/{env}/` routes, per env as
//! AgentGym's server for that env answers its own client
//! (`scripts/agentgym/GAP.md` §3; the recordings in
//! `crates/server/tests/data/agentgym/`).
//!
//! A session's dialect is chosen at `create`: a body with any of agentrl's
//! fields (`env`, `seed`, `data_idx`, `difficulty`, `split`, `params`; our
//! `HttpEnv` always sends `env`) makes a typed session, answered exactly like
//! the top-level routes; any other body (none, TextCraft's `{minecraft_dir,
//! commands, goal}`, SearchQA's `{id}`) an AgentGym session. For an
//! AgentGym session:
//!
//! - the session id is in `id`, or `env_idx` for WebShop and SearchQA;
//! - an invalid action answers 200 with the env's own message as the
//!   observation (WebShop: the page unchanged), reward 0, not done; the
//!   session's invalid-action counter still goes up;
//! - a step after done, an unknown id or an index past the data answer 200
//!   `{"error": …}` where AgentGym does; where AgentGym's server fails with
//!   an uncaught 500 on the client's mistake we answer the 4xx it is (an
//!   unknown WebShop or SearchQA `env_idx`: 404 naming it, as agentrl's
//!   routes answer an id they do not know; a SearchQA item past the data or a
//!   WebShop goal past the seeds: 400; a SearchQA reset without its item:
//!   422);
//! - a body that is not JSON, or whose fields are missing or of the wrong
//!   type, answers FastAPI's 422 `{"detail": [...]}` with pydantic v2's
//!   entries (`type`, `loc`, `msg`, `input`); integer fields and ids are
//!   read as pydantic's lax mode reads them (`"3"`, `3.0` and `3` alike);
//! - ALFWorld's reset takes `data_idx` for `game`, as every other AgentGym
//!   client names its task, and `world_type` defaults to `"Text"`;
//! - `close` answers `true`, then `false` (AgentGym's ALFWorld and WebShop
//!   have no close route; answering 200 keeps their clients' assert happy).
//!
//! Observation *wording* stays agentrl's (the clients' prompts describe the
//! action syntax, not the view); protocol, action lists and the messages
//! clients or trainers match on are AgentGym's.

mod tasks;

use std::collections::HashMap;
use std::sync::Arc;

use agentrl_env_core::{Step, StepError, TaskSpec};
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::routes::{
    body_error, close_typed, create_typed, new_session, reset_to, reset_typed, step_one, AppState,
    EnvSegment, Shared,
};
use crate::sessions::{Dialect, Session, SessionState};
use agentrl_env_client::protocol::{ErrorKind, SessionId, StepResponse};
use tasks::{task_for, Flavor, OutOfRange, Task};

/// The create-body fields only agentrl clients send.
const AGENTRL_CREATE_FIELDS: [&str; 6] =
    ["env", "seed", "data_idx", "difficulty", "split", "params"];

const TEXTCRAFT_INVALID: &str = "Could not execute";
const BABYAI_INVALID: &str = "The action is not recognized. Please check valid actions.";
const ALFWORLD_INVALID: &str = "Nothing happens.";
const SEARCHQA_INVALID: &str =
    "Your previous action is invalid. If you want to search, you should \
    put the query between <search> and </search>. If you want to give the final answer, you \
    should put the answer between <answer> and </answer>. Please try again.";
const SEARCHQA_RIGHT: &str = "Congratulations! You have answered the question correctly.";
const SEARCHQA_WRONG: &str = "Sorry, your answer is incorrect. Please try again.";
/// The user prompt AgentGym's SearchQA server answers to reset, before the question.
const SEARCHQA_PROMPT: &str = "You must reason inside <think>...</think> first. If you do not have \
    enough knowledge, issue a <search>...</search> and then STOP. Do not generate <information> or \
    <answer> yet. Wait for external input wrapped in <information>...</information>. After receiving \
    information, reason again in <think>. If confident, output your final answer in \
    <answer>...</answer>. Do not output <answer> before receiving <information> unless you are fully \
    confident. If you find no further external knowledge needed, you can directly provide the answer \
    inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing \
    </answer>. Follow this process every time.\n\n Question: ";
const ALFWORLD_WORLD_TYPES: [&str; 3] = ["Text", "Embody", "Hybrid"];

// ---------------------------------------------------------------- answers

fn ok(body: Value) -> Response {
    (StatusCode::OK, Json(body)).into_response()
}

/// AgentGym's wrappers catch every env failure into 200 `{"error": …}`.
fn error_200(message: impl Into<String>) -> Response {
    ok(json!({ "error": message.into() }))
}

/// One entry of FastAPI's 422 `detail` list as pydantic v2 writes it.
fn detail(kind: &str, loc: &[Value], msg: impl Into<String>, input: &Value) -> Value {
    json!({ "type": kind, "loc": loc, "msg": msg.into(), "input": input })
}

/// `loc` of a named field: `["body", "id"]`, `["query", "env_idx"]`.
fn loc(parts: &[&str]) -> Vec<Value> {
    parts.iter().map(|p| Value::from(*p)).collect()
}

/// FastAPI's answer to a request that fails validation.
fn unprocessable(details: Vec<Value>) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(json!({ "detail": details })),
    )
        .into_response()
}

/// FastAPI's answer to a missing required field (`loc` as FastAPI writes it).
fn missing(at: &[&str], input: &Value) -> Response {
    unprocessable(vec![detail("missing", &loc(at), "Field required", input)])
}

/// FastAPI's answer to a body that is not JSON: `loc` ends with the
/// character offset of the error, as Python's `json` module reports it.
fn json_invalid(bytes: &[u8], e: &serde_json::Error) -> Response {
    let at = Value::from(error_offset(bytes, e));
    let mut entry = detail(
        "json_invalid",
        &[Value::from("body"), at],
        format!("JSON decode error: {e}"),
        &json!({}),
    );
    entry["ctx"] = json!({ "error": e.to_string() });
    unprocessable(vec![entry])
}

/// Where in `bytes` parsing failed, in characters: the end for a body cut
/// short, else the character serde_json stopped at (its line and 1-based
/// column, in bytes).
fn error_offset(bytes: &[u8], e: &serde_json::Error) -> usize {
    let byte = if e.classify() == serde_json::error::Category::Eof {
        bytes.len()
    } else {
        let line_start = match e.line() {
            0 | 1 => 0,
            line => bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .nth(line - 2)
                .map_or(bytes.len(), |(i, _)| i + 1),
        };
        (line_start + e.column().saturating_sub(1)).min(bytes.len())
    };
    String::from_utf8_lossy(&bytes[..byte]).chars().count()
}

/// Why a value is not the non-negative integer a field needs, in pydantic's
/// words where pydantic has them.
#[derive(Debug, Clone, PartialEq)]
struct NotAnIndex {
    kind: &'static str,
    msg: &'static str,
}

impl NotAnIndex {
    const NOT_DIGITS: Self = Self {
        kind: "int_parsing",
        msg: "Input should be a valid integer, unable to parse string as an integer",
    };
    const NEGATIVE: Self = Self {
        kind: "greater_than_equal",
        msg: "Input should be greater than or equal to 0",
    };
    const TOO_BIG: Self = Self {
        kind: "int_parsing_size",
        msg: "Input should be an integer below 2^64",
    };
    const FRACTION: Self = Self {
        kind: "int_from_float",
        msg: "Input should be a valid integer, got a number with a fractional part",
    };
    const WRONG_TYPE: Self = Self {
        kind: "int_type",
        msg: "Input should be a valid integer",
    };

    /// FastAPI's 422 for the field at `at` holding `input`.
    fn answer(&self, at: &[&str], input: &Value) -> Response {
        let mut entry = detail(self.kind, &loc(at), self.msg, input);
        if *self == Self::NEGATIVE {
            entry["ctx"] = json!({ "ge": 0 });
        }
        unprocessable(vec![entry])
    }
}

/// A non-negative integer as pydantic's lax mode reads an `int`: a JSON
/// integer, a float with no fractional part, or a string of decimal digits
/// (surrounding whitespace and a `+` allowed). Booleans, which pydantic
/// would read as 0 and 1, are refused: a `true` id is a client's bug.
fn lax_index(v: &Value) -> Result<u64, NotAnIndex> {
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_u64() {
                return Ok(i);
            }
            if n.is_i64() {
                return Err(NotAnIndex::NEGATIVE);
            }
            let f = n.as_f64().ok_or(NotAnIndex::WRONG_TYPE)?;
            if f.fract() != 0.0 {
                Err(NotAnIndex::FRACTION)
            } else if f < 0.0 {
                Err(NotAnIndex::NEGATIVE)
            } else if f >= u64::MAX as f64 {
                Err(NotAnIndex::TOO_BIG)
            } else {
                // A whole number below 2^64: the cast is exact.
                Ok(f as u64)
            }
        }
        Value::String(s) => lax_index_str(s),
        _ => Err(NotAnIndex::WRONG_TYPE),
    }
}

/// [`lax_index`] of a string (a body field or a query parameter).
fn lax_index_str(s: &str) -> Result<u64, NotAnIndex> {
    let t = s.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NotAnIndex::NOT_DIGITS);
    }
    if negative && digits.bytes().any(|b| b != b'0') {
        return Err(NotAnIndex::NEGATIVE);
    }
    digits.parse().map_err(|_| NotAnIndex::TOO_BIG)
}

/// What AgentGym's servers answer to an uncaught exception; the server's
/// JSON-error layer gives it our `{"error", "kind"}` body.
fn internal(why: &str) -> Response {
    ApiError::internal(format!("Internal Server Error ({why})")).into_response()
}

/// The answer to a session id the server does not know.
fn unknown_session(flavor: Flavor, id: SessionId) -> Response {
    match flavor {
        // AgentGym's wrappers index a dict and fail with an uncaught
        // KeyError (500); the mistake is the client's, so we answer what
        // agentrl's routes answer to an id they do not know, under the
        // name the client gave it.
        Flavor::WebShop | Flavor::SearchQa => ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorKind::NotFound,
            format!(
                "unknown {} {id} (closed, expired or never created)",
                flavor.id_key()
            ),
        )
        .into_response(),
        _ => error_200(format!("The id {id} is not valid.")),
    }
}

/// The answer to a SearchQA item id past the data: the request's mistake
/// (AgentGym's server fails with an uncaught IndexError, 500).
fn item_out_of_range(OutOfRange { len }: OutOfRange, item: u64) -> Response {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        ErrorKind::InvalidSpec,
        format!(
            "item id {item} is past the data: the items are 0..={}",
            len.saturating_sub(1)
        ),
    )
    .into_response()
}

fn finished(id: SessionId) -> Response {
    error_200(format!("The task with environment {id} has finished."))
}

/// BabyAI's action list as AgentGym appends it: `["a", "b", …]`.
fn babyai_action_list(actions: &[String]) -> String {
    let quoted: Vec<String> = actions
        .iter()
        .map(|a| Value::String(a.clone()).to_string())
        .collect();
    format!("\nAvailable actions: [{}]", quoted.join(", "))
}

fn babyai_observation(observation: &str, state: &SessionState) -> String {
    format!(
        "{observation}{}",
        babyai_action_list(&state.env.available_actions())
    )
}

/// SearchQA's reset answer: AgentGym's prompt with the session's question.
fn searchqa_prompt(first_observation: &str) -> String {
    let question = first_observation
        .trim()
        .strip_prefix("Question:")
        .unwrap_or(first_observation)
        .trim();
    format!("{SEARCHQA_PROMPT}{question}")
}

/// SearchQA's action: the first `<search>…</search>` or `<answer>…</answer>`
/// on one line (AgentGym: `re.search(r"<(search|answer)>(.*?)</\1>")`),
/// turned into agentrl's `search[…]` / `answer[…]`; `None` when there is none.
pub(crate) fn searchqa_action(reply: &str) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for tag in ["search", "answer"] {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        let mut from = 0;
        while let Some(at) = reply[from..].find(&open) {
            let start = from + at + open.len();
            let line_end = reply[start..].find('\n').map_or(reply.len(), |n| start + n);
            if let Some(end) = reply[start..line_end].find(&close) {
                let content = reply[start..start + end].trim();
                if best.as_ref().is_none_or(|(b, _)| from + at < *b) {
                    best = Some((from + at, format!("{tag}[{content}]")));
                }
                break;
            }
            from = start;
        }
    }
    best.map(|(_, action)| action)
}

/// WebShop's `available_actions`: `{"has_search_bar", "clickables"}` from
/// agentrl's `search[…]` / `click[…]` list.
fn webshop_available(actions: &[String]) -> Value {
    let has_search_bar = actions.iter().any(|a| a.starts_with("search["));
    let clickables: Vec<&str> = actions
        .iter()
        .filter_map(|a| a.strip_prefix("click[")?.strip_suffix(']'))
        .collect();
    let mut clickables: Vec<Value> = clickables.into_iter().map(Value::from).collect();
    if has_search_bar {
        clickables.insert(0, Value::from("search"));
    }
    json!({ "has_search_bar": has_search_bar, "clickables": clickables })
}

/// WebShop's `instruction_text`: the `Instruction: …` line of the page.
fn instruction_line(observation: &str) -> String {
    observation
        .lines()
        .find(|l| l.trim_start().starts_with("Instruction:"))
        .unwrap_or(observation)
        .trim()
        .to_string()
}

// ---------------------------------------------------------------- requests

/// What the AgentGym POST routes take: the app state, the `{env}` path
/// segment and the raw body, extracted in that order (as axum extracts a
/// handler's `State`, [`EnvSegment`] and `Bytes` arguments).
pub(crate) struct EnvPost {
    st: Shared,
    path: Option<String>,
    bytes: Bytes,
}

impl FromRequest<Shared> for EnvPost {
    type Rejection = Response;

    async fn from_request(req: Request, st: &Shared) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let EnvSegment(path) = EnvSegment::from_request_parts(&mut parts, st)
            .await
            .map_err(IntoResponse::into_response)?;
        let bytes = Bytes::from_request(Request::from_parts(parts, body), st)
            .await
            .map_err(IntoResponse::into_response)?;
        let st = Arc::clone(st);
        Ok(Self { st, path, bytes })
    }
}

/// An answer given before the request reached a session (a 422, an unknown
/// id), boxed: a `Response` is large for the `Err` of a `Result`.
type Early = Box<Response>;

/// The request body as JSON; `Null` when there is none. Not JSON: FastAPI's
/// 422 `json_invalid` (agentrl's own routes answer 400).
fn body_json(bytes: &Bytes) -> Result<Value, Early> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).map_err(|e| Box::new(json_invalid(bytes, &e)))
}

/// FastAPI's 422 for a body that is neither absent nor an object, where the
/// route reads fields from it.
fn object_body(body: &Value) -> Result<(), Early> {
    match body {
        Value::Null | Value::Object(_) => Ok(()),
        _ => Err(Box::new(unprocessable(vec![detail(
            "model_attributes_type",
            &loc(&["body"]),
            "Input should be a valid dictionary or object to extract fields from",
            body,
        )]))),
    }
}

/// A required integer field of the body (read as [`lax_index`] reads it),
/// or FastAPI's 422.
fn int_field(body: &Value, key: &str) -> Result<u64, Early> {
    object_body(body)?;
    match body.get(key) {
        None | Some(Value::Null) if body.is_null() => Err(Box::new(missing(&["body"], body))),
        None | Some(Value::Null) => Err(Box::new(missing(&["body", key], body))),
        Some(v) => lax_index(v).map_err(|e| Box::new(e.answer(&["body", key], v))),
    }
}

/// An optional integer field of the body.
fn opt_int_field(body: &Value, key: &str) -> Result<Option<u64>, Early> {
    object_body(body)?;
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => lax_index(v)
            .map(Some)
            .map_err(|e| Box::new(e.answer(&["body", key], v))),
    }
}

fn typed<T: serde::de::DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|e| body_error(&e))
}

/// The env the route names (404 when not served).
fn route_env(
    st: &AppState,
    path: Option<&str>,
) -> Result<agentrl_env_core::EnvDescriptor, ApiError> {
    st.resolve_env(path, None).cloned()
}

/// The session `id` if it lives and belongs to `env`.
fn find_session(st: &AppState, env: &str, id: SessionId) -> Option<Arc<Session>> {
    st.sessions.get(id).filter(|s| s.env_name == env)
}

/// The typed session the body's `id` names (typed clients name their
/// session `id` under every env, WebShop's and SearchQA's included).
fn typed_session(st: &AppState, env: &str, body: &Value) -> Option<Arc<Session>> {
    let id = body.get("id").and_then(Value::as_u64)?;
    find_session(st, env, id).filter(|s| s.dialect == Dialect::Agentrl)
}

/// A reset or step for an AgentGym client's id, with what the route read
/// from its body (`Input`).
struct Call<Input> {
    desc: agentrl_env_core::EnvDescriptor,
    flavor: Flavor,
    body: Value,
    session: Arc<Session>,
    id: SessionId,
    input: Input,
}

/// What `reset` and `step` share: route the env, read the body, and hand a
/// typed client's request to `typed_route` (answered as the top-level
/// route answers it), an AgentGym client's to `agentgym_route` with what
/// `validate` read from the body. As FastAPI validates the body before its
/// handler looks the id up, a 422 comes before an unknown id.
async fn session_call<Req, Answer, Input>(
    st: &AppState,
    path: Option<&str>,
    bytes: &Bytes,
    typed_route: impl AsyncFnOnce(&AppState, Option<&str>, Req) -> Result<Answer, ApiError>,
    validate: impl FnOnce(Flavor, &Value) -> Result<Input, Early>,
    agentgym_route: impl AsyncFnOnce(&AppState, Call<Input>) -> Result<Response, ApiError>,
) -> Result<Response, ApiError>
where
    Req: serde::de::DeserializeOwned,
    Answer: serde::Serialize,
{
    let desc = route_env(st, path)?;
    let flavor = Flavor::of(desc.name);
    let body = match body_json(bytes) {
        Ok(b) => b,
        Err(r) => return Ok(*r),
    };
    if typed_session(st, desc.name, &body).is_some() {
        return Ok(Json(typed_route(st, path, typed(body)?).await?).into_response());
    }
    let checked =
        int_field(&body, flavor.id_key()).and_then(|id| Ok((id, validate(flavor, &body)?)));
    let (id, input) = match checked {
        Ok(c) => c,
        Err(r) => return Ok(*r),
    };
    match find_session(st, desc.name, id) {
        None => Ok(unknown_session(flavor, id)),
        Some(s) if s.dialect == Dialect::Agentrl => {
            Ok(Json(typed_route(st, path, typed(body)?).await?).into_response())
        }
        Some(session) => {
            let call = Call {
                desc,
                flavor,
                body,
                session,
                id,
                input,
            };
            agentgym_route(st, call).await
        }
    }
}

/// The GET routes' session: `?id=` or `?env_idx=` per env.
fn query_target(
    st: &AppState,
    flavor: Flavor,
    env: &str,
    query: &HashMap<String, String>,
) -> Result<(Arc<Session>, SessionId), Early> {
    let key = flavor.id_key();
    let raw = query
        .get(key)
        .ok_or_else(|| Box::new(missing(&["query", key], &Value::Null)))?;
    let id: SessionId = lax_index_str(raw)
        .map_err(|e| Box::new(e.answer(&["query", key], &Value::from(raw.as_str()))))?;
    find_session(st, env, id)
        .map(|s| (s, id))
        .ok_or_else(|| Box::new(unknown_session(flavor, id)))
}

// ---------------------------------------------------------------- create

/// `POST /{env}/create`.
pub(crate) async fn create(EnvPost { st, path, bytes }: EnvPost) -> Result<Response, ApiError> {
    let desc = route_env(&st, path.as_deref())?;
    let body = match body_json(&bytes) {
        Ok(b) => b,
        Err(r) => return Ok(*r),
    };
    let speaks_agentrl = AGENTRL_CREATE_FIELDS.iter().any(|k| body.get(k).is_some());
    if speaks_agentrl {
        let req = typed(body)?;
        return Ok(Json(create_typed(&st, path.as_deref(), req).await?).into_response());
    }
    let flavor = Flavor::of(desc.name);
    let index = match flavor {
        Flavor::TextCraft => {
            if body.is_null() {
                return Ok(missing(&["body"], &body));
            }
            let custom = ["commands", "goal"]
                .iter()
                .any(|k| body.get(k).is_some_and(|v| !v.is_null()));
            if custom {
                return Ok(error_200(
                    "agentrl's textcraft builds its tasks from data_idx; custom `commands` and \
                     `goal` are not supported",
                ));
            }
            0
        }
        Flavor::SearchQa => match int_field(&body, "id") {
            Ok(item) => item,
            Err(r) => return Ok(*r),
        },
        _ => 0,
    };
    let default = st.operator_params.default_difficulty(&desc);
    let task = match task_for(
        flavor,
        index,
        &default,
        st.operator_params.difficulty(desc.name),
    ) {
        Ok(t) => t,
        Err(e) => return Ok(item_out_of_range(e, index)),
    };
    let mut params = st.operator_params.merge(&desc, Default::default())?;
    if flavor == Flavor::SearchQa && !params.contains_key("retry_wrong_answer") {
        // AgentGym's SearchQA lets a wrong answer be retried.
        params.insert("retry_wrong_answer".into(), Value::Bool(true));
    }
    let spec = TaskSpec::new(desc.name, task.split, task.difficulty, task.seed);
    let created = match new_session(&st, desc, spec, params, Dialect::AgentGym).await {
        Ok(c) => c,
        // Full (503) stays what it is; a task that cannot be built is the
        // wrapper's caught exception.
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => return Err(e),
        Err(e) => return Ok(error_200(e.body.error)),
    };
    let id = created.id;
    Ok(match flavor {
        Flavor::TextCraft => ok(json!({
            "id": id,
            "observation": created.observation,
            "done": false,
            "reward": 0,
        })),
        Flavor::BabyAi | Flavor::AlfWorld => ok(json!({ "id": id })),
        Flavor::WebShop | Flavor::SearchQa => ok(json!(id)),
        Flavor::Generic => Json(created.into_response_body()).into_response(),
    })
}

// ---------------------------------------------------------------- reset

/// `POST /{env}/reset`.
pub(crate) async fn reset(EnvPost { st, path, bytes }: EnvPost) -> Result<Response, ApiError> {
    session_call(
        &st,
        path.as_deref(),
        &bytes,
        reset_typed,
        reset_index,
        agentgym_reset,
    )
    .await
}

/// The task index a reset body names in `flavor`'s field (`None`: the
/// current task again).
fn reset_index(flavor: Flavor, body: &Value) -> Result<Option<u64>, Early> {
    match flavor {
        Flavor::BabyAi => int_field(body, "data_idx").map(Some),
        Flavor::TextCraft => Ok(Some(opt_int_field(body, "data_idx")?.unwrap_or(0))),
        Flavor::AlfWorld => alfworld_game(body).map(Some),
        Flavor::WebShop => Ok(Some(opt_int_field(body, "session_id")?.unwrap_or(0))),
        // AgentGym's model has `id` optional and its server fails on None
        // (500): the field is required.
        Flavor::SearchQa => int_field(body, "id").map(Some),
        Flavor::Generic => opt_int_field(body, "data_idx"),
    }
}

/// `reset` of an AgentGym session.
async fn agentgym_reset(st: &AppState, call: Call<Option<u64>>) -> Result<Response, ApiError> {
    let Call {
        desc,
        flavor,
        body,
        session,
        id,
        input: index,
    } = call;
    if flavor == Flavor::AlfWorld {
        // Checked once the id is known, as AgentGym's wrapper checks it.
        let world_type = body.get("world_type").and_then(Value::as_str);
        if world_type.is_some_and(|w| !ALFWORLD_WORLD_TYPES.contains(&w)) {
            return Ok(error_200(
                "world_type must be one of \"Text\", \"Embody\" and \"Hybrid\"",
            ));
        }
    }
    let default = st.operator_params.default_difficulty(&desc);
    let task: Option<Task> = match index {
        None => None,
        Some(i) => match task_for(
            flavor,
            i,
            &default,
            st.operator_params.difficulty(desc.name),
        ) {
            Ok(t) => Some(t),
            Err(e) if flavor == Flavor::SearchQa => return Ok(item_out_of_range(e, i)),
            // ALFWorld's wrapper catches its IndexError.
            Err(_) => return Ok(error_200("list index out of range")),
        },
    };
    let reset = reset_to(st, &session, |spec| {
        if let Some(t) = task {
            spec.split = t.split;
            spec.difficulty = t.difficulty;
            spec.seed = t.seed;
        }
    })
    .await;
    let reset = match reset {
        Ok(r) => r,
        // Their wrappers catch nothing: a failure is an uncaught 500, unless
        // the request asked for a task no env can build (a seed past the
        // split), which is its mistake and answers agentrl's 4xx.
        Err(e) if matches!(flavor, Flavor::SearchQa | Flavor::WebShop) => {
            return Ok(if e.status.is_client_error() {
                e.into_response()
            } else {
                internal(&e.body.error)
            })
        }
        Err(e) => return Ok(error_200(e.body.error)),
    };
    let guard = session.state.lock().await;
    Ok(match flavor {
        Flavor::TextCraft => ok(json!({
            "id": id, "observation": reset.observation, "done": false, "reward": 0,
        })),
        Flavor::BabyAi => ok(json!({
            "observation": babyai_observation(&reset.observation, &guard),
            "reward": 0, "score": 0, "deleted": false, "done": false,
        })),
        Flavor::AlfWorld => ok(json!({
            "id": id,
            "observation": reset.observation,
            "available_actions": guard.env.available_actions(),
            "task_type": format!("{}/{}", reset.spec.difficulty, reset.spec),
        })),
        Flavor::WebShop => ok(json!([reset.observation, null])),
        Flavor::SearchQa => ok(json!(searchqa_prompt(&reset.observation))),
        // The typed API's reset answer.
        Flavor::Generic => {
            let env = reset.spec.env.clone();
            ok(json!(reset.into_response_body(id, env)))
        }
    })
}

/// ALFWorld's game from a reset body: `game`, or `data_idx` as every other
/// AgentGym client names its task (both: they must agree); `world_type`,
/// when given, a string (its value is checked once the id is known, and
/// agentrl's ALFWorld is text whatever it says).
fn alfworld_game(body: &Value) -> Result<u64, Early> {
    let game = opt_int_field(body, "game")?;
    let data_idx = opt_int_field(body, "data_idx")?;
    if let Some(v) = body
        .get("world_type")
        .filter(|v| !v.is_null() && !v.is_string())
    {
        return Err(Box::new(unprocessable(vec![detail(
            "string_type",
            &loc(&["body", "world_type"]),
            "Input should be a valid string",
            v,
        )])));
    }
    match (game, data_idx) {
        (Some(g), Some(d)) if g != d => Err(Box::new(unprocessable(vec![detail(
            "value_error",
            &loc(&["body", "data_idx"]),
            format!("game {g} and data_idx {d} differ; data_idx is another name for game"),
            &body["data_idx"],
        )]))),
        (Some(g), _) | (None, Some(g)) => Ok(g),
        (None, None) => Err(Box::new(missing(&["body", "game"], body))),
    }
}

// ---------------------------------------------------------------- step

/// `POST /{env}/step`.
pub(crate) async fn step(EnvPost { st, path, bytes }: EnvPost) -> Result<Response, ApiError> {
    session_call(
        &st,
        path.as_deref(),
        &bytes,
        step_one,
        step_action,
        agentgym_step,
    )
    .await
}

/// The action of a step body.
fn step_action(_: Flavor, body: &Value) -> Result<String, Early> {
    match body.get("action") {
        Some(Value::String(a)) => Ok(a.clone()),
        None | Some(Value::Null) => Err(Box::new(missing(&["body", "action"], body))),
        Some(v) => Err(Box::new(unprocessable(vec![detail(
            "string_type",
            &loc(&["body", "action"]),
            "Input should be a valid string",
            v,
        )]))),
    }
}

/// `step` of an AgentGym session.
async fn agentgym_step(st: &AppState, call: Call<String>) -> Result<Response, ApiError> {
    let (flavor, session, id, action) = (call.flavor, call.session, call.id, call.input);
    let mut guard = session.state.lock().await;
    let answer = step_session(flavor, id, &action, &mut guard);
    drop(guard);
    st.sessions.touch(&session);
    Ok(answer)
}

/// One AgentGym step on a locked session.
fn step_session(flavor: Flavor, id: SessionId, action: &str, state: &mut SessionState) -> Response {
    if state.env.is_done() {
        return after_done(flavor, id, state);
    }
    let sent = match flavor {
        // AgentGym's BabyAI server lower-cases and strips the action.
        Flavor::BabyAi => action.trim().to_lowercase(),
        // No tag: our parser refuses the raw text, which counts it invalid.
        Flavor::SearchQa => searchqa_action(action).unwrap_or_else(|| action.to_string()),
        _ => action.to_string(),
    };
    match state.env.step(&sent) {
        Ok(s) => {
            state.score += s.reward;
            valid_step(flavor, id, s, state)
        }
        Err(StepError::EpisodeOver) => after_done(flavor, id, state),
        Err(StepError::InvalidAction(e)) => {
            let observation = match flavor {
                Flavor::TextCraft => format!("{TEXTCRAFT_INVALID} {action}"),
                Flavor::BabyAi => format!(
                    "{BABYAI_INVALID}{}",
                    babyai_action_list(&state.env.available_actions())
                ),
                Flavor::AlfWorld => ALFWORLD_INVALID.to_string(),
                // "If action not valid, perform nothing": the page unchanged.
                Flavor::WebShop => state.env.observation(),
                Flavor::SearchQa => SEARCHQA_INVALID.to_string(),
                Flavor::Generic => format!("Invalid action: {e}."),
            };
            step_answer(flavor, id, observation, 0.0, false, state)
        }
    }
}

fn valid_step(flavor: Flavor, id: SessionId, s: Step, state: &SessionState) -> Response {
    if flavor == Flavor::Generic {
        let status = {
            let mut st = state.status();
            st.done = s.done;
            st.success = s.success;
            st
        };
        return Json(StepResponse {
            id,
            observation: s.observation,
            reward: s.reward,
            info: s.info,
            status,
        })
        .into_response();
    }
    let observation = match flavor {
        Flavor::BabyAi => babyai_observation(&s.observation, state),
        Flavor::SearchQa if s.success => SEARCHQA_RIGHT.to_string(),
        Flavor::SearchQa if s.info.extra.contains_key("wrong_answer") && !s.done => {
            SEARCHQA_WRONG.to_string()
        }
        _ => s.observation,
    };
    step_answer(flavor, id, observation, s.reward, s.done, state)
}

/// A step answer in `flavor`'s fields.
fn step_answer(
    flavor: Flavor,
    id: SessionId,
    observation: String,
    reward: f64,
    done: bool,
    state: &SessionState,
) -> Response {
    match flavor {
        Flavor::TextCraft => {
            ok(json!({ "observation": observation, "reward": reward, "done": done }))
        }
        Flavor::BabyAi => ok(json!({
            "observation": observation, "reward": reward, "score": state.score, "done": done,
        })),
        Flavor::AlfWorld => ok(json!({
            "observation": observation,
            "reward": reward,
            "available_actions": state.env.available_actions(),
            "done": done,
        })),
        Flavor::WebShop => {
            ok(json!({ "state": observation, "reward": reward, "done": done, "info": null }))
        }
        Flavor::SearchQa => ok(json!({
            "observation": observation, "reward": reward, "done": done, "info": null,
        })),
        Flavor::Generic => {
            let status = state.status();
            ok(json!({
                "id": id,
                "observation": observation,
                "reward": reward,
                "done": done,
                "success": status.success,
                "score": status.score,
                "steps": status.steps,
                "invalid_actions": status.invalid_actions,
                "max_steps": status.max_steps,
                "state_key": status.state_key,
            }))
        }
    }
}

/// A step once the episode is over: BabyAI, ALFWorld and the generic dialect
/// refuse it with AgentGym's message; TextCraft's, WebShop's and SearchQA's
/// AgentGym envs have no terminal state and answer a step that did nothing.
fn after_done(flavor: Flavor, id: SessionId, state: &SessionState) -> Response {
    match flavor {
        Flavor::SearchQa if state.env.is_success() => {
            step_answer(flavor, id, SEARCHQA_RIGHT.to_string(), 0.0, false, state)
        }
        Flavor::TextCraft | Flavor::WebShop | Flavor::SearchQa => {
            step_answer(flavor, id, state.env.observation(), 0.0, false, state)
        }
        Flavor::BabyAi | Flavor::AlfWorld | Flavor::Generic => finished(id),
    }
}

// ---------------------------------------------------------------- close

/// `POST /{env}/close`: `true` when it closed a session, `false` when the
/// id names none (AgentGym's answer to a second close).
pub(crate) async fn close(EnvPost { st, path, bytes }: EnvPost) -> Result<Response, ApiError> {
    let desc = route_env(&st, path.as_deref())?;
    let flavor = Flavor::of(desc.name);
    let body = match body_json(&bytes) {
        Ok(b) => b,
        Err(r) => return Ok(*r),
    };
    if typed_session(&st, desc.name, &body).is_some() {
        return Ok(Json(close_typed(&st, path.as_deref(), typed(body)?)?).into_response());
    }
    let id = match int_field(&body, flavor.id_key()) {
        Ok(id) => id,
        Err(r) => return Ok(*r),
    };
    match find_session(&st, desc.name, id) {
        Some(_) => Ok(ok(json!(st.sessions.remove(id).is_some()))),
        None => Ok(ok(json!(false))),
    }
}

// ---------------------------------------------------------------- GET routes

/// A GET route of `/{env}/`: the session the query names answered by
/// `answer` (see [`read`]).
pub(crate) fn read_route(answer: fn(Flavor, &SessionState) -> Value) -> MethodRouter<Shared> {
    get(
        move |State(st): State<Shared>,
              EnvSegment(path): EnvSegment,
              Query(query): Query<HashMap<String, String>>| async move {
            read(&st, path.as_deref(), &query, answer).await
        },
    )
}

/// `GET /{env}/observation?id=` (`?env_idx=` for WebShop and SearchQA).
pub(crate) fn observation(flavor: Flavor, state: &SessionState) -> Value {
    match flavor {
        Flavor::BabyAi => json!({
            "observation": babyai_observation(&state.env.observation(), state),
            "reward": 0,
            "score": state.score,
            "done": state.env.is_done(),
            "deleted": false,
        }),
        Flavor::SearchQa if state.env.steps() == 0 => {
            json!(searchqa_prompt(&state.first_observation))
        }
        _ => json!(state.env.observation()),
    }
}

/// `GET /{env}/available_actions`: a list (WebShop: `{has_search_bar, clickables}`).
pub(crate) fn available_actions(flavor: Flavor, state: &SessionState) -> Value {
    let actions = state.env.available_actions();
    match flavor {
        Flavor::WebShop => webshop_available(&actions),
        _ => json!(actions),
    }
}

/// `GET /{env}/instruction_text` (WebShop's): the `Instruction: …` line.
pub(crate) fn instruction_text(_: Flavor, state: &SessionState) -> Value {
    json!(instruction_line(&state.first_observation))
}

/// A GET route: typed sessions get the top-level answer (`?id=`, a bare
/// string or list), AgentGym sessions `answer`.
async fn read(
    st: &AppState,
    path: Option<&str>,
    query: &HashMap<String, String>,
    answer: impl FnOnce(Flavor, &SessionState) -> Value,
) -> Result<Response, ApiError> {
    let desc = route_env(st, path)?;
    let flavor = Flavor::of(desc.name);
    // A typed session is named by `?id=` whatever the env.
    let typed_session = query
        .get("id")
        .and_then(|raw| raw.parse::<SessionId>().ok())
        .and_then(|id| find_session(st, desc.name, id))
        .filter(|s| s.dialect == Dialect::Agentrl);
    let session = match typed_session {
        Some(s) => s,
        None => match query_target(st, flavor, desc.name, query) {
            Ok((s, _)) => s,
            Err(r) => return Ok(*r),
        },
    };
    let guard = session.state.lock().await;
    if session.dialect == Dialect::Agentrl {
        // The typed GET answers: the reads the top-level routes give.
        return Ok(Json(answer(Flavor::Generic, &guard)).into_response());
    }
    Ok(ok(answer(flavor, &guard)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searchqa_takes_the_first_tag_on_one_line() {
        assert_eq!(
            searchqa_action("<think>x</think>\n<search> capital of france? </search>").as_deref(),
            Some("search[capital of france?]")
        );
        assert_eq!(
            searchqa_action("<answer> Paris </answer> <search>q</search>").as_deref(),
            Some("answer[Paris]")
        );
        assert_eq!(
            searchqa_action("<search>q</search><answer>a</answer>").as_deref(),
            Some("search[q]")
        );
        // Python's `.` stops at a newline: a tag split over lines is no match.
        assert_eq!(searchqa_action("<search>a\nb</search>"), None);
        assert_eq!(
            searchqa_action("<search>a\n<search>b</search>").as_deref(),
            Some("search[b]")
        );
        assert_eq!(searchqa_action("I do not know."), None);
    }

    #[test]
    fn indices_are_read_as_pydantic_lax_mode_reads_ints() {
        for (v, want) in [
            (json!(7), 7),
            (json!("7"), 7),
            (json!(" +7\n"), 7),
            (json!("007"), 7),
            (json!(7.0), 7),
            (json!("-0"), 0),
            (json!(u64::MAX), u64::MAX),
            (json!(u64::MAX.to_string()), u64::MAX),
        ] {
            assert_eq!(lax_index(&v), Ok(want), "{v}");
        }
        for (v, why) in [
            (json!("7a"), NotAnIndex::NOT_DIGITS),
            (json!(""), NotAnIndex::NOT_DIGITS),
            (json!("+"), NotAnIndex::NOT_DIGITS),
            (json!("7.0"), NotAnIndex::NOT_DIGITS),
            (json!("1 2"), NotAnIndex::NOT_DIGITS),
            (json!(-3), NotAnIndex::NEGATIVE),
            (json!("-3"), NotAnIndex::NEGATIVE),
            (json!(-3.0), NotAnIndex::NEGATIVE),
            (json!(2.5), NotAnIndex::FRACTION),
            (json!(1e30), NotAnIndex::TOO_BIG),
            (json!("18446744073709551616"), NotAnIndex::TOO_BIG),
            (json!(true), NotAnIndex::WRONG_TYPE),
            (json!([1]), NotAnIndex::WRONG_TYPE),
            (json!({"id": 1}), NotAnIndex::WRONG_TYPE),
        ] {
            assert_eq!(lax_index(&v), Err(why), "{v}");
        }
    }

    #[test]
    fn a_json_error_is_located_as_pythons_json_module_locates_it() {
        // Python: json.loads(text) raises with .pos = the offset here.
        for (text, pos) in [
            ("{\"id\": ", 7),
            ("{\"id\": x}", 7),
            ("{\"id\": 1,\n \"action\": x}", 21),
            ("[1,2", 4),
            ("{\"é\": x}", 6),
        ] {
            let e = serde_json::from_str::<Value>(text).unwrap_err();
            assert_eq!(error_offset(text.as_bytes(), &e), pos, "{text:?}: {e}");
        }
    }

    #[test]
    fn babyai_list_is_agentgyms_json_style() {
        let list = babyai_action_list(&["turn left".into(), "go to \"x\" 1".into()]);
        assert_eq!(
            list,
            "\nAvailable actions: [\"turn left\", \"go to \\\"x\\\" 1\"]"
        );
    }

    #[test]
    fn searchqa_prompt_ends_with_the_question() {
        let p = searchqa_prompt("Question: what is the capital of france?\n");
        assert!(p.starts_with("You must reason inside <think>"));
        assert!(p.ends_with(
            "Follow this process every time.\n\n Question: what is the capital of france?"
        ));
    }

    #[test]
    fn webshop_actions_become_search_bar_and_clickables() {
        let v = webshop_available(&[
            "search[shoes]".into(),
            "click[b0x]".into(),
            "click[buy now]".into(),
        ]);
        assert_eq!(
            v,
            json!({"has_search_bar": true, "clickables": ["search", "b0x", "buy now"]})
        );
        let v = webshop_available(&["click[back to search]".into()]);
        assert_eq!(
            v,
            json!({"has_search_bar": false, "clickables": ["back to search"]})
        );
        assert_eq!(
            instruction_line("WebShop\nInstruction: i need shoes\n[Search]"),
            "Instruction: i need shoes"
        );
    }
}
