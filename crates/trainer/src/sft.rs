//! Warm start: supervised next-token training on expert demonstrations,
//! on the policy's own tokens only (the loss mask of a rollout), and the
//! perception pre-training before it (reading one state into the thought
//! the perceiving expert writes).

use agentrl_env_core::{Env, EnvParams, Split, TaskSpec};
use agentrl_model::{clip_grad_norm, AdamW, PolicyModel};
use agentrl_rollout::{
    expert_demonstrations, state_prompt, ChatCodec, CodecError, ExpertActor, RolloutConfig,
    Trajectory,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
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
    let rows = ModelRows::of(trajs.iter().copied());
    let masks: Vec<Vec<f32>> = trajs.iter().map(|t| shifted_mask(t)).collect();
    let masks = rows.split(masks.iter());
    // Only the policy's tokens are scored: the head skips the prompts.
    let out = model.scored_logprobs(&rows.seqs, &masks)?;
    masked_mean_nll(out.logprobs, &masks, model)
}

/// Minus the mean of `logprobs` ([rows, width], next-token log-probs) over
/// the 1s of the shifted mask `rows` (padded to the width with 0s).
fn masked_mean_nll(
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

/// One perception example: the tokens of a prompt that shows one state
/// ([`state_prompt`]: instructions and the state, no history) and of the
/// perception thought after it; the mask is 1 on the thought.
#[derive(Debug, Clone, PartialEq)]
pub struct PerceptionExample {
    pub tokens: Vec<u32>,
    pub mask: Vec<u8>,
}

/// Perception examples from random walks on `tasks` tasks of `split`
/// (seeds `first_seed..`): every state a player acts in, up to
/// `rollout.max_turns` of them a task, with the env's perception of it.
#[allow(clippy::too_many_arguments)]
pub fn perception_examples(
    make: &EnvMaker<'_>,
    codec: &dyn ChatCodec,
    env: &str,
    difficulty: &str,
    params: &EnvParams,
    rollout: &RolloutConfig,
    split: Split,
    tasks: usize,
    first_seed: u64,
    seed: u64,
) -> Result<Vec<PerceptionExample>, TrainError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut examples = Vec::new();
    for i in 0..tasks as u64 {
        let spec = TaskSpec::new(env, split, difficulty, first_seed + i);
        let mut task = make(&spec, params)?;
        task.reset();
        let mut last_reward = 0.0;
        for turn in 1..=rollout.max_turns.max(1) {
            let Some(thought) = task.perception() else {
                return Err(TrainError::Config(crate::config::ConfigError::Invalid(format!(
                    "sft.perception_steps: env {env:?} has no perception to pre-train on; set sft.perception_steps = 0"
                ))));
            };
            // One action a turn: the budget left is what a rollout shows.
            let actions_left = rollout.max_actions.saturating_sub(turn - 1);
            let (mut tokens, target) = perception_tokens(
                codec,
                &*task,
                rollout,
                turn,
                actions_left,
                last_reward,
                &thought,
            )
            .map_err(agentrl_rollout::RolloutError::from)?;
            let mut mask = vec![0u8; tokens.len()];
            mask.extend(std::iter::repeat_n(1u8, target.len()));
            tokens.extend(target);
            examples.push(PerceptionExample { tokens, mask });
            let actions = task.available_actions();
            if actions.is_empty() {
                break;
            }
            let action = &actions[rng.random_range(0..actions.len())];
            match task.step(action) {
                Ok(step) if !step.done => last_reward = step.reward as f32,
                _ => break,
            }
        }
    }
    Ok(examples)
}

