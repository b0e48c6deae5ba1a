//! The routes, their extractors and the layers around them.
//!
//! Every session route exists twice, from one router: at the top level (the
//! environment comes from the body or from the session id) and nested under
//! `/{env}/`, so that an AgentGym client given the base URL
//! `http://host:port/{env}` works unchanged.

use std::collections::BTreeMap;
use std::sync::Arc;

use agentrl_connections::Hardening;
use agentrl_env_core::{Env, EnvDescriptor, EnvParams, Split, TaskSpec};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::agentgym;
use crate::builds::Builds;
use crate::error::ApiError;
use crate::openapi;
use crate::params::OperatorParams;
use crate::sessions::{Dialect, Session, SessionState, SessionStore};
use agentrl_env_client::protocol::{
    BatchStepResult, CloseRequest, CloseResponse, CreateRequest, EnvEntry, ErrorKind,
    ExpertActionResponse, HealthResponse, IdQuery, ResetRequest, SessionId, SessionResponse,
    SessionStatus, StepRequest, StepResponse,
};

/// Shared state of every route.
pub(crate) struct AppState {
    pub envs: BTreeMap<&'static str, EnvDescriptor>,
    pub sessions: SessionStore,
    pub operator_params: OperatorParams,
    /// Slots for task builds and expert searches (`ServerConfig::max_builds`).
    pub builds: Builds,
}

pub(crate) type Shared = Arc<AppState>;

/// The full application: routes inside the shared auth, request timeout,
/// body limit, panic and JSON-error layers ([`agentrl_connections::harden`]).
/// Work of a request that timed out or whose client hung up is cancelled
/// (see [`crate::builds`]).
pub(crate) fn router(state: Shared, hardening: Hardening) -> Router {
    let routes = Router::new()
        .route("/", get(root))
        .route("/health", get(health))
        .route("/envs", get(list_envs))
        .route("/openapi.json", get(openapi_json))
        .route("/{env}", get(env_info))
        .route("/{env}/", get(env_info))
        .merge(session_routes())
        .nest("/{env}", env_session_routes())
        .fallback(not_found)
        .with_state(state);
    agentrl_connections::harden::<ApiError>(routes, hardening)
}

/// The session routes, mounted twice: at the root, where the environment comes
/// from the body or the session, and under `/{env}`, where [`EnvSegment`]
/// carries it.
fn session_routes() -> Router<Shared> {
    Router::new()
        .route("/create", post(create))
        .route("/reset", post(reset))
        .route("/step", post(step))
        .route("/step_batch", post(step_batch))
        .route("/close", post(close))
        // A bare JSON string, as AgentGym's `/observation` answers.
        .route("/observation", read_route(|env| env.observation()))
        .route(
            "/available_actions",
            read_route(|env| env.available_actions()),
        )
        .route("/instructions", read_route(|env| env.instructions()))
        .route("/expert_action", get(expert_action))
}

/// The session routes under `/{env}/`: a session created there by an
/// AgentGym client (a create body without agentrl's fields) speaks the
/// AgentGym dialect of its env ([`agentgym`]); one created by an agentrl
/// client (`HttpEnv` always names `env`) speaks the typed API.
fn env_session_routes() -> Router<Shared> {
    Router::new()
        .route("/create", post(agentgym::create))
        .route("/reset", post(agentgym::reset))
        .route("/step", post(agentgym::step))
        .route("/step_batch", post(step_batch))
        .route("/close", post(agentgym::close))
        .route("/observation", agentgym::read_route(agentgym::observation))
        .route(
            "/available_actions",
            agentgym::read_route(agentgym::available_actions),
        )
        .route(
            "/instruction_text",
            agentgym::read_route(agentgym::instruction_text),
        )
        .route("/instructions", read_route(|env| env.instructions()))
        .route("/expert_action", get(expert_action))
}

// ---------------------------------------------------------------- extractors

/// A JSON body, read whatever the content type (AgentGym clients post
/// `create` with no body and no content type); an empty body reads as `{}`.
/// Rejections are JSON errors: 400 malformed JSON, 422 wrong shape, 413 too large.
pub(crate) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(text)
            .map(JsonBody)
            .map_err(|e| body_error(&e))
    }
}

