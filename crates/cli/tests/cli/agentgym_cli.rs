//! `agentrl train` and `agentrl eval --endpoint` on a test double of
//! AgentGym's BabyAI server: the run plays the configured, held-out
//! `data_idx` ranges, one reset per episode, and counts invalid actions.

#[path = "../../../env-client/tests/agentgym_double/mod.rs"]
mod agentgym_double;

use std::process::Command;

use agentgym_double::{DoubleServer, Kind};

use crate::common;
use common::{BIN, SMOKE};

/// `configs/smoke.toml` moved onto the double: BabyAI over AgentGym's
/// protocol, no warm start (there is no expert on AgentGym), two turns.
fn overrides(endpoint: &str) -> Vec<String> {
    let mut o = vec![
        "name=agentgym-test".to_string(),
        "env.name=babyai".into(),
        "env.protocol=agentgym".into(),
        format!("env.endpoint={endpoint}"),
        "env.instructions=You are in a grid world. Reply with one action from the available actions.".into(),
    ];
    o.extend(
        [
            "env.data_idx.train=[100, 140]",
            "env.data_idx.val=[0, 3]",
            "model.vocab_size=300",
            "model.num_hidden_layers=2",
            "model.num_attention_heads=4",
            "model.num_key_value_heads=2",
            "sft.demos=0",
            "rollout.max_turns=2",
            "rollout.max_actions=2",
            "rollout.show_valid_actions=true",
            "trainer.save_freq=0",
            "trainer.val_tasks=3",
            "trainer.val_greedy=false",
        ]
        .map(String::from),
    );
    o
}

#[test]
fn train_and_eval_on_an_agentgym_server() {
    let d = DoubleServer::start(Kind::BabyAi);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    common::ok_stdout(
        &Command::new(BIN)
            .arg("train")
            .arg(SMOKE)
            .args(overrides(&d.url()))
            .arg("--out")
            .arg(&run)
            .arg("--quiet")
            .output()
            .unwrap(),
    );
    // Validation plays data_idx 0..3 (twice: before and after), RL only
    // train indices; the tokenizer corpus read 16 train tasks.
    let resets = d.reset_indices();
    let creates = d.sent("create").len();
    assert_eq!(resets.len(), creates, "one reset per episode: {resets:?}");
    let val: Vec<u64> = resets.iter().copied().filter(|&i| i < 3).collect();
    assert_eq!(val, [0, 1, 2, 0, 1, 2], "{resets:?}");
    assert!(
        resets.iter().all(|&i| i < 3 || (100..140).contains(&i)),
        "{resets:?}"
    );
    assert_eq!(
        resets.iter().filter(|&&i| i >= 100).count(),
        16 + 2 * 2 * 2,
        "corpus tasks + steps × groups × n"
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"invalid_action_rate\""), "{metrics}");
    assert_eq!(d.open_sessions(), 0, "every session closed");

    // The trained run evaluated on the server's data_idx 500..504.
    let report = common::json_stdout(
        &Command::new(BIN)
            .args(["eval", "--env", "babyai", "--protocol", "agentgym"])
            .args(["--endpoint", &d.url(), "--n", "4", "--seed-start", "500"])
            .arg("--json")
            .arg("--policy")
            .arg(&run)
            .output()
            .unwrap(),
    );
    assert_eq!(report["n"], 4, "{report}");
    let tail: Vec<u64> = d.reset_indices().into_iter().rev().take(4).collect();
    assert_eq!(tail, [503, 502, 501, 500]);
}

#[test]
fn eval_on_an_agentgym_server_says_what_is_missing() {
    let d = DoubleServer::start(Kind::SciWorld);
    let eval = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["eval", "--env", "sciworld", "--endpoint", &d.url()])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = eval(&["--protocol", "agentgym"]);
    assert!(e.contains("--instructions-file"), "{e}");
    let e = eval(&[]);
    assert!(e.contains("--difficulty"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prompt.txt");
    std::fs::write(&f, "Play SciWorld.").unwrap();
    let f = f.display().to_string();
    let e = eval(&["--protocol", "agentgym", "--instructions-file", &f]);
    assert!(e.contains("no expert"), "{e}");
    // An index past SciWorld's tasks: the server's own message.
    let e = eval(&[
        "--protocol",
        "agentgym",
        "--instructions-file",
        &f,
        "--policy",
        "random",
        "--seed-start",
        "4639",
        "--n",
        "1",
    ]);
    assert!(e.contains("list index out of range"), "{e}");
}

/// The client speaks ALFWorld's, WebShop's and SearchQA's own request
/// dialects: `agentrl serve` answers each env's AgentGym dialect exactly as
/// AgentGym's servers do (422 for a reset without ALFWorld's `game`, 404 for
/// WebShop's `id` instead of `env_idx`), so a run and an eval that finish
/// are requests in the right shape.
#[test]
fn train_and_eval_speak_alfworld_webshop_and_searchqa() {
    let served = common::Served::start(&[
        "--envs",
        "alfworld,webshop,searchqa",
        "--env-param",
        "webshop.catalog_size=100",
        "--env-param",
        "searchqa.corpus_size=100",
        "--env-param",
        "cache_dir=memory",
    ]);
    for env in ["alfworld", "webshop", "searchqa"] {
        let endpoint = format!("{}/{env}", served.url);
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let mut overrides = overrides(&endpoint);
        overrides[1] = format!("env.name={env}");
        common::ok_stdout(
            &Command::new(BIN)
                .arg("train")
                .arg(SMOKE)
                .args(&overrides)
                .arg("--out")
                .arg(&run)
                .arg("--quiet")
                .output()
                .unwrap(),
        );
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        assert!(metrics.contains("\"kind\":\"train\""), "{env}: {metrics}");
        let report = common::json_stdout(
            &Command::new(BIN)
                .args(["eval", "--env", env, "--protocol", "agentgym"])
                .args(["--endpoint", &endpoint, "--n", "2", "--seed-start", "7"])
                .arg("--json")
                .arg("--policy")
                .arg(&run)
                .output()
                .unwrap(),
        );
        assert_eq!(report["n"], 2, "{env}: {report}");
    }
}
