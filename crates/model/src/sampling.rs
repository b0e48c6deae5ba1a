//! Sampling parameters, results and the per-row token choice (host side).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::ModelError;

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
    /// Greedy decoding of up to `max_new_tokens`.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ModelError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ModelError::InvalidInput(format!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ModelError::InvalidInput(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// One generated continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// New token ids, including the stop token when one was generated.
    pub tokens: Vec<u32>,
    /// Per new token: its log-probability under the model's own,
    /// untempered distribution (log-softmax of the raw logits, temperature 1,
    /// no top-k/top-p truncation) — the policy log-prob RL needs.
    pub logprobs: Vec<f32>,
    /// True when the sequence ended on a stop token (false: ran out of `max_new_tokens`).
    pub stopped: bool,
}

/// Picks the next token from one row of raw logits; returns it with its
/// untempered log-probability `log_softmax(logits)[token]`.
pub(crate) fn sample_row(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut ChaCha8Rng,
) -> (u32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64
        + logits
            .iter()
            .map(|&x| ((x - max) as f64).exp())
            .sum::<f64>()
            .ln();
    let token = if params.temperature == 0.0 {
        argmax(logits)
    } else {
        sample_tempered(logits, params, rng)
    };
    let lp = (logits[token] as f64 - lse) as f32;
    (token as u32, lp)
}

/// Index of the largest logit (the lowest index among equal maxima).
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

fn sample_tempered(logits: &[f32], params: &SamplingParams, rng: &mut ChaCha8Rng) -> usize {
    let inv_t = 1.0 / params.temperature;
    // Candidates sorted by logit, descending; ties by id so the order is the same everywhere.
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if params.top_k > 0 && params.top_k < idx.len() {
        idx.truncate(params.top_k);
    }
    let top = logits[idx[0]] as f64 * inv_t;
    let mut probs: Vec<f64> = idx
        .iter()
        .map(|&i| (logits[i] as f64 * inv_t - top).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    for p in probs.iter_mut() {
        *p /= total;
    }
    if params.top_p < 1.0 {
        let mut cum = 0.0;
        let mut keep = probs.len();
        for (n, p) in probs.iter().enumerate() {
            cum += p;
            if cum >= params.top_p {
                keep = n + 1;
                break;
            }
        }
        probs.truncate(keep);
        idx.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (n, p) in probs.iter().enumerate() {
        if u < *p {
            return idx[n];
        }
        u -= p;
    }
    // Rounding can leave u a hair above the last bucket.
    idx[idx.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn greedy_picks_lowest_id_among_ties() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let (t, _) = sample_row(&[0.0, 2.0, 2.0, 1.0], &SamplingParams::greedy(1), &mut rng);
        assert_eq!(t, 1);
    }

    #[test]
    fn logprob_is_untempered_log_softmax() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let logits = [1.0f32, 2.0, 3.0];
        let p = SamplingParams {
            temperature: 0.3,
            ..SamplingParams::default()
        };
        let (t, lp) = sample_row(&logits, &p, &mut rng);
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((lp as f64 - (logits[t as usize] as f64 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            ..SamplingParams::default()
        };
        for _ in 0..20 {
            assert_eq!(sample_row(&[0.1, 0.5, 0.2], &p, &mut rng).0, 1);
        }
    }

    #[test]
    fn top_p_excludes_tail_tokens() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        // probs ≈ [0.665, 0.245, 0.090]: top_p 0.8 keeps ids 0 and 1 only.
        let logits = [2.0f32, 1.0, 0.0];
        let p = SamplingParams {
            top_p: 0.8,
            ..SamplingParams::default()
        };
        let mut seen = [0usize; 3];
        for _ in 0..400 {
            seen[sample_row(&logits, &p, &mut rng).0 as usize] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > 0 && seen[1] > 0);
    }

    #[test]
    fn sampling_frequencies_follow_softmax() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let p = SamplingParams::default();
        let n = 4000;
        let ones = (0..n)
            .filter(|_| sample_row(&logits, &p, &mut rng).0 == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.03, "{frac}");
    }
}
