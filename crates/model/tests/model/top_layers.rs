//! Training only the top layers (`PolicyModel::train_top_layers`): the
//! trained parameters get exactly the gradients full training gives them,
//! the frozen ones none, AdamW leaves the frozen ones bit-identical, and bad
//! requests are refused.

use agentrl_model::{LoraConfig, LoraTarget, ModelConfig, PolicyModel};
use candle_core::{DType, Device, Tensor};

use crate::finite_difference::{fit_two_sequences, logprob_entropy_objective, values, var_names};

fn config(tied: bool) -> ModelConfig {
    let mut c = ModelConfig::new_qwen2(13, 8, 3, 2, 1, 12);
    c.tie_word_embeddings = tied;
    c.max_position_embeddings = 16;
    c.initializer_range = 0.5;
    c
}

/// Weighted log-probs plus entropies of two sequences: every weight matters.
fn objective(model: &PolicyModel) -> Tensor {
    logprob_entropy_objective(model, &[vec![1, 5, 7, 2, 11, 3], vec![4, 12, 0, 9]])
}

fn model(tied: bool, fused: bool) -> PolicyModel {
    let mut m =
        PolicyModel::new_random_with_dtype(&config(tied), true, 5, DType::F64, &Device::Cpu)
            .unwrap();
    m.set_fused_training(fused);
    m
}

#[test]
fn the_top_layers_get_their_full_gradients_and_the_rest_none() {
    for tied in [true, false] {
        for fused in [true, false] {
            let full = model(tied, fused);
            let mut top = model(tied, fused);
            top.train_top_layers(1).unwrap();
            let case = format!("tied {tied}, fused {fused}");
            let mut expected = vec![
                "model.layers.2.input_layernorm.weight",
                "model.layers.2.mlp.down_proj.weight",
                "model.layers.2.mlp.gate_proj.weight",
                "model.layers.2.mlp.up_proj.weight",
                "model.layers.2.post_attention_layernorm.weight",
                "model.layers.2.self_attn.k_proj.bias",
                "model.layers.2.self_attn.k_proj.weight",
                "model.layers.2.self_attn.o_proj.weight",
                "model.layers.2.self_attn.q_proj.bias",
                "model.layers.2.self_attn.q_proj.weight",
                "model.layers.2.self_attn.v_proj.bias",
                "model.layers.2.self_attn.v_proj.weight",
                "model.norm.weight",
                "value_head.bias",
                "value_head.weight",
            ];
            if !tied {
                expected.insert(0, "lm_head.weight");
            }
            let trained = var_names(top.trainable_named_vars().unwrap());
            assert_eq!(trained, expected, "{case}");

            let full_grads = objective(&full).backward().unwrap();
            let top_grads = objective(&top).backward().unwrap();
            let trained_vars = top.trainable_named_vars().unwrap();
            for ((name, var), (_, full_var)) in top
                .named_vars()
                .unwrap()
                .iter()
                .zip(full.named_vars().unwrap())
            {
                let got = top_grads.get(var.as_tensor());
                if !trained_vars.iter().any(|(n, _)| n == name) {
                    assert!(got.is_none(), "{case}: frozen {name} got a gradient");
                    continue;
                }
                if name.starts_with("value_head") {
                    continue; // the objective does not read it
                }
                let got = values(got.unwrap_or_else(|| panic!("{case}: {name} got none")));
                let want = values(full_grads.get(full_var.as_tensor()).unwrap());
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(worst < 1e-12, "{case}: {name} differs by {worst}");
            }
        }
    }
}

#[test]
fn adamw_moves_only_the_top_layers() {
    let mut m = PolicyModel::new_random(&config(true), false, 9, &Device::Cpu).unwrap();
    m.train_top_layers(2).unwrap();
    let before: Vec<(String, Vec<f64>)> = m
        .named_vars()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, values(v.as_tensor())))
        .collect();
    let (first, last) = fit_two_sequences(&m, 10);
    assert!(
        last < first,
        "the top layers did not learn: {first} -> {last}"
    );
    for ((name, before), (_, var)) in before.iter().zip(m.named_vars().unwrap()) {
        let moved = before != &values(var.as_tensor());
        let trained = name.starts_with("model.layers.1.")
            || name.starts_with("model.layers.2.")
            || name == "model.norm.weight";
        assert_eq!(moved, trained, "{name}: moved {moved}, trained {trained}");
    }
}

#[test]
fn bad_requests_are_refused_by_name() {
    let lora = LoraConfig {
        r: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: vec![LoraTarget::QProj],
        use_rslora: false,
    };
    let mut m = PolicyModel::new_random(&config(true), false, 1, &Device::Cpu).unwrap();
    for layers in [0, 4] {
        let e = m.train_top_layers(layers).unwrap_err().to_string();
        assert!(
            e.contains(&format!("top {layers} layers of a 3-layer")),
            "{e}"
        );
    }
    m.train_top_layers(3).unwrap();
    let e = m.attach_lora(lora.clone(), 0).unwrap_err().to_string();
    assert!(e.contains("do not combine"), "{e}");

    let mut m = PolicyModel::new_random(&config(true), false, 1, &Device::Cpu).unwrap();
    m.attach_lora(lora, 0).unwrap();
    let e = m.train_top_layers(1).unwrap_err().to_string();
    assert!(e.contains("do not combine"), "{e}");
}
