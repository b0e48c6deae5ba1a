//! GGUF files as a model source: the qwen2-tiny fixture and a llama model
//! written as GGUF (by `gguf_writer`, llama.cpp's layout) load to the logits
//! of their safetensors checkpoints.

use std::collections::HashMap;
use std::path::Path;

use agentrl_model::{ModelConfig, PolicyModel};
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::SeedableRng;

use crate::gguf_writer::{matrices_in, write_file, write_gguf, GgufOptions};
use crate::qwen2_tiny::fixture_dir;

/// Logits `[T, V]` of a fixed sequence.
fn logits(model: &PolicyModel) -> Vec<Vec<f32>> {
    let ids: Vec<u32> = (0..20)
        .map(|i| (i * 11 + 5) % model.config.vocab_size as u32)
        .collect();
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    model
        .forward_no_grad(&input)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2()
        .unwrap()
}

fn load(path: &Path) -> PolicyModel {
    PolicyModel::load(path, false, &Device::Cpu)
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// max |a - b| over max |b|.
fn relative_gap(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let gap = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let scale = b.iter().flatten().map(|y| y.abs()).fold(0f32, f32::max);
    gap / scale
}

/// A copy of the checkpoint `dir` whose 2-D weights went through `dtype`
/// and back (`QTensor::quantize` then `dequantize`, rows that a block does
/// not divide left as they are): the weights a GGUF of that type holds.
fn dequantised_copy(dir: &Path, dtype: GgmlDType) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("config.json"), out.path().join("config.json")).unwrap();
    let stored = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(name, t)| {
            let rows_fit = t.dims().len() == 2 && t.dims()[1] % dtype.block_size() == 0;
            let t = if rows_fit {
                QTensor::quantize(&t, dtype)
                    .unwrap()
                    .dequantize(&Device::Cpu)
                    .unwrap()
            } else {
                t
            };
            (name, t)
        })
        .collect::<HashMap<_, _>>();
    candle_core::safetensors::save(&stored, out.path().join("model.safetensors")).unwrap();
    out
}

#[test]
fn gguf_in_f32_gives_the_safetensors_logits_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("qwen2-tiny.f32.gguf");
    write_gguf(&fixture_dir(), &gguf, &GgufOptions::f32("qwen2"));
    let from_gguf = load(&gguf);
    let from_dir = load(&fixture_dir());
    assert_eq!(from_gguf.config.vocab_size, 384);
    assert!(from_gguf.config.tie_word_embeddings);
    assert_eq!(logits(&from_gguf), logits(&from_dir));
}

#[test]
fn quantised_gguf_gives_the_logits_of_its_dequantised_weights() {
    // The fixture's rows are 64 and 176 wide: the 32-blocks fit the 64-wide
    // rows (everything but down_proj); the k-quants' 256-blocks fit none.
    // Bound on max |Δlogit| / max |logit| against the f32 model, about
    // twice what was measured (2026-11-27: F16 1.6e-3, BF16 1.5e-2, Q8_0
    // 4.8e-2, Q4_0 0.54, Q4_1 0.68: the fixture's random weights have no
    // structure for 4 bits to keep).
    let cases = [
        (GgmlDType::F16, 4e-3),
        (GgmlDType::BF16, 3e-2),
        (GgmlDType::Q8_0, 0.1),
        (GgmlDType::Q4_0, 1.0),
        (GgmlDType::Q4_1, 1.2),
    ];
    let reference = logits(&load(&fixture_dir()));
    let mut gaps = Vec::new();
    for (dtype, bound) in cases {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("qwen2-tiny.gguf");
        let opts = GgufOptions {
            dtype: matrices_in(dtype),
            ..GgufOptions::f32("qwen2")
        };
        write_gguf(&fixture_dir(), &gguf, &opts);
        let got = logits(&load(&gguf));
        let expected = logits(&load(dequantised_copy(&fixture_dir(), dtype).path()));
        assert_eq!(got, expected, "{dtype:?}");
        let gap = relative_gap(&got, &reference);
        eprintln!("{dtype:?}: max |Δlogit| / max |logit| = {gap:.2e}");
        assert!(gap > 0.0 && gap < bound, "{dtype:?}: {gap}");
        gaps.push(gap);
    }
    // Fewer bits, further from the f32 logits.
    assert!(gaps[0] < gaps[1] && gaps[1] < gaps[2], "{gaps:?}");
    assert!(gaps[2] < gaps[3].min(gaps[4]), "{gaps:?}");
}

