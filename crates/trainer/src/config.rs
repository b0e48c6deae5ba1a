//! The training configuration: TOML sections with verl / RAGEN / AgentGym-RL
//! names, overridable on the command line as `section.key=value`.

use std::path::Path;

use agentrl_algos::{AdvEstimator, KlKind, LossAgg};
use agentrl_env_client::DataIdxRanges;
use agentrl_env_core::SPLIT_STRIDE;
use agentrl_model::{ModelConfig, Precision};
use agentrl_rollout::{RandomMoves, RolloutConfig};
use agentrl_tokenizer::{MAX_TRAINED_VOCAB, MIN_TRAINED_VOCAB};
use serde::{Deserialize, Serialize};

use crate::collapse::CollapseConfig;
pub use crate::lora_section::LoraSection;
use crate::mixture::{mixture_problems, MixtureEntry};
pub use crate::policy_section::PolicySection;
use crate::schedule::{max_turns_schedule_problems, CurriculumSection};

/// The embedded default: a tiny model, perception pre-training and a warm
/// start of safe random moves, GiGPO + StarPO-S on FrozenLake.
pub const DEFAULT_CONFIG: &str = include_str!("../../../configs/default.toml");

/// `configs/frozenlake-format-only.toml`, the default before perception
/// pre-training: a warm start that teaches only the reply format. The
/// studies and `agentrl sequence` start from it without a config, because
/// they also train on Sokoban, for which the perception recipe was not
/// tuned, and their figures in docs/src/results.md were measured with it.
pub const FORMAT_ONLY_CONFIG: &str = include_str!("../../../configs/frozenlake-format-only.toml");

/// `configs/smoke.toml`: a seconds-long run on the bandit that checks the
/// machinery end to end. The whole-run tests start from it and override what
/// they test.
pub const SMOKE_CONFIG: &str = include_str!("../../../configs/smoke.toml");

/// A config could not be read; the message names the file or key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("config is not valid TOML: {0}")]
    Syntax(String),
    #[error("override '{0}' is not of the form section.key=value")]
    OverrideSyntax(String),
    #[error("override '{key}': '{section}' is not a table")]
    NotATable { key: String, section: String },
    #[error("invalid config: {0}")]
    Invalid(String),
    /// Values out of range, every one of them, each with its key.
    #[error("invalid config ({} problem{}):{}", .0.len(), if .0.len() == 1 { "" } else { "s" }, format_problems(.0))]
    Problems(Vec<ConfigProblem>),
    #[error("cannot render the config as TOML: {0}")]
    Render(String),
}

/// A whole training run's configuration: every TOML section and key. Its
/// doc comments are the configuration reference (`agentrl config
/// --reference`, docs/src/config.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Run name (the run directory is `runs/<name>-<timestamp>`).
    #[serde(default = "default_name")]
    pub name: String,
    /// The policy model: a checkpoint to start from, or a tiny one to create.
    #[serde(default)]
    pub model: ModelSection,
    /// Advantage estimation (verl's `algorithm`).
    #[serde(default)]
    pub algorithm: AlgorithmSection,
    /// The policy update (verl's `actor`).
    #[serde(default)]
    pub actor: ActorSection,
    /// The value head (GAE only).
    #[serde(default)]
    pub critic: CriticSection,
    /// How trajectories are played.
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// Steps, validation, checkpoints, seed and device.
    #[serde(default)]
    pub trainer: TrainerSection,
    /// The environment trained on (required: at least `name`).
    pub env: EnvSection,
    /// The supervised warm start before RL.
    #[serde(default)]
    pub sft: SftSection,
    /// The Echo Trap watch's thresholds.
    #[serde(default)]
    pub collapse: CollapseConfig,
    /// A policy served by an OpenAI-compatible server: evaluation, and with
    /// `[lora]` RL that generates its rollouts there.
    #[serde(default)]
    pub policy: PolicySection,
    /// LoRA adapters on a frozen base (off by default).
    #[serde(default, skip_serializing_if = "LoraSection::is_default")]
    pub lora: LoraSection,
    /// The easy → hard difficulty curriculum (off when empty).
    #[serde(default, skip_serializing_if = "CurriculumSection::is_off")]
    pub curriculum: CurriculumSection,
    /// Several environments trained at once, in set proportions; empty =
    /// `[env]` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mixture: Vec<MixtureEntry>,
}

fn default_name() -> String {
    "agentrl".to_string()
}

/// Which model: a Hugging Face directory, or a tiny one created on the spot.
///
/// In TOML the section is flat: `path`, `init_seed`, and any key of the
/// model's own `config.json` ([`ModelConfig`]: `hidden_size`,
/// `num_hidden_layers`, `rope_theta`, `tie_word_embeddings`, …) over the
/// tiny default. A key that is not a [`ModelConfig`] field is an error.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "ModelTable")]
pub struct ModelSection {
    /// A HF checkpoint directory or a GGUF file; empty = create a tiny model and tokenizer.
    pub path: String,
    /// Seed of the tiny model's initial weights.
    pub init_seed: u64,
    /// Environments whose text the tiny tokenizer is trained on besides the
    /// run's own (a run whose policy later trains or is evaluated on them:
    /// one tokenizer covers every env of a sequence).
    pub tokenizer_envs: Vec<String>,
    /// The tiny model's architecture. Its `vocab_size` is the size the
    /// tokenizer is trained to; the model gets the tokenizer's actual size.
    pub config: ModelConfig,
    /// The precision of the large matrix products (the config key `model.precision`).
    pub precision: Precision,
    /// Recompute activations in the backward instead of keeping them (the
    /// config key `model.gradient_checkpointing`).
    pub gradient_checkpointing: bool,
    /// Attention as the flash op where its GPU kernels apply (the config
    /// key `model.flash_attention`).
    pub flash_attention: bool,
}

/// The tiny model of the default run: d 128, 2 layers, 4 query / 2 key-value
/// heads, ffn 384, a 512-token vocabulary, 2048 positions.
pub fn default_tiny_model() -> ModelConfig {
    ModelConfig::new_qwen2(512, 128, 2, 4, 2, 384)
}

impl ModelSection {
    /// `precision` where this CPU runs it, else f32: a bf16 run's policy
    /// still acts on a CPU without AVX512-BF16.
    pub fn precision_here(&self) -> Precision {
        if self.precision.available() {
            self.precision
        } else {
            Precision::F32
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: String::new(),
            init_seed: 0,
            tokenizer_envs: Vec::new(),
            config: default_tiny_model(),
            precision: Precision::F32,
            gradient_checkpointing: false,
            flash_attention: true,
        }
    }
}

/// `[model]` as written: the trainer's keys and the model's own keys (the
/// configuration reference documents this form; see [`ModelSection`]).
#[derive(Deserialize, schemars::JsonSchema)]
struct ModelTable {
    /// A HF checkpoint directory or a GGUF file; empty = create a tiny model and tokenizer.
    #[serde(default)]
    path: String,
    /// Seed of the tiny model's initial weights.
    #[serde(default)]
    init_seed: u64,
    /// Environments whose text the tiny tokenizer is trained on besides the
    /// run's own.
    #[serde(default)]
    tokenizer_envs: Vec<String>,
    /// The precision of the large products, in training, scoring and
    /// sampling; weights, their gradients and the optimizer state stay f32
    /// either way. On the CPU, the projections' and the LM head's products
    /// (every other op stays f32): bf16 trains and samples SmolLM2-135M
    /// about 1.6× faster than f32. On a GPU (`trainer.device = "cuda"`),
    /// autocast: each forward computes through a bf16 copy of the weights
    /// (activations and products bf16, log-probs and values f32).
    #[serde(default)]
    precision: Precision,
    /// Gradient checkpointing (verl's `enable_gradient_checkpointing`): the
    /// CPU's training passes keep no activations for the backward but each
    /// layer's input, and compute them again there. An update then holds
    /// one layer's activations at a time (the SmolLM2 FrozenLake recipe:
    /// 11.8 GB at its peak without) for about a third more compute; the
    /// gradients are the same to the bit.
    #[serde(default)]
    gradient_checkpointing: bool,
    /// Attention as one fused op on a GPU (FlashAttention-2's algorithm on
    /// tensor cores, `kernels/flash_attention.cu`) where its kernels apply:
    /// bf16 on a CUDA device at head dim 64 or 128. It keeps each query
    /// row's log-sum-exp instead of the `[B, heads, T, T]` probabilities
    /// and recomputes them in the backward. false materialises the scores
    /// on every device; the CPU always does.
    #[serde(default = "flash_attention_default")]
    flash_attention: bool,
    /// The tiny model's architecture: any key of a `config.json` over the
    /// tiny default.
    #[serde(flatten)]
    #[schemars(with = "ModelConfig")]
    config: toml::Table,
}

impl TryFrom<ModelTable> for ModelSection {
    type Error = String;
    fn try_from(t: ModelTable) -> Result<Self, String> {
        Ok(Self {
            path: t.path,
            init_seed: t.init_seed,
            tokenizer_envs: t.tokenizer_envs,
            config: model_config_over_default(t.config)?,
            precision: t.precision,
            gradient_checkpointing: t.gradient_checkpointing,
            flash_attention: t.flash_attention,
        })
    }
}

fn flash_attention_default() -> bool {
    true
}

