//! Continuous batching (`PolicyModel::generate_continuous`): a sequence
//! whose continuation ends goes on with a new context in the same forward
//! passes as the others' tokens. Each dialogue must come out as playing its
//! turns one call at a time would give it.

use agentrl_model::{Followup, Generation, PolicyModel, SamplingParams};
use candle_core::Device;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::qwen2_tiny::fixture_dir;

fn host_model() -> PolicyModel {
    PolicyModel::load(&fixture_dir(), false, &Device::Cpu).unwrap()
}

/// Three dialogues, or with `twins` four, the last a copy of the first
/// (the members of a GRPO group in the same state): the same prompt, the
/// same observations, so under greedy decoding both are continued with
/// the same context in the same step.
#[derive(Clone, Copy)]
struct Dialogues3 {
    twins: bool,
}

impl Dialogues3 {
    /// The dialogue whose prompts and observations `i` gets.
    fn original(self, i: usize) -> usize {
        if self.twins && i == 3 {
            0
        } else {
            i
        }
    }

    /// First prompts of different lengths.
    fn prompts(self, vocab: u32) -> Vec<Vec<u32>> {
        let ids = |n: usize, k: u32| {
            (0..n as u32)
                .map(|i| (i * 7 + k * 13 + 1) % vocab)
                .collect()
        };
        let firsts: [Vec<u32>; 3] = [ids(9, 0), ids(23, 1), ids(4, 2)];
        (0..self.len())
            .map(|i| firsts[self.original(i)].clone())
            .collect()
    }

    fn len(self) -> usize {
        3 + self.twins as usize
    }

    /// Turns dialogue `i` plays: the batch's sequences end at different times.
    fn turns(self, i: usize) -> usize {
        [3, 1, 4][self.original(i)]
    }

    /// What dialogue `i` is told after turn `turn`, of different lengths.
    fn observation(self, i: usize, turn: usize, vocab: u32) -> Vec<u32> {
        let i = self.original(i);
        (0..(3 + 2 * i + turn) as u32)
            .map(|j| (j * 11 + i as u32 * 5 + turn as u32 * 17 + 3) % vocab)
            .collect()
    }
}

/// Every third token stops a continuation, so replies end at different
/// steps; at most 6 new tokens.
fn params(vocab: u32, temperature: f64) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 6,
        temperature,
        stop_tokens: (0..vocab).filter(|t| t % 3 == 0).collect(),
        ..SamplingParams::default()
    }
}

/// Each dialogue's generations, turn by turn.
type Dialogues = Vec<Vec<Generation>>;

