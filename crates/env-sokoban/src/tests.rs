use super::*;
use agentrl_env_core::{testing, Split};
use proptest::prelude::*;

fn spec(d: &str, seed: u64) -> TaskSpec {
    TaskSpec::new(NAME, Split::Train, d, seed)
}

fn env(d: &str, seed: u64) -> Sokoban {
    Sokoban::new(&spec(d, seed), &EnvParams::new()).unwrap()
}

fn hand(text: &str) -> Sokoban {
    let cfg = Config::for_difficulty("easy").unwrap();
    let mut e = Sokoban::from_text(&spec("easy", 0), cfg, text).unwrap();
    e.reset();
    e
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn generated_rooms_are_solved_by_the_expert_within_bounds() {
    // 200 rooms per difficulty: the solver's plan must fit the configured
    // bounds, and playing the expert through the env must solve every room.
    for &d in DIFFICULTIES {
        let cfg = Config::for_difficulty(d).unwrap();
        let mut lengths = std::collections::BTreeMap::new();
        for seed in 0..200 {
            let mut e =
                Sokoban::new(&TaskSpec::new(NAME, Split::Val, d, seed), &EnvParams::new()).unwrap();
            let start = e.reset();
            assert!(!e.state().is_solved(e.room()), "{d}#{seed} starts solved");
            let mut total = 0.0;
            while let Some(a) = e.expert_action() {
                total += e.step(&a).unwrap().reward;
            }
            assert!(e.is_success(), "{d}#{seed} not solved:\n{start}");
            let n = e.steps();
            assert!(n >= cfg.generation.min_solution_len && n <= cfg.generation.max_solution_len);
            // Net reward: −0.1 per step, +1 per box finally placed (pushes off
            // and back on cancel), +10 at the end.
            let boxes = cfg.generation.boxes as f64;
            assert!(
                total <= 10.0 + boxes - 0.1 * n as f64 + 1e-9,
                "{d}#{seed} reward {total}"
            );
            *lengths.entry(n).or_insert(0) += 1;
        }
        eprintln!("{d}: optimal solution lengths {lengths:?}");
    }
}

#[test]
fn same_seed_gives_identical_observations_over_an_action_sequence() {
    let actions: Vec<Action> = (0..80).map(|i| ACTIONS[(i * 5 + i / 4) % 4]).collect();
    for &d in DIFFICULTIES {
        for seed in 0..20 {
            let mut a = env(d, seed);
            let mut b = env(d, seed);
            assert_eq!(a.reset(), b.reset());
            for act in &actions {
                let (sa, sb) = (a.step(act.name()), b.step(act.name()));
                assert_eq!(sa, sb);
                if sa.is_err() {
                    break;
                }
            }
            assert_eq!(a.state_key(), b.state_key());
        }
    }
}

#[test]
fn different_seeds_give_different_rooms() {
    for &d in DIFFICULTIES {
        let rooms: std::collections::BTreeSet<String> =
            (0..50).map(|s| env(d, s).reset()).collect();
        assert!(
            rooms.len() >= 45,
            "{d}: {} distinct rooms in 50",
            rooms.len()
        );
    }
}

#[test]
fn reset_restores_the_initial_room() {
    let mut e = env("hard", 7);
    let first = e.reset();
    let key = e.state_key();
    for a in ["Up", "Left", "Down", "Right", "Right"] {
        let _ = e.step(a);
    }
    assert_eq!(e.reset(), first);
    assert_eq!(e.state_key(), key);
    assert_eq!((e.steps(), e.invalid_actions()), (0, 0));
}

#[test]
fn difficulties_set_size_and_boxes() {
    let easy = env("easy", 0).reset();
    assert_eq!(easy.lines().count(), 6);
    assert!(easy.lines().all(|l| l.chars().count() == 6));
    assert_eq!(easy.chars().filter(|c| matches!(c, 'X' | '√')).count(), 1);
    let hard = env("hard", 0).reset();
    assert_eq!(hard.lines().count(), 8);
    assert_eq!(hard.chars().filter(|c| matches!(c, 'X' | '√')).count(), 2);
}

#[test]
fn pushing_a_box_onto_a_target_pays_one_minus_the_step_and_solving_pays_ten() {
    let mut e = hand("#######\n#P_X_O#\n#_____#\n#######");
    let s = e.step("Right").unwrap();
    assert!(close(s.reward, -0.1));
    assert_eq!(s.observation, "#######\n#_PX_O#\n#_____#\n#######");
    let s = e.step("Right").unwrap();
    assert!(close(s.reward, -0.1));
    assert!(s.info.effective);
    let s = e.step("Right").unwrap();
    // Box onto the only target: −0.1 + 1 + 10.
    assert!(close(s.reward, 10.9), "{}", s.reward);
    assert!(s.done && s.success);
    assert_eq!(s.observation, "#######\n#___P√#\n#_____#\n#######");
    assert_eq!(e.step("Left"), Err(StepError::EpisodeOver));
}

#[test]
fn box_on_and_off_targets_with_two_boxes() {
    // Two boxes, two targets: placing one pays +1 −0.1, pushing it off −1 −0.1.
    let mut e = hand("########\n#P_XO__#\n#__XO__#\n#______#\n########");
    let s = e.step("Right").unwrap();
    assert!(close(s.reward, -0.1));
    let s = e.step("Right").unwrap();
    assert!(close(s.reward, 0.9), "{}", s.reward);
    assert_eq!(s.info.extra["boxes_on_target"], 1);
    assert!(!s.done);
    assert_eq!(s.observation.lines().nth(1), Some("#__P√__#"));
    let s = e.step("Right").unwrap();
    assert!(close(s.reward, -1.1), "{}", s.reward);
    assert_eq!(s.observation.lines().nth(1), Some("#___SX_#"));
    assert_eq!(s.info.extra["boxes_on_target"], 0);
}

#[test]
fn pushing_a_box_from_one_target_to_another_pays_only_the_step() {
    let mut e = hand("#######\n#PXOO_#\n#_____#\n#_X___#\n#######");
    let s = e.step("Right").unwrap();
    assert!(close(s.reward, 0.9));
    let s = e.step("Right").unwrap();
    assert!(close(s.reward, -0.1), "{}", s.reward);
    assert_eq!(s.observation.lines().nth(1), Some("#__S√_#"));
}

#[test]
fn walls_and_blocked_boxes_stop_the_player_but_cost_a_step() {
    let mut e = hand("######\n#P_XX#\n#__O_#\n#__O_#\n######");
    let before = e.observation();
    let s = e.step("Up").unwrap();
    assert!(!s.info.effective);
    assert!(close(s.reward, -0.1));
    assert_eq!(s.observation, before);
    e.step("Right").unwrap();
    // Box against a box: nothing moves.
    let s = e.step("Right").unwrap();
    assert!(!s.info.effective);
    assert_eq!(e.steps(), 3);
    // Box against a wall: nothing moves.
    let mut e = hand("#####\n#_PX#\n#_O_#\n#####");
    assert!(!e.step("Right").unwrap().info.effective);
}

#[test]
fn player_on_target_renders_s() {
    let mut e = hand("######\n#PO__#\n#_X__#\n#____#\n######");
    let s = e.step("Right").unwrap();
    assert_eq!(s.observation.lines().nth(1), Some("#_S__#"));
}

#[test]
fn running_out_of_steps_ends_the_episode() {
    let mut cfg = Config::for_difficulty("easy").unwrap();
    cfg.max_steps = 2;
    let mut e =
        Sokoban::from_text(&spec("easy", 0), cfg, "######\n#P_XO#\n#____#\n######").unwrap();
    testing::assert_budget_ends_episode(&mut e, &["Down", "Up"]);
}

#[test]
fn invalid_action_changes_nothing_but_the_counter() {
    let mut e = env("easy", 1);
    let too_long = "Up".repeat(1000);
    testing::assert_refused_unchanged(&mut e, &[("push", "Unknown"), (&too_long, "TooLong")]);
}

#[test]
fn expert_replans_after_a_detour() {
    for seed in 0..30 {
        let mut e = env("hard", seed);
        // Wander first, then let the expert finish from wherever we are.
        for a in ["Left", "Up", "Up", "Right"] {
            e.step(a).unwrap();
        }
        while let Some(a) = e.expert_action() {
            e.step(&a).unwrap();
        }
        // A detour can push a box into a dead corner; then the expert has no
        // move and the episode is left unfinished. Otherwise it must solve.
        if !e.is_done() {
            assert!(solve(e.room(), e.state(), 100).is_none());
        } else {
            assert!(e.is_success() || e.steps() == e.max_steps());
        }
    }
}

#[test]
fn params_tune_generation_and_reject_unknown_keys() {
    let p: EnvParams =
        serde_json::from_str(r#"{"size": 7, "boxes": 1, "max_solution_len": 3}"#).unwrap();
    let mut e = Sokoban::new(&spec("easy", 0), &p).unwrap();
    assert_eq!(e.reset().lines().count(), 7);
    assert!(solve(e.room(), e.state(), 3).is_some());
    for bad in [
        r#"{"boxes": 9}"#,
        r#"{"size": 40}"#,
        r#"{"colour": 1}"#,
        r#"{"min_solution_len": 50}"#,
        r#"{"size": -1}"#,
    ] {
        let p: EnvParams = serde_json::from_str(bad).unwrap();
        assert!(
            matches!(
                Sokoban::new(&spec("easy", 0), &p),
                Err(EnvError::InvalidParam { .. })
            ),
            "{bad}"
        );
    }
}

fn arb_action() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["Up", "Down", "Left", "Right", "up", "4"]).prop_map(String::from),
        1 => ".{0,8}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_action_sequence_panics_or_breaks_invariants(
        seed in 0u64..500,
        hard in any::<bool>(),
        actions in proptest::collection::vec(arb_action(), 0..120),
    ) {
        let d = if hard { "hard" } else { "easy" };
        let mut e = env(d, seed);
        let boxes = e.state().boxes().len();
        for a in &actions {
            // Counts valid and invalid actions one by one (see step_any).
            if let Some(s) = testing::step_any(&mut e, a).map_err(TestCaseError::fail)? {
                let obs = &s.observation;
                prop_assert_eq!(obs.chars().filter(|c| matches!(c, 'X' | '√')).count(), boxes);
                prop_assert_eq!(obs.chars().filter(|c| matches!(c, 'P' | 'S')).count(), 1);
            }
            let st = e.state();
            prop_assert_eq!(st.boxes().len(), boxes);
            prop_assert!(e.room().is_open(st.player as usize), "player inside a wall");
            prop_assert!(st.box_at(st.player as usize).is_none());
            for &b in st.boxes() {
                prop_assert!(e.room().is_open(b as usize), "box inside a wall");
            }
            let mut sorted = st.boxes().to_vec();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), boxes);
        }
    }
}

