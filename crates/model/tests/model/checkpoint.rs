//! Saving and loading Hugging Face checkpoint directories, and their errors.

use std::collections::HashMap;
use std::path::Path;

use agentrl_model::{ModelConfig, ModelError, PolicyModel};
use candle_core::{DType, Device, Tensor};

use crate::qwen2_tiny::fixture_dir;

fn logits(model: &PolicyModel) -> Vec<Vec<f32>> {
    let ids: Vec<u32> = (0..24)
        .map(|i| (i * 7 + 3) % model.config.vocab_size as u32)
        .collect();
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    model
        .forward(&input)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2()
        .unwrap()
}

fn values(model: &PolicyModel) -> Vec<Vec<f32>> {
    let out = model
        .sequence_logprobs(&[vec![1, 2, 3, 4], vec![5, 6]])
        .unwrap();
    out.values.unwrap().to_vec2().unwrap()
}

fn fixture_tensors() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture_dir().join("model.safetensors"), &Device::Cpu).unwrap()
}

/// A copy of the fixture's config.json in `dir` with `tensors` as model.safetensors.
fn write_checkpoint(dir: &Path, tensors: &HashMap<String, Tensor>) {
    std::fs::copy(fixture_dir().join("config.json"), dir.join("config.json")).unwrap();
    candle_core::safetensors::save(tensors, dir.join("model.safetensors")).unwrap();
}

/// A fresh directory holding a copy of the fixture's file `name`.
fn dir_with_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture_dir().join(name), dir.path().join(name)).unwrap();
    dir
}

/// `PolicyModel::load` of `dir`, which must fail.
fn load_error(dir: &Path) -> ModelError {
    PolicyModel::load(dir, false, &Device::Cpu).unwrap_err()
}

/// The error of loading `dir`, checked to name `what` (a tensor or a file).
fn load_error_naming(dir: &Path, what: &str) -> ModelError {
    let err = load_error(dir);
    assert!(err.to_string().contains(what), "{err}");
    err
}

fn llama_config() -> ModelConfig {
    let mut c = ModelConfig::new_qwen2(50, 16, 2, 4, 2, 40);
    c.model_type = "llama".to_string();
    c.tie_word_embeddings = false;
    c.extra.insert(
        "architectures".into(),
        serde_json::json!(["LlamaForCausalLM"]),
    );
    c
}

#[test]
fn saved_then_loaded_model_gives_identical_logits() {
    for (config, vh) in [(ModelConfig::tiny(97), true), (llama_config(), false)] {
        let model = PolicyModel::new_random(&config, vh, 3, &Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        model.save(dir.path()).unwrap();
        let back = PolicyModel::load(dir.path(), vh, &Device::Cpu).unwrap();
        assert_eq!(back.config.model_type, config.model_type);
        assert_eq!(logits(&model), logits(&back));
        if vh {
            assert_eq!(values(&model), values(&back));
        }
    }
}

#[test]
fn saved_tensor_names_follow_hugging_face() {
    let dir = tempfile::tempdir().unwrap();
    let tied = PolicyModel::new_random(&ModelConfig::tiny(64), true, 1, &Device::Cpu).unwrap();
    tied.save(dir.path()).unwrap();
    let t =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(t.contains_key("model.embed_tokens.weight"));
    assert!(t.contains_key("model.layers.3.self_attn.q_proj.bias"));
    assert!(t.contains_key("model.layers.0.mlp.down_proj.weight"));
    assert!(t.contains_key("value_head.weight") && t.contains_key("value_head.bias"));
    assert!(
        !t.contains_key("lm_head.weight"),
        "tied embeddings must not save lm_head"
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["model_type"], "qwen2");
    assert_eq!(cfg["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(cfg["tie_word_embeddings"], true);
    assert_eq!(cfg["num_key_value_heads"], 2);
    assert_eq!(cfg["rope_theta"], 10000.0);
    assert_eq!(cfg["rope_parameters"]["rope_theta"], 10000.0);
    // transformers derives head_dim itself; a null would not be accepted everywhere.
    assert!(cfg.get("head_dim").is_none());

    let untied = PolicyModel::new_random(&llama_config(), false, 1, &Device::Cpu).unwrap();
    untied.save(dir.path()).unwrap();
    let t =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(t.contains_key("lm_head.weight"));
    assert!(!t.contains_key("model.layers.0.self_attn.q_proj.bias"));
}

#[test]
fn same_seed_gives_same_weights_and_different_seed_differs() {
    let c = ModelConfig::tiny(40);
    let a = PolicyModel::new_random(&c, false, 9, &Device::Cpu).unwrap();
    let b = PolicyModel::new_random(&c, false, 9, &Device::Cpu).unwrap();
    let d = PolicyModel::new_random(&c, false, 10, &Device::Cpu).unwrap();
    assert_eq!(logits(&a), logits(&b));
    assert_ne!(logits(&a), logits(&d));
}

#[test]
fn fixture_round_trip_keeps_logits_and_adds_value_head() {
    let model = PolicyModel::load(&fixture_dir(), true, &Device::Cpu).unwrap();
    assert!(model.has_value_head());
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let back = PolicyModel::load(dir.path(), true, &Device::Cpu).unwrap();
    assert_eq!(logits(&model), logits(&back));
    assert_eq!(values(&model), values(&back));
    let plain = PolicyModel::load(&fixture_dir(), false, &Device::Cpu).unwrap();
    assert_eq!(logits(&plain), logits(&back));
}

#[test]
fn sharded_checkpoint_loads_like_the_single_file() {
    let tensors = fixture_tensors();
    let dir = dir_with_fixture("config.json");
    let mut shards = [HashMap::new(), HashMap::new()];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, t)) in tensors.iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i % 2 + 1);
        weight_map.insert(name.clone(), serde_json::json!(file));
        shards[i % 2].insert(name.clone(), t.clone());
    }
    for (i, s) in shards.iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        candle_core::safetensors::save(s, dir.path().join(file)).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let sharded = PolicyModel::load(dir.path(), false, &Device::Cpu).unwrap();
    let single = PolicyModel::load(&fixture_dir(), false, &Device::Cpu).unwrap();
    assert_eq!(logits(&sharded), logits(&single));
}

