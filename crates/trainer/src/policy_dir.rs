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
    /// Open a run directory (uses `checkpoints/latest`) or a model directory.
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        let (checkpoint, config) = if path.join("config.toml").is_file()
            && path.join("checkpoints").is_dir()
        {
            let run = RunDir::open(path)?;
            let cfg = TrainConfig::load(Some(&run.config_path()), &[])?;
            (run.latest_checkpoint()?, Some(cfg))
        } else if path.join("config.json").is_file() {
            (path.to_path_buf(), None)
        } else {
            return Err(TrainError::Checkpoint(format!(
                "{}: neither a run directory (config.toml + checkpoints/) nor a model directory (config.json)",
                path.display()
            )));
        };
        let tokenizer =
            ChatTokenizer::load(&checkpoint).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        let model = PolicyModel::load(&checkpoint, false, &Device::Cpu)?;
        let rollout = config
            .as_ref()
            .map(|c| c.rollout.clone())
            .unwrap_or_default();
        Ok(Self {
            model,
            tokenizer,
            rollout,
            checkpoint,
            config,
        })
    }
}
