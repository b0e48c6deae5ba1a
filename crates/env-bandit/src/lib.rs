//! The two-armed bandit of RAGEN: one turn, one pull.
//!
//! The low arm pays 0.1 every time; the high arm pays 1.0 with probability
//! 0.25 (expected 0.25, the right choice). Each task draws a name pair (test
//! tasks use pairs never seen in training), which name is the risky arm, the
//! display order and the wording of the descriptions. On `easy` the
//! descriptions state the payouts; on `hard` they only hint at them
//! symbolically, as RAGEN asks the agent to reason from the arms' names.

mod generator;
mod parser;
mod solver;

use agentrl_env_core::{
    chance_rng, param_error, param_in_range, parse_params, stable_hash, task_rng, Env,
    EnvDescriptor, EnvError, EnvParams, Episode, Outcome, Step, StepError, TaskConfig, TaskSpec,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

pub use generator::{draw, Task, TEST_PAIRS, TRAIN_PAIRS};
pub use parser::{parse_action, MAX_ACTION_LEN};
pub use solver::{best_arm, expected_payouts};

/// Registry name.
pub const NAME: &str = "bandit";
/// Difficulty levels; the first is the default.
pub const DIFFICULTIES: &[&str] = &["easy", "hard"];

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: NAME,
        summary: "two named arms, one pull: a safe 0.1 or a 25% chance of 1.0 (RAGEN Bandit; test uses held-out names)",
        difficulties: DIFFICULTIES,
        default_max_turns: 1,
        request_params: &["low_reward", "high_reward", "high_prob", "numbered_arms"],
        operator_params: &[],
        factory: |spec, params| Ok(Box::new(Bandit::new(spec, params)?)),
    }
}

/// Label of the payout draws' RNG stream.
const PAYOUT_STREAM: &[u8] = b"bandit-payout";

/// The largest payout magnitude the params accept (RAGEN's are 0.1 and 1).
pub const REWARD_BOUND: f64 = 1000.0;

/// Payouts, from the `[env]` params.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The safe arm's certain payout.
    pub low_reward: f64,
    /// The risky arm's payout when it pays.
    pub high_reward: f64,
    /// How often the risky arm pays.
    pub high_prob: f64,
    /// Hard level: descriptions without numbers.
    pub symbolic: bool,
    /// Actions are the arms' numbers (`1`, `2`): the valid actions, the
    /// expert's and the instructions name an arm by its place, so the choice
    /// is one answer shared by every task rather than a name the reply can
    /// copy from the prompt. Names are still accepted.
    pub numbered_arms: bool,
}

/// The `[env]` params; an absent key keeps the config's value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    low_reward: Option<f64>,
    high_reward: Option<f64>,
    high_prob: Option<f64>,
    numbered_arms: Option<bool>,
}

impl TaskConfig for Config {
    /// RAGEN's payouts; `hard` hides the numbers.
    fn for_difficulty(difficulty: &str) -> Result<Self, EnvError> {
        let symbolic = match difficulty {
            "easy" => false,
            "hard" => true,
            other => return Err(EnvError::unknown_difficulty(NAME, other, DIFFICULTIES)),
        };
        Ok(Self {
            low_reward: 0.1,
            high_reward: 1.0,
            high_prob: 0.25,
            symbolic,
            numbered_arms: false,
        })
    }

    /// This config with `[env]` params applied: `low_reward`, `high_reward`,
    /// `high_prob` (the risky arm must keep the higher expectation: the
    /// task) and `numbered_arms`.
    fn with_params(mut self, params: &EnvParams) -> Result<Self, EnvError> {
        let p: Params = parse_params(NAME, params)?;
        // NaN fails every range check, so the ranges also refuse it.
        if let Some(v) = p.low_reward {
            self.low_reward = param_in_range(NAME, "low_reward", v, -REWARD_BOUND..=REWARD_BOUND)?;
        }
        if let Some(v) = p.high_reward {
            self.high_reward =
                param_in_range(NAME, "high_reward", v, -REWARD_BOUND..=REWARD_BOUND)?;
        }
        if let Some(v) = p.high_prob {
            self.high_prob = param_in_range(NAME, "high_prob", v, 0.0..=1.0)?;
        }
        if let Some(v) = p.numbered_arms {
            self.numbered_arms = v;
        }
        let (low, high) = expected_payouts(self.low_reward, self.high_reward, self.high_prob);
        if high <= low {
            return Err(param_error(
                NAME,
                "high_prob",
                "the risky arm's expectation (high_reward × high_prob) must exceed low_reward",
            ));
        }
        Ok(self)
    }
}

