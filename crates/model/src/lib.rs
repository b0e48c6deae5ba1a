//! The policy model: a Qwen2/Llama-family transformer written in candle from
//! differentiable ops only (so every parameter gets a gradient), Hugging Face
//! checkpoint I/O, differentiable per-token log-probs, batched KV-cache
//! sampling, and an AdamW whose state can be saved for exact resume. The
//! tokenizer and chat template are `agentrl-tokenizer`.

mod attention;
mod batch_cache;
pub mod bias;
#[cfg(feature = "openblas")]
mod blas;
mod block;
pub mod checkpoint;
pub mod config;
#[cfg(feature = "cuda")]
mod cuda;
pub mod decode;
pub mod device;
#[cfg(feature = "cuda")]
mod device_sampling;
mod embedding;
pub mod error;
mod fixed_step;
pub mod flash_attention;
#[cfg(target_arch = "x86_64")]
mod gemm_bf16;
pub mod gguf;
mod graph_decode;
mod head;
mod host;
mod kernels;
pub mod lora;
mod lora_layer;
#[cfg(feature = "cuda")]
mod multi_tensor;
pub mod ops;
pub mod optim;
pub mod policy;
pub mod precision;
mod projection;
pub mod qwen2;
pub mod sampling;
mod steer;
pub mod token_loss;

/// The tensor library, re-exported so callers need no direct dependency.
pub use candle_core;
/// candle's NN helpers (VarMap), re-exported for the same reason.
pub use candle_nn;

/// Per-sequence steering of a generation, re-exported for callers.
pub use agentrl_sampling::{steering, LogitAdjustment, Steering};
pub use config::{ModelConfig, RopeParameters, MAX_PARAMETERS, MAX_POSITIONS};
pub use decode::SequenceCache;
pub use device::{open_cuda, ProfiledRange};
pub use error::ModelError;
pub use lora::{LoraAdapter, LoraConfig, LoraTarget};
pub use optim::{add_grads, clip_grad_norm, AdamW, AdamWConfig};
pub use policy::{PolicyModel, SequenceLogprobs};
pub use precision::Precision;
pub use sampling::{Followup, Generation, SamplingParams};
pub use steer::PromptTokenLogprob;

/// Which library runs the large CPU matrix products: `gemm` (the crate), or
/// with the `openblas` feature `openblas (KERNEL)`, or `gemm (...)` saying
/// why OpenBLAS's kernel for this CPU was not used.
pub fn gemm_backend() -> String {
    #[cfg(feature = "openblas")]
    {
        let core = blas::core_name();
        if blas::vector_kernel() {
            format!("openblas ({core})")
        } else {
            format!("gemm (OpenBLAS picked its {core} kernel, not AVX2: set OPENBLAS_CORETYPE)")
        }
    }
    #[cfg(not(feature = "openblas"))]
    {
        "gemm".to_string()
    }
}
