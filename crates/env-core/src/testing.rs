//! Helpers the environments' own tests and measurements share (feature
//! `testing`, for dev-dependencies only).

use std::fmt;
use std::time::Instant;

use rand::Rng;

use crate::{ActionError, Env, Step, StepError};

/// What an expert episode did.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertRun {
    pub success: bool,
    /// Valid steps taken since reset when the episode stopped.
    pub steps: usize,
    /// The rewards of the expert's steps, summed.
    pub reward: f64,
    pub actions: Vec<String>,
}

/// Play the expert from the current state until the episode ends or the
/// expert has no move. Panics when the env refuses an expert action.
pub fn run_expert(env: &mut dyn Env) -> ExpertRun {
    let (mut reward, mut actions) = (0.0, Vec::new());
    while !env.is_done() {
        let Some(action) = env.expert_action() else {
            break;
        };
        let step = env
            .step(&action)
            .unwrap_or_else(|e| panic!("{}: expert action {action:?} refused: {e}", env.spec()));
        reward += step.reward;
        actions.push(action);
    }
    ExpertRun {
        success: env.is_success(),
        steps: env.steps(),
        reward,
        actions,
    }
}

/// Step any `text` on an env whose episode is running and check the
/// contract: the text is taken with an observation, or refused as an invalid
/// action and counted once; it is never "episode over". `Err` says what broke.
pub fn check_arbitrary_step(env: &mut dyn Env, text: &str) -> Result<(), String> {
    let invalid = env.invalid_actions();
    match env.step(text) {
        Ok(s) if s.observation.is_empty() => Err(format!("{text:?} gave an empty observation")),
        Ok(_) => Ok(()),
        Err(StepError::InvalidAction(_)) if env.invalid_actions() == invalid + 1 => Ok(()),
        Err(StepError::InvalidAction(e)) => Err(format!("{text:?} refused ({e}) but not counted")),
        Err(StepError::EpisodeOver) => Err(format!("{text:?}: a running episode said it is over")),
    }
}

/// How uniformly random play over the available actions fares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomBaseline {
    pub episodes: u64,
    pub successes: usize,
    pub steps: usize,
    /// Valid steps per second, env creation included.
    pub steps_per_second: f64,
}

impl fmt::Display for RandomBaseline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "random success {}/{}, {:.0} steps/s",
            self.successes, self.episodes, self.steps_per_second
        )
    }
}

/// Play `episodes` episodes (`make(seed)` for seeds `0..episodes`) with a
/// uniformly random available action each turn, until each one ends.
pub fn random_baseline<E: Env>(
    make: impl Fn(u64) -> E,
    episodes: u64,
    rng: &mut impl Rng,
) -> RandomBaseline {
    let (mut successes, mut steps) = (0, 0);
    let start = Instant::now();
    for seed in 0..episodes {
        let mut env = make(seed);
        while !env.is_done() {
            let actions = env.available_actions();
            assert!(!actions.is_empty(), "{}: no available action", env.spec());
            let action = &actions[rng.random_range(0..actions.len())];
            if let Err(e) = env.step(action) {
                panic!("{}: available action {action:?} refused: {e}", env.spec());
            }
            steps += 1;
        }
        successes += usize::from(env.is_success());
    }
    RandomBaseline {
        episodes,
        successes,
        steps,
        steps_per_second: steps as f64 / start.elapsed().as_secs_f64(),
    }
}

/// The `q` quantile (0 to 1) of sorted measurements, nearest rank.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The name of an action error's variant (`"Empty"`, `"TooLong"`,
/// `"Unknown"`, `"Malformed"`, `"NotPossible"`), for table-driven tests.
pub fn refusal(error: &ActionError) -> &'static str {
    match error {
        ActionError::Empty => "Empty",
        ActionError::TooLong { .. } => "TooLong",
        ActionError::Unknown { .. } => "Unknown",
        ActionError::Malformed { .. } => "Malformed",
        ActionError::NotPossible { .. } => "NotPossible",
    }
}

/// How a step went, as a name: `"taken"`, `"EpisodeOver"` or the
/// [`refusal`] of an invalid action.
pub fn step_kind(result: &Result<Step, StepError>) -> &'static str {
    match result {
        Ok(_) => "taken",
        Err(StepError::EpisodeOver) => "EpisodeOver",
        Err(StepError::InvalidAction(e)) => refusal(e),
    }
}

/// The [`refusal`] of a parse result, `None` when it parsed.
pub fn refusal_of<T>(result: Result<T, ActionError>) -> Option<&'static str> {
    result.err().map(|e| refusal(&e))
}

/// Check a grammar of a few named actions (see
/// [`crate::action::choose_action`]): each of `names` in any case, and its
/// 1-based index, parse to the action at the same place in `actions`; other
/// text is refused as unknown, empty or too long.
pub fn check_named_actions<A: PartialEq + fmt::Debug + Copy>(
    parse: impl Fn(&str) -> Result<A, ActionError>,
    actions: &[A],
    names: &[&str],
) {
    assert_eq!(actions.len(), names.len());
    for (i, (action, name)) in actions.iter().zip(names).enumerate() {
        assert_eq!(parse(&name.to_uppercase()), Ok(*action), "{name}");
        assert_eq!(parse(&format!(" {}\n", name.to_lowercase())), Ok(*action));
        assert_eq!(parse(&(i + 1).to_string()), Ok(*action), "index {}", i + 1);
    }
    let past_the_end = (actions.len() + 1).to_string();
    for text in ["0", &past_the_end, "-1", "north west", "١"] {
        assert_eq!(refusal_of(parse(text)), Some("Unknown"), "{text}");
    }
    assert_eq!(refusal_of(parse(" \t\n")), Some("Empty"));
    assert_eq!(refusal_of(parse(&"x".repeat(100_000))), Some("TooLong"));
}
