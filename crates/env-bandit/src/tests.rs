use super::*;
use agentrl_env_core::{testing, ActionError, Split};
use proptest::prelude::*;

fn env(split: Split, d: &str, seed: u64) -> Bandit {
    let mut e = Bandit::new(&TaskSpec::new(NAME, split, d, seed), &EnvParams::new()).unwrap();
    e.reset();
    e
}

#[test]
fn same_seed_gives_the_same_task_and_payout() {
    for &d in DIFFICULTIES {
        for seed in 0..50 {
            let mut a = env(Split::Train, d, seed);
            let mut b = env(Split::Train, d, seed);
            assert_eq!(a.observation(), b.observation());
            let sa = a.step("2").unwrap();
            let sb = b.step("2").unwrap();
            assert_eq!(sa, sb);
        }
    }
}

#[test]
fn different_seeds_give_different_tasks() {
    let obs: std::collections::BTreeSet<String> = (0..50)
        .map(|s| env(Split::Train, "easy", s).observation())
        .collect();
    assert!(obs.len() > 20, "only {} distinct tasks", obs.len());
}

#[test]
fn reset_replays_the_same_payout() {
    for seed in 0..50 {
        let mut e = env(Split::Val, "easy", seed);
        let high = e.task().names[e.task().high].clone();
        let first = e.step(&high).unwrap();
        e.reset();
        let second = e.step(&high).unwrap();
        assert_eq!(first, second);
    }
}

/// The risky arm's payouts over 400 tasks, pulled with chance stream `stream`.
fn risky_payouts(stream: u64) -> Vec<f64> {
    (0..400)
        .map(|seed| {
            let mut e = env(Split::Train, "easy", seed);
            e.set_chance_stream(stream);
            e.reset();
            let high = e.task().names[e.task().high].clone();
            e.step(&high).unwrap().reward
        })
        .collect()
}

#[test]
fn chance_streams_share_the_task_but_not_the_payout() {
    let own: Vec<f64> = (0..400)
        .map(|seed| {
            let mut e = env(Split::Train, "easy", seed);
            let high = e.task().names[e.task().high].clone();
            e.step(&high).unwrap().reward
        })
        .collect();
    // Stream 0 is the task's own luck; another stream replays itself.
    assert_eq!(risky_payouts(0), own);
    assert_eq!(risky_payouts(3), risky_payouts(3));
    let other = risky_payouts(3);
    let differ = own.iter().zip(&other).filter(|(a, b)| a != b).count();
    // Independent Bernoulli(0.25) draws differ with probability 0.375.
    assert!(
        (100..200).contains(&differ),
        "{differ} of 400 payouts differ"
    );
    let wins = other.iter().filter(|&&r| r == 1.0).count();
    assert!((70..130).contains(&wins), "stream 3 paid {wins} of 400");
    // The task is the same on every stream.
    let mut a = env(Split::Train, "easy", 7);
    a.set_chance_stream(5);
    assert_eq!(a.reset(), env(Split::Train, "easy", 7).observation());
}

#[test]
fn low_arm_pays_a_fixed_amount_and_high_arm_pays_one_a_quarter_of_the_time() {
    let (mut high_total, mut high_wins) = (0.0, 0);
    let n = 4000;
    for seed in 0..n {
        let mut e = env(Split::Train, "easy", seed);
        let t = e.task().clone();
        let s = e.step(&t.names[1 - t.high]).unwrap();
        assert_eq!(s.reward, 0.1);
        assert!(s.done && !s.success);
        let mut e = env(Split::Train, "easy", seed);
        let s = e.step(&t.names[t.high].to_uppercase()).unwrap();
        assert!(s.done && s.success);
        assert!(s.reward == 0.0 || s.reward == 1.0);
        high_total += s.reward;
        high_wins += (s.reward == 1.0) as u32;
    }
    let rate = high_wins as f64 / n as f64;
    assert!((rate - 0.25).abs() < 0.03, "high arm paid {rate}");
    assert!(high_total / n as f64 > 0.1);
}

#[test]
fn expert_always_picks_the_high_arm() {
    for split in Split::ALL {
        for &d in DIFFICULTIES {
            for seed in 0..200 {
                let mut e = env(split, d, seed);
                let a = e.expert_action().unwrap();
                assert!(e.step(&a).unwrap().success);
                assert_eq!(e.expert_action(), None);
            }
        }
    }
}

#[test]
fn index_actions_follow_the_display_order() {
    let mut e = env(Split::Train, "easy", 3);
    let high = e.task().high;
    let s = e.step(&(high + 1).to_string()).unwrap();
    assert!(s.success);
}

