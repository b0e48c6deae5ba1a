//! `agentrl train` and `agentrl eval --endpoint` on a test double of
//! AgentGym's BabyAI server: the run plays the configured, held-out
//! `data_idx` ranges, one reset per episode, and counts invalid actions.

#[path = "../../env-client/tests/agentgym_double/mod.rs"]
mod agentgym_double;

use std::process::Command;

use agentgym_double::{DoubleServer, Kind};

const BIN: &str = env!("CARGO_BIN_EXE_agentrl");

/// A seconds-long run: tiny model, no warm start (no expert on AgentGym).
fn config(endpoint: &str) -> String {
    format!(
        r#"
name = "agentgym-test"
[env]
name = "babyai"
protocol = "agentgym"
endpoint = "{endpoint}"
instructions = "You are in a grid world. Reply with one action from the available actions."
data_idx.train = [100, 140]
data_idx.val = [0, 3]
[model]
vocab_size = 300
hidden_size = 32
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
intermediate_size = 64
[sft]
demos = 0
[rollout]
n = 2
env_groups = 2
max_turns = 2
max_actions = 2
response_length = 8
show_valid_actions = true
[trainer]
total_training_steps = 2
save_freq = 0
test_freq = 0
val_tasks = 3
val_greedy = false
"#
    )
}

#[test]
fn train_and_eval_on_an_agentgym_server() {
    let d = DoubleServer::start(Kind::BabyAi);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentgym.toml");
    std::fs::write(&cfg, config(&d.url())).unwrap();
    let run = dir.path().join("run");
    let out = Command::new(BIN)
        .arg("train")
        .arg(&cfg)
        .arg("--out")
        .arg(&run)
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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
    let out = Command::new(BIN)
        .args(["eval", "--env", "babyai", "--protocol", "agentgym"])
        .args([
            "--endpoint",
            &d.url(),
            "--n",
            "4",
            "--seed-start",
            "500",
            "--json",
        ])
        .arg("--policy")
        .arg(&run)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