fn extreme() -> Config {
    // Rooms of hundreds of moves cannot come from reverse play: every draw
    // is searched in full, and the work budget, not the attempt count, ends it.
    let p: EnvParams = serde_json::from_str(
        r#"{"size": 16, "boxes": 4, "reverse_steps": 100000, "min_solution_len": 900,
            "max_solution_len": 1000, "max_steps": 1000}"#,
    )
    .unwrap();
    Config::for_difficulty("hard")
        .unwrap()
        .with_params(&p)
        .unwrap()
}

#[test]
fn extreme_params_give_up_once_the_work_budget_is_spent() {
    let mut rng = agentrl_env_core::task_rng(&spec("hard", 0)).unwrap();
    let t = std::time::Instant::now();
    // A small budget keeps the test fast; the env passes WORK_BUDGET.
    assert!(generate(&mut rng, &extreme().generation, 10_000, 300_000).is_none());
    assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
}

#[test]
fn a_cancelled_build_stops_at_once_with_its_own_error() {
    // The issue's params: alone, a build spends the whole work budget
    // (seconds) before it fails; cancelled, it stops before the first room.
    let p: EnvParams = serde_json::from_str(
        r#"{"size": 16, "boxes": 4, "reverse_steps": 100000, "min_solution_len": 1000,
            "max_solution_len": 1000, "max_steps": 1000}"#,
    )
    .unwrap();
    let cancel = agentrl_env_core::BuildCancel::new();
    cancel.cancel();
    let err = cancel
        .run(|| Sokoban::new(&spec("hard", 0), &p))
        .unwrap_err();
    assert!(matches!(err, EnvError::Cancelled { .. }), "{err}");
    // The solver looks too: a search that would explore many states stops
    // at its first look, having explored only the start.
    let cfg = Config::for_difficulty("hard")
        .unwrap()
        .with_params(&p)
        .unwrap();
    let mut rng = agentrl_env_core::task_rng(&spec("hard", 0)).unwrap();
    let mut room = topology(&mut rng, cfg.generation.size);
    let start = reverse_play(&mut rng, &mut room, 4, 100_000).unwrap();
    let (plan, explored) = cancel.run(|| solver::solve_within(&room, &start, 1000, MAX_NODES));
    assert_eq!((plan, explored), (None, 1));
    let (_, uncancelled) = solver::solve_within(&room, &start, 1000, 100_000);
    assert!(uncancelled > 1000, "{uncancelled}");
}

