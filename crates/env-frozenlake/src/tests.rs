use super::*;
use agentrl_env_core::{testing, Split};
use proptest::prelude::*;

fn spec(d: &str, seed: u64) -> TaskSpec {
    TaskSpec::new(NAME, Split::Train, d, seed)
}

fn env(d: &str, seed: u64) -> FrozenLake {
    FrozenLake::new(&spec(d, seed), &EnvParams::new()).unwrap()
}

fn params(json: &str) -> EnvParams {
    serde_json::from_str(json).unwrap()
}

fn hand_map(rows: &[&str]) -> Map {
    let tiles = rows
        .iter()
        .flat_map(|r| r.chars())
        .map(|c| match c {
            'S' => Tile::Start,
            'F' => Tile::Frozen,
            'H' => Tile::Hole,
            _ => Tile::Goal,
        })
        .collect();
    Map {
        size: rows.len(),
        tiles,
    }
}

fn play(e: &mut FrozenLake, actions: &[Action]) -> Vec<String> {
    let mut obs = vec![e.reset()];
    for a in actions {
        match e.step(a.name()) {
            Ok(s) => obs.push(s.observation),
            Err(StepError::EpisodeOver) => break,
            Err(err) => panic!("{err}"),
        }
    }
    obs
}

#[test]
fn same_seed_gives_identical_observations_over_an_action_sequence() {
    let actions: Vec<Action> = (0..60).map(|i| ACTIONS[(i * 7 + i / 3) % 4]).collect();
    for &d in DIFFICULTIES {
        for seed in 0..20 {
            let a = play(&mut env(d, seed), &actions);
            let b = play(&mut env(d, seed), &actions);
            assert_eq!(a, b);
        }
    }
}

#[test]
fn reset_replays_the_slips_identically() {
    let actions: Vec<Action> = (0..40).map(|i| ACTIONS[(i * 3) % 4]).collect();
    let mut e = env("hard", 5);
    let first = play(&mut e, &actions);
    let second = play(&mut e, &actions);
    assert_eq!(first, second);
}

#[test]
fn a_chance_stream_slips_differently_on_the_same_map() {
    let actions: Vec<Action> = (0..40).map(|i| ACTIONS[(i * 3) % 4]).collect();
    let mut own = env("hard", 5);
    let mut other = env("hard", 5);
    other.set_chance_stream(1);
    assert_eq!(own.map(), other.map());
    let first = play(&mut own, &actions);
    let second = play(&mut other, &actions);
    assert_ne!(first, second, "stream 1 slipped exactly as stream 0");
    assert_eq!(
        second,
        play(&mut other, &actions),
        "a reset replays the stream"
    );
    own.set_chance_stream(0);
    assert_eq!(
        first,
        play(&mut own, &actions),
        "stream 0 is the task's own luck"
    );
}

#[test]
fn different_seeds_give_different_maps() {
    let maps: std::collections::BTreeSet<Vec<u8>> =
        (0..50).map(|s| env("easy", s).map().to_bytes()).collect();
    assert!(
        maps.len() > 30,
        "only {} distinct maps in 50 seeds",
        maps.len()
    );
    let map_of = |split, d| {
        let spec = TaskSpec::new(NAME, split, d, 3);
        FrozenLake::new(&spec, &EnvParams::new())
            .unwrap()
            .map()
            .to_bytes()
    };
    let (ma, mb) = (map_of(Split::Train, "easy"), map_of(Split::Val, "easy"));
    // Different splits are different tasks (they may coincide by chance on a
    // 4×4 map, so compare the hard size where a collision is unlikely).
    let (ha, hb) = (map_of(Split::Train, "hard"), map_of(Split::Val, "hard"));
    assert!(ma != mb || ha != hb);
}

#[test]
fn difficulties_set_the_map_size() {
    assert_eq!(env("easy", 0).map().size, 4);
    assert_eq!(env("hard", 0).map().size, 6);
    assert_eq!(env("easy", 0).observation().lines().count(), 4);
    assert!(FrozenLake::new(&spec("medium", 0), &EnvParams::new()).is_err());
}