/// The tiny default with `keys` written over it, each checked on its own so
/// that an error names the key.
fn model_config_over_default(keys: toml::Table) -> Result<ModelConfig, String> {
    let default = default_tiny_model();
    let mut merged = match serde_json::to_value(&default).map_err(|e| e.to_string())? {
        serde_json::Value::Object(m) => m,
        other => return Err(format!("model: default config is not a table: {other}")),
    };
    // The tiny default states θ twice (top level and `rope_parameters`, which
    // wins); a θ given alone must not be shadowed by the default's.
    if keys.contains_key("rope_theta") && !keys.contains_key("rope_parameters") {
        merged.remove("rope_parameters");
    }
    for (key, value) in keys {
        let value = serde_json::to_value(&value).map_err(|e| format!("model.{key}: {e}"))?;
        let mut trial = merged.clone();
        trial.insert(key.clone(), value.clone());
        let parsed: ModelConfig = serde_json::from_value(serde_json::Value::Object(trial))
            .map_err(|e| format!("model.{key}: {e}"))?;
        // ModelConfig keeps keys it does not know in `extra` (to round-trip
        // HF files); in a config file such a key is a typo.
        if parsed.extra.contains_key(&key) && !default.extra.contains_key(&key) {
            return Err(format!(
                "unknown key model.{key}: not a field of the model's config"
            ));
        }
        merged.insert(key, value);
    }
    serde_json::from_value(serde_json::Value::Object(merged)).map_err(|e| format!("model: {e}"))
}

