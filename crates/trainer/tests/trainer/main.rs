//! The integration tests of `trainer`, one module per area, in one test binary
//! (each binary links every dependency again: one instead of 7 keeps the
//! test build short).

mod cache_reuse_rollout;
mod common;
mod continuous_rollout;
mod crash_safety;
mod credit_assignment;
mod perception;
mod schedules;
mod sequence;
mod update_direction;