#[test]
fn generation_failure_is_an_error_naming_the_knobs() {
    let p: EnvParams = serde_json::from_str(
        r#"{"size": 5, "boxes": 1, "reverse_steps": 1, "min_solution_len": 90, "max_solution_len": 100}"#,
    )
    .unwrap();
    let err = Sokoban::new(&spec("hard", 0), &p).unwrap_err();
    assert!(matches!(err, EnvError::Generation { .. }), "{err}");
    assert!(err.to_string().contains("lower min_solution_len"), "{err}");
}

#[test]
fn default_generation_uses_a_small_part_of_the_work_budget() {
    for (d, seed) in [("easy", 0..50), ("hard", 0..20)]
        .into_iter()
        .flat_map(|(d, r)| r.map(move |s| (d, s)))
    {
        let config = Config::for_difficulty(d).unwrap();
        let mut rng = agentrl_env_core::task_rng(&spec(d, seed)).unwrap();
        let g = generate(&mut rng, &config.generation, 10_000, WORK_BUDGET).unwrap();
        assert!(
            g.work < WORK_BUDGET / 100,
            "{d} seed {seed}: {} units",
            g.work
        );
    }
}

/// RAGEN's names and indices (1 = Up, 2 = Down, 3 = Left, 4 = Right); the shared rules
/// (trimming, case, length) are tested in env-core.
#[test]
fn actions_parse_by_name_in_any_case_and_by_ragen_index() {
    testing::check_named_actions(parse_action, &ACTIONS, &["Up", "Down", "Left", "Right"]);
}

