//! Per-sequence KV caches kept across `generate_cached` calls: a turn that
//! appends tokens to a cached dialogue must sample exactly what re-encoding
//! the whole dialogue from scratch samples. Every test runs on both
//! decoders: the host decoder (the CPU's per-sequence caches) and the graph
//! decoder (a GPU's batch caches, on the device `AGENTRL_TEST_DEVICE` names).

use agentrl_model::{Generation, ModelConfig, PolicyModel, SamplingParams, SequenceCache};
use candle_core::Device;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::device::test_device;
use crate::qwen2_tiny::fixture_dir;

/// Which generation path a test runs.
#[derive(Debug, Clone, Copy)]
enum Decoder {
    Host,
    Graph,
}

const DECODERS: [Decoder; 2] = [Decoder::Host, Decoder::Graph];

fn fixture_model(decoder: Decoder) -> PolicyModel {
    let device = match decoder {
        Decoder::Host => Device::Cpu,
        Decoder::Graph => test_device(),
    };
    let mut model = PolicyModel::load(&fixture_dir(), false, &device).unwrap();
    model.set_graph_decode(matches!(decoder, Decoder::Graph));
    model
}

/// Three prompts of different lengths (batched without padding).
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let ids = |n: usize, k: u32| {
        (0..n as u32)
            .map(|i| (i * 7 + k * 13 + 1) % vocab)
            .collect()
    };
    vec![ids(9, 0), ids(23, 1), ids(4, 2)]
}

/// A different "observation" per sequence, of different lengths.
fn observation(i: usize, turn: usize, vocab: u32) -> Vec<u32> {
    (0..(3 + 2 * i + turn) as u32)
        .map(|j| (j * 11 + i as u32 * 5 + turn as u32 * 17 + 3) % vocab)
        .collect()
}

fn assert_same(cached: &[Generation], fresh: &[Generation], what: &str) {
    assert_eq!(cached.len(), fresh.len());
    for (i, (c, f)) in cached.iter().zip(fresh).enumerate() {
        assert_eq!(c.tokens, f.tokens, "{what}: sequence {i} tokens");
        assert_eq!(c.stopped, f.stopped, "{what}: sequence {i} stop");
        for (j, (a, b)) in c.logprobs.iter().zip(&f.logprobs).enumerate() {
            assert!(
                (a - b).abs() < 1e-4,
                "{what}: seq {i} token {j}: {a} vs {b}"
            );
        }
    }
}

/// Greedy generation of `contexts` through `caches` equals generation from fresh caches.
fn greedy_cached_equals_fresh(
    model: &PolicyModel,
    caches: &mut [SequenceCache],
    contexts: &[Vec<u32>],
    max_new: usize,
    what: &str,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let params = SamplingParams::greedy(max_new);
    let a = model
        .generate_cached(caches, contexts, &params, &mut rng)
        .unwrap();
    let b = model.generate(contexts, &params, &mut rng).unwrap();
    assert_same(&a, &b, what);
}

/// Three turns: generate, append an observation, generate again — with the
/// caches, and by re-encoding each full context with fresh caches; the same
/// seed must give the same tokens and log-probs.
fn three_turns_match(decoder: Decoder, params: &SamplingParams, seed: u64) {
    let model = fixture_model(decoder);
    let vocab = model.config.vocab_size as u32;
    let mut rng_cached = ChaCha8Rng::seed_from_u64(seed);
    let mut rng_fresh = ChaCha8Rng::seed_from_u64(seed);
    let mut caches: Vec<SequenceCache> = (0..3).map(|_| model.new_cache()).collect();
    let mut contexts = prompts(vocab);
    for turn in 0..3 {
        let cached = model
            .generate_cached(&mut caches, &contexts, params, &mut rng_cached)
            .unwrap();
        let fresh = model.generate(&contexts, params, &mut rng_fresh).unwrap();
        assert_same(&cached, &fresh, &format!("{decoder:?} turn {turn}"));
        for (i, (c, g)) in caches.iter().zip(&cached).enumerate() {
            let want: Vec<u32> = contexts[i].iter().chain(&g.tokens).copied().collect();
            assert_eq!(c.tokens(), want.as_slice(), "cache {i} tokens");
            // Everything but the last sampled token is encoded.
            assert_eq!(c.cached_len(), want.len() - 1, "cache {i} positions");
        }
        contexts = caches
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut next = c.tokens().to_vec();
                next.extend(observation(i, turn, vocab));
                next
            })
            .collect();
    }
}

