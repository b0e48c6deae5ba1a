//! Accepting and serving connections, with the limits `axum::serve` lacks:
//! a cap on open connections and hyper's header-read timeout, shared by the
//! env server (`agentrl serve`) and the policy server (`agentrl
//! serve-policy`). Each server's app and its per-request timeout stay its own.
//!
//! At the cap, a new client waits until a slot frees up. To free one, the
//! connection idle the longest (no request in flight for at least
//! [`EVICT_IDLE_AFTER`]; one that never sent a whole request counts as idle
//! since it opened) is closed, the way nginx reuses idle keep-alive
//! connections: idle pooled connections and slowloris clients never lock new
//! clients out, busy ones are never cut, and at most `max_connections + 1`
//! client sockets are open at any time.
//!
//! Both servers also share the layers around their routes ([`hardening`])
//! and the runtime of a server started from synchronous code
//! ([`background`]).

pub mod background;
pub mod hardening;

pub use background::BackgroundRuntime;
pub use hardening::{harden, Hardening, LayerErrors};

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::convert::Infallible;

use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// How connections are accepted and kept.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// A connection must deliver a whole request head within this time of
    /// opening or of its previous response, else it is closed: this ends
    /// slowloris clients and idle keep-alive connections alike.
    pub header_timeout: Duration,
}

/// How long a connection must have had no request in flight before it may
/// be closed to make room: a client is unlikely to be reusing a connection
/// at the very moment it is closed after a second of silence (the HTTP/1.1
/// keep-alive race), while one used a moment ago is likely in use again.
pub const EVICT_IDLE_AFTER: Duration = Duration::from_secs(1);

/// How often a client waiting at the cap looks for a connection to close.
const LOOK_AGAIN_AFTER: Duration = Duration::from_millis(20);

/// What the acceptor knows of one open connection.
struct OpenConnection {
    activity: Arc<Activity>,
    /// Sending (or dropping) it asks the connection to close once idle.
    close: oneshot::Sender<()>,
}

/// Requests in flight on a connection and when its last one ended.
struct Activity {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` at which the connection last became idle.
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(epoch.elapsed().as_millis() as u64),
        }
    }

    /// How long the connection has been idle, or `None` while it is busy.
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.epoch.elapsed().saturating_sub(since))
    }

    /// Marks a request in flight until the returned guard drops (answered,
    /// or dropped with its connection).
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }
}

struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.idle_since_ms
            .store(a.epoch.elapsed().as_millis() as u64, Ordering::Release);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A listening socket could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind {addr}: {source}")]
pub struct BindError {
    pub addr: std::net::SocketAddr,
    pub source: std::io::Error,
}

/// Open a listening socket on `addr`; a failure names the address.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serve `app` on `listener` until `signal`, then stop accepting, let open
/// connections finish their requests, and return.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    signal: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let epoch = Instant::now();
    let mut open: Vec<OpenConnection> = Vec::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(signal);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => tokio::select! {
                slot = make_room(&slots, &mut open) => slot,
                () = &mut signal => break,
            },
        };
        // Forget connections that ended (their receiver is gone).
        open.retain(|c| !c.close.is_closed());
        let activity = Arc::new(Activity::new(epoch));
        let (close, close_asked) = oneshot::channel();
        open.push(OpenConnection {
            activity: Arc::clone(&activity),
            close,
        });
        tokio::spawn(serve_one(
            http.clone(),
            stream,
            app.clone(),
            activity,
            close_asked,
            slot,
        ));
        tracing::trace!(%peer, "connection accepted");
    }
    drop(listener);
    // Dropping the senders asks every connection to close once idle; all
    // slots back means all closed.
    drop(open);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _all_closed = slots.acquire_many(all).await;
}

/// Serve one connection until it ends, closing it once idle when asked.
async fn serve_one(
    http: http1::Builder,
    stream: TcpStream,
    app: Router,
    activity: Arc<Activity>,
    mut close_asked: oneshot::Receiver<()>,
    slot: OwnedSemaphorePermit,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let tracked = ServiceExt::<Request<Incoming>>::map_future(app, move |answer| {
        let in_flight = activity.begin();
        async move {
            let answer: Result<Response, Infallible> = answer.await;
            drop(in_flight);
            answer
        }
    });
    let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(tracked));
    tokio::pin!(conn);
    let mut asked = false;
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    // Timeouts and resets by the client end here.
                    tracing::debug!(error = %e, "connection closed with an error");
                }
                break;
            }
            // Asked or shut down (the sender dropped): the same for us.
            _ = &mut close_asked, if !asked => {
                asked = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    drop(slot);
}

/// At the cap: close the connection idle the longest, once one has been
/// idle for [`EVICT_IDLE_AFTER`], and wait for its slot; look again every
/// [`LOOK_AGAIN_AFTER`] meanwhile (a connection may also close by itself).
async fn make_room(slots: &Arc<Semaphore>, open: &mut Vec<OpenConnection>) -> OwnedSemaphorePermit {
    loop {
        let idlest = open
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.close.is_closed())
            .filter_map(|(i, c)| Some((i, c.activity.idle_for()?)))
            .filter(|(_, idle)| *idle >= EVICT_IDLE_AFTER)
            .max_by_key(|(_, idle)| *idle);
        if let Some((i, _)) = idlest {
            // Fails only if the connection ended meanwhile: a slot is free.
            let _ = open.swap_remove(i).close.send(());
        }
        if let Ok(Ok(slot)) =
            tokio::time::timeout(LOOK_AGAIN_AFTER, Arc::clone(slots).acquire_owned()).await
        {
            return slot;
        }
    }
}

/// Per-connection errors (the client gave up before the accept) are
/// ignored; others (out of descriptors) are logged and the loop pauses, so
/// that it does not spin while nothing can be accepted.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept failed; pausing for 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The message of a handler's panic payload (`String` or `&str`), for the
/// 500 both servers answer instead of dropping the connection.
pub fn panic_message(err: &(dyn std::any::Any + Send)) -> String {
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Re-answer a non-JSON error (axum's 405, tower-http's 413, …) in a
/// server's own JSON error shape: `rebuild` gets the status and the original
/// body's text (the status's reason when empty); headers such as `Allow`
/// and `WWW-Authenticate` are kept. Other answers pass through.
pub async fn json_error_answer(
    resp: Response,
    rebuild: impl FnOnce(axum::http::StatusCode, String) -> Response,
) -> Response {
    use axum::http::header;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_lowercase()
    } else {
        text
    };
    let mut out = rebuild(status, message);
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}
