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

    /// 401: the bearer key is missing or wrong.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or wrong API key (send 'Authorization: Bearer <key>')",
            None,
            Some("invalid_api_key"),
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

    /// 503: the request ran past the server's request timeout.
    pub fn timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!(
                "the request took longer than the server's request timeout ({:.1} s)",
                limit.as_secs_f64()
            ),
            None,
            Some("timeout"),
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
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
