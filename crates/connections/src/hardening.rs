//! The layers both servers put around their routes: bearer auth, a request
//! timeout, one body limit, panics answered as 500s, and every error answer
//! in the server's own JSON shape. What each error says stays the server's
//! ([`LayerErrors`]); the stack and its order are shared.

use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::timeout::error::Elapsed;
use tower::timeout::TimeoutLayer;
use tower::{BoxError, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;

use crate::{json_error_answer, panic_message};

/// The error answers of a server's layers, in that server's JSON shape.
pub trait LayerErrors: IntoResponse + Sized + Send + 'static {
    /// 503: the request ran past the request timeout `limit`.
    fn timeout(limit: Duration) -> Self;
    /// 500: the server failed.
    fn internal(message: String) -> Self;
    /// 401: the bearer token is missing or wrong.
    fn unauthorized() -> Self;
    /// A non-JSON error answer (axum's 405, tower-http's 413, …) with its
    /// status and text, re-answered in the server's shape.
    fn from_status(status: StatusCode, message: String) -> Self;
    /// 500: a handler panicked with `message`.
    fn panicked(message: &str) -> Self {
        Self::internal(format!("internal error: {message}"))
    }
}

/// What a [`LayerErrors::timeout`] answer says.
pub fn timeout_message(limit: Duration) -> String {
    format!(
        "the request took longer than the server's request timeout ({:.1} s)",
        limit.as_secs_f64()
    )
}

/// What the layers enforce.
#[derive(Debug, Clone)]
pub struct Hardening {
    /// Largest accepted request body in bytes; larger bodies get 413.
    pub body_limit: usize,
    /// Time one request may take; beyond it the client hears 503 at once.
    pub request_timeout: Duration,
    /// When set, every route but `/health` needs `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
}

/// `routes` inside auth, request timeout, body limit, panic and JSON-error
/// layers, answering their errors as `E`.
///
/// The timeout drops the request's future: work already handed to another
/// thread runs to its end, and its answer is dropped.
pub fn harden<E: LayerErrors>(routes: Router, hardening: Hardening) -> Router {
    let Hardening {
        body_limit,
        request_timeout,
        bearer_token,
    } = hardening;
    let timeout = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(move |e: BoxError| async move {
            if e.is::<Elapsed>() {
                E::timeout(request_timeout)
            } else {
                E::internal(format!("internal error: {e}"))
            }
        }))
        .layer(TimeoutLayer::new(request_timeout));
    let token: Option<Arc<str>> = bearer_token.map(Arc::from);
    routes
        .layer(middleware::from_fn_with_state(token, bearer_auth::<E>))
        .layer(timeout)
        // One configurable body limit: tower-http's; axum's own 2 MB default is off.
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(body_limit))
        .layer(CatchPanicLayer::custom(panic_answer::<E>))
        .layer(middleware::map_response(json_errors::<E>))
}

async fn bearer_auth<E: LayerErrors>(
    axum::extract::State(token): axum::extract::State<Option<Arc<str>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = token else {
        return next.run(req).await;
    };
    // Liveness probes stay open.
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        next.run(req).await
    } else {
        E::unauthorized().into_response()
    }
}

/// Compares without an early exit, so timing does not reveal a token prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn panic_answer<E: LayerErrors>(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let msg = panic_message(err.as_ref());
    tracing::error!(panic = %msg, "a request handler panicked");
    E::panicked(&msg).into_response()
}

async fn json_errors<E: LayerErrors>(resp: Response) -> Response {
    json_error_answer(resp, |status, message| {
        E::from_status(status, message).into_response()
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"ab", b"abc"));
    }
}
