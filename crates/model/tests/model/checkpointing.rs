//! Gradient checkpointing on the fused path: the layers and the LM head
//! keep nothing for the backward and compute it again there, and every
//! output and gradient keeps its bits: in f32 and bf16 products, with a
//! shared prompt packed once, with a value head, and with LoRA adapters.

use agentrl_model::{LoraConfig, LoraTarget, ModelConfig, PolicyModel, Precision};
use candle_core::{DType, Device, Tensor};

fn config() -> ModelConfig {
    let mut c = ModelConfig::new_qwen2(29, 32, 3, 4, 2, 48);
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.3;
    c
}

/// Three replies to one 20-token prompt (packed once) and a fourth sequence.
fn batch() -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 29).collect();
    let seqs: Vec<Vec<u32>> = vec![
        [&prompt[..], &[1, 2, 3, 4, 5]].concat(),
        [&prompt[..], &[6, 7]].concat(),
        [&prompt[..], &[8, 9, 10, 11]].concat(),
        (0..17).map(|i| (i * 5 + 1) % 29).collect(),
    ];
    let scored = seqs
        .iter()
        .zip([20, 20, 20, 3])
        .map(|(s, first)| {
            (0..s.len() - 1)
                .map(|t| f32::from(t + 1 >= first))
                .collect()
        })
        .collect();
    (seqs, scored)
}

/// The outputs and every trainable variable's gradient of a weighted loss,
/// as raw bits.
fn outputs_and_grads(model: &PolicyModel) -> Vec<Vec<u32>> {
    let (seqs, scored) = batch();
    let out = model.scored_logprobs(&seqs, &scored).unwrap();
    let (b, w) = out.logprobs.dims2().unwrap();
    let weights: Vec<f32> = (0..b * w).map(|i| 0.3 + 0.1 * (i % 5) as f32).collect();
    let weights = Tensor::from_vec(weights, (b, w), &Device::Cpu).unwrap();
    let values = out.values.clone().unwrap();
    let loss = ((&out.logprobs * &weights).unwrap().sum_all().unwrap()
        + out.entropy.sum_all().unwrap().affine(0.5, 0.0).unwrap()
        + values
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .affine(0.1, 0.0)
            .unwrap())
    .unwrap();
    let grads = loss.backward().unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    };
    let mut all = vec![bits(&out.logprobs), bits(&out.entropy), bits(&values)];
    for var in model.trainable_vars().unwrap() {
        let g = grads
            .get(var.as_tensor())
            .expect("every trainable variable gets a gradient");
        all.push(bits(g));
    }
    all
}

fn assert_same_with_and_without(model: &mut PolicyModel, what: &str) {
    model.set_gradient_checkpointing(false);
    let kept = outputs_and_grads(model);
    model.set_gradient_checkpointing(true);
    let recomputed = outputs_and_grads(model);
    assert_eq!(kept.len(), recomputed.len());
    for (i, (a, b)) in kept.iter().zip(&recomputed).enumerate() {
        assert!(
            a == b,
            "{what}: output or gradient {i} differs with checkpointing"
        );
    }
}

#[test]
fn checkpointing_keeps_every_output_and_gradient_bit_for_bit() {
    let precisions = [Precision::F32, Precision::Bf16];
    for precision in precisions.into_iter().filter(|p| p.available()) {
        let mut model =
            PolicyModel::new_random_with_dtype(&config(), true, 3, DType::F32, &Device::Cpu)
                .unwrap();
        model.set_precision(precision).unwrap();
        assert_same_with_and_without(&mut model, &format!("full, {precision}"));
        model
            .attach_lora(
                LoraConfig {
                    r: 4,
                    alpha: 8.0,
                    dropout: 0.0,
                    target_modules: vec![LoraTarget::KProj, LoraTarget::OProj, LoraTarget::UpProj],
                    use_rslora: false,
                },
                7,
            )
            .unwrap();
        // B = 0 at attachment would leave A without a gradient: one step of
        // values makes every factor matter.
        for (name, var) in model.lora().unwrap().named_vars() {
            if name.ends_with("lora_B.weight") {
                let v: Vec<f32> = (0..var.elem_count())
                    .map(|i| ((i % 7) as f32 - 3.0) * 0.05)
                    .collect();
                var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
                    .unwrap();
            }
        }
        assert_same_with_and_without(&mut model, &format!("LoRA, {precision}"));
    }
}
