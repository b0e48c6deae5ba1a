//! The RL loop, read like the paper's algorithm box:
//!
//! ```text
//! warm start (SFT on expert demos) ─► evaluate "before"
//! for step in 1..=T:
//!     sample B train tasks, G rollouts each            (rollout engine)
//!     keep the top groups by raw-reward std            (StarPO-S)
//!     advantages                                       (GRPO / RLOO / RE++ / GAE / GiGPO)
//!     PPO epochs over mini-batches                     (clipped loss, KL, entropy, value)
//!     log metrics; evaluate every test_freq; checkpoint every save_freq
//! evaluate "after" ─► summary.json
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use agentrl_algos as algos;
use agentrl_env_core::{stable_hash, Env, EnvError, EnvParams, Split, TaskSpec, SPLIT_STRIDE};
use agentrl_model::{clip_grad_norm, AdamW, AdamWConfig, PolicyModel};
use agentrl_rollout::{run_rollouts, Trajectory};
use agentrl_tokenizer::ChatTokenizer;
use candle_core::Device;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::advantages::{self, shifted_masks};
use crate::batch::padded;
use crate::bootstrap::starting_policy;
use crate::config::TrainConfig;
use crate::evaluate::{evaluate, EnvMaker, EvalStats};
use crate::local_policy::LocalPolicy;
use crate::run_dir::{RunDir, TrainerState};
use crate::{sft, TrainError};

/// How a run reports progress to the person watching.
pub trait Progress {
    fn message(&mut self, text: &str);
    fn phase(&mut self, name: &str, total: usize);
    fn advance(&mut self, done: usize, text: &str);
    fn finish_phase(&mut self);
}

/// Progress that says nothing (tests, library use).
pub struct Silent;
impl Progress for Silent {
    fn message(&mut self, _: &str) {}
    fn phase(&mut self, _: &str, _: usize) {}
    fn advance(&mut self, _: usize, _: &str) {}
    fn finish_phase(&mut self) {}
}

/// What a finished run reports (also `RUN_DIR/summary.json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub env: String,
    pub difficulty: String,
    pub steps: usize,
    pub wall_seconds: f64,
    pub before: EvalStats,
    pub after: EvalStats,
    pub run_dir: PathBuf,
}

/// Figures of one RL step, written to `metrics.jsonl`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StepMetrics {
    pub step: usize,
    pub success: f64,
    pub reward_mean: f64,
    pub reward_std: f64,
    pub in_group_std_before: f32,
    pub in_group_std_after: f32,
    pub kept_groups: usize,
    pub entropy: f64,
    pub kl: f64,
    pub approx_kl: f64,
    pub clip_fraction: f64,
    pub grad_norm: f64,
    /// The actor's learning rate this step.
    pub lr: f64,
    pub pg_loss: f64,
    pub value_loss: f64,
    pub turns: f64,
    pub generated_tokens: f64,
    pub invalid_action_rate: f64,
    pub format_error_rate: f64,
    pub rollout_seconds: f64,
    pub update_seconds: f64,
}

/// This step's environments and the group of each.
type StepTasks = (Vec<Box<dyn Env>>, Vec<usize>);

/// Per-trajectory log-prob rows and, with a critic, value rows.
type ScoredRows = (Vec<Vec<f32>>, Option<Vec<Vec<f32>>>);

/// A training run in progress.
pub struct Trainer {
    pub cfg: TrainConfig,
    pub run: RunDir,
    pub tokenizer: ChatTokenizer,
    pub model: PolicyModel,
    reference: Option<PolicyModel>,
    opt: AdamW,
    pub state: TrainerState,
    device: Device,
}

fn uses_critic(cfg: &TrainConfig) -> bool {
    cfg.algorithm.adv_estimator == "gae"
}

fn needs_reference(cfg: &TrainConfig) -> bool {
    (cfg.actor.use_kl_loss && cfg.actor.kl_loss_coef > 0.0)
        || (cfg.algorithm.use_kl_in_reward && cfg.algorithm.kl_coef > 0.0)
}

fn kl_kind(name: &str) -> Result<algos::KlKind, TrainError> {
    Ok(name.parse()?)
}

fn loss_agg(name: &str) -> Result<algos::LossAgg, TrainError> {
    Ok(name.parse()?)
}

