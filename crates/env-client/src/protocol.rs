//! The JSON bodies of every route, shared by the server and [`crate::HttpEnv`].
//!
//! Field names follow AgentGym's env servers (`id`, `data_idx`, `action`,
//! `observation`, `reward`, `done`, `score`) so that an AgentGym client works
//! unchanged; everything else is an addition that AgentGym clients ignore.

use agentrl_env_core::{ActionError, EnvParams, StepInfo, TaskSpec};
use serde::{Deserialize, Serialize};

/// A session id. Ids are unique across every environment of one server and
/// drawn at random below 2^53 (exact in every JSON parser, JavaScript's
/// included), so that one client cannot guess another's session.
pub type SessionId = u64;

/// `POST /create` and `POST /{env}/create`. Every field is optional: an
/// AgentGym client posts no body at all.
///
/// `data_idx` is AgentGym's name for the task index and is the same thing as
/// `seed`: the seed index inside `split` (default `train`), so `data_idx = 7`
/// is `TaskSpec { split: train, seed: 7 }`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// The environment; required at the top level unless the server serves one.
    pub env: Option<String>,
    pub seed: Option<u64>,
    pub data_idx: Option<u64>,
    /// Default: the environment's first difficulty.
    pub difficulty: Option<String>,
    /// `train` (default), `val` or `test`.
    pub split: Option<String>,
    /// Environment-specific options, as in the `[env]` config section.
    pub params: Option<EnvParams>,
}

/// `POST /reset`: restart the session's task, or switch it to another task
/// when `seed`/`data_idx`, `difficulty` or `split` differ from the current one.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetRequest {
    pub env: Option<String>,
    pub id: SessionId,
    pub seed: Option<u64>,
    pub data_idx: Option<u64>,
    pub difficulty: Option<String>,
    pub split: Option<String>,
}

/// `POST /step` and one entry of `POST /step_batch`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRequest {
    pub env: Option<String>,
    pub id: SessionId,
    pub action: String,
}

/// `POST /close`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseRequest {
    pub env: Option<String>,
    pub id: SessionId,
}

/// The `?id=` of the GET routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdQuery {
    pub id: SessionId,
}

/// Counters and flags of a session after a request; they let the client answer
/// the `Env` trait's accessors without a round trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub done: bool,
    pub success: bool,
    /// Sum of the rewards since the last reset (AgentGym's `score`).
    pub score: f64,
    pub steps: usize,
    pub invalid_actions: usize,
    pub max_steps: usize,
    /// `Env::state_key` of the current state.
    pub state_key: u64,
}

/// Answer of `create` and `reset`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionResponse {
    pub id: SessionId,
    pub env: String,
    pub spec: TaskSpec,
    pub observation: String,
    /// The environment's instructions (only in the answer of `create`).
    pub instructions: Option<String>,
    /// Always 0 (AgentGym's reset answer carries a reward).
    pub reward: f64,
    #[serde(flatten)]
    pub status: SessionStatus,
}

/// Answer of a valid `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepResponse {
    pub id: SessionId,
    pub observation: String,
    pub reward: f64,
    pub info: StepInfo,
    #[serde(flatten)]
    pub status: SessionStatus,
}

/// Answer of `GET /expert_action`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertActionResponse {
    pub action: Option<String>,
}

/// Answer of `POST /close`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloseResponse {
    pub id: SessionId,
    pub closed: bool,
}

/// Answer of `GET /health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthResponse {
    pub status: String,
    pub sessions: usize,
    pub max_sessions: usize,
    /// Task builds (and expert searches) running now, at most the server's
    /// `--max-builds`.
    #[serde(default)]
    pub builds_running: usize,
    /// Requests waiting for a build slot.
    #[serde(default)]
    pub builds_waiting: usize,
}