impl Serialize for ModelSection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Flat<'a> {
            path: &'a str,
            init_seed: u64,
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            tokenizer_envs: &'a [String],
            precision: Precision,
            #[serde(flatten)]
            config: &'a ModelConfig,
        }
        Flat {
            path: &self.path,
            init_seed: self.init_seed,
            tokenizer_envs: &self.tokenizer_envs,
            precision: self.precision,
            config: &self.config,
        }
        .serialize(s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmSection {
    /// The advantage estimator.
    pub adv_estimator: AdvEstimator,
    /// Discount γ over the turns (and tokens) of a trajectory.
    pub gamma: f32,
    /// GAE's λ.
    pub lam: f32,
    /// false = Dr.GRPO (no division by the group std).
    pub norm_adv_by_std_in_grpo: bool,
    /// GiGPO's weight ω of the step-level advantage.
    pub gigpo_step_weight: f32,
    /// Put the KL to the reference in the reward instead of the loss.
    pub use_kl_in_reward: bool,
    /// β of the KL in the reward: β·k1 to the reference is taken off every
    /// policy token's reward.
    pub kl_coef: f32,
    /// Let a positive advantage reach replies that did not parse. Off by
    /// default: a successful episode would otherwise reinforce its malformed
    /// turns (the format penalty is small next to the outcome), and the reply
    /// format erodes until it collapses.
    pub credit_malformed_turns: bool,
    /// With rollouts generated by a server (`policy.endpoint`): the cap of
    /// the truncated importance weight `min(exp(log π_old − log π_rollout),
    /// cap)` that multiplies each token's policy loss (verl's truncated
    /// importance sampling). Unused with local generation.
    pub rollout_is_cap: f32,
}

impl Default for AlgorithmSection {
    fn default() -> Self {
        Self {
            adv_estimator: AdvEstimator::Grpo,
            gamma: 1.0,
            lam: 1.0,
            norm_adv_by_std_in_grpo: true,
            gigpo_step_weight: 1.0,
            use_kl_in_reward: false,
            kl_coef: 0.0,
            credit_malformed_turns: false,
            rollout_is_cap: 2.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ActorSection {
    /// AdamW learning rate of the RL updates.
    pub lr: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Trajectories per optimizer step.
    pub ppo_mini_batch_size: usize,
    /// Trajectories per forward and backward pass within a mini-batch
    /// (verl's `ppo_micro_batch_size`; 0 = the whole mini-batch at once).
    /// Their gradients add up to the mini-batch's: each part's loss is
    /// scaled by its share under `loss_agg_mode`, so the optimizer step is
    /// the same and only the activations held at once shrink. Lower it when
    /// an update runs out of memory; it also sizes the scoring passes.
    pub ppo_micro_batch_size: usize,
    /// Passes over each step's batch.
    pub ppo_epochs: usize,
    /// PPO's ε_low: the ratio is clipped below at 1 − ε_low.
    pub clip_ratio_low: f32,
    /// PPO's ε_high: the ratio is clipped above at 1 + ε_high (StarPO-S: 0.28).
    pub clip_ratio_high: f32,
    /// Dual-clip constant c (0 disables).
    pub clip_ratio_c: f32,
    /// Add a KL penalty to the reference policy to the loss.
    pub use_kl_loss: bool,
    /// Weight of that KL loss.
    pub kl_loss_coef: f32,
    /// The KL loss's weight by stage, replacing `kl_loss_coef` when not
    /// empty: with n = `kl_loss_coef_stage_steps`, steps 1…n take the first
    /// weight, n+1…2n the second, and the last holds once reached. A fixed weight holds the policy at an
    /// equilibrium with the reward (π ∝ π_ref·exp(A/β)); a strong pull while
    /// the reward has not yet shown what pays and a weaker one after lets
    /// the learnt choice sharpen past it.
    pub kl_loss_coef_schedule: Vec<f32>,
    /// RL steps per stage of `kl_loss_coef_schedule`.
    pub kl_loss_coef_stage_steps: usize,
    /// The KL estimator of the KL loss.
    pub kl_loss_type: KlKind,
    /// Weight of the entropy bonus (0 = off).
    pub entropy_coeff: f32,
    /// How the per-token losses become one number.
    pub loss_agg_mode: LossAgg,
    /// Clip the gradient's global norm to this.
    pub grad_clip: f64,
    /// RL steps over which the learning rate ramps linearly from lr/warmup to
    /// lr (verl's `lr_warmup_steps`). A fresh Adam's first steps are
    /// sign-descent at the full rate on every weight; the ramp lets its second
    /// moments settle first.
    pub lr_warmup_steps: usize,
    /// Adam's denominator ε. Raising it toward the typical gradient size
    /// makes tiny, noisy gradients move weights less than Adam's
    /// per-weight normalisation otherwise would.
    pub adam_eps: f64,
    /// Continue RL with the warm start's optimizer instead of a fresh AdamW.
    /// Its second moments remember the (much larger) SFT gradients, which
    /// shrinks RL's effective step size by that ratio.
    pub keep_sft_optimizer: bool,
    /// Skip the optimizer step of a mini-batch whose gradient norm exceeds
    /// this multiple of the running mean of the applied ones (0 = off).
    /// Every collapse seen so far followed one AdamW step on a gradient
    /// 3–7× the recent norms; Adam's per-weight normalisation makes such a
    /// step large on exactly the weights that rarely move, whatever the
    /// global clip, so the step is skipped rather than scaled. A skip
    /// counts in the mean as the threshold, so a lasting rise in the norms
    /// passes after a few skips.
    pub grad_spike_factor: f64,
    /// Train the thoughts of RL's samples (`<think>…</think>`) as well as
    /// their answers. With `false` the policy loss covers only what follows
    /// `</think>`: the thoughts stay what the warm start taught (a
    /// perception warm start's readings of the state) and RL learns which
    /// answer to give after them. Reward-weighted updates of 16 noisy
    /// reading tokens turned the readings to garbage within 50 steps.
    pub train_thoughts: bool,
    /// Perception updates (`sft.perception_*`: the pre-training's examples,
    /// batch and learning rate) after every RL update, so the readings the
    /// pre-training taught are not unlearnt while RL changes the weights
    /// (0 = none).
    pub perception_steps_per_update: usize,
    /// Where those updates take their states from: the pre-training's
    /// random walks, or the states this step's rollouts played from.
    pub perception_states: PerceptionStates,
    /// Train only the top this-many decoder layers (with the final norm, an
    /// untied LM head and a value head) in RL; the embeddings and the layers
    /// below stay as the warm start left them (0 = train every weight).
    /// The backward stops at the lowest trained layer, so an update costs
    /// the forward plus that fraction of the backward.
    pub train_top_layers: usize,
}

/// The states of the perception updates between RL steps
/// (`actor.perception_states`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PerceptionStates {
    /// The pre-training's examples: random walks from each train task's
    /// start, most of them a few moves from it.
    #[default]
    Walks,
    /// Every turn of this step's rollouts (before the filter), each with the
    /// prompt the policy read there: the readings hold on the states the
    /// policy reaches, late turns included.
    Rollouts,
}

impl ActorSection {
    /// The KL loss's weight at RL step `step` (1-based):
    /// `kl_loss_coef_schedule` at the step's stage, or `kl_loss_coef`; 0
    /// without `use_kl_loss`.
    pub fn kl_loss_coef_at(&self, step: usize) -> f32 {
        if !self.use_kl_loss {
            return 0.0;
        }
        let schedule = &self.kl_loss_coef_schedule;
        match schedule.is_empty() {
            true => self.kl_loss_coef,
            false => {
                let stage = (step.max(1) - 1) / self.kl_loss_coef_stage_steps.max(1);
                schedule[stage.min(schedule.len() - 1)]
            }
        }
    }

    /// This section as RL step `step` uses it: the KL loss's weight of the
    /// step's stage in `kl_loss_coef`, and no schedule.
    pub fn at_step(&self, step: usize) -> ActorSection {
        ActorSection {
            kl_loss_coef: self.kl_loss_coef_at(step),
            kl_loss_coef_schedule: Vec::new(),
            kl_loss_coef_stage_steps: 0,
            ..self.clone()
        }
    }

    /// Whether any RL step has a KL loss (and so needs the reference policy).
    pub fn has_kl_loss(&self) -> bool {
        self.use_kl_loss
            && (self.kl_loss_coef > 0.0 || self.kl_loss_coef_schedule.iter().any(|&c| c > 0.0))
    }

    /// Trajectories per forward and backward pass: `ppo_micro_batch_size`,
    /// or the whole mini-batch when that is 0 or larger.
    pub fn micro_batch(&self) -> usize {
        let mini = self.ppo_mini_batch_size.max(1);
        match self.ppo_micro_batch_size {
            0 => mini,
            micro => micro.min(mini),
        }
    }
}

impl Default for ActorSection {
    fn default() -> Self {
        Self {
            lr: 1e-4,
            weight_decay: 0.01,
            ppo_mini_batch_size: 32,
            ppo_micro_batch_size: 0,
            ppo_epochs: 1,
            clip_ratio_low: 0.2,
            clip_ratio_high: 0.28,
            clip_ratio_c: 3.0,
            use_kl_loss: false,
            kl_loss_coef: 0.0,
            kl_loss_coef_schedule: Vec::new(),
            kl_loss_coef_stage_steps: 0,
            kl_loss_type: KlKind::LowVarKl,
            // verl's default. With Adam even a tiny bonus moves weights at full
            // speed when the policy loss carries no signal, driving the policy to
            // uniform: enable it deliberately.
            entropy_coeff: 0.0,
            loss_agg_mode: LossAgg::TokenMean,
            grad_clip: 1.0,
            lr_warmup_steps: 0,
            adam_eps: 1e-8,
            keep_sft_optimizer: false,
            grad_spike_factor: 0.0,
            train_thoughts: true,
            perception_steps_per_update: 0,
            perception_states: PerceptionStates::Walks,
            train_top_layers: 0,
        }
    }
}

/// The value head (GAE only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CriticSection {
    /// Learning rate of the value head's own AdamW (the actor's
    /// `lr_warmup_steps` ramp applies to it too).
    pub lr: f64,
    /// Clip of the value prediction's move from the old value.
    pub cliprange_value: f32,
    /// Weight of the value loss.
    pub value_loss_coef: f32,
}

impl Default for CriticSection {
    fn default() -> Self {
        Self {
            lr: 1e-4,
            cliprange_value: 0.5,
            value_loss_coef: 0.5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSection {
    /// RL steps (at least 1; to evaluate only, use `agentrl eval`).
    pub total_training_steps: usize,
    /// Evaluate on the validation seeds every this many steps (0 = only before/after).
    pub test_freq: usize,
    /// Checkpoint every this many steps (0 = only at the end).
    pub save_freq: usize,
    /// Step checkpoints kept on disk, the newest first (0 = all). The
    /// latest, `best/` and, when a reference model is used, step 0 are
    /// always kept: a 135M-parameter checkpoint with its optimizer state
    /// is about 1.6 GB.
    pub keep_checkpoints: usize,
    /// Seed of every random draw of the run (tasks, sampling, warm start).
    pub seed: u64,
    /// Held-out validation tasks (seeds 0..val_tasks of the val split).
    pub val_tasks: usize,
    /// Sampling temperature for validation (0 = greedy).
    pub val_temperature: f64,
    /// Also validate the greedy policy (temperature 0) before and after RL,
    /// when `val_temperature` is not already 0.
    pub val_greedy: bool,
    /// Trajectories per step written to trajectories.jsonl.
    pub log_trajectories: usize,
    /// Where the policy trains and samples: `cpu` (the default), or `cuda` (GPU 0; a build
    /// with the `cuda` feature). Rollouts, rewards and checkpoints stay on the host.
    #[serde(skip_serializing_if = "TrainDevice::is_cpu")]
    pub device: TrainDevice,
}

/// The device of `trainer.device`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum TrainDevice {
    /// The CPU (deterministic: same seed and config, same trajectories).
    #[default]
    Cpu,
    /// CUDA device 0 (float rounding differs from the CPU's).
    Cuda,
}

impl TrainDevice {
    fn is_cpu(&self) -> bool {
        *self == TrainDevice::Cpu
    }

    /// The candle device; a clear error when this build or machine has no CUDA.
    pub fn open(self) -> Result<candle_core::Device, ConfigError> {
        match self {
            TrainDevice::Cpu => Ok(candle_core::Device::Cpu),
            TrainDevice::Cuda => agentrl_model::open_cuda(0).map_err(|e| {
                ConfigError::Invalid(format!(
                    "trainer.device = \"cuda\": no CUDA device 0 ({e}); build with \
                     `--features agentrl-model/cuda` on a machine with a GPU"
                ))
            }),
        }
    }
}

impl Default for TrainerSection {
    fn default() -> Self {
        Self {
            total_training_steps: 50,
            test_freq: 10,
            save_freq: 10,
            keep_checkpoints: 0,
            seed: 0,
            val_tasks: 256,
            val_temperature: 0.0,
            val_greedy: true,
            log_trajectories: 2,
            device: TrainDevice::Cpu,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    /// The environment's registry name (`agentrl envs` lists them).
    pub name: String,
    /// The difficulty of the training and validation tasks.
    #[serde(default = "default_difficulty")]
    pub difficulty: String,
    /// URL of an `agentrl serve` (or AgentGym) env server, or a list of
    /// `agentrl serve` URLs (sessions spread over them, an episode moved off
    /// a server that stops answering); empty = in-process.
    #[serde(default)]
    pub endpoint: Endpoints,
    /// RL draws its tasks from the first `train_tasks` train seeds (a fixed
    /// training set); 0 draws from the whole train split.
    #[serde(default)]
    pub train_tasks: u64,
    /// Environment-specific options.
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// How to talk to `endpoint`: `agentrl` (`agentrl serve`) or `agentgym`
    /// (AgentGym's Python env servers: TextCraft, BabyAI, SciWorld, …).
    #[serde(default)]
    pub protocol: EnvProtocol,
    /// The prompt shown before the first observation (agentgym: required,
    /// this or `instructions_file`; AgentGym keeps it in its client).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instructions: String,
    /// A file holding the instructions (read when the run starts).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instructions_file: String,
    /// agentgym: regular expressions of the observations that answer an
    /// invalid action (their servers answer it with a 200 and a message);
    /// absent = the env's defaults (textcraft, babyai, sciworld, alfworld,
    /// searchqa), none for other names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_action_patterns: Option<Vec<String>>,
    /// agentgym: multiplies every reward (SciWorld's scores run -100..100: 0.01).
    #[serde(default = "default_reward_scale")]
    pub reward_scale: f64,
    /// agentgym: the server's `data_idx` range `[start, end)` of each split
    /// (`train` and `val` required, disjoint, so validation is held out).
    #[serde(default)]
    pub data_idx: DataIdxRanges,
}

/// `env.endpoint`: none (in-process), one URL, or several. Written as a
/// string when there is at most one, so a one-server config reads back the
/// same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints(Vec<String>);

impl Endpoints {
    /// In-process: no server.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every server's URL, in configured order.
    pub fn urls(&self) -> &[String] {
        &self.0
    }

    /// Comma-separated URLs (a command line's `--endpoint A,B`).
    pub fn parse_list(list: &str) -> Self {
        Endpoints(
            list.split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }
}

impl From<&str> for Endpoints {
    fn from(url: &str) -> Self {
        Endpoints(if url.is_empty() {
            Vec::new()
        } else {
            vec![url.to_string()]
        })
    }
}

/// One URL or a list of URLs; an empty string means in-process.
impl schemars::JsonSchema for Endpoints {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Endpoints".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [{ "type": "string" }, { "type": "array", "items": { "type": "string" } }]
        })
    }
}

impl std::fmt::Display for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

impl Serialize for Endpoints {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [] => s.serialize_str(""),
            [one] => s.serialize_str(one),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Endpoints {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(url) => Endpoints::from(url.as_str()),
            OneOrMany::Many(urls) => Endpoints(urls),
        })
    }
}

/// How the trainer talks to `env.endpoint`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EnvProtocol {
    /// `agentrl serve`: typed answers, spec, instructions and expert from the server.
    #[default]
    Agentrl,
    /// AgentGym's env servers: `{id, data_idx}`, 200 `{"error"}` bodies,
    /// invalid actions as messages, instructions from the config.
    Agentgym,
}

fn default_difficulty() -> String {
    "easy".into()
}

fn default_reward_scale() -> f64 {
    1.0
}

/// Supervised warm start on expert demonstrations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SftSection {
    /// Expert demonstrations (train seeds); 0 skips the warm start.
    pub demos: usize,
    /// Passes over the demonstrations.
    pub epochs: usize,
    /// AdamW learning rate of the warm start.
    pub lr: f64,
    /// Demonstrations per update.
    pub batch_size: usize,
    /// Demonstrations per forward and backward pass within an update (0 =
    /// the whole batch at once); the parts' gradients add up to the
    /// batch's, as with `actor.ppo_micro_batch_size`.
    pub micro_batch_size: usize,
    /// Actions the expert writes per reply.
    pub actions_per_turn: usize,
    /// Probability that a demonstrated action is a uniformly random valid
    /// action instead of the expert's (0 = pure expert). With noise every
    /// demonstration is kept, successful or not, so the warm start imitates
    /// the noisy expert: it knows the right move but takes it unreliably.
    pub expert_noise: f64,
    /// Where the noisy expert's random moves are drawn from: `"valid"`
    /// (every valid action) or `"safe"` (the env's safe actions, on
    /// FrozenLake the moves onto ice or the goal: with `perceive` each
    /// random move then follows from the reading written before it).
    pub random_moves: RandomMoves,
    /// The expert thinks what it perceives (the env's perception: on
    /// FrozenLake what lies one step in each direction) before it moves,
    /// so the warm-started policy writes its readings of the state in its
    /// thoughts and acts after them.
    pub perceive: bool,
    /// Perception pre-training before the warm start: updates on short
    /// prompts (one state, `Turn k:` and the observation, no dialogue)
    /// whose target is the perception thought. 0 skips it; it needs an env
    /// with a perception.
    pub perception_steps: usize,
    /// Prompts per perception update.
    pub perception_batch_size: usize,
    /// Learning rate of the perception updates (reading a cell next to the
    /// player is learnt at 5e-4 and not at 2e-3: scripts/grid_reading_probe.py).
    pub perception_lr: f64,
    /// Train tasks whose random walks give the perception states.
    pub perception_tasks: usize,
}

