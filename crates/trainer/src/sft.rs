//! Warm start: supervised next-token training on expert demonstrations,
//! on the policy's own tokens only (the loss mask of a rollout). The
//! perception pre-training of the tiny recipes is in the `perception` module.

use agentrl_env_core::{EnvParams, Split, TaskSpec};
use agentrl_model::{add_grads, clip_grad_norm, AdamW, PolicyModel};
use agentrl_rollout::{expert_demonstrations, ChatCodec, ExpertActor, RolloutConfig, Trajectory};
use candle_core::backprop::GradStore;
use candle_core::Var;
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
    if sft.perceive && envs.first().is_some_and(|e| e.perception().is_none()) {
        return Err(TrainError::Config(crate::config::ConfigError::Invalid(format!(
            "sft.perceive: env {env:?} has no perception for the expert to think; set sft.perceive = false"
        ))));
    }
    let groups: Vec<usize> = (0..envs.len()).collect();
    let mut expert = ExpertActor::new(sft.actions_per_turn, sft.expert_noise)
        .random_moves(sft.random_moves)
        .perceiving(sft.perceive);
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
    let (rows, masks) = scored_rows(trajs);
    rows_nll(model, &rows, &masks)
}

/// [`nll`] of model rows and their shifted loss masks.
fn rows_nll(
    model: &PolicyModel,
    rows: &ModelRows,
    masks: &[Vec<f32>],
) -> Result<candle_core::Tensor, TrainError> {
    // Only the policy's tokens are scored: the head skips the prompts.
    let out = model.scored_logprobs(&rows.seqs, masks)?;
    masked_mean_nll(out.logprobs, masks, model)
}

/// The model rows of `trajs` and each row's shifted loss mask.
fn scored_rows(trajs: &[&Trajectory]) -> (ModelRows, Vec<Vec<f32>>) {
    let rows = ModelRows::of(trajs.iter().copied());
    let masks: Vec<Vec<f32>> = trajs.iter().map(|t| shifted_mask(t)).collect();
    let masks = rows.split(masks.iter());
    (rows, masks)
}

/// [`nll`] of `batch` and its gradients (of `vars`; `None` for an empty
/// batch), taken in backward passes of `micro` demonstrations whose losses
/// are scaled by their share of the batch's policy tokens, so that they add
/// up to the whole batch's (`sft.micro_batch_size`).
pub fn batch_nll_grads(
    model: &PolicyModel,
    batch: &[&Trajectory],
    micro: usize,
    vars: &[Var],
) -> Result<(f32, Option<GradStore>), TrainError> {
    let parts: Vec<(ModelRows, Vec<Vec<f32>>)> =
        batch.chunks(micro.max(1)).map(scored_rows).collect();
    let tokens = |masks: &[Vec<f32>]| -> f64 { masks.iter().flatten().map(|&m| m as f64).sum() };
    let total: f64 = parts.iter().map(|(_, masks)| tokens(masks)).sum();
    let mut loss = 0.0;
    let mut grads: Option<GradStore> = None;
    for (rows, masks) in &parts {
        let share = if total > 0.0 {
            tokens(masks) / total
        } else {
            0.0
        };
        let part_loss = (rows_nll(model, rows, masks)? * share)?;
        loss += part_loss.to_scalar::<f32>()?;
        grads = Some(add_grads(grads, part_loss.backward()?, vars)?);
    }
    Ok((loss, grads))
}

/// Minus the mean of `logprobs` ([rows, width], next-token log-probs) over
/// the 1s of the shifted mask `rows` (padded to the width with 0s).
pub(crate) fn masked_mean_nll(
    logprobs: candle_core::Tensor,
    rows: &[Vec<f32>],
    model: &PolicyModel,
) -> Result<candle_core::Tensor, TrainError> {
    let mask = padded(rows, logprobs.dim(1)?, &model.device)?;
    let total = (logprobs * &mask)?.sum_all()?;
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
            let (l, grads) = batch_nll_grads(model, &batch, sft.micro_batch(), &vars)?;
            if let Some(mut grads) = grads {
                clip_grad_norm(&mut grads, &vars, grad_clip)?;
                opt.step(&grads)?;
            }
            sum += l;
            done += 1;
            on_batch(done, total, l);
        }
        epoch_losses.push(sum / batches_per_epoch.max(1) as f32);
    }
    opt.set_lr(rl_lr);
    Ok(epoch_losses)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use agentrl_env_core::Env;
    use agentrl_rollout::CodecError;
    use agentrl_rollout::RandomMoves;

    /// One id per byte; ChatML markers far above.
    pub(crate) struct ByteCodec;

    impl ChatCodec for ByteCodec {
        fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
            let bytes: Vec<u8> = ids.iter().filter_map(|&i| u8::try_from(i).ok()).collect();
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
        fn im_start(&self) -> u32 {
            1000
        }
        fn im_end(&self) -> u32 {
            1001
        }
    }

    pub(crate) fn make(
        spec: &TaskSpec,
        params: &EnvParams,
    ) -> Result<Box<dyn Env>, agentrl_env_core::EnvError> {
        agentrl_envs::make_env(spec, params)
    }

    /// Safe random moves follow the reading: every move of the warm start
    /// goes onto a cell its thought reads as ice or the goal, while valid
    /// random moves also walk into holes and edges.
    #[test]
    fn demonstrations_of_safe_random_moves_never_go_where_the_thought_reads_o_or_edge() {
        let params: EnvParams = serde_json::from_str(r#"{"is_slippery": false}"#).unwrap();
        let rollout = RolloutConfig {
            history_turns: Some(0),
            ..RolloutConfig::default()
        };
        let read_then_move = |random_moves| {
            let sft = SftSection {
                demos: 40,
                perceive: true,
                expert_noise: 1.0,
                random_moves,
                ..SftSection::default()
            };
            let demos = demonstrations(
                &make,
                &ByteCodec,
                "frozenlake",
                "easy",
                &params,
                &rollout,
                &sft,
                0,
            )
            .unwrap();
            let mut seen = Vec::new();
            for turn in demos.iter().flat_map(|t| &t.turns) {
                let thought = &turn.reply
                    [turn.reply.find("<think>").unwrap() + 7..turn.reply.find("</think>").unwrap()];
                let [action] = &turn.actions[..] else {
                    panic!("{turn:?}")
                };
                let read = thought
                    .split(", ")
                    .find_map(|r| r.strip_prefix(&format!("{action} ")))
                    .unwrap();
                seen.push(read.to_string());
            }
            seen
        };
        let safe = read_then_move(RandomMoves::Safe);
        assert!(safe.len() > 100, "{}", safe.len());
        assert!(safe.iter().all(|r| r == "_" || r == "G"), "{safe:?}");
        let valid = read_then_move(RandomMoves::Valid);
        assert!(valid.iter().any(|r| r == "O"), "{valid:?}");
        assert!(valid.iter().any(|r| r == "edge"), "{valid:?}");
    }

    #[test]
    fn a_perceiving_expert_on_an_env_without_perception_is_a_clear_error() {
        let sft = SftSection {
            demos: 2,
            perceive: true,
            ..SftSection::default()
        };
        let err = demonstrations(
            &make,
            &ByteCodec,
            "bandit",
            "easy",
            &EnvParams::new(),
            &RolloutConfig::default(),
            &sft,
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("no perception") && err.contains("sft.perceive"),
            "{err}"
        );
    }
}
