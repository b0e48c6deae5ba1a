//! The per-row token choice (host side), with the sampling parameters and
//! results of [`agentrl_sampling`].

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::ModelError;

pub use agentrl_sampling::{Generation, SamplingParams};

/// Checks that `params` can be sampled with (see [`SamplingParams::validate`]).
pub(crate) fn validate(params: &SamplingParams) -> Result<(), ModelError> {
    params.validate().map_err(ModelError::InvalidInput)
}

/// Where a batch's sampling draws come from.
pub(crate) enum SamplingRng<'a> {
    /// One stream for the whole batch, drawn sequence by sequence, step by
    /// step: a sequence's draws depend on the batch it was in.
    Shared(&'a mut ChaCha8Rng),
    /// One stream per sequence: a sequence samples the same tokens whatever
    /// else shares its batch (a server batching independent requests).
    PerSequence(&'a mut [ChaCha8Rng]),
}

impl SamplingRng<'_> {
    /// The stream sequence `i` draws from.
    pub(crate) fn for_sequence(&mut self, i: usize) -> &mut ChaCha8Rng {
        match self {
            SamplingRng::Shared(rng) => rng,
            SamplingRng::PerSequence(rngs) => &mut rngs[i],
        }
    }
}

/// One empty continuation for each of `n` prompts.
pub(crate) fn empty_generations(n: usize) -> Vec<Generation> {
    (0..n)
        .map(|_| Generation {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            stopped: false,
        })
        .collect()
}

/// Appends a sampled token and its log-prob to `g`; returns whether the
/// sequence goes on (it neither emitted a stop token, which marks it
/// `stopped`, nor reached `max_new_tokens`).
pub(crate) fn push_token(g: &mut Generation, tok: u32, lp: f32, params: &SamplingParams) -> bool {
    g.tokens.push(tok);
    g.logprobs.push(lp);
    if params.stop_tokens.contains(&tok) {
        g.stopped = true;
        return false;
    }
    g.tokens.len() < params.max_new_tokens
}

/// Picks the next token from one row of raw logits; returns it with its
/// untempered log-probability `log_softmax(logits)[token]`. A NaN or
/// infinite logit (weights that hold NaN, or overflow) is an error: no token
/// can be drawn from such a row.
pub(crate) fn sample_row(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut ChaCha8Rng,
) -> Result<(u32, f32), ModelError> {
    check_finite(logits)?;
    let u = (params.temperature != 0.0).then(|| rng.random::<f64>());
    Ok(sample_row_drawn(logits, params, u))
}

/// [`sample_row`] for the sequences `seqs` at once, sequence i reading row
/// `row_of[i]` of `logits` (`[rows, vocab]`): each row's one uniform draw is
/// taken first, in the order of `seqs`, from that sequence's stream (the
/// draws [`sample_row`] row after row would make), then the rows, each a
/// pass over the vocabulary, are scored in parallel.
pub(crate) fn sample_rows(
    logits: &[f32],
    vocab: usize,
    seqs: &[usize],
    row_of: &[usize],
    params: &SamplingParams,
    rng: &mut SamplingRng<'_>,
) -> Result<Vec<(u32, f32)>, ModelError> {
    use rayon::prelude::*;
    let row = |i: usize| &logits[row_of[i] * vocab..(row_of[i] + 1) * vocab];
    for &i in seqs {
        check_finite(row(i))?;
    }
    let draws: Vec<Option<f64>> = seqs
        .iter()
        .map(|&i| (params.temperature != 0.0).then(|| rng.for_sequence(i).random::<f64>()))
        .collect();
    Ok(seqs
        .par_iter()
        .zip(&draws)
        .map(|(&i, &u)| sample_row_drawn(row(i), params, u))
        .collect())
}

/// A NaN or infinite logit, as the error that names it.
fn check_finite(logits: &[f32]) -> Result<(), ModelError> {
    if let Some(i) = logits.iter().position(|x| !x.is_finite()) {
        return Err(ModelError::NonFiniteLogits {
            token: i,
            value: logits[i],
        });
    }
    Ok(())
}

