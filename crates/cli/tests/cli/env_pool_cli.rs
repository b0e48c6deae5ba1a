//! Env servers on several hosts: `env.endpoint` (or `eval --endpoint A,B`)
//! lists `agentrl serve` processes; sessions spread over them, and when one
//! is killed mid-run its episodes move to the other (replayed there), so the
//! run ends with every trajectory and the figures a run with no failure gives.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::{json_stdout, Served, BIN, SMOKE};

/// Live sessions on the server at `url` (`GET /health`).
fn sessions(url: &str) -> u64 {
    let addr = url.trim_start_matches("http://");
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    let _ = write!(
        s,
        "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("{}");
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["sessions"].as_u64())
        .unwrap_or(0)
}

/// Wait until the server at `url` holds a session (the run is using it).
fn wait_for_sessions(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sessions(url) == 0 {
        assert!(Instant::now() < deadline, "{url} never got a session");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `cmd`, kill `victim` once the run holds a session on it, and return
/// what the run printed.
fn run_while_killing(mut cmd: Command, victim: &mut Served) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_sessions(&victim.url);
    victim.kill();
    child.wait_with_output().unwrap()
}

#[test]
fn an_eval_over_two_servers_loses_nothing_when_one_dies() {
    let eval = ["eval", "--policy", "expert", "--env", "frozenlake"];
    let tasks = ["--difficulty", "hard", "--n", "200", "--json"];
    let local = json_stdout(&Command::new(BIN).args(eval).args(tasks).output().unwrap());

    let mut a = Served::start(&[]);
    let b = Served::start(&[]);
    let mut child = Command::new(BIN);
    child
        .args(eval)
        .args(tasks)
        .args(["--endpoint", &format!("{},{}", a.url, b.url)]);
    let out = run_while_killing(child, &mut a);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let pooled = json_stdout(&out);
    for key in [
        "n",
        "success_rate",
        "mean_reward",
        "mean_env_steps",
        "mean_turns",
    ] {
        assert_eq!(
            pooled[key], local[key],
            "{key}: {pooled} vs {local}\n{stderr}"
        );
    }
    assert!(
        stderr.contains("episode moved"),
        "no episode was moved:\n{stderr}"
    );
}

#[test]
fn a_training_run_over_two_servers_finishes_when_one_dies() {
    let mut a = Served::start(&[]);
    let b = Served::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let endpoints = format!("env.endpoint=[\"{}\", \"{}\"]", a.url, b.url);
    let mut child = Command::new(BIN);
    child
        .arg("train")
        .arg(SMOKE)
        .args([
            "env.name=frozenlake",
            "sft.demos=16",
            "rollout.max_turns=3",
            "trainer.total_training_steps=12",
            "trainer.save_freq=0",
        ])
        .arg(&endpoints)
        .arg("--out")
        .arg(&run)
        .arg("--quiet");
    common::ok_stdout(&run_while_killing(child, &mut a));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=12).collect::<Vec<_>>());
    let summary = std::fs::read_to_string(run.join("summary.json")).unwrap();
    assert!(summary.contains("\"after\""), "{summary}");
}