/// 422 for a body of the wrong shape, 400 for malformed JSON.
pub(crate) fn body_error(e: &serde_json::Error) -> ApiError {
    if e.is_data() {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::BadRequest,
            format!("invalid request body: {e}"),
        )
    } else {
        ApiError::bad_request(format!("malformed JSON body: {e}"))
    }
}

pub(crate) fn body_rejection(r: BytesRejection) -> ApiError {
    let status = r.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(status, ErrorKind::PayloadTooLarge, "request body too large")
    } else {
        ApiError::new(
            status,
            ErrorKind::BadRequest,
            format!("cannot read request body: {}", r.body_text()),
        )
    }
}

/// The `?id=` query of the GET routes.
pub(crate) struct IdParam(pub SessionId);

impl<S: Send + Sync> FromRequestParts<S> for IdParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<IdQuery>::from_request_parts(parts, state)
            .await
            .map(|q| IdParam(q.0.id))
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "expected a query ?id=<session id>: {}",
                    e.body_text()
                ))
            })
    }
}

/// The `{env}` path segment: `Some` under `/{env}/`, `None` at the root.
pub(crate) struct EnvSegment(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for EnvSegment {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Option::<Path<String>>::from_request_parts(parts, state)
            .await
            .map(|p| EnvSegment(p.map(|p| p.0)))
            .map_err(|e| {
                ApiError::bad_request(format!("bad environment name in path: {}", e.body_text()))
            })
    }
}

// ---------------------------------------------------------------- layers

async fn not_found(req: Request<Body>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorKind::NotFound,
        format!(
            "no route {} {} (see GET /openapi.json)",
            req.method(),
            req.uri().path()
        ),
    )
}

// ---------------------------------------------------------------- helpers

impl AppState {
    pub(crate) fn served(&self) -> String {
        self.envs.keys().copied().collect::<Vec<_>>().join(", ")
    }

    /// The environment a request names: by path, by body, or the only one served.
    pub(crate) fn resolve_env(
        &self,
        path: Option<&str>,
        body: Option<&str>,
    ) -> Result<&EnvDescriptor, ApiError> {
        let name = match (path, body) {
            (Some(p), Some(b)) if p != b => {
                return Err(ApiError::bad_request(format!(
                    "the body names environment '{b}' but the route is /{p}/"
                )))
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) if self.envs.len() == 1 => {
                return self
                    .envs
                    .values()
                    .next()
                    .ok_or_else(|| ApiError::internal("no environment"))
            }
            (None, None) => {
                return Err(ApiError::bad_request(format!(
                "which environment? pass \"env\" in the body or use /{{env}}/create (served: {})",
                self.served()
            )))
            }
        };
        self.envs
            .get(name)
            .ok_or_else(|| ApiError::unknown_env(name, &self.served()))
    }

    /// The session `id`, checked against the environment the route or body names.
    pub(crate) fn session(
        &self,
        id: SessionId,
        path: Option<&str>,
        body: Option<&str>,
    ) -> Result<Arc<Session>, ApiError> {
        for name in [path, body].into_iter().flatten() {
            if !self.envs.contains_key(name) {
                return Err(ApiError::unknown_env(name, &self.served()));
            }
        }
        let s = self
            .sessions
            .get(id)
            .ok_or_else(|| ApiError::unknown_session(id))?;
        for name in [path, body].into_iter().flatten() {
            if name != s.env_name {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    ErrorKind::NotFound,
                    format!("session {id} is a '{}' session, not '{name}'", s.env_name),
                ));
            }
        }
        Ok(s)
    }
}

fn pick_seed(seed: Option<u64>, data_idx: Option<u64>) -> Result<Option<u64>, ApiError> {
    match (seed, data_idx) {
        (Some(a), Some(b)) if a != b => Err(ApiError::bad_request(format!(
            "seed {a} and data_idx {b} differ; they name the same thing"
        ))),
        (Some(a), _) | (None, Some(a)) => Ok(Some(a)),
        (None, None) => Ok(None),
    }
}

