use agentrl_env_core::{testing, Env, EnvError, EnvParams, Split, StepError, TaskSpec};
use agentrl_env_searchqa::{descriptor, SearchQaEnv};
use proptest::prelude::*;
use serde_json::json;

fn params(size: u64) -> EnvParams {
    let mut p = EnvParams::new();
    p.insert("corpus_size".into(), json!(size));
    p.insert("cache_dir".into(), json!("memory"));
    p
}

fn fixture_params() -> EnvParams {
    let mut p = EnvParams::new();
    p.insert(
        "corpus".into(),
        json!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/corpus.jsonl"
        )),
    );
    p.insert(
        "qa_file".into(),
        json!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/qa.jsonl")),
    );
    p.insert("cache_dir".into(), json!("memory"));
    p
}

fn env(difficulty: &str, seed: u64, p: &EnvParams) -> SearchQaEnv {
    SearchQaEnv::new(
        &TaskSpec::new("searchqa", Split::Train, difficulty, seed),
        p,
    )
    .unwrap()
}

fn run_expert(e: &mut SearchQaEnv) -> bool {
    let run = testing::run_expert(e);
    assert!(e.is_done(), "the expert ran out of moves");
    run.success
}

/// Expert successes on 100 questions of a 3000-passage KB.
fn expert_successes(difficulty: &str) -> usize {
    let p = params(3000);
    (0..100)
        .filter(|&s| run_expert(&mut env(difficulty, s, &p)))
        .count()
}

#[test]
fn expert_succeeds_on_one_hop_questions() {
    let ok = expert_successes("easy");
    assert!(ok >= 95, "easy expert success {ok}/100");
}

#[test]
fn expert_succeeds_on_multi_hop_questions() {
    let ok = expert_successes("hard");
    assert!(ok >= 95, "hard expert success {ok}/100");
}

#[test]
fn search_returns_each_gold_passage_in_the_top_three_for_the_expert_query() {
    let p = params(3000);
    let (mut hits, mut total) = (0, 0);
    for seed in 0..60 {
        let e = env("hard", seed, &p);
        for title in &e.question().chain {
            let top = e.corpus().search(title, 3).unwrap();
            total += 1;
            hits += usize::from(top.iter().any(|&i| &e.corpus().passages[i].title == title));
        }
    }
    assert!(
        hits * 100 >= total * 98,
        "gold passage in top 3 for {hits}/{total} queries"
    );
}

#[test]
fn observation_uses_the_information_format() {
    let p = params(500);
    let mut e = env("easy", 1, &p);
    assert!(e.observation().starts_with("Question: "));
    let title = e.question().chain[0].clone();
    let s = e.step(&format!("search[{title}]")).unwrap();
    assert!(
        s.observation.starts_with("<information>Doc 1 (Title: "),
        "{}",
        s.observation
    );
    assert!(s.observation.ends_with("</information>"));
    assert!(s.observation.contains("\nDoc 3 (Title: "));
    assert!(!s.observation.contains("Doc 4"));
    assert!(s.observation.contains(&format!("(Title: {title})")));
    assert_eq!((s.reward, s.done), (0.0, false));
}

#[test]
fn wrong_answer_is_retried_by_default_and_final_when_disabled() {
    let p = params(500);
    let mut e = env("easy", 2, &p);
    let s = e.step("answer[definitely not it]").unwrap();
    assert!(!s.done && s.reward == 0.0 && s.observation.contains("incorrect"));
    let gold = e.question().answers[0].clone();
    // Normalisation: case, articles and punctuation do not matter.
    let s = e
        .step(&format!("answer[The {}.]", gold.to_uppercase()))
        .unwrap();
    assert!(s.done && s.success && s.reward == 1.0);

    let mut p = params(500);
    p.insert("retry_wrong_answer".into(), json!(false));
    let mut e = env("easy", 2, &p);
    let s = e.step("answer[definitely not it]").unwrap();
    assert!(s.done && !s.success);
    assert_eq!(e.step("answer[x]"), Err(StepError::EpisodeOver));
}