#[test]
fn cached_turns_equal_full_reencoding_greedy() {
    for decoder in DECODERS {
        three_turns_match(decoder, &SamplingParams::greedy(6), 0);
    }
}

#[test]
fn cached_turns_equal_full_reencoding_seeded_sampling() {
    let params = SamplingParams {
        max_new_tokens: 7,
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        stop_tokens: vec![],
    };
    for decoder in DECODERS {
        three_turns_match(decoder, &params, 11);
        three_turns_match(
            decoder,
            &SamplingParams {
                max_new_tokens: 5,
                ..SamplingParams::default()
            },
            3,
        );
    }
}

#[test]
fn sequences_that_stop_early_leave_the_batch_and_keep_their_cache_consistent() {
    for decoder in DECODERS {
        sequences_that_stop_early_leave_the_batch_and_keep_their_cache_consistent_on(decoder);
    }
}

fn sequences_that_stop_early_leave_the_batch_and_keep_their_cache_consistent_on(decoder: Decoder) {
    let model = fixture_model(decoder);
    let vocab = model.config.vocab_size as u32;
    let contexts = prompts(vocab);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let free = model
        .generate(&contexts, &SamplingParams::greedy(8), &mut rng)
        .unwrap();
    // Stop on sequence 1's third token: it finishes early, the others run on.
    let stop = free[1].tokens[2];
    let params = SamplingParams {
        stop_tokens: vec![stop],
        ..SamplingParams::greedy(8)
    };
    let mut caches: Vec<SequenceCache> = (0..3).map(|_| model.new_cache()).collect();
    let cached = model
        .generate_cached(&mut caches, &contexts, &params, &mut rng)
        .unwrap();
    for (i, g) in cached.iter().enumerate() {
        let alone = model
            .generate(std::slice::from_ref(&contexts[i]), &params, &mut rng)
            .unwrap()
            .remove(0);
        assert_eq!(g.tokens, alone.tokens, "{decoder:?} sequence {i}");
        assert_eq!(caches[i].tokens().len(), contexts[i].len() + g.tokens.len());
    }
    assert!(cached[1].stopped && cached[1].tokens.len() == 3);
    // A next turn after the early stop still matches re-encoding.
    let next: Vec<Vec<u32>> = caches
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.tokens()
                .iter()
                .copied()
                .chain(observation(i, 0, vocab))
                .collect()
        })
        .collect();
    greedy_cached_equals_fresh(
        &model,
        &mut caches,
        &next,
        5,
        &format!("{decoder:?} after an early stop"),
    );
}

#[test]
fn a_context_that_diverges_from_the_cache_reuses_only_the_common_prefix() {
    for decoder in DECODERS {
        a_context_that_diverges_from_the_cache_reuses_only_the_common_prefix_on(decoder);
    }
}

fn a_context_that_diverges_from_the_cache_reuses_only_the_common_prefix_on(decoder: Decoder) {
    let model = fixture_model(decoder);
    let vocab = model.config.vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut caches: Vec<SequenceCache> = (0..3).map(|_| model.new_cache()).collect();
    let contexts = prompts(vocab);
    model
        .generate_cached(&mut caches, &contexts, &SamplingParams::greedy(6), &mut rng)
        .unwrap();
    // Drop the reply's last 3 tokens and change one more: a retokenised turn.
    let edited: Vec<Vec<u32>> = caches
        .iter()
        .map(|c| {
            let mut t = c.tokens()[..c.tokens().len() - 3].to_vec();
            let last = t.len() - 1;
            t[last] = (t[last] + 1) % vocab;
            t.extend([5, 6, 7]);
            t
        })
        .collect();
    greedy_cached_equals_fresh(
        &model,
        &mut caches,
        &edited,
        6,
        &format!("{decoder:?} diverged context"),
    );
    // The same context again (fully cached): the last token is re-encoded for its logits.
    greedy_cached_equals_fresh(
        &model,
        &mut caches,
        &edited,
        4,
        &format!("{decoder:?} repeated context"),
    );
}

