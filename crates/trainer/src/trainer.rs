//! The RL loop, read like the paper's algorithm box:
//!
//! ```text
//! warm start (SFT on expert demos) ─► evaluate "before"
//! for step in 1..=T:
//!     this step's turn budget and difficulty           (ScalingInter-RL, curriculum)
//!     sample B train tasks, G rollouts each            (rollout engine; a mixture deals B by weight)
//!     keep the top groups by raw-reward std            (StarPO-S)
//!     advantages                                       (GRPO / RLOO / RE++ / GAE / GiGPO)
//!     PPO epochs over mini-batches                     (clipped loss, KL, entropy, value)
//!     log metrics; evaluate every test_freq; checkpoint every save_freq
//! evaluate "after" ─► summary.json
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use agentrl_algos as algos;
use agentrl_env_core::{stable_hash, Env, EnvError, EnvParams, Split, TaskSpec, SPLIT_STRIDE};
use agentrl_model::{AdamW, AdamWConfig, PolicyModel};
use agentrl_rollout::{
    run_rollouts, EpisodeTally, FailureCounts, GroupFilterType, Policy, PolicyActor, RandomMoves,
    RolloutConfig, SamplingParams, Trajectory,
};
use agentrl_tokenizer::ChatTokenizer;
use candle_core::{Device, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::advantages;
use crate::batch::{PpoBatch, Scoring};
use crate::bootstrap::starting_policy;
use crate::collapse::{CollapseSignal, CollapseWatch, StepSignals};
use crate::config::{SftSection, TrainConfig};
use crate::evaluate::{evaluate, EnvMaker, EvalPlan, EvalStats};
use crate::local_policy::LocalPolicy;
use crate::mixture::{groups_per_source, sources_at, task_sources, TaskSource};
use crate::perception::{check_readings_exist, PerceptionTask, RunInputs};
use crate::ppo::{ppo_update, split_value_head, Optimizers, StepLr, UpdateStats};
use crate::remote_generation::{rollout_logprob_rows, RecordingPolicy, RemoteGeneration};
use crate::run_dir::{BestCheckpoint, RunDir, TrainerState};
use crate::schedule::max_turns_at;
use crate::template_collapse;
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
    /// The greedy policy (temperature 0) before and after RL, with
    /// `trainer.val_greedy` (absent when validation is greedy already).
    pub before_greedy: Option<EvalStats>,
    pub after_greedy: Option<EvalStats>,
    /// The best validation along the run; its weights are in `checkpoints/best`.
    pub best: Option<BestCheckpoint>,
    /// Every collapse signal the watch raised, with the step it rose at.
    pub collapse_warnings: Vec<CollapseWarning>,
    /// With a mixture: validation of each task source (`env/difficulty`)
    /// before and after RL (`before`/`after` pool them).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub before_per_env: BTreeMap<String, EvalStats>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub after_per_env: BTreeMap<String, EvalStats>,
    pub run_dir: PathBuf,
}

/// A collapse signal raised at an RL step.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CollapseWarning {
    pub step: usize,
    pub signal: CollapseSignal,
}

/// Figures of one RL step, written to `metrics.jsonl`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    pub step: usize,
    pub success: f64,
    pub reward_mean: f64,
    pub reward_std: f64,
    pub in_group_std_before: f32,
    pub in_group_std_after: f32,
    pub kept_groups: usize,
    /// The actor's learning rate this step.
    pub lr: f64,
    /// The update's figures (all zero when the step took no update).
    #[serde(flatten)]
    pub update: UpdateStats,
    pub turns: f64,
    pub generated_tokens: f64,
    pub invalid_action_rate: f64,
    pub format_error_rate: f64,
    pub rollout_seconds: f64,
    pub update_seconds: f64,
    /// This step's turn budget (ScalingInter-RL's stage, or `max_turns`).
    #[serde(default)]
    pub max_turns: usize,
    /// This step's training difficulty (the curriculum's stage); empty for
    /// a mixture, whose sources are in `per_env`.
    #[serde(default)]
    pub difficulty: String,
    /// With a mixture: each source's figures this step (`env/difficulty`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_env: BTreeMap<String, EvalStats>,
    /// The collapse signals that hold after this step.
    #[serde(default)]
    pub collapse: Vec<CollapseSignal>,
    /// RAGEN-2's template-collapse diagnostics of this step's first turns
    /// (with `collapse.mi_every`; absent when not measured or not measurable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_collapse: Option<algos::TemplateCollapse>,
    /// Mean loss of the perception updates after this step's update
    /// (`actor.perception_steps_per_update`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perception_loss: Option<f32>,
    /// With rollouts generated by a server (`policy.endpoint`): the served
    /// model (this step's LoRA adapter) that generated them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_model: Option<String>,
    /// With rollouts generated by a server: the truncated importance
    /// ratios between the trainer's and the server's log-probs of the
    /// sampled tokens of the update's trajectories (`algorithm.rollout_is_cap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_is: Option<algos::RolloutIsStats>,
}

impl StepMetrics {
    /// What the collapse watch reads of this step.
    fn signals(&self) -> StepSignals {
        let u = &self.update;
        StepSignals {
            in_group_std: self.in_group_std_before as f64,
            success: self.success,
            // A skipped update reports zeros: nothing was measured.
            update: (u.entropy != 0.0 || u.grad_norm != 0.0).then_some((u.entropy, u.grad_norm)),
        }
    }
}

