//! A server on its own tokio runtime, for synchronous callers (tests,
//! benches, a rollout that wants in-process HTTP).

use std::future::Future;
use std::time::Duration;

use tokio::runtime::Runtime;

/// A running server's handle `H` and the runtime it runs on. Stopping it
/// shuts the server down with the handle, then the runtime. Do not stop or
/// drop it inside an async context.
pub struct BackgroundRuntime<H> {
    handle: Option<H>,
    runtime: Option<Runtime>,
}

impl<H> BackgroundRuntime<H> {
    /// Build a multi-threaded runtime of `worker_threads` workers (at least
    /// one) named `thread_name`, and run `start` on it to get the handle.
    pub fn start<E, F>(
        worker_threads: usize,
        thread_name: &str,
        start: impl FnOnce() -> F,
    ) -> Result<Self, E>
    where
        E: From<std::io::Error>,
        F: Future<Output = Result<H, E>>,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .thread_name(thread_name)
            .enable_all()
            .build()?;
        let handle = runtime.block_on(start())?;
        Ok(Self {
            handle: Some(handle),
            runtime: Some(runtime),
        })
    }

    /// The handle, until stopped.
    pub fn handle(&self) -> Option<&H> {
        self.handle.as_ref()
    }

    /// Run `shutdown` on the handle to its end, then stop the runtime
    /// (waiting up to a second for its other tasks). `None` when already
    /// stopped.
    pub fn stop<T, F: Future<Output = T>>(&mut self, shutdown: impl FnOnce(H) -> F) -> Option<T> {
        let result = match (self.handle.take(), self.runtime.as_ref()) {
            (Some(h), Some(rt)) => Some(rt.block_on(shutdown(h))),
            _ => None,
        };
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        result
    }
}
