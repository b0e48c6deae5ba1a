use agentrl_env_babyai::{
    descriptor, BabyAi, Cell, Color, Desc, DoorState, Family, Instr, Kind, Mission, Obj, State,
    NOTHING_HAPPENS,
};
use agentrl_env_core::{testing, Env, EnvParams, Split, TaskSpec};
use proptest::prelude::*;

fn spec(difficulty: &str, seed: u64) -> TaskSpec {
    TaskSpec::new("babyai", Split::Train, difficulty, seed)
}

fn make(difficulty: &str, seed: u64) -> BabyAi {
    BabyAi::new(&spec(difficulty, seed), &EnvParams::new()).unwrap()
}

/// An 8×8 walled room, agent at (3, 5) facing north.
fn room() -> State {
    let mut s = State::new(8, 8);
    for i in 0..8 {
        for (x, y) in [(i, 0), (i, 7), (0, i), (7, i)] {
            s.set((x, y), Cell::Wall);
        }
    }
    s.pos = (3, 5);
    s.dir = 3;
    s
}

fn obj(kind: Kind, color: Color, id: u16) -> Cell {
    Cell::Obj(Obj { kind, color, id })
}

#[test]
fn hand_checked_view_and_go_to() {
    let mut s = room();
    s.set((4, 3), obj(Kind::Ball, Color::Red, 0));
    s.set((1, 2), obj(Kind::Box, Color::Grey, 1));
    s.set((3, 6), obj(Kind::Key, Color::Blue, 2)); // behind the agent: unseen
    let m = Mission::single(Instr::GoTo(Desc::obj(Kind::Ball, Color::Red)));
    let mut env = BabyAi::from_parts(spec("easy", 0), Family::GoToRedBall, s, m);
    assert_eq!(
        env.observation(),
        "Your goal: go to the red ball\n\
         There is a red ball 1, 1 step right and 2 steps forward.\n\
         There is a grey box 1, 2 steps left and 3 steps forward.\n\
         You are facing a wall 5 steps away.\n\
         There is a wall 3 steps to your left.\n\
         You are not carrying anything."
    );
    let st = env.step("go to red ball 1").unwrap();
    assert!(st.done && st.success);
    assert!((st.reward - (1.0 - 0.9 / 32.0)).abs() < 1e-12);
}

#[test]
fn walls_and_closed_doors_block_the_view() {
    let mut s = room();
    // A wall across the room hides the ball behind it (a single wall cell
    // would not: MiniGrid's light spreads around it).
    for x in 1..7 {
        s.set((x, 4), Cell::Wall);
    }
    s.set((3, 2), obj(Kind::Ball, Color::Red, 0));
    let m = Mission::single(Instr::GoTo(Desc::obj(Kind::Ball, Color::Red)));
    let env = BabyAi::from_parts(spec("easy", 0), Family::GoToRedBall, s, m);
    assert!(
        !env.observation().contains("There is a red ball"),
        "{}",
        env.observation()
    );
    assert!(env
        .observation()
        .contains("You are facing a wall 1 step away."));
}

#[test]
fn unlocking_needs_the_key_and_counts_as_opening() {
    let mut s = room();
    s.set(
        (3, 0),
        Cell::Door {
            color: Color::Yellow,
            state: DoorState::Locked,
        },
    );
    s.set((3, 4), obj(Kind::Key, Color::Yellow, 0));
    let m = Mission::single(Instr::Open(Desc::Door {
        color: Color::Yellow,
    }));
    let mut env = BabyAi::from_parts(spec("medium", 0), Family::Unlock, s, m);
    assert!(
        env.observation()
            .contains("There is a yellow key 1, 1 step forward."),
        "{}",
        env.observation()
    );
    assert!(env
        .observation()
        .contains("There is a locked yellow door 1, 5 steps forward."));
    // The key, not the door, is in front: toggling does nothing.
    let st = env.step("toggle").unwrap();
    assert!(!st.info.effective);
    assert!(st.observation.starts_with(NOTHING_HAPPENS));
    let st = env.step("pickup yellow key 1").unwrap();
    assert!(st.info.effective);
    assert!(st.observation.ends_with("You are carrying a yellow key."));
    let st = env.step("toggle and go through yellow door 1").unwrap();
    assert!(st.success && st.done);
}