fn parse_split(split: Option<&str>) -> Result<Option<Split>, ApiError> {
    split
        .map(|s| {
            s.parse::<Split>()
                .map_err(|e| ApiError::bad_request(e.to_string()))
        })
        .transpose()
}

// ---------------------------------------------------------------- info routes

async fn root(State(st): State<Shared>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "name": "agentrl env server",
        "protocol": "AgentGym env-server routes; see /openapi.json",
        "envs": st.envs.keys().collect::<Vec<_>>(),
    }))
}

async fn health(State(st): State<Shared>) -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "ok".into(),
        sessions: st.sessions.len(),
        max_sessions: st.sessions.max_sessions,
        builds_running: st.builds.running(),
        builds_waiting: st.builds.waiting(),
    })
}

fn entry(d: &EnvDescriptor) -> EnvEntry {
    EnvEntry {
        name: d.name.to_string(),
        summary: d.summary.to_string(),
        difficulties: d.difficulties.iter().map(|s| s.to_string()).collect(),
        default_max_turns: d.default_max_turns,
        request_params: d.request_params.iter().map(|s| s.to_string()).collect(),
    }
}

async fn list_envs(State(st): State<Shared>) -> Json<Vec<EnvEntry>> {
    Json(st.envs.values().map(entry).collect())
}

async fn env_info(
    State(st): State<Shared>,
    EnvSegment(env): EnvSegment,
) -> Result<Json<EnvEntry>, ApiError> {
    Ok(Json(entry(st.resolve_env(env.as_deref(), None)?)))
}

async fn openapi_json(State(st): State<Shared>) -> Json<serde_json::Value> {
    Json(openapi::document(
        &st.envs.keys().copied().collect::<Vec<_>>(),
    ))
}

// ---------------------------------------------------------------- create

async fn create(
    State(st): State<Shared>,
    EnvSegment(path): EnvSegment,
    JsonBody(req): JsonBody<CreateRequest>,
) -> Result<Json<SessionResponse>, ApiError> {
    create_typed(&st, path.as_deref(), req).await.map(Json)
}

/// `create` of the typed API, for the top level and for agentrl clients under `/{env}/`.
pub(crate) async fn create_typed(
    st: &AppState,
    path: Option<&str>,
    req: CreateRequest,
) -> Result<SessionResponse, ApiError> {
    let desc = st.resolve_env(path, req.env.as_deref())?.clone();
    let seed = pick_seed(req.seed, req.data_idx)?.unwrap_or(0);
    let split = parse_split(req.split.as_deref())?.unwrap_or(Split::Train);
    let difficulty = match req.difficulty {
        Some(d) => d,
        None => st.operator_params.default_difficulty(&desc),
    };
    let spec = TaskSpec::new(desc.name, split, difficulty, seed);
    let params = st
        .operator_params
        .merge(&desc, req.params.unwrap_or_default())?;
    let created = new_session(st, desc, spec, params, Dialect::Agentrl).await?;
    Ok(created.into_response_body())
}

/// A session just created.
pub(crate) struct NewSession {
    pub id: SessionId,
    pub spec: TaskSpec,
    pub observation: String,
    pub instructions: String,
    pub status: SessionStatus,
}

impl NewSession {
    pub(crate) fn into_response_body(self) -> SessionResponse {
        SessionResponse {
            id: self.id,
            env: self.spec.env.clone(),
            spec: self.spec,
            observation: self.observation,
            instructions: Some(self.instructions),
            reward: 0.0,
            status: self.status,
        }
    }
}