#[test]
fn same_spec_gives_same_task_and_observations() {
    let p = params(500);
    let mut a = env("hard", 9, &p);
    let mut b = env("hard", 9, &p);
    assert_eq!(a.question(), b.question());
    while !a.is_done() {
        let x = a.expert_action().unwrap();
        assert_eq!(Some(x.clone()), b.expert_action());
        assert_eq!(a.step(&x).unwrap(), b.step(&x).unwrap());
        assert_eq!(a.state_key(), b.state_key());
    }
    assert_ne!(a.question(), env("hard", 10, &p).question());
}

#[test]
fn hard_questions_need_two_or_three_hops() {
    let p = params(500);
    for seed in 0..30 {
        let n = env("hard", seed, &p).question().chain.len();
        assert!((2..=3).contains(&n));
        assert_eq!(env("easy", seed, &p).question().chain.len(), 1);
    }
}

#[test]
fn invalid_actions_are_typed_counted_and_change_nothing() {
    let p = params(500);
    let mut e = env("easy", 4, &p);
    testing::assert_refused_unchanged(
        &mut e,
        &[("lookup[x]", "Unknown"), ("search[]", "Malformed")],
    );
    assert!(run_expert(&mut e));
}

#[test]
fn reset_restores_the_initial_state() {
    let p = params(500);
    let mut e = env("hard", 5, &p);
    let (obs, key) = (e.observation(), e.state_key());
    run_expert(&mut e);
    assert_eq!(e.reset(), obs);
    assert_eq!(e.state_key(), key);
}

#[test]
fn step_budget_ends_the_episode() {
    let mut p = params(500);
    p.insert("max_steps".into(), json!(2));
    testing::assert_budget_ends_episode(&mut env("easy", 0, &p), &["search[a]", "search[b]"]);
}

#[test]
fn loader_reads_search_r1_corpus_and_qa_files() {
    let e = env("easy", 0, &fixture_params());
    let c = e.corpus();
    assert_eq!(c.passages.len(), 6);
    // {"id", "contents"}: quoted title on the first line.
    assert_eq!(c.passages[0].title, "Eiffel Tower");
    assert!(c.passages[0].text.starts_with("The Eiffel Tower is"));
    assert_eq!(c.passages[3].id, "3");
    let top = c.search("Gustave Eiffel born", 3).unwrap();
    assert_eq!(c.passages[top[0]].title, "Gustave Eiffel");
    let mut questions = std::collections::BTreeSet::new();
    for seed in 0..30 {
        let mut e = env("easy", seed, &fixture_params());
        questions.insert(e.question().question.clone());
        assert!(run_expert(&mut e));
    }
    assert_eq!(questions.len(), 3);
    // "3776" is one of the golden answers of the Fuji question.
    let fuji = (0..30)
        .map(|s| env("easy", s, &fixture_params()))
        .find(|e| e.question().question.contains("fuji"));
    let mut fuji = fuji.unwrap();
    assert!(fuji.step("answer[3776]").unwrap().success);
}

#[test]
fn parameter_errors_are_reported() {
    let d = descriptor();
    let spec = TaskSpec::new("searchqa", Split::Train, "easy", 0);
    let mut p = EnvParams::new();
    p.insert("qa_file".into(), json!("x.jsonl"));
    assert!(matches!(
        d.create(&spec, &p),
        Err(EnvError::InvalidParam { .. })
    ));
    let mut p = EnvParams::new();
    p.insert("top_k".into(), json!(0));
    assert!(d.create(&spec, &p).is_err());
    let mut p = EnvParams::new();
    p.insert("corpus".into(), json!("/nonexistent.jsonl"));
    p.insert("qa_file".into(), json!("/nonexistent.jsonl"));
    assert!(matches!(d.create(&spec, &p), Err(EnvError::Data { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_actions_never_panic(seed in 0u64..50, acts in prop::collection::vec("(search|answer|<search>|x)\\[?\\PC{0,20}\\]?", 1..15)) {
        let p = params(500);
        let mut e = env("hard", seed, &p);
        for a in acts {
            if e.is_done() { break; }
            let before = e.invalid_actions();
            match e.step(&a) {
                Ok(_) => {}
                Err(StepError::InvalidAction(_)) => prop_assert_eq!(e.invalid_actions(), before + 1),
                Err(StepError::EpisodeOver) => prop_assert!(false),
            }
            let _ = e.state_key();
        }
    }
}
