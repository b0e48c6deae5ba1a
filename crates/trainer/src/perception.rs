//! Perception: the auxiliary task of the tiny from-scratch recipes. A model
//! that starts knowing nothing first learns to read one state into the
//! thought a perceiving expert writes (`sft.perception_steps`), and may keep
//! doing so between RL updates (`actor.perception_steps_per_update`);
//! `rollout.show_perception` puts the env's reading in the prompt. A
//! pretrained model needs none of it: with these settings at their defaults
//! the trainer never calls in here, and the RL loop is all there is.

use agentrl_env_core::{Env, EnvParams, Split, TaskSpec};
use agentrl_model::{clip_grad_norm, AdamW, PolicyModel};
use agentrl_rollout::{state_prompt, ChatCodec, CodecError, RolloutConfig, Trajectory};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::config::{ConfigError, PerceptionStates, SftSection, TrainConfig};
use crate::evaluate::EnvMaker;
use crate::mixture::{groups_per_source, sources_at, task_sources, TaskSource};
use crate::sft::masked_mean_nll;
use crate::trainer::Progress;
use crate::TrainError;

/// Train seeds of the perception pre-training's random walks: past the
/// demonstrations' (which start at half the split).
const FIRST_SEED: u64 = agentrl_env_core::SPLIT_STRIDE / 2 + agentrl_env_core::SPLIT_STRIDE / 4;
/// Validation tasks whose states measure the perception's held-out loss.
const HELD_OUT_TASKS: usize = 64;

/// With `rollout.show_perception`, every task source's env must have a
/// reading to show: an error naming the key and the env otherwise, rather
/// than a run whose prompts silently lack what the config asked for.
pub(crate) fn check_readings_exist(
    cfg: &TrainConfig,
    make: &EnvMaker<'_>,
) -> Result<(), TrainError> {
    if !cfg.rollout.show_perception {
        return Ok(());
    }
    for source in task_sources(cfg) {
        let spec = TaskSpec::new(&source.env, Split::Train, &source.difficulty, 0);
        let mut env = make(&spec, &source.params)?;
        env.reset();
        if env.perception().is_none() {
            return Err(TrainError::Config(ConfigError::Invalid(format!(
                "rollout.show_perception: env {:?} has no reading of its state to show; set rollout.show_perception = false",
                source.env
            ))));
        }
    }
    Ok(())
}

/// What the perception task reads of a run: its config, envs, tokenizer
/// and the task sources at the run's difficulty.
pub(crate) struct RunInputs<'a> {
    pub cfg: &'a TrainConfig,
    pub make: &'a EnvMaker<'a>,
    pub codec: &'a dyn ChatCodec,
    pub sources: Vec<TaskSource>,
}

impl<'a> RunInputs<'a> {
    /// A run's inputs, at its `env.difficulty`.
    pub(crate) fn of(
        cfg: &'a TrainConfig,
        make: &'a EnvMaker<'a>,
        codec: &'a dyn ChatCodec,
    ) -> Self {
        RunInputs {
            cfg,
            make,
            codec,
            sources: sources_at(cfg, &cfg.env.difficulty),
        }
    }
}

/// A run's perception task: the pre-training's random-walk examples, kept
/// for the updates between RL steps; built on first use, the same after a
/// resume.
#[derive(Default)]
pub(crate) struct PerceptionTask {
    walks: Vec<PerceptionExample>,
}

impl PerceptionTask {
    /// The perception examples of this run's tasks: train-seed states to
    /// learn from and validation-seed states to measure on.
    #[allow(clippy::type_complexity)]
    fn walk_examples(
        run: &RunInputs<'_>,
    ) -> Result<(Vec<PerceptionExample>, Vec<PerceptionExample>), TrainError> {
        let weights: Vec<f64> = run.sources.iter().map(|s| s.weight).collect();
        let (mut train, mut held_out) = (Vec::new(), Vec::new());
        let train_counts = groups_per_source(&weights, run.cfg.sft.perception_tasks, 1);
        let held_out_counts = groups_per_source(&weights, HELD_OUT_TASKS, 1);
        for ((source, n_train), n_held_out) in
            run.sources.iter().zip(train_counts).zip(held_out_counts)
        {
            for (split, tasks, first_seed, into) in [
                (Split::Train, n_train, FIRST_SEED, &mut train),
                (Split::Val, n_held_out, 0, &mut held_out),
            ] {
                into.extend(perception_examples(
                    run.make,
                    run.codec,
                    &source.env,
                    &source.difficulty,
                    &source.params,
                    &run.cfg.rollout,
                    split,
                    tasks,
                    first_seed,
                    run.cfg.trainer.seed,
                )?);
            }
        }
        Ok((train, held_out))
    }

