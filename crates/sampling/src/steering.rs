//! What a generation can be asked per sequence beyond [`crate::SamplingParams`]:
//! logits adjusted before each token is chosen (OpenAI's and vLLM's
//! frequency and presence penalties, `logit_bias`), the top alternatives of
//! each step, and a say in whether the sequence goes on (a client that left,
//! a stop string reached). All of it is plain functions over one row of raw
//! logits, so the decoders call them without knowing who asked.

/// Largest `|logit_bias|` value, OpenAI's bound (vLLM clamps to it too).
pub const MAX_LOGIT_BIAS: f32 = 100.0;
/// Largest `|frequency_penalty|` and `|presence_penalty|`, OpenAI's bound.
pub const MAX_PENALTY: f32 = 2.0;

/// Additive changes to a row of logits, as OpenAI and vLLM define them:
/// `logit[j] += bias[j] − frequency_penalty · count[j] − presence_penalty · [count[j] > 0]`,
/// where `count[j]` is how often token `j` was generated so far in this
/// sequence (the prompt does not count).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitAdjustment {
    /// Subtracted once per earlier occurrence of a token (−2 to 2).
    pub frequency_penalty: f32,
    /// Subtracted once from every token that already occurred (−2 to 2).
    pub presence_penalty: f32,
    /// `(token id, bias)` added to that token's logit (−100 to 100); −100
    /// bans a token in practice, 100 all but forces it.
    pub logit_bias: Vec<(u32, f32)>,
}

impl LogitAdjustment {
    /// True when [`LogitAdjustment::apply`] changes nothing (all zero).
    pub fn is_neutral(&self) -> bool {
        self.frequency_penalty == 0.0
            && self.presence_penalty == 0.0
            && self.logit_bias.iter().all(|&(_, b)| b == 0.0)
    }

    /// Adjusts `logits` (one row over the vocabulary) of a sequence that has
    /// generated `generated` so far. Ids outside the row are ignored (the
    /// server checks them against the vocabulary first).
    pub fn apply(&self, logits: &mut [f32], generated: &[u32]) {
        for &(t, b) in &self.logit_bias {
            if let Some(x) = logits.get_mut(t as usize) {
                *x += b;
            }
        }
        if self.frequency_penalty == 0.0 && self.presence_penalty == 0.0 {
            return;
        }
        // Counting by sorting keeps the cost in the generated length, not
        // the vocabulary.
        let mut seen = generated.to_vec();
        seen.sort_unstable();
        for run in seen.chunk_by(|a, b| a == b) {
            if let Some(x) = logits.get_mut(run[0] as usize) {
                *x -= self.frequency_penalty * run.len() as f32 + self.presence_penalty;
            }
        }
    }
}

/// `log Σ exp(logits)`, in f64 as the samplers compute it.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max as f64;
    }
    max as f64
        + logits
            .iter()
            .map(|&x| ((x - max) as f64).exp())
            .sum::<f64>()
            .ln()
}

/// `log_softmax(logits)[token]`, the way the samplers compute a chosen
/// token's log-prob (f64 inside, f32 out).
pub fn log_softmax_at(logits: &[f32], token: u32, lse: f64) -> f32 {
    (logits[token as usize] as f64 - lse) as f32
}

/// The `k` most likely tokens of a row of raw logits with their log-probs
/// (`log_softmax`), most likely first, ties by lower id. A linear-time
/// selection, then a sort of the `k` kept.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let lse = log_sum_exp(logits);
    let order = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    idx.into_iter()
        .map(|i| (i as u32, log_softmax_at(logits, i as u32, lse)))
        .collect()
}

/// The rank of `token` in a row (1 = the most likely; tokens with a larger
/// logit come first, equal logits by lower id), as vLLM reports a prompt
/// token's rank.
pub fn rank_of(logits: &[f32], token: u32) -> usize {
    let x = logits[token as usize];
    1 + logits
        .iter()
        .enumerate()
        .filter(|&(i, &y)| y > x || (y == x && (i as u32) < token))
        .count()
}