impl SftSection {
    /// Demonstrations per forward and backward pass: `micro_batch_size`, or
    /// the whole batch when that is 0 or larger.
    pub fn micro_batch(&self) -> usize {
        let batch = self.batch_size.max(1);
        match self.micro_batch_size {
            0 => batch,
            micro => micro.min(batch),
        }
    }
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            demos: 256,
            epochs: 2,
            lr: 2e-3,
            batch_size: 16,
            micro_batch_size: 0,
            actions_per_turn: 1,
            expert_noise: 0.0,
            random_moves: RandomMoves::Valid,
            perceive: false,
            perception_steps: 0,
            perception_batch_size: 32,
            perception_lr: 5e-4,
            perception_tasks: 4096,
        }
    }
}

impl TrainConfig {
    /// Parse TOML text, apply `section.key=value` overrides, validate.
    pub fn from_toml(text: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut value: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string()))?;
        for o in overrides {
            apply_override(&mut value, o)?;
        }
        let cfg: TrainConfig = toml::Value::Table(value)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Invalid(e.to_string().trim().to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Read a config file (or the embedded default when `path` is None).
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Self, ConfigError> {
        Self::load_or(path, DEFAULT_CONFIG, overrides)
    }

    /// Read a config file, or the TOML text `default` when `path` is None.
    pub fn load_or(
        path: Option<&Path>,
        default: &str,
        overrides: &[String],
    ) -> Result<Self, ConfigError> {
        let text = match path {
            None => default.to_string(),
            Some(p) => std::fs::read_to_string(p).map_err(|e| ConfigError::Read {
                path: p.display().to_string(),
                reason: e.to_string(),
            })?,
        };
        Self::from_toml(&text, overrides)
    }

    /// The resolved config as TOML (what `config.toml` of a run holds).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string_pretty(self).map_err(|e| ConfigError::Render(e.to_string()))
    }

    /// Check the whole config before any work starts: every problem at
    /// once, each naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Problems(problems))
        }
    }

    /// [`TrainConfig::validate`] plus what a new run needs besides its
    /// values: the model directory of `model.path` and the positions its
    /// `config.json` allows, a `trainer.device` this build has, and env
    /// servers (`env.endpoint`) that accept a connection. Not checked when
    /// resuming, which loads the checkpoint instead (the directory may have
    /// moved since).
    pub fn validate_for_new_run(&self) -> Result<(), ConfigError> {
        let mut problems = self.problems();
        problems.extend(self.model_source_problems());
        let outside = crate::preflight::device_problem(self.trainer.device)
            .into_iter()
            .chain(crate::preflight::endpoint_problems(self));
        problems.extend(outside.map(|(key, message)| ConfigProblem { key, message }));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Problems(problems))
        }
    }

    /// Problems with the model directory `model.path` names (none when the
    /// tiny model is created).
    pub fn model_source_problems(&self) -> Vec<ConfigProblem> {
        let mut p = Problems::default();
        if self.model.path.is_empty() {
            return p.0;
        }
        let source = Path::new(&self.model.path);
        // A GGUF file carries its configuration in its metadata.
        let config = if agentrl_model::gguf::is_gguf(source) {
            source.to_path_buf()
        } else {
            source.join("config.json")
        };
        match ModelConfig::from_source(source) {
            Ok(c) if self.rollout.max_context_tokens > c.max_position_embeddings => p.add(
                "rollout.max_context_tokens",
                format!(
                    "{} is more than the model's max_position_embeddings {} ({})",
                    self.rollout.max_context_tokens,
                    c.max_position_embeddings,
                    config.display()
                ),
            ),
            Ok(_) => {}
            Err(e) => p.add("model.path", e.to_string()),
        }
        p.0
    }

    /// Every value that is out of range, or inconsistent with another, in
    /// section order, then the params of each in-process env (one task of
    /// each is built, so a generator setting that cannot produce a task is
    /// named too; data files an env's params name are read). Empty when the
    /// config is usable.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut p = Problems::default();
        self.check_name(&mut p);
        self.check_model(&mut p);
        self.check_algorithm(&mut p);
        self.check_actor(&mut p);
        self.check_critic(&mut p);
        self.check_rollout(&mut p);
        self.check_trainer(&mut p);
        self.check_env(&mut p);
        self.check_sft(&mut p);
        self.check_policy(&mut p);
        self.check_lora(&mut p);
        for (key, message) in self.collapse.problems() {
            p.add(key, message);
        }
        self.check_schedules(&mut p);
        // Last: building a task is the one check that does work, and a
        // value already named above is not reported again through it.
        for (key, message) in crate::preflight::env_task_problems(self) {
            p.add(&key, message);
        }
        p.0
    }

    /// ScalingInter-RL's turn schedule, the curriculum, the mixture and the
    /// tokenizer's extra envs (each checked in its own module).
    fn check_schedules(&self, p: &mut Problems) {
        let in_process = self.env.endpoint.is_empty() && self.env.protocol == EnvProtocol::Agentrl;
        let mut found = max_turns_schedule_problems(&self.rollout);
        let known = agentrl_envs::find(&self.env.name)
            .ok()
            .filter(|_| in_process)
            .map(|d| d.difficulties);
        found.extend(self.curriculum.problems(known, self.trainer.test_freq));
        found.extend(mixture_problems(&self.mixture, &self.env.name, in_process));
        if !self.mixture.is_empty() {
            if self.curriculum.is_on() {
                found.push((
                    "curriculum.difficulties".into(),
                    "a curriculum trains one env; a [[mixture]] sets each env's difficulty".into(),
                ));
            }
            if self.env.protocol == EnvProtocol::Agentgym {
                found.push((
                    "mixture".into(),
                    "mixes agentrl's envs (in-process or on `agentrl serve`), not AgentGym servers"
                        .into(),
                ));
            }
        }
        if self.model.path.is_empty() {
            for (i, name) in self.model.tokenizer_envs.iter().enumerate() {
                if let Err(e) = agentrl_envs::find(name) {
                    found.push((format!("model.tokenizer_envs[{i}]"), e.to_string()));
                }
            }
        } else if !self.model.tokenizer_envs.is_empty() {
            found.push((
                "model.tokenizer_envs".into(),
                "applies to the tiny model's tokenizer; model.path brings its own".into(),
            ));
        }
        for (key, message) in found {
            p.add(&key, message);
        }
    }

    fn check_name(&self, p: &mut Problems) {
        // The run directory is runs/<name>-<timestamp>: a path in the name
        // would put it elsewhere.
        let n = &self.name;
        if n.is_empty() || n == "." || n == ".." || n.contains(['/', '\\', '\0']) {
            p.add(
                "name",
                format!("{n:?} must be a plain name (no path separators)"),
            );
        }
    }

    fn check_model(&self, p: &mut Problems) {
        let m = &self.model;
        if !m.path.is_empty() {
            // A model directory is checked by `model_source_problems`.
            return;
        }
        // The tiny model is created from this config: check it now, not
        // after the tokenizer has been trained.
        let c = &m.config;
        let vocab_in_range = (MIN_TRAINED_VOCAB..=MAX_TRAINED_VOCAB).contains(&c.vocab_size);
        if !vocab_in_range {
            p.add(
                "model.vocab_size",
                format!(
                    "{} is the size the tokenizer is trained to: it must be in {MIN_TRAINED_VOCAB}..={MAX_TRAINED_VOCAB}",
                    c.vocab_size
                ),
            );
        }
        for why in c.problems() {
            // ModelConfig's messages start with the key they are about.
            let key = why.split([' ', '`']).next().unwrap_or_default();
            // An out-of-range vocabulary is reported once, above.
            if key != "vocab_size" || vocab_in_range {
                p.add(&format!("model.{key}"), why);
            }
        }
        if self.rollout.max_context_tokens > c.max_position_embeddings {
            p.add(
                "rollout.max_context_tokens",
                format!(
                    "{} is more than model.max_position_embeddings {}",
                    self.rollout.max_context_tokens, c.max_position_embeddings
                ),
            );
        }
    }

    fn check_algorithm(&self, p: &mut Problems) {
        let a = &self.algorithm;
        p.in_range("algorithm.gamma", a.gamma as f64, 0.0..=1.0);
        p.in_range("algorithm.lam", a.lam as f64, 0.0..=1.0);
        p.non_negative("algorithm.gigpo_step_weight", a.gigpo_step_weight as f64);
        p.non_negative("algorithm.kl_coef", a.kl_coef as f64);
        p.at_least("algorithm.rollout_is_cap", a.rollout_is_cap as f64, 1.0);
    }

    fn check_actor(&self, p: &mut Problems) {
        let a = &self.actor;
        p.positive("actor.lr", a.lr);
        p.non_negative("actor.weight_decay", a.weight_decay);
        p.at_least_one("actor.ppo_mini_batch_size", a.ppo_mini_batch_size);
        p.at_least_one("actor.ppo_epochs", a.ppo_epochs);
        let low = a.clip_ratio_low as f64;
        if !(low.is_finite() && (0.0..1.0).contains(&low)) {
            p.add("actor.clip_ratio_low", format!("{low} must be in [0, 1)"));
        }
        p.non_negative("actor.clip_ratio_high", a.clip_ratio_high as f64);
        let c = a.clip_ratio_c as f64;
        if !(c == 0.0 || (c.is_finite() && c > 1.0)) {
            p.add(
                "actor.clip_ratio_c",
                format!("{c} must be 0 (no dual clip) or above 1"),
            );
        }
        p.non_negative("actor.kl_loss_coef", a.kl_loss_coef as f64);
        if a.kl_loss_coef_schedule
            .iter()
            .any(|c| !(c.is_finite() && *c >= 0.0))
        {
            p.add(
                "actor.kl_loss_coef_schedule",
                format!(
                    "{:?}: every weight must be 0 or more",
                    a.kl_loss_coef_schedule
                ),
            );
        }
        match (
            a.kl_loss_coef_schedule.is_empty(),
            a.kl_loss_coef_stage_steps,
        ) {
            (false, 0) => p.add(
                "actor.kl_loss_coef_stage_steps",
                "must be at least 1 with an actor.kl_loss_coef_schedule (steps per stage)".into(),
            ),
            (true, n) if n > 0 => p.add(
                "actor.kl_loss_coef_stage_steps",
                "applies to actor.kl_loss_coef_schedule, which is empty".into(),
            ),
            _ => {}
        }
        if !a.kl_loss_coef_schedule.is_empty() && !a.use_kl_loss {
            p.add(
                "actor.kl_loss_coef_schedule",
                "applies only with actor.use_kl_loss = true".into(),
            );
        }
        p.non_negative("actor.entropy_coeff", a.entropy_coeff as f64);
        p.positive("actor.grad_clip", a.grad_clip);
        p.positive("actor.adam_eps", a.adam_eps);
        let f = a.grad_spike_factor;
        if !(f == 0.0 || (f.is_finite() && f >= 1.0)) {
            p.add(
                "actor.grad_spike_factor",
                format!("{f} must be 0 (off) or at least 1"),
            );
        }
    }

    fn check_critic(&self, p: &mut Problems) {
        let c = &self.critic;
        p.positive("critic.lr", c.lr);
        p.non_negative("critic.cliprange_value", c.cliprange_value as f64);
        p.non_negative("critic.value_loss_coef", c.value_loss_coef as f64);
    }

    fn check_rollout(&self, p: &mut Problems) {
        let r = &self.rollout;
        p.at_least_one("rollout.n", r.n);
        p.at_least_one("rollout.env_groups", r.env_groups);
        p.non_negative("rollout.temperature", r.temperature);
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            p.add("rollout.top_p", format!("{} must be in (0, 1]", r.top_p));
        }
        p.at_least_one("rollout.max_turns", r.max_turns);
        p.at_least_one("rollout.max_actions_per_turn", r.max_actions_per_turn);
        p.at_least_one("rollout.max_actions", r.max_actions);
        p.at_least_one("rollout.response_length", r.response_length);
        if r.max_context_tokens <= r.response_length {
            p.add(
                "rollout.max_context_tokens",
                format!(
                    "{} leaves no room for a prompt before a reply of rollout.response_length {}",
                    r.max_context_tokens, r.response_length
                ),
            );
        }
        let penalty = r.format_penalty as f64;
        if !(penalty.is_finite() && penalty <= 0.0) {
            p.add(
                "rollout.format_penalty",
                format!("{penalty} must be a finite number <= 0"),
            );
        }
        let ratio = r.rollout_filter_ratio as f64;
        if !(ratio > 0.0 && ratio <= 1.0) {
            p.add(
                "rollout.rollout_filter_ratio",
                format!("{ratio} must be in (0, 1]"),
            );
        }
        let top_p = r.rollout_filter_top_p as f64;
        if !(top_p > 0.0 && top_p <= 1.0) {
            p.add(
                "rollout.rollout_filter_top_p",
                format!("{top_p} must be in (0, 1]"),
            );
        }
        p.non_negative("rollout.rollout_filter_eps", r.rollout_filter_eps as f64);
    }

    fn check_trainer(&self, p: &mut Problems) {
        let t = &self.trainer;
        // 0 steps would only evaluate the starting policy: `agentrl eval` does that.
        if t.total_training_steps == 0 {
            p.add(
                "trainer.total_training_steps",
                "must be at least 1 (to only evaluate a policy, use `agentrl eval`)".to_string(),
            );
        }
        if !(1..=SPLIT_STRIDE).contains(&(t.val_tasks as u64)) {
            p.add(
                "trainer.val_tasks",
                format!(
                    "{} must be in 1..={SPLIT_STRIDE} (the validation split's size)",
                    t.val_tasks
                ),
            );
        }
        p.non_negative("trainer.val_temperature", t.val_temperature);
    }

    fn check_env(&self, p: &mut Problems) {
        let e = &self.env;
        // Remote servers may host environments we do not ship (SciWorld,
        // WebArena); a missing AgentGym endpoint is named below.
        if e.endpoint.is_empty() && e.protocol == EnvProtocol::Agentrl {
            let problem = crate::mixture::registry_problem(&e.name, Some(&e.difficulty));
            if let Some((field, why)) = problem {
                p.add(&format!("env.{field}"), why);
            }
        }
        if self.rollout.independent_chance && !e.endpoint.is_empty() {
            p.add(
                "rollout.independent_chance",
                "needs in-process envs: an env server replays each task's own draws, so drop env.endpoint or set it false".to_string(),
            );
        }
        for url in e.endpoint.urls() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                p.add(
                    "env.endpoint",
                    format!("{url:?} must start with http:// or https://"),
                );
            }
        }
        if e.protocol == EnvProtocol::Agentgym {
            self.check_agentgym(p);
        } else {
            let agentgym_only = [
                ("env.instructions", !e.instructions.is_empty()),
                ("env.instructions_file", !e.instructions_file.is_empty()),
                (
                    "env.invalid_action_patterns",
                    e.invalid_action_patterns.is_some(),
                ),
                ("env.reward_scale", e.reward_scale != 1.0),
                ("env.data_idx", e.data_idx != DataIdxRanges::default()),
            ];
            for (key, set) in agentgym_only {
                if set {
                    p.add(
                        key,
                        "applies to env.protocol = \"agentgym\" only (an agentrl env brings its own)"
                            .into(),
                    );
                }
            }
        }
        // The upper half of the train split holds the warm start's demonstrations.
        if e.train_tasks > SPLIT_STRIDE / 2 {
            p.add(
                "env.train_tasks",
                format!(
                    "{} is more than the {} train seeds RL draws from",
                    e.train_tasks,
                    SPLIT_STRIDE / 2
                ),
            );
        }
    }

    /// An AgentGym server: an endpoint, instructions, held-out `data_idx`
    /// ranges that fit the run, and no demonstrations (no expert there).
    fn check_agentgym(&self, p: &mut Problems) {
        let e = &self.env;
        if e.endpoint.is_empty() {
            p.add(
                "env.protocol",
                "\"agentgym\" needs env.endpoint (the AgentGym server's URL)".into(),
            );
        }
        if e.endpoint.urls().len() > 1 {
            p.add(
                "env.endpoint",
                "\"agentgym\" takes one server (a list of servers needs agentrl serve: moving an episode replays it, which AgentGym's servers do not promise to reproduce)".into(),
            );
        }
        match (e.instructions.trim().is_empty(), e.instructions_file.is_empty()) {
            (true, true) => p.add(
                "env.instructions",
                "AgentGym's servers keep no prompt: set env.instructions or env.instructions_file (AgentGym's conversation_start for the env)".into(),
            ),
            (false, false) => p.add(
                "env.instructions",
                "set env.instructions or env.instructions_file, not both".into(),
            ),
            _ => {}
        }
        if let Some(patterns) = &e.invalid_action_patterns {
            for pattern in patterns {
                if let Err(err) = agentrl_env_client::check_invalid_action_pattern(pattern) {
                    p.add("env.invalid_action_patterns", err);
                }
            }
        }
        p.positive("env.reward_scale", e.reward_scale);
        let mut ranges = Vec::new();
        for (split, range, required) in [
            ("train", e.data_idx.train, true),
            ("val", e.data_idx.val, true),
            ("test", e.data_idx.test, false),
        ] {
            let key = format!("env.data_idx.{split}");
            match range {
                None if required => p.add(
                    &key,
                    "required: the server's data_idx range [start, end) of this split".into(),
                ),
                None => {}
                Some([a, b]) if a >= b => p.add(&key, format!("[{a}, {b}] is empty")),
                Some(r) => ranges.push((key, r)),
            }
        }
        for (i, (key, [a, b])) in ranges.iter().enumerate() {
            for (other, [c, d]) in &ranges[i + 1..] {
                if a < d && c < b {
                    p.add(
                        key,
                        format!(
                            "[{a}, {b}] overlaps {other} = [{c}, {d}]: validation must be held out"
                        ),
                    );
                }
            }
        }
        if let Some([a, b]) = e.data_idx.val {
            if a < b && self.trainer.val_tasks as u64 > b - a {
                p.add(
                    "trainer.val_tasks",
                    format!(
                        "{} is more than the {} tasks of env.data_idx.val = [{a}, {b}]",
                        self.trainer.val_tasks,
                        b - a
                    ),
                );
            }
        }
        if let Some([a, b]) = e.data_idx.train {
            if a < b && e.train_tasks > b - a {
                p.add(
                    "env.train_tasks",
                    format!(
                        "{} is more than the {} tasks of env.data_idx.train = [{a}, {b}]",
                        e.train_tasks,
                        b - a
                    ),
                );
            }
        }
        if self.sft.demos > 0 && self.sft.epochs > 0 {
            p.add(
                "sft.demos",
                format!(
                    "{}: AgentGym's servers have no expert to demonstrate; set sft.demos = 0 (or warm-start from model.path)",
                    self.sft.demos
                ),
            );
        }
    }

    /// Training through a server (`policy.endpoint`) hot-loads the LoRA
    /// adapter it trains onto the server after every update, over the base
    /// model the server serves: LoRA on, the same base weights on both sides
    /// (`model.path`, no warm start here) and a directory the server reads.
    fn check_policy(&self, p: &mut Problems) {
        for (key, message) in self.policy.problems() {
            p.add(&key, message);
        }
        let endpoint = &self.policy.endpoint;
        if endpoint.is_empty() {
            return;
        }
        if !self.lora.enabled {
            p.add(
                "policy.endpoint",
                format!(
                    "{endpoint:?}: training through a server needs `lora.enabled = true`: the server cannot see the trainer's updates unless the trainer hot-loads its LoRA adapter after each one (full weights are not sent). To only evaluate through a server: `agentrl eval --policy-endpoint URL`"
                ),
            );
            return;
        }
        if self.model.path.is_empty() {
            p.add(
                "model.path",
                format!(
                    "empty, but training through policy.endpoint {endpoint:?} needs the base model the server serves: set model.path to that directory (`agentrl serve-policy --model DIR`, vLLM's model); a tiny model created here would exist only here"
                ),
            );
        }
        if self.sft.demos > 0 && self.sft.epochs > 0 {
            p.add(
                "sft.demos",
                format!(
                    "{}: a warm start trains the base weights here only, and the server's base would no longer match; set sft.demos = 0 (warm-start in a run of its own and serve its checkpoint)",
                    self.sft.demos
                ),
            );
        }
        if self.policy.adapter_dir.is_empty() && !crate::policy_section::is_loopback(endpoint) {
            p.add(
                "policy.adapter_dir",
                format!(
                    "empty, but policy.endpoint {endpoint:?} is not on this machine: the server reads each LoRA adapter from the path the trainer writes it to, so set policy.adapter_dir to a directory the server sees at the same path (shared storage)"
                ),
            );
        }
    }

    fn check_lora(&self, p: &mut Problems) {
        for (key, message) in self.lora.problems() {
            p.add(&key, message);
        }
        let warm_start = self.sft.demos > 0 && self.sft.epochs > 0;
        if self.lora.enabled && warm_start && self.actor.keep_sft_optimizer {
            p.add(
                "actor.keep_sft_optimizer",
                "the warm start trains every weight and RL only the LoRA adapter attached after it: the SFT optimizer's state has nothing to carry over".into(),
            );
        }
        if self.lora.enabled && self.actor.train_top_layers > 0 {
            p.add(
                "actor.train_top_layers",
                "LoRA already freezes the base model: set actor.train_top_layers = 0 or lora.enabled = false".into(),
            );
        }
        if self.actor.train_top_layers > 0 && warm_start && self.actor.keep_sft_optimizer {
            p.add(
                "actor.keep_sft_optimizer",
                "the warm start trains every weight and RL only the top layers: the SFT optimizer's state does not fit RL's parameters".into(),
            );
        }
    }

    fn check_sft(&self, p: &mut Problems) {
        let s = &self.sft;
        p.in_range("sft.expert_noise", s.expert_noise, 0.0..=1.0);
        if s.demos > 0 && s.epochs > 0 {
            p.positive("sft.lr", s.lr);
            p.at_least_one("sft.batch_size", s.batch_size);
            p.at_least_one("sft.actions_per_turn", s.actions_per_turn);
        }
        if s.perception_steps > 0 || self.actor.perception_steps_per_update > 0 {
            p.positive("sft.perception_lr", s.perception_lr);
            p.at_least_one("sft.perception_batch_size", s.perception_batch_size);
            p.at_least_one("sft.perception_tasks", s.perception_tasks);
        }
    }
}

