//! Every value of a config, env and mixture params included, is
//! checked before `agentrl train` writes anything, `--print-config` runs
//! the same checks, an error about the user's input prints no stack trace
//! whatever `RUST_BACKTRACE` says, and a start that fails anyway leaves no
//! run directory that would refuse the same command.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::{assert_contains_all, BIN};

const FROZENLAKE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../configs/frozenlake-3x3.toml"
);

/// `agentrl ARGS` with `RUST_BACKTRACE=1`, as on many developers' machines.
fn agentrl_with_backtraces(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

/// The stderr of `agentrl ARGS` (with `RUST_BACKTRACE=1`), which must fail
/// with an error message and no stack trace.
fn refused(args: &[&str]) -> String {
    let out = agentrl_with_backtraces(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} was accepted: {stderr}");
    assert!(stderr.contains("Error: "), "{args:?}: {stderr}");
    assert!(
        !stderr.to_lowercase().contains("stack backtrace"),
        "{args:?} printed a backtrace:\n{stderr}"
    );
    stderr
}

/// A port on loopback that nothing listens on.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn env_params_are_checked_with_the_other_values_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_arg = run.to_str().unwrap();
    // The issue's command: both problems at once, for --print-config too.
    let bad = [FROZENLAKE, "env.params.size=1000", "rollout.temperature=-1"];
    for tail in [&["--print-config"][..], &["--quiet", "--out", run_arg]] {
        let err = refused(&[&["train"][..], &bad, tail].concat());
        assert_contains_all(&err, &["env.params.size", "rollout.temperature"]);
        assert!(!err.contains("run directory"), "{err}");
    }
    assert!(!run.exists(), "the refused run wrote {}", run.display());
    // A generator setting that never yields a task, named by its env.
    let err = refused(&[
        "train",
        FROZENLAKE,
        "env.params.frozen_prob=1e-9",
        "--print-config",
    ]);
    assert_contains_all(&err, &["env.params", "raise frozen_prob"]);
    // An env server that does not answer.
    let endpoint = format!("env.endpoint=http://127.0.0.1:{}", closed_port());
    let err = refused(&["train", FROZENLAKE, &endpoint, "--print-config"]);
    assert_contains_all(&err, &["env.endpoint", "cannot connect"]);
}

#[test]
fn mixture_params_are_checked_per_entry() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mix.toml");
    let text = std::fs::read_to_string(FROZENLAKE).unwrap()
        + r#"
[[mixture]]
name = "frozenlake"
difficulty = "easy"
params = { is_slippery = false, size = 3 }

[[mixture]]
name = "sokoban"
difficulty = "easy"
params = { boxes = 9 }
"#;
    std::fs::write(&config, text).unwrap();
    let err = refused(&["train", config.to_str().unwrap(), "--print-config"]);
    assert_contains_all(&err, &["mixture[1].params.boxes", "between 1 and 4"]);
}

#[test]
fn a_device_this_build_lacks_is_named_before_the_run_starts() {
    if candle_core::utils::cuda_is_available() {
        // A CUDA build: the device is checked when it opens.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let err = refused(&[
        "train",
        FROZENLAKE,
        "trainer.device=cuda",
        "--quiet",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert_contains_all(&err, &["trainer.device", "built with CUDA"]);
    assert!(!run.exists());
}

#[test]
fn errors_about_files_print_the_message_alone() {
    let err = refused(&["train", "/nonexistent/agentrl.toml", "--print-config"]);
    assert_contains_all(&err, &["cannot read config", "/nonexistent/agentrl.toml"]);
    let err = refused(&["eval", "--env", "no-such-env"]);
    assert!(err.contains("no-such-env"), "{err}");
}

/// An "env server" that accepts connections and refuses every request with
/// a 400, until the test ends: reachable when the config is checked, but
/// the run's first env fails once its directory exists.
fn refusing_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let body = r#"{"error":"this server refuses every task","kind":"invalid_spec"}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn a_start_that_fails_removes_what_it_wrote_and_can_run_again() {
    let endpoint = format!("env.endpoint=http://127.0.0.1:{}", refusing_server());
    let dir = tempfile::tempdir().unwrap();
    // A new directory, below a parent that does not exist yet either.
    let run = dir.path().join("runs").join("first");
    let args = [
        "train",
        FROZENLAKE,
        &endpoint,
        "sft.demos=0",
        "--quiet",
        "--out",
        run.to_str().unwrap(),
    ];
    for _ in 0..2 {
        let err = refused(&args);
        assert!(err.contains("refuses every task"), "{err}");
        // The same command again fails for the same reason, not because a
        // half-written run is in the way.
        assert!(!err.contains("not written into an existing one"), "{err}");
        assert!(!run.exists(), "{} left behind", run.display());
        assert!(!run.parent().unwrap().exists(), "its parent left behind");
    }
    // A directory that existed (empty) stays, and stays empty.
    let existing = dir.path().join("existing");
    std::fs::create_dir(&existing).unwrap();
    let mut args = args;
    args[6] = existing.to_str().unwrap();
    let err = refused(&args);
    assert!(err.contains("refuses every task"), "{err}");
    assert!(existing.is_dir());
    assert_eq!(entries(&existing), 0);
}

#[test]
fn a_tokenizer_that_cannot_find_where_thoughts_end_is_refused_before_the_warm_start() {
    // Qwen2's tokenizer has no `</think>` token, so `actor.train_thoughts =
    // false` cannot tell a thought from its answer: the start says so before
    // the warm start, and leaves no run directory behind.
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/data/qwen2-tiny"
    );
    let smoke = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/smoke.toml");
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = agentrl_with_backtraces(&[
        "train",
        smoke,
        &format!("model.path={model}"),
        "actor.train_thoughts=false",
        "rollout.max_context_tokens=512",
        "--out",
        run.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert_contains_all(&stderr, &["actor.train_thoughts", "</think>"]);
    assert!(
        !stdout.contains("warm start") && !stderr.contains("warm start"),
        "{stdout}{stderr}"
    );
    assert!(!run.exists(), "the refused run left {}", run.display());
}
