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
    /// The environment's perception of that state ([`agentrl_env_core::Env::perception`]),
    /// where it has one: the reading a perception update teaches for the
    /// turn's own prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perception: Option<String>,
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
    /// Everything the policy read and wrote: with the whole dialogue in the
    /// context (the default) one sequence of prompt, replies and
    /// observations; with a history window (`rollout.history_turns`) each
    /// turn's own prompt and reply, one sequence after another (see
    /// [`Trajectory::sequence_ranges`]).
    pub tokens: Vec<u32>,
    /// 1 exactly on tokens the policy generated (including its `<|im_end|>`).
    pub loss_mask: Vec<u8>,
    /// Where each sequence after the first begins in `tokens` (empty: one
    /// sequence). No token attends across a start: the model reads each
    /// sequence on its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequence_starts: Vec<usize>,
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
    /// An episode of `spec` in `group` with nothing played: no tokens or
    /// turns, not ended, no instructions (a base to set the played fields on).
    pub fn new(spec: TaskSpec, group: usize) -> Self {
        Trajectory {
            spec,
            group,
            tokens: Vec::new(),
            loss_mask: Vec::new(),
            sequence_starts: Vec::new(),
            turns: Vec::new(),
            success: false,
            env_done: false,
            truncated: false,
            env_steps: 0,
            instructions: String::new(),
            final_observation: String::new(),
            final_state_key: 0,
            env_max_steps: 0,
        }
    }

    /// Raw environment return, before penalties (StarPO-S filters on this).
    pub fn raw_score(&self) -> f32 {
        self.turns.iter().map(|t| t.env_reward).sum()
    }

    /// Return the policy is trained on: env rewards plus penalties.
    pub fn score(&self) -> f32 {
        self.turns.iter().map(Turn::reward).sum()
    }

    /// Token ranges `[start, end)` of the sequences the model reads on its
    /// own, in order; together they cover `tokens`.
    pub fn sequence_ranges(&self) -> Vec<std::ops::Range<usize>> {
        sequence_ranges(&self.sequence_starts, self.tokens.len())
    }

    /// The sequences themselves (see [`Trajectory::sequence_ranges`]).
    pub fn sequences(&self) -> Vec<&[u32]> {
        self.sequence_ranges()
            .into_iter()
            .map(|r| &self.tokens[r])
            .collect()
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

/// The ranges of a token row of `len` tokens cut at `starts`.
pub fn sequence_ranges(starts: &[usize], len: usize) -> Vec<std::ops::Range<usize>> {
    let mut cuts: Vec<usize> = std::iter::once(0)
        .chain(starts.iter().copied().filter(|&s| s > 0 && s < len))
        .collect();
    cuts.push(len);
    cuts.windows(2)
        .filter(|w| w[1] > w[0])
        .map(|w| w[0]..w[1])
        .collect()
}

/// A row in the *shifted* frame of a trajectory with several sequences
/// (entry `i` scores token `i + 1`), cut into the shifted rows of its
/// sequences: sequence `[a, b)` owns entries `a..b - 1`, and the entry
/// between two sequences (a first token, predicted by no one) is dropped.
pub fn split_shifted<T: Clone>(row: &[T], ranges: &[std::ops::Range<usize>]) -> Vec<Vec<T>> {
    ranges
        .iter()
        .map(|r| row[r.start.min(row.len())..(r.end - 1).min(row.len())].to_vec())
        .collect()
}

/// The inverse of [`split_shifted`]: the sequences' shifted rows joined into
/// one shifted row, `fill` on each entry between two sequences.
pub fn join_shifted<T: Clone>(rows: Vec<Vec<T>>, fill: T) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.iter().map(|r| r.len() + 1).sum());
    for (i, row) in rows.into_iter().enumerate() {
        if i > 0 {
            out.push(fill.clone());
        }
        out.extend(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_row_and_ignore_empty_cuts() {
        assert_eq!(sequence_ranges(&[], 5), vec![0..5]);
        assert_eq!(sequence_ranges(&[2, 4], 6), vec![0..2, 2..4, 4..6]);
        assert_eq!(sequence_ranges(&[0, 3, 3, 9], 5), vec![0..3, 3..5]);
        assert!(sequence_ranges(&[], 0).is_empty());
    }

    #[test]
    fn split_then_join_restores_a_shifted_row() {
        // Tokens 0..7 in sequences [0,3) [3,7): shifted entries 0..6; entry
        // 2 scores token 3, the second sequence's first token.
        let ranges = sequence_ranges(&[3], 7);
        let row: Vec<i32> = (0..6).collect();
        let parts = split_shifted(&row, &ranges);
        assert_eq!(parts, vec![vec![0, 1], vec![3, 4, 5]]);
        assert_eq!(join_shifted(parts, -1), vec![0, 1, -1, 3, 4, 5]);
    }
}