#[test]
fn first_observation_shows_the_player_top_left_and_the_goal_bottom_right() {
    let obs = env("easy", 1).reset();
    let rows: Vec<&str> = obs.lines().collect();
    assert!(rows[0].starts_with('P'));
    assert!(rows[3].ends_with('G'));
    assert!(obs.chars().all(|c| "P_OG\n".contains(c)), "{obs}");
}

fn no_slip() -> Config {
    Config {
        size: 3,
        frozen_prob: 0.8,
        slip: 0.0,
        max_steps: 100,
    }
}

#[test]
fn reaching_the_goal_pays_one_and_renders_the_check_mark() {
    let m = hand_map(&["SFF", "FFF", "FFG"]);
    let mut e = FrozenLake::from_map(&spec("easy", 0), no_slip(), m).unwrap();
    e.reset();
    for a in ["Right", "Right", "Down"] {
        let s = e.step(a).unwrap();
        assert_eq!(s.reward, 0.0);
        assert!(!s.done);
    }
    let s = e.step("down").unwrap();
    assert_eq!(s.reward, 1.0);
    assert!(s.done && s.success);
    assert_eq!(s.observation, "___\n___\n__√");
    assert_eq!(e.step("Up"), Err(StepError::EpisodeOver));
    assert!(e.available_actions().is_empty());
    assert_eq!(e.expert_action(), None);
}

#[test]
fn falling_into_a_hole_ends_the_episode_without_success() {
    let m = hand_map(&["SHF", "FFF", "FFG"]);
    let mut e = FrozenLake::from_map(&spec("easy", 0), no_slip(), m).unwrap();
    e.reset();
    let s = e.step("Right").unwrap();
    assert!(s.done && !s.success);
    assert_eq!(s.reward, 0.0);
    assert_eq!(s.observation, "_X_\n___\n__G");
    assert_eq!(e.step("Left"), Err(StepError::EpisodeOver));
}

#[test]
fn perception_reads_the_four_neighbours_in_the_observations_symbols() {
    let m = hand_map(&["SHF", "FFF", "HFG"]);
    let mut e = FrozenLake::from_map(&spec("easy", 0), no_slip(), m).unwrap();
    e.reset();
    assert_eq!(
        e.perception().as_deref(),
        Some("Left edge, Down _, Right O, Up edge")
    );
    e.step("Down").unwrap();
    assert_eq!(
        e.perception().as_deref(),
        Some("Left edge, Down O, Right _, Up _")
    );
    e.step("Right").unwrap();
    e.step("Down").unwrap();
    assert_eq!(
        e.perception().as_deref(),
        Some("Left O, Down edge, Right G, Up _")
    );
}

#[test]
fn safe_actions_are_the_moves_the_reading_shows_onto_ice_or_the_goal() {
    let m = hand_map(&["SHF", "FFF", "HFG"]);
    let mut e = FrozenLake::from_map(&spec("easy", 0), no_slip(), m).unwrap();
    e.reset();
    // Left and Up are the edge, Right a hole.
    assert_eq!(e.safe_actions(), ["Down"]);
    e.step("Down").unwrap();
    assert_eq!(e.safe_actions(), ["Right", "Up"]);
    e.step("Right").unwrap();
    e.step("Down").unwrap();
    // Left is a hole, Down the edge; the goal is safe.
    assert_eq!(e.safe_actions(), ["Right", "Up"]);
}

#[test]
fn safe_actions_fall_back_to_every_valid_move_when_all_are_ruled_out() {
    let m = hand_map(&["SHF", "HFF", "FFG"]);
    let mut e = FrozenLake::from_map(&spec("easy", 0), no_slip(), m).unwrap();
    e.reset();
    assert_eq!(e.safe_actions(), e.available_actions());
    assert_eq!(e.safe_actions().len(), 4);
}

