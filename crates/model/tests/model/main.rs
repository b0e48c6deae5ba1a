//! The integration tests of `model`, one module per area, in one test binary
//! (each binary links every dependency again: one instead of 7 keeps the
//! test build short).

mod cache_reuse;
mod causal_softmax;
mod checkpoint;
mod checkpointing;
mod continuous;
mod device;
mod finite_difference;
mod fixture;
mod flash_attention;
mod generation;
mod gguf;
mod gguf_writer;
mod gradients;
mod infer_tracks_updates;
mod lora;
mod norm_and_mlp;
mod precision;
mod qwen2_tiny;
mod token_loss;
mod top_layers;
