//! The seam between rollouts and models: anything that turns a batch of
//! prompts into sampled tokens with their log-probs.
//!
//! The types here are plain data, so that rollouts need no tensor library:
//! the local candle model implements [`Policy`] in `agentrl-trainer`
//! (`LocalPolicy`); an OpenAI-compatible inference server (vLLM, SGLang, TGI)
//! can implement it the same way.

use rand_chacha::ChaCha8Rng;

/// How to sample continuations (the model's own sampling parameters, as data).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Most tokens generated per sequence (the stop token counts).
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 means greedy.
    pub temperature: f64,
    /// Nucleus sampling threshold; 1 = off.
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Generation of a sequence ends after it emits any of these ids.
    pub stop_tokens: Vec<u32>,
}

impl SamplingParams {
    /// Greedy decoding of up to `max_new_tokens` that stops at no token.
    pub fn greedy(max_new_tokens: usize) -> Self {
        SamplingParams {
            max_new_tokens,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            stop_tokens: Vec::new(),
        }
    }
}

/// One generated continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// New token ids, including the stop token when one was generated.
    pub tokens: Vec<u32>,
    /// Per new token: its log-probability under the policy's untempered
    /// distribution.
    pub logprobs: Vec<f32>,
    /// True when the sequence ended on a stop token.
    pub stopped: bool,
}

/// What [`Policy::generate`] answers: one continuation per prompt.
pub type Generations = Result<Vec<Generation>, PolicyError>;

/// Generates continuations for a batch of token prompts.
pub trait Policy {
    /// One continuation per prompt, with the log-prob of every sampled token.
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Generations;
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
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Generations {
        (self.0)(prompts, params, rng)
    }
}

/// A policy failed to generate.
#[derive(Debug, thiserror::Error)]
#[error("policy generation failed: {0}")]
pub struct PolicyError(pub String);
