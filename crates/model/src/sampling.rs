//! The per-row token choice (host side), with the sampling parameters and
//! results of [`agentrl_sampling`].

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::kernels::exp_shifted_sum;
use crate::ModelError;

pub use agentrl_sampling::{Followup, Generation, SamplingParams};

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
    let max = finite_max(logits)?;
    let u = (params.temperature != 0.0).then(|| rng.random::<f64>());
    Ok(sample_row_drawn(logits, max, params, u))
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
    let draws: Vec<Option<f64>> = seqs
        .iter()
        .map(|&i| (params.temperature != 0.0).then(|| rng.for_sequence(i).random::<f64>()))
        .collect();
    // Each row checks its own finiteness on its thread; the first bad row in
    // `seqs` order names the error, as a sequential check would.
    seqs.par_iter()
        .zip(&draws)
        .map(|(&i, &u)| {
            let max = finite_max(row(i))?;
            Ok(sample_row_drawn(row(i), max, params, u))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .collect()
}

/// Lanes of the vectorised passes over a row of logits.
const LANES: usize = 16;

/// The largest of `logits`, or the error naming the first NaN or infinite
/// one: one pass in independent lanes, which vectorises.
fn finite_max(logits: &[f32]) -> Result<f32, ModelError> {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut finite = true;
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks.chain([tail]) {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = l.max(x);
            finite &= x.is_finite();
        }
    }
    if !finite {
        if let Some(i) = logits.iter().position(|x| !x.is_finite()) {
            return Err(ModelError::NonFiniteLogits {
                token: i,
                value: logits[i],
            });
        }
    }
    Ok(lanes.into_iter().fold(f32::NEG_INFINITY, f32::max))
}

/// [`sample_row`] of finite logits whose largest is `max`, with the uniform
/// draw `u` in [0, 1) already made (`None` at temperature 0, which draws
/// nothing). The log-softmax's normaliser is an f32 sum of vectorised
/// exponentials (relative error ~1e-6 over a 49,152-token vocabulary): as
/// libm's scalar f64 `exp` this pass was a tenth of a rollout.
fn sample_row_drawn(
    logits: &[f32],
    max: f32,
    params: &SamplingParams,
    u: Option<f64>,
) -> (u32, f32) {
    SCRATCH.with_borrow_mut(|exp| {
        exp.clear();
        exp.extend_from_slice(logits);
        let sum = exp_shifted_sum(exp, max);
        let lse = max as f64 + (sum as f64).ln();
        let token = match u {
            Some(u) if params.temperature != 0.0 => {
                let whole = params.top_k == 0 || params.top_k >= logits.len();
                if whole && params.top_p >= 1.0 {
                    sample_whole(logits, max, exp, 1.0 / params.temperature, u)
                } else {
                    sample_tempered(logits, params, u)
                }
            }
            // The lowest index among equal maxima.
            _ => logits.iter().position(|&x| x == max).unwrap_or(0),
        };
        let lp = (logits[token] as f64 - lse) as f32;
        (token as u32, lp)
    })
}