/// Environments in-process from the registry, or through an env server.
pub fn env_maker(cfg: &TrainConfig) -> Box<EnvMaker<'static>> {
    let endpoint = cfg.env.endpoint.clone();
    if endpoint.is_empty() {
        Box::new(|spec: &TaskSpec, params: &EnvParams| agentrl_envs::make_env(spec, params))
    } else {
        Box::new(
            move |spec: &TaskSpec, params: &EnvParams| -> Result<Box<dyn Env>, EnvError> {
                Ok(Box::new(agentrl_env_client::HttpEnv::connect(
                    &endpoint, spec, params, None,
                )?))
            },
        )
    }
}

/// The actor's learning rate at RL step `step` (1-based): a linear ramp over
/// `lr_warmup_steps`, then constant. A pure function of the step, so a
/// resumed run continues the same schedule.
pub fn rl_learning_rate(cfg: &TrainConfig, step: usize) -> f64 {
    let warmup = cfg.actor.lr_warmup_steps;
    if warmup == 0 || step >= warmup {
        cfg.actor.lr
    } else {
        cfg.actor.lr * step.max(1) as f64 / warmup as f64
    }
}

/// The RNG of one phase of one step: a pure function of (seed, step, phase),
/// so a resumed run replays exactly what an uninterrupted one would do.
fn step_rng(seed: u64, step: usize, phase: &str) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(stable_hash(&[
        &seed.to_le_bytes(),
        &(step as u64).to_le_bytes(),
        phase.as_bytes(),
    ]))
}

impl Trainer {
    /// Start a fresh run: tokenizer + model, warm start, "before" evaluation,
    /// checkpoint of step 0.
    pub fn start(
        cfg: TrainConfig,
        run_path: &Path,
        progress: &mut dyn Progress,
    ) -> Result<Self, TrainError> {
        // Wall time of the whole run: tokenizer, model, warm start, evaluations, RL.
        let started = Instant::now();
        let run = RunDir::create(run_path)?;
        run.write_config(&cfg.to_toml())?;
        let device = Device::Cpu;
        let make = env_maker(&cfg);
        progress.message("creating tokenizer and model");
        let (tokenizer, model) = starting_policy(&cfg, make.as_ref(), uses_critic(&cfg), &device)?;
        let opt = Self::optimizer(&cfg, &model)?;
        let mut t = Trainer {
            cfg,
            run,
            tokenizer,
            model,
            reference: None,
            opt,
            state: TrainerState::default(),
            device,
        };
        if t.cfg.sft.demos > 0 && t.cfg.sft.epochs > 0 {
            t.warm_start(progress)?;
            if !t.cfg.actor.keep_sft_optimizer {
                t.opt = Self::optimizer(&t.cfg, &t.model)?;
            }
        }
        progress.message("evaluating the starting policy on held-out validation seeds");
        let before = t.evaluate_now(0, "before")?;
        progress.message(&format!(
            "before RL: success {:.1}%",
            100.0 * before.success_rate
        ));
        t.state.before = Some(before);
        t.state.wall_seconds = started.elapsed().as_secs_f64();
        t.save_checkpoint()?;
        if needs_reference(&t.cfg) {
            t.reference = Some(PolicyModel::load(
                &t.run.checkpoint_dir(0),
                false,
                &t.device,
            )?);
        }
        Ok(t)
    }

    /// Continue a run from its latest checkpoint.
    pub fn resume(run_path: &Path) -> Result<Self, TrainError> {
        let run = RunDir::open(run_path)?;
        let cfg = TrainConfig::load(Some(&run.config_path()), &[])?;
        let ckpt = run.latest_checkpoint()?;
        let device = Device::Cpu;
        let tokenizer =
            ChatTokenizer::load(&ckpt).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        let model = PolicyModel::load(&ckpt, uses_critic(&cfg), &device)?;
        let mut opt = Self::optimizer(&cfg, &model)?;
        let opt_path = ckpt.join("optimizer.safetensors");
        if opt_path.exists() {
            opt.load_state(&opt_path)?;
        }
        let state = RunDir::read_state(&ckpt)?;
        run.truncate_logs_after(state.step)?;
        let reference = if needs_reference(&cfg) {
            Some(PolicyModel::load(&run.checkpoint_dir(0), false, &device)?)
        } else {
            None
        };
        Ok(Trainer {
            cfg,
            run,
            tokenizer,
            model,
            reference,
            opt,
            state,
            device,
        })
    }

