//! The bookkeeping every episode shares, so an environment's `step` holds
//! only its own game logic.

use crate::{ActionError, Step, StepError, StepInfo};

/// How the game stands after a valid action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Not over yet (the step budget may still end it).
    Running,
    /// Over, successfully.
    Won,
    /// Over, unsuccessfully (a hole, a wrong final answer, a bad purchase).
    Lost,
}

/// The counters and flags of one episode: valid steps, invalid actions, the
/// step budget, done and success.
///
/// An env embeds one, opens every step with [`Episode::begin`] and closes
/// every valid step with [`Episode::settle`]; [`crate::Env`]'s bookkeeping
/// methods read it through [`crate::Env::episode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    steps: usize,
    invalid_actions: usize,
    max_steps: usize,
    done: bool,
    success: bool,
}

impl Episode {
    /// A fresh episode that ends (unsuccessfully) after `max_steps` valid steps.
    pub fn new(max_steps: usize) -> Self {
        Self {
            steps: 0,
            invalid_actions: 0,
            max_steps,
            done: false,
            success: false,
        }
    }

    /// Back to the start: no steps, no invalid actions, not over.
    pub fn reset(&mut self) {
        *self = Self::new(self.max_steps);
    }

    /// Valid steps taken since reset.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Invalid actions attempted since reset.
    pub fn invalid_actions(&self) -> usize {
        self.invalid_actions
    }

    /// The step budget.
    pub fn max_steps(&self) -> usize {
        self.max_steps
    }

    /// Valid steps still allowed.
    pub fn steps_left(&self) -> usize {
        self.max_steps.saturating_sub(self.steps)
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn is_success(&self) -> bool {
        self.success
    }

    /// `Env::available_actions`: none once the episode is over, else `actions()`.
    pub fn offer(&self, actions: impl FnOnce() -> Vec<String>) -> Vec<String> {
        match self.done {
            true => Vec::new(),
            false => actions(),
        }
    }

    /// The opening of every step: refuse once the episode is over, then parse
    /// the action text; a text that does not parse is counted as an invalid
    /// action and returned as the step's error.
    pub fn begin<A>(
        &mut self,
        action: &str,
        parse: impl FnOnce(&str) -> Result<A, ActionError>,
    ) -> Result<A, StepError> {
        if self.done {
            return Err(StepError::EpisodeOver);
        }
        parse(action).map_err(|e| self.reject(e))
    }

    /// Count an action that cannot be taken (it parsed, but the state does not
    /// allow it) and turn it into the step's error; nothing else changes.
    pub fn reject(&mut self, error: ActionError) -> StepError {
        self.invalid_actions += 1;
        StepError::InvalidAction(error)
    }

    /// The result of a valid step, done and successful as the episode now
    /// stands (call after [`Episode::settle`]).
    pub fn step_result(
        &self,
        observation: String,
        reward: f64,
        effective: bool,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> Step {
        Step {
            observation,
            reward,
            done: self.done,
            success: self.success,
            info: StepInfo { effective, extra },
        }
    }

    /// Count one valid step and settle the episode: `Won` and `Lost` end it,
    /// a `Running` game ends (unsuccessfully) when the step budget is spent.
    /// Returns whether the budget ended a game that was still running, for
    /// envs that say so in the observation.
    pub fn settle(&mut self, outcome: Outcome) -> bool {
        self.steps += 1;
        match outcome {
            Outcome::Won => {
                self.done = true;
                self.success = true;
                false
            }
            Outcome::Lost => {
                self.done = true;
                false
            }
            Outcome::Running => {
                self.done = self.steps >= self.max_steps;
                self.done
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_digit(text: &str) -> Result<u8, ActionError> {
        text.parse().map_err(|_| ActionError::Unknown {
            action: text.into(),
            expected: "a digit".into(),
        })
    }

    #[test]
    fn begin_counts_parse_failures_and_refuses_after_the_end() {
        let mut ep = Episode::new(2);
        assert_eq!(ep.begin("7", parse_digit), Ok(7));
        assert!(matches!(
            ep.begin("x", parse_digit),
            Err(StepError::InvalidAction(ActionError::Unknown { .. }))
        ));
        assert_eq!((ep.steps(), ep.invalid_actions()), (0, 1));
        assert!(!ep.settle(Outcome::Lost));
        assert!(ep.is_done() && !ep.is_success());
        // Once over, even a bad text is EpisodeOver and is not counted.
        assert_eq!(ep.begin("x", parse_digit), Err(StepError::EpisodeOver));
        assert_eq!(ep.invalid_actions(), 1);
    }

    #[test]
    fn settle_ends_on_win_loss_or_the_step_budget() {
        let mut ep = Episode::new(2);
        assert!(!ep.settle(Outcome::Running));
        assert_eq!((ep.steps(), ep.steps_left(), ep.is_done()), (1, 1, false));
        assert!(ep.settle(Outcome::Running));
        assert!(ep.is_done() && !ep.is_success());
        ep.reset();
        assert_eq!(ep, Episode::new(2));
        // A win on the last allowed step is a win, not a timeout.
        ep.settle(Outcome::Running);
        assert!(!ep.settle(Outcome::Won));
        assert!(ep.is_done() && ep.is_success());
    }
}
