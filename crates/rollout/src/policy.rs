//! The seam between rollouts and models: anything that turns a batch of
//! prompts into sampled tokens with their log-probs.
//!
//! The types here are plain data (the sampling ones from `agentrl-sampling`,
//! which the model samples with too), so that rollouts need no tensor
//! library: the local candle model implements [`Policy`] in `agentrl-trainer`
//! (`LocalPolicy`); an OpenAI-compatible inference server (vLLM, SGLang, TGI)
//! can implement it the same way.

use rand_chacha::ChaCha8Rng;

pub use agentrl_sampling::{Followup, Generation, SamplingParams};

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

    /// Continuous batching: continues sequence `i` from `prompts[i]`, and
    /// when its continuation ends hands it to `next(i, generation)`, which
    /// says how the sequence goes on: with a new context (the dialogue with
    /// the next observation), done, or abort the batch. Returns when every
    /// sequence is done.
    ///
    /// The default plays lock-step, as [`generate_in_lockstep`]: a policy
    /// that can encode a new context while other sequences are still
    /// generating (the local model on the CPU) overrides it, so that no
    /// sequence waits for the slowest of a turn.
    fn generate_continuous(
        &mut self,
        prompts: Vec<Vec<u32>>,
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
        next: &mut dyn FnMut(usize, Generation) -> Followup,
    ) -> Result<(), PolicyError> {
        generate_in_lockstep(self, prompts, params, rng, next)
    }
}

/// [`Policy::generate_continuous`] in lock-step: one [`Policy::generate`]
/// over every sequence still going (in index order), then `next` for each
/// generation in that order, until every sequence is done.
pub fn generate_in_lockstep<P: Policy + ?Sized>(
    policy: &mut P,
    prompts: Vec<Vec<u32>>,
    params: &SamplingParams,
    rng: &mut ChaCha8Rng,
    next: &mut dyn FnMut(usize, Generation) -> Followup,
) -> Result<(), PolicyError> {
    let mut live: Vec<usize> = (0..prompts.len()).collect();
    let mut contexts = prompts;
    while !live.is_empty() {
        let gens = policy.generate(&contexts, params, rng)?;
        if gens.len() != contexts.len() {
            return Err(PolicyError(format!(
                "{} generations for {} prompts",
                gens.len(),
                contexts.len()
            )));
        }
        let (mut still, mut next_contexts) = (Vec::new(), Vec::new());
        for (&i, gen) in live.iter().zip(gens) {
            match next(i, gen) {
                Followup::Continue(context) => {
                    still.push(i);
                    next_contexts.push(context);
                }
                Followup::Done => {}
                Followup::Abort => return Ok(()),
            }
        }
        live = still;
        contexts = next_contexts;
    }
    Ok(())
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