/// An untied llama checkpoint (no q/k/v biases) whose rows fit the
/// k-quants' 256-blocks: d 256, 4 query heads and 2 key/value heads of
/// width 64, ffn 512.
fn llama_checkpoint() -> tempfile::TempDir {
    let config = ModelConfig {
        model_type: "llama".into(),
        tie_word_embeddings: false,
        ..ModelConfig::new_qwen2(300, 256, 2, 4, 2, 512)
    };
    let model = PolicyModel::new_random(&config, false, 7, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    dir
}

#[test]
fn llama_gguf_has_its_q_and_k_rows_put_back_in_hugging_face_order() {
    let hf = llama_checkpoint();
    let reference = logits(&load(hf.path()));
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("llama.gguf");
    let opts = GgufOptions {
        tokenizer: false,
        ..GgufOptions::f32("llama")
    };
    write_gguf(hf.path(), &gguf, &opts);
    let from_gguf = load(&gguf);
    assert_eq!(from_gguf.config.model_type, "llama");
    assert!(!from_gguf.config.qkv_bias());
    assert!(!from_gguf.config.tie_word_embeddings);
    assert_eq!(logits(&from_gguf), reference);

    // Without llama.cpp's permutation in the file, the loader's
    // un-permutation scrambles the heads: it is what makes the two equal.
    let unpermuted = dir.path().join("unpermuted.gguf");
    let opts = GgufOptions {
        tokenizer: false,
        llama_permute: false,
        ..GgufOptions::f32("llama")
    };
    write_gguf(hf.path(), &unpermuted, &opts);
    assert!(relative_gap(&logits(&load(&unpermuted)), &reference) > 1e-2);
}

#[test]
fn k_quantised_llama_gguf_gives_the_logits_of_its_dequantised_weights() {
    // Bound on max |Δlogit| / max |logit| against the f32 model, about
    // twice what was measured on this random model (2026-11-27: Q4_K 0.20,
    // Q5_K 8.9e-2, Q6_K 4.7e-2).
    let hf = llama_checkpoint();
    let reference = logits(&load(hf.path()));
    let mut gaps = Vec::new();
    for (dtype, bound) in [
        (GgmlDType::Q4K, 0.4),
        (GgmlDType::Q5K, 0.2),
        (GgmlDType::Q6K, 0.1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("llama.gguf");
        let opts = GgufOptions {
            dtype: matrices_in(dtype),
            tokenizer: false,
            ..GgufOptions::f32("llama")
        };
        write_gguf(hf.path(), &gguf, &opts);
        let got = logits(&load(&gguf));
        let expected = logits(&load(dequantised_copy(hf.path(), dtype).path()));
        assert_eq!(got, expected, "{dtype:?}");
        let gap = relative_gap(&got, &reference);
        eprintln!("{dtype:?}: max |Δlogit| / max |logit| = {gap:.2e}");
        assert!(gap > 0.0 && gap < bound, "{dtype:?}: {gap}");
        gaps.push(gap);
    }
    assert!(gaps[0] > gaps[1] && gaps[1] > gaps[2], "{gaps:?}");
}

#[test]
fn the_configuration_comes_from_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("qwen2-tiny.gguf");
    write_gguf(&fixture_dir(), &gguf, &GgufOptions::f32("qwen2"));
    let ours = ModelConfig::from_source(&gguf).unwrap();
    let theirs = ModelConfig::from_source(&fixture_dir()).unwrap();
    assert_eq!(ours.model_type, theirs.model_type);
    assert_eq!(ours.vocab_size, theirs.vocab_size);
    assert_eq!(ours.hidden_size, theirs.hidden_size);
    assert_eq!(ours.intermediate_size, theirs.intermediate_size);
    assert_eq!(ours.num_hidden_layers, theirs.num_hidden_layers);
    assert_eq!(ours.num_attention_heads, theirs.num_attention_heads);
    assert_eq!(ours.num_kv_heads(), theirs.num_kv_heads());
    assert_eq!(ours.head_dim(), theirs.head_dim());
    assert_eq!(ours.rope_theta(), theirs.rope_theta());
    assert_eq!(ours.max_position_embeddings, theirs.max_position_embeddings);
    assert_eq!(ours.tie_word_embeddings, theirs.tie_word_embeddings);
    assert_eq!(ours.qkv_bias(), theirs.qkv_bias());
    // Stored as f32, as llama.cpp stores it.
    assert_eq!(ours.rms_norm_eps, f64::from(theirs.rms_norm_eps as f32));
    assert_eq!(ours.extra["eos_token_id"], serde_json::json!(2));
}

#[test]
fn a_model_loaded_from_gguf_saves_as_a_hugging_face_directory() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("qwen2-tiny.gguf");
    let opts = GgufOptions {
        dtype: matrices_in(GgmlDType::Q8_0),
        ..GgufOptions::f32("qwen2")
    };
    write_gguf(&fixture_dir(), &gguf, &opts);
    let model = load(&gguf);
    let saved = dir.path().join("saved");
    model.save(&saved).unwrap();
    assert!(saved.join("model.safetensors").is_file());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "qwen2");
    assert_eq!(
        config["architectures"],
        serde_json::json!(["Qwen2ForCausalLM"])
    );
    assert_eq!(logits(&load(&saved)), logits(&model));
}