/// The reading names the cell one move away in each direction and, beyond
/// a box, what a push runs into, then where each box off a target is and
/// where its nearest free target is from it; the safe moves are those the
/// reading leaves open.
#[test]
fn perception_reads_each_neighbour_and_what_a_push_runs_into() {
    // Box to the right with floor beyond; wall above; target below.
    let e = hand("######\n#_#__#\n#_PX_#\n#_O__#\n######");
    assert_eq!(
        e.perception().unwrap(),
        "Up #, Down O, Left _, Right X then _; box Right 1; target from box Down 1 Left 1"
    );
    assert_eq!(e.safe_actions(), ["Down", "Left", "Right"]);
    // A box against the wall cannot be pushed; a box on a target reads √.
    let e = hand("######\n#√___#\n#P_X_#\n#___O#\n######");
    assert_eq!(
        e.perception().unwrap(),
        "Up √ then #, Down _, Left #, Right _; box Right 2; target from box Down 1 Right 1"
    );
    assert_eq!(e.safe_actions(), ["Down", "Right"]);
    // Two boxes share the targets: each names its nearest, the first in
    // reading order on a tie.
    let e = hand("######\n#O___#\n#_PXX#\n#O___#\n######");
    assert_eq!(
        e.perception().unwrap(),
        "Up _, Down _, Left _, Right X then X; box Right 1; target from box Up 1 Left 2; \
         box Right 2; target from box Up 1 Left 3"
    );
    assert_eq!(e.safe_actions(), ["Up", "Down", "Left"]);
    assert_safe_exactly_when_the_state_changes(&e);
}

