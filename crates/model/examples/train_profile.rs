//! Per-phase timing of one training step on the `agentrl bench model` shape:
//! `cargo run --release -p agentrl-model --example train_profile`.

use std::time::Instant;

use agentrl_model::{AdamW, AdamWConfig, ModelConfig, PolicyModel};
use candle_core::Device;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ModelConfig::new_qwen2(512, 256, 4, 4, 2, 688);
    let model = PolicyModel::new_random(&cfg, false, 0, &Device::Cpu)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let batch: Vec<Vec<u32>> = (0..16)
        .map(|_| (0..256).map(|_| rng.random_range(0..512)).collect())
        .collect();
    let mut opt = AdamW::new(model.trainable_vars()?, AdamWConfig::default())?;
    for step in 0..3 {
        let t0 = Instant::now();
        let out = model.sequence_logprobs(&batch)?;
        let loss = (&out.logprobs * &out.mask)?.sum_all()?.neg()?;
        let _ = loss.to_scalar::<f32>()?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        let t2 = Instant::now();
        opt.step(&grads)?;
        let t3 = Instant::now();
        println!(
            "step {step}: forward {:.3}s backward {:.3}s adamw {:.3}s",
            (t1 - t0).as_secs_f64(),
            (t2 - t1).as_secs_f64(),
            (t3 - t2).as_secs_f64()
        );
    }
    Ok(())
}
