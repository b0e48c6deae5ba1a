//! The local candle model as a rollout [`Policy`]: the adapter between the
//! rollout's plain-data sampling types and the model's own, and the keeper
//! of each dialogue's KV cache between turns.

use agentrl_model::{PolicyModel, SequenceCache};
use agentrl_rollout::{Generation, Generations, Policy, PolicyError, SamplingParams};
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
    /// encoded, and those encoded.
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
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Generations {
        let params = model_params(params);
        let total: usize = prompts.iter().map(Vec::len).sum();
        let gens = match &mut self.caches {
            None => {
                self.encoded += total;
                self.model.generate(prompts, &params, rng)
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
                    .generate_cached(&mut caches, prompts, &params, rng);
                *pool = caches;
                gens
            }
        }
        .map_err(|e| PolicyError(e.to_string()))?;
        Ok(gens.into_iter().map(rollout_generation).collect())
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

/// The rollout's sampling parameters as the model's.
fn model_params(p: &SamplingParams) -> agentrl_model::SamplingParams {
    agentrl_model::SamplingParams {
        max_new_tokens: p.max_new_tokens,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        stop_tokens: p.stop_tokens.clone(),
    }
}

/// The model's generation as the rollout's.
fn rollout_generation(g: agentrl_model::Generation) -> Generation {
    Generation {
        tokens: g.tokens,
        logprobs: g.logprobs,
        stopped: g.stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_params_convert_field_for_field() {
        let p = SamplingParams {
            max_new_tokens: 7,
            temperature: 0.5,
            top_p: 0.9,
            top_k: 3,
            stop_tokens: vec![2, 5],
        };
        let m = model_params(&p);
        assert_eq!(
            (
                m.max_new_tokens,
                m.temperature,
                m.top_p,
                m.top_k,
                m.stop_tokens
            ),
            (7, 0.5, 0.9, 3, vec![2, 5])
        );
        let g = rollout_generation(agentrl_model::Generation {
            tokens: vec![4, 2],
            logprobs: vec![-0.25, -1.5],
            stopped: true,
        });
        assert_eq!(
            g,
            Generation {
                tokens: vec![4, 2],
                logprobs: vec![-0.25, -1.5],
                stopped: true,
            }
        );
    }
}