/// One value out of range: its key (`section.key`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The problems found so far, with the range checks most keys share.
#[derive(Default)]
struct Problems(Vec<ConfigProblem>);

impl Problems {
    fn add(&mut self, key: &str, message: String) {
        self.0.push(ConfigProblem {
            key: key.to_string(),
            message,
        });
    }
    fn positive(&mut self, key: &str, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            self.add(key, format!("{v} must be a finite number > 0"));
        }
    }
    fn non_negative(&mut self, key: &str, v: f64) {
        self.at_least(key, v, 0.0);
    }
    /// `v` must be finite and at least `min`.
    fn at_least(&mut self, key: &str, v: f64, min: f64) {
        if !(v.is_finite() && v >= min) {
            self.add(key, format!("{v} must be a finite number >= {min}"));
        }
    }
    fn in_range(&mut self, key: &str, v: f64, range: std::ops::RangeInclusive<f64>) {
        if !range.contains(&v) {
            self.add(
                key,
                format!("{v} must be in [{}, {}]", range.start(), range.end()),
            );
        }
    }
    fn at_least_one(&mut self, key: &str, v: usize) {
        if v == 0 {
            self.add(key, "must be at least 1".to_string());
        }
    }
}

fn format_problems(problems: &[ConfigProblem]) -> String {
    problems.iter().map(|p| format!("\n  {p}")).collect()
}