/// This step's environments and the group of each.
type StepTasks = (Vec<Box<dyn Env>>, Vec<usize>);

/// A training run in progress.
pub struct Trainer {
    pub cfg: TrainConfig,
    pub run: RunDir,
    pub tokenizer: ChatTokenizer,
    pub model: PolicyModel,
    reference: Option<PolicyModel>,
    opts: Optimizers,
    pub state: TrainerState,
    device: Device,
    watch: CollapseWatch,
    warnings: Vec<CollapseWarning>,
    /// Built once per run: a pool of env servers keeps what it learnt
    /// (which server is down, where sessions are) across phases.
    make: Box<EnvMaker<'static>>,
    /// With `policy.endpoint`: the server that generates every rollout
    /// (training and validation) with the current LoRA adapter.
    remote: Option<RemoteGeneration>,
    /// The perception auxiliary task of the tiny recipes (idle unless
    /// configured).
    perception: PerceptionTask,
}

fn uses_critic(cfg: &TrainConfig) -> bool {
    cfg.algorithm.adv_estimator.needs_critic()
}

/// A checkpoint of the run, its products in `model.precision` (its
/// backward recomputing activations under `model.gradient_checkpointing`,
/// its attention as `model.flash_attention` says).
fn load_in_precision(
    dir: &Path,
    with_value_head: bool,
    device: &Device,
    cfg: &TrainConfig,
) -> Result<PolicyModel, TrainError> {
    let mut model = PolicyModel::load(dir, with_value_head, device)?;
    model.set_precision(cfg.model.precision)?;
    model.set_gradient_checkpointing(cfg.model.gradient_checkpointing);
    model.set_flash_attention(cfg.model.flash_attention);
    Ok(model)
}

/// Restricts RL to the top `actor.train_top_layers` layers of `model`; a
/// count the model cannot take is an error naming the key.
fn train_top_layers(cfg: &TrainConfig, model: &mut PolicyModel) -> Result<(), TrainError> {
    model
        .train_top_layers(cfg.actor.train_top_layers)
        .map_err(|e| {
            crate::config::ConfigError::Invalid(format!("actor.train_top_layers: {e}")).into()
        })
}

fn needs_reference(cfg: &TrainConfig) -> bool {
    cfg.actor.has_kl_loss() || kl_in_reward(cfg)
}

/// KL to the reference is taken off the reward.
fn kl_in_reward(cfg: &TrainConfig) -> bool {
    cfg.algorithm.use_kl_in_reward && cfg.algorithm.kl_coef > 0.0
}

/// The actor's AdamW state in a checkpoint directory.
const ACTOR_OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The value head's AdamW state (runs with a critic).
const CRITIC_OPTIMIZER_FILE: &str = "critic_optimizer.safetensors";

/// Environments in-process from the registry, or through an env server
/// (`env.protocol`; AgentGym tasks by `env.data_idx`).
pub fn env_maker(cfg: &TrainConfig) -> Result<Box<EnvMaker<'static>>, EnvError> {
    if cfg.env.endpoint.is_empty() {
        Ok(Box::new(|spec: &TaskSpec, params: &EnvParams| {
            agentrl_envs::make_env(spec, params)
        }))
    } else {
        crate::remote_env::remote_maker(&cfg.env, cfg.env.data_idx.clone())
    }
}

/// With `policy.endpoint`, the server that generates the run's rollouts
/// (the config's checks have made sure LoRA is on).
fn remote_generation(
    cfg: &TrainConfig,
    run_dir: &Path,
) -> Result<Option<RemoteGeneration>, TrainError> {
    match cfg.policy.endpoint.is_empty() {
        true => Ok(None),
        false => Ok(Some(RemoteGeneration::connect(&cfg.policy, run_dir)?)),
    }
}

