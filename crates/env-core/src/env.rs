use serde::{Deserialize, Serialize};

use crate::{Episode, StepError, TaskSpec};

/// The [`Env::safe_actions`] of an env whose reading rules out some moves:
/// those of `safe` that are valid now, or every valid action when none is
/// (a player boxed in still has to move).
pub fn safe_or_valid(valid: Vec<String>, safe: Vec<String>) -> Vec<String> {
    let safe: Vec<String> = safe.into_iter().filter(|a| valid.contains(a)).collect();
    match safe.is_empty() {
        true => valid,
        false => safe,
    }
}

/// Extra facts about one step, for metrics and analysis.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepInfo {
    /// The action changed the environment's state (RAGEN's "action is effective").
    pub effective: bool,
    /// Free-form env-specific facts (e.g. `"boxes_on_target": 1`).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The result of a valid action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub observation: String,
    pub reward: f64,
    pub done: bool,
    pub success: bool,
    pub info: StepInfo,
}

/// One environment instance playing one task.
///
/// Contract:
/// - `reset` puts the task back in its initial state (same spec → same state)
///   and returns the first observation;
/// - `step` applies one action text; an invalid action returns
///   `Err(StepError::InvalidAction)`, changes nothing but the invalid-action
///   counter, and the env stays usable;
/// - after `done`, `step` returns `Err(StepError::EpisodeOver)`.
///
/// An env that keeps its bookkeeping in an [`Episode`] (every built-in env
/// does) implements the eight game methods and [`Env::episode`]; the five
/// bookkeeping methods then read the episode.
pub trait Env: Send {
    /// The spec this env was created from.
    fn spec(&self) -> &TaskSpec;

    /// Rules, action grammar and symbol legend, shown once at the start.
    fn instructions(&self) -> String;

    /// Restart the task from its initial state; returns the first observation.
    fn reset(&mut self) -> String;

    /// Apply one action given as text.
    fn step(&mut self, action: &str) -> Result<Step, StepError>;

    /// The current observation text.
    fn observation(&self) -> String;

    /// Actions valid in the current state, in a stable order. For free-text
    /// grammars (search queries) this lists representative actions.
    fn available_actions(&self) -> Vec<String>;

    /// A key identifying the current environment state: equal keys mean the
    /// same state (used by GiGPO's step-level groups). Must be stable across runs.
    fn state_key(&self) -> u64;

    /// The expert solver's next action from the current state, or `None` if the
    /// episode is over or the expert has no move.
    fn expert_action(&mut self) -> Option<String>;

    /// What a careful player reads off the current observation before it
    /// acts, as a short text (FrozenLake: what lies one step in each
    /// direction). A warm start can write it as the expert's thought and
    /// pre-train on it, so the model learns to read the state before RL
    /// asks it to act on what it read. `None` where the env defines none.
    fn perception(&self) -> Option<String> {
        None
    }

    /// The valid actions a player who read the state (its
    /// [`Env::perception`]) would not rule out at once: on FrozenLake the
    /// moves that neither fall into a hole nor bump into the edge. A warm
    /// start whose random moves are drawn from these ties each move to the
    /// reading before it. Defaults to every valid action.
    fn safe_actions(&self) -> Vec<String> {
        self.available_actions()
    }

    /// Draw this task's chance events (a bandit's payout, a slip on the ice)
    /// from stream `stream` from the next reset on; stream 0 is the task's
    /// own luck. Members of a GRPO group given different streams meet the
    /// same task with independent luck, so the group compares choices, not
    /// one shared draw. Envs without chance, and remote envs, ignore it.
    fn set_chance_stream(&mut self, _stream: u64) {}

    /// The episode's bookkeeping, for an env that keeps it in an [`Episode`].
    /// An env that keeps it elsewhere (a remote client mirroring a server's
    /// counters) answers `None` and overrides the five methods below, which
    /// otherwise read an episode that never starts: no steps, no budget, not done.
    fn episode(&self) -> Option<&Episode> {
        None
    }

    /// Valid steps taken since reset.
    fn steps(&self) -> usize {
        self.episode().map_or(0, Episode::steps)
    }

    /// Invalid actions attempted since reset.
    fn invalid_actions(&self) -> usize {
        self.episode().map_or(0, Episode::invalid_actions)
    }

    /// The episode ends (done, not successful) after this many valid steps.
    fn max_steps(&self) -> usize {
        self.episode().map_or(0, Episode::max_steps)
    }

    fn is_done(&self) -> bool {
        self.episode().is_some_and(Episode::is_done)
    }

    fn is_success(&self) -> bool {
        self.episode().is_some_and(Episode::is_success)
    }
}