/// Set `a.b.c = value` in a TOML table; the value is read as a TOML literal
/// (number, bool, string, array), falling back to a bare string.
/// `rollout` with `key=value` overrides of its own keys applied (the
/// `--rollout` flag of `agentrl eval`: `prefill=true`, `response_length=64`),
/// checked as a config's `[rollout]` section is.
pub fn override_rollout(
    rollout: &RolloutConfig,
    overrides: &[String],
) -> Result<RolloutConfig, ConfigError> {
    if overrides.is_empty() {
        return Ok(rollout.clone());
    }
    let mut root = toml::Table::new();
    let section = toml::Value::try_from(rollout).map_err(|e| ConfigError::Render(e.to_string()))?;
    root.insert("rollout".to_string(), section);
    for o in overrides {
        apply_override(&mut root, &format!("rollout.{o}"))?;
    }
    let section = root
        .remove("rollout")
        .ok_or_else(|| ConfigError::Invalid("rollout: the section went missing".to_string()))?;
    let mut cfg = TrainConfig::load(None, &[])?;
    cfg.rollout = section.try_into().map_err(|e: toml::de::Error| {
        ConfigError::Invalid(format!("rollout: {}", e.to_string().trim()))
    })?;
    // Only the section's own checks: the rest of this config is a stand-in.
    let problems: Vec<ConfigProblem> = cfg
        .problems()
        .into_iter()
        .filter(|p| p.key.starts_with("rollout."))
        .collect();
    match problems.is_empty() {
        true => Ok(cfg.rollout),
        false => Err(ConfigError::Problems(problems)),
    }
}

fn apply_override(root: &mut toml::Table, o: &str) -> Result<(), ConfigError> {
    let (key, raw) = o
        .split_once('=')
        .ok_or_else(|| ConfigError::OverrideSyntax(o.to_string()))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    if key.is_empty() || parts.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::OverrideSyntax(o.to_string()));
    }
    let value = parse_literal(raw.trim());
    let mut table = root;
    for (i, part) in parts[..parts.len() - 1].iter().enumerate() {
        let entry = table
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| ConfigError::NotATable {
            key: key.to_string(),
            section: parts[..=i].join("."),
        })?;
    }
    table.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

