//! Multi-turn rollouts: a policy plays environments turn by turn.
//!
//! - [`codec`]: chat messages → token ids (ChatML, built incrementally so the
//!   loss mask is exact);
//! - [`format`]: reply formats and their parsers;
//! - [`policy`]: the `Policy` seam and its plain-data sampling types (the
//!   local model implements it in `agentrl-trainer`);
//! - [`engine`]: B×G trajectories in lock-step turns, and expert demonstrations;
//! - [`trajectory`]: what a finished episode holds.

pub mod codec;
pub mod engine;
pub mod format;
pub mod policy;
pub mod trajectory;

pub use codec::{ChatCodec, CodecError};
pub use engine::{expert_trajectory, run_rollouts, RolloutConfig, RolloutError, SYSTEM_PROMPT};
pub use format::{FormatError, ReplyFormat};
pub use policy::{Generation, Policy, PolicyError, SamplingParams};
pub use trajectory::{Trajectory, Turn};