/// Perception examples from played episodes: one for every turn whose
/// state has a perception ([`agentrl_rollout::Turn::perception`]), with the
/// tokens the policy read before that turn's reply (its own sequence's
/// prefix) as the prompt and the rendered reading as the target.
pub fn rollout_perception_examples(
    codec: &dyn ChatCodec,
    rollout: &RolloutConfig,
    trajs: &[Trajectory],
) -> Result<Vec<PerceptionExample>, CodecError> {
    let mut examples = Vec::new();
    for traj in trajs {
        let ranges = traj.sequence_ranges();
        for turn in &traj.turns {
            let Some(thought) = &turn.perception else {
                continue;
            };
            // The reply's own sequence: the one it starts in (a reply is
            // never the first token of a sequence, so `start > r.start`).
            let Some(seq) = ranges
                .iter()
                .find(|r| r.start < turn.start && turn.start <= r.end)
            else {
                continue;
            };
            let mut tokens = traj.tokens[seq.start..turn.start].to_vec();
            let mut mask = vec![0u8; tokens.len()];
            let target = codec.encode(agentrl_rollout::policy_written(
                rollout,
                &rollout.format.render_thought(thought),
            ))?;
            mask.extend(std::iter::repeat_n(1u8, target.len()));
            tokens.extend(target);
            examples.push(PerceptionExample { tokens, mask });
        }
    }
    Ok(examples)
}

/// The prompt and target tokens of one perception example.
fn perception_tokens(
    codec: &dyn ChatCodec,
    env: &dyn Env,
    rollout: &RolloutConfig,
    turn: usize,
    actions_left: usize,
    last_reward: f32,
    thought: &str,
) -> Result<(Vec<u32>, Vec<u32>), CodecError> {
    let prompt = state_prompt(codec, env, rollout, turn, actions_left, last_reward)?;
    let target = codec.encode(agentrl_rollout::policy_written(
        rollout,
        &rollout.format.render_thought(thought),
    ))?;
    Ok((prompt, target))
}

/// Mean next-token NLL of the thought tokens of `examples` (differentiable).
pub fn perception_nll(
    model: &PolicyModel,
    examples: &[&PerceptionExample],
) -> Result<candle_core::Tensor, TrainError> {
    let seqs: Vec<Vec<u32>> = examples.iter().map(|e| e.tokens.clone()).collect();
    let masks: Vec<Vec<f32>> = examples
        .iter()
        .map(|e| e.mask.iter().skip(1).map(|&m| m as f32).collect())
        .collect();
    // Only the thought is scored: the head skips the prompt.
    let out = model.scored_logprobs(&seqs, &masks)?;
    masked_mean_nll(out.logprobs, &masks, model)
}

/// Batches of `batch_size` example indices, each drawn from one length
/// bucket (a fresh episode's long first prompt never pads a batch of short
/// ones), in a shuffled order; a bucket's last batch may be short.
fn length_bucketed_batches(
    examples: &[PerceptionExample],
    batch_size: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<Vec<usize>> {
    const BUCKET_TOKENS: usize = 16;
    let mut buckets: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, e) in examples.iter().enumerate() {
        buckets
            .entry(e.tokens.len() / BUCKET_TOKENS)
            .or_default()
            .push(i);
    }
    let mut batches = Vec::new();
    for (_, mut bucket) in buckets {
        bucket.shuffle(rng);
        batches.extend(bucket.chunks(batch_size.max(1)).map(<[usize]>::to_vec));
    }
    batches.shuffle(rng);
    batches
}