/// One bandit task.
#[derive(Debug, Clone)]
pub struct Bandit {
    spec: TaskSpec,
    config: Config,
    task: Task,
    task_hash: u64,
    /// Display index pulled, once pulled.
    pulled: Option<usize>,
    payout: f64,
    episode: Episode,
    payout_rng_start: ChaCha8Rng,
    payout_rng: ChaCha8Rng,
}

impl Bandit {
    /// Draw the task of `spec` with `[env]` params.
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let config = Config::for_task(spec, params)?;
        let mut rng = task_rng(spec)?;
        let task = draw(
            &mut rng,
            spec.split,
            config.symbolic,
            config.low_reward,
            config.high_reward,
            config.high_prob,
        );
        // Payouts come from their own stream so that the task itself does not
        // depend on how often the arm is pulled across resets.
        let payout_rng = chance_rng(PAYOUT_STREAM, spec, 0)?;
        let task_hash = stable_hash(&[
            task.names[0].as_bytes(),
            task.names[1].as_bytes(),
            task.descriptions[0].as_bytes(),
            task.descriptions[1].as_bytes(),
            &[task.high as u8],
        ]);
        Ok(Self {
            spec: spec.clone(),
            config,
            task,
            task_hash,
            pulled: None,
            payout: 0.0,
            episode: Episode::new(1),
            payout_rng_start: payout_rng.clone(),
            payout_rng,
        })
    }

    /// The drawn names, descriptions and the risky arm.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The action that pulls display index `arm`: its name, or with
    /// `numbered_arms` its number.
    fn action_of(&self, arm: usize) -> String {
        match self.config.numbered_arms {
            true => (arm + 1).to_string(),
            false => self.task.names[arm].clone(),
        }
    }

    fn render(&self) -> String {
        let t = &self.task;
        match self.pulled {
            None => format!(
                "Arm 1: {} — {} {}.\nArm 2: {} — {} {}.\nWhich arm do you pull?",
                t.names[0],
                t.names[0],
                t.descriptions[0],
                t.names[1],
                t.names[1],
                t.descriptions[1]
            ),
            Some(i) => format!("You pulled {} and received {}.", t.names[i], self.payout),
        }
    }
}

impl Env for Bandit {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        let action = match self.config.numbered_arms {
            true => "the arm's number, 1 or 2".to_string(),
            false => format!(
                "the arm's name ({a} or {b}, any case) or its number (1 or 2)",
                a = self.task.names[0],
                b = self.task.names[1]
            ),
        };
        format!(
            "Bandit: there are two slot-machine arms, {a} and {b}. Each arm has its own reward \
             distribution, described next to its name; one arm is safe and pays a small amount every \
             time, the other is risky. Pull the arm you expect to pay more on average.\n\
             You pull exactly once. Action: {action}.\n\
             Reward: whatever the pulled arm pays.",
            a = self.task.names[0],
            b = self.task.names[1]
        )
    }

    fn set_chance_stream(&mut self, stream: u64) {
        // The spec was checked when the env was built, so this cannot fail.
        if let Ok(rng) = chance_rng(PAYOUT_STREAM, &self.spec, stream) {
            self.payout_rng_start = rng.clone();
            self.payout_rng = rng;
        }
    }

    fn reset(&mut self) -> String {
        self.pulled = None;
        self.payout = 0.0;
        self.episode.reset();
        self.payout_rng = self.payout_rng_start.clone();
        self.render()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let arm = self
            .episode
            .begin(action, |text| parse_action(text, &self.task.names))?;
        // Draw even for the safe arm so the stream position never depends on the choice.
        let u: f64 = self.payout_rng.random();
        self.payout = if arm == self.task.high {
            if u < self.config.high_prob {
                self.config.high_reward
            } else {
                0.0
            }
        } else {
            self.config.low_reward
        };
        self.pulled = Some(arm);
        self.episode.settle(if arm == self.task.high {
            Outcome::Won
        } else {
            Outcome::Lost
        });
        let mut extra = serde_json::Map::new();
        extra.insert("arm".into(), self.task.names[arm].clone().into());
        Ok(self
            .episode
            .step_result(self.render(), self.payout, true, extra))
    }

    fn observation(&self) -> String {
        self.render()
    }

    fn available_actions(&self) -> Vec<String> {
        self.episode
            .offer(|| (0..2).map(|arm| self.action_of(arm)).collect())
    }

    fn state_key(&self) -> u64 {
        let pulled = self.pulled.map_or(0u8, |i| i as u8 + 1);
        stable_hash(&[&self.task_hash.to_le_bytes(), &[pulled]])
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.episode.is_done() {
            return None;
        }
        let c = &self.config;
        let arm = best_arm(self.task.high, c.low_reward, c.high_reward, c.high_prob);
        Some(self.action_of(arm))
    }

    fn episode(&self) -> Option<&Episode> {
        Some(&self.episode)
    }
}

#[cfg(test)]
mod tests;
