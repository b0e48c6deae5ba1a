use agentrl_env_core::{testing, Env, EnvParams, Split, StepError, TaskSpec};
use agentrl_env_webshop::{descriptor, WebShopEnv};
use proptest::prelude::*;
use serde_json::json;

fn params(size: u64) -> EnvParams {
    let mut p = EnvParams::new();
    p.insert("catalog_size".into(), json!(size));
    p.insert("cache_dir".into(), json!("memory"));
    p
}

fn fixture_params(goals: &str) -> EnvParams {
    let mut p = EnvParams::new();
    p.insert(
        "data_dir".into(),
        json!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data")),
    );
    p.insert("goals".into(), json!(goals));
    p.insert("cache_dir".into(), json!("memory"));
    p
}

fn env(difficulty: &str, seed: u64, p: &EnvParams) -> WebShopEnv {
    WebShopEnv::new(&TaskSpec::new("webshop", Split::Train, difficulty, seed), p).unwrap()
}

/// Runs the expert to the end; returns (success, reward, steps).
fn run_expert(e: &mut WebShopEnv) -> (bool, f64, usize) {
    let run = testing::run_expert(e);
    assert!(e.is_done(), "the expert ran out of moves");
    (run.success, run.reward, run.steps)
}

fn expert_success_rate(difficulty: &str, size: u64, n: u64) -> f64 {
    let p = params(size);
    let mut ok = 0;
    for seed in 0..n {
        let mut e = env(difficulty, seed, &p);
        let (success, reward, _) = run_expert(&mut e);
        assert_eq!(success, (reward - 1.0).abs() < 1e-9);
        ok += usize::from(success);
    }
    ok as f64 / n as f64
}

#[test]
fn expert_succeeds_on_easy() {
    let rate = expert_success_rate("easy", 1000, 100);
    assert!(rate >= 0.95, "easy expert success {rate}");
}

#[test]
fn expert_succeeds_on_hard_with_near_twin_distractors() {
    let rate = expert_success_rate("hard", 2000, 100);
    assert!(rate >= 0.95, "hard expert success {rate}");
}

#[test]
fn search_for_the_expert_query_ranks_a_perfect_product_on_the_first_page() {
    let p = params(2000);
    let (mut perfect_first_page, mut target_in_results) = (0, 0);
    for seed in 0..50 {
        let mut e = env("hard", seed, &p);
        let a = e.expert_action().unwrap();
        assert!(a.starts_with("search["));
        e.step(&a).unwrap();
        let first_page: Vec<usize> = e.results().iter().take(10).copied().collect();
        perfect_first_page +=
            usize::from(first_page.iter().any(|&i| e.achievable_reward(i) == 1.0));
        let target = e.goal().asin.clone();
        target_in_results += usize::from(
            e.results()
                .iter()
                .any(|&i| e.world().products[i].asin == target),
        );
    }
    // Hard goals leave several products that satisfy every constraint; BM25
    // must rank one of them on page 1, and the target itself among the 50.
    assert!(
        perfect_first_page >= 48,
        "perfect product on page 1 in {perfect_first_page}/50"
    );
    assert!(
        target_in_results >= 45,
        "target among the results in {target_in_results}/50"
    );
}

#[test]
fn same_spec_gives_same_task_and_trajectory() {
    let p = params(500);
    let mut a = env("easy", 7, &p);
    let mut b = env("easy", 7, &p);
    assert_eq!(a.goal(), b.goal());
    assert_eq!(a.observation(), b.observation());
    while !a.is_done() {
        let x = a.expert_action().unwrap();
        assert_eq!(Some(x.clone()), b.expert_action());
        let sa = a.step(&x).unwrap();
        let sb = b.step(&x).unwrap();
        assert_eq!(sa, sb);
        assert_eq!(a.state_key(), b.state_key());
    }
    let c = env("easy", 8, &p);
    assert_ne!(a.goal().instruction, c.goal().instruction);
}

