use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::EnvError;

/// Seeds of one split are indices `0..SPLIT_STRIDE`; the absolute seed is
/// `split.offset() + index`, so train / val / test seeds never overlap.
pub const SPLIT_STRIDE: u64 = 1 << 32;

/// Which disjoint seed range a task is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Val,
    Test,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Train, Split::Val, Split::Test];

    /// First absolute seed of this split.
    pub fn offset(self) -> u64 {
        match self {
            Split::Train => 0,
            Split::Val => SPLIT_STRIDE,
            Split::Test => 2 * SPLIT_STRIDE,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Split {
    type Err = EnvError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "train" => Ok(Split::Train),
            "val" | "valid" | "validation" => Ok(Split::Val),
            "test" => Ok(Split::Test),
            other => Err(EnvError::InvalidSpec(format!(
                "unknown split '{other}' (expected train, val or test)"
            ))),
        }
    }
}

/// One task: which environment, which split, which difficulty, which seed.
///
/// `seed` is an index inside the split (`0..SPLIT_STRIDE`); two specs that are
/// equal describe the same task on every machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskSpec {
    pub env: String,
    pub split: Split,
    pub difficulty: String,
    pub seed: u64,
}

impl TaskSpec {
    pub fn new(
        env: impl Into<String>,
        split: Split,
        difficulty: impl Into<String>,
        seed: u64,
    ) -> Self {
        Self {
            env: env.into(),
            split,
            difficulty: difficulty.into(),
            seed,
        }
    }

    /// The seed in the global space, disjoint across splits.
    pub fn absolute_seed(&self) -> Result<u64, EnvError> {
        if self.seed >= SPLIT_STRIDE {
            return Err(EnvError::InvalidSpec(format!(
                "seed {} is out of range: seeds of a split are 0..{}",
                self.seed, SPLIT_STRIDE
            )));
        }
        Ok(self.split.offset() + self.seed)
    }
}

impl fmt::Display for TaskSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}#{}",
            self.env, self.split, self.difficulty, self.seed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_disjoint() {
        let a = TaskSpec::new("x", Split::Train, "easy", SPLIT_STRIDE - 1);
        let b = TaskSpec::new("x", Split::Val, "easy", 0);
        assert!(a.absolute_seed().unwrap() < b.absolute_seed().unwrap());
    }

    #[test]
    fn out_of_range_seed_is_an_error() {
        let a = TaskSpec::new("x", Split::Train, "easy", SPLIT_STRIDE);
        assert!(a.absolute_seed().is_err());
    }

    #[test]
    fn split_parses() {
        assert_eq!("VAL".parse::<Split>().unwrap(), Split::Val);
        assert!("nope".parse::<Split>().is_err());
    }
}