    fn optimizer(cfg: &TrainConfig, model: &PolicyModel) -> Result<AdamW, TrainError> {
        Ok(AdamW::new(
            model.trainable_vars()?,
            AdamWConfig {
                lr: cfg.actor.lr,
                weight_decay: cfg.actor.weight_decay,
                eps: cfg.actor.adam_eps,
                ..AdamWConfig::default()
            },
        )?)
    }

    fn warm_start(&mut self, progress: &mut dyn Progress) -> Result<(), TrainError> {
        let make = env_maker(&self.cfg);
        let noise = self.cfg.sft.expert_noise;
        progress.message(&if noise >= 1.0 {
            format!(
                "warm start: {} demonstrations of random valid moves (teaches the reply format only)",
                self.cfg.sft.demos
            )
        } else if noise > 0.0 {
            format!(
                "warm start: {} expert demonstrations, {:.0}% of moves random",
                self.cfg.sft.demos,
                100.0 * noise
            )
        } else {
            format!("warm start: {} expert demonstrations", self.cfg.sft.demos)
        });
        // Demonstrations come from train seeds far from those RL samples first.
        let demos = sft::demonstrations(
            make.as_ref(),
            &self.tokenizer,
            &self.cfg.env.name,
            &self.cfg.env.difficulty,
            &self.cfg.env.params,
            &self.cfg.rollout,
            &self.cfg.sft,
            SPLIT_STRIDE / 2,
        )?;
        let batches = demos.len().div_ceil(self.cfg.sft.batch_size.max(1)) * self.cfg.sft.epochs;
        progress.phase("sft", batches);
        let losses = sft::train(
            &self.model,
            &mut self.opt,
            &demos,
            &self.cfg.sft,
            self.cfg.actor.grad_clip,
            self.cfg.trainer.seed,
            |done, _, l| {
                progress.advance(done, &format!("loss {l:.3}"));
            },
        )?;
        progress.finish_phase();
        self.run.log_metrics(
            &json!({"kind": "sft", "step": 0, "demos": demos.len(), "epoch_losses": losses}),
        )?;
        Ok(())
    }

    /// Validation on the held-out seeds (same seeds every time).
    pub fn evaluate_now(&mut self, step: usize, phase: &str) -> Result<EvalStats, TrainError> {
        let make = env_maker(&self.cfg);
        let c = &self.cfg;
        let mut policy = LocalPolicy { model: &self.model };
        let (stats, trajs) = evaluate(
            &mut policy,
            &self.tokenizer,
            make.as_ref(),
            &c.env.name,
            &c.env.difficulty,
            &c.env.params,
            Split::Val,
            0..c.trainer.val_tasks as u64,
            &c.rollout,
            c.trainer.val_temperature,
            c.trainer.seed ^ 0x5eed_0fa1,
        )?;
        let mut line = serde_json::to_value(&stats).unwrap_or(json!({}));
        if let Some(o) = line.as_object_mut() {
            o.insert("kind".into(), json!("eval"));
            o.insert("phase".into(), json!(phase));
            o.insert("step".into(), json!(step));
        }
        self.run.log_metrics(&line)?;
        if let Some(t) = trajs.first() {
            self.log_trajectory(step, phase, t)?;
        }
        Ok(stats)
    }

    fn log_trajectory(&self, step: usize, phase: &str, t: &Trajectory) -> Result<(), TrainError> {
        let text = self.tokenizer.decode(&t.tokens, false).unwrap_or_default();
        self.run.log_trajectory(&json!({
            "step": step, "phase": phase, "task": t.spec.to_string(), "success": t.success,
            "score": t.score(), "turns": t.turns.iter().map(|x| json!({"reply": x.reply, "actions": x.actions, "reward": x.reward()})).collect::<Vec<_>>(),
            "text": text,
        }))?;
        Ok(())
    }

    fn save_checkpoint(&mut self) -> Result<(), TrainError> {
        let dir = self.run.checkpoint_dir(self.state.step);
        std::fs::create_dir_all(&dir)
            .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", dir.display())))?;
        self.model.save(&dir)?;
        self.tokenizer
            .save(&dir)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        self.opt.save_state(&dir.join("optimizer.safetensors"))?;
        RunDir::write_state(&dir, &self.state)?;
        self.run.set_latest(self.state.step)?;
        Ok(())
    }