/// Per-sequence control of a generation call, called by the decoder at
/// every step of every live sequence (`seq` is the sequence's index in the
/// call). Without it a decoder samples from the raw row and runs each
/// sequence to a stop token or `max_new_tokens`.
pub trait Steering {
    /// Whether sequence `seq`'s logits are adjusted before its next token
    /// is chosen; when false the decoder samples from the raw row (no copy).
    fn adjusts(&self, seq: usize) -> bool;

    /// Adjusts `logits` (a copy of sequence `seq`'s raw row) given the
    /// tokens it generated so far; the token is then chosen from them with
    /// the call's temperature, top-k and top-p.
    fn adjust(&self, seq: usize, generated: &[u32], logits: &mut [f32]);

    /// Sequence `seq` chose `token`, whose log-prob under the raw (untempered,
    /// unadjusted) distribution of `logits` is `logprob`. Returns whether the
    /// sequence may go on: false ends it after this token (its client left,
    /// or a stop string was reached), neither stopped nor at its length.
    fn chosen(&mut self, seq: usize, token: u32, logprob: f32, logits: &[f32]) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequency_penalty_scales_with_the_count() {
        let mut row = vec![1.0f32; 5];
        let adj = LogitAdjustment {
            frequency_penalty: 0.5,
            ..LogitAdjustment::default()
        };
        adj.apply(&mut row, &[3, 1, 3, 3]);
        assert_eq!(row, vec![1.0, 0.5, 1.0, -0.5, 1.0]);
        // Negative values encourage repeats.
        let mut row = vec![0.0f32; 3];
        LogitAdjustment {
            frequency_penalty: -1.0,
            ..LogitAdjustment::default()
        }
        .apply(&mut row, &[2, 2]);
        assert_eq!(row, vec![0.0, 0.0, 2.0]);
    }

    #[test]
    fn presence_penalty_counts_each_token_once() {
        let mut row = vec![1.0f32; 5];
        let adj = LogitAdjustment {
            presence_penalty: 0.25,
            ..LogitAdjustment::default()
        };
        adj.apply(&mut row, &[4, 4, 4, 0]);
        assert_eq!(row, vec![0.75, 1.0, 1.0, 1.0, 0.75]);
        // Both penalties together: −(f·count + p).
        let mut row = vec![0.0f32; 3];
        LogitAdjustment {
            frequency_penalty: 1.0,
            presence_penalty: 0.5,
            logit_bias: Vec::new(),
        }
        .apply(&mut row, &[1, 1]);
        assert_eq!(row, vec![0.0, -2.5, 0.0]);
    }

    #[test]
    fn logit_bias_adds_to_its_tokens_only() {
        let mut row = vec![0.0f32, 1.0, 2.0];
        let adj = LogitAdjustment {
            logit_bias: vec![(0, 100.0), (2, -100.0), (7, 5.0)],
            ..LogitAdjustment::default()
        };
        assert!(!adj.is_neutral());
        adj.apply(&mut row, &[0, 0]);
        // The prompt-free, penalty-free bias ignores what was generated, and
        // an id past the row.
        assert_eq!(row, vec![100.0, 1.0, -98.0]);
        assert!(LogitAdjustment {
            logit_bias: vec![(1, 0.0)],
            ..LogitAdjustment::default()
        }
        .is_neutral());
    }

    #[test]
    fn top_logprobs_are_the_largest_of_the_log_softmax() {
        let row = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        let lse = (row.iter().map(|&x| (x as f64).exp()).sum::<f64>()).ln();
        let top = top_logprobs(&row, 3);
        let ids: Vec<u32> = top.iter().map(|&(t, _)| t).collect();
        assert_eq!(ids, vec![1, 3, 4], "ties by lower id");
        for &(t, lp) in &top {
            assert!((lp as f64 - (row[t as usize] as f64 - lse)).abs() < 1e-6);
        }
        assert_eq!(top_logprobs(&row, 0), vec![]);
        assert_eq!(top_logprobs(&row, 50).len(), 5);
        assert_eq!(rank_of(&row, 1), 1);
        assert_eq!(rank_of(&row, 3), 2);
        assert_eq!(rank_of(&row, 2), 5);
    }
}
