//! Warm start: supervised next-token training on expert demonstrations,
//! on the policy's own tokens only (the loss mask of a rollout).

use agentrl_env_core::{EnvParams, Split, TaskSpec};
use agentrl_model::{clip_grad_norm, AdamW, PolicyModel};
use agentrl_rollout::{expert_demonstrations, ChatCodec, ExpertActor, RolloutConfig, Trajectory};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::batch::{padded, shifted_mask, ModelRows};
use crate::config::SftSection;
use crate::evaluate::EnvMaker;
use crate::TrainError;

/// Expert demonstrations on train seeds `first_seed..first_seed + n`.
#[allow(clippy::too_many_arguments)]
pub fn demonstrations(
    make: &EnvMaker<'_>,
    codec: &dyn ChatCodec,
    env: &str,
    difficulty: &str,
    params: &EnvParams,
    rollout: &RolloutConfig,
    sft: &SftSection,
    first_seed: u64,
) -> Result<Vec<Trajectory>, TrainError> {
    let mut envs = Vec::with_capacity(sft.demos);
    for i in 0..sft.demos as u64 {
        let spec = TaskSpec::new(env, Split::Train, difficulty, first_seed + i);
        envs.push(make(&spec, params)?);
    }
    let groups: Vec<usize> = (0..envs.len()).collect();
    let mut expert = ExpertActor::new(sft.actions_per_turn, sft.expert_noise);
    let demos = expert_demonstrations(&mut expert, codec, envs, &groups, rollout)?;
    // A pure expert's failures (budget too short) teach nothing; a noisy
    // expert's are part of the behaviour being imitated.
    Ok(demos
        .into_iter()
        .filter(|t| match sft.expert_noise > 0.0 {
            true => !t.turns.is_empty(),
            false => t.success,
        })
        .collect())
}

/// Mean next-token NLL of the policy tokens of `trajs` (differentiable).
pub fn nll(model: &PolicyModel, trajs: &[&Trajectory]) -> Result<candle_core::Tensor, TrainError> {
    let rows = ModelRows::of(trajs.iter().copied());
    let out = model.sequence_logprobs(&rows.seqs)?;
    let width = out.logprobs.dim(1)?;
    let masks: Vec<Vec<f32>> = trajs.iter().map(|t| shifted_mask(t)).collect();
    let mask = padded(&rows.split(masks.iter()), width, &model.device)?;
    let total = (out.logprobs * &mask)?.sum_all()?;
    let count = mask.sum_all()?.to_scalar::<f32>()?.max(1.0);
    Ok((total.neg()? / count as f64)?)
}

/// Train on the demonstrations; returns the mean loss of each epoch.
///
/// `opt` runs at `sft.lr` here and is handed back at its own learning rate
/// (the trainer may keep it for RL: `actor.keep_sft_optimizer`).
pub fn train(
    model: &PolicyModel,
    opt: &mut AdamW,
    demos: &[Trajectory],
    sft: &SftSection,
    grad_clip: f64,
    seed: u64,
    mut on_batch: impl FnMut(usize, usize, f32),
) -> Result<Vec<f32>, TrainError> {
    let vars = model.trainable_vars()?;
    let rl_lr = opt.lr();
    opt.set_lr(sft.lr);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..demos.len()).collect();
    let batches_per_epoch = demos.len().div_ceil(sft.batch_size.max(1));
    let total = batches_per_epoch * sft.epochs;
    let mut epoch_losses = Vec::new();
    let mut done = 0;
    for _ in 0..sft.epochs {
        order.shuffle(&mut rng);
        let mut sum = 0.0;
        for chunk in order.chunks(sft.batch_size.max(1)) {
            let batch: Vec<&Trajectory> = chunk.iter().map(|&i| &demos[i]).collect();
            let loss = nll(model, &batch)?;
            let mut grads = loss.backward()?;
            clip_grad_norm(&mut grads, &vars, grad_clip)?;
            opt.step(&grads)?;
            let l = loss.to_scalar::<f32>()?;
            sum += l;
            done += 1;
            on_batch(done, total, l);
        }
        epoch_losses.push(sum / batches_per_epoch.max(1) as f32);
    }
    opt.set_lr(rl_lr);
    Ok(epoch_losses)
}
