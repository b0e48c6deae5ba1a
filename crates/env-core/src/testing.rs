//! Helpers the environments' own tests and measurements share (feature
//! `testing`, for dev-dependencies only).

use std::fmt::Debug;
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

/// Step any `text` at any point of an episode and check the bookkeeping
/// every env shares: only an ended episode answers "episode over"; a taken
/// step counts one step and its `done` is the env's; a refused action counts
/// one invalid action and no step. `Ok(Some(step))` when the step was taken,
/// `Ok(None)` when it was refused; `Err` says what broke.
pub fn step_any(env: &mut dyn Env, text: &str) -> Result<Option<Step>, String> {
    let (was_done, steps, invalid) = (env.is_done(), env.steps(), env.invalid_actions());
    let counts = |env: &dyn Env| (env.steps(), env.invalid_actions());
    match env.step(text) {
        Ok(_) if was_done => Err(format!("{text:?} was taken after the episode ended")),
        Ok(s) if s.done != env.is_done() => Err(format!(
            "{text:?}: done {} but the env says {}",
            s.done,
            env.is_done()
        )),
        Ok(_) if counts(env) != (steps + 1, invalid) => {
            Err(format!("{text:?} taken but not counted once as a step"))
        }
        Ok(s) => Ok(Some(s)),
        Err(StepError::EpisodeOver) if was_done => Ok(None),
        Err(StepError::EpisodeOver) => Err(format!("{text:?}: a running episode said it is over")),
        Err(StepError::InvalidAction(e)) if counts(env) != (steps, invalid + 1) => Err(format!(
            "{text:?} refused ({e}) but not counted once as invalid"
        )),
        Err(StepError::InvalidAction(_)) => Ok(None),
    }
}

/// Check that the expert solves at least `min_successes` of the episodes
/// `make(difficulty, seed)`, seeds `0..episodes`, on each difficulty; prints
/// the rate and mean steps (`label` names the env) and each failure's actions.
pub fn assert_expert_solves(
    label: &str,
    difficulties: &[&str],
    make: impl Fn(&str, u64) -> Box<dyn Env>,
    episodes: u64,
    min_successes: usize,
) {
    for &difficulty in difficulties {
        let (mut successes, mut steps) = (0, 0);
        for seed in 0..episodes {
            let mut env = make(difficulty, seed);
            env.reset();
            let run = run_expert(env.as_mut());
            if !run.success {
                eprintln!("{} failed: {:?}", env.spec(), run.actions);
            }
            successes += usize::from(run.success);
            steps += run.steps;
        }
        println!(
            "{label} {difficulty}: expert success {successes}/{episodes}, mean steps {:.1}",
            steps as f64 / episodes as f64
        );
        assert!(
            successes >= min_successes,
            "{label} {difficulty}: expert solved only {successes}/{episodes}"
        );
    }
}

/// Check that uniformly random play over the available actions succeeds
/// fewer than `max_successes` times in the episodes `make(difficulty, seed)`,
/// seeds `0..episodes`, on each difficulty (one `rng` for all); prints the
/// successes and valid steps per second, env creation included.
pub fn assert_random_play_below(
    label: &str,
    difficulties: &[&str],
    make: impl Fn(&str, u64) -> Box<dyn Env>,
    (episodes, max_successes): (u64, usize),
    rng: &mut impl Rng,
) {
    for &difficulty in difficulties {
        let (mut successes, mut steps) = (0, 0);
        let start = Instant::now();
        for seed in 0..episodes {
            let mut env = make(difficulty, seed);
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
        println!(
            "{label} {difficulty}: random success {successes}/{episodes}, {:.0} steps/s",
            steps as f64 / start.elapsed().as_secs_f64()
        );
        assert!(
            successes < max_successes,
            "{label} {difficulty}: {successes}"
        );
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
pub fn check_named_actions<A: PartialEq + Debug + Copy>(
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

/// Check that each text is refused with the [`refusal`] named next to it,
/// that each refusal is counted, and that nothing else changes: valid steps,
/// observation and state key stay as they were.
pub fn assert_refused_unchanged(env: &mut dyn Env, refusals: &[(&str, &str)]) {
    let (observation, key) = (env.observation(), env.state_key());
    let (steps, invalid) = (env.steps(), env.invalid_actions());
    for &(text, kind) in refusals {
        assert_eq!(step_kind(&env.step(text)), kind, "{}: {text:?}", env.spec());
    }
    assert_eq!(
        env.invalid_actions(),
        invalid + refusals.len(),
        "{}",
        env.spec()
    );
    assert_eq!(env.steps(), steps, "{}", env.spec());
    assert_eq!(env.observation(), observation, "{}", env.spec());
    assert_eq!(env.state_key(), key, "{}", env.spec());
}

/// Check that valid `actions` (cycled), none of which wins or loses, end the
/// episode unsuccessfully on exactly the last step of the budget, after
/// which stepping is "episode over".
pub fn assert_budget_ends_episode(env: &mut dyn Env, actions: &[&str]) {
    let (spec, max) = (env.spec().clone(), env.max_steps());
    for (i, action) in actions.iter().cycle().take(max).enumerate() {
        let step = env
            .step(action)
            .unwrap_or_else(|e| panic!("{spec}: {action:?} refused: {e}"));
        assert_eq!(step.done, i + 1 == max, "{spec}: step {} of {max}", i + 1);
        assert!(!step.success, "{spec}: {action:?} won");
    }
    assert_eq!(env.step(actions[0]), Err(StepError::EpisodeOver), "{spec}");
}
