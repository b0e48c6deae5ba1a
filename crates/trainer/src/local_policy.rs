//! The local candle model as a rollout [`Policy`] (both speak the
//! plain-data sampling types of `agentrl-sampling`), and the keeper of each
//! dialogue's KV cache between turns.

use agentrl_model::{PolicyModel, SequenceCache};
use agentrl_rollout::{
    generate_in_lockstep, Followup, Generation, Generations, Policy, PolicyError, PromptBatch,
    SamplingParams,
};
use rand_chacha::ChaCha8Rng;

/// The local candle model as a policy.
///
/// With cache reuse on, the KV caches of one call's sequences are kept, and a
/// prompt of the next call that extends one of them (the same dialogue one
/// turn later) continues from it: only the tokens the turn added are
/// encoded. A cache holds keys of the weights it was filled with, so a
/// `LocalPolicy` must not outlive an optimizer step (the trainer makes a new
/// one for every rollout phase).
pub struct LocalPolicy<'a> {
    model: &'a PolicyModel,
    /// The previous call's caches; `None` when reuse is off.
    caches: Option<Vec<SequenceCache>>,
    /// Prompt tokens served from a kept cache, and encoded afresh, so far.
    reused: usize,
    encoded: usize,
}

impl<'a> LocalPolicy<'a> {
    /// `model` as a policy that reuses each dialogue's KV cache across turns.
    pub fn new(model: &'a PolicyModel) -> Self {
        Self {
            model,
            caches: Some(Vec::new()),
            reused: 0,
            encoded: 0,
        }
    }

    /// `model` as a policy that encodes every prompt from its first token
    /// (the reference the cached path is checked and benchmarked against).
    pub fn without_cache_reuse(model: &'a PolicyModel) -> Self {
        Self {
            model,
            caches: None,
            reused: 0,
            encoded: 0,
        }
    }

    /// Prompt tokens so far that came from a kept cache instead of being
    /// encoded, and those encoded. On the graph decoder (a GPU) these are
    /// what the caches could serve: its batch encodes every context's last
    /// n tokens, n the most any row leaves to encode, so a row may encode
    /// some of its cached tokens again.
    pub fn prompt_tokens(&self) -> PromptTokens {
        PromptTokens {
            reused: self.reused,
            encoded: self.encoded,
        }
    }

    /// `new` or `without_cache_reuse`, as `reuse` says.
    pub fn with_cache_reuse(model: &'a PolicyModel, reuse: bool) -> Self {
        match reuse {
            true => Self::new(model),
            false => Self::without_cache_reuse(model),
        }
    }
}

impl Policy for LocalPolicy<'_> {
    fn generate_batch(&mut self, batch: PromptBatch<'_>, rng: &mut ChaCha8Rng) -> Generations {
        let PromptBatch { prompts, params } = batch;
        let total: usize = prompts.iter().map(Vec::len).sum();
        let generated = match &mut self.caches {
            None => {
                self.encoded += total;
                self.model.generate(prompts, params, rng)
            }
            Some(pool) => {
                let mut caches =
                    pick_caches(std::mem::take(pool), prompts, || self.model.new_cache());
                let reused: usize = caches
                    .iter()
                    .zip(prompts)
                    .map(|(c, p)| c.reusable_for(p))
                    .sum();
                self.reused += reused;
                self.encoded += total - reused;
                let gens = self
                    .model
                    .generate_cached(&mut caches, prompts, params, rng);
                *pool = caches;
                gens
            }
        };
        generated.map_err(|e| PolicyError(e.to_string()))
    }

    /// Continuous batching on the host decoder (a model on the CPU), each
    /// dialogue's cache kept across its turns when reuse is on; lock-step
    /// elsewhere.
    fn generate_continuous(
        &mut self,
        prompts: Vec<Vec<u32>>,
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
        next: &mut dyn FnMut(usize, Generation) -> Followup,
    ) -> Result<(), PolicyError> {
        let model = self.model;
        if !model.batches_continuously() {
            return generate_in_lockstep(self, prompts, params, rng, next);
        }
        let keep_cache = self.caches.is_some();
        let mut caches = match &mut self.caches {
            Some(pool) => pick_caches(std::mem::take(pool), &prompts, || model.new_cache()),
            None => prompts.iter().map(|_| model.new_cache()).collect(),
        };
        let mut total: usize = prompts.iter().map(Vec::len).sum();
        let mut counted = |i: usize, gen: Generation| {
            let followup = next(i, gen);
            if let Followup::Continue(context) = &followup {
                total += context.len();
            }
            followup
        };
        let played =
            model.generate_continuous(&mut caches, &prompts, params, rng, keep_cache, &mut counted);
        if let Some(pool) = &mut self.caches {
            *pool = caches;
        }
        let reused = played.map_err(|e| PolicyError(e.to_string()))?;
        self.reused += reused;
        self.encoded += total - reused;
        Ok(())
    }
}

/// Where a policy's prompt tokens came from (see [`LocalPolicy::prompt_tokens`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptTokens {
    /// Served from a dialogue's kept KV cache.
    pub reused: usize,
    /// Encoded by the model.
    pub encoded: usize,
}

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One cache per prompt, in order: the unclaimed cache of `pool` sharing the
/// longest prefix with it (the earliest on a tie), or a fresh one from
/// `fresh` when none shares a token. A dialogue's own cache is a prefix of
/// its next prompt, so no other cache can beat it.
fn pick_caches(
    mut pool: Vec<SequenceCache>,
    prompts: &[Vec<u32>],
    fresh: impl Fn() -> SequenceCache,
) -> Vec<SequenceCache> {
    prompts
        .iter()
        .map(|p| {
            let best = pool
                .iter()
                .enumerate()
                .map(|(i, c)| (common_prefix(c.tokens(), p), i))
                .filter(|&(len, _)| len > 0)
                .min_by_key(|&(len, i)| (std::cmp::Reverse(len), i));
            match best {
                Some((_, i)) => pool.remove(i),
                None => fresh(),
            }
        })
        .collect()
}
