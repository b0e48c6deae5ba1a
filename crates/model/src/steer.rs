//! Generation steered per sequence ([`Steering`]: penalties and logit bias
//! before a token is chosen, each chosen token seen with its row, a sequence
//! ended early), and the log-probs of a prompt's own tokens (OpenAI's
//! `echo`, vLLM's `prompt_logprobs`).
//!
//! The decoders call [`Steer::choose`] where they would call the plain
//! sampler: without a [`Steering`] it *is* the plain sampler (same draws,
//! same bits), so the unsteered path pays nothing.

use agentrl_sampling::steering::{log_softmax_at, log_sum_exp, rank_of, top_logprobs};
use agentrl_sampling::Steering;
use candle_core::{DType, Device, Tensor};
use rand_chacha::ChaCha8Rng;

use crate::qwen2::{LayerKvCache, Model};
use crate::sampling::{sample_row, sample_rows, Generation, SamplingParams, SamplingRng};
use crate::{ModelConfig, ModelError};

/// The steering of one generation call, if any, with the scratch row its
/// adjustments are made in.
pub(crate) struct Steer<'a> {
    steering: Option<&'a mut dyn Steering>,
    row: Vec<f32>,
}

impl<'a> Steer<'a> {
    /// No steering: every choice is the plain sampler's.
    pub(crate) fn none() -> Self {
        Self {
            steering: None,
            row: Vec::new(),
        }
    }

    /// Whether every choice is the plain sampler's (no steering).
    #[cfg(feature = "cuda")]
    pub(crate) fn is_plain(&self) -> bool {
        self.steering.is_none()
    }

    /// Steered by `steering`.
    pub(crate) fn by(steering: &'a mut dyn Steering) -> Self {
        Self {
            steering: Some(steering),
            row: Vec::new(),
        }
    }

    /// Sequence `seq`'s next token from its raw row `logits`, given what it
    /// generated so far: the token, its log-prob under the raw distribution,
    /// and whether the sequence may go on (the [`Steering`]'s say).
    pub(crate) fn choose(
        &mut self,
        seq: usize,
        logits: &[f32],
        generated: &[u32],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Result<(u32, f32, bool), ModelError> {
        let Some(steering) = self.steering.as_deref_mut() else {
            let (token, logprob) = sample_row(logits, params, rng)?;
            return Ok((token, logprob, true));
        };
        let (token, logprob) = if steering.adjusts(seq) {
            self.row.clear();
            self.row.extend_from_slice(logits);
            steering.adjust(seq, generated, &mut self.row);
            // The choice is the adjusted row's; the log-prob stays the raw
            // policy's (vLLM's default `raw_logprobs`), as RL needs it.
            let (token, _) = sample_row(&self.row, params, rng)?;
            (token, log_softmax_at(logits, token, log_sum_exp(logits)))
        } else {
            sample_row(logits, params, rng)?
        };
        let go_on = steering.chosen(seq, token, logprob, logits);
        Ok((token, logprob, go_on))
    }

    /// [`Steer::choose`] for the sequences `seqs`, sequence i reading row
    /// `row_of[i]` of `logits` (`[rows, vocab]`): unsteered, the plain
    /// sampler's rows in parallel.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn choose_rows(
        &mut self,
        logits: &[f32],
        vocab: usize,
        seqs: &[usize],
        row_of: &[usize],
        gens: &[Generation],
        params: &SamplingParams,
        rng: &mut SamplingRng<'_>,
    ) -> Result<Vec<(u32, f32, bool)>, ModelError> {
        if self.steering.is_none() {
            return Ok(sample_rows(logits, vocab, seqs, row_of, params, rng)?
                .into_iter()
                .map(|(t, lp)| (t, lp, true))
                .collect());
        }
        // Row by row, each drawing from its own sequence's stream in the
        // order of `seqs`: the draws the parallel sampler makes.
        seqs.iter()
            .map(|&i| {
                let row = &logits[row_of[i] * vocab..(row_of[i] + 1) * vocab];
                self.choose(i, row, &gens[i].tokens, params, rng.for_sequence(i))
            })
            .collect()
    }
}

/// One prompt token's log-prob given the tokens before it (vLLM's
/// `prompt_logprobs` entry).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTokenLogprob {
    /// The token.
    pub token: u32,
    /// `log p(token | earlier tokens)` under the raw distribution.
    pub logprob: f32,
    /// Its rank in that distribution (1 = most likely).
    pub rank: usize,
    /// The most likely tokens there with their log-probs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Positions run through the model at once when scoring a prompt: the
