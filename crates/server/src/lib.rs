//! Environments over HTTP, speaking AgentGym's env-server protocol. The
//! wire types and the `HttpEnv` client live in `agentrl-env-client`.
//!
//! Every registered environment is served at the top level
//! (`POST /create {"env": "sokoban"}`, agentrl's typed API) and under
//! `/{env}/` (`POST /sokoban/create`), where a session created by an
//! AgentGym client speaks AgentGym's dialect of that env (see the
//! `agentgym` module), so that AgentGym's own client given the base URL
//! `http://host:port/babyai` works unchanged. Sessions have their own lock,
//! an idle TTL and a cap.
//!
//! In the typed API every bad input is a 4xx with a JSON body `{"error":
//! "...", "kind": "..."}`; `data_idx` is the seed index inside the chosen
//! split (default `train`): `data_idx = 7` is `TaskSpec { split: train,
//! seed: 7 }`. An invalid action text answers 400 with `kind =
//! "invalid_action"` and the structured reason; the session stays usable and
//! its invalid-action counter went up, exactly as in-process. `HttpEnv`
//! turns it back into `StepError::InvalidAction`.
//!
//! Limits: a request's `params` may hold only its env's `request_params`
//! (file paths and cache locations come from the operator's `env_params`);
//! connections are capped and must send a request head within the header
//! timeout; each request has a timeout; session ids are random. Task builds
//! run at most `max_builds` at a time and stop when their client hangs up
//! (`builds`); the data envs share (catalogs, corpora) stays within one
//! memory budget ([`agentrl_env_core::SHARED_DATA`]).

mod agentgym;
mod builds;
mod error;
mod openapi;
mod params;
mod routes;
mod server;
mod sessions;

pub use error::{ApiError, ServerError};
pub use server::{
    default_max_builds, registry_descriptors, select, serve_until, spawn, BackgroundServer,
    ServerConfig, ServerHandle, DEFAULT_PORT,
};
