//! Batched KV-cache generation against full forward passes and one-by-one generation.

use agentrl_model::{Generation, PolicyModel, SamplingParams};
use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::device;
use crate::qwen2_tiny::{fixture_dir, reference, u32s};

fn fixture_model() -> PolicyModel {
    PolicyModel::load(&fixture_dir(), false, &Device::Cpu).unwrap()
}

fn fixture_ids() -> Vec<u32> {
    u32s(&reference()["input_ids"])
}

/// The one greedy or sampled continuation of `prompt`.
fn generate_one(
    model: &PolicyModel,
    prompt: &[u32],
    params: &SamplingParams,
    rng: &mut ChaCha8Rng,
) -> Generation {
    let prompts = [prompt.to_vec()];
    model.generate(&prompts, params, rng).unwrap().remove(0)
}

/// Ragged prompts cut from the fixture's chat ids.
fn ragged_prompts() -> Vec<Vec<u32>> {
    let ids = fixture_ids();
    vec![
        ids[..20].to_vec(),
        ids.clone(),
        ids[30..33].to_vec(),
        ids[5..50].to_vec(),
    ]
}

fn row_log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

#[test]
fn kv_cache_generation_equals_full_forward_token_by_token() {
    let model = fixture_model();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for prompt in ragged_prompts() {
        let gen = generate_one(&model, &prompt, &SamplingParams::greedy(12), &mut rng);
        assert_eq!(gen.tokens.len(), 12);
        let mut seq = prompt.clone();
        for (tok, lp) in gen.tokens.iter().zip(&gen.logprobs) {
            // Recompute the whole sequence without a cache.
            let input = Tensor::new(seq.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let logits = model.forward_no_grad(&input).unwrap();
            let last: Vec<f32> = logits
                .squeeze(0)
                .unwrap()
                .get(seq.len() - 1)
                .unwrap()
                .to_vec1()
                .unwrap();
            let lsm = row_log_softmax(&last);
            let best = (0..lsm.len()).fold(0, |b, i| if lsm[i] > lsm[b] { i } else { b });
            assert_eq!(
                *tok as usize, best,
                "greedy token differs from full forward"
            );
            assert!(
                (*lp as f64 - lsm[best]).abs() < 1e-4,
                "{lp} vs {}",
                lsm[best]
            );
            seq.push(*tok);
        }
    }
}

#[test]
fn batched_ragged_generation_equals_one_by_one() {
    let model = fixture_model();
    let prompts = ragged_prompts();
    let params = SamplingParams::greedy(16);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let batched = model.generate(&prompts, &params, &mut rng).unwrap();
    for (p, b) in prompts.iter().zip(&batched) {
        let single = generate_one(&model, p, &params, &mut rng);
        assert_eq!(b.tokens, single.tokens);
        for (x, y) in b.logprobs.iter().zip(&single.logprobs) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
    }
}

#[test]
fn independent_streams_sample_the_same_tokens_whatever_the_batch() {
    let model = fixture_model();
    let prompts = ragged_prompts();
    let params = SamplingParams {
        max_new_tokens: 16,
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let streams = |order: &[usize]| -> Vec<ChaCha8Rng> {
        order
            .iter()
            .map(|&i| ChaCha8Rng::seed_from_u64(100 + i as u64))
            .collect()
    };
    let order: Vec<usize> = (0..prompts.len()).collect();
    let batched = model
        .generate_independent(&prompts, &params, &mut streams(&order))
        .unwrap();
    // Reversed, and each alone: prompt i's tokens depend on its stream only.
    let reversed: Vec<usize> = order.iter().rev().copied().collect();
    let rev_prompts: Vec<Vec<u32>> = reversed.iter().map(|&i| prompts[i].clone()).collect();
    let rev = model
        .generate_independent(&rev_prompts, &params, &mut streams(&reversed))
        .unwrap();
    for (k, &i) in reversed.iter().enumerate() {
        assert_eq!(rev[k].tokens, batched[i].tokens, "prompt {i} reversed");
        let alone = model
            .generate_independent(
                std::slice::from_ref(&prompts[i]),
                &params,
                &mut streams(&[i]),
            )
            .unwrap()
            .remove(0);
        assert_eq!(alone.tokens, batched[i].tokens, "prompt {i} alone");
    }
    // Different streams draw different continuations (sampling is on).
    assert!(batched.windows(2).any(|w| w[0].tokens != w[1].tokens));
    let e = model
        .generate_independent(&prompts, &params, &mut streams(&[0]))
        .unwrap_err();
    assert!(
        e.to_string().contains("1 random streams for 4 prompts"),
        "{e}"
    );
}

#[test]
fn generated_logprobs_equal_sequence_logprobs_of_the_result() {
    let model = fixture_model();
    let prompts = ragged_prompts();
    let params = SamplingParams {
        max_new_tokens: 10,
        temperature: 0.7,
        top_p: 0.9,
        top_k: 50,
        stop_tokens: vec![],
    };
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let gens = model.generate(&prompts, &params, &mut rng).unwrap();
    let seqs: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&gens)
        .map(|(p, g)| p.iter().chain(&g.tokens).copied().collect())
        .collect();
    let out = model.sequence_logprobs(&seqs).unwrap();
    let lp: Vec<Vec<f32>> = out.logprobs.to_vec2().unwrap();
    for (i, (p, g)) in prompts.iter().zip(&gens).enumerate() {
        for (j, want) in g.logprobs.iter().enumerate() {
            let got = lp[i][p.len() - 1 + j];
            assert!(
                (got - want).abs() < 1e-4,
                "seq {i} tok {j}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn generation_stops_after_a_stop_token_and_includes_it() {
    let model = fixture_model();
    let prompt = fixture_ids();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let free = generate_one(&model, &prompt, &SamplingParams::greedy(10), &mut rng);
    let stop = free.tokens[3];
    let first = free.tokens.iter().position(|&t| t == stop).unwrap();
    let params = SamplingParams {
        stop_tokens: vec![stop],
        ..SamplingParams::greedy(10)
    };
    let g = generate_one(&model, &prompt, &params, &mut rng);
    assert!(g.stopped);
    assert_eq!(g.tokens, free.tokens[..=first].to_vec());
    assert_eq!(g.logprobs.len(), g.tokens.len());
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let model = fixture_model();
    let prompts = ragged_prompts();
    let params = SamplingParams {
        max_new_tokens: 12,
        ..SamplingParams::default()
    };
    let run = |seed| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        model.generate(&prompts, &params, &mut rng).unwrap()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(
        run(1).iter().map(|g| g.tokens.clone()).collect::<Vec<_>>(),
        run(2).iter().map(|g| g.tokens.clone()).collect::<Vec<_>>()
    );
}

#[test]
fn generation_rejects_out_of_vocab_ids_and_overlong_requests() {
    let model = fixture_model();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let bad = model.generate(&[vec![1, 999]], &SamplingParams::greedy(2), &mut rng);
    assert!(bad.unwrap_err().to_string().contains("999"));
    let long = model.generate(&[vec![1; 500]], &SamplingParams::greedy(100), &mut rng);
    assert!(long.is_err());
    let empty = model.generate(&[vec![]], &SamplingParams::greedy(2), &mut rng);
    assert!(empty.is_err());
}

#[test]
fn generation_builds_no_autograd_graph() {
    // A gradient of anything computed from generate's outputs is impossible
    // by construction (host vectors); check the internal forward too.
    let model = fixture_model();
    let input = Tensor::new(&[1u32, 2, 3], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = model.forward_no_grad(&input).unwrap();
    let grads = logits.sum_all().unwrap().backward().unwrap();
    for v in model.trainable_vars().unwrap() {
        assert!(grads.get(v.as_tensor()).is_none());
    }
}

/// The graph decoder (what runs off the CPU) against the host decoder on
/// ragged prompts: greedy with a stop token one prompt meets early (so a
/// finished row rides along in the batch), seeded sampling with top-k, and
/// plain seeded sampling. On `AGENTRL_TEST_DEVICE=cuda` the graph side runs
/// on the GPU, where greedy and plain sampling choose there
/// (`kernels/sample.cu`) with the host's uniform draws.
#[test]
fn graph_decode_on_the_test_device_equals_the_host_decoder() {
    let host = fixture_model();
    let mut graph = PolicyModel::load(&fixture_dir(), false, &device::test_device()).unwrap();
    graph.set_graph_decode(true);
    let prompts = ragged_prompts();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let free = host
        .generate(&prompts, &SamplingParams::greedy(10), &mut rng)
        .unwrap();
    let stop = free[2].tokens[3];
    let greedy = SamplingParams {
        stop_tokens: vec![stop],
        ..SamplingParams::greedy(10)
    };
    let sampled = SamplingParams {
        max_new_tokens: 10,
        temperature: 0.8,
        top_k: 20,
        ..SamplingParams::default()
    };
    let plain = SamplingParams {
        max_new_tokens: 10,
        temperature: 0.8,
        ..SamplingParams::default()
    };
    for params in [greedy, sampled, plain] {
        let want = host
            .generate(&prompts, &params, &mut ChaCha8Rng::seed_from_u64(7))
            .unwrap();
        let got = graph
            .generate(&prompts, &params, &mut ChaCha8Rng::seed_from_u64(7))
            .unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "prompt {i}, {params:?}");
            assert_eq!(g.stopped, w.stopped, "prompt {i}");
            for (a, b) in g.logprobs.iter().zip(&w.logprobs) {
                assert!((a - b).abs() < 1e-4, "prompt {i}: logprob {a} vs {b}");
            }
        }
    }
    // The stop token ends prompt 2 early while the others run on.
    let g = graph
        .generate(
            &prompts,
            &SamplingParams {
                stop_tokens: vec![stop],
                ..SamplingParams::greedy(10)
            },
            &mut rng,
        )
        .unwrap();
    assert!(g[2].stopped && g[2].tokens.len() <= 4);
    assert!(g.iter().any(|x| x.tokens.len() == 10));
}

/// A batch whose prompts repeat (a GRPO group's members on their first
/// turn) encodes each distinct prompt once and copies its keys and values:
/// the draws, the log-probs and a second turn from the kept caches are
/// those of the graph decoder, which encodes every prompt.
#[test]
fn repeated_prompts_are_encoded_once_and_continue_from_their_own_caches() {
    let host = fixture_model();
    let mut graph = fixture_model();
    graph.set_graph_decode(true);
    let ids = fixture_ids();
    let (a, b) = (ids[..40].to_vec(), ids[3..30].to_vec());
    let prompts = vec![a.clone(), b.clone(), a.clone(), a, b];
    let sampled = SamplingParams {
        max_new_tokens: 8,
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let mut caches: Vec<_> = prompts.iter().map(|_| host.new_cache()).collect();
    let got = host
        .generate_cached(
            &mut caches,
            &prompts,
            &sampled,
            &mut ChaCha8Rng::seed_from_u64(3),
        )
        .unwrap();
    let want = graph
        .generate(&prompts, &sampled, &mut ChaCha8Rng::seed_from_u64(3))
        .unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "prompt {i}");
        for (x, y) in g.logprobs.iter().zip(&w.logprobs) {
            assert!((x - y).abs() < 1e-4, "prompt {i}: {x} vs {y}");
        }
    }
    // Members of a group draw different replies to one prompt.
    assert!(got[0].tokens != got[2].tokens || got[0].tokens != got[3].tokens);
    // Second turn: each dialogue grows by its reply and an observation.
    let turn2: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&got)
        .map(|(p, g)| [&p[..], &g.tokens[..], &ids[50..56]].concat())
        .collect();
    let greedy = SamplingParams::greedy(6);
    let got2 = host
        .generate_cached(
            &mut caches,
            &turn2,
            &greedy,
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
    let want2 = graph
        .generate(&turn2, &greedy, &mut ChaCha8Rng::seed_from_u64(0))
        .unwrap();
    for (i, (g, w)) in got2.iter().zip(&want2).enumerate() {
        assert_eq!(g.tokens, w.tokens, "turn 2, dialogue {i}");
        for (x, y) in g.logprobs.iter().zip(&w.logprobs) {
            assert!((x - y).abs() < 1e-4, "turn 2, dialogue {i}: {x} vs {y}");
        }
    }
}
