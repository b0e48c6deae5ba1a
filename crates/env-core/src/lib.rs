//! The environment contract shared by every agentrl environment.
//!
//! An environment is created from a [`TaskSpec`] and is fully determined by it:
//! the same spec gives the same task on every machine. Environments know
//! nothing about models; they speak text (observations, actions) only.
//!
//! Besides the contract, the pieces every environment shares: the episode
//! bookkeeping ([`Episode`]), the action-text checks ([`action`]), typed
//! `[env]` params ([`parse_params`]), the process-wide data cache
//! ([`SharedCache`]) under one memory budget ([`SHARED_DATA`]), and the
//! cooperative cancellation of long builds ([`BuildCancel`]).

pub mod action;
mod cache;
mod cancel;
mod debug_fields;
mod descriptor;
pub mod direction;
mod env;
mod episode;
mod error;
mod params;
mod seed;
mod spec;
#[cfg(feature = "testing")]
pub mod testing;

pub use cache::{MemoryBudget, Reservation, SharedCache, SHARED_DATA};
pub use cancel::{build_cancelled, BuildCancel};
pub use descriptor::{EnvDescriptor, EnvFactory, EnvParams};
pub use direction::{direction_names, parse_direction, Direction};
pub use env::{safe_or_valid, Env, Step, StepInfo};
pub use episode::{Episode, Outcome};
pub use error::{ActionError, EnvError, StepError};
pub use params::{param_error, param_in_range, parse_params, TaskConfig, MAX_STEPS_PARAM};
pub use seed::{chance_rng, stable_hash, stable_hash_words, task_rng, TaskRng};
pub use spec::{Split, TaskSpec, SPLIT_STRIDE};
