use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use agentrl_env_core::{testing, Env, EnvParams, Split, StepError, TaskSpec};
use agentrl_env_textcraft::{descriptor, loader, Recipe, RecipeBook, Task, TextCraft};
use proptest::prelude::*;

fn spec(difficulty: &str, seed: u64) -> TaskSpec {
    TaskSpec::new("textcraft", Split::Train, difficulty, seed)
}

fn make(difficulty: &str, seed: u64) -> TextCraft {
    TextCraft::new(&spec(difficulty, seed), &EnvParams::new()).unwrap()
}

fn fixture_params() -> EnvParams {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut p = EnvParams::new();
    p.insert("data_dir".into(), dir.display().to_string().into());
    p
}

/// Run the expert to the end; returns (success, steps).
fn run_expert(env: &mut dyn Env) -> (bool, usize) {
    env.reset();
    let run = testing::run_expert(env);
    (run.success, run.steps)
}

fn r(out: &str, n: u32, ins: &[(&str, u32)]) -> Recipe {
    let ins: Vec<(String, u32)> = ins.iter().map(|(a, b)| (a.to_string(), *b)).collect();
    Recipe::new(out, n, &ins)
}

fn pickaxe_task() -> TextCraft {
    let recipes = vec![
        r("oak planks", 4, &[("oak log", 1)]),
        r("stick", 4, &[("oak planks", 2)]),
        r("wooden pickaxe", 1, &[("oak planks", 3), ("stick", 2)]),
    ];
    let book = RecipeBook::build(&BTreeSet::new(), recipes.clone());
    let task = Task {
        goal: "wooden pickaxe".into(),
        depth: 3,
        book: Arc::new(book),
        shown: recipes,
    };
    TextCraft::from_task(spec("easy", 0), task)
}

#[test]
fn different_seeds_and_splits_give_different_tasks() {
    // Same-spec determinism: crates/envs/tests/contract.rs, for every env.
    assert_ne!(make("easy", 1).observation(), make("easy", 2).observation());
    let val = TextCraft::new(
        &TaskSpec::new("textcraft", Split::Val, "easy", 1),
        &EnvParams::new(),
    )
    .unwrap();
    assert_ne!(make("easy", 1).observation(), val.observation());
}

#[test]
fn goal_depth_matches_difficulty() {
    for (d, want) in [
        ("easy", 1..=1),
        ("medium", 2..=2),
        ("hard", 3..=4),
        ("depth4", 4..=4),
    ] {
        for seed in 0..30 {
            let env = make(d, seed);
            assert!(
                want.contains(&env.task().depth),
                "{d} seed {seed}: depth {}",
                env.task().depth
            );
            let n_needed = env.task().book.needed_recipes(&env.task().goal).len();
            assert!(env.task().shown.len() <= n_needed + 10);
        }
    }
}

#[test]
fn first_observation_lists_commands_and_goal() {
    let env = pickaxe_task();
    assert_eq!(
        env.observation(),
        "Crafting commands:\n\
         craft 4 oak planks using 1 oak log\n\
         craft 4 stick using 2 oak planks\n\
         craft 1 wooden pickaxe using 3 oak planks, 2 stick\n\
         \nGoal: craft wooden pickaxe."
    );
}

#[test]
fn hand_played_pickaxe_task() {
    let mut env = pickaxe_task();
    let s = env.step("get 2 oak log").unwrap();
    assert_eq!(s.observation, "Got 2 oak log");
    assert!(s.info.effective);
    let s = env.step("get 1 stick").unwrap();
    assert_eq!(s.observation, "Could not get stick: it has to be crafted.");
    assert!(!s.info.effective);
    let s = env.step("craft 3 oak planks using 1 oak log").unwrap();
    assert_eq!(
        s.observation,
        "Wrong item number: oak planks is crafted 4 at a time"
    );
    let s = env.step("craft 8 oak planks using 1 oak log").unwrap();
    assert_eq!(
        s.observation,
        "Wrong ingredient amounts to craft 8 oak planks"
    );
    env.step("craft 8 oak planks using 2 oak log").unwrap();
    let s = env.step("craft 4 stick using 2 oak planks").unwrap();
    assert_eq!(s.observation, "Crafted 4 stick");
    let s = env.step("inventory").unwrap();
    assert_eq!(s.observation, "Inventory: [oak planks] (6), [stick] (4)");
    let s = env
        .step("craft 1 wooden pickaxe using 2 stick, 3 oak planks")
        .unwrap();
    assert!(s.done && s.success);
    assert_eq!(s.reward, 1.0);
    assert!(matches!(env.step("inventory"), Err(StepError::EpisodeOver)));
}