#[test]
fn numbered_arms_offer_and_demonstrate_numbers_and_still_take_names() {
    let p: EnvParams = serde_json::from_str(r#"{"numbered_arms": true}"#).unwrap();
    for seed in 0..50 {
        let spec = TaskSpec::new(NAME, Split::Train, "easy", seed);
        let mut e = Bandit::new(&spec, &p).unwrap();
        e.reset();
        assert_eq!(e.available_actions(), ["1", "2"]);
        assert!(e
            .instructions()
            .contains("Action: the arm's number, 1 or 2."));
        let best = e.expert_action().unwrap();
        assert_eq!(best, (e.task().high + 1).to_string());
        assert!(e.step(&best).unwrap().success);
        // The name of the risky arm still pulls it.
        e.reset();
        let name = e.task().names[e.task().high].clone();
        assert!(e.step(&name).unwrap().success);
    }
    // Off by default: the names are the actions.
    let e = env(Split::Train, "easy", 0);
    assert_eq!(e.available_actions(), e.task().names.to_vec());
    let p: EnvParams = serde_json::from_str(r#"{"numbered_arms": 1}"#).unwrap();
    assert!(Bandit::new(&TaskSpec::new(NAME, Split::Train, "easy", 0), &p).is_err());
}

#[test]
fn observation_names_both_arms_and_hard_hides_the_numbers() {
    for seed in 0..50 {
        let e = env(Split::Train, "easy", seed);
        let obs = e.observation();
        for n in &e.task().names {
            assert!(obs.contains(n.as_str()));
        }
        assert!(obs.contains("25%") && obs.contains("0.1"), "{obs}");
        let h = env(Split::Train, "hard", seed);
        let obs = h.observation();
        assert!(
            !obs.chars()
                .any(|c| c.is_ascii_digit() && c != '1' && c != '2'),
            "{obs}"
        );
        assert!(!obs.contains('%') && !obs.contains("0.1"), "{obs}");
    }
}

#[test]
fn test_split_names_are_held_out() {
    let train: Vec<&str> = TRAIN_PAIRS.iter().flat_map(|(a, b)| [*a, *b]).collect();
    for seed in 0..100 {
        let e = env(Split::Test, "easy", seed);
        assert!(e.task().names.iter().all(|n| !train.contains(&n.as_str())));
    }
}

#[test]
fn step_after_the_pull_is_episode_over() {
    let mut e = env(Split::Train, "easy", 0);
    e.step("1").unwrap();
    assert_eq!(e.step("1"), Err(StepError::EpisodeOver));
    assert!(e.available_actions().is_empty());
}

#[test]
fn invalid_action_is_counted_and_the_env_stays_usable() {
    let mut e = env(Split::Train, "easy", 0);
    let obs = e.observation();
    let key = e.state_key();
    assert!(matches!(
        e.step("Unicorn"),
        Err(StepError::InvalidAction(ActionError::Unknown { .. }))
    ));
    assert_eq!(
        e.step(""),
        Err(StepError::InvalidAction(ActionError::Empty))
    );
    assert_eq!(e.invalid_actions(), 2);
    assert_eq!(e.observation(), obs);
    assert_eq!(e.state_key(), key);
    assert!(!e.is_done());
    e.step("1").unwrap();
    assert_ne!(e.state_key(), key);
}

#[test]
fn params_that_make_the_safe_arm_better_are_rejected() {
    let p: EnvParams = serde_json::from_str(r#"{"high_prob": 0.05}"#).unwrap();
    assert!(matches!(
        Bandit::new(&TaskSpec::new(NAME, Split::Train, "easy", 0), &p),
        Err(EnvError::InvalidParam { .. })
    ));
    let p: EnvParams = serde_json::from_str(r#"{"arms": 3}"#).unwrap();
    assert!(Bandit::new(&TaskSpec::new(NAME, Split::Train, "easy", 0), &p).is_err());
    let p: EnvParams = serde_json::from_str(r#"{"high_prob": 0.5, "low_reward": 0.2}"#).unwrap();
    let mut e = Bandit::new(&TaskSpec::new(NAME, Split::Train, "easy", 0), &p).unwrap();
    e.reset();
    assert!(e.observation().contains("50%"), "{}", e.observation());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn no_action_text_panics(seed in 0u64..10_000, hard in any::<bool>(), actions in proptest::collection::vec(".*", 0..5)) {
        let mut e = env(Split::Train, if hard { "hard" } else { "easy" }, seed);
        for a in &actions {
            if let Some(s) = testing::step_any(&mut e, a).map_err(TestCaseError::fail)? {
                prop_assert!(s.done);
            }
        }
        prop_assert!(e.steps() <= 1);
    }
}
