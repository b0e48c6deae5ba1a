//! LoRA adapters: gradients of A and B against finite differences (f64, on
//! the fused and the composite path), frozen base weights under AdamW, an
//! adapter with B = 0 giving exactly the base model, PEFT files read back
//! bit for bit, merging, and bad adapter files named.

use std::collections::HashMap;
use std::path::Path;

use agentrl_model::lora::{ADAPTER_CONFIG_FILE, ADAPTER_DIR, ADAPTER_WEIGHTS_FILE};
use agentrl_model::{LoraConfig, LoraTarget, ModelConfig, PolicyModel, SamplingParams};
use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::finite_difference::{
    assert_gradient_matches, fit_two_sequences, logprob_entropy_objective, values, var_names,
};

fn small_config() -> ModelConfig {
    let mut c = ModelConfig::new_qwen2(13, 8, 2, 2, 1, 12);
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 16;
    // Larger weights than 0.02 so that the layers are far from linear.
    c.initializer_range = 0.5;
    c
}

fn lora_config(targets: &[LoraTarget]) -> LoraConfig {
    LoraConfig {
        r: 2,
        alpha: 3.0,
        dropout: 0.0,
        target_modules: targets.to_vec(),
        use_rslora: false,
    }
}

/// The largest elementwise difference of `a` and `b`.
fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

const SEQS: [&[u32]; 2] = [&[1, 5, 7, 2, 11, 3], &[4, 12, 0]];

fn seqs() -> Vec<Vec<u32>> {
    SEQS.iter().map(|s| s.to_vec()).collect()
}

/// Weighted log-probs plus entropies: a scalar that depends on every weight.
fn objective(model: &PolicyModel) -> Tensor {
    logprob_entropy_objective(model, &seqs())
}

/// Sets every B of the adapter to seeded values, so A's gradient is not zero.
fn randomise_b(model: &PolicyModel, seed: u64) {
    use rand::Rng;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (name, var) in model.lora().unwrap().named_vars() {
        if name.ends_with("lora_B.weight") {
            let v: Vec<f64> = (0..var.elem_count())
                .map(|_| rng.random_range(-0.5..0.5))
                .collect();
            let t = Tensor::from_vec(v, var.dims(), &Device::Cpu)
                .unwrap()
                .to_dtype(var.dtype())
                .unwrap();
            var.set(&t).unwrap();
        }
    }
}

#[test]
fn adapter_gradients_match_finite_differences_and_the_base_gets_none() {
    // Every projection, and two whose outputs are columns inside the
    // layer's fused products (k within q|k|v, up within gate|up).
    let some = [LoraTarget::KProj, LoraTarget::UpProj];
    for (fused, targets) in [
        (true, &LoraTarget::ALL[..]),
        (true, &some),
        (false, &LoraTarget::ALL),
    ] {
        let mut model =
            PolicyModel::new_random_with_dtype(&small_config(), true, 7, DType::F64, &Device::Cpu)
                .unwrap();
        model.set_fused_training(fused);
        model.attach_lora(lora_config(targets), 11).unwrap();
        randomise_b(&model, 3);
        let grads = objective(&model).backward().unwrap();
        for (name, var) in model.named_vars().unwrap() {
            let is_head = name.starts_with("value_head");
            // The value head stays trainable but this objective does not read it.
            assert!(
                grads.get(var.as_tensor()).is_none() || is_head,
                "base weight {name} got a gradient (fused {fused})"
            );
        }
        for (name, var) in model.lora().unwrap().named_vars() {
            let what = format!("{name} (fused {fused})");
            let picks = |n: usize| (0..n).step_by((n / 5).max(1));
            assert_gradient_matches(&what, &var, &grads, picks, || {
                objective(&model).to_scalar::<f64>().unwrap()
            });
        }
    }
}

