use thiserror::Error;

/// Why an action text was rejected. The environment stays usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ActionError {
    #[error("empty action")]
    Empty,
    #[error("action too long ({len} bytes, at most {max})")]
    TooLong { len: usize, max: usize },
    #[error("unknown action '{action}'; valid actions: {expected}")]
    Unknown { action: String, expected: String },
    #[error("malformed action '{action}': {reason}")]
    Malformed { action: String, reason: String },
    #[error("action '{action}' is not possible now: {reason}")]
    NotPossible { action: String, reason: String },
}

impl ActionError {
    /// `action` is none of the grammar's actions; `expected` lists them.
    pub fn unknown(action: &str, expected: impl Into<String>) -> Self {
        ActionError::Unknown {
            action: action.to_string(),
            expected: expected.into(),
        }
    }

    /// `action` is one of the grammar's forms, filled in wrongly.
    pub fn malformed(action: &str, reason: impl Into<String>) -> Self {
        ActionError::Malformed {
            action: action.to_string(),
            reason: reason.into(),
        }
    }

    /// `action` is well-formed but the current state does not allow it.
    pub fn not_possible(action: &str, reason: impl Into<String>) -> Self {
        ActionError::NotPossible {
            action: action.to_string(),
            reason: reason.into(),
        }
    }
}

/// Why a step could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StepError {
    /// The action text did not parse or is not allowed; no state changed
    /// except the env's invalid-action counter.
    #[error("invalid action: {0}")]
    InvalidAction(#[from] ActionError),
    #[error("the episode is over; reset the environment first")]
    EpisodeOver,
}

/// Errors creating or configuring an environment.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvError {
    #[error("unknown environment '{name}' (available: {available})")]
    UnknownEnv { name: String, available: String },
    #[error("unknown difficulty '{difficulty}' for {env} (available: {available})")]
    UnknownDifficulty {
        env: String,
        difficulty: String,
        available: String,
    },
    #[error("invalid task spec: {0}")]
    InvalidSpec(String),
    #[error("invalid parameter '{key}' for {env}: {reason}")]
    InvalidParam {
        env: String,
        key: String,
        reason: String,
    },
    #[error("cannot load data for {env} from {path}: {reason}")]
    Data {
        env: String,
        path: String,
        reason: String,
    },
    /// The task generator used up its attempt budget without finding a
    /// task that fits the params (extreme settings, e.g. almost no ice).
    #[error("cannot generate a {env} task: {reason}")]
    Generation { env: String, reason: String },
    #[error("remote environment error: {0}")]
    Remote(String),
    /// The env server did not answer at all (refused, reset or timed-out
    /// connection): another server may still serve the episode.
    #[error("env server {endpoint} unreachable: {reason}")]
    Unreachable { endpoint: String, reason: String },
    /// The build was cancelled before it finished ([`crate::BuildCancel`]):
    /// whoever asked for the task went away or ran out of time.
    #[error("building the {env} task was cancelled (the request was abandoned or timed out)")]
    Cancelled { env: String },
    /// The process has no room for this task right now (the shared data
    /// budget, see [`crate::MemoryBudget`]); the same request may succeed
    /// once other sessions close.
    #[error("{env}: {reason}")]
    Busy { env: String, reason: String },
}

impl EnvError {
    /// `env`'s build stopped because its [`crate::BuildCancel`] was cancelled.
    pub fn cancelled(env: &str) -> Self {
        EnvError::Cancelled {
            env: env.to_string(),
        }
    }

    /// `env`'s generator gave up; `reason` says on what and how to fix it.
    pub fn generation(env: &str, reason: impl Into<String>) -> Self {
        EnvError::Generation {
            env: env.to_string(),
            reason: reason.into(),
        }
    }

    /// `difficulty` is not one of the levels `env` offers.
    pub fn unknown_difficulty(env: &str, difficulty: &str, available: &[&str]) -> Self {
        EnvError::UnknownDifficulty {
            env: env.to_string(),
            difficulty: difficulty.to_string(),
            available: available.join(", "),
        }
    }
}
