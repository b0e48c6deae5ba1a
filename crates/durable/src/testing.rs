//! Simulated crashes (feature `testing`, for dev-dependencies only): the
//! n-th write or append on this thread dies the way a kill -9 in the middle
//! of it would, leaving on disk exactly what the kill would leave (a
//! half-written temporary file, or part of an appended line), and returns an
//! error instead of the process dying. The caller stops at that error as it
//! would have stopped at the kill, so a test can then check that what is on
//! disk is still usable.

use std::cell::Cell;
use std::io;

use tempfile::NamedTempFile;

thread_local! {
    /// Writes left before the crash, counting the crashing one.
    static COUNTDOWN: Cell<Option<usize>> = const { Cell::new(None) };
    static FIRED: Cell<bool> = const { Cell::new(false) };
}

const MESSAGE: &str = "simulated crash (agentrl-durable testing)";

/// Crash at the `nth` (1-based) write or append made on this thread from now on.
pub fn crash_at(nth: usize) {
    COUNTDOWN.with(|c| c.set(Some(nth.max(1))));
    FIRED.with(|f| f.set(false));
}

/// Cancel the planned crash; true when it happened.
pub fn disarm() -> bool {
    COUNTDOWN.with(|c| c.set(None));
    FIRED.with(|f| f.replace(false))
}

/// Whether `e` is the error of a simulated crash.
pub fn is_simulated_crash(e: &dyn std::fmt::Display) -> bool {
    e.to_string().contains(MESSAGE)
}

/// Counts one write; true when it is the one to crash.
pub(crate) fn crash_here() -> bool {
    COUNTDOWN.with(|c| match c.get() {
        Some(1) => {
            c.set(None);
            FIRED.with(|f| f.set(true));
            true
        }
        Some(n) => {
            c.set(Some(n - 1));
            false
        }
        None => false,
    })
}

pub(crate) fn crash_error() -> io::Error {
    io::Error::other(MESSAGE)
}

/// Leave the temporary file behind holding the first half of what was
/// written, as a kill in the middle of writing it would.
pub(crate) fn crash_leaving_half(tmp: NamedTempFile) -> io::Result<()> {
    let len = tmp.as_file().metadata()?.len();
    tmp.as_file().set_len(len / 2)?;
    tmp.keep().map_err(|e| e.error)?;
    Err(crash_error())
}
