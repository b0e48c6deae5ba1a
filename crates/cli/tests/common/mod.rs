//! What the CLI tests share: running the built binary as a user runs it and
//! reading what it printed.
#![allow(dead_code)] // each test binary uses its own subset

use std::process::{Command, Output};

/// The built `agentrl` binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_agentrl");

/// `configs/smoke.toml`: the seconds-long bandit run the whole-run tests
/// start from, overriding what they test.
pub const SMOKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/smoke.toml");

/// Run `agentrl ARGS` to the end.
pub fn agentrl(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Its stdout as text; a failure shows its stderr.
pub fn ok_stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Its stdout as JSON; a failure shows its stderr.
pub fn json_stdout(out: &Output) -> serde_json::Value {
    serde_json::from_str(&ok_stdout(out)).unwrap()
}

/// The stderr of a run that had to fail.
pub fn failure_stderr(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "it succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every one of `needles` appears in `text`.
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for n in needles {
        assert!(text.contains(n), "{n:?} missing from:\n{text}");
    }
}
