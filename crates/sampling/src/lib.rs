//! What to sample and what was sampled, as plain data: the sampling
//! parameters of a generation call and the continuation it gives.
//!
//! The local model (`agentrl-model`) samples with these types and the
//! rollouts' `Policy` seam (`agentrl-rollout`) speaks them, so a rollout
//! needs no tensor library and the local model needs no conversion to serve
//! it.

pub mod steering;

pub use steering::{LogitAdjustment, Steering};

/// How to sample continuations.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Most tokens generated per sequence (the stop token counts).
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 means greedy (argmax, lowest id on ties).
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose
    /// probability (after temperature and top-k) reaches `top_p`; 1 = off.
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Generation of a sequence ends after it emits any of these ids.
    pub stop_tokens: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop_tokens: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of up to `max_new_tokens` that stops at no token.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks that these parameters can be sampled with.
    ///
    /// # Errors
    /// A temperature that is negative or not finite, or a `top_p` outside
    /// (0, 1], described.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

/// One generated continuation (the default: none yet).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generation {
    /// New token ids, including the stop token when one was generated.
    pub tokens: Vec<u32>,
    /// Per new token: its log-probability under the policy's own,
    /// untempered distribution (log-softmax of the raw logits, temperature 1,
    /// no top-k/top-p truncation) — the policy log-prob RL needs.
    pub logprobs: Vec<f32>,
    /// True when the sequence ended on a stop token (false: ran out of `max_new_tokens`).
    pub stopped: bool,
}

/// What a sequence of a continuously batched generation does once its
/// continuation has ended (see agentrl-rollout's `Policy::generate_continuous`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followup {
    /// Go on with this context: the whole sequence so far, which usually
    /// extends the one just generated (the dialogue with the next
    /// observation), sampled with the same params.
    Continue(Vec<u32>),
    /// The sequence is done; its place in the batch is free.
    Done,
    /// Stop the whole batch now (the caller has failed and says why itself).
    Abort,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_the_default_at_temperature_zero() {
        let g = SamplingParams::greedy(5);
        assert_eq!(
            g,
            SamplingParams {
                max_new_tokens: 5,
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                stop_tokens: Vec::new(),
            }
        );
        assert_eq!(g.validate(), Ok(()));
    }

    #[test]
    fn out_of_range_parameters_are_named() {
        let hot = SamplingParams {
            temperature: f64::NAN,
            ..SamplingParams::default()
        };
        assert!(hot.validate().unwrap_err().starts_with("temperature"));
        let p = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        };
        assert!(p.validate().unwrap_err().starts_with("top_p"));
    }
}
