//! The env contract, checked over every registered environment, every
//! difficulty and a few seeds in each split.
//!
//! The retrieval envs run on their smallest built-in collections in memory
//! (100 products, 100 passages), so the whole file stays well under a second.

use agentrl_env_core::testing::check_arbitrary_step;
use agentrl_envs::{
    descriptors, find, make_env, Env, EnvDescriptor, EnvError, EnvParams, Split, Step, StepError,
    TaskSpec,
};
use proptest::prelude::*;

/// Texts no environment's grammar accepts.
const NOT_ACTIONS: [&str; 2] = ["", "definitely not an action"];

/// Seeds per difficulty; seed `i` is drawn from split `i % 3`.
const SEEDS: u64 = 3;

fn small_params(env: &str) -> EnvParams {
    let size_key = match env {
        "webshop" => "catalog_size",
        "searchqa" => "corpus_size",
        _ => return EnvParams::new(),
    };
    let mut p = EnvParams::new();
    p.insert(size_key.into(), 100.into());
    p.insert("cache_dir".into(), "memory".into());
    p
}

/// Every (descriptor, spec) the contract is checked on.
fn cases() -> Vec<(EnvDescriptor, TaskSpec)> {
    let mut out = Vec::new();
    for d in descriptors() {
        for difficulty in d.difficulties {
            for seed in 0..SEEDS {
                let split = Split::ALL[seed as usize % Split::ALL.len()];
                out.push((d.clone(), TaskSpec::new(d.name, split, *difficulty, seed)));
            }
        }
    }
    out
}

