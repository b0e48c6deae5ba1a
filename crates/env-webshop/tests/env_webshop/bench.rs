//! Measurements for the report, not run by default:
//! `cargo test -p agentrl-env-webshop --release --test env_webshop -- bench:: --ignored --nocapture`

use std::time::Instant;

use agentrl_env_core::testing::{percentile, run_expert};
use agentrl_env_core::{Env, EnvParams, Split, TaskSpec};
use agentrl_env_webshop::catalog::{generate, search_bodies, search_docs, GenConfig};
use agentrl_env_webshop::WebShopEnv;
use agentrl_search_index::{data_hash, IndexLocation, SearchIndex};
use rand::seq::IndexedRandom;
use rand::SeedableRng;
use serde_json::json;

#[test]
#[ignore]
fn bench_search_latency_on_100k_products() {
    let t = Instant::now();
    let products = generate(GenConfig {
        size: 100_000,
        family: 4,
    })
    .expect("a 100000-product catalog");
    let gen = t.elapsed().as_secs_f64();
    let bodies = search_bodies(&products);
    let docs = search_docs(&products, &bodies);
    let dir = tempfile::tempdir().unwrap();
    let loc = IndexLocation::Dir(dir.path().to_path_buf());
    let t = Instant::now();
    let index = SearchIndex::open_or_build(&docs, data_hash(&docs), &loc).unwrap();
    let build = t.elapsed().as_secs_f64();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut lat = Vec::new();
    for i in 0..2000 {
        let target = products.choose(&mut rng).unwrap();
        let g = agentrl_env_webshop::catalog::make_goal(target, 1 + i % 3, 2, &mut rng);
        let q = format!("{} {}", g.attributes.join(" "), g.query);
        let t = Instant::now();
        let hits = index.search(&q, 0, 50).unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(!hits.is_empty());
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "webshop 100k products: generate {gen:.1} s, index build {build:.1} s; search (top 50) latency over 2000 queries: p50 {:.3} ms, p99 {:.3} ms",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
}

#[test]
#[ignore]
fn bench_expert_and_random_success_and_steps_per_second() {
    let mut p = EnvParams::new();
    p.insert("cache_dir".into(), json!("memory"));
    for difficulty in ["easy", "hard"] {
        let n = 300;
        // First env builds the catalog and index; time it separately.
        let t = Instant::now();
        WebShopEnv::new(&TaskSpec::new("webshop", Split::Val, difficulty, 0), &p).unwrap();
        let first = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (mut ok, mut steps, mut reward) = (0, 0, 0.0);
        for seed in 0..n {
            let mut e =
                WebShopEnv::new(&TaskSpec::new("webshop", Split::Val, difficulty, seed), &p)
                    .unwrap();
            let run = run_expert(&mut e);
            (reward, steps) = (reward + run.reward, steps + run.actions.len());
            ok += usize::from(run.success);
        }
        let dt = t.elapsed().as_secs_f64();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let (mut rok, mut rreward, mut rsteps) = (0, 0.0, 0);
        let t = Instant::now();
        for seed in 0..n {
            let mut e =
                WebShopEnv::new(&TaskSpec::new("webshop", Split::Val, difficulty, seed), &p)
                    .unwrap();
            // Random valid action among the available ones, 15 turns as an agent would get.
            let mut turns = 0;
            while !e.is_done() && turns < 15 {
                let a = e.available_actions().choose(&mut rng).unwrap().clone();
                rreward += e.step(&a).unwrap().reward;
                turns += 1;
                rsteps += 1;
            }
            rok += usize::from(e.is_success());
        }
        let rdt = t.elapsed().as_secs_f64();
        println!(
            "webshop {difficulty}: first env (catalog + in-memory index) {first:.2} s; expert success {:.1}% ({ok}/{n}), mean reward {:.3}, {:.1} steps/episode, {:.0} steps/s; random-valid-action success {:.1}%, mean reward {:.3}, {:.0} steps/s",
            100.0 * ok as f64 / n as f64,
            reward / n as f64,
            steps as f64 / n as f64,
            steps as f64 / dt,
            100.0 * rok as f64 / n as f64,
            rreward / n as f64,
            rsteps as f64 / rdt
        );
    }
}
