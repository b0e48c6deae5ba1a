//! What the CLI tests share: running the built binary as a user runs it and
//! reading what it printed.
#![allow(dead_code)] // each test binary uses its own subset

use std::process::{Command, Output};

/// The built `agentrl` binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_agentrl");

/// `configs/smoke.toml`: the seconds-long bandit run the whole-run tests
/// start from, overriding what they test.
pub const SMOKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/smoke.toml");

/// The TOML of a tiny 3×3 FrozenLake run (non-slippery maps, a one-layer
/// model with a `vocab_size`-token vocabulary) named `name`, followed by
/// `sections` (its `[sft]`, `[rollout]`, `[trainer]`, …): the run the
/// served-policy tests train their checkpoints with.
pub fn tiny_frozenlake_config(name: &str, vocab_size: usize, sections: &str) -> String {
    format!(
        r#"
name = "{name}"
[env]
name = "frozenlake"
difficulty = "easy"
[env.params]
is_slippery = false
size = 3
[model]
vocab_size = {vocab_size}
hidden_size = 64
num_hidden_layers = 1
num_attention_heads = 4
num_key_value_heads = 2
intermediate_size = 128
{sections}"#
    )
}

/// Run `agentrl ARGS` to the end.
pub fn agentrl(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Run `agentrl` with the words of `line` (a command line as a user types
/// it, without quoting) followed by `more` (paths, text with spaces).
pub fn agentrl_line(line: &str, more: &[&str]) -> Output {
    Command::new(BIN)
        .args(line.split_whitespace())
        .args(more)
        .output()
        .unwrap()
}

/// `agentrl train CONFIG OVERRIDES --quiet --out RUN`, which must succeed.
pub fn train(config: &str, overrides: &[&str], run: &std::path::Path) {
    let run = run.to_str().unwrap();
    let tail = ["--quiet", "--out", run];
    ok_stdout(&agentrl(&[&["train", config], overrides, &tail].concat()));
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

/// `agentrl serve ARGS` on a free port, killed when dropped.
pub struct Served {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Served {
    /// `agentrl serve ARGS`.
    pub fn start(args: &[&str]) -> Self {
        Self::command("serve", args)
    }

    /// `agentrl COMMAND --port 0 ARGS` for a command that prints its
    /// `http://` address first (`serve`, `serve-policy`).
    pub fn command(command: &str, args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(BIN)
            .args([command, "--port", "0"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        // Keep reading: a closed pipe would fail the server's next print.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .to_string();
        Served { child, url }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// Kill the server now (a host going away mid-run).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