#[test]
fn reset_restores_the_initial_state() {
    let p = params(500);
    let mut e = env("easy", 3, &p);
    let first = e.observation();
    let key = e.state_key();
    run_expert(&mut e);
    assert_eq!(e.reset(), first);
    assert_eq!(e.state_key(), key);
    assert_eq!((e.steps(), e.invalid_actions(), e.is_done()), (0, 0, false));
}

#[test]
fn invalid_actions_are_typed_counted_and_change_nothing() {
    let p = params(500);
    let mut e = env("easy", 1, &p);
    let refused = [
        ("click[buy now]", "NotPossible"),
        ("dance", "Unknown"),
        ("", "Empty"),
    ];
    testing::assert_refused_unchanged(&mut e, &refused);
    e.step("search[coffee]").unwrap();
    let refused = [
        ("search[tea]", "NotPossible"),
        ("click[no such product]", "Unknown"),
    ];
    testing::assert_refused_unchanged(&mut e, &refused);
    // The env stays usable.
    let (success, _, _) = run_expert(&mut e);
    assert!(success);
    assert_eq!(e.step("click[back to search]"), Err(StepError::EpisodeOver));
}

#[test]
fn pages_navigate_like_webshop() {
    let p = params(1000);
    let mut e = env("easy", 2, &p);
    let s = e.step("search[coffee organic]").unwrap();
    assert!(s.observation.contains("Page 1 (Total results: "));
    assert!(s.observation.contains("[Next >]"));
    let s = e.step("click[Next >]").unwrap();
    assert!(s.observation.contains("Page 2") && s.observation.contains("[< Prev]"));
    // Click the first result of page 2 by its title.
    let actions = e.available_actions();
    let first_id = actions
        .iter()
        .find(|a| a.starts_with("click[b0"))
        .unwrap()
        .clone();
    let id = first_id
        .trim_start_matches("click[")
        .trim_end_matches(']')
        .to_uppercase();
    let title = e
        .world()
        .products
        .iter()
        .find(|x| x.asin == id)
        .unwrap()
        .title
        .clone();
    let s = e.step(&format!("click[{title}]")).unwrap();
    assert!(s.observation.contains("[Buy Now]") && s.observation.contains(&title));
    let s = e.step("click[features]").unwrap();
    assert!(s.observation.contains("- "));
    e.step("click[< prev]").unwrap();
    let s = e.step("click[< prev]").unwrap();
    assert!(s.observation.contains("Page 2"));
    let s = e.step("click[back to search]").unwrap();
    assert!(s.observation.contains("[Search]"));
    assert_eq!(e.available_actions().len(), 1);
    assert!(e.available_actions()[0].starts_with("search["));
}

#[test]
fn buying_the_wrong_option_gives_partial_reward() {
    use agentrl_env_webshop::reward::{normalize_color, token_set_ratio};
    let p = params(1000);
    for seed in 0..50 {
        let mut e = env("easy", seed, &p);
        let g = e.goal().clone();
        let Some((_, gval)) = g.options.first().cloned() else {
            continue;
        };
        // Let the expert open the product it would buy.
        let product = loop {
            if let agentrl_env_webshop::Page::Item { product, .. } = e.page() {
                break *product;
            }
            let a = e.expert_action().unwrap();
            e.step(&a).unwrap();
        };
        let item = e.world().products[product].clone();
        let wrong = item
            .options
            .iter()
            .flat_map(|(_, vs)| vs.iter())
            .find(|v| token_set_ratio(&normalize_color(v), &normalize_color(&gval)) <= 85)
            .cloned();
        let Some(wrong) = wrong else { continue };
        e.step(&format!("click[{wrong}]")).unwrap();
        let s = e.step("click[buy now]").unwrap();
        assert!(s.done && !s.success);
        // Easy goals: 1 attribute, 1 option, price; the option is missed: 2/3.
        assert!(
            (s.reward - 2.0 / 3.0).abs() < 1e-9,
            "reward {} for {g:?}",
            s.reward
        );
        return;
    }
    panic!("no task with an alternative option value found");
}

#[test]
fn step_budget_ends_the_episode() {
    let mut p = params(500);
    p.insert("max_steps".into(), json!(2));
    let actions = ["search[coffee]", "click[back to search]"];
    testing::assert_budget_ends_episode(&mut env("easy", 0, &p), &actions);
}

