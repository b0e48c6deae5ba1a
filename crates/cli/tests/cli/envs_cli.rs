//! `agentrl envs`, `play` and `eval` run as a user runs them: the built binary.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::{agentrl, agentrl_line, assert_contains_all, failure_stderr, ok_stdout, BIN};

fn agentrl_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn envs_lists_the_first_three_environments_with_splits() {
    let text = ok_stdout(&agentrl(&["envs"]));
    for name in ["bandit", "frozenlake", "sokoban"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(name) && l.contains("easy, hard")),
            "{text}"
        );
    }
    assert_contains_all(
        &text,
        &[
            "train  0..4294967296",
            "val    4294967296..8589934592",
            "test   8589934592..12884901888",
        ],
    );
}

#[test]
fn envs_json_has_names_difficulties_and_splits() {
    let rows: Value = serde_json::from_str(&ok_stdout(&agentrl(&["envs", "--json"]))).unwrap();
    let row = |name: &str| {
        let rows = rows.as_array().unwrap();
        rows.iter().find(|r| r["name"] == name).unwrap().clone()
    };
    let sokoban = row("sokoban");
    assert_eq!(sokoban["difficulties"], serde_json::json!(["easy", "hard"]));
    assert_eq!(sokoban["default_difficulty"], "easy");
    assert_eq!(sokoban["splits"]["val"]["start"], 4294967296u64);
    let bandit = row("bandit");
    assert_eq!(bandit["default_max_turns"], 1);
}

/// The example: two scripted moves, then input ends.
#[test]
fn scripted_play_prints_each_step_and_a_summary() {
    let out = agentrl_with_stdin(&["play", "sokoban", "--seed", "3"], b"Up\nLeft\n");
    let text = ok_stdout(&out);
    assert!(text.contains("== sokoban/train/easy#3 =="), "{text}");
    assert!(text.contains("Symbols: # = wall"), "{text}");
    assert_eq!(
        text.matches("reward: -0.1  done: false").count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("summary: steps 2  total reward -0.2  success false  invalid actions 0"),
        "{text}"
    );
}

#[test]
fn play_reports_invalid_actions_and_keeps_going() {
    let out = agentrl_with_stdin(
        &[
            "play",
            "frozenlake",
            "--seed",
            "1",
            "--show-actions",
            "--param",
            "is_slippery=false",
        ],
        b"fly\n\xff\xfe\nRight\n",
    );
    let text = ok_stdout(&out);
    assert_contains_all(
        &text,
        &[
            "invalid action: unknown action 'fly'",
            "actions: Left, Down, Right, Up",
            "invalid actions 2",
            "> Right",
        ],
    );
}

#[test]
fn play_stops_at_the_end_of_the_episode() {
    // The bandit is one pull; the second line is never read as an action.
    let out = agentrl_with_stdin(
        &["play", "bandit", "--seed", "0", "--split", "test"],
        b"1\n2\n",
    );
    let text = ok_stdout(&out);
    assert_eq!(text.matches("done: true").count(), 1, "{text}");
    assert!(text.contains("summary: steps 1"), "{text}");
}

#[test]
fn play_rejects_unknown_env_and_difficulty() {
    let out = agentrl_with_stdin(&["play", "chess"], b"");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown environment 'chess'"));
    let out = agentrl_with_stdin(&["play", "sokoban", "--difficulty", "nightmare"], b"");
    assert!(!out.status.success());
}

fn eval_json(args: &[&str]) -> Value {
    let mut all = vec!["eval", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(ok_stdout(&agentrl(&all)).trim()).unwrap()
}

#[test]
fn eval_expert_solves_every_easy_sokoban_room() {
    let v = eval_json(&["--policy", "expert", "--env", "sokoban", "--n", "50"]);
    assert_eq!(v["n"], 50);
    assert_eq!(v["success_rate"], 1.0);
    // Every solved room pays +10 + 1 for its box, minus 0.1 a step (summed
    // in f32 per episode, as trajectories keep rewards).
    let expected = 11.0 - 0.1 * v["mean_env_steps"].as_f64().unwrap();
    assert!(
        (v["mean_reward"].as_f64().unwrap() - expected).abs() < 1e-4,
        "{v}"
    );
}

#[test]
fn eval_random_is_worse_than_expert_and_deterministic() {
    let a = eval_json(&["--policy", "random", "--env", "frozenlake", "--n", "100"]);
    let b = eval_json(&["--policy", "random", "--env", "frozenlake", "--n", "100"]);
    assert_eq!(a, b);
    let e = eval_json(&["--policy", "expert", "--env", "frozenlake", "--n", "100"]);
    assert!(e["success_rate"].as_f64().unwrap() > a["success_rate"].as_f64().unwrap());
    let bandit = eval_json(&[
        "--policy", "expert", "--env", "bandit", "--split", "test", "--n", "100",
    ]);
    assert_eq!(bandit["success_rate"], 1.0);
}

#[test]
fn a_gigabyte_action_line_is_an_error_not_an_abort() {
    let mut child = Command::new(BIN)
        .args(["play", "bandit"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // 1 GiB without a newline, written until the reader stops reading.
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 20];
        let mut sent = 0usize;
        while sent < 1 << 30 && stdin.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        sent
    });
    let out = child.wait_with_output().unwrap();
    let sent = writer.join().unwrap();
    let err = failure_stderr(&out);
    assert!(
        err.contains("line 1 of stdin is longer than 65536 bytes"),
        "{err}"
    );
    assert!(
        sent < 1 << 30,
        "play stopped reading early ({sent} bytes sent)"
    );
}

#[test]
fn eval_seed_range_past_the_split_is_an_error() {
    let line = "eval --policy random --env bandit --n 5 --seed-start 18446744073709551615";
    let out = agentrl_line(line, &[]);
    let err = failure_stderr(&out);
    assert!(err.contains("--seed-start 18446744073709551615"), "{err}");
    // The last task of the split is fine.
    let line = "eval --policy random --env bandit --n 1 --seed-start 4294967295 --json";
    let text = ok_stdout(&agentrl_line(line, &[]));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["n"], 1);
}