/// attention scores of a chunk are `[heads, CHUNK, positions so far]`, and
/// its logits `[CHUNK, vocab]`, whatever the prompt's length.
const PROMPT_CHUNK: usize = 64;

/// Log-probs of `prompt[1..]` given what precedes each (with the `k` most
/// likely tokens at each position): the prompt goes through the model in
/// chunks of [`PROMPT_CHUNK`] positions over a KV cache, so memory stays in
/// proportion to the prompt, not its square times the vocabulary.
pub(crate) fn prompt_logprobs(
    model: &Model,
    cfg: &ModelConfig,
    prompt: &[u32],
    k: usize,
) -> Result<Vec<PromptTokenLogprob>, ModelError> {
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(ModelError::InvalidInput(format!(
            "token id {bad} >= vocab_size {}",
            cfg.vocab_size
        )));
    }
    if prompt.len() > model.rotary().max_positions() {
        return Err(ModelError::InvalidInput(format!(
            "prompt length {} > max_position_embeddings {}",
            prompt.len(),
            model.rotary().max_positions()
        )));
    }
    // The last token predicts nothing in the prompt.
    let scored = prompt.len().saturating_sub(1);
    let mut out = Vec::with_capacity(scored);
    if scored == 0 {
        return Ok(out);
    }
    let dev = model.device().clone();
    let mut kv = (0..model.num_layers())
        .map(|_| LayerKvCache::new(cfg, 1, scored, model.dtype(), &dev))
        .collect::<candle_core::Result<Vec<_>>>()?;
    for start in (0..scored).step_by(PROMPT_CHUNK) {
        let end = (start + PROMPT_CHUNK).min(scored);
        let ids = Tensor::from_vec(prompt[start..end].to_vec(), (1, end - start), &dev)?;
        let rope = model.rotary().tables_contiguous(start, end - start)?;
        let h = model.forward_hidden(&ids, &rope, &[], Some(&mut kv))?;
        let logits = model
            .logits(&h)?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let vocab = logits.len() / (end - start);
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            if let Some(i) = row.iter().position(|x| !x.is_finite()) {
                return Err(ModelError::NonFiniteLogits {
                    token: i,
                    value: row[i],
                });
            }
            let token = prompt[start + r + 1];
            out.push(PromptTokenLogprob {
                token,
                logprob: log_softmax_at(row, token, log_sum_exp(row)),
                rank: rank_of(row, token),
                top: top_logprobs(row, k),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelConfig, PolicyModel};
    use agentrl_sampling::LogitAdjustment;
    use rand::SeedableRng;

    fn model() -> PolicyModel {
        PolicyModel::new_random(&ModelConfig::tiny(64), false, 7, &Device::Cpu).unwrap()
    }

    /// Adjusts every sequence by one [`LogitAdjustment`], records what it
    /// saw, and ends sequence 0 after `end_after` tokens.
    struct Recorder {
        adjust: LogitAdjustment,
        end_after: usize,
        seen: Vec<Vec<(u32, f32, f32)>>,
    }

    impl Steering for Recorder {
        fn adjusts(&self, _: usize) -> bool {
            !self.adjust.is_neutral()
        }
        fn adjust(&self, _: usize, generated: &[u32], logits: &mut [f32]) {
            self.adjust.apply(logits, generated);
        }
        fn chosen(&mut self, seq: usize, token: u32, logprob: f32, logits: &[f32]) -> bool {
            let top = top_logprobs(logits, 1)[0].1;
            self.seen[seq].push((token, logprob, top));
            !(seq == 0 && self.seen[0].len() >= self.end_after)
        }
    }

    fn recorder(adjust: LogitAdjustment, end_after: usize) -> Recorder {
        Recorder {
            adjust,
            end_after,
            seen: vec![Vec::new(); 2],
        }
    }

    #[test]
    fn a_neutral_steering_gives_the_plain_generation() {
        let m = model();
        let prompts = vec![vec![1, 2, 3], vec![4, 5]];
        let params = SamplingParams {
            max_new_tokens: 12,
            temperature: 0.8,
            ..SamplingParams::default()
        };
        let rngs = || -> Vec<ChaCha8Rng> {
            (0..2)
                .map(|i| {
                    let mut r = ChaCha8Rng::seed_from_u64(3);
                    r.set_stream(i);
                    r
                })
                .collect()
        };
        let plain = m
            .generate_independent(&prompts, &params, &mut rngs())
            .unwrap();
        let mut rec = recorder(LogitAdjustment::default(), usize::MAX);
        let steered = m
            .generate_steered(&prompts, &params, &mut rngs(), &mut rec)
            .unwrap();
        assert_eq!(steered, plain);
        // The steering saw every token with its log-prob.
        for (g, seen) in plain.iter().zip(&rec.seen) {
            let tokens: Vec<u32> = seen.iter().map(|s| s.0).collect();
            let lps: Vec<f32> = seen.iter().map(|s| s.1).collect();
            assert_eq!((tokens, lps), (g.tokens.clone(), g.logprobs.clone()));
        }
    }

    #[test]
    fn a_steering_that_says_stop_ends_its_sequence_there() {
        let m = model();
        let prompts = vec![vec![1, 2, 3], vec![4, 5]];
        let mut rngs = vec![ChaCha8Rng::seed_from_u64(0), ChaCha8Rng::seed_from_u64(1)];
        let mut rec = recorder(LogitAdjustment::default(), 3);
        let gens = m
            .generate_steered(&prompts, &SamplingParams::greedy(10), &mut rngs, &mut rec)
            .unwrap();
        assert_eq!(gens[0].tokens.len(), 3);
        assert!(!gens[0].stopped);
        assert_eq!(gens[1].tokens.len(), 10);
    }

    #[test]
    fn bias_steers_the_choice_and_the_logprob_stays_raw() {
        let m = model();
        let prompts = vec![vec![1, 2, 3]];
        let mut rec = recorder(
            LogitAdjustment {
                logit_bias: vec![(9, 100.0)],
                ..LogitAdjustment::default()
            },
            usize::MAX,
        );
        let mut rngs = vec![ChaCha8Rng::seed_from_u64(0)];
        let gens = m
            .generate_steered(&prompts, &SamplingParams::greedy(5), &mut rngs, &mut rec)
            .unwrap();
        assert_eq!(gens[0].tokens, vec![9; 5]);
        // The log-prob is the raw model's: what its own row gives token 9,
        // below the raw row's best unless 9 is the best anyway.
        let raw = m.prompt_logprobs(&[1, 2, 3, 9], 1).unwrap().pop().unwrap();
        assert!((gens[0].logprobs[0] - raw.logprob).abs() < 1e-4);
        assert!(rec.seen[0].iter().all(|&(_, lp, top)| lp <= top));
        // A frequency penalty breaks a greedy repeat.
        let mut rec = recorder(
            LogitAdjustment {
                logit_bias: vec![(9, 5.0)],
                frequency_penalty: 2.0,
                presence_penalty: 2.0,
            },
            usize::MAX,
        );
        let mut rngs = vec![ChaCha8Rng::seed_from_u64(0)];
        let gens = m
            .generate_steered(&prompts, &SamplingParams::greedy(6), &mut rngs, &mut rec)
            .unwrap();
        assert_eq!(gens[0].tokens[0], 9);
        assert!(gens[0].tokens.iter().filter(|&&t| t == 9).count() < 6);
    }

    #[test]
    fn prompt_logprobs_match_the_training_forward() {
        let m = model();
        let prompt: Vec<u32> = (0..150).map(|i| (i * 7 % 64) as u32).collect();
        let scored = m.prompt_logprobs(&prompt, 3).unwrap();
        assert_eq!(scored.len(), prompt.len() - 1);
        let reference = m.sequence_logprobs(std::slice::from_ref(&prompt)).unwrap();
        let want: Vec<f32> = reference.logprobs.flatten_all().unwrap().to_vec1().unwrap();
        for (i, s) in scored.iter().enumerate() {
            assert_eq!(s.token, prompt[i + 1]);
            assert!(
                (s.logprob - want[i]).abs() < 1e-4,
                "{i}: {} vs {}",
                s.logprob,
                want[i]
            );
            assert_eq!(s.top.len(), 3);
            assert!(s.top[0].1 >= s.logprob - 1e-6);
            assert!(s.rank >= 1);
            if s.rank == 1 {
                assert_eq!(s.top[0].0, s.token);
            }
        }
    }
}
