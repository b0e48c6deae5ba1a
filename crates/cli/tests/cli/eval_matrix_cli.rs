//! `agentrl eval --envs … --difficulty … --k K`: the evaluation matrix, as a
//! user runs it (the built binary): in-process, for a trained run, and on an
//! `agentrl serve` endpoint, with the same figures either way.

use serde_json::Value;

use crate::common::{agentrl, failure_stderr, json_stdout, train, Served, SMOKE};

fn eval_json(args: &[&str]) -> Value {
    json_stdout(&agentrl(&[&["eval", "--json"], args].concat()))
}

fn cell<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            format!(
                "{}/{}",
                c["env"].as_str().unwrap(),
                c["difficulty"].as_str().unwrap()
            ) == name
        })
        .unwrap_or_else(|| panic!("no cell {name} in {report}"))
}

#[test]
fn every_env_and_difficulty_gets_avg_and_pass_at_k_with_intervals_and_labels() {
    let args = [
        "--policy",
        "random",
        "--envs",
        "frozenlake,sokoban",
        "--difficulty",
        "easy,hard",
        "--k",
        "4",
        "--n",
        "12",
        "--param",
        "frozenlake.is_slippery=false",
    ];
    let r = eval_json(&args);
    assert_eq!(r["cells"].as_array().unwrap().len(), 4);
    assert_eq!((r["k"].as_u64(), r["samples"].as_u64()), (Some(4), Some(4)));
    for name in [
        "frozenlake/easy",
        "frozenlake/hard",
        "sokoban/easy",
        "sokoban/hard",
    ] {
        let c = cell(&r, name);
        assert_eq!(c["tasks"], 12, "{name}");
        assert_eq!(c["split"], "val");
        let avg = c["avg_at_k"]["mean"].as_f64().unwrap();
        let pass = c["pass_at_k"]["mean"].as_f64().unwrap();
        assert!(pass >= avg, "{name}: pass@4 {pass} below avg@4 {avg}");
        let [lo, hi] = [0, 1].map(|i| c["avg_at_k"]["ci95"][i].as_f64().unwrap());
        assert!(lo <= avg && avg <= hi, "{name}: {c}");
        let f = &c["failures"];
        assert_eq!(f["episodes"], 48);
        let failed = f["failed"].as_f64().unwrap();
        assert!((failed / 48.0 - (1.0 - avg)).abs() < 1e-9, "{name}: {c}");
    }
    // Random play on the large Sokoban rooms runs out of steps.
    let hard = cell(&r, "sokoban/hard");
    assert!(
        hard["failures"]["labels"]["turn_budget_exhausted"]
            .as_u64()
            .unwrap()
            > 0
    );
    // The same command gives the same figures.
    assert_eq!(eval_json(&args), r);
    // The text table has one row per cell and the failure-label table.
    let out = agentrl(&[&["eval"], &args[..]].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("avg@4") && text.contains("pass@4"), "{text}");
    assert!(
        text.contains("sokoban/hard") && text.contains("confirmation_bias"),
        "{text}"
    );
}

#[test]
fn matrix_arguments_are_checked() {
    let fails = |args: &[&str], says: &str| {
        let err = failure_stderr(&agentrl(&[&["eval"], args].concat()));
        assert!(err.contains(says), "{args:?}: {err}");
    };
    fails(
        &["--envs", "frozenlake", "--k", "4", "--samples", "2"],
        "--samples 2 is fewer than --k 4",
    );
    fails(
        &["--envs", "frozenlake", "--difficulty", "easy,nightmare"],
        "nightmare",
    );
    fails(
        &["--envs", "sokoban", "--param", "slip=0.1"],
        "--param slip",
    );
}

/// `configs/smoke.toml` (a tiny run on the bandit, seconds long), with two
/// turns and one RL step.
const OVERRIDES: &[&str] = &[
    "name=matrix-test",
    "model.vocab_size=300",
    "rollout.max_turns=2",
    "trainer.total_training_steps=1",
    "trainer.save_freq=0",
];

#[test]
fn a_trained_run_plays_its_own_and_an_unseen_env_in_process_and_on_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(SMOKE, OVERRIDES, &run);
    let run = run.to_str().unwrap();
    let args = [
        "--policy",
        run,
        "--envs",
        "bandit,frozenlake",
        "--k",
        "2",
        "--n",
        "3",
        "--temperature",
        "1.0",
    ];
    let local = eval_json(&args);
    assert_eq!(local["temperature"], 1.0);
    for name in ["bandit/easy", "frozenlake/easy"] {
        let c = cell(&local, name);
        assert_eq!(c["failures"]["episodes"], 6, "{name}");
        assert!(
            c["mean_generated_tokens"].as_f64().unwrap() > 0.0,
            "{name}: a model replied"
        );
    }
    let mut server = Served::start(&["--envs", "bandit,frozenlake"]);
    let remote = eval_json(&[&args[..], &["--endpoint", &server.url]].concat());
    server.kill();
    assert_eq!(
        remote["cells"], local["cells"],
        "a server plays the same episodes"
    );
}
