//! One episode of a policy in an environment, as token ids plus everything the
//! algorithms and the reports need.

use agentrl_env_core::TaskSpec;
use serde::{Deserialize, Serialize};

/// One policy turn: its reply and what the environment made of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Token range `[start, end)` of the policy's reply in `Trajectory::tokens`
    /// (includes its end-of-turn token when it generated one).
    pub start: usize,
    pub end: usize,
    /// The reply's text (for a scripted player, its moves in the reply format).
    pub reply: String,
    /// Actions read from the reply (empty when the format was wrong).
    pub actions: Vec<String>,
    /// Sum of the environment's rewards for this turn's actions (raw).
    pub env_reward: f32,
    /// Format / invalid-action penalty charged this turn (≤ 0).
    pub penalty: f32,
    /// The reply did not parse.
    pub format_error: bool,
    /// Actions the environment rejected.
    pub invalid_actions: usize,
    /// Environment state before the turn (GiGPO anchor states).
    pub state_key: u64,
    /// The environment's observation the turn was played from.
    #[serde(default)]
    pub observation: String,
}

impl Turn {
    /// Reward of the turn as the policy is trained on it.
    pub fn reward(&self) -> f32 {
        self.env_reward + self.penalty
    }
}

/// A finished episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub spec: TaskSpec,
    /// Index of the group (same TaskSpec) this trajectory belongs to.
    pub group: usize,
    /// The whole conversation: prompt, replies and observations.
    pub tokens: Vec<u32>,
    /// 1 exactly on tokens the policy generated (including its `<|im_end|>`).
    pub loss_mask: Vec<u8>,
    pub turns: Vec<Turn>,
    pub success: bool,
    /// The environment ended the episode (vs. turn/action/context budget).
    pub env_done: bool,
    /// Stopped because the context grew past its limit.
    pub truncated: bool,
    /// Valid environment steps taken.
    pub env_steps: usize,
    /// The environment's instructions (rules, grammar), shown before the
    /// first observation.
    #[serde(default)]
    pub instructions: String,
    /// The observation after the last turn.
    #[serde(default)]
    pub final_observation: String,
    /// The environment's state after the last turn.
    #[serde(default)]
    pub final_state_key: u64,
    /// The environment's own step limit (0 when it has none it reports).
    #[serde(default)]
    pub env_max_steps: usize,
}

impl Trajectory {
    /// Raw environment return, before penalties (StarPO-S filters on this).
    pub fn raw_score(&self) -> f32 {
        self.turns.iter().map(|t| t.env_reward).sum()
    }

    /// Return the policy is trained on: env rewards plus penalties.
    pub fn score(&self) -> f32 {
        self.turns.iter().map(Turn::reward).sum()
    }

    pub fn generated_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m == 1).count()
    }

    pub fn format_errors(&self) -> usize {
        self.turns.iter().filter(|t| t.format_error).count()
    }

    pub fn invalid_actions(&self) -> usize {
        self.turns.iter().map(|t| t.invalid_actions).sum()
    }

    /// The state after turn `k`: the next turn's starting state, or the
    /// final state after the last turn.
    pub fn state_after(&self, k: usize) -> u64 {
        self.turns
            .get(k + 1)
            .map_or(self.final_state_key, |t| t.state_key)
    }

    /// Per-token rewards. With `per_turn`, each turn's reward sits on that
    /// turn's last policy token; otherwise the whole return sits on the last
    /// policy token. Either way no reward lands on an observation token (the
    /// AgentGym-RL bug where GAE / REINFORCE++ then drop it).
    pub fn token_rewards(&self, per_turn: bool) -> Vec<f32> {
        let mut r = vec![0.0; self.tokens.len()];
        if per_turn {
            for t in &self.turns {
                if t.end > t.start {
                    r[t.end - 1] += t.reward();
                }
            }
        } else if let Some(last) = self.loss_mask.iter().rposition(|&m| m == 1) {
            r[last] = self.score();
        }
        r
    }

    /// Turn index of every token (−1 on tokens the policy did not generate).
    pub fn turn_ids(&self) -> Vec<i32> {
        let mut ids = vec![-1; self.tokens.len()];
        for (k, t) in self.turns.iter().enumerate() {
            for (i, id) in ids.iter_mut().enumerate().take(t.end).skip(t.start) {
                if self.loss_mask[i] == 1 {
                    *id = k as i32;
                }
            }
        }
        ids
    }
}
