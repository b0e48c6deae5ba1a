//! The client side of agentrl's environment server: the JSON bodies of every
//! route ([`protocol`], shared with `agentrl-server`) and [`HttpEnv`], which
//! makes an environment living on a server (an agentrl server or an AgentGym
//! Python env server) look local behind the `Env` trait.
//!
//! This crate needs no web framework and no async runtime of its own, so a
//! trainer that plays remote environments does not link the server.

mod client;
pub mod protocol;

pub use client::{remote_env, ClientOptions, HttpEnv};