#[test]
fn adamw_trains_only_the_adapter_and_the_base_stays_bit_identical() {
    let cfg = ModelConfig::tiny(16);
    let mut model = PolicyModel::new_random(&cfg, true, 4, &Device::Cpu).unwrap();
    let base_before: Vec<(String, Vec<f64>)> = model
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, values(v.as_tensor())))
        .collect();
    let targets = [LoraTarget::QProj, LoraTarget::VProj, LoraTarget::DownProj];
    model.attach_lora(lora_config(&targets), 1).unwrap();
    let trainable = var_names(model.trainable_named_vars().unwrap());
    // A and B of 3 projections in 4 layers, and the value head.
    assert_eq!(trainable.len(), 2 * 3 * 4 + 2, "{trainable:?}");
    assert!(trainable
        .iter()
        .all(|n| n.contains(".lora_") || n.starts_with("value_head")));
    assert!(
        trainable.contains(&"base_model.model.model.layers.3.mlp.down_proj.lora_B.weight".into())
    );
    let adapter_before: Vec<Vec<f64>> = model
        .lora()
        .unwrap()
        .named_vars()
        .iter()
        .map(|(_, v)| values(v.as_tensor()))
        .collect();
    let (first, last) = fit_two_sequences(&model, 10);
    assert!(last < first, "the adapter did not learn: {first} -> {last}");
    for ((name, before), (_, var)) in base_before.iter().zip(model.named_vars().unwrap()) {
        assert_eq!(before, &values(var.as_tensor()), "{name} moved");
    }
    for ((name, var), before) in model
        .lora()
        .unwrap()
        .named_vars()
        .iter()
        .zip(adapter_before)
    {
        assert_ne!(before, values(var.as_tensor()), "{name} was not trained");
    }
}

#[test]
fn an_adapter_with_b_zero_gives_exactly_the_base_outputs() {
    let mut model =
        PolicyModel::new_random(&ModelConfig::tiny(16), false, 2, &Device::Cpu).unwrap();
    let ids = Tensor::new(&[[1u32, 4, 9, 2, 7]], &Device::Cpu).unwrap();
    let greedy = SamplingParams {
        max_new_tokens: 6,
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let outputs = |m: &PolicyModel| {
        let lp = m.sequence_logprobs(&seqs()).unwrap();
        let generation = m
            .generate(&[vec![3, 1, 4]], &greedy, &mut ChaCha8Rng::seed_from_u64(0))
            .unwrap();
        (
            values(&m.forward_no_grad(&ids).unwrap()),
            values(&lp.logprobs),
            values(&lp.entropy),
            generation[0].logprobs.clone(),
        )
    };
    let base = outputs(&model);
    model.attach_lora(lora_config(&LoraTarget::ALL), 5).unwrap();
    assert_eq!(outputs(&model), base);
}

fn adapted_model() -> PolicyModel {
    let mut model = PolicyModel::new_random(&small_config(), false, 9, &Device::Cpu).unwrap();
    model
        .attach_lora(lora_config(&[LoraTarget::KProj, LoraTarget::UpProj]), 4)
        .unwrap();
    randomise_b(&model, 8);
    model
}

#[test]
fn a_saved_adapter_loads_back_exactly_and_merges_into_the_base() {
    let model = adapted_model();
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let adapter = dir.path().join(ADAPTER_DIR);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(adapter.join(ADAPTER_CONFIG_FILE)).unwrap())
            .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["task_type"], "CAUSAL_LM");
    assert_eq!(config["r"], 2);
    assert_eq!(config["lora_alpha"], 3.0);
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["k_proj", "up_proj"])
    );
    let tensors =
        candle_core::safetensors::load(adapter.join(ADAPTER_WEIGHTS_FILE), &Device::Cpu).unwrap();
    let a = &tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"];
    let b = &tensors["base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"];
    assert_eq!((a.dims(), b.dims()), (&[2, 8][..], &[12, 2][..]));
    assert_eq!(tensors.len(), 2 * 2 * 2);

    let back = PolicyModel::load(dir.path(), false, &Device::Cpu).unwrap();
    assert!(back.lora().is_some());
    let lp = |m: &PolicyModel| values(&m.sequence_logprobs(&seqs()).unwrap().logprobs);
    assert_eq!(lp(&back), lp(&model));

    let merged_dir = tempfile::tempdir().unwrap();
    model.save_merged(merged_dir.path()).unwrap();
    assert!(!merged_dir.path().join(ADAPTER_DIR).exists());
    let merged = PolicyModel::load(merged_dir.path(), false, &Device::Cpu).unwrap();
    assert!(merged.lora().is_none());
    let base = PolicyModel::new_random(&small_config(), false, 9, &Device::Cpu).unwrap();
    let (adapted, merged, base) = (lp(&model), lp(&merged), lp(&base));
    let max_diff = max_abs_diff(&adapted, &merged);
    assert!(max_diff < 1e-5, "merged differs by {max_diff}");
    assert!(
        max_abs_diff(&adapted, &base) > 1e-3,
        "the adapter changes nothing: the test would not see a failed merge"
    );
}