/// The learning rates at RL step `step` (1-based): `actor.lr` and
/// `critic.lr`, each on a linear ramp over `actor.lr_warmup_steps`, then
/// constant. A pure function of the step, so a resumed run continues the
/// same schedule.
pub fn rl_learning_rates(cfg: &TrainConfig, step: usize) -> StepLr {
    let warmup = cfg.actor.lr_warmup_steps;
    let ramp = |lr: f64| {
        if warmup == 0 || step >= warmup {
            lr
        } else {
            lr * step.max(1) as f64 / warmup as f64
        }
    };
    StepLr {
        actor: ramp(cfg.actor.lr),
        critic: ramp(cfg.critic.lr),
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
        // Before any work: values (a config built in code has not been
        // through `TrainConfig::load`) and the model directory.
        cfg.validate_for_new_run()?;
        let make = env_maker(&cfg)?;
        // Before the run directory exists, so a fixed config can rerun there.
        check_readings_exist(&cfg, make.as_ref())?;
        // Also before it: a machine without the configured GPU.
        let device = cfg.trainer.device.open()?;
        // From here until the first checkpoint, a failure (or a panic)
        // removes what the start wrote, so the same command can run again.
        let (run, unfinished) = RunDir::create_for_start(run_path)?;
        let run = run.watch_in_tensorboard()?;
        run.write_config(&cfg.to_toml()?)?;
        let remote = remote_generation(&cfg, &run.path)?;
        progress.message("creating tokenizer and model");
        let (tokenizer, model) = starting_policy(&cfg, make.as_ref(), uses_critic(&cfg), &device)?;
        let watch = CollapseWatch::new(cfg.collapse.clone());
        let opts = Self::optimizers(&cfg, &model)?;
        let mut t = Trainer {
            cfg,
            run,
            tokenizer,
            model,
            reference: None,
            opts,
            state: TrainerState::default(),
            watch,
            warnings: Vec::new(),
            device,
            make,
            remote,
            perception: PerceptionTask::default(),
        };
        // What the tokenizer cannot serve fails now, not after the warm
        // start's minutes.
        if !t.cfg.actor.train_thoughts {
            t.thought_end_token()?;
        }
        let perceive = t.cfg.sft.perception_steps > 0;
        let warm_start = t.cfg.sft.demos > 0 && t.cfg.sft.epochs > 0;
        if perceive {
            let run = RunInputs::of(&t.cfg, t.make.as_ref(), &t.tokenizer);
            let metrics = t
                .perception
                .pretrain(&run, &t.model, &mut t.opts.actor, progress)?;
            t.run.log_metrics(&metrics)?;
        }
        if warm_start {
            t.warm_start(progress)?;
        }
        if (perceive || warm_start) && !t.cfg.actor.keep_sft_optimizer {
            t.opts = Self::optimizers(&t.cfg, &t.model)?;
        }
        if t.cfg.lora.enabled {
            // RL trains only the adapter, on the (warmed-up) model as its frozen base.
            let lora = t.cfg.lora.adapter_config().map_err(|(key, why)| {
                crate::config::ConfigError::Invalid(format!("{key}: {why}"))
            })?;
            t.model.attach_lora(lora, t.cfg.lora.init_seed)?;
            t.opts = Self::optimizers(&t.cfg, &t.model)?;
        }
        if t.cfg.actor.train_top_layers > 0 {
            train_top_layers(&t.cfg, &mut t.model)?;
            t.opts = Self::optimizers(&t.cfg, &t.model)?;
        }
        progress.message("evaluating the starting policy on held-out validation seeds");
        let (before, before_per_env) =
            t.validate_sources(0, "before", t.cfg.trainer.val_temperature)?;
        t.state.before_per_env = before_per_env;
        progress.message(&format!(
            "before RL: success {:.1}%",
            100.0 * before.success_rate
        ));
        t.keep_if_best(0, &before)?;
        t.state.before = Some(before);
        if t.greedy_validation() {
            t.state.before_greedy = Some(t.evaluate_greedy(0, "before_greedy")?);
        }
        t.state.wall_seconds = started.elapsed().as_secs_f64();
        t.save_checkpoint()?;
        unfinished.first_checkpoint();
        if needs_reference(&t.cfg) {
            t.reference = Some(load_in_precision(
                &t.run.checkpoint_dir(0),
                false,
                &t.device,
                &t.cfg,
            )?);
        }
        Ok(t)
    }

    /// Continue a run from its latest checkpoint.
    pub fn resume(run_path: &Path) -> Result<Self, TrainError> {
        let run = RunDir::open(run_path)?.watch_in_tensorboard()?;
        // A kill mid-write leaves a temporary file beside the one it replaced.
        run.remove_temporaries()?;
        let cfg = TrainConfig::load(Some(&run.config_path()), &[])?;
        let cfg_for_make = cfg.clone();
        let ckpt = run.latest_checkpoint()?;
        let remote = remote_generation(&cfg, &run.path)?;
        let device = cfg.trainer.device.open()?;
        let tokenizer =
            ChatTokenizer::load(&ckpt).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        let mut model = load_in_precision(&ckpt, uses_critic(&cfg), &device, &cfg)?;
        if cfg.lora.enabled != model.lora().is_some() {
            return Err(TrainError::Checkpoint(format!(
                "{}: lora.enabled is {} but the checkpoint {} a LoRA adapter",
                ckpt.display(),
                cfg.lora.enabled,
                if cfg.lora.enabled { "has no" } else { "has" }
            )));
        }
        if cfg.actor.train_top_layers > 0 {
            train_top_layers(&cfg, &mut model)?;
        }
        let mut opts = Self::optimizers(&cfg, &model)?;
        opts.actor.load_state(&ckpt.join(ACTOR_OPTIMIZER_FILE))?;
        if let Some(critic) = &mut opts.critic {
            critic.load_state(&ckpt.join(CRITIC_OPTIMIZER_FILE))?;
        }
        let state = RunDir::read_state(&ckpt)?;
        run.truncate_logs_after(state.step)?;
        let reference = if needs_reference(&cfg) {
            Some(load_in_precision(
                &run.checkpoint_dir(0),
                false,
                &device,
                &cfg,
            )?)
        } else {
            None
        };
        // The watch's memory is the run's own log: replay the kept steps.
        let mut watch = CollapseWatch::new(cfg.collapse.clone());
        let mut warnings = Vec::new();
        for record in run.train_records()? {
            let m: StepMetrics = serde_json::from_value(record).map_err(|e| {
                TrainError::Checkpoint(format!(
                    "metrics.jsonl: a train record does not read back: {e}"
                ))
            })?;
            for signal in watch.observe(m.signals()) {
                warnings.push(CollapseWarning {
                    step: m.step,
                    signal,
                });
            }
        }
        Ok(Trainer {
            cfg,
            run,
            tokenizer,
            model,
            reference,
            opts,
            state,
            device,
            watch,
            warnings,
            make: env_maker(&cfg_for_make)?,
            remote,
            perception: PerceptionTask::default(),
        })
    }

    /// A fresh AdamW for the actor (every weight but the value head's) at
    /// `actor.lr`, and with a value head one for it at `critic.lr`.
    fn optimizers(cfg: &TrainConfig, model: &PolicyModel) -> Result<Optimizers, TrainError> {
        let adamw = |vars: Vec<Var>, lr: f64| {
            AdamW::new(
                vars,
                AdamWConfig {
                    lr,
                    weight_decay: cfg.actor.weight_decay,
                    eps: cfg.actor.adam_eps,
                    ..AdamWConfig::default()
                },
            )
        };
        let (head, rest) = split_value_head(model)?;
        Ok(Optimizers {
            actor: adamw(rest, cfg.actor.lr)?,
            critic: match head.is_empty() {
                true => None,
                false => Some(adamw(head, cfg.critic.lr)?),
            },
        })
    }

    /// The one token that closes a thought (`actor.train_thoughts = false`).
    fn thought_end_token(&self) -> Result<u32, TrainError> {
        let ids = self
            .tokenizer
            .encode("</think>")
            .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
        match ids[..] {
            [id] => Ok(id),
            _ => Err(TrainError::Config(crate::config::ConfigError::Invalid(format!(
                "actor.train_thoughts = false: the tokenizer splits </think> into {} tokens; it must be one (a special token) to find where thoughts end",
                ids.len()
            )))),
        }
    }

    fn warm_start(&mut self, progress: &mut dyn Progress) -> Result<(), TrainError> {
        let make = self.make.as_ref();
        let noise = self.cfg.sft.expert_noise;
        let safe = self.cfg.sft.random_moves == RandomMoves::Safe;
        progress.message(&if noise >= 1.0 && safe {
            format!(
                "warm start: {} demonstrations of random safe moves (the reply format, and no move its reading rules out)",
                self.cfg.sft.demos
            )
        } else if noise >= 1.0 {
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
        // Demonstrations come from train seeds far from those RL samples
        // first; a mixture's are dealt among its sources by weight.
        let sources = self.sources_at(&self.cfg.env.difficulty);
        let weights: Vec<f64> = sources.iter().map(|s| s.weight).collect();
        let counts = groups_per_source(&weights, self.cfg.sft.demos, 1);
        let mut demos = Vec::new();
        for (source, count) in sources.iter().zip(counts) {
            demos.extend(sft::demonstrations(
                make,
                &self.tokenizer,
                &source.env,
                &source.difficulty,
                &source.params,
                &self.cfg.rollout,
                &SftSection {
                    demos: count,
                    ..self.cfg.sft.clone()
                },
                SPLIT_STRIDE / 2,
            )?);
        }
        let batches = demos.len().div_ceil(self.cfg.sft.batch_size.max(1)) * self.cfg.sft.epochs;
        progress.phase("sft", batches);
        let losses = sft::train(
            &self.model,
            &mut self.opts.actor,
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
        Ok(self
            .validate_sources(step, phase, self.cfg.trainer.val_temperature)?
            .0)
    }

    /// Validation of the greedy policy (temperature 0).
    pub fn evaluate_greedy(&mut self, step: usize, phase: &str) -> Result<EvalStats, TrainError> {
        Ok(self.validate_sources(step, phase, 0.0)?.0)
    }

    /// Validation of every task source at `temperature`: the pooled figures
    /// (logged as the `eval` record of `phase`, as a one-env run's) and,
    /// with a mixture, each source's (logged as `eval_env` records).
    fn validate_sources(
        &mut self,
        step: usize,
        phase: &str,
        temperature: f64,
    ) -> Result<(EvalStats, BTreeMap<String, EvalStats>), TrainError> {
        let sources = task_sources(&self.cfg);
        if let [source] = sources.as_slice() {
            let (stats, _) = self.validate(step, phase, temperature, source, "eval")?;
            return Ok((stats, BTreeMap::new()));
        }
        let mut per_env = BTreeMap::new();
        let mut all = Vec::new();
        for source in &sources {
            let (stats, trajs) = self.validate(step, phase, temperature, source, "eval_env")?;
            per_env.insert(source.key(), stats);
            all.extend(trajs);
        }
        let pooled = EvalStats::of(&all);
        let mut failures = FailureCounts::default();
        failures.add(&all, self.cfg.rollout.max_turns);
        self.run.log_record(
            &pooled,
            &[
                ("kind", json!("eval")),
                ("phase", json!(phase)),
                ("step", json!(step)),
                ("failures", json!(failures)),
            ],
        )?;
        Ok((pooled, per_env))
    }

    /// Whether the run also validates greedily (see `trainer.val_greedy`).
    fn greedy_validation(&self) -> bool {
        self.cfg.trainer.val_greedy && self.cfg.trainer.val_temperature != 0.0
    }

    /// If `stats` (validation at step `step`) beats the best so far, keep the
    /// current weights and tokenizer as `checkpoints/best` (written aside,
    /// then renamed over the old one, so a kill leaves one whole copy).
    fn keep_if_best(&mut self, step: usize, stats: &EvalStats) -> Result<(), TrainError> {
        if let Some(b) = &self.state.best {
            if stats.success_rate <= b.success_rate {
                return Ok(());
            }
        }
        let dir = self.run.best_checkpoint_dir();
        let tmp = dir.with_extension("tmp");
        let io =
            |p: &Path, e: std::io::Error| TrainError::Checkpoint(format!("{}: {e}", p.display()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        self.model.save(&tmp)?;
        self.tokenizer
            .save(&tmp)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io(&dir, e))?;
        }
        std::fs::rename(&tmp, &dir).map_err(|e| io(&dir, e))?;
        self.state.best = Some(BestCheckpoint {
            step,
            success_rate: stats.success_rate,
        });
        Ok(())
    }

    /// Validation of `source` at `temperature`, logged as a `kind` record
    /// of `phase` (with the source's env and difficulty).
    fn validate(
        &mut self,
        step: usize,
        phase: &str,
        temperature: f64,
        source: &TaskSource,
        kind: &str,
    ) -> Result<(EvalStats, Vec<Trajectory>), TrainError> {
        let make = self.make.as_ref();
        let c = &self.cfg;
        let mut local;
        let policy: &mut dyn Policy = match &mut self.remote {
            None => {
                local = LocalPolicy::with_cache_reuse(&self.model, c.rollout.kv_cache_reuse);
                &mut local
            }
            Some(remote) => remote.policy_at(&self.model, self.state.step)?,
        };
        let sampling = SamplingParams {
            temperature,
            ..c.rollout.sampling(self.tokenizer.im_end_id())
        };
        let (stats, trajs) = evaluate(
            &mut PolicyActor::new(policy, sampling),
            &EvalPlan {
                make,
                env: &source.env,
                difficulty: &source.difficulty,
                params: &source.params,
                split: Split::Val,
                seeds: 0..c.trainer.val_tasks as u64,
                samples: 1,
                codec: Some(&self.tokenizer),
                rollout: &c.rollout,
                seed: c.trainer.seed ^ 0x5eed_0fa1,
            },
        )?;
        let mut failures = FailureCounts::default();
        failures.add(&trajs, c.rollout.max_turns);
        let mut fields = vec![
            ("kind", json!(kind)),
            ("phase", json!(phase)),
            ("step", json!(step)),
            ("failures", json!(failures)),
        ];
        if kind != "eval" {
            fields.push(("env", json!(source.env)));
            fields.push(("difficulty", json!(source.difficulty)));
        }
        self.run.log_record(&stats, &fields)?;
        if let Some(t) = trajs.first() {
            self.log_trajectory(step, phase, t)?;
        }
        Ok((stats, trajs))
    }

    fn log_trajectory(&self, step: usize, phase: &str, t: &Trajectory) -> Result<(), TrainError> {
        let text = self
            .tokenizer
            .decode(&t.tokens, false)
            .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
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
        self.opts
            .actor
            .save_state(&dir.join(ACTOR_OPTIMIZER_FILE))?;
        if let Some(critic) = &self.opts.critic {
            critic.save_state(&dir.join(CRITIC_OPTIMIZER_FILE))?;
        }
        RunDir::write_state(&dir, &self.state)?;
        // Every file above was synced as it was renamed into place; the logs
        // and the new directory's entry go to disk before `latest` names it.
        self.run.sync_logs()?;
        self.run.set_latest(self.state.step)?;
        let keep = self.cfg.trainer.keep_checkpoints;
        if keep > 0 {
            let mut protect = vec![self.state.step];
            if needs_reference(&self.cfg) {
                protect.push(0);
            }
            self.run.prune_checkpoints(keep, &protect)?;
        }
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
            self.announce_stages(step, progress);
            let mut m = self.rl_step(step)?;
            for signal in self.watch.observe(m.signals()) {
                let text = format!("step {step}: collapse warning: {}", signal.describe());
                progress.message(&text);
                self.warnings.push(CollapseWarning { step, signal });
            }
            m.collapse = self.watch.active().to_vec();
            self.run.log_record(&m, &[("kind", json!("train"))])?;
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
                self.keep_if_best(step, &s)?;
                text.push_str(&format!(" | val {:.0}%", 100.0 * s.success_rate));
                progress.message(&format!(
                    "step {step}: validation success {:.1}%",
                    100.0 * s.success_rate
                ));
                if self.cfg.curriculum.by_threshold() {
                    self.curriculum_check(step, &s, progress)?;
                }
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
        let (after, after_per_env) = match last_eval {
            Some((s, stats)) if s == total => (stats, BTreeMap::new()),
            _ => self.validate_sources(total, "after", self.cfg.trainer.val_temperature)?,
        };
        self.keep_if_best(total, &after)?;
        let after_greedy = match self.greedy_validation() {
            true => Some(self.evaluate_greedy(total, "after_greedy")?),
            false => None,
        };
        self.state.wall_seconds = wall_before + session.elapsed().as_secs_f64();
        self.save_checkpoint()?;
        let before = self.state.before.clone().ok_or_else(|| {
            TrainError::Checkpoint("the trainer state has no 'before' evaluation".into())
        })?;
        let sources = task_sources(&self.cfg);
        let (env, difficulty) = match sources.as_slice() {
            [one] => (one.env.clone(), one.difficulty.clone()),
            many => (
                many.iter()
                    .map(|s| s.env.as_str())
                    .collect::<Vec<_>>()
                    .join("+"),
                many.iter()
                    .map(|s| s.difficulty.as_str())
                    .collect::<Vec<_>>()
                    .join("+"),
            ),
        };
        let summary = Summary {
            env,
            difficulty,
            steps: total,
            wall_seconds: self.state.wall_seconds,
            before,
            after,
            before_greedy: self.state.before_greedy.clone(),
            after_greedy,
            best: self.state.best.clone(),
            collapse_warnings: self.warnings.clone(),
            before_per_env: self.state.before_per_env.clone(),
            after_per_env,
            run_dir: self.run.path.clone(),
        };
        self.run.write_summary(&summary)?;
        Ok(summary)
    }

    /// The sources RL draws from at `step`: the mixture's entries, or the
    /// env at the curriculum's difficulty for the step.
    pub fn step_sources(&self, step: usize) -> Vec<TaskSource> {
        self.sources_at(self.cfg.curriculum.difficulty_at(
            step,
            self.state.curriculum_stage,
            &self.cfg.env.difficulty,
        ))
    }

    /// The mixture's entries, or the one env (a one-entry mixture too) at
    /// `difficulty`. The warm start and the perception examples use
    /// `env.difficulty`.
    fn sources_at(&self, difficulty: &str) -> Vec<TaskSource> {
        sources_at(&self.cfg, difficulty)
    }

    /// This step's tasks: B train seeds, dealt among the sources by weight
    /// (all to the one env without a mixture), each repeated G times.
    fn step_envs(&self, step: usize, rng: &mut ChaCha8Rng) -> Result<StepTasks, TrainError> {
        let make = self.make.as_ref();
        let c = &self.cfg;
        let sources = self.step_sources(step);
        let weights: Vec<f64> = sources.iter().map(|s| s.weight).collect();
        let counts = groups_per_source(&weights, c.rollout.env_groups, step);
        let pool = match c.env.train_tasks {
            0 => SPLIT_STRIDE / 2,
            n => n,
        };
        let mut envs = Vec::new();
        let mut groups = Vec::new();
        let mut g = 0;
        for (source, count) in sources.iter().zip(counts) {
            for _ in 0..count {
                let seed = rng.random_range(0..pool);
                let spec = TaskSpec::new(&source.env, Split::Train, &source.difficulty, seed);
                for member in 0..c.rollout.n {
                    let mut env = make(&spec, &source.params)?;
                    if c.rollout.independent_chance {
                        env.set_chance_stream(member as u64);
                    }
                    envs.push(env);
                    groups.push(g);
                }
                g += 1;
            }
        }
        Ok((envs, groups))
    }

    /// The rollout settings of RL step `step`: the config's, with the turn
    /// budget of ScalingInter-RL's stage.
    pub fn step_rollout(&self, step: usize) -> RolloutConfig {
        RolloutConfig {
            max_turns: max_turns_at(&self.cfg.rollout, step),
            ..self.cfg.rollout.clone()
        }
    }

    /// Say when a step starts a new turn-budget or curriculum stage.
    fn announce_stages(&self, step: usize, progress: &mut dyn Progress) {
        let c = &self.cfg;
        if !c.rollout.max_turns_schedule.is_empty() {
            let turns = max_turns_at(&c.rollout, step);
            if step == 1 || turns != max_turns_at(&c.rollout, step - 1) {
                progress.message(&format!("step {step}: ScalingInter-RL turn budget {turns}"));
            }
        }
        if !c.actor.kl_loss_coef_schedule.is_empty() {
            let weight = c.actor.kl_loss_coef_at(step);
            if step == 1 || weight != c.actor.kl_loss_coef_at(step - 1) {
                progress.message(&format!("step {step}: KL loss weight {weight}"));
            }
        }
        if c.curriculum.is_on() && !c.curriculum.by_threshold() {
            let stage = &self.step_sources(step)[0].difficulty;
            let before = (step > 1).then(|| self.step_sources(step - 1)[0].difficulty.clone());
            if before.as_ref() != Some(stage) {
                progress.message(&format!("step {step}: curriculum difficulty {stage}"));
            }
        }
    }

    /// `curriculum.advance_at`: validate the current stage's difficulty
    /// (`validation` when it is `env.difficulty`, which was just validated)
    /// and move to the next stage when its success rate reaches the
    /// threshold. The stage is trainer state, saved with the checkpoint
    /// that follows.
    fn curriculum_check(
        &mut self,
        step: usize,
        validation: &EvalStats,
        progress: &mut dyn Progress,
    ) -> Result<(), TrainError> {
        let c = self.cfg.curriculum.clone();
        let last = c.difficulties.len() - 1;
        let stage = self.state.curriculum_stage.min(last);
        if stage == last {
            return Ok(());
        }
        let source = TaskSource {
            difficulty: c.difficulties[stage].clone(),
            ..task_sources(&self.cfg)[0].clone()
        };
        let stats = if source.difficulty == self.cfg.env.difficulty {
            let fields = [
                ("kind", json!("eval_curriculum")),
                ("phase", json!("curriculum")),
                ("step", json!(step)),
                ("env", json!(source.env)),
                ("difficulty", json!(source.difficulty)),
            ];
            self.run.log_record(validation, &fields)?;
            validation.clone()
        } else {
            let temperature = self.cfg.trainer.val_temperature;
            self.validate(step, "curriculum", temperature, &source, "eval_curriculum")?
                .0
        };
        if stats.success_rate >= c.advance_at {
            self.state.curriculum_stage = stage + 1;
            progress.message(&format!(
                "step {step}: curriculum: {:.1}% on {} reaches {:.1}%: training on {} from step {}",
                100.0 * stats.success_rate,
                c.difficulties[stage],
                100.0 * c.advance_at,
                c.difficulties[stage + 1],
                step + 1
            ));
        }
        Ok(())
    }

    /// One RL step: rollouts, filter, then the update on the kept groups.
    pub fn rl_step(&mut self, step: usize) -> Result<StepMetrics, TrainError> {
        let seed = self.cfg.trainer.seed;
        let mut rng = step_rng(seed, step, "rollout");
        let t0 = Instant::now();
        let (envs, groups) = self.step_envs(step, &mut rng)?;
        let rollout = self.step_rollout(step);
        // The step's rollouts, played by the local model or the server.
        let play = |policy: &mut dyn Policy| {
            run_rollouts(policy, &self.tokenizer, envs, &groups, &rollout, &mut rng)
        };
        let (trajs, rollout_logprobs, policy_model) = match &mut self.remote {
            None => {
                let mut policy = LocalPolicy::with_cache_reuse(&self.model, rollout.kv_cache_reuse);
                (play(&mut policy)?, None, None)
            }
            Some(remote) => {
                // The weights after the previous step's update (`state.step` of them).
                let server = remote.policy_at(&self.model, self.state.step)?;
                let mut recording = RecordingPolicy::new(server);
                let trajs = play(&mut recording)?;
                let rows = rollout_logprob_rows(&trajs, recording.into_record())?;
                (trajs, Some(rows), Some(remote.model_name().to_string()))
            }
        };
        let rollout_seconds = t0.elapsed().as_secs_f64();
        for t in trajs.iter().take(self.cfg.trainer.log_trajectories) {
            self.log_trajectory(step, "train", t)?;
        }

        // Keep the groups whose raw rewards disagree most (StarPO-S's fixed
        // share, or RAGEN-2's share of the signal).
        let raw: Vec<f32> = trajs.iter().map(Trajectory::raw_score).collect();
        let r = &self.cfg.rollout;
        let mut filter = match r.rollout_filter_type {
            GroupFilterType::Std => algos::top_std_groups(&raw, &groups, r.rollout_filter_ratio)?,
            GroupFilterType::Snr => {
                algos::snr_groups(&raw, &groups, r.rollout_filter_top_p, r.rollout_filter_eps)?
            }
        };
        if self.cfg.rollout.drop_zero_std_groups {
            filter = filter.without_zero_std(&raw, &groups)?;
        }
        let lr = rl_learning_rates(&self.cfg, step);
        let mut m = StepMetrics::of_rollouts(step, &trajs, &filter);
        m.max_turns = rollout.max_turns;
        let sources = self.step_sources(step);
        match sources.as_slice() {
            [one] => m.difficulty = one.difficulty.clone(),
            many => {
                for source in many {
                    let mut tally = EpisodeTally::default();
                    for t in trajs.iter().filter(|t| {
                        t.spec.env == source.env && t.spec.difficulty == source.difficulty
                    }) {
                        tally.add(std::slice::from_ref(t));
                    }
                    m.per_env.insert(source.key(), tally.stats());
                }
            }
        }
        let every = self.cfg.collapse.mi_every;
        if every > 0 && step.is_multiple_of(every) {
            m.template_collapse = template_collapse::measure(
                &self.model,
                &self.tokenizer,
                &trajs,
                self.cfg.collapse.mi_target,
                self.cfg.collapse.mi_samples,
                &mut step_rng(seed, step, "template_collapse"),
            )?;
        }
        m.rollout_seconds = rollout_seconds;
        m.lr = lr.actor;
        m.policy_model = policy_model;
        let rollout_states = PerceptionTask::rollout_states(&self.cfg, &self.tokenizer, &trajs)?;
        let kept: Vec<Trajectory> = trajs
            .into_iter()
            .zip(&filter.kept_mask)
            .filter_map(|(t, &keep)| keep.then_some(t))
            .collect();
        let kept_logprobs = rollout_logprobs.map(|rows| {
            rows.into_iter()
                .zip(&filter.kept_mask)
                .filter_map(|(r, &keep)| keep.then_some(r))
                .collect()
        });
        let t1 = Instant::now();
        (m.update, m.rollout_is) =
            self.update_with_rollout_logprobs(kept, kept_logprobs, step, lr)?;
        let run = RunInputs::of(&self.cfg, self.make.as_ref(), &self.tokenizer);
        m.perception_loss = self.perception.refresh(
            &run,
            &self.model,
            &mut self.opts.actor,
            step,
            rollout_states,
        )?;
        m.update_seconds = t1.elapsed().as_secs_f64();
        Ok(m)
    }

    /// The update of step `step` on `trajs` at learning rates `lr`: the batch
    /// (masks and no-grad scores), the targets, then the PPO epochs. Returns
    /// zeros without touching the weights when there is nothing to learn.
    pub fn update(
        &mut self,
        trajs: Vec<Trajectory>,
        step: usize,
        lr: StepLr,
    ) -> Result<UpdateStats, TrainError> {
        Ok(self.update_with_rollout_logprobs(trajs, None, step, lr)?.0)
    }

    /// [`Trainer::update`] of trajectories a server generated, with the
    /// server's log-prob of each sampled token (`rollout_logprobs`, one
    /// shifted row per trajectory): the policy loss of every token is
    /// weighted by the truncated importance ratio between the trainer's
    /// old log-prob and the server's (`algorithm.rollout_is_cap`), whose
    /// figures are returned beside the update's. Without rollout log-probs
    /// (local generation) it is exactly [`Trainer::update`].
    pub fn update_with_rollout_logprobs(
        &mut self,
        trajs: Vec<Trajectory>,
        rollout_logprobs: Option<Vec<Vec<f32>>>,
        step: usize,
        lr: StepLr,
    ) -> Result<(UpdateStats, Option<algos::RolloutIsStats>), TrainError> {
        if trajs.is_empty() {
            return Ok((UpdateStats::default(), None));
        }
        // The actor settings of this step (its stage's KL weight).
        let step_cfg = TrainConfig {
            actor: self.cfg.actor.at_step(step),
            ..self.cfg.clone()
        };
        let c = &step_cfg;
        let critic = uses_critic(c);
        // With one update on fresh samples the current policy *is* the
        // sampling policy, so its detached log-probs serve as the old ones;
        // otherwise (for KL in the reward, and for the importance ratio to
        // a server's log-probs) they are scored first.
        let single_update =
            c.actor.ppo_epochs == 1 && trajs.len() <= c.actor.ppo_mini_batch_size.max(1);
        let scoring = Scoring {
            old: !single_update || critic || kl_in_reward(c) || rollout_logprobs.is_some(),
            // A stage of the KL schedule at weight 0 needs no reference pass.
            reference: self.reference.as_ref().filter(|_| needs_reference(c)),
            chunk: c.actor.micro_batch(),
        };
        let scoring_started = Instant::now();
        let mut batch = PpoBatch::build(trajs, &self.model, &scoring)?;
        let scoring_seconds = scoring_started.elapsed().as_secs_f64();
        if !c.actor.train_thoughts {
            let thought_end = self.thought_end_token()?;
            for (t, mask) in batch.trajs.iter().zip(batch.masks.iter_mut()) {
                crate::batch::mask_thoughts(t, mask, thought_end);
            }
        }
        let correction = match &rollout_logprobs {
            None => None,
            Some(rollout) => {
                let old = batch.old_logprobs.as_ref().ok_or_else(|| {
                    TrainError::RemoteGeneration("the old log-probs were not scored".into())
                })?;
                Some(algos::truncated_is_weights(
                    old,
                    rollout,
                    &batch.masks,
                    c.algorithm.rollout_is_cap,
                )?)
            }
        };
        let is_stats = correction.as_ref().map(|(_, stats)| *stats);
        let reference_kl = if kl_in_reward(c) {
            Some(batch.reference_kl().ok_or_else(|| {
                TrainError::Checkpoint(
                    "KL in the reward needs the reference policy (checkpoint step-0)".into(),
                )
            })?)
        } else {
            None
        };
        let targets = advantages::compute(
            &c.algorithm,
            &batch.trajs,
            &batch.masks,
            batch.old_values.as_deref(),
            reference_kl.as_deref(),
        )?;
        // No advantage anywhere (every kept group had equal returns) and no
        // other loss: an optimizer step would only apply Adam's normalised
        // noise (or the entropy bonus at full speed), so skip it.
        let signal = targets.advantages.iter().flatten().any(|&a| a != 0.0);
        let other_loss = critic || (c.actor.use_kl_loss && c.actor.kl_loss_coef > 0.0);
        if !signal && !other_loss {
            let skipped = UpdateStats {
                scoring_seconds,
                ..UpdateStats::default()
            };
            return Ok((skipped, is_stats));
        }
        self.opts.set_lr(lr);
        let mut rng = step_rng(c.trainer.seed, step, "minibatch");
        let weights = correction.as_ref().map(|(w, _)| w.as_slice());
        let stats = ppo_update(
            &self.model,
            &mut self.opts,
            &batch,
            &targets,
            weights,
            c,
            &mut rng,
            &mut self.state.spike_guard,
        )?;
        Ok((
            UpdateStats {
                scoring_seconds,
                ..stats
            },
            is_stats,
        ))
    }
}

impl StepMetrics {
    /// The rollout half of a step's figures: outcomes of every trajectory
    /// and what the group filter kept.
    fn of_rollouts(step: usize, trajs: &[Trajectory], filter: &algos::GroupFilterResult) -> Self {
        let stats = EvalStats::of(trajs);
        let scores: Vec<f64> = trajs.iter().map(|t| t.score() as f64).collect();
        let mean = scores.iter().sum::<f64>() / scores.len().max(1) as f64;
        let var =
            scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / scores.len().max(1) as f64;
        StepMetrics {
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
            ..Default::default()
        }
    }
}
