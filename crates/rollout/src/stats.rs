//! Figures over played episodes: the one evaluation result type.

use serde::{Deserialize, Serialize};

use crate::trajectory::Trajectory;

/// Aggregate figures over a set of trajectories (validation, `agentrl eval`,
/// `agentrl bench envs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalStats {
    pub n: usize,
    pub success_rate: f64,
    /// Mean return (environment rewards plus format penalties).
    pub mean_reward: f64,
    pub mean_turns: f64,
    /// Mean valid environment steps.
    pub mean_env_steps: f64,
    pub mean_generated_tokens: f64,
    /// Invalid actions per turn.
    pub invalid_action_rate: f64,
    /// Unparseable replies per turn.
    pub format_error_rate: f64,
}

impl EvalStats {
    pub fn of(trajs: &[Trajectory]) -> Self {
        let mut tally = EpisodeTally::default();
        tally.add(trajs);
        tally.stats()
    }
}

/// Running totals over episodes, for figures over more episodes than are
/// kept at once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpisodeTally {
    pub episodes: usize,
    pub successes: usize,
    /// Sum of returns.
    pub reward: f64,
    pub turns: usize,
    pub env_steps: usize,
    pub generated_tokens: usize,
    pub invalid_actions: usize,
    pub format_errors: usize,
}

impl EpisodeTally {
    /// Count `trajs`.
    pub fn add(&mut self, trajs: &[Trajectory]) {
        for t in trajs {
            self.episodes += 1;
            self.successes += usize::from(t.success);
            self.reward += t.score() as f64;
            self.turns += t.turns.len();
            self.env_steps += t.env_steps;
            self.generated_tokens += t.generated_tokens();
            self.invalid_actions += t.invalid_actions();
            self.format_errors += t.format_errors();
        }
    }

    /// Means and rates of what was counted (all zero for no episode).
    pub fn stats(&self) -> EvalStats {
        if self.episodes == 0 {
            return EvalStats::default();
        }
        let n = self.episodes as f64;
        let per_turn = |x: usize| match self.turns {
            0 => 0.0,
            turns => x as f64 / turns as f64,
        };
        EvalStats {
            n: self.episodes,
            success_rate: self.successes as f64 / n,
            mean_reward: self.reward / n,
            mean_turns: self.turns as f64 / n,
            mean_env_steps: self.env_steps as f64 / n,
            mean_generated_tokens: self.generated_tokens as f64 / n,
            invalid_action_rate: per_turn(self.invalid_actions),
            format_error_rate: per_turn(self.format_errors),
        }
    }
}