/// [`sample_row`] of finite logits with its uniform draw `u` in [0, 1)
/// already made (`None` at temperature 0, which draws nothing).
fn sample_row_drawn(logits: &[f32], params: &SamplingParams, u: Option<f64>) -> (u32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64
        + logits
            .iter()
            .map(|&x| ((x - max) as f64).exp())
            .sum::<f64>()
            .ln();
    let token = match u {
        Some(u) if params.temperature != 0.0 => sample_tempered(logits, params, u),
        _ => argmax(logits),
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

/// Samples from the tempered distribution restricted to the top-k and then
/// the top-p nucleus. Neither restriction sorts the whole vocabulary: top-k
/// is a linear-time selection, and the nucleus sorts a growing head of the
/// candidates only until it holds `top_p` of the mass.
fn sample_tempered(logits: &[f32], params: &SamplingParams, u: f64) -> usize {
    let inv_t = 1.0 / params.temperature;
    let whole = params.top_k == 0 || params.top_k >= logits.len();
    if whole && params.top_p >= 1.0 {
        return sample_whole(logits, inv_t, u);
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if params.top_k > 0 && params.top_k < idx.len() {
        // Ties broken by id so the kept set is the same everywhere.
        idx.select_nth_unstable_by(params.top_k - 1, |&a, &b| {
            logits[b].total_cmp(&logits[a]).then(a.cmp(&b))
        });
        idx.truncate(params.top_k);
        idx.sort_unstable();
    }
    let top = idx
        .iter()
        .map(|&i| logits[i])
        .fold(f32::NEG_INFINITY, f32::max) as f64
        * inv_t;
    let mut weights: Vec<f64> = idx
        .iter()
        .map(|&i| (logits[i] as f64 * inv_t - top).exp())
        .collect();
    if params.top_p < 1.0 {
        (idx, weights) = nucleus(&idx, &weights, params.top_p);
    }
    idx[bucket(&weights, u)]
}

/// The bucket of `weights` (unnormalised) that the uniform draw `u` in
/// [0, 1) falls in, walking them in order.
fn bucket(weights: &[f64], u: f64) -> usize {
    let total: f64 = weights.iter().sum();
    let mut u = u * total;
    for (n, w) in weights.iter().enumerate() {
        if u < *w {
            return n;
        }
        u -= w;
    }
    // Rounding can leave u a hair above the last bucket.
    weights.len() - 1
}

thread_local! {
    /// [`sample_whole`]'s weights, kept between calls: a fresh vocabulary-
    /// sized buffer per row and token cost more in page faults than its
    /// exponentials.
    static WEIGHTS: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`sample_tempered`] over the whole vocabulary (no top-k, no nucleus):
/// the same weights, sum and walk, without the candidate list.
fn sample_whole(logits: &[f32], inv_t: f64, u: f64) -> usize {
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64 * inv_t;
    WEIGHTS.with_borrow_mut(|weights| {
        weights.clear();
        weights.extend(logits.iter().map(|&x| (x as f64 * inv_t - top).exp()));
        bucket(weights, u)
    })
}

/// The smallest set of most likely candidates (by weight, then id) holding
/// at least `top_p` of the total weight, most likely first, with their weights.
fn nucleus(idx: &[usize], weights: &[f64], top_p: f64) -> (Vec<usize>, Vec<f64>) {
    let target = top_p * weights.iter().sum::<f64>();
    let n = idx.len();
    let heavier = |a: &usize, b: &usize| {
        weights[*b]
            .total_cmp(&weights[*a])
            .then(idx[*a].cmp(&idx[*b]))
    };
    let mut order: Vec<usize> = (0..n).collect();
    let mut head = n.min(32);
    let keep = loop {
        if head < n {
            order.select_nth_unstable_by(head - 1, heavier);
        }
        order[..head].sort_unstable_by(heavier);
        let mut cum = 0.0;
        let reached = order[..head].iter().position(|&p| {
            cum += weights[p];
            cum >= target
        });
        match reached {
            Some(c) => break c + 1,
            None if head == n => break n,
            None => head = (head * 4).min(n),
        }
    };
    order[..keep].iter().map(|&p| (idx[p], weights[p])).unzip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn rows_sampled_together_equal_rows_sampled_one_by_one() {
        let vocab = 300;
        let logits: Vec<f32> = (0..5 * vocab)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 20) as f32 / 400.0)
            .collect();
        let seqs = [0, 2, 3, 4];
        // Sequence i reads row row_of[i]: rows in another order than the
        // sequences, as a decode step's emitted rows are.
        let row_of = [4, 3, 0, 1, 2];
        for params in [
            SamplingParams::default(),
            SamplingParams::greedy(1),
            SamplingParams {
                top_k: 7,
                top_p: 0.5,
                temperature: 0.7,
                ..SamplingParams::default()
            },
        ] {
            let mut one = ChaCha8Rng::seed_from_u64(3);
            let want: Vec<(u32, f32)> = seqs
                .iter()
                .map(|&i| {
                    let r = row_of[i];
                    sample_row(&logits[r * vocab..(r + 1) * vocab], &params, &mut one).unwrap()
                })
                .collect();
            let mut all = ChaCha8Rng::seed_from_u64(3);
            let got = sample_rows(
                &logits,
                vocab,
                &seqs,
                &row_of,
                &params,
                &mut SamplingRng::Shared(&mut all),
            )
            .unwrap();
            assert_eq!(got, want, "{params:?}");
            // Both consumed the same draws.
            assert_eq!(one.random::<u64>(), all.random::<u64>());
        }
        let mut bad = logits.clone();
        bad[2 * vocab + 5] = f32::NAN;
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let err = sample_rows(
            &bad,
            vocab,
            &seqs,
            &row_of,
            &SamplingParams::default(),
            &mut SamplingRng::Shared(&mut rng),
        );
        assert!(err.is_err());
    }

    #[test]
    fn greedy_picks_lowest_id_among_ties() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let (t, _) =
            sample_row(&[0.0, 2.0, 2.0, 1.0], &SamplingParams::greedy(1), &mut rng).unwrap();
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
        let (t, lp) = sample_row(&logits, &p, &mut rng).unwrap();
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((lp as f64 - (logits[t as usize] as f64 - lse)).abs() < 1e-6);
    }

    #[test]
    fn a_non_finite_logit_is_an_error_not_a_token() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for p in [SamplingParams::greedy(1), SamplingParams::default()] {
                let e = sample_row(&[0.0, bad, 1.0], &p, &mut rng).unwrap_err();
                assert!(
                    matches!(e, ModelError::NonFiniteLogits { token: 1, .. }),
                    "{e}"
                );
            }
        }
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
            assert_eq!(sample_row(&[0.1, 0.5, 0.2], &p, &mut rng).unwrap().0, 1);
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
            seen[sample_row(&logits, &p, &mut rng).unwrap().0 as usize] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > 0 && seen[1] > 0);
    }

    #[test]
    fn top_k_and_nucleus_keep_the_sets_a_full_sort_keeps() {
        // 300 logits with ties; the kept sets must be those of sorting everything.
        let logits: Vec<f32> = (0..300)
            .map(|i| ((i * 37 % 101) as f32 * 0.05).sin() * 4.0)
            .collect();
        let mut sorted: Vec<usize> = (0..logits.len()).collect();
        sorted.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        for top_p in [0.05, 0.5, 0.9, 0.999] {
            let w: Vec<f64> = (0..logits.len())
                .map(|i| (logits[i] as f64 - 4.0).exp())
                .collect();
            let idx: Vec<usize> = (0..logits.len()).collect();
            let (kept, _) = nucleus(&idx, &w, top_p);
            let total: f64 = w.iter().sum();
            let mut cum = 0.0;
            let want = sorted
                .iter()
                .position(|&i| {
                    cum += w[i];
                    cum >= top_p * total
                })
                .map_or(sorted.len(), |c| c + 1);
            assert_eq!(kept, sorted[..want].to_vec(), "top_p {top_p}");
        }
        let p = SamplingParams {
            top_k: 7,
            ..SamplingParams::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let t = sample_row(&logits, &p, &mut rng).unwrap().0 as usize;
            assert!(sorted[..7].contains(&t), "{t} is outside the top 7");
        }
    }

    #[test]
    fn sampling_frequencies_follow_softmax() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let p = SamplingParams::default();
        let n = 4000;
        let ones = (0..n)
            .filter(|_| sample_row(&logits, &p, &mut rng).unwrap().0 == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.03, "{frac}");
    }
}
