//! `agentrl serve-policy`: a local model behind an OpenAI-compatible API,
//! so that rollouts and evaluation reach it exactly as they reach vLLM or
//! SGLang (`agentrl-policy-client`'s `OpenAiPolicy`), and small models are
//! served without Python.
//!
//! Routes: `GET /v1/models` and `/v1/models/{id}`; `POST /v1/completions`
//! (prompt as text, token ids, or a list of either; `max_tokens`,
//! `temperature`, `top_p`, `top_k`, `n`, `best_of`, `stop`, `stop_token_ids`,
//! `ignore_eos`, `seed`, `frequency_penalty`, `presence_penalty`,
//! `logit_bias`, `logprobs` 0–20 with `text_offset`, `echo`, vLLM's
//! `prompt_logprobs` and `return_token_ids`, `stream` with
//! `stream_options`); `POST /v1/chat/completions` (the checkpoint's chat
//! template, `tools` read back as `tool_calls`, `top_logprobs`,
//! `response_format: text`); `GET /health`. Log-probs are the model's
//! untempered ones (as vLLM's default `raw_logprobs`), whatever penalties
//! and biases steered the choice. Every bad request is a 400 in OpenAI's
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
pub mod options;
pub mod plan;
mod routes;
mod server;
mod stream;

pub use batcher::{
    BatchLimits, GenerateError, GenerateOutput, GenerateRequest, GenerationStats, Generator,
    SequenceOptions, SequenceOutput, StreamEvent,
};
pub use error::{ApiError, ServerError};
pub use server::{
    serve_until, spawn, BackgroundPolicyServer, PolicyServerConfig, PolicyServerHandle,
    ServedModel, DEFAULT_PORT,
};
