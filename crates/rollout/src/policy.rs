//! The seam between rollouts and models: anything that turns a batch of
//! prompts into sampled tokens with their log-probs.
//!
//! The types here are plain data (the sampling ones from `agentrl-sampling`,
//! which the model samples with too), so that rollouts need no tensor
//! library: the local candle model implements [`Policy`] in `agentrl-trainer`
//! (`LocalPolicy`); an OpenAI-compatible inference server (vLLM, SGLang, TGI)
//! can implement it the same way.

use rand_chacha::ChaCha8Rng;

pub use agentrl_sampling::{Generation, SamplingParams};

/// What [`Policy::generate`] answers: one continuation per prompt.
pub type Generations = Result<Vec<Generation>, PolicyError>;

/// A batch of token prompts to continue, every continuation sampled with the
/// same params.
#[derive(Debug, Clone, Copy)]
pub struct PromptBatch<'a> {
    /// The prompts, in order: one continuation each.
    pub prompts: &'a [Vec<u32>],
    /// How each continuation is sampled.
    pub params: &'a SamplingParams,
}

/// Generates continuations for a batch of token prompts.
pub trait Policy {
    /// One continuation per prompt of `batch`, with the log-prob of every
    /// sampled token.
    fn generate_batch(&mut self, batch: PromptBatch<'_>, rng: &mut ChaCha8Rng) -> Generations;

    /// [`Policy::generate_batch`] of `prompts`, each sampled with `params`.
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Generations {
        self.generate_batch(PromptBatch { prompts, params }, rng)
    }
}

/// A [`Policy`] made of a closure, for wrappers and scripted policies that
/// need no type of their own (as `tower::service_fn` makes a service).
pub struct PolicyFn<F>(F);

impl<F> PolicyFn<F>
where
    F: FnMut(&[Vec<u32>], &SamplingParams, &mut ChaCha8Rng) -> Generations,
{
    /// The policy that answers `generate` by calling `f`.
    pub fn new(f: F) -> Self {
        PolicyFn(f)
    }
}

impl<F> Policy for PolicyFn<F>
where
    F: FnMut(&[Vec<u32>], &SamplingParams, &mut ChaCha8Rng) -> Generations,
{
    fn generate_batch(&mut self, batch: PromptBatch<'_>, rng: &mut ChaCha8Rng) -> Generations {
        (self.0)(batch.prompts, batch.params, rng)
    }
}

/// A policy failed to generate.
#[derive(Debug, thiserror::Error)]
#[error("policy generation failed: {0}")]
pub struct PolicyError(pub String);