/// One entry of `GET /envs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvEntry {
    pub name: String,
    pub summary: String,
    pub difficulties: Vec<String>,
    pub default_max_turns: usize,
    /// The `params` keys a client may send with `create`; the server's
    /// operator sets the others (`agentrl serve --env-param`).
    #[serde(default)]
    pub request_params: Vec<String>,
}

/// What kind of error an error body reports, for programs to branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request body or query did not parse or has the wrong shape.
    BadRequest,
    Unauthorized,
    /// No such session, environment or route.
    NotFound,
    MethodNotAllowed,
    /// The request body is larger than the server accepts.
    PayloadTooLarge,
    /// The server holds its maximum number of sessions.
    Full,
    /// The server has no room for this task right now (its shared-data
    /// memory budget is held by open sessions); retry after `Retry-After`.
    Busy,
    /// The action text was rejected; the session is still usable and counted it.
    InvalidAction,
    /// The episode is over; reset first.
    EpisodeOver,
    /// The environment could not be created (bad difficulty, seed, params).
    InvalidSpec,
    /// A param only the server's operator may set (a file path, a cache
    /// directory) came in a request.
    ForbiddenParam,
    /// The request took longer than the server's request timeout.
    Timeout,
    /// A bug: an environment panicked.
    Internal,
}

/// Every error answer: `{"error": "...", "kind": "..."}` plus, for an invalid
/// action, the structured reason and the session's counters.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub kind: ErrorKind,
    pub action_error: Option<WireActionError>,
    pub status: Option<SessionStatus>,
}

/// One result of `POST /step_batch`: the step answer or the error body, with
/// the HTTP status the single `step` route would have answered.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchStepResult {
    pub code: u16,
    pub ok: Option<StepResponse>,
    pub err: Option<ErrorBody>,
}

/// [`ActionError`] in a form that crosses the wire, so the client rebuilds the
/// exact error the in-process environment returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WireActionError {
    Empty,
    TooLong { len: usize, max: usize },
    Unknown { action: String, expected: String },
    Malformed { action: String, reason: String },
    NotPossible { action: String, reason: String },
}

impl From<&ActionError> for WireActionError {
    fn from(e: &ActionError) -> Self {
        match e.clone() {
            ActionError::Empty => Self::Empty,
            ActionError::TooLong { len, max } => Self::TooLong { len, max },
            ActionError::Unknown { action, expected } => Self::Unknown { action, expected },
            ActionError::Malformed { action, reason } => Self::Malformed { action, reason },
            ActionError::NotPossible { action, reason } => Self::NotPossible { action, reason },
        }
    }
}

impl From<WireActionError> for ActionError {
    fn from(e: WireActionError) -> Self {
        match e {
            WireActionError::Empty => Self::Empty,
            WireActionError::TooLong { len, max } => Self::TooLong { len, max },
            WireActionError::Unknown { action, expected } => Self::Unknown { action, expected },
            WireActionError::Malformed { action, reason } => Self::Malformed { action, reason },
            WireActionError::NotPossible { action, reason } => Self::NotPossible { action, reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_errors_round_trip_through_json() {
        let all = [
            ActionError::Empty,
            ActionError::TooLong { len: 9, max: 4 },
            ActionError::Unknown {
                action: "jump".into(),
                expected: "up, down".into(),
            },
            ActionError::Malformed {
                action: "get x".into(),
                reason: "no count".into(),
            },
            ActionError::NotPossible {
                action: "open".into(),
                reason: "locked".into(),
            },
        ];
        for e in all {
            let json = serde_json::to_string(&WireActionError::from(&e)).unwrap();
            let back: WireActionError = serde_json::from_str(&json).unwrap();
            assert_eq!(ActionError::from(back), e);
        }
    }

    #[test]
    fn create_request_accepts_an_empty_object_and_rejects_unknown_fields() {
        let r: CreateRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(r, CreateRequest::default());
        assert!(serde_json::from_str::<CreateRequest>(r#"{"sed": 1}"#).is_err());
    }
}
