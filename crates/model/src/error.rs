//! The error type of the model crate.

use std::path::PathBuf;

/// Everything that can go wrong while building, loading, saving, running or
/// optimising a [`crate::PolicyModel`].
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// `config.json` is unreadable, malformed or describes an unsupported model.
    #[error("bad config {path}: {msg}")]
    Config {
        /// The config file (or `<in memory>` for a config built in code).
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A safetensors file could not be parsed.
    #[error("corrupt checkpoint file {path}: {msg}")]
    CorruptFile {
        /// The file that failed to parse.
        path: PathBuf,
        /// The parser's complaint.
        msg: String,
    },
    /// A tensor the configuration requires is absent from the checkpoint.
    #[error("missing tensor `{name}` in checkpoint {path}")]
    MissingTensor {
        /// The Hugging Face tensor name, e.g. `model.layers.0.mlp.up_proj.weight`.
        name: String,
        /// The checkpoint directory or file searched.
        path: PathBuf,
    },
    /// A tensor exists but has a shape other than the configuration implies.
    #[error("tensor `{name}` in {path} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The Hugging Face tensor name.
        name: String,
        /// The file holding the tensor.
        path: PathBuf,
        /// The shape implied by `config.json`.
        expected: Vec<usize>,
        /// The shape found in the file.
        got: Vec<usize>,
    },
    /// A LoRA adapter directory is unreadable or does not fit the model
    /// (missing or unexpected tensor, wrong shape, rank mismatch, unknown
    /// module, an unsupported PEFT feature), or an adapter operation does not apply.
    #[error("bad LoRA adapter {path}: {msg}")]
    Adapter {
        /// The adapter file or directory.
        path: PathBuf,
        /// What is wrong, naming the tensor or key.
        msg: String,
    },
    /// Optimizer state does not fit the variables it is loaded for.
    #[error("optimizer state {path}: {msg}")]
    OptimizerState {
        /// The state file.
        path: PathBuf,
        /// What does not fit.
        msg: String,
    },
    /// The caller passed something the model cannot work with (empty batch,
    /// token id out of range, bad sampling parameters, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The model produced a NaN or infinite logit, so no token can be
    /// sampled: its weights hold NaN or infinite values, or overflow.
    #[error("the model's logits are not finite (token {token}: {value}): its weights hold NaN or infinite values, or overflow")]
    NonFiniteLogits {
        /// The first token id whose logit is not finite.
        token: usize,
        /// That logit.
        value: f32,
    },
    /// An error from the tensor library.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}
