//! Errors: [`ApiError`] is what a route answers, in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}`; [`ServerError`] is
//! what starting the server can fail with.

use agentrl_policy_client::protocol::{ErrorDetail, ErrorResponse};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answer: a status and OpenAI's error body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// Boxed: errors travel in every handler's `Result`; keep that small.
    pub body: Box<ErrorResponse>,
}

impl ApiError {
    /// An error of OpenAI's `type` with an optional offending field and code.
    pub fn new(
        status: StatusCode,
        kind: &str,
        message: impl Into<String>,
        param: Option<&str>,
        code: Option<&str>,
    ) -> Self {
        Self {
            status,
            body: Box::new(ErrorResponse {
                error: ErrorDetail {
                    message: message.into(),
                    kind: kind.to_string(),
                    param: param.map(str::to_string),
                    code: code.map(str::to_string),
                },
            }),
        }
    }

    /// 400: the request field `param` is wrong.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message,
            Some(param),
            None,
        )
    }

    /// 400 about the request as a whole (not JSON, …).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message,
            None,
            None,
        )
    }

    /// 404: the request names a model this server does not serve.
    pub fn unknown_model(name: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{name}` does not exist (served: {served})"),
            Some("model"),
            Some("model_not_found"),
        )
    }

    /// 503: the queue of requests waiting for the model is full.
    pub fn busy(queued: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("the server already has {queued} requests waiting for the model; retry later"),
            None,
            Some("overloaded"),
        )
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            message,
            None,
            None,
        )
    }
}

/// The shared layers' errors ([`agentrl_connections::harden`]) in OpenAI's shape.
impl agentrl_connections::LayerErrors for ApiError {
    fn timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            agentrl_connections::hardening::timeout_message(limit),
            None,
            Some("timeout"),
        )
    }

    fn internal(message: String) -> Self {
        ApiError::internal(message)
    }

    fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or wrong API key (send 'Authorization: Bearer <key>')",
            None,
            Some("invalid_api_key"),
        )
    }

    fn from_status(status: StatusCode, message: String) -> Self {
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        ApiError::new(status, kind, message, None, None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(*self.body)).into_response()
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid server config: {0}")]
    Config(String),
    #[error(transparent)]
    Bind(#[from] agentrl_connections::BindError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