#[test]
fn a_cache_of_another_shape_or_count_is_rejected() {
    for decoder in DECODERS {
        a_cache_of_another_shape_or_count_is_rejected_on(decoder);
    }
}

fn a_cache_of_another_shape_or_count_is_rejected_on(decoder: Decoder) {
    let model = fixture_model(decoder);
    let mut other = vec![SequenceCache::new(&ModelConfig::new_qwen2(
        50, 8, 1, 2, 1, 12,
    ))];
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let err = model
        .generate_cached(
            &mut other,
            &[vec![1, 2]],
            &SamplingParams::greedy(2),
            &mut rng,
        )
        .unwrap_err();
    assert!(err.to_string().contains("another shape"), "{err}");
    let mut two = vec![model.new_cache(), model.new_cache()];
    assert!(model
        .generate_cached(
            &mut two,
            &[vec![1, 2]],
            &SamplingParams::greedy(2),
            &mut rng
        )
        .is_err());
}

/// Caches from two earlier calls (on the graph decoder: two batches'
/// caches), in another order, beside a dialogue with no cache yet: the
/// call equals encoding every context afresh.
#[test]
fn caches_from_several_calls_in_any_order_continue_their_dialogues() {
    for decoder in DECODERS {
        let model = fixture_model(decoder);
        let vocab = model.config.vocab_size as u32;
        let p = prompts(vocab);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let sampled = SamplingParams {
            max_new_tokens: 6,
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let mut first: Vec<SequenceCache> = (0..2).map(|_| model.new_cache()).collect();
        model
            .generate_cached(&mut first, &p[..2], &sampled, &mut rng)
            .unwrap();
        let mut second = vec![model.new_cache()];
        model
            .generate_cached(&mut second, &p[2..], &sampled, &mut rng)
            .unwrap();
        let grown = |c: &SequenceCache, i: usize| -> Vec<u32> {
            [c.tokens(), &observation(i, 1, vocab)].concat()
        };
        let newcomer: Vec<u32> = (0..17).map(|j| (j * 3 + 2) % vocab).collect();
        let contexts = vec![
            grown(&first[1], 0),
            newcomer,
            grown(&second[0], 1),
            grown(&first[0], 2),
        ];
        let mut caches = vec![
            first[1].clone(),
            model.new_cache(),
            second[0].clone(),
            first[0].clone(),
        ];
        drop((first, second));
        let what = format!("{decoder:?} caches of two calls");
        greedy_cached_equals_fresh(&model, &mut caches, &contexts, 5, &what);
        let seeded = |caches: &mut [SequenceCache]| {
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            model
                .generate_cached(caches, &contexts, &sampled, &mut rng)
                .unwrap()
        };
        let mut again = caches.clone();
        let fresh = seeded(
            &mut contexts
                .iter()
                .map(|_| model.new_cache())
                .collect::<Vec<_>>(),
        );
        let cached = seeded(&mut again);
        assert_same(&cached, &fresh, &what);
    }
}

/// The kept keys are really read, not encoded again: caches filled by one
/// model and continued by another of the same shape (what a cache must not
/// outlive: an optimizer step) give other log-probs than encoding afresh.
#[test]
fn a_later_turn_reads_the_kept_keys_instead_of_encoding_them() {
    for decoder in DECODERS {
        let filler = fixture_model(decoder);
        let vocab = filler.config.vocab_size as u32;
        let device = match decoder {
            Decoder::Host => Device::Cpu,
            Decoder::Graph => test_device(),
        };
        let mut other = PolicyModel::new_random(&filler.config, false, 4, &device).unwrap();
        other.set_graph_decode(matches!(decoder, Decoder::Graph));
        let contexts = prompts(vocab);
        let mut caches: Vec<SequenceCache> = (0..3).map(|_| filler.new_cache()).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        filler
            .generate_cached(&mut caches, &contexts, &SamplingParams::greedy(4), &mut rng)
            .unwrap();
        let next: Vec<Vec<u32>> = caches
            .iter()
            .enumerate()
            .map(|(i, c)| [c.tokens(), &observation(i, 0, vocab)].concat())
            .collect();
        let params = SamplingParams::greedy(3);
        let stale = other
            .generate_cached(&mut caches, &next, &params, &mut rng)
            .unwrap();
        let fresh = other.generate(&next, &params, &mut rng).unwrap();
        let gap = stale
            .iter()
            .zip(&fresh)
            .flat_map(|(s, f)| {
                s.logprobs
                    .iter()
                    .zip(&f.logprobs)
                    .map(|(a, b)| (a - b).abs())
            })
            .fold(0f32, f32::max);
        assert!(
            gap > 1e-3,
            "{decoder:?}: the stale keys changed nothing ({gap})"
        );
    }
}

/// A batch whose contexts repeat (a GRPO group's members), some with a
/// kept cache and some without: the graph decoder encodes each distinct
/// context once, and the members then draw their own replies and continue
/// from their own caches, as encoding every context afresh does.
#[test]
fn repeated_contexts_with_and_without_caches_continue_as_fresh_ones() {
    for decoder in DECODERS {
        let model = fixture_model(decoder);
        let vocab = model.config.vocab_size as u32;
        let p = prompts(vocab);
        let sampled = SamplingParams {
            max_new_tokens: 6,
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let mut first: Vec<SequenceCache> = (0..2).map(|_| model.new_cache()).collect();
        model
            .generate_cached(&mut first, &p[1..], &sampled, &mut rng)
            .unwrap();
        let a: Vec<u32> = [first[0].tokens(), &observation(0, 0, vocab)].concat();
        let b: Vec<u32> = [first[1].tokens(), &observation(1, 0, vocab)].concat();
        // a's twins: one without a cache, one from its own, one from b's
        // (which shares no token with a): the one with a cache leads.
        let contexts = vec![a.clone(), b.clone(), a.clone(), a, b];
        let mut caches = vec![
            model.new_cache(),
            first[1].clone(),
            first[0].clone(),
            first[1].clone(),
            model.new_cache(),
        ];
        let turn = |caches: &mut [SequenceCache], contexts: &[Vec<u32>], seed: u64| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let cached = model
                .generate_cached(caches, contexts, &sampled, &mut rng)
                .unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let fresh = model.generate(contexts, &sampled, &mut rng).unwrap();
            assert_same(&cached, &fresh, &format!("{decoder:?} repeated contexts"));
            cached
        };
        let got = turn(&mut caches, &contexts, 1);
        assert!(
            got[0].tokens != got[2].tokens || got[2].tokens != got[3].tokens,
            "{decoder:?}: the members drew one reply"
        );
        let next: Vec<Vec<u32>> = caches
            .iter()
            .enumerate()
            .map(|(i, c)| [c.tokens(), &observation(i, 1, vocab)].concat())
            .collect();
        turn(&mut caches, &next, 2);
    }
}

/// Two sequences continuing one dialogue from copies of its kept cache
/// (the same context from the same cached start): the turn is encoded
/// once, and the twin, which takes the leader's keys and values, samples
/// its reply as encoding it afresh does.
#[test]
fn twins_from_copies_of_one_kept_cache_continue_as_fresh_ones() {
    for decoder in DECODERS {
        let model = fixture_model(decoder);
        let vocab = model.config.vocab_size as u32;
        let sampled = SamplingParams {
            max_new_tokens: 6,
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut first = vec![model.new_cache()];
        model
            .generate_cached(&mut first, &prompts(vocab)[..1], &sampled, &mut rng)
            .unwrap();
        let context: Vec<u32> = [first[0].tokens(), &observation(0, 0, vocab)].concat();
        let contexts = vec![context.clone(), context];
        let mut caches = vec![first[0].clone(), first[0].clone()];
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let cached = model
            .generate_cached(&mut caches, &contexts, &sampled, &mut rng)
            .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let fresh = model.generate(&contexts, &sampled, &mut rng).unwrap();
        assert_same(&cached, &fresh, &format!("{decoder:?} twins"));
        assert_ne!(
            cached[0].tokens, cached[1].tokens,
            "{decoder:?}: one reply drawn"
        );
    }
}