#[test]
fn unknown_params_and_bad_values_are_errors() {
    let d = descriptor();
    let spec = TaskSpec::new("webshop", Split::Train, "easy", 0);
    let mut p = EnvParams::new();
    p.insert("bogus".into(), json!(1));
    assert!(d.create(&spec, &p).is_err());
    let mut p = EnvParams::new();
    p.insert("catalog_size".into(), json!(5));
    assert!(d.create(&spec, &p).is_err());
    assert!(d
        .create(
            &TaskSpec::new("webshop", Split::Train, "medium", 0),
            &params(500)
        )
        .is_err());
}

#[test]
fn loader_reads_webshop_files_with_human_goals() {
    let e = env("easy", 0, &fixture_params("human"));
    let w = e.world();
    // Duplicate and "nan" ASINs are skipped.
    assert_eq!(w.products.len(), 3);
    let coffee = &w.products[0];
    assert_eq!(coffee.query, "coffee");
    assert_eq!(coffee.price, 23.99);
    assert_eq!(
        coffee.attributes,
        vec!["gluten free".to_string(), "fair trade".to_string()]
    );
    // Option names lower-cased, values lower-cased with "/" → " | ".
    assert!(coffee.options.contains(&(
        "flavor name".to_string(),
        vec!["dark | bold".to_string(), "medium".to_string()]
    )));
    // A price range is drawn inside the range; a missing price is $100.
    assert!(w.products[1].price >= 5.5 && w.products[1].price <= 9.0);
    assert_eq!(w.products[2].price, 100.0);
    assert_eq!(
        w.products[2].attributes,
        vec!["non slip".to_string(), "rubber sole".to_string()]
    );
    // Every human goal is reachable and the expert solves it.
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..40 {
        let mut e = env("easy", seed, &fixture_params("human"));
        assert!(e.goal().instruction.contains("price lower than"));
        seen.insert(e.goal().asin.clone());
        let (success, _, _) = run_expert(&mut e);
        assert!(success, "{:?}", e.goal());
    }
    assert_eq!(
        seen.len(),
        2,
        "both human goals (the attribute-less one is skipped)"
    );
}

#[test]
fn loader_builds_synthetic_goals_from_items_ins() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..40 {
        let mut e = env("easy", seed, &fixture_params("synthetic"));
        let g = e.goal().clone();
        seen.insert(g.asin.clone());
        if g.asin == "B07TEST001" {
            assert!(
                g.instruction
                    .starts_with("i need a gluten free coffee with flavor name: "),
                "{}",
                g.instruction
            );
            assert_eq!(g.options.len(), 2);
        }
        let (success, _, _) = run_expert(&mut e);
        assert!(success, "{g:?}");
    }
    // Product 3 has no instruction in items_ins_v2: never a goal.
    assert_eq!(seen.len(), 2);
}

#[test]
fn missing_data_dir_is_a_data_error() {
    let mut p = EnvParams::new();
    p.insert("data_dir".into(), json!("/nonexistent/webshop"));
    let r = WebShopEnv::new(&TaskSpec::new("webshop", Split::Train, "easy", 0), &p);
    assert!(matches!(r, Err(agentrl_env_core::EnvError::Data { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_actions_never_panic(seed in 0u64..50, picks in prop::collection::vec((0usize..40, "\\PC{0,30}"), 1..25)) {
        let p = params(500);
        let mut e = env("easy", seed, &p);
        for (i, junk) in picks {
            if e.is_done() { break; }
            let acts = e.available_actions();
            // Mix valid actions with arbitrary text.
            let a = if i < 30 && !acts.is_empty() { acts[i % acts.len()].clone() } else { junk };
            let before = e.invalid_actions();
            match e.step(&a) {
                Ok(_) => {}
                Err(StepError::InvalidAction(_)) => prop_assert_eq!(e.invalid_actions(), before + 1),
                Err(StepError::EpisodeOver) => prop_assert!(false, "episode over while not done"),
            }
            let _ = e.observation();
            let _ = e.state_key();
        }
    }
}