fn parse_literal(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_overrides_set_keys_and_refuse_unknown_or_invalid_ones() {
        let base = RolloutConfig::default();
        let r = override_rollout(
            &base,
            &["prefill=true".to_string(), "response_length=64".to_string()],
        )
        .unwrap();
        assert!(r.prefill && !base.prefill);
        assert_eq!(r.response_length, 64);
        assert_eq!(r.n, base.n);
        let e = override_rollout(&base, &["prefil=true".to_string()]).unwrap_err();
        assert!(e.to_string().contains("prefil"), "{e}");
        let e = override_rollout(&base, &["temperature=-1".to_string()]).unwrap_err();
        assert!(e.to_string().contains("rollout.temperature"), "{e}");
    }

    #[test]
    fn independent_chance_is_refused_with_an_env_server() {
        let local =
            TrainConfig::from_toml(SMOKE_CONFIG, &["rollout.independent_chance=true".into()])
                .unwrap();
        assert!(local.rollout.independent_chance);
        assert!(local.problems().is_empty(), "{:?}", local.problems());
        let e = TrainConfig::from_toml(
            SMOKE_CONFIG,
            &[
                "rollout.independent_chance=true".into(),
                "env.endpoint=http://a:1".into(),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("rollout.independent_chance"), "{e}");
    }

    #[test]
    fn env_endpoint_is_one_url_or_a_list_and_reads_back_the_same() {
        let one =
            TrainConfig::from_toml(SMOKE_CONFIG, &["env.endpoint=http://a:1".into()]).unwrap();
        assert_eq!(one.env.endpoint.urls(), ["http://a:1"]);
        let many = TrainConfig::from_toml(
            SMOKE_CONFIG,
            &[r#"env.endpoint=["http://a:1", "http://b:2"]"#.into()],
        )
        .unwrap();
        assert_eq!(many.env.endpoint.urls(), ["http://a:1", "http://b:2"]);
        for cfg in [one, many] {
            let again = TrainConfig::from_toml(&cfg.to_toml().unwrap(), &[]).unwrap();
            assert_eq!(again.env.endpoint, cfg.env.endpoint);
        }
        let text = TrainConfig::from_toml(SMOKE_CONFIG, &[])
            .unwrap()
            .to_toml()
            .unwrap();
        assert!(text.contains("endpoint = \"\""), "{text}");
        let e = TrainConfig::from_toml(
            SMOKE_CONFIG,
            &[r#"env.endpoint=["http://a:1", "ftp://b"]"#.into()],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("env.endpoint") && e.contains("ftp://b"), "{e}");
    }

    #[test]
    fn smoke_config_parses() {
        let cfg = TrainConfig::from_toml(SMOKE_CONFIG, &[]).unwrap();
        assert_eq!(cfg.env.name, "bandit");
    }

    #[test]
    fn trainer_device_parses_defaults_to_cpu_and_names_a_missing_gpu() {
        let c = TrainConfig::load(None, &[]).unwrap();
        assert_eq!(c.trainer.device, TrainDevice::Cpu);
        assert!(
            !c.to_toml().unwrap().contains("device"),
            "cpu is not written"
        );
        let c = TrainConfig::load(None, &["trainer.device=cuda".to_string()]).unwrap();
        assert_eq!(c.trainer.device, TrainDevice::Cuda);
        assert!(c.to_toml().unwrap().contains("device = \"cuda\""));
        let e = TrainConfig::load(None, &["trainer.device=tpu".to_string()]).unwrap_err();
        assert!(e.to_string().contains("tpu"), "{e}");
        // Without the cuda feature (CI) or a GPU, opening it says what to do.
        if let Err(e) = TrainDevice::Cuda.open() {
            assert!(e.to_string().contains("trainer.device"), "{e}");
        }
    }

    #[test]
    fn embedded_default_parses() {
        let c = TrainConfig::load(None, &[]).unwrap();
        assert_eq!(c.algorithm.adv_estimator, AdvEstimator::Gigpo);
        assert!(!c.algorithm.norm_adv_by_std_in_grpo);
        assert_eq!(
            c.collapse.mi_target,
            crate::template_collapse::MiTarget::Reply
        );
    }

    #[test]
    fn overrides_set_nested_keys_with_types() {
        let c = TrainConfig::load(
            None,
            &[
                "actor.lr=0.5".into(),
                "env.difficulty=hard".into(),
                "rollout.format=react".into(),
                "trainer.seed=7".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.actor.lr, 0.5);
        assert_eq!(c.env.difficulty, "hard");
        assert_eq!(c.rollout.format, agentrl_rollout::ReplyFormat::React);
        assert_eq!(c.trainer.seed, 7);
    }

    #[test]
    fn unknown_key_is_named_in_the_error() {
        let e = TrainConfig::load(None, &["actor.lrr=0.5".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lrr"), "{e}");
        let e = TrainConfig::from_toml("[env]\nname='bandit'\n[trainer]\nbogus=1\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn wrong_type_and_bad_values_are_errors() {
        let e = TrainConfig::load(None, &["actor.lr=fast".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lr") || e.contains("actor"), "{e}");
        let e = TrainConfig::load(None, &["algorithm.adv_estimator=ppo2".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("adv_estimator"), "{e}");
        assert!(TrainConfig::load(None, &["nodot".into()]).is_err());
        assert!(TrainConfig::from_toml("this is = not toml [", &[]).is_err());
    }

    #[test]
    fn a_wrong_enum_value_names_the_key_and_the_allowed_values() {
        for (o, key, allowed) in [
            (
                "algorithm.adv_estimator=ppo2",
                "algorithm.adv_estimator",
                "reinforce_plus_plus",
            ),
            (
                "actor.loss_agg_mode=token_mean",
                "actor.loss_agg_mode",
                "seq-mean-token-sum",
            ),
            ("actor.kl_loss_type=k9", "actor.kl_loss_type", "low_var_kl"),
        ] {
            let e = TrainConfig::load(None, &[o.into()])
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(allowed), "{o}: {e}");
        }
        let c = TrainConfig::load(
            None,
            &[
                "actor.kl_loss_type=k1".into(),
                "actor.loss_agg_mode=seq-mean-token-mean".into(),
                "algorithm.adv_estimator=gigpo".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.actor.kl_loss_type, KlKind::Kl);
        assert_eq!(c.actor.loss_agg_mode, LossAgg::SeqMeanTokenMean);
        assert_eq!(c.algorithm.adv_estimator, AdvEstimator::Gigpo);
    }

    #[test]
    fn model_section_is_the_models_own_config_over_the_tiny_default() {
        let c = TrainConfig::load(None, &[]).unwrap();
        assert_eq!(c.model, ModelSection::default());
        let c = TrainConfig::load(
            None,
            &[
                "model.hidden_size=64".into(),
                "model.num_hidden_layers=1".into(),
                "model.rope_theta=500000.0".into(),
                "model.tie_word_embeddings=false".into(),
                "model.init_seed=3".into(),
            ],
        )
        .unwrap();
        let m = &c.model.config;
        assert_eq!((m.hidden_size, m.num_hidden_layers), (64, 1));
        assert_eq!(m.num_attention_heads, 4, "the rest stays the default");
        assert_eq!(m.rope_theta(), 500000.0, "a θ given alone is the one used");
        assert!(!m.tie_word_embeddings);
        assert_eq!(c.model.init_seed, 3);
        for (o, key) in [
            ("model.hiden_size=3", "hiden_size"),
            ("model.hidden_size=wide", "hidden_size"),
            ("model.init_seed=-1", "init_seed"),
            ("model.num_key_value_heads=3", "num_key_value_heads"),
        ] {
            let e = TrainConfig::load(None, &[o.into()])
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{o}: {e}");
        }
    }

    #[test]
    fn unknown_env_is_named() {
        let e = TrainConfig::load(None, &["env.name=nope".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("env.name") && e.contains("nope"), "{e}");
        // A remote server may serve environments agentrl does not ship.
        assert!(TrainConfig::load(
            None,
            &[
                "env.name=sciworld".into(),
                "env.endpoint=http://127.0.0.1:1".into()
            ]
        )
        .is_ok());
    }

    #[test]
    fn an_agentgym_env_needs_instructions_held_out_ranges_and_no_demos() {
        let base = [
            "env.name=sciworld",
            "env.protocol=agentgym",
            "env.endpoint=http://127.0.0.1:1",
        ];
        let keys = problem_keys(&base);
        for key in [
            "env.instructions",
            "env.data_idx.train",
            "env.data_idx.val",
            "sft.demos",
        ] {
            assert!(keys.contains(&key.to_string()), "{key}: {keys:?}");
        }
        let good = [
            &base[..],
            &[
                "env.instructions_file=configs/agentgym/sciworld.txt",
                "env.data_idx.train=[0, 100]",
                "env.data_idx.val=[100, 110]",
                "sft.demos=0",
                "trainer.val_tasks=10",
            ],
        ]
        .concat();
        let o: Vec<String> = good.iter().map(|s| s.to_string()).collect();
        let c = TrainConfig::load(None, &o).unwrap();
        assert_eq!(c.env.protocol, EnvProtocol::Agentgym);
        assert_eq!(c.env.data_idx.val, Some([100, 110]));
        let again = TrainConfig::from_toml(&c.to_toml().unwrap(), &[]).unwrap();
        assert_eq!(c, again, "the resolved config round-trips");
        for (o, key) in [
            ("env.data_idx.val=[50, 60]", "env.data_idx.train"),
            ("env.data_idx.val=[110, 110]", "env.data_idx.val"),
            ("trainer.val_tasks=11", "trainer.val_tasks"),
            ("env.train_tasks=101", "env.train_tasks"),
            (
                "env.invalid_action_patterns=['(']",
                "env.invalid_action_patterns",
            ),
            ("env.reward_scale=0", "env.reward_scale"),
            ("env.instructions=both", "env.instructions"),
            ("env.endpoint=", "env.protocol"),
        ] {
            let with: Vec<&str> = good.iter().copied().chain([o]).collect();
            assert_eq!(problem_keys(&with), [key], "{o}");
        }
        // The AgentGym keys mean nothing to an agentrl server: named, not ignored.
        assert_eq!(
            problem_keys(&["env.reward_scale=0.01"]),
            ["env.reward_scale"]
        );
    }

    /// The keys of every problem `overrides` give, in order.
    #[test]
    fn the_kl_loss_weight_follows_its_schedule() {
        let load = |o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            TrainConfig::load(None, &o).unwrap().actor
        };
        let staged = load(&[
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef=0.3",
            "actor.kl_loss_coef_schedule=[0.2, 0.05, 0.01]",
            "actor.kl_loss_coef_stage_steps=60",
        ]);
        let weights: Vec<f32> = [1, 59, 60, 61, 120, 121, 500]
            .iter()
            .map(|&s| staged.kl_loss_coef_at(s))
            .collect();
        assert_eq!(weights, [0.2, 0.2, 0.2, 0.05, 0.05, 0.01, 0.01]);
        let step = staged.at_step(61);
        assert_eq!(step.kl_loss_coef, 0.05);
        assert!(step.kl_loss_coef_schedule.is_empty());
        assert_eq!(step.kl_loss_coef_at(1), 0.05);
        let fixed = load(&["actor.use_kl_loss=true", "actor.kl_loss_coef=0.3"]);
        assert_eq!(fixed.kl_loss_coef_at(100), 0.3);
        assert!(fixed.has_kl_loss());
        let off = load(&["actor.kl_loss_coef=0.3"]);
        assert_eq!(off.kl_loss_coef_at(1), 0.0);
        assert!(!off.has_kl_loss());
        let zeros = load(&[
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef_schedule=[0.0, 0.0]",
            "actor.kl_loss_coef_stage_steps=5",
        ]);
        assert!(!zeros.has_kl_loss());
        let late = load(&[
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef_schedule=[0.0, 0.1]",
            "actor.kl_loss_coef_stage_steps=5",
        ]);
        assert!(late.has_kl_loss());
        for (o, key) in [
            (
                &[
                    "actor.use_kl_loss=true",
                    "actor.kl_loss_coef_schedule=[0.2]",
                ][..],
                "actor.kl_loss_coef_stage_steps",
            ),
            (
                &["actor.use_kl_loss=true", "actor.kl_loss_coef_stage_steps=5"][..],
                "actor.kl_loss_coef_stage_steps",
            ),
            (
                &[
                    "actor.use_kl_loss=true",
                    "actor.kl_loss_coef_schedule=[0.2, -0.1]",
                    "actor.kl_loss_coef_stage_steps=5",
                ][..],
                "actor.kl_loss_coef_schedule",
            ),
            (
                &[
                    "actor.kl_loss_coef_schedule=[0.2, 0.1]",
                    "actor.kl_loss_coef_stage_steps=5",
                ][..],
                "actor.kl_loss_coef_schedule",
            ),
        ] {
            assert_eq!(problem_keys(o), [key], "{o:?}");
        }
    }

    fn problem_keys(overrides: &[&str]) -> Vec<String> {
        let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        match TrainConfig::load(None, &o) {
            Err(ConfigError::Problems(p)) => {
                let mut keys: Vec<String> = p.into_iter().map(|p| p.key).collect();
                keys.dedup();
                keys
            }
            other => panic!("{overrides:?}: expected problems, got {other:?}"),
        }
    }

    #[test]
    fn every_out_of_range_value_is_named_before_any_work() {
        for (o, key) in [
            ("rollout.temperature=-1", "rollout.temperature"),
            ("rollout.temperature=nan", "rollout.temperature"),
            ("rollout.top_p=5", "rollout.top_p"),
            ("rollout.top_p=0", "rollout.top_p"),
            ("rollout.response_length=0", "rollout.response_length"),
            (
                "rollout.max_context_tokens=16",
                "rollout.max_context_tokens",
            ),
            (
                "rollout.max_context_tokens=100000",
                "rollout.max_context_tokens",
            ),
            ("rollout.format_penalty=0.5", "rollout.format_penalty"),
            (
                "rollout.rollout_filter_ratio=0",
                "rollout.rollout_filter_ratio",
            ),
            ("rollout.max_actions=0", "rollout.max_actions"),
            ("model.vocab_size=1000000000000", "model.vocab_size"),
            ("model.vocab_size=100", "model.vocab_size"),
            ("model.hidden_size=0", "model.hidden_size"),
            (
                "model.max_position_embeddings=1099511627776",
                "model.max_position_embeddings",
            ),
            (
                "trainer.total_training_steps=0",
                "trainer.total_training_steps",
            ),
            ("trainer.val_tasks=0", "trainer.val_tasks"),
            ("trainer.val_tasks=5000000000", "trainer.val_tasks"),
            ("trainer.val_temperature=-0.5", "trainer.val_temperature"),
            ("algorithm.gamma=1.5", "algorithm.gamma"),
            ("algorithm.lam=-1", "algorithm.lam"),
            ("algorithm.kl_coef=-1", "algorithm.kl_coef"),
            ("actor.lr=0", "actor.lr"),
            ("actor.lr=inf", "actor.lr"),
            ("actor.weight_decay=-0.1", "actor.weight_decay"),
            ("actor.clip_ratio_low=1", "actor.clip_ratio_low"),
            ("actor.clip_ratio_high=-0.2", "actor.clip_ratio_high"),
            ("actor.clip_ratio_c=0.5", "actor.clip_ratio_c"),
            ("actor.grad_clip=0", "actor.grad_clip"),
            ("actor.grad_spike_factor=0.5", "actor.grad_spike_factor"),
            ("actor.entropy_coeff=-1", "actor.entropy_coeff"),
            ("actor.ppo_epochs=0", "actor.ppo_epochs"),
            ("critic.lr=-1", "critic.lr"),
            ("critic.value_loss_coef=nan", "critic.value_loss_coef"),
            ("sft.lr=0", "sft.lr"),
            ("sft.batch_size=0", "sft.batch_size"),
            ("sft.expert_noise=2", "sft.expert_noise"),
            ("env.difficulty=impossible", "env.difficulty"),
            ("env.train_tasks=4294967296", "env.train_tasks"),
            ("env.endpoint=ftp://x", "env.endpoint"),
            ("name=../elsewhere", "name"),
        ] {
            let keys = problem_keys(&[o]);
            // hidden_size 0 also makes head_dim 0; nothing else is touched.
            assert_eq!(keys[0], key, "{o}: {keys:?}");
            assert!(
                keys.iter()
                    .all(|k| k.starts_with(key.split('.').next().unwrap())),
                "{o}: {keys:?}"
            );
        }
        // Every problem at once, each on its own line with its key.
        let e = TrainConfig::load(
            None,
            &[
                "rollout.temperature=-1".into(),
                "rollout.top_p=5".into(),
                "trainer.total_training_steps=0".into(),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("invalid config (3 problems):"), "{e}");
        assert!(e.contains("\n  rollout.temperature: -1 must be"), "{e}");
        assert!(e.contains("\n  rollout.top_p: 5 must be in (0, 1]"), "{e}");
        // A negative count is a type error that names the key.
        let e = TrainConfig::load(None, &["rollout.top_k=-1".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("top_k"), "{e}");
        // A model directory is checked for a new run, not at every load.
        let c = TrainConfig::load(None, &["model.path=/nonexistent".into()]).unwrap();
        let e = c.validate_for_new_run().unwrap_err().to_string();
        assert!(
            e.contains("model.path: ") && e.contains("/nonexistent/config.json"),
            "{e}"
        );
        // Switched off, the warm start's own settings are not checked.
        assert!(TrainConfig::load(None, &["sft.demos=0".into(), "sft.lr=0".into()]).is_ok());
    }

    #[test]
    fn training_the_top_layers_refuses_lora_and_the_sft_optimizer() {
        let top = "actor.train_top_layers=4";
        assert_eq!(
            problem_keys(&[top, "lora.enabled=true"]),
            ["actor.train_top_layers"]
        );
        assert_eq!(
            problem_keys(&[top, "sft.demos=8", "actor.keep_sft_optimizer=true"]),
            ["actor.keep_sft_optimizer"]
        );
        let ok: Vec<String> = vec![top.into(), "sft.demos=8".into()];
        assert_eq!(
            TrainConfig::load(None, &ok).unwrap().actor.train_top_layers,
            4
        );
    }

    #[test]
    fn the_example_configs_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                if let Err(e) = TrainConfig::load(Some(&path), &[]) {
                    panic!("{}: {e}", path.display());
                }
                n += 1;
            }
        }
        assert!(n >= 5, "{n} configs");
    }

    #[test]
    fn schedules_mixtures_and_tokenizer_envs_are_checked_with_the_rest() {
        for (overrides, key) in [
            (
                &[
                    "rollout.max_turns_schedule=[2, 0]",
                    "rollout.max_turns_stage_steps=5",
                ][..],
                "rollout.max_turns_schedule",
            ),
            (
                &["rollout.max_turns_schedule=[2, 4]"][..],
                "rollout.max_turns_stage_steps",
            ),
            (
                &[
                    "curriculum.difficulties=['easy', 'nightmare']",
                    "curriculum.stage_steps=5",
                ][..],
                "curriculum.difficulties",
            ),
            (
                &[
                    "curriculum.difficulties=['easy', 'hard']",
                    "curriculum.advance_at=0.5",
                    "trainer.test_freq=0",
                ][..],
                "curriculum.advance_at",
            ),
            (
                &["mixture=[{name = 'frozenlake'}, {name = 'chess'}]"][..],
                "mixture[1].name",
            ),
            (&["mixture=[{name = 'sokoban'}]"][..], "env.name"),
            (
                &["model.tokenizer_envs=['chess']"][..],
                "model.tokenizer_envs[0]",
            ),
        ] {
            assert_eq!(problem_keys(overrides), [key], "{overrides:?}");
        }
        let c = TrainConfig::load(
            None,
            &[
                "rollout.max_turns_schedule=[2, 4, 8]".into(),
                "rollout.max_turns_stage_steps=20".into(),
                "curriculum.difficulties=['easy', 'hard']".into(),
                "curriculum.stage_steps=25".into(),
                "model.tokenizer_envs=['sokoban']".into(),
            ],
        )
        .unwrap();
        let again = TrainConfig::from_toml(&c.to_toml().unwrap(), &[]).unwrap();
        assert_eq!(c, again, "the new sections round-trip");
        let plain = TrainConfig::load(None, &[]).unwrap().to_toml().unwrap();
        assert!(
            !plain.contains("[curriculum]")
                && !plain.contains("mixture")
                && !plain.contains("tokenizer_envs"),
            "a run without them writes none of them: {plain}"
        );
    }

    #[test]
    fn resolved_config_round_trips() {
        let c = TrainConfig::load(None, &[]).unwrap();
        let again = TrainConfig::from_toml(&c.to_toml().unwrap(), &[]).unwrap();
        assert_eq!(c, again);
    }
}
