//! Multi-turn rollouts: a policy plays environments turn by turn.
//!
//! - [`codec`]: chat messages → token ids (ChatML, built incrementally so the
//!   loss mask is exact);
//! - [`mod@format`]: reply formats and their parsers;
//! - [`policy`]: the `Policy` seam and its plain-data sampling types (the
//!   local model implements it in `agentrl-trainer`, an inference server can
//!   too);
//! - [`engine`]: the one episode loop: B×G episodes in lock-step turns,
//!   played by an [`Actor`];
//! - [`actor`]: the actors: a model policy, the expert, random play;
//! - [`trajectory`]: what a finished episode holds;
//! - [`stats`]: figures over finished episodes;
//! - [`failure`]: rule-based failure labels of unsuccessful episodes.

pub mod actor;
pub mod codec;
pub mod engine;
pub mod failure;
pub mod format;
pub mod policy;
pub mod stats;
pub mod trajectory;

pub use actor::{
    Expert, ExpertActor, PolicyActor, Random, RandomActor, RandomMoves, Scripted, ScriptedPlayer,
};
pub use codec::{ChatCodec, CodecError};
pub use engine::{
    expert_demonstrations, play_episodes, policy_written, prefill_text, reply_opening,
    run_rollouts, state_message, state_prompt, Actor, AgentStrategy, GroupFilterType, Play, Reply,
    RolloutConfig, RolloutError, Seat, SYSTEM_PROMPT,
};
pub use failure::{failure_labels, FailureCounts, FailureLabel};
pub use format::{FormatError, ReplyFormat};
pub use policy::{
    generate_in_lockstep, Followup, Generation, Generations, Policy, PolicyError, PolicyFn,
    PromptBatch, SamplingParams,
};
pub use stats::{EpisodeTally, EvalStats};
pub use trajectory::{Trajectory, Turn};
