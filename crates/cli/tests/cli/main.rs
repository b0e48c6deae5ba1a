//! The integration tests of `cli`, one module per area, in one test binary
//! (each binary links every dependency again: one instead of 12 keeps the
//! test build short).

mod agentgym_cli;
mod common;
mod config_checks_cli;
mod env_pool_cli;
mod envs_cli;
mod eval_matrix_cli;
mod generalisation_study_cli;
mod generate_cli;
mod learning;
mod lora_cli;
mod policy_cli;
mod remote_generation_cli;
mod serve_cli;
mod serve_hostile_cli;
mod train_resume;

/// The policy-client's loopback double (`policy_cli` and `remote_generation_cli`).
#[path = "../../../policy-client/tests/loopback/mod.rs"]
mod loopback;