/// The error of loading a GGUF written from the fixture with `meta` and
/// `tensors` edited.
fn load_edited_error(
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>),
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.gguf");
    write_gguf(&fixture_dir(), &whole, &GgufOptions::f32("qwen2"));
    let mut file = std::fs::File::open(&whole).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut meta: Vec<(String, Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| {
            (
                n.clone(),
                content.tensor(&mut file, n, &Device::Cpu).unwrap(),
            )
        })
        .collect();
    edit(&mut meta, &mut tensors);
    let edited = dir.path().join("edited.gguf");
    write_file(&edited, &meta, &tensors);
    PolicyModel::load(&edited, false, &Device::Cpu)
        .unwrap_err()
        .to_string()
}

#[test]
fn what_the_loader_does_not_implement_is_an_error_naming_it() {
    let arch = load_edited_error(|meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("gemma2".into());
            }
        }
    });
    assert!(arch.contains("general.architecture `gemma2`"), "{arch}");

    let extra = load_edited_error(|_, tensors| {
        let freqs = Tensor::ones(8, candle_core::DType::F32, &Device::Cpu).unwrap();
        tensors.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&freqs, GgmlDType::F32).unwrap(),
        ));
    });
    assert!(extra.contains("rope_freqs.weight"), "{extra}");

    let missing = load_edited_error(|_, tensors| {
        tensors.retain(|(n, _)| n != "blk.1.ffn_up.weight");
    });
    assert!(
        missing.contains("model.layers.1.mlp.up_proj.weight"),
        "{missing}"
    );

    let partial_rotary = load_edited_error(|meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "qwen2.rope.dimension_count" {
                *v = Value::U32(8);
            }
        }
    });
    assert!(
        partial_rotary.contains("rope.dimension_count"),
        "{partial_rotary}"
    );

    let missing_file = PolicyModel::load(Path::new("/nonexistent/model.gguf"), false, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        missing_file.contains("/nonexistent/model.gguf"),
        "{missing_file}"
    );
}

/// SmolLM2-135M-Instruct's GGUF, when `AGENTRL_SMOLLM2_GGUF` names it
/// (`scripts/fetch-smollm2.sh`); `None` with a note otherwise.
fn smollm2_gguf() -> Option<std::path::PathBuf> {
    match std::env::var_os("AGENTRL_SMOLLM2_GGUF") {
        Some(p) => Some(p.into()),
        None => {
            eprintln!(
                "skipped: AGENTRL_SMOLLM2_GGUF is not set (scripts/fetch-smollm2.sh fetches SmolLM2's GGUF)"
            );
            None
        }
    }
}

#[test]
fn smollm2_gguf_greedy_ids_match_transformers() {
    let Some(path) = smollm2_gguf() else {
        return;
    };
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/smollm2-reference.json"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let model = load(&path);
    let c = &model.config;
    assert_eq!(
        (c.model_type.as_str(), c.num_hidden_layers, c.hidden_size),
        ("llama", 30, 576)
    );
    assert_eq!((c.num_attention_heads, c.num_kv_heads()), (9, 3));
    assert_eq!(c.vocab_size, 49_152);
    assert!(c.tie_word_embeddings);

    let prompt = crate::qwen2_tiny::u32s(&r["prompt_ids"]);
    let expected = crate::qwen2_tiny::u32s(&r["greedy_new_ids"]);
    let params = agentrl_model::SamplingParams {
        max_new_tokens: expected.len(),
        temperature: 0.0,
        // <|im_end|> and <|endoftext|>, as agentrl generate stops.
        stop_tokens: vec![2, 0],
        ..Default::default()
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let generation = model
        .generate(std::slice::from_ref(&prompt), &params, &mut rng)
        .unwrap()
        .remove(0);
    assert_eq!(generation.tokens, expected);

    // The last prompt position's 20 largest logits, to float rounding:
    // transformers' smallest top-2 margin on the greedy path is far above it.
    let input = Tensor::new(prompt.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let last: Vec<f32> = model
        .forward_no_grad(&input)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .get(prompt.len() - 1)
        .unwrap()
        .to_vec1()
        .unwrap();
    for pair in r["logits_last_top"].as_array().unwrap() {
        let (id, value) = (
            pair[0].as_u64().unwrap() as usize,
            pair[1].as_f64().unwrap(),
        );
        let gap = (f64::from(last[id]) - value).abs();
        assert!(gap < 1e-3, "token {id}: {} vs {value}", last[id]);
    }
    assert!(r["greedy_min_top2_gap"].as_f64().unwrap() > 0.01);
}