#[test]
fn put_next_succeeds_only_when_adjacent() {
    let mut s = room();
    s.set((3, 4), obj(Kind::Ball, Color::Red, 0));
    s.set((5, 1), obj(Kind::Box, Color::Blue, 1));
    let m = Mission::single(Instr::PutNext(
        Desc::obj(Kind::Ball, Color::Red),
        Desc::obj(Kind::Box, Color::Blue),
    ));
    let mut env = BabyAi::from_parts(spec("medium", 0), Family::PutNextLocal, s, m);
    env.step("pick up").unwrap();
    env.step("turn left").unwrap();
    let st = env.step("drop").unwrap();
    assert!(!st.success);
    env.step("pick up").unwrap();
    let (ok, _, _) = {
        let mut acts = Vec::new();
        while let Some(a) = env.expert_action() {
            env.step(&a).unwrap();
            acts.push(a);
        }
        (env.is_success(), 0, acts)
    };
    assert!(ok);
}

#[test]
fn different_seeds_give_different_levels() {
    // Same-spec determinism: crates/envs/tests/contract.rs, for every env.
    assert_ne!(make("goto", 1).state_key(), make("goto", 2).state_key());
}

#[test]
fn difficulties_draw_their_families() {
    for seed in 0..40 {
        assert!(matches!(
            make("easy", seed).family(),
            Family::GoToRedBall | Family::GoToLocal | Family::PickupLoc
        ));
        assert_eq!(make("bosslevel", seed).family(), Family::BossLevel);
        assert_eq!(make("bosslevel", seed).mission().instrs.len(), 2);
        assert_eq!(make("goto", seed).state().width, 22);
        // No family falls back to the emergency level (a lone red ball).
        for f in Family::ALL {
            let env = make(f.name(), seed);
            let want_width = match f {
                Family::OpenDoor | Family::GoTo | Family::BossLevel => 22,
                Family::Unlock => 15,
                _ => 8,
            };
            assert_eq!(env.state().width, want_width, "{f:?} seed {seed}");
            let kind_ok = matches!(
                (f, &env.mission().instrs[0]),
                (Family::OpenDoor | Family::Unlock, Instr::Open(_))
                    | (Family::PickupLoc, Instr::Pickup(_))
                    | (Family::PutNextLocal, Instr::PutNext(..))
                    | (
                        Family::GoToRedBall | Family::GoToLocal | Family::GoTo,
                        Instr::GoTo(_)
                    )
                    | (Family::BossLevel, _)
            );
            assert!(kind_ok, "{f:?} seed {seed}: {}", env.mission().text());
        }
    }
}

#[test]
fn invalid_actions_count_and_change_nothing() {
    let mut env = make("easy", 4);
    let refusals = [("dance", "Unknown"), ("go to red ball", "Malformed")];
    testing::assert_refused_unchanged(&mut env, &refusals);
    // Well-formed but naming nothing visible: a valid no-op step.
    let st = env.step("go to purple box 9").unwrap();
    assert!(!st.info.effective);
    assert!(st.observation.starts_with(NOTHING_HAPPENS));
    assert_eq!(env.steps(), 1);
}

#[test]
fn check_available_actions_lists_them_without_acting() {
    let mut env = make("easy", 2);
    let key = env.state_key();
    let st = env.step("check available actions").unwrap();
    assert!(st
        .observation
        .starts_with("Available actions: turn left, turn right, move forward"));
    assert_eq!(env.state_key(), key);
    for a in env.available_actions() {
        assert!(agentrl_env_babyai::parse(&a).is_ok(), "{a}");
    }
    let mut p = EnvParams::new();
    p.insert("show_available_actions".into(), true.into());
    let shown = BabyAi::new(&spec("easy", 2), &p).unwrap();
    assert!(shown.observation().contains("\nAvailable actions: "));
    p.insert("bogus".into(), 1.into());
    assert!(descriptor().create(&spec("easy", 2), &p).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn grammar_shaped_text_never_panics(
        verb in prop::sample::select(vec!["go to", "pickup", "pick up", "go through", "toggle and go through"]),
        color in prop::sample::select(vec!["red", "green", "blue", "purple", "yellow", "grey", "pink"]),
        what in prop::sample::select(vec!["ball", "box", "key", "door", "chair"]),
        n in 0usize..5, seed in 0u64..30,
    ) {
        let mut env = make("medium", seed);
        let _ = env.step(&format!("{verb} {color} {what} {n}"));
    }
}