/// Every reading agrees with the rendered grid: the cell one step away in
/// the observation holds the symbol read (or the player is at the edge).
#[test]
fn perception_agrees_with_the_observation_on_generated_lakes() {
    for seed in 0..50 {
        let mut e = env("hard", seed);
        let obs = e.reset();
        let grid: Vec<Vec<char>> = obs.lines().map(|l| l.chars().collect()).collect();
        let n = grid.len();
        let (r, c) = (0usize, 0usize);
        assert_eq!(grid[r][c], 'P');
        let p = e.perception().unwrap();
        let expect = format!(
            "Left edge, Down {}, Right {}, Up edge",
            grid[r + 1][c],
            grid[r][c + 1]
        );
        assert_eq!(p, expect, "seed {seed}, {n}×{n}:\n{obs}");
    }
}

#[test]
fn bumping_into_the_edge_is_a_step_that_changes_nothing() {
    let m = hand_map(&["SFF", "FFF", "FFG"]);
    let mut e = FrozenLake::from_map(&spec("easy", 0), no_slip(), m).unwrap();
    let before = e.reset();
    let key = e.state_key();
    let s = e.step("Up").unwrap();
    assert!(!s.info.effective);
    assert_eq!(s.observation, before);
    assert_eq!(e.state_key(), key);
    assert_eq!(e.steps(), 1);
    let s = e.step("Right").unwrap();
    assert!(s.info.effective);
    assert_ne!(e.state_key(), key);
}

#[test]
fn invalid_action_changes_nothing_but_the_counter() {
    let mut e = env("easy", 2);
    testing::assert_refused_unchanged(&mut e, &[("jump", "Unknown"), ("", "Empty")]);
    assert!(e.step("Down").is_ok());
}

#[test]
fn running_out_of_steps_ends_the_episode() {
    let m = hand_map(&["SFF", "FFF", "FFG"]);
    let cfg = Config {
        max_steps: 3,
        ..no_slip()
    };
    let mut e = FrozenLake::from_map(&spec("easy", 0), cfg, m).unwrap();
    testing::assert_budget_ends_episode(&mut e, &["Up"]);
}

#[test]
fn slip_sends_the_player_sideways_at_the_configured_rate() {
    // Open 16×16 ice; the player starts in a corner, so count how often
    // "Down" from the top-left moves down vs right (left is the wall).
    let size = 16;
    let mut tiles = vec![Tile::Frozen; size * size];
    tiles[0] = Tile::Start;
    tiles[size * size - 1] = Tile::Goal;
    let cfg = Config {
        size,
        frozen_prob: 0.8,
        slip: DEFAULT_SLIP,
        max_steps: 1,
    };
    let (mut down, mut right, mut stay) = (0, 0, 0);
    for seed in 0..3000 {
        let m = Map {
            size,
            tiles: tiles.clone(),
        };
        let mut e = FrozenLake::from_map(&spec("easy", seed), cfg.clone(), m).unwrap();
        e.reset();
        e.step("Down").unwrap();
        match e.position() {
            p if p == size => down += 1,
            1 => right += 1,
            0 => stay += 1,
            p => panic!("impossible position {p}"),
        }
    }
    for (name, count) in [("down", down), ("right", right), ("stay", stay)] {
        let rate = count as f64 / 3000.0;
        assert!((rate - 1.0 / 3.0).abs() < 0.04, "{name} rate {rate}");
    }
}