/// The dialogues played through one continuous batch: each goes on with
/// its context, reply and next observation until it has played its turns.
/// Also the context positions served from caches.
fn play_continuously(
    model: &PolicyModel,
    set: Dialogues3,
    params: &SamplingParams,
    keep_cache: bool,
    seed: u64,
) -> (Dialogues, usize) {
    let vocab = model.config.vocab_size as u32;
    let mut contexts = set.prompts(vocab);
    let mut dialogues: Dialogues = vec![Vec::new(); contexts.len()];
    let mut caches: Vec<_> = contexts.iter().map(|_| model.new_cache()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let first = contexts.clone();
    let mut next = |i: usize, gen: Generation| {
        contexts[i].extend(&gen.tokens);
        dialogues[i].push(gen);
        let turn = dialogues[i].len();
        if turn == set.turns(i) {
            return Followup::Done;
        }
        contexts[i].extend(set.observation(i, turn, vocab));
        Followup::Continue(contexts[i].clone())
    };
    let reused = model
        .generate_continuous(&mut caches, &first, params, &mut rng, keep_cache, &mut next)
        .unwrap();
    (dialogues, reused)
}

/// The same dialogues, each played alone a turn per call from fresh caches.
fn play_one_at_a_time(model: &PolicyModel, set: Dialogues3, params: &SamplingParams) -> Dialogues {
    let vocab = model.config.vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    set.prompts(vocab)
        .into_iter()
        .enumerate()
        .map(|(i, mut context)| {
            (0..set.turns(i))
                .map(|turn| {
                    if turn > 0 {
                        context.extend(set.observation(i, turn, vocab));
                    }
                    let gen = model
                        .generate(std::slice::from_ref(&context), params, &mut rng)
                        .unwrap()
                        .remove(0);
                    context.extend(&gen.tokens);
                    gen
                })
                .collect()
        })
        .collect()
}

fn assert_same_dialogues(got: &Dialogues, want: &Dialogues, what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: dialogue {i} turns");
        for (t, (a, b)) in g.iter().zip(w).enumerate() {
            assert_eq!(a.tokens, b.tokens, "{what}: dialogue {i} turn {t} tokens");
            assert_eq!(a.stopped, b.stopped, "{what}: dialogue {i} turn {t} stop");
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!(
                    (x - y).abs() < 1e-4,
                    "{what}: dialogue {i} turn {t}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn each_dialogue_plays_as_its_turns_one_call_at_a_time_would() {
    let model = host_model();
    assert!(model.batches_continuously());
    let params = params(model.config.vocab_size as u32, 0.0);
    for set in [Dialogues3 { twins: false }, Dialogues3 { twins: true }] {
        let want = play_one_at_a_time(&model, set, &params);
        // The premise: replies end at different steps, so the batch mixes
        // one sequence's new context with another's next token.
        let lengths: Vec<usize> = want.iter().flatten().map(|g| g.tokens.len()).collect();
        assert!(
            lengths.iter().any(|&n| n != lengths[0]),
            "all replies {lengths:?} long"
        );
        for keep_cache in [true, false] {
            let (got, reused) = play_continuously(&model, set, &params, keep_cache, 0);
            let what = format!("twins {}, keep_cache {keep_cache}", set.twins);
            assert_same_dialogues(&got, &want, &what);
            // Every later turn's context extends the dialogue its cache holds.
            let later_turns: usize = (0..set.len()).map(|i| set.turns(i) - 1).sum();
            match keep_cache {
                true => assert!(reused >= later_turns, "{what}: {reused} positions reused"),
                false => assert_eq!(reused, 0, "{what}"),
            }
        }
    }
}

#[test]
fn sampled_continuous_batches_repeat_with_their_seed() {
    let model = host_model();
    let params = params(model.config.vocab_size as u32, 1.0);
    let set = Dialogues3 { twins: true };
    let a = play_continuously(&model, set, &params, true, 7);
    assert_eq!(a, play_continuously(&model, set, &params, true, 7));
    assert_ne!(
        a.0,
        play_continuously(&model, set, &params, true, 8).0,
        "the seed draws"
    );
}

#[test]
fn sequences_done_after_one_continuation_are_generate_cached() {
    // Nothing continued: the same draws in the same order as one call.
    let model = host_model();
    let vocab = model.config.vocab_size as u32;
    let params = params(vocab, 1.0);
    let contexts = Dialogues3 { twins: true }.prompts(vocab);
    let mut got = vec![Generation::default(); contexts.len()];
    let mut caches: Vec<_> = contexts.iter().map(|_| model.new_cache()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    model
        .generate_continuous(
            &mut caches,
            &contexts,
            &params,
            &mut rng,
            true,
            &mut |i, gen| {
                got[i] = gen;
                Followup::Done
            },
        )
        .unwrap();
    let mut caches: Vec<_> = contexts.iter().map(|_| model.new_cache()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let want = model
        .generate_cached(&mut caches, &contexts, &params, &mut rng)
        .unwrap();
    assert_eq!(got, want);
}

#[test]
fn a_continued_context_is_checked_and_an_abort_stops_the_batch() {
    let model = host_model();
    let vocab = model.config.vocab_size as u32;
    let params = params(vocab, 0.0);
    let contexts = Dialogues3 { twins: false }.prompts(vocab);
    let fresh = || -> Vec<_> { contexts.iter().map(|_| model.new_cache()).collect() };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let err = model
        .generate_continuous(
            &mut fresh(),
            &contexts,
            &params,
            &mut rng,
            true,
            &mut |_, _| Followup::Continue(vec![vocab]),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("continued") && err.contains("vocab_size"),
        "{err}"
    );
    let mut calls = 0;
    model
        .generate_continuous(
            &mut fresh(),
            &contexts,
            &params,
            &mut rng,
            true,
            &mut |_, _| {
                calls += 1;
                Followup::Abort
            },
        )
        .unwrap();
    assert_eq!(calls, 1, "nothing is generated after an abort");
}

#[test]
fn the_graph_decoder_says_it_does_not_batch_continuously() {
    let mut model = host_model();
    model.set_graph_decode(true);
    assert!(!model.batches_continuously());
    let contexts = Dialogues3 { twins: false }.prompts(model.config.vocab_size as u32);
    let mut caches: Vec<_> = contexts.iter().map(|_| model.new_cache()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let params = SamplingParams::greedy(2);
    let err = model
        .generate_continuous(
            &mut caches,
            &contexts,
            &params,
            &mut rng,
            true,
            &mut |_, _| Followup::Done,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("host decoder"), "{err}");
}