fn make(d: &EnvDescriptor, spec: &TaskSpec) -> Box<dyn Env> {
    d.create(spec, &small_params(d.name))
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Everything an observer can see of an env between steps.
fn snapshot(env: &dyn Env) -> (String, u64, usize, usize, bool, bool) {
    (
        env.observation(),
        env.state_key(),
        env.steps(),
        env.invalid_actions(),
        env.is_done(),
        env.is_success(),
    )
}

/// Play the expert to the end, trying the non-actions before every move.
/// Returns the valid steps' results.
fn play_expert_with_mistakes(env: &mut dyn Env) -> Vec<Step> {
    let spec = env.spec().clone();
    let mut steps = Vec::new();
    while let Some(action) = env.expert_action() {
        for text in NOT_ACTIONS {
            let before = snapshot(env);
            let result = env.step(text);
            assert!(
                matches!(result, Err(StepError::InvalidAction(_))),
                "{spec}: {text:?} gave {result:?}"
            );
            let after = snapshot(env);
            // Only the invalid-action counter moves.
            assert_eq!(after.3, before.3 + 1, "{spec}");
            assert_eq!((after.0, after.1, after.2), (before.0, before.1, before.2));
        }
        let step = env
            .step(&action)
            .unwrap_or_else(|e| panic!("{spec}: expert action {action:?} refused: {e}"));
        assert_eq!(step.done, env.is_done(), "{spec}");
        steps.push(step);
        assert!(env.steps() <= env.max_steps(), "{spec}: past the budget");
    }
    steps
}

#[test]
fn every_env_plays_by_the_contract() {
    let mut successes = std::collections::BTreeMap::<&str, usize>::new();
    for (d, spec) in cases() {
        let mut env = make(&d, &spec);
        assert_eq!(env.spec(), &spec);
        assert!(!env.instructions().is_empty(), "{spec}");
        let first = env.reset();
        let key = env.state_key();
        assert_eq!(env.observation(), first, "{spec}");
        assert_eq!((env.steps(), env.invalid_actions()), (0, 0), "{spec}");

        let steps = play_expert_with_mistakes(env.as_mut());
        // The expert ends the episode within the budget, with every
        // attempted text counted once.
        assert!(env.is_done(), "{spec}: the expert stopped before the end");
        assert_eq!(env.steps(), steps.len(), "{spec}");
        assert_eq!(env.invalid_actions(), steps.len() * NOT_ACTIONS.len());
        assert_eq!(steps.last().map(|s| s.success), Some(env.is_success()));
        *successes.entry(d.name).or_default() += usize::from(env.is_success());

        // After the end every text is refused, and nothing is counted.
        for text in ["x", &first] {
            assert_eq!(env.step(text), Err(StepError::EpisodeOver), "{spec}");
        }
        assert_eq!(env.invalid_actions(), steps.len() * NOT_ACTIONS.len());
        assert_eq!(env.expert_action(), None, "{spec}");

        // Reset restores the same task and state with fresh counters.
        assert_eq!(env.reset(), first, "{spec}");
        assert_eq!(env.state_key(), key, "{spec}");
        assert_eq!((env.steps(), env.invalid_actions()), (0, 0), "{spec}");
        assert!(!env.is_done() && !env.is_success(), "{spec}");
    }
    // The expert can win everywhere (per-env tests measure how often).
    for d in descriptors() {
        assert!(
            successes.get(d.name).copied().unwrap_or(0) > 0,
            "{}",
            d.name
        );
    }
}

/// The state keys of an expert episode from the env's current state.
fn expert_state_keys(env: &mut dyn Env) -> Vec<u64> {
    let mut keys = vec![env.state_key()];
    while let Some(action) = env.expert_action() {
        let _ = env.step(&action);
        keys.push(env.state_key());
    }
    keys
}

#[test]
fn the_same_spec_gives_the_same_episode_in_two_fresh_instances() {
    for (d, spec) in cases() {
        let mut a = make(&d, &spec);
        let mut b = make(&d, &spec);
        assert_eq!(a.instructions(), b.instructions(), "{spec}");
        assert_eq!(snapshot(a.as_ref()), snapshot(b.as_ref()), "{spec}");
        assert_eq!(a.available_actions(), b.available_actions(), "{spec}");
        while let Some(action) = a.expert_action() {
            assert_eq!(
                b.expert_action().as_deref(),
                Some(action.as_str()),
                "{spec}"
            );
            assert_eq!(a.step(&action), b.step(&action), "{spec}");
            assert_eq!(snapshot(a.as_ref()), snapshot(b.as_ref()), "{spec}");
            assert_eq!(a.available_actions(), b.available_actions(), "{spec}");
        }
        // A reset replays the same states.
        a.reset();
        b.reset();
        assert_eq!(
            expert_state_keys(a.as_mut()),
            expert_state_keys(b.as_mut()),
            "{spec}"
        );
    }
}

#[test]
fn names_are_unique_and_every_env_is_reachable_by_name() {
    let all = descriptors();
    assert_eq!(all.len(), 8);
    let mut names: Vec<&str> = all.iter().map(|d| d.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len());
    for d in &all {
        assert_eq!(find(d.name).unwrap().name, d.name);
        assert!(!d.difficulties.is_empty() && d.default_max_turns > 0);
        assert!(!d.summary.is_empty());
    }
    for name in ["bandit", "frozenlake", "sokoban"] {
        assert_eq!(find(name).unwrap().difficulties, &["easy", "hard"]);
    }
}

#[test]
fn unknown_env_difficulty_and_param_are_errors() {
    let spec = TaskSpec::new("chess", Split::Train, "easy", 0);
    assert!(matches!(
        make_env(&spec, &EnvParams::new()),
        Err(EnvError::UnknownEnv { .. })
    ));
    for d in descriptors() {
        let spec = TaskSpec::new(d.name, Split::Train, "insane", 0);
        assert!(
            matches!(
                make_env(&spec, &EnvParams::new()),
                Err(EnvError::UnknownDifficulty { .. })
            ),
            "{}",
            d.name
        );
        let mut p = small_params(d.name);
        p.insert("no_such_param".into(), 1.into());
        let spec = TaskSpec::new(d.name, Split::Train, d.difficulties[0], 0);
        match make_env(&spec, &p) {
            Err(EnvError::InvalidParam { env, key, .. }) => {
                assert_eq!((env.as_str(), key.as_str()), (d.name, "no_such_param"));
            }
            other => panic!("{}: {:?}", d.name, other.map(|_| ())),
        }
    }
}

/// The param names an env's parser knows, read from the serde message that
/// refuses an unknown key ("expected one of `a`, `b`" / "there are no fields").
fn parser_keys(d: &EnvDescriptor) -> Vec<String> {
    let mut p = EnvParams::new();
    p.insert("no_such_param".into(), 1.into());
    let spec = TaskSpec::new(d.name, Split::Train, d.difficulties[0], 0);
    let Err(EnvError::InvalidParam { reason, .. }) = make_env(&spec, &p) else {
        panic!("{}: an unknown param must be refused", d.name);
    };
    let Some((_, expected)) = reason.split_once("expected") else {
        assert!(reason.contains("there are no fields"), "{reason}");
        return Vec::new();
    };
    let mut keys: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

#[test]
fn every_param_is_listed_as_a_request_or_an_operator_param() {
    // The server's allow-list is only safe if it is complete: a new key that
    // is in neither list is refused from clients, but it must be placed.
    for d in descriptors() {
        let mut listed: Vec<String> = d
            .request_params
            .iter()
            .chain(d.operator_params)
            .map(|k| k.to_string())
            .collect();
        listed.sort();
        assert_eq!(listed, parser_keys(&d), "{}", d.name);
        for key in d.request_params {
            assert!(
                !d.operator_params.contains(key),
                "{}: {key} in both",
                d.name
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any text, on any env at any difficulty: taken with an observation or
    /// refused as invalid and counted, never a panic or "episode over".
    #[test]
    fn arbitrary_text_is_taken_or_counted_as_invalid(
        which in any::<prop::sample::Index>(),
        seed in 0u64..30,
        text in ".{0,120}",
    ) {
        let all = cases();
        let (d, spec) = &all[which.index(all.len())];
        let spec = TaskSpec { seed, ..spec.clone() };
        let mut env = make(d, &spec);
        prop_assert_eq!(check_arbitrary_step(env.as_mut(), &text), Ok(()));
    }
}