    /// Run the remaining RL steps, then the final evaluation and summary.
    pub fn train(&mut self, progress: &mut dyn Progress) -> Result<Summary, TrainError> {
        let session = Instant::now();
        let wall_before = self.state.wall_seconds;
        let total = self.cfg.trainer.total_training_steps;
        let mut last_eval: Option<(usize, EvalStats)> = None;
        progress.phase("rl", total);
        progress.advance(self.state.step, "");
        while self.state.step < total {
            let step = self.state.step + 1;
            let m = self.rl_step(step)?;
            self.run.log_metrics(&{
                let mut v = serde_json::to_value(&m).unwrap_or(json!({}));
                if let Some(o) = v.as_object_mut() {
                    o.insert("kind".into(), json!("train"));
                }
                v
            })?;
            self.state.step = step;
            if m.in_group_std_before == 0.0 {
                progress.message(&format!(
                    "step {step}: every group has identical rewards (no learning signal)"
                ));
            }
            let mut text = format!(
                "success {:.0}% reward {:.2}",
                100.0 * m.success,
                m.reward_mean
            );
            let freq = self.cfg.trainer.test_freq;
            if freq > 0 && step.is_multiple_of(freq) && step < total {
                let s = self.evaluate_now(step, "val")?;
                text.push_str(&format!(" | val {:.0}%", 100.0 * s.success_rate));
                progress.message(&format!(
                    "step {step}: validation success {:.1}%",
                    100.0 * s.success_rate
                ));
                last_eval = Some((step, s));
            }
            progress.advance(step, &text);
            let save = self.cfg.trainer.save_freq;
            if save > 0 && step.is_multiple_of(save) && step < total {
                self.state.wall_seconds = wall_before + session.elapsed().as_secs_f64();
                self.save_checkpoint()?;
            }
        }
        progress.finish_phase();
        let after = match last_eval {
            Some((s, stats)) if s == total => stats,
            _ => self.evaluate_now(total, "after")?,
        };
        self.state.wall_seconds = wall_before + session.elapsed().as_secs_f64();
        self.save_checkpoint()?;
        let before = self.state.before.clone().unwrap_or_default();
        let summary = Summary {
            env: self.cfg.env.name.clone(),
            difficulty: self.cfg.env.difficulty.clone(),
            steps: total,
            wall_seconds: self.state.wall_seconds,
            before,
            after,
            run_dir: self.run.path.clone(),
        };
        self.run
            .write_summary(&serde_json::to_value(&summary).unwrap_or(json!({})))?;
        Ok(summary)
    }

    /// Sample this step's tasks: B train seeds, each repeated G times.
    fn step_envs(&self, rng: &mut ChaCha8Rng) -> Result<StepTasks, TrainError> {
        let make = env_maker(&self.cfg);
        let c = &self.cfg;
        let mut envs = Vec::new();
        let mut groups = Vec::new();
        for g in 0..c.rollout.env_groups {
            let pool = match c.env.train_tasks {
                0 => SPLIT_STRIDE / 2,
                n => n,
            };
            let seed = rng.random_range(0..pool);
            let spec = TaskSpec::new(&c.env.name, Split::Train, &c.env.difficulty, seed);
            for _ in 0..c.rollout.n {
                envs.push(make(&spec, &c.env.params)?);
                groups.push(g);
            }
        }
        Ok((envs, groups))
    }

    /// One RL step: rollouts, filter, advantages, PPO update.
    pub fn rl_step(&mut self, step: usize) -> Result<StepMetrics, TrainError> {
        let seed = self.cfg.trainer.seed;
        let mut rng = step_rng(seed, step, "rollout");
        let t0 = Instant::now();
        let (envs, groups) = self.step_envs(&mut rng)?;
        let trajs = {
            let mut policy = LocalPolicy { model: &self.model };
            run_rollouts(
                &mut policy,
                &self.tokenizer,
                envs,
                &groups,
                &self.cfg.rollout,
                &mut rng,
            )?
        };
        let rollout_seconds = t0.elapsed().as_secs_f64();
        for t in trajs.iter().take(self.cfg.trainer.log_trajectories) {
            self.log_trajectory(step, "train", t)?;
        }

        // StarPO-S: keep the groups whose raw rewards disagree most.
        let raw: Vec<f32> = trajs.iter().map(Trajectory::raw_score).collect();
        let filter = algos::top_std_groups(&raw, &groups, self.cfg.rollout.rollout_filter_ratio)?;
        let kept: Vec<Trajectory> = trajs
            .iter()
            .zip(&filter.kept_mask)
            .filter(|(_, &k)| k)
            .map(|(t, _)| t.clone())
            .collect();

        let stats = crate::evaluate::EvalStats::of(&trajs);
        let scores: Vec<f64> = trajs.iter().map(|t| t.score() as f64).collect();
        let mean = scores.iter().sum::<f64>() / scores.len().max(1) as f64;
        let var =
            scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / scores.len().max(1) as f64;
        let mut m = StepMetrics {
            step,
            success: stats.success_rate,
            reward_mean: mean,
            reward_std: var.sqrt(),
            in_group_std_before: filter.std_before,
            in_group_std_after: filter.std_after,
            kept_groups: filter.kept_groups.len(),
            turns: stats.mean_turns,
            generated_tokens: stats.mean_generated_tokens,
            invalid_action_rate: stats.invalid_action_rate,
            format_error_rate: stats.format_error_rate,
            rollout_seconds,
            lr: rl_learning_rate(&self.cfg, step),
            ..Default::default()
        };
        let t1 = Instant::now();
        self.update(&kept, step, &mut m)?;
        m.update_seconds = t1.elapsed().as_secs_f64();
        Ok(m)
    }

