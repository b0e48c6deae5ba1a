//! Measurements for the report, not run by default:
//! `cargo test -p agentrl-env-searchqa --release --test bench -- --ignored --nocapture`

use std::time::Instant;

use agentrl_env_core::testing::{percentile, run_expert};
use agentrl_env_core::{Env, EnvParams, Split, TaskSpec};
use agentrl_env_searchqa::kb::{search_docs, Kb};
use agentrl_env_searchqa::SearchQaEnv;
use agentrl_search_index::{data_hash, IndexLocation, SearchIndex};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

#[test]
#[ignore]
fn bench_search_latency_on_100k_documents() {
    let kb = Kb::generate(100_000).expect("a 100000-passage KB");
    let docs = search_docs(&kb.passages);
    let dir = tempfile::tempdir().unwrap();
    let loc = IndexLocation::Dir(dir.path().to_path_buf());
    let t = Instant::now();
    let index = SearchIndex::open_or_build(&docs, data_hash(&docs), &loc).unwrap();
    let build = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let reopened = SearchIndex::open_or_build(&docs, data_hash(&docs), &loc).unwrap();
    let reopen = t.elapsed().as_secs_f64();
    assert_eq!(reopened.num_docs(), 100_000);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut queries: Vec<String> = Vec::new();
    for _ in 0..1000 {
        queries.push(docs[rng.random_range(0..docs.len())].title.to_string());
        let q = kb.question(rng.random_range(1..=3), &mut rng);
        queries.push(q.question);
    }
    let mut lat = Vec::new();
    let mut top3 = 0;
    for (i, q) in queries.iter().enumerate() {
        let t = Instant::now();
        let hits = index.search(q, 0, 3).unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        if i % 2 == 0 {
            top3 += usize::from(hits.iter().any(|h| docs[h.doc].title == q.as_str()));
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "searchqa 100k docs: build {build:.1} s, reopen from disk cache {:.0} ms; search latency over {} queries: p50 {:.3} ms, p99 {:.3} ms; entity-name query finds its passage in the top 3: {top3}/1000",
        reopen * 1e3,
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
}

fn params() -> EnvParams {
    let mut p = EnvParams::new();
    p.insert("cache_dir".into(), json!("memory"));
    p
}

#[test]
#[ignore]
fn bench_expert_and_random_success_and_steps_per_second() {
    let p = params();
    for difficulty in ["easy", "hard"] {
        let n = 500;
        let (mut ok, mut steps) = (0, 0);
        let t = Instant::now();
        for seed in 0..n {
            let mut e =
                SearchQaEnv::new(&TaskSpec::new("searchqa", Split::Val, difficulty, seed), &p)
                    .unwrap();
            let run = run_expert(&mut e);
            steps += run.actions.len();
            ok += usize::from(run.success);
        }
        let dt = t.elapsed().as_secs_f64();
        // Random agent: searches the question or a random word of it, or
        // answers the title of a random passage it has seen.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut rok = 0;
        for seed in 0..n {
            let mut e =
                SearchQaEnv::new(&TaskSpec::new("searchqa", Split::Val, difficulty, seed), &p)
                    .unwrap();
            let mut seen: Vec<String> = Vec::new();
            while !e.is_done() {
                let words: Vec<String> = e
                    .question()
                    .question
                    .split_whitespace()
                    .map(|s| s.to_string())
                    .collect();
                let a = match rng.random_range(0..3) {
                    0 => format!("search[{}]", e.question().question),
                    1 => format!("search[{}]", words.choose(&mut rng).unwrap()),
                    _ => format!(
                        "answer[{}]",
                        seen.choose(&mut rng)
                            .cloned()
                            .unwrap_or_else(|| "unknown".into())
                    ),
                };
                let s = e.step(&a).unwrap();
                for part in s.observation.split("(Title: ").skip(1) {
                    if let Some(t) = part.split(')').next() {
                        seen.push(t.to_string());
                    }
                }
            }
            rok += usize::from(e.is_success());
        }
        println!(
            "searchqa {difficulty} (5000-passage KB): expert success {:.1}% ({ok}/{n}), random success {:.1}%, expert {:.0} steps/s (env creation included)",
            100.0 * ok as f64 / n as f64,
            100.0 * rok as f64 / n as f64,
            steps as f64 / dt
        );
    }
}
