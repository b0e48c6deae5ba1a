//! The seam between rollouts and models: anything that turns a batch of
//! prompts into sampled tokens with their log-probs.
//!
//! A local candle model implements it here; an OpenAI-compatible inference
//! server (vLLM, SGLang, TGI) can implement it the same way.

use agentrl_model::{Generation, PolicyModel, SamplingParams};
use rand_chacha::ChaCha8Rng;

/// Generates continuations for a batch of token prompts.
pub trait Policy {
    /// One continuation per prompt, with the log-prob of every sampled token.
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Generation>, PolicyError>;
}

/// A policy failed to generate.
#[derive(Debug, thiserror::Error)]
#[error("policy generation failed: {0}")]
pub struct PolicyError(pub String);

/// The local candle model as a policy.
pub struct LocalPolicy<'a> {
    pub model: &'a PolicyModel,
}

impl Policy for LocalPolicy<'_> {
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Generation>, PolicyError> {
        self.model
            .generate(prompts, params, rng)
            .map_err(|e| PolicyError(e.to_string()))
    }
}
