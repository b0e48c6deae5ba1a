//! The policy model: a Qwen2/Llama-family transformer written in candle from
//! differentiable ops only (so every parameter gets a gradient), Hugging Face
//! checkpoint I/O, differentiable per-token log-probs, batched KV-cache
//! sampling, and an AdamW whose state can be saved for exact resume.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod optim;
pub mod policy;
pub mod qwen2;
pub mod sampling;

pub use config::{ModelConfig, RopeParameters};
pub use error::ModelError;
pub use optim::{clip_grad_norm, AdamW, AdamWConfig};
pub use policy::{PolicyModel, SequenceLogprobs};
pub use sampling::{Generation, SamplingParams};
pub mod chat_template;
pub mod tokenizer;
pub use chat_template::{ChatMessage, ChatTemplate, TemplateError};
pub use tokenizer::{ChatTokenizer, TokenizerError};
