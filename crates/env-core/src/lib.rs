//! The environment contract shared by every agentrl environment.
//!
//! An environment is created from a [`TaskSpec`] and is fully determined by it:
//! the same spec gives the same task on every machine. Environments know
//! nothing about models; they speak text (observations, actions) only.

mod descriptor;
mod env;
mod error;
mod seed;
mod spec;

pub use descriptor::{EnvDescriptor, EnvFactory, EnvParams};
pub use env::{Env, Step, StepInfo};
pub use error::{ActionError, EnvError, StepError};
pub use seed::{stable_hash, task_rng, TaskRng};
pub use spec::{Split, TaskSpec, SPLIT_STRIDE};