/// With `reading_stand`, the reading names the push toward the target
/// (rows first, unless its stand cell or destination is blocked) and where
/// the player stands for it, in place of the box's and target's offsets;
/// off by default.
#[test]
fn reading_stand_names_the_push_toward_the_target_and_where_to_stand_for_it() {
    let standing = |text: &str| {
        let cfg = Config::for_difficulty("easy")
            .unwrap()
            .with_params(&serde_json::from_str(r#"{"reading_stand": true}"#).unwrap())
            .unwrap();
        let mut e = Sokoban::from_text(&spec("easy", 0), cfg, text).unwrap();
        e.reset();
        e.perception().unwrap()
    };
    // Target down-left of the box: push it Down first, from above it.
    let room = "######\n#_#__#\n#_PX_#\n#_O__#\n######";
    assert_eq!(
        standing(room),
        "Up #, Down O, Left _, Right X then _; stand Up 1 Right 1 to push Down"
    );
    assert_eq!(
        hand(room).perception().unwrap(),
        "Up #, Down O, Left _, Right X then _; box Right 1; target from box Down 1 Left 1"
    );
    // Below the box is a wall: the push goes Left, from its right.
    assert_eq!(
        standing("#######\n#_____#\n#_P_X_#\n#O#####\n#######"),
        "Up _, Down #, Left _, Right _; stand Right 3 to push Left"
    );
    // Already behind the box.
    assert_eq!(
        standing("######\n#P___#\n#X___#\n#O___#\n######"),
        "Up #, Down X then O, Left #, Right _; stand here to push Down"
    );
}

/// Every move in `e`'s safe set changes the state; no other move does.
fn assert_safe_exactly_when_the_state_changes(e: &Sokoban) {
    let safe = e.safe_actions();
    for a in ["Up", "Down", "Left", "Right"] {
        let mut probe = e.clone();
        let before = probe.state_key();
        probe.step(a).unwrap();
        assert_eq!(
            probe.state_key() != before,
            safe.contains(&a.to_string()),
            "{a}:\n{}",
            e.observation()
        );
    }
}

/// On generated rooms the safe moves are exactly the state-changing ones.
#[test]
fn safe_moves_are_the_moves_that_change_the_state_on_generated_rooms() {
    for seed in 0..30 {
        let mut e = env("easy", seed);
        e.reset();
        for step in 0..12 {
            let safe = e.safe_actions();
            assert!(!safe.is_empty(), "seed {seed} step {step}");
            assert_safe_exactly_when_the_state_changes(&e);
            let a = safe[(seed as usize + step) % safe.len()].clone();
            if e.step(&a).unwrap().done {
                break;
            }
        }
    }
}

/// A reactive player that sees only the perception text: walk to the cell
/// behind the box (opposite a direction its target lies in) and push; never
/// a move the neighbours show does nothing. Returns the move.
fn move_from_reading(reading: &str, turn: usize) -> String {
    let unit = |d: &str| parse_action(d).unwrap().delta();
    let offset = |text: &str| -> (isize, isize) {
        let words: Vec<&str> = text.split_whitespace().collect();
        words.chunks(2).fold((0, 0), |(r, c), w| {
            let (dr, dc) = unit(w[0]);
            let n: isize = w[1].parse().unwrap();
            (r + dr * n, c + dc * n)
        })
    };
    let parts: Vec<&str> = reading.split("; ").collect();
    let neighbours: Vec<(&str, &str)> = parts[0]
        .split(", ")
        .map(|n| n.split_once(' ').unwrap())
        .collect();
    let blocked =
        |seen: &str| seen.starts_with('#') || seen.ends_with("then #") || seen.ends_with("then X");
    let safe: Vec<&str> = neighbours
        .iter()
        .filter(|(_, seen)| !blocked(seen))
        .map(|(d, _)| *d)
        .collect();
    let box_at = offset(parts[1].strip_prefix("box ").unwrap());
    let target = offset(parts[2].strip_prefix("target from box ").unwrap());
    let pushes: Vec<&str> = ACTIONS
        .iter()
        .map(|a| a.name())
        .filter(|d| {
            let (dr, dc) = unit(d);
            target.0 * dr > 0 || target.1 * dc > 0
        })
        .collect();
    if let Some(d) = pushes
        .iter()
        .find(|d| unit(d) == box_at && safe.contains(d))
    {
        return d.to_string();
    }
    // Walk towards the cell behind the box, without touching the box.
    let (dr, dc) = unit(pushes[turn % pushes.len()]);
    let stand = (box_at.0 - dr, box_at.1 - dc);
    let distance = |(r, c): (isize, isize)| (r - stand.0).abs() + (c - stand.1).abs();
    let walks: Vec<&str> = safe.iter().copied().filter(|d| unit(d) != box_at).collect();
    let closer: Vec<&str> = walks
        .iter()
        .copied()
        .filter(|d| distance(unit(d)) < distance((0, 0)))
        .collect();
    let choices = [closer, walks, safe]
        .into_iter()
        .find(|c| !c.is_empty())
        .unwrap();
    choices[turn % choices.len()].to_string()
}

/// The reading carries what a reactive player needs: one that sees only
/// the perception text solves most easy rooms within RAGEN's 10 moves, at
/// least twice as many as one that knows only which moves do anything
/// (the safe moves, taken in turn).
#[test]
fn a_player_that_sees_only_the_reading_solves_most_easy_rooms() {
    let play = |seed: u64, reading_player: bool| {
        let mut e = Sokoban::new(&spec("easy", seed), &EnvParams::new()).unwrap();
        e.reset();
        for turn in 0..10 {
            let a = if reading_player {
                move_from_reading(&e.perception().unwrap(), turn)
            } else {
                let safe = e.safe_actions();
                safe[(seed as usize * 7 + turn * 3) % safe.len()].clone()
            };
            if e.step(&a).unwrap().done {
                break;
            }
        }
        e.is_success()
    };
    let rooms = 300u64;
    let by_reading = (0..rooms).filter(|&s| play(s, true)).count() as u64;
    let by_safe_moves = (0..rooms).filter(|&s| play(s, false)).count() as u64;
    eprintln!("solved by the reading {by_reading}/{rooms}, by safe moves {by_safe_moves}/{rooms}");
    assert!(by_reading * 10 >= rooms * 6, "{by_reading}/{rooms}");
    assert!(
        by_reading >= 2 * by_safe_moves,
        "{by_reading} vs {by_safe_moves}"
    );
}
