//! The integration tests of `server`, one module per area, in one test binary
//! (each binary links every dependency again: one instead of 3 keeps the
//! test build short).

mod agentgym_replay;
mod builds;
mod common;
mod hardening;
mod routes;