    /// Perception pre-training (`sft.perception_steps`): the model learns to
    /// read the state off short one-state prompts before it sees a
    /// dialogue. Returns the metrics line: the held-out loss (validation
    /// tasks' states) before and after.
    pub(crate) fn pretrain(
        &mut self,
        run: &RunInputs<'_>,
        model: &PolicyModel,
        opt: &mut AdamW,
        progress: &mut dyn Progress,
    ) -> Result<serde_json::Value, TrainError> {
        let (train, held_out) = Self::walk_examples(run)?;
        let sft = &run.cfg.sft;
        progress.message(&format!(
            "perception pre-training: {} updates on {} states of {} tasks",
            sft.perception_steps,
            train.len(),
            sft.perception_tasks
        ));
        let held_out_refs: Vec<&PerceptionExample> = held_out.iter().collect();
        let before = perception_nll(model, &held_out_refs)?.to_scalar::<f32>()?;
        progress.phase("perception", sft.perception_steps);
        let losses = pretrain_perception(
            model,
            opt,
            &train,
            sft,
            run.cfg.actor.grad_clip,
            run.cfg.trainer.seed,
            // Thousands of quick updates: a line every hundred in a log.
            |done, total, l| {
                if done % 100 == 0 || done == total {
                    progress.advance(done, &format!("loss {l:.3}"));
                }
            },
        )?;
        progress.finish_phase();
        let after = perception_nll(model, &held_out_refs)?.to_scalar::<f32>()?;
        progress.message(&format!(
            "perception: held-out loss {before:.3} -> {after:.3} ({} states)",
            held_out.len()
        ));
        let metrics = json!({
            "kind": "perception", "step": 0, "states": train.len(),
            "losses": losses, "held_out_loss_before": before, "held_out_loss_after": after,
        });
        self.walks = train;
        Ok(metrics)
    }

    /// The perception examples of this step's rollouts, where the
    /// perception updates take their states from them
    /// (`actor.perception_states = "rollouts"`); `None` otherwise.
    pub(crate) fn rollout_states(
        cfg: &TrainConfig,
        codec: &dyn ChatCodec,
        trajs: &[Trajectory],
    ) -> Result<Option<Vec<PerceptionExample>>, TrainError> {
        let actor = &cfg.actor;
        if actor.perception_steps_per_update == 0
            || actor.perception_states != PerceptionStates::Rollouts
        {
            return Ok(None);
        }
        let examples = rollout_perception_examples(codec, &cfg.rollout, trajs)
            .map_err(agentrl_rollout::RolloutError::from)?;
        if examples.is_empty() {
            return Err(TrainError::Config(ConfigError::Invalid(
                "actor.perception_states = \"rollouts\": this step's rollouts have no perception (the env defines none); use \"walks\" or actor.perception_steps_per_update = 0".into(),
            )));
        }
        Ok(Some(examples))
    }

    /// `actor.perception_steps_per_update` perception updates after RL
    /// step `step`'s update, on `rollout_states` where the config takes
    /// them from the rollouts and on the pre-training's random walks
    /// otherwise; returns their mean loss.
    pub(crate) fn refresh(
        &mut self,
        run: &RunInputs<'_>,
        model: &PolicyModel,
        opt: &mut AdamW,
        step: usize,
        rollout_states: Option<Vec<PerceptionExample>>,
    ) -> Result<Option<f32>, TrainError> {
        let steps = run.cfg.actor.perception_steps_per_update;
        if steps == 0 {
            return Ok(None);
        }
        if rollout_states.is_none() && self.walks.is_empty() {
            self.walks = Self::walk_examples(run)?.0;
        }
        let examples = rollout_states.as_deref().unwrap_or(&self.walks);
        let sft = SftSection {
            perception_steps: steps,
            ..run.cfg.sft.clone()
        };
        let seed = agentrl_env_core::stable_hash(&[
            &run.cfg.trainer.seed.to_le_bytes(),
            &(step as u64).to_le_bytes(),
            b"perception",
        ]);
        let losses = pretrain_perception(
            model,
            opt,
            examples,
            &sft,
            run.cfg.actor.grad_clip,
            seed,
            |_, _, _| {},
        )?;
        Ok(Some(
            losses.iter().sum::<f32>() / losses.len().max(1) as f32,
        ))
    }
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
                return Err(TrainError::Config(ConfigError::Invalid(format!(
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
        return Err(TrainError::Config(ConfigError::Invalid(
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
    use crate::sft::demonstrations;
    use crate::sft::tests::{make, ByteCodec};
    use agentrl_rollout::RandomMoves;

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
    fn an_env_without_perception_is_a_clear_error() {
        let err = examples("bandit", 2, 0).unwrap_err().to_string();
        assert!(
            err.contains("no perception") && err.contains("sft.perception_steps"),
            "{err}"
        );
    }
}