#[test]
fn params_set_slip_and_reject_unknown_keys() {
    let e = FrozenLake::new(&spec("easy", 0), &params(r#"{"is_slippery": false}"#)).unwrap();
    assert_eq!(e.config().slip, 0.0);
    let e = FrozenLake::new(&spec("easy", 0), &params(r#"{"slip": 0.2, "size": 5}"#)).unwrap();
    assert_eq!(e.config().slip, 0.2);
    assert_eq!(e.map().size, 5);
    for bad in [
        r#"{"slipp": 0.1}"#,
        r#"{"slip": 1.5}"#,
        r#"{"slip": "high"}"#,
        r#"{"size": 1}"#,
        r#"{"max_steps": 0}"#,
        r#"{"max_steps": 1001}"#,
        r#"{"is_slippery": false, "slip": 0.3}"#,
    ] {
        assert!(
            matches!(
                FrozenLake::new(&spec("easy", 0), &params(bad)),
                Err(EnvError::InvalidParam { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn hopeless_frozen_prob_is_an_error_not_a_hang() {
    let t = std::time::Instant::now();
    let err = FrozenLake::new(
        &spec("easy", 0),
        &params(r#"{"frozen_prob": 1e-9, "size": 16}"#),
    )
    .unwrap_err();
    assert!(matches!(err, EnvError::Generation { .. }), "{err}");
    assert!(err.to_string().contains("raise frozen_prob"), "{err}");
    assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
}

/// Run the expert on `n` tasks; returns the success rate.
fn expert_success(d: &str, p: &EnvParams, n: u64) -> f64 {
    let mut wins = 0;
    for seed in 0..n {
        let mut e = FrozenLake::new(&TaskSpec::new(NAME, Split::Val, d, seed), p).unwrap();
        e.reset();
        while let Some(a) = e.expert_action() {
            e.step(&a).unwrap();
        }
        assert!(e.is_done());
        wins += e.is_success() as u32;
    }
    wins as f64 / n as f64
}

#[test]
fn expert_always_succeeds_without_slip() {
    let p = params(r#"{"is_slippery": false}"#);
    for &d in DIFFICULTIES {
        assert_eq!(expert_success(d, &p, 200), 1.0, "{d}");
    }
}

#[test]
fn expert_success_on_slippery_ice_matches_value_iteration() {
    // The empirical success rate over 200 tasks should be close to the mean
    // success probability (within the 100-step budget) that value iteration
    // predicts for those maps.
    for &d in DIFFICULTIES {
        let mut predicted = 0.0;
        for seed in 0..200 {
            let e = FrozenLake::new(&TaskSpec::new(NAME, Split::Val, d, seed), &EnvParams::new())
                .unwrap();
            predicted += solve(e.map(), DEFAULT_SLIP, 100).success[0];
        }
        predicted /= 200.0;
        let got = expert_success(d, &EnvParams::new(), 200);
        assert!(
            (got - predicted).abs() < 0.08,
            "{d}: got {got}, predicted {predicted}"
        );
        eprintln!("{d}: expert success {got}, predicted {predicted}");
        assert!(got > 0.4, "{d}: expert success {got}");
    }
}

#[test]
fn expert_beats_random_play() {
    let mut random_wins = 0;
    for seed in 0..200u64 {
        let mut e = env("easy", seed);
        e.reset();
        let mut i = seed as usize;
        while !e.is_done() {
            i = i
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            e.step(ACTIONS[(i >> 33) % 4].name()).unwrap();
        }
        random_wins += e.is_success() as u32;
    }
    let random = random_wins as f64 / 200.0;
    let expert = expert_success("easy", &EnvParams::new(), 200);
    assert!(expert > random + 0.2, "expert {expert} random {random}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn no_action_sequence_panics_or_leaves_the_map(
        seed in 0u64..1000,
        difficulty in prop::sample::select(vec!["easy", "hard"]),
        actions in proptest::collection::vec(
            prop_oneof![
                Just("Left".to_string()), Just("down".to_string()), Just("RIGHT".to_string()),
                Just("Up".to_string()), Just("3".to_string()), ".*"
            ],
            0..150,
        ),
    ) {
        let mut e = env(difficulty, seed);
        e.reset();
        let cells = e.map().size * e.map().size;
        for a in &actions {
            // Counts valid and invalid actions one by one (see step_any).
            if let Some(s) = testing::step_any(&mut e, a).map_err(TestCaseError::fail)? {
                prop_assert!(s.reward == 0.0 || (s.reward == 1.0 && s.success));
            }
            prop_assert!(e.position() < cells);
            prop_assert_eq!(e.observation().chars().filter(|c| "PX√".contains(*c)).count(), 1);
        }
        prop_assert!(e.steps() <= e.max_steps());
    }
}

/// RAGEN's names and indices (1 = Left, 2 = Down, 3 = Right, 4 = Up); the shared rules
/// (trimming, case, length) are tested in env-core.
#[test]
fn actions_parse_by_name_in_any_case_and_by_ragen_index() {
    testing::check_named_actions(parse_action, &ACTIONS, &["Left", "Down", "Right", "Up"]);
}