/// Perception pre-training: `sft.perception_steps` updates of up to
/// `sft.perception_batch_size` examples of similar length (a new shuffle of
/// the batches after each pass) at `sft.perception_lr`; `on_batch(done,
/// total, loss)` after each. Returns the mean loss of each tenth of the
/// updates. `opt` is handed back at its own learning rate.
pub fn pretrain_perception(
    model: &PolicyModel,
    opt: &mut AdamW,
    examples: &[PerceptionExample],
    sft: &SftSection,
    grad_clip: f64,
    seed: u64,
    mut on_batch: impl FnMut(usize, usize, f32),
) -> Result<Vec<f32>, TrainError> {
    if examples.is_empty() {
        return Err(TrainError::Config(crate::config::ConfigError::Invalid(
            "sft.perception_steps: no perception examples (sft.perception_tasks = 0?)".into(),
        )));
    }
    let vars = model.trainable_vars()?;
    let own_lr = opt.lr();
    opt.set_lr(sft.perception_lr);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let total = sft.perception_steps;
    let report_every = total.div_ceil(10).max(1);
    let (mut losses, mut sum, mut count) = (Vec::new(), 0.0f32, 0usize);
    for done in 1..=total {
        if batches.is_empty() {
            batches = length_bucketed_batches(examples, sft.perception_batch_size, &mut rng);
            batches.reverse();
        }
        let Some(indices) = batches.pop() else {
            break;
        };
        let batch: Vec<&PerceptionExample> = indices.iter().map(|&i| &examples[i]).collect();
        let loss = perception_nll(model, &batch)?;
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, &vars, grad_clip)?;
        opt.step(&grads)?;
        let l = loss.to_scalar::<f32>()?;
        on_batch(done, total, l);
        sum += l;
        count += 1;
        if done % report_every == 0 || done == total {
            losses.push(sum / count as f32);
            (sum, count) = (0.0, 0);
        }
    }
    opt.set_lr(own_lr);
    Ok(losses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_rollout::RandomMoves;

    /// One id per byte; ChatML markers far above.
    struct ByteCodec;

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

    fn make(
        spec: &TaskSpec,
        params: &EnvParams,
    ) -> Result<Box<dyn Env>, agentrl_env_core::EnvError> {
        agentrl_envs::make_env(spec, params)
    }

    fn examples(env: &str, tasks: usize, seed: u64) -> Result<Vec<PerceptionExample>, TrainError> {
        let params: EnvParams = serde_json::from_str(r#"{"is_slippery": false}"#).unwrap();
        let params = match env {
            "frozenlake" => params,
            _ => EnvParams::new(),
        };
        let rollout = RolloutConfig {
            max_turns: 5,
            max_actions: 5,
            ..RolloutConfig::default()
        };
        perception_examples(
            &make,
            &ByteCodec,
            env,
            "easy",
            &params,
            &rollout,
            Split::Train,
            tasks,
            0,
            seed,
        )
    }

    /// Every example asks about the state its prompt shows, ends its prompt
    /// with the assistant header, and supervises exactly the thought.
    #[test]
    fn perception_examples_supervise_the_reading_of_the_state_they_show() {
        let examples = examples("frozenlake", 20, 7).unwrap();
        assert!(
            examples.len() >= 20 && examples.len() <= 100,
            "{}",
            examples.len()
        );
        for e in &examples {
            assert_eq!(e.tokens.len(), e.mask.len());
            let start = e.mask.iter().position(|&m| m == 1).unwrap();
            assert!(e.mask[start..].iter().all(|&m| m == 1));
            let prompt = ByteCodec.decode(&e.tokens[..start]).unwrap();
            let target = ByteCodec.decode(&e.tokens[start..]).unwrap();
            assert!(prompt.ends_with(" actions left.\nassistant\n"), "{prompt}");
            assert_eq!(
                e.tokens[start - 1 - "assistant\n".len()],
                ByteCodec.im_start()
            );
            // The grid between "State:\n" and the actions-left line.
            let grid =
                &prompt[prompt.find("State:\n").unwrap() + 7..prompt.find("\nYou have").unwrap()];
            let rows: Vec<&[u8]> = grid.lines().map(str::as_bytes).collect();
            let (r, c) = (0..4)
                .flat_map(|r| (0..4).map(move |c| (r, c)))
                .find(|&(r, c)| rows[r][c] == b'P')
                .unwrap();
            let cell = |dr: isize, dc: isize| {
                let (r, c) = (r as isize + dr, c as isize + dc);
                match (0..4).contains(&r) && (0..4).contains(&c) {
                    true => (rows[r as usize][c as usize] as char).to_string(),
                    false => "edge".to_string(),
                }
            };
            let expect = format!(
                "<think>Left {}, Down {}, Right {}, Up {}</think>",
                cell(0, -1),
                cell(1, 0),
                cell(0, 1),
                cell(-1, 0)
            );
            assert_eq!(target, expect, "{prompt}");
        }
        assert_eq!(examples, self::examples("frozenlake", 20, 7).unwrap());
        assert_ne!(examples, self::examples("frozenlake", 20, 8).unwrap());
    }

    /// Every example once per pass, and no batch mixes a long first
    /// prompt with short later ones.
    #[test]
    fn batches_cover_every_example_once_and_keep_to_one_length() {
        let examples = examples("frozenlake", 30, 1).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let batches = length_bucketed_batches(&examples, 8, &mut rng);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..examples.len()).collect::<Vec<_>>());
        for b in &batches {
            assert!(b.len() <= 8);
            let lens: Vec<usize> = b.iter().map(|&i| examples[i].tokens.len()).collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(hi - lo < 16, "{lens:?}");
        }
        let long = examples.iter().map(|e| e.tokens.len()).max().unwrap();
        let short = examples.iter().map(|e| e.tokens.len()).min().unwrap();
        assert!(
            long > 2 * short,
            "first prompts carry the instructions: {long} vs {short}"
        );
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

    /// A perceiving expert's thought is its state's perception, so the
    /// examples of its episodes are exactly the tokens it read and thought
    /// at each turn: its own sequence up to the end of the thought, with
    /// the mask on the thought; one for every turn, in both prompt layouts.
    #[test]
    fn rollout_perception_examples_are_each_turns_prompt_then_its_reading() {
        let params: EnvParams = serde_json::from_str(r#"{"is_slippery": false}"#).unwrap();
        let sft = SftSection {
            demos: 12,
            perceive: true,
            expert_noise: 1.0,
            random_moves: RandomMoves::Safe,
            ..SftSection::default()
        };
        let demos_with = |rollout: &RolloutConfig| {
            demonstrations(
                &make,
                &ByteCodec,
                "frozenlake",
                "easy",
                &params,
                rollout,
                &sft,
                0,
            )
            .unwrap()
        };
        for history_turns in [Some(0), None] {
            let rollout = RolloutConfig {
                history_turns,
                ..RolloutConfig::default()
            };
            let demos = demos_with(&rollout);
            let examples = rollout_perception_examples(&ByteCodec, &rollout, &demos).unwrap();
            let turns: Vec<(&Trajectory, &agentrl_rollout::Turn)> = demos
                .iter()
                .flat_map(|t| t.turns.iter().map(move |turn| (t, turn)))
                .collect();
            assert_eq!(examples.len(), turns.len());
            // More turns than episodes: later turns' prompts are covered.
            assert!(turns.len() > 2 * demos.len(), "{}", turns.len());
            for (e, (traj, turn)) in examples.iter().zip(&turns) {
                let seq = traj
                    .sequence_ranges()
                    .into_iter()
                    .find(|r| r.contains(&turn.start))
                    .unwrap();
                let thought_len = turn.reply.find("</think>").unwrap() + "</think>".len();
                assert_eq!(e.tokens, traj.tokens[seq.start..turn.start + thought_len]);
                let prompt_len = turn.start - seq.start;
                assert!(e.mask[..prompt_len].iter().all(|&m| m == 0));
                assert!(e.mask[prompt_len..].iter().all(|&m| m == 1));
                assert_eq!(e.mask.len(), e.tokens.len());
            }
        }
        // No perception, no example: a turn of an env without one.
        let mut demos = demos_with(&RolloutConfig::default());
        let all =
            rollout_perception_examples(&ByteCodec, &RolloutConfig::default(), &demos).unwrap();
        demos[0].turns[0].perception = None;
        let fewer =
            rollout_perception_examples(&ByteCodec, &RolloutConfig::default(), &demos).unwrap();
        assert_eq!(fewer.len() + 1, all.len());
        assert_eq!(fewer[..], all[1..]);
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

    #[test]
    fn an_env_without_perception_is_a_clear_error() {
        let err = examples("bandit", 2, 0).unwrap_err().to_string();
        assert!(
            err.contains("no perception") && err.contains("sft.perception_steps"),
            "{err}"
        );
    }
}
