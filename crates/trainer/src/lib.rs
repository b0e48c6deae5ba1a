//! The trainer: configuration, warm start, the RL loop, evaluation, the run
//! directory with its metrics and checkpoints.

pub mod advantages;
pub mod batch;
pub mod bootstrap;
pub mod collapse;
pub mod config;
pub mod config_reference;
pub mod eval_matrix;
pub mod evaluate;
pub mod local_policy;
pub mod lora_section;
pub mod mixture;
pub mod pass_at_k;
mod perception;
pub mod policy_dir;
pub mod policy_section;
pub mod ppo;
mod preflight;
pub mod remote_env;
pub mod remote_generation;
pub mod run_dir;
pub mod schedule;
pub mod sequence;
pub mod sft;
pub mod template_collapse;
pub mod tensorboard;
pub mod trainer;

pub use config::{override_rollout, ConfigError, TrainConfig, DEFAULT_CONFIG, FORMAT_ONLY_CONFIG};
pub use evaluate::{evaluate, EvalPlan, EvalStats};
pub use local_policy::{LocalPolicy, PromptTokens};
pub use policy_dir::{PolicySettings, TrainedPolicy};
pub use trainer::{Progress, Silent, StepMetrics, Summary, Trainer};

/// Anything that can stop a training run, with the file or key it concerns.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Env(#[from] agentrl_env_core::EnvError),
    #[error(transparent)]
    Model(#[from] agentrl_model::ModelError),
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    #[error(transparent)]
    Algo(#[from] agentrl_algos::AlgoError),
    #[error(transparent)]
    Rollout(#[from] agentrl_rollout::RolloutError),
    #[error(transparent)]
    Eval(#[from] evaluate::EvalError),
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),
    #[error("run directory: {0}")]
    RunDir(#[from] run_dir::RunDirError),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("policy server: {0}")]
    PolicyServer(#[from] agentrl_policy_client::OpenAiError),
    /// The server's rollout log-probs do not match the trajectories.
    #[error("remote generation: {0}")]
    RemoteGeneration(String),
}
