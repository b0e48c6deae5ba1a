//! Environment work that may take seconds (building a task, the expert's
//! search) runs here: off the async workers, at most `max_builds` at a
//! time, and cancelled when its request goes away.
//!
//! A request's future is dropped when its client hangs up (hyper notices
//! the closed connection while the handler waits) or when the request
//! timeout fires. The work itself sits on a blocking thread that nothing can
//! stop from outside, so the future carries a guard that, when dropped,
//! cancels the work's [`BuildCancel`] flag; generators look at the flag
//! between units of work ([`agentrl_env_core::build_cancelled`]) and stop.
//! A request still waiting for a slot just leaves the queue.
//!
//! The slot is held by the blocking work, not by the request: a cancelled
//! build keeps its slot until it has really stopped, so no more than
//! `max_builds` builds ever hold memory at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use agentrl_env_core::BuildCancel;
use tokio::sync::Semaphore;

use crate::error::ApiError;

/// The build slots of one server.
pub(crate) struct Builds {
    slots: Arc<Semaphore>,
    max: usize,
    waiting: AtomicUsize,
}

/// Cancels its flag when dropped: with the request's future, or after the
/// work finished (when cancelling changes nothing).
struct CancelOnDrop(BuildCancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Counts a request as waiting while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Builds {
    /// At most `max` (≥ 1) builds at a time.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            waiting: AtomicUsize::new(0),
        }
    }

    /// Builds running now.
    pub(crate) fn running(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// Requests waiting for a slot now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Run `work` on the blocking pool once a slot is free, with a
    /// cancellation flag that dropping this future sets.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let slot = {
            let _waiting = Waiting::new(&self.waiting);
            Arc::clone(&self.slots)
                .acquire_owned()
                .await
                .map_err(|_| ApiError::internal("the build slots are closed"))?
        };
        let cancel = BuildCancel::new();
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let out = cancel.run(work);
            if cancel.is_cancelled() {
                tracing::debug!("a build finished after its request went away");
            }
            out
        })
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "environment task failed");
            ApiError::internal(format!("internal error (an environment panicked): {e}"))
        })
    }
}
