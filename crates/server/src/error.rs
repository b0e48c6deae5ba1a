//! Errors: [`ApiError`] is what a route answers (always a JSON body, always a
//! 4xx except for an environment bug); [`ServerError`] is what starting the
//! server can fail with.

use agentrl_env_core::{EnvError, StepError};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use thiserror::Error;

use agentrl_env_client::protocol::{
    ErrorBody, ErrorKind, SessionId, SessionStatus, WireActionError,
};

/// An error answer: an HTTP status and the JSON body `{"error", "kind", …}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// Boxed: errors travel in every handler's `Result`; keep that small.
    pub body: Box<ErrorBody>,
}

impl ApiError {
    /// An error with a status, a kind and a message.
    pub fn new(status: StatusCode, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            status,
            body: Box::new(ErrorBody {
                error: message.into(),
                kind,
                action_error: None,
                status: None,
            }),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorKind::BadRequest, message)
    }

    pub(crate) fn unknown_session(id: SessionId) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorKind::NotFound,
            format!("unknown session id {id} (closed, expired or never created)"),
        )
    }

    pub(crate) fn unknown_env(name: &str, available: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorKind::NotFound,
            format!("unknown environment '{name}' (served: {available})"),
        )
    }

    pub(crate) fn full(max: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Full,
            format!(
                "the server holds its maximum of {max} sessions; close sessions or retry later"
            ),
        )
    }

    /// A param only the operator may set came in a request.
    pub(crate) fn forbidden_param(env: &str, key: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            ErrorKind::ForbiddenParam,
            format!(
                "parameter '{key}' of {env} may not come from a request: it names a file or \
                 directory on the server; the server's operator sets it with \
                 `agentrl serve --env-param {env}.{key}=VALUE`"
            ),
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Internal,
            message,
        )
    }

    /// A rejected step, carrying the session's counters after it.
    pub(crate) fn from_step(err: &StepError, status: SessionStatus) -> Self {
        let mut e = match err {
            StepError::InvalidAction(a) => {
                let mut e = Self::new(
                    StatusCode::BAD_REQUEST,
                    ErrorKind::InvalidAction,
                    err.to_string(),
                );
                e.body.action_error = Some(WireActionError::from(a));
                e
            }
            StepError::EpisodeOver => Self::new(
                StatusCode::CONFLICT,
                ErrorKind::EpisodeOver,
                err.to_string(),
            ),
        };
        e.body.status = Some(status);
        e
    }
}

impl From<EnvError> for ApiError {
    fn from(e: EnvError) -> Self {
        match e {
            EnvError::UnknownEnv { .. } => {
                Self::new(StatusCode::NOT_FOUND, ErrorKind::NotFound, e.to_string())
            }
            // Not the request's fault: the same request may succeed later.
            EnvError::Busy { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Busy,
                e.to_string(),
            ),
            // Only answered when nobody waits for the answer any more (the
            // client left or the request timed out): what a timeout says.
            EnvError::Cancelled { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Timeout,
                e.to_string(),
            ),
            // Params, data and generation failures all come from what the
            // request asked for.
            _ => Self::new(
                StatusCode::BAD_REQUEST,
                ErrorKind::InvalidSpec,
                e.to_string(),
            ),
        }
    }
}

/// The shared layers' errors ([`agentrl_connections::harden`]) in the
/// `{"error", "kind"}` shape the routes answer.
impl agentrl_connections::LayerErrors for ApiError {
    fn timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Timeout,
            agentrl_connections::hardening::timeout_message(limit),
        )
    }

    fn internal(message: String) -> Self {
        ApiError::internal(message)
    }

    fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorKind::Unauthorized,
            "missing or wrong bearer token (send 'Authorization: Bearer <token>')",
        )
    }

    fn from_status(status: StatusCode, message: String) -> Self {
        let kind = match status {
            StatusCode::NOT_FOUND => ErrorKind::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ErrorKind::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::PayloadTooLarge,
            StatusCode::UNAUTHORIZED => ErrorKind::Unauthorized,
            s if s.is_server_error() => ErrorKind::Internal,
            _ => ErrorKind::BadRequest,
        };
        Self::new(status, kind, message)
    }

    /// A handler panics only inside an environment.
    fn panicked(message: &str) -> Self {
        ApiError::internal(format!(
            "internal error (an environment panicked): {message}"
        ))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(*self.body)).into_response();
        match self.status {
            StatusCode::UNAUTHORIZED => {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServerError {
    #[error(transparent)]
    Bind(#[from] agentrl_connections::BindError),
    #[error("unknown environment '{name}' in --envs (available: {available})")]
    UnknownEnv { name: String, available: String },
    #[error("no environment to serve")]
    NoEnvs,
    #[error("invalid server configuration: {0}")]
    Config(String),
    #[error("--env-param: {0}")]
    EnvParam(String),
    #[error("server i/o error: {0}")]
    Io(#[from] std::io::Error),
}
