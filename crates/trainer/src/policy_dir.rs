//! Opening a trained policy for evaluation: a run directory (its latest
//! checkpoint and the rollout settings it was trained with) or a plain
//! Hugging Face model directory (default rollout settings).

use std::path::{Path, PathBuf};

use agentrl_model::PolicyModel;
use agentrl_rollout::RolloutConfig;
use agentrl_tokenizer::ChatTokenizer;
use candle_core::Device;

use crate::run_dir::RunDir;
use crate::{TrainConfig, TrainError};

/// A policy directory's tokenizer and settings, without its weights (what
/// a policy served elsewhere is played with: the prompts are tokenized here).
pub struct PolicySettings {
    pub tokenizer: ChatTokenizer,
    pub rollout: RolloutConfig,
    /// The checkpoint directory (or GGUF file).
    pub checkpoint: PathBuf,
    /// The training config, when the path was a run directory.
    pub config: Option<TrainConfig>,
}

impl PolicySettings {
    /// Open a run directory (uses `checkpoints/latest`), one of a run's
    /// checkpoints (`RUN/checkpoints/best`, `RUN/checkpoints/step-N`: played
    /// with the run's config), a model directory or a GGUF file; reads no
    /// weights.
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        let is_run = |p: &Path| p.join("config.toml").is_file() && p.join("checkpoints").is_dir();
        let run_of_checkpoint = path
            .parent()
            .filter(|p| p.file_name().is_some_and(|n| n == "checkpoints"))
            .and_then(Path::parent)
            .filter(|p| is_run(p));
        let (checkpoint, config) = if is_run(path) {
            let run = RunDir::open(path)?;
            let cfg = TrainConfig::load(Some(&run.config_path()), &[])?;
            (run.latest_checkpoint()?, Some(cfg))
        } else if let (Some(run), true) = (run_of_checkpoint, path.join("config.json").is_file()) {
            let cfg = TrainConfig::load(Some(&RunDir::open(run)?.config_path()), &[])?;
            (path.to_path_buf(), Some(cfg))
        } else if path.join("config.json").is_file() || agentrl_model::gguf::is_gguf(path) {
            (path.to_path_buf(), None)
        } else {
            return Err(TrainError::Checkpoint(format!(
                "{}: neither a run directory (config.toml + checkpoints/) nor a model directory (config.json) nor a GGUF file",
                path.display()
            )));
        };
        let tokenizer =
            ChatTokenizer::load(&checkpoint).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        let rollout = config
            .as_ref()
            .map(|c| c.rollout.clone())
            .unwrap_or_default();
        Ok(Self {
            tokenizer,
            rollout,
            checkpoint,
            config,
        })
    }
}

/// A model ready to act, with the rollout settings to act under.
pub struct TrainedPolicy {
    pub model: PolicyModel,
    pub tokenizer: ChatTokenizer,
    pub rollout: RolloutConfig,
    /// The checkpoint directory the weights came from.
    pub checkpoint: PathBuf,
    /// The training config, when `path` was a run directory.
    pub config: Option<TrainConfig>,
}

impl TrainedPolicy {
    /// [`PolicySettings::open`], then the checkpoint's weights, their
    /// products in the run's `model.precision` where this CPU has it (else
    /// f32: a bf16 run's policy still acts on a CPU without AVX512-BF16).
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        Self::open_on(path, &Device::Cpu)
    }

    /// [`TrainedPolicy::open`] with the weights loaded on `device` (the
    /// run's precision applies to CPU products only).
    pub fn open_on(path: &Path, device: &Device) -> Result<Self, TrainError> {
        let s = PolicySettings::open(path)?;
        let mut model = PolicyModel::load(&s.checkpoint, false, device)?;
        if let (Some(c), true) = (&s.config, device.is_cpu()) {
            model.set_precision(c.model.precision_here())?;
        }
        Ok(Self {
            model,
            tokenizer: s.tokenizer,
            rollout: s.rollout,
            checkpoint: s.checkpoint,
            config: s.config,
        })
    }
}