/// Build `spec`'s env in a build slot ([`Builds`]) and store it as a new session.
pub(crate) async fn new_session(
    st: &AppState,
    desc: EnvDescriptor,
    spec: TaskSpec,
    params: EnvParams,
    dialect: Dialect,
) -> Result<NewSession, ApiError> {
    // Refuse before building the env: building can cost milliseconds.
    if st.sessions.is_full() {
        return Err(ApiError::full(st.sessions.max_sessions));
    }
    let build_params = params.clone();
    let build_spec = spec.clone();
    let (env, observation, instructions) = st
        .builds
        .run(move || {
            let env = desc.create(&build_spec, &build_params)?;
            let observation = env.observation();
            let instructions = env.instructions();
            Ok::<_, ApiError>((env, observation, instructions))
        })
        .await??;
    let state = SessionState {
        env,
        score: 0.0,
        first_observation: observation.clone(),
    };
    let status = state.status();
    let id = st
        .sessions
        .insert(desc_name(st, &spec.env)?, dialect, params, state)
        .ok_or_else(|| ApiError::full(st.sessions.max_sessions))?;
    Ok(NewSession {
        id,
        spec,
        observation,
        instructions,
        status,
    })
}

fn desc_name(st: &AppState, name: &str) -> Result<&'static str, ApiError> {
    st.envs
        .get(name)
        .map(|d| d.name)
        .ok_or_else(|| ApiError::unknown_env(name, &st.served()))
}

// ---------------------------------------------------------------- reset

async fn reset(
    State(st): State<Shared>,
    EnvSegment(path): EnvSegment,
    JsonBody(req): JsonBody<ResetRequest>,
) -> Result<Json<SessionResponse>, ApiError> {
    reset_typed(&st, path.as_deref(), req).await.map(Json)
}

/// `reset` of the typed API, for the top level and for agentrl clients under `/{env}/`.
pub(crate) async fn reset_typed(
    st: &AppState,
    path: Option<&str>,
    req: ResetRequest,
) -> Result<SessionResponse, ApiError> {
    let session = st.session(req.id, path, req.env.as_deref())?;
    let seed = pick_seed(req.seed, req.data_idx)?;
    let split = parse_split(req.split.as_deref())?;
    let reset = reset_to(st, &session, |spec| {
        if let Some(seed) = seed {
            spec.seed = seed;
        }
        if let Some(split) = split {
            spec.split = split;
        }
        if let Some(d) = req.difficulty {
            spec.difficulty = d;
        }
    })
    .await?;
    Ok(reset.into_response_body(req.id, session.env_name.to_string()))
}

/// A session just reset: its task, first observation and status.
pub(crate) struct ResetSession {
    pub spec: TaskSpec,
    pub observation: String,
    pub status: SessionStatus,
}

impl ResetSession {
    /// The answer to the reset of session `id` of `env`.
    pub(crate) fn into_response_body(self, id: SessionId, env: String) -> SessionResponse {
        SessionResponse {
            id,
            env,
            spec: self.spec,
            observation: self.observation,
            instructions: None,
            reward: 0.0,
            status: self.status,
        }
    }
}

/// Reset `session` to its current task changed by `change`: the env's own
/// reset when the task stays, else a new env for the new task.
pub(crate) async fn reset_to(
    st: &AppState,
    session: &Arc<Session>,
    change: impl FnOnce(&mut TaskSpec),
) -> Result<ResetSession, ApiError> {
    let desc = st.resolve_env(Some(session.env_name), None)?.clone();
    let params = session.params.clone();
    let mut guard = Arc::clone(&session.state).lock_owned().await;
    let current = guard.env.spec().clone();
    let mut spec = current.clone();
    change(&mut spec);
    let (guard, observation) = if spec == current {
        // Same task: the env's own reset is cheap (it restores a stored state).
        let observation = guard.env.reset();
        (guard, observation)
    } else {
        // Another task: build it like `create` does, in a build slot.
        let new_spec = spec.clone();
        st.builds
            .run(move || {
                let env = desc.create(&new_spec, &params)?;
                let observation = env.observation();
                guard.env = env;
                Ok::<_, ApiError>((guard, observation))
            })
            .await??
    };
    let mut guard = guard;
    guard.score = 0.0;
    guard.first_observation = observation.clone();
    let status = guard.status();
    drop(guard);
    st.sessions.touch(session);
    Ok(ResetSession {
        spec,
        observation,
        status,
    })
}