/// Saves [`adapted_model`], lets `spoil` change its adapter directory, and
/// returns the error loading it gives.
fn load_error(spoil: impl FnOnce(&Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    adapted_model().save(dir.path()).unwrap();
    spoil(&dir.path().join(ADAPTER_DIR));
    PolicyModel::load(dir.path(), false, &Device::Cpu)
        .unwrap_err()
        .to_string()
}

fn edit_config(dir: &Path, key: &str, value: serde_json::Value) {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c[key] = value;
    std::fs::write(&path, c.to_string()).unwrap();
}

fn edit_tensors(dir: &Path, edit: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let path = dir.join(ADAPTER_WEIGHTS_FILE);
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, &path).unwrap();
}

#[test]
fn bad_adapter_files_are_errors_naming_the_problem() {
    let a0 = "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight";
    let e = load_error(|d| edit_tensors(d, |t| drop(t.remove(a0))));
    assert!(e.contains(&format!("missing tensor `{a0}`")), "{e}");

    let e = load_error(|d| edit_config(d, "r", serde_json::json!(4)));
    assert!(e.contains("rank mismatch") && e.contains("r = 4"), "{e}");

    let e = load_error(|d| {
        edit_tensors(d, |t| {
            t.insert(
                a0.into(),
                Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap(),
            );
        })
    });
    assert!(
        e.contains(a0) && e.contains("[2, 5]") && e.contains("[2, 8]"),
        "{e}"
    );

    let e = load_error(|d| {
        edit_config(
            d,
            "target_modules",
            serde_json::json!(["k_proj", "lm_head"]),
        )
    });
    assert!(e.contains("unknown module `lm_head`"), "{e}");

    let e = load_error(|d| edit_config(d, "target_modules", serde_json::json!(["k_proj"])));
    assert!(
        e.contains("unexpected tensor") && e.contains("up_proj"),
        "{e}"
    );

    let e = load_error(|d| std::fs::remove_file(d.join(ADAPTER_WEIGHTS_FILE)).unwrap());
    assert!(e.contains(ADAPTER_WEIGHTS_FILE), "{e}");
    assert!(e.contains("adapter") || e.contains("No such file"), "{e}");
}

#[test]
fn dropout_serves_but_is_refused_for_training() {
    let mut model =
        PolicyModel::new_random(&ModelConfig::tiny(16), false, 2, &Device::Cpu).unwrap();
    let config = LoraConfig {
        dropout: 0.05,
        ..lora_config(&[LoraTarget::QProj])
    };
    model.attach_lora(config, 0).unwrap();
    assert!(model.sequence_logprobs(&seqs()).is_ok());
    let e = model.trainable_vars().unwrap_err().to_string();
    assert!(
        e.contains("dropout 0.05 cannot be trained") && e.contains("lora_dropout = 0"),
        "{e}"
    );
    let again = model
        .attach_lora(lora_config(&[LoraTarget::QProj]), 0)
        .unwrap_err();
    assert!(
        again.to_string().contains("already has a LoRA adapter"),
        "{again}"
    );
}