/// Samples from the tempered distribution restricted to the top-k and then
/// the top-p nucleus. Neither restriction sorts the whole vocabulary: top-k
/// is a linear-time selection, and the nucleus sorts a growing head of the
/// candidates only until it holds `top_p` of the mass.
fn sample_tempered(logits: &[f32], params: &SamplingParams, u: f64) -> usize {
    let inv_t = 1.0 / params.temperature;
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
    /// A row's exponentials, kept between calls: a fresh vocabulary-sized
    /// buffer per row and token cost more in page faults than the work.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Weights per block of [`sample_whole`]'s walk.
const WALK_BLOCK: usize = 256;

/// [`sample_tempered`] over the whole vocabulary (no top-k, no nucleus):
/// weights `e^((x − max)/T)` in f32 (`exp` holds `e^(x − max)`, which are
/// those weights at T = 1), then the bucket of `u` found block by block:
/// the blocks' sums in f64, then the chosen block's weights in order.
fn sample_whole(logits: &[f32], max: f32, exp: &mut [f32], inv_t: f64, u: f64) -> usize {
    if inv_t != 1.0 {
        let inv_t = inv_t as f32;
        for (w, &x) in exp.iter_mut().zip(logits) {
            *w = (x - max) * inv_t;
        }
        exp_shifted_sum(exp, 0.0);
    }
    let weights: &[f32] = exp;
    let sums: Vec<f64> = weights.chunks(WALK_BLOCK).map(lane_sum).collect();
    let mut target = u * sums.iter().sum::<f64>();
    for (b, &s) in sums.iter().enumerate() {
        let block = &weights[b * WALK_BLOCK..(b * WALK_BLOCK + WALK_BLOCK).min(weights.len())];
        if target < s {
            for (i, &w) in block.iter().enumerate() {
                if target < w as f64 {
                    return b * WALK_BLOCK + i;
                }
                target -= w as f64;
            }
            // Rounding between the block's sum and its walk.
            return b * WALK_BLOCK + last_weighted(block);
        }
        target -= s;
    }
    // Rounding can leave the target a hair above the last block.
    let b = sums.iter().rposition(|&s| s > 0.0).unwrap_or(0);
    b * WALK_BLOCK + last_weighted(&weights[b * WALK_BLOCK..])
}

/// Σ `xs` in independent f32 lanes (vectorised), as f64.
fn lane_sum(xs: &[f32]) -> f64 {
    let mut lanes = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks.chain([tail]) {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    lanes.iter().map(|&l| l as f64).sum()
}

/// The index of the last positive weight (0 when there is none).
fn last_weighted(weights: &[f32]) -> usize {
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)
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

    /// Logits spread over several walk blocks, deterministic.
    fn spread_logits(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 16) as f32 / 4096.0 - 8.0)
            .collect()
    }

    #[test]
    fn whole_vocabulary_walk_finds_the_exact_bucket() {
        // Against the f64 bucket of the same tempered weights: the same token
        // for every draw not within rounding of a bucket's edge.
        let logits = spread_logits(3 * WALK_BLOCK + 37);
        let max = finite_max(&logits).unwrap();
        for t in [1.0f64, 0.7] {
            let exact: Vec<f64> = logits
                .iter()
                .map(|&x| ((x - max) as f64 / t).exp())
                .collect();
            let total: f64 = exact.iter().sum();
            for d in 0..997 {
                let u = (d as f64 + 0.5) / 997.0;
                let mut exp = logits.clone();
                exp_shifted_sum(&mut exp, max);
                let got = sample_whole(&logits, max, &mut exp, 1.0 / t, u);
                let want = bucket(&exact, u);
                if got != want {
                    let edge: f64 = exact[..want.max(got)].iter().sum::<f64>() / total;
                    assert!((edge - u).abs() < 1e-5, "t {t} u {u}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn tempered_frequencies_follow_the_tempered_softmax() {
        // Three tokens in different walk blocks; at T = 0.5 their
        // probabilities are those of the logits doubled.
        let mut logits = vec![-40.0f32; 2 * WALK_BLOCK + 10];
        let (a, b, c) = (3, WALK_BLOCK + 1, 2 * WALK_BLOCK + 9);
        logits[a] = 0.0;
        logits[b] = 0.5 * (2.0f32).ln();
        logits[c] = 0.5 * (5.0f32).ln();
        let p = SamplingParams {
            temperature: 0.5,
            ..SamplingParams::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut seen = [0usize; 3];
        let n = 8000;
        for _ in 0..n {
            let (t, lp) = sample_row(&logits, &p, &mut rng).unwrap();
            let k = [a, b, c].iter().position(|&x| x == t as usize).unwrap();
            seen[k] += 1;
            // The log-prob stays the untempered one.
            let lse = (1.0f64 + 2f64.sqrt() + 5f64.sqrt()).ln();
            assert!((lp as f64 - (logits[t as usize] as f64 - lse)).abs() < 1e-5);
        }
        for (k, want) in [1.0, 2.0, 5.0].iter().map(|w| w / 8.0).enumerate() {
            let got = seen[k] as f64 / n as f64;
            assert!((got - want).abs() < 0.02, "token {k}: {got} vs {want}");
        }
    }
}
