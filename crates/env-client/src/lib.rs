//! The client side of agentrl's environment server: the JSON bodies of every
//! route ([`protocol`], shared with `agentrl-server`) and [`HttpEnv`], which
//! makes an environment living on an agentrl server look local behind the
//! `Env` trait, and [`AgentGymEnv`], the same for AgentGym's Python env
//! servers in their own dialect, and [`EndpointPool`], which spreads sessions
//! over several servers and moves an episode off a server that stops answering.
//!
//! This crate needs no web framework and no async runtime of its own, so a
//! trainer that plays remote environments does not link the server.

mod agentgym;
mod client;
mod pool;
pub mod protocol;
mod remote;

pub use agentgym::{
    check_invalid_action_pattern, default_invalid_action_patterns, AgentGymEnv, AgentGymOptions,
    DataIdxRanges,
};
pub use client::{remote_env, ClientOptions, HttpEnv};
pub use pool::{EndpointPool, PooledEnv};