#[test]
fn invalid_action_counts_and_changes_nothing() {
    let mut env = pickaxe_task();
    env.step("get 1 oak log").unwrap();
    testing::assert_refused_unchanged(&mut env, &[("fly to the moon", "Unknown")]);
    assert_eq!((env.invalid_actions(), env.steps()), (1, 1));
}

#[test]
fn episode_ends_after_max_steps() {
    testing::assert_budget_ends_episode(&mut pickaxe_task(), &["inventory"]);
}

#[test]
fn available_actions_are_valid_and_include_the_expert_crafts() {
    let mut env = make("medium", 3);
    while let Some(a) = env.expert_action() {
        let avail = env.available_actions();
        if a.starts_with("craft") {
            // The expert may craft several batches; the one-batch command is listed.
            let item = a
                .split(" using ")
                .next()
                .unwrap()
                .split_once(' ')
                .unwrap()
                .1
                .split_once(' ')
                .unwrap()
                .1;
            assert!(
                avail.iter().any(|x| x.contains(item)),
                "{a} not in {avail:?}"
            );
        }
        for x in &avail {
            assert!(agentrl_env_textcraft::parse(x).is_ok(), "{x}");
        }
        env.step(&a).unwrap();
    }
    assert!(env.is_success());
}

#[test]
fn loader_reads_the_minecraft_data_fixture() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let book = loader::load_dir(&dir).unwrap();
    assert_eq!(book.depth["oak planks"], 1);
    assert_eq!(book.depth["stick"], 2);
    assert_eq!(book.depth["wooden pickaxe"], 3);
    assert_eq!(book.depth["torch"], 3);
    assert_eq!(book.depth["lantern"], 4);
    // The ingot/block/nugget cycle is broken at the ingot.
    assert!(book.base.contains("iron ingot"));
    assert_eq!(book.depth["iron block"], 1);
    // Shaped recipes count slots; nulls are empty.
    let pick = book.primary_recipe("wooden pickaxe").unwrap();
    assert_eq!(
        pick.command(1),
        "craft 1 wooden pickaxe using 3 oak planks, 2 stick"
    );
    assert_eq!(
        book.items_at_depth(1),
        vec!["iron block", "iron nugget", "oak planks"]
    );
    assert!(!book.knows("dirt"));
}

#[test]
fn loaded_tasks_are_solved_by_the_expert() {
    for d in ["easy", "medium", "hard", "depth4"] {
        for seed in 0..20 {
            let mut env = descriptor()
                .create(&spec(d, seed), &fixture_params())
                .unwrap();
            let (ok, _) = run_expert(env.as_mut());
            assert!(ok, "{d} seed {seed}");
        }
    }
    let env = descriptor()
        .create(&spec("depth4", 0), &fixture_params())
        .unwrap();
    assert!(
        env.observation().ends_with("Goal: craft lantern."),
        "{}",
        env.observation()
    );
    assert!(env
        .observation()
        .contains("craft 1 lantern using 8 iron nugget, 1 torch"));
}

#[test]
fn bad_params_are_errors() {
    let mut p = EnvParams::new();
    p.insert("nope".into(), 1.into());
    assert!(TextCraft::new(&spec("easy", 0), &p).is_err());
    let mut p = EnvParams::new();
    p.insert("data_dir".into(), "/nonexistent/textcraft".into());
    assert!(TextCraft::new(&spec("easy", 0), &p).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn craftlike_text_never_panics(n in 0u32..20, m in 0u32..20, item in "[a-z ]{0,20}") {
        let mut env = make("hard", u64::from(n));
        let _ = env.step(&format!("craft {n} {item} using {m} {item}, {n} oak log"));
        let _ = env.step(&format!("get {m} {item}"));
    }
}
