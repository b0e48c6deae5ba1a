//! Cooperative cancellation of task building.
//!
//! Building a task can take seconds (a Sokoban room under extreme params, a
//! large catalog) on a thread that nothing can stop from outside. Whoever
//! builds on behalf of someone who may go away (the env server, for a client
//! that hangs up or times out) runs the build inside [`BuildCancel::run`];
//! generators call [`build_cancelled`] between units of work (a drawn room,
//! a batch of solver states) and give up with [`EnvError::Cancelled`] once it
//! is true. Outside `run` it is always false, so an env built in-process
//! (training, `agentrl play`) never sees a cancellation.
//!
//! The flag travels in a thread-local rather than through every factory's
//! signature: the [`EnvFactory`](crate::EnvFactory) contract stays one
//! function of a spec and params, and only the generators that can run long
//! need to look.
//!
//! [`EnvError::Cancelled`]: crate::EnvError::Cancelled

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    /// The flag of the build running on this thread, if any.
    static CURRENT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// A cancellation flag for one build; clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct BuildCancel {
    flag: Arc<AtomicBool>,
}

impl BuildCancel {
    /// A flag not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the build to stop at its next check.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    /// Whether [`BuildCancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Run `f` on this thread with this flag as the current build's: inside
    /// it, [`build_cancelled`] answers whether this flag was cancelled. The
    /// previous flag (a build inside a build) is restored afterwards, also
    /// when `f` panics.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Restore(Option<Arc<AtomicBool>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let previous = self.0.take();
                CURRENT.with(|c| *c.borrow_mut() = previous);
            }
        }
        let previous = CURRENT.with(|c| c.borrow_mut().replace(Arc::clone(&self.flag)));
        let _restore = Restore(previous);
        f()
    }
}

/// Whether the build running on this thread has been cancelled (false
/// outside [`BuildCancel::run`]). Cheap enough to call every few thousand
/// units of work.
pub fn build_cancelled() -> bool {
    CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_build_inside_run_sees_its_flag() {
        let cancel = BuildCancel::new();
        assert!(!build_cancelled());
        cancel.run(|| assert!(!build_cancelled()));
        cancel.cancel();
        assert!(cancel.run(build_cancelled));
        // Outside `run`, and on another thread, nothing is cancelled.
        assert!(!build_cancelled());
        let other = cancel.clone();
        std::thread::spawn(move || {
            assert!(other.is_cancelled());
            assert!(!build_cancelled());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_nested_build_restores_the_outer_flag_even_after_a_panic() {
        let outer = BuildCancel::new();
        let inner = BuildCancel::new();
        inner.cancel();
        outer.run(|| {
            assert!(inner.run(build_cancelled));
            assert!(!build_cancelled(), "the outer flag is back");
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                inner.run(|| panic!("boom"))
            }));
            assert!(caught.is_err());
            assert!(!build_cancelled(), "restored after the panic too");
            outer.cancel();
            assert!(build_cancelled());
        });
        assert!(!build_cancelled());
    }
}
