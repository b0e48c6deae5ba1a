//! The registry serves bandit, frozenlake and sokoban with the env contract.

use agentrl_envs::{descriptors, find, make_env, EnvError, EnvParams, Split, StepError, TaskSpec};

const FIRST: [&str; 3] = ["bandit", "frozenlake", "sokoban"];

#[test]
fn names_are_unique_and_the_first_three_are_registered_with_easy_default() {
    let all = descriptors();
    let mut names: Vec<&str> = all.iter().map(|d| d.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len());
    for name in FIRST {
        let d = find(name).unwrap();
        assert_eq!(d.difficulties, &["easy", "hard"]);
    }
}

#[test]
fn unknown_env_and_difficulty_are_errors() {
    let spec = TaskSpec::new("chess", Split::Train, "easy", 0);
    assert!(matches!(
        make_env(&spec, &EnvParams::new()),
        Err(EnvError::UnknownEnv { .. })
    ));
    let spec = TaskSpec::new("sokoban", Split::Train, "insane", 0);
    assert!(matches!(
        make_env(&spec, &EnvParams::new()),
        Err(EnvError::UnknownDifficulty { .. })
    ));
}

#[test]
fn every_split_and_difficulty_plays_by_the_contract() {
    for name in FIRST {
        for split in Split::ALL {
            for difficulty in ["easy", "hard"] {
                for seed in 0..5 {
                    let spec = TaskSpec::new(name, split, difficulty, seed);
                    let mut env = make_env(&spec, &EnvParams::new()).unwrap();
                    assert_eq!(env.spec(), &spec);
                    let first = env.reset();
                    let key = env.state_key();
                    assert!(!env.instructions().is_empty());
                    // Expert play ends the episode, then stepping is refused.
                    while let Some(a) = env.expert_action() {
                        env.step(&a).unwrap();
                    }
                    assert!(env.is_done(), "{spec}");
                    assert!(env.available_actions().is_empty());
                    assert_eq!(env.step("Up"), Err(StepError::EpisodeOver));
                    // Reset restores the same task and state.
                    assert_eq!(env.reset(), first);
                    assert_eq!(env.state_key(), key);
                    assert_eq!((env.steps(), env.invalid_actions()), (0, 0));
                }
            }
        }
    }
}