#[test]
fn bf16_and_f16_checkpoints_load_as_exact_f32() {
    for half in [DType::BF16, DType::F16] {
        let halves: HashMap<String, Tensor> = fixture_tensors()
            .into_iter()
            .map(|(n, t)| (n, t.to_dtype(half).unwrap()))
            .collect();
        // The same values widened to f32 beforehand must give the very same model.
        let widened: HashMap<String, Tensor> = halves
            .iter()
            .map(|(n, t)| (n.clone(), t.to_dtype(DType::F32).unwrap()))
            .collect();
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_checkpoint(d1.path(), &halves);
        write_checkpoint(d2.path(), &widened);
        let model = PolicyModel::load(d1.path(), false, &Device::Cpu).unwrap();
        assert_eq!(model.dtype(), DType::F32);
        for v in model.trainable_vars().unwrap() {
            assert_eq!(v.dtype(), DType::F32);
        }
        let reference = PolicyModel::load(d2.path(), false, &Device::Cpu).unwrap();
        assert_eq!(logits(&model), logits(&reference), "{half:?}");
    }
}

#[test]
fn wrong_shape_error_names_the_tensor_and_file() {
    let mut tensors = fixture_tensors();
    let name = "model.layers.1.self_attn.k_proj.weight";
    tensors.insert(
        name.to_string(),
        Tensor::zeros((3, 64), DType::F32, &Device::Cpu).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &tensors);
    let err = load_error(dir.path());
    assert!(matches!(err, ModelError::ShapeMismatch { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(name) && msg.contains("model.safetensors"),
        "{msg}"
    );
}

#[test]
fn missing_tensor_error_names_the_tensor() {
    let mut tensors = fixture_tensors();
    let name = "model.layers.0.mlp.up_proj.weight";
    tensors.remove(name);
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &tensors);
    let err = load_error_naming(dir.path(), name);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
}

#[test]
fn corrupt_file_error_names_the_file() {
    let dir = dir_with_fixture("config.json");
    let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("model.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let err = load_error_naming(dir.path(), "model.safetensors");
    assert!(matches!(err, ModelError::CorruptFile { .. }), "{err:?}");
}

#[test]
fn bad_config_json_error_names_the_file() {
    let dir = dir_with_fixture("model.safetensors");
    for bad in [
        "{not json",
        r#"{"vocab_size": 10}"#,
        r#"{"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 2}"#,
    ] {
        std::fs::write(dir.path().join("config.json"), bad).unwrap();
        let err = load_error_naming(dir.path(), "config.json");
        assert!(matches!(err, ModelError::Config { .. }), "{err:?}");
    }
}

#[test]
fn missing_weights_file_error_names_the_file() {
    let dir = dir_with_fixture("config.json");
    load_error_naming(dir.path(), "model.safetensors");
}