// ---------------------------------------------------------------- step

/// One step, called directly on the async worker: environment steps take
/// microseconds (see `agentrl bench server`), less than a `spawn_blocking`
/// hand-off costs.
async fn step(
    State(st): State<Shared>,
    EnvSegment(path): EnvSegment,
    JsonBody(req): JsonBody<StepRequest>,
) -> Result<Json<StepResponse>, ApiError> {
    step_one(&st, path.as_deref(), req).await.map(Json)
}

/// One step of the typed API (also `step_batch`'s and agentrl clients' under `/{env}/`).
pub(crate) async fn step_one(
    st: &AppState,
    path: Option<&str>,
    req: StepRequest,
) -> Result<StepResponse, ApiError> {
    let session = st.session(req.id, path, req.env.as_deref())?;
    let mut guard = session.state.lock().await;
    let result = guard.env.step(&req.action);
    let out = match result {
        Ok(s) => {
            guard.score += s.reward;
            let mut status = guard.status();
            // The step's own flags are what an in-process caller sees.
            status.done = s.done;
            status.success = s.success;
            Ok(StepResponse {
                id: req.id,
                observation: s.observation,
                reward: s.reward,
                info: s.info,
                status,
            })
        }
        Err(e) => Err(ApiError::from_step(&e, guard.status())),
    };
    drop(guard);
    st.sessions.touch(&session);
    out
}

/// Steps in the order given (two entries for one session apply in order).
async fn step_batch(
    State(st): State<Shared>,
    EnvSegment(path): EnvSegment,
    JsonBody(reqs): JsonBody<Vec<StepRequest>>,
) -> Json<Vec<BatchStepResult>> {
    let mut out = Vec::with_capacity(reqs.len());
    for req in reqs {
        out.push(match step_one(&st, path.as_deref(), req).await {
            Ok(r) => BatchStepResult {
                code: 200,
                ok: Some(r),
                err: None,
            },
            Err(e) => BatchStepResult {
                code: e.status.as_u16(),
                ok: None,
                err: Some(*e.body),
            },
        });
    }
    Json(out)
}

// ---------------------------------------------------------------- close

async fn close(
    State(st): State<Shared>,
    EnvSegment(path): EnvSegment,
    JsonBody(req): JsonBody<CloseRequest>,
) -> Result<Json<CloseResponse>, ApiError> {
    close_typed(&st, path.as_deref(), req).map(Json)
}

/// `close` of the typed API.
pub(crate) fn close_typed(
    st: &AppState,
    path: Option<&str>,
    req: CloseRequest,
) -> Result<CloseResponse, ApiError> {
    st.session(req.id, path, req.env.as_deref())?;
    st.sessions
        .remove(req.id)
        .ok_or_else(|| ApiError::unknown_session(req.id))?;
    Ok(CloseResponse {
        id: req.id,
        closed: true,
    })
}

// ---------------------------------------------------------------- GET ?id=

/// `GET ?id=` answering what `read` reads from the session's env (a read
/// does not restart the session's idle timer).
fn read_route<T: Serialize + Send + 'static>(read: fn(&dyn Env) -> T) -> MethodRouter<Shared> {
    get(
        move |State(st): State<Shared>, EnvSegment(path): EnvSegment, IdParam(id): IdParam| async move {
            let session = st.session(id, path.as_deref(), None)?;
            let guard = session.state.lock().await;
            Ok::<_, ApiError>(Json(read(guard.env.as_ref())))
        },
    )
}

/// The expert may search (BFS, value iteration): run it in a build slot.
async fn expert_action(
    State(st): State<Shared>,
    EnvSegment(path): EnvSegment,
    IdParam(id): IdParam,
) -> Result<Json<ExpertActionResponse>, ApiError> {
    let session = st.session(id, path.as_deref(), None)?;
    let mut guard = Arc::clone(&session.state).lock_owned().await;
    let action = st.builds.run(move || guard.env.expert_action()).await?;
    st.sessions.touch(&session);
    Ok(Json(ExpertActionResponse { action }))
}
