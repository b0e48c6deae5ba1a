//! `agentrl serve` refuses bad limits and bad operator params at start,
//! before it listens (run as a user runs it: the built binary).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run `agentrl serve ARGS` on a free port; a server that starts listening
/// instead of failing is killed after 20 s and reported.
fn serve(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrl"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "serve {args:?} kept running: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn refused_with(args: &[&str], says: &str) {
    let out = serve(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

#[test]
fn zero_limits_are_errors() {
    refused_with(&["--body-limit", "0"], "body limit");
    refused_with(&["--max-connections", "0"], "max_connections");
    refused_with(&["--header-timeout-secs", "0"], "timeouts must be positive");
    refused_with(
        &["--request-timeout-secs", "0"],
        "timeouts must be positive",
    );
}

#[test]
fn bad_operator_params_are_errors() {
    refused_with(
        &["--env-param", "textcraft.data_dir=/nonexistent/agentrl"],
        "/nonexistent/agentrl",
    );
    refused_with(
        &["--envs", "frozenlake", "--env-param", "corpus=/x"],
        "no served environment has a parameter 'corpus'",
    );
}
