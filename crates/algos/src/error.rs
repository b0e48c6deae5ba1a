//! The one error type of this crate.

use thiserror::Error;

/// Why an estimator or loss could not be computed.
///
/// Every function in this crate validates its inputs (lengths, masks,
/// parameters) instead of panicking, because the inputs come from rollouts
/// and user configuration.
#[derive(Debug, Error)]
pub enum AlgoError {
    /// Two inputs that must describe the same items have different lengths.
    #[error("length mismatch for {what}: expected {expected}, got {got}")]
    LengthMismatch {
        /// Which input (and, for ragged inputs, which sequence) disagreed.
        what: String,
        /// The length implied by the other inputs.
        expected: usize,
        /// The length found.
        got: usize,
    },
    /// A hyper-parameter is outside its valid range.
    #[error("invalid parameter {name}: {reason}")]
    InvalidParam {
        /// The parameter's config name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A loss-mask entry is neither 0 nor 1.
    #[error("mask value {value} at sequence {seq}, position {pos} is not 0 or 1")]
    InvalidMask {
        /// Sequence index.
        seq: usize,
        /// Token position.
        pos: usize,
        /// The offending value.
        value: f32,
    },
    /// A non-zero reward sits on a token the policy did not generate.
    ///
    /// Token-level estimators skip such tokens, so the reward would be
    /// silently lost (AgentGym-RL's bug: the outcome reward on an
    /// observation token). Credit rewards to the last policy token instead.
    #[error(
        "reward {reward} at sequence {seq}, position {pos} is on a non-policy token \
         (mask 0 / turn id -1); credit rewards to policy tokens"
    )]
    RewardOnNonPolicyToken {
        /// Sequence index.
        seq: usize,
        /// Token position.
        pos: usize,
        /// The reward that would be dropped.
        reward: f32,
    },
    /// A turn id below −1, or one with no per-turn entry.
    #[error("invalid turn id {turn_id} at sequence {seq}, position {pos}: {reason}")]
    InvalidTurnId {
        /// Sequence index.
        seq: usize,
        /// Token position.
        pos: usize,
        /// The offending id.
        turn_id: i32,
        /// Why it is invalid.
        reason: String,
    },
    /// A config string names no known variant.
    #[error("unknown {kind} {name:?}; expected one of: {expected}")]
    UnknownName {
        /// What was being parsed (e.g. "adv_estimator").
        kind: &'static str,
        /// The string given.
        name: String,
        /// The accepted names.
        expected: &'static str,
    },
    /// A tensor operation failed (shape, dtype or device mismatch).
    #[error("tensor error: {0}")]
    Tensor(#[from] Box<candle_core::Error>),
}

impl From<candle_core::Error> for AlgoError {
    fn from(e: candle_core::Error) -> Self {
        AlgoError::Tensor(Box::new(e))
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, AlgoError>;
