//! Advantage estimators on plain `f32` slices (no tensors).
//!
//! Two shapes of input appear:
//! - per trajectory: `scores[i]` with `group_ids[i]` (the G samples of one
//!   task share a group id) — GRPO, RLOO, GiGPO's episode level;
//! - per token, ragged: `rows[i][t]` for sequence `i`, position `t`, with a
//!   loss mask (1 = a token the policy generated, 0 = prompt / observation)
//!   — REINFORCE++, GAE.
//!
//! Trajectory- and turn-level advantages are spread onto tokens with the
//! helpers in [`spread`].

pub mod gae;
pub mod gigpo;
pub mod grpo;
pub mod reinforce;
pub mod rloo;
pub mod spread;

pub use gae::{gae, gae_bilevel, BiLevelGaeConfig, GaeOutput};
pub use gigpo::gigpo;
pub use grpo::{grpo, GRPO_EPS};
pub use reinforce::reinforce_plus_plus;
pub use rloo::rloo;
pub use spread::{kl_in_reward, sequence_to_tokens, turns_to_tokens};
