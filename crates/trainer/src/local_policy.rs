//! The local candle model as a rollout [`Policy`]: the adapter between the
//! rollout's plain-data sampling types and the model's own.

use agentrl_model::PolicyModel;
use agentrl_rollout::{Generation, Policy, PolicyError, SamplingParams};
use rand_chacha::ChaCha8Rng;

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
        let gens = self
            .model
            .generate(prompts, &model_params(params), rng)
            .map_err(|e| PolicyError(e.to_string()))?;
        Ok(gens.into_iter().map(rollout_generation).collect())
    }
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
