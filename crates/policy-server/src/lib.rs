//! `agentrl serve-policy`: a local model behind an OpenAI-compatible API,
//! so that rollouts and evaluation reach it exactly as they reach vLLM or
//! SGLang (`agentrl-policy-client`'s `OpenAiPolicy`), and small models are
//! served without Python.
//!
//! Routes: `GET /v1/models`; `POST /v1/completions` (prompt as text, token
//! ids, or a list of either; `max_tokens`, `temperature`, `top_p`, `top_k`,
//! `n`, `stop`, `stop_token_ids`, `ignore_eos`, `seed`, `logprobs: 0`, vLLM's
//! `return_token_ids`); `POST /v1/chat/completions` (the checkpoint's chat
//! template); `GET /health`. Log-probs are the model's untempered ones (as
//! vLLM's default `raw_logprobs`). Every bad request is a 400 in OpenAI's
//! error shape naming the field.
//!
//! The model runs on its own thread ([`batcher`]): requests waiting for it
//! are generated together, each sequence from its own random stream, so a
//! seeded request makes the same draws whatever it was batched with (its
//! log-probs equal up to the float rounding of the batch's shape).

pub mod answer;
pub mod batcher;
pub mod bounds;
mod error;
pub mod plan;
mod routes;
mod server;

pub use batcher::{BatchLimits, GenerateError, Generator};
pub use error::{ApiError, ServerError};
pub use server::{
    serve_until, spawn, BackgroundPolicyServer, PolicyServerConfig, PolicyServerHandle,
    ServedModel, DEFAULT_PORT,
};