    /// No-grad pass: log-probs (and values) of each trajectory under the
    /// current policy, in the shifted frame, trimmed to each row's length.
    fn score_rows(
        &self,
        model: &PolicyModel,
        trajs: &[Trajectory],
    ) -> Result<ScoredRows, TrainError> {
        let mut lps = Vec::new();
        let mut vals = Vec::new();
        let mb = self.cfg.actor.ppo_mini_batch_size.max(1);
        for chunk in trajs.chunks(mb) {
            let seqs: Vec<Vec<u32>> = chunk.iter().map(|t| t.tokens.clone()).collect();
            let out = model.sequence_logprobs(&seqs)?;
            let lp = out.logprobs.detach().to_vec2::<f32>()?;
            for (row, t) in lp.into_iter().zip(chunk) {
                lps.push(row[..t.tokens.len() - 1].to_vec());
            }
            if let Some(v) = out.values {
                let v = v.detach().to_vec2::<f32>()?;
                for (row, t) in v.into_iter().zip(chunk) {
                    vals.push(row[..t.tokens.len() - 1].to_vec());
                }
            }
        }
        let vals = if vals.is_empty() { None } else { Some(vals) };
        Ok((lps, vals))
    }

    /// One PPO update (all epochs and mini-batches) on `trajs`, with
    /// advantages from their scores; writes the update's figures into `m`.
    pub fn update(
        &mut self,
        trajs: &[Trajectory],
        step: usize,
        m: &mut StepMetrics,
    ) -> Result<(), TrainError> {
        if trajs.is_empty() {
            return Ok(());
        }
        let c = self.cfg.clone();
        let mb = c.actor.ppo_mini_batch_size.max(1);
        let single_update = c.actor.ppo_epochs == 1 && trajs.len() <= mb;
        // Old log-probs: with one update on fresh samples the current policy
        // *is* the sampling policy, so its detached log-probs serve; otherwise
        // score everything once before the first update.
        let (old_lp, old_values) = if single_update && !uses_critic(&c) {
            (None, None)
        } else {
            let (lp, v) = self.score_rows(&self.model, trajs)?;
            (Some(lp), v)
        };
        let ref_lp = match (
            &self.reference,
            c.algorithm.use_kl_in_reward || c.actor.use_kl_loss,
        ) {
            (Some(r), true) => Some(self.score_rows(r, trajs)?.0),
            _ => None,
        };
        let mut trajs_for_adv: Vec<Trajectory> = trajs.to_vec();
        if let (true, Some(refs), Some(olds)) = (c.algorithm.use_kl_in_reward, &ref_lp, &old_lp) {
            // KL in the reward: subtract β·k1 summed over each turn's tokens from that turn's reward.
            for ((t, r), o) in trajs_for_adv.iter_mut().zip(refs).zip(olds) {
                for turn in t.turns.iter_mut() {
                    let kl: f32 = (turn.start.max(1)..turn.end)
                        .map(|i| o[i - 1] - r[i - 1])
                        .sum();
                    turn.penalty -= c.algorithm.kl_coef * kl;
                }
            }
        }
        let targets = advantages::compute(&c.algorithm, &trajs_for_adv, old_values.as_deref())?;
        // No advantage anywhere (every kept group had equal returns) and no
        // other loss: an optimizer step would only apply Adam's normalised
        // noise (or the entropy bonus at full speed), so skip it.
        let signal = targets.advantages.iter().flatten().any(|&a| a != 0.0);
        let other_loss = uses_critic(&c) || (c.actor.use_kl_loss && c.actor.kl_loss_coef > 0.0);
        if !signal && !other_loss {
            return Ok(());
        }
        self.opt.set_lr(rl_learning_rate(&c, step));
        let masks = shifted_masks(trajs);
        let agg = loss_agg(&c.actor.loss_agg_mode)?;
        let kl_type = kl_kind(&c.actor.kl_loss_type)?;
        let vars = self.model.trainable_vars()?;
        let mut rng = step_rng(c.trainer.seed, step, "minibatch");
        let mut order: Vec<usize> = (0..trajs.len()).collect();
        let (mut n, mut ent, mut kl_sum, mut akl, mut clip, mut gn, mut pg, mut vl) =
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for _ in 0..c.actor.ppo_epochs {
            order.shuffle(&mut rng);
            for chunk in order.chunks(mb) {
                let seqs: Vec<Vec<u32>> = chunk.iter().map(|&i| trajs[i].tokens.clone()).collect();
                let out = self.model.sequence_logprobs(&seqs)?;
                let w = out.logprobs.dim(1)?;
                let rows = |src: &Vec<Vec<f32>>| -> Vec<Vec<f32>> {
                    chunk.iter().map(|&i| src[i].clone()).collect()
                };
                let dev = &self.device;
                let mask = padded(&rows(&masks), w, dev)?;
                let adv = padded(&rows(&targets.advantages), w, dev)?;
                let old = match &old_lp {
                    Some(o) => padded(&rows(o), w, dev)?,
                    None => out.logprobs.detach(),
                };
                let pl = algos::ppo_policy_loss(
                    &out.logprobs,
                    &old,
                    &adv,
                    &mask,
                    &algos::PpoClip {
                        clip_ratio_low: c.actor.clip_ratio_low,
                        clip_ratio_high: c.actor.clip_ratio_high,
                        clip_ratio_c: (c.actor.clip_ratio_c > 1.0).then_some(c.actor.clip_ratio_c),
                    },
                    agg,
                )?;
                let mut loss = pl.loss.clone();
                let entropy = algos::aggregate(&out.entropy, &mask, agg)?;
                if c.actor.entropy_coeff != 0.0 {
                    loss = (loss - (&entropy * c.actor.entropy_coeff as f64)?)?;
                }
                if let (Some(r), true) =
                    (&ref_lp, c.actor.use_kl_loss && c.actor.kl_loss_coef > 0.0)
                {
                    let reft = padded(&rows(r), w, dev)?;
                    let kl = algos::aggregate(
                        &algos::kl_penalty(&out.logprobs, &reft, kl_type)?,
                        &mask,
                        agg,
                    )?;
                    kl_sum += kl.to_scalar::<f32>()? as f64;
                    loss = (loss + (kl * c.actor.kl_loss_coef as f64)?)?;
                }
                if let (Some(values), Some(returns), Some(oldv)) =
                    (&out.values, &targets.returns, &old_values)
                {
                    let v = values.narrow(1, 0, w)?;
                    let vloss = algos::value_loss(
                        &v,
                        &padded(&rows(oldv), w, dev)?,
                        &padded(&rows(returns), w, dev)?,
                        &mask,
                        c.critic.cliprange_value,
                        agg,
                    )?
                    .loss;
                    vl += vloss.to_scalar::<f32>()? as f64;
                    loss = (loss + (vloss * c.critic.value_loss_coef as f64)?)?;
                }
                let mut grads = loss.backward()?;
                gn += clip_grad_norm(&mut grads, &vars, c.actor.grad_clip)?;
                self.opt.step(&grads)?;
                n += 1.0;
                ent += entropy.to_scalar::<f32>()? as f64;
                pg += pl.loss.to_scalar::<f32>()? as f64;
                akl += pl.approx_kl as f64;
                clip += pl.clip_fraction as f64;
            }
        }
        m.entropy = ent / n;
        m.kl = kl_sum / n;
        m.approx_kl = akl / n;
        m.clip_fraction = clip / n;
        m.grad_norm = gn / n;
        m.pg_loss = pg / n;
        m.value_loss = vl / n;
        Ok(())
    }
}
