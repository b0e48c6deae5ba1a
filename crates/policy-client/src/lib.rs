//! A rollout `Policy` whose model is served by an OpenAI-compatible
//! inference server: vLLM, SGLang, or `agentrl serve-policy`.
//!
//! - [`protocol`]: the wire types of `/v1/completions`,
//!   `/v1/chat/completions`, `/v1/models`, `/v1/load_lora_adapter` and the
//!   error body (the policy server answers with the same types);
//! - [`client`]: [`OpenAiPolicy`], token-id prompts in, token ids and
//!   log-probs out, with bounded concurrency and retries; LoRA adapters
//!   hot-loaded onto the server between RL updates.

pub mod client;
pub mod protocol;

pub use client::{OpenAiError, OpenAiOptions, OpenAiPolicy, MAX_BACKOFF};
