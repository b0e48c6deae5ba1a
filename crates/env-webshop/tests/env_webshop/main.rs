//! The integration tests of `env-webshop`, one module per area, in one test binary
//! (each binary links every dependency again: one instead of 3 keeps the
//! test build short).

mod bench;
mod reward_cases;
mod webshop;
