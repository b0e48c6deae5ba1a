//! The no-grad sampling path must see every optimizer update: generation
//! after a training step has to come from the updated weights.

use agentrl_model::{AdamW, AdamWConfig, ModelConfig, PolicyModel};
use candle_core::{Device, Tensor};

fn flat(logits: Result<Tensor, agentrl_model::ModelError>) -> Vec<f32> {
    logits.unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn no_grad_forward_matches_training_forward_after_an_update() {
    let cfg = ModelConfig::new_qwen2(64, 32, 2, 4, 2, 64);
    let model = PolicyModel::new_random(&cfg, false, 0, &Device::Cpu).unwrap();
    let ids = Tensor::new(&[[1u32, 5, 9, 3, 7]], &Device::Cpu).unwrap();
    let before = flat(model.forward_no_grad(&ids));
    let mut opt = AdamW::new(
        model.trainable_vars().unwrap(),
        AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
    )
    .unwrap();
    let out = model.sequence_logprobs(&[vec![1, 5, 9, 3, 7]]).unwrap();
    let loss = out.logprobs.sum_all().unwrap().neg().unwrap();
    let grads = loss.backward().unwrap();
    opt.step(&grads).unwrap();
    let train = flat(model.forward(&ids));
    let infer = flat(model.forward_no_grad(&ids));
    let moved: f32 = before
        .iter()
        .zip(&train)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(moved > 1e-3, "the update changed nothing ({moved})");
    let diff: f32 = train
        .iter()
        .zip(&infer)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        diff < 1e-4,
        "sampling path is stale: max |train - infer| = {diff}"
    );
}
