//! A run killed at any write survives: for every write and append a run
//! makes while it trains, checkpoints and finishes, and while a finished run
//! is resumed (the logs' rewrite, the re-save of the last checkpoint, the
//! summary), a crash there leaves a directory that resumes from its last
//! good checkpoint and ends with exactly the log lines of an uninterrupted
//! run. The crash is agentrl-durable's simulated kill: the write stops half
//! way with the half-written bytes left on disk, as kill -9 leaves them.

use std::fs;
use std::path::Path;

use agentrl_durable::testing;
use agentrl_trainer::run_dir::RunDir;
use agentrl_trainer::{Silent, TrainError, Trainer};
use serde_json::Value;

use crate::common;
use common::copy_dir;

/// Resume the run in `dir` and train it to the end.
fn resume_to_end(dir: &Path) -> Result<(), TrainError> {
    Trainer::resume(dir)?.train(&mut Silent).map(|_| ())
}

/// What must not differ from an uninterrupted run: every line of both logs
/// and the summary, less wall-clock times and the directory's own path.
type Outcome = (Vec<Value>, Vec<Value>, Value);

fn outcome(dir: &Path) -> Outcome {
    let strip = |mut v: Value| {
        if let Value::Object(m) = &mut v {
            m.retain(|k, _| !k.ends_with("seconds") && k != "run_dir");
        }
        v
    };
    let lines = |file: &str| -> Vec<Value> {
        fs::read_to_string(dir.join(file))
            .unwrap()
            .lines()
            .map(|l| strip(serde_json::from_str(l).unwrap_or_else(|e| panic!("{file}: {e}: {l}"))))
            .collect()
    };
    let summary = fs::read_to_string(dir.join("summary.json")).unwrap();
    (
        lines("metrics.jsonl"),
        lines("trajectories.jsonl"),
        strip(serde_json::from_str(&summary).unwrap()),
    )
}

/// For k = 1, 2, …: copy `start` afresh, crash at its k-th write while
/// resuming it to the end, then resume it again and check that it ends as
/// `expected`. Returns how many crash points there were.
fn crash_at_every_write(start: &Path, scratch: &Path, expected: &Outcome) -> usize {
    for k in 1.. {
        let dir = scratch.join(format!("crash-{k}"));
        copy_dir(start, &dir);
        testing::crash_at(k);
        let crashed = resume_to_end(&dir);
        if !testing::disarm() {
            crashed.unwrap();
            return k - 1;
        }
        let e = crashed.expect_err("a crash is an error");
        assert!(testing::is_simulated_crash(&e), "write {k}: {e}");
        resume_to_end(&dir)
            .unwrap_or_else(|e| panic!("after a crash at write {k} the run does not resume: {e}"));
        assert!(
            outcome(&dir) == *expected,
            "after a crash at write {k} the logs differ from an uninterrupted run's"
        );
        // The resumed run removed what the crash left half written.
        assert_eq!(RunDir::open(&dir).unwrap().remove_temporaries().unwrap(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }
    unreachable!()
}

/// A run after checkpoint 0 (warm start, "before" evaluation), the same run
/// finished, and the outcome of finishing it.
struct Runs {
    scratch: tempfile::TempDir,
    started: std::path::PathBuf,
    finished: std::path::PathBuf,
    expected: Outcome,
}

fn runs() -> Runs {
    let scratch = tempfile::tempdir().unwrap();
    let started = scratch.path().join("started");
    // configs/smoke.toml: two RL steps, a checkpoint after each, on the bandit.
    let cfg = common::smoke_with(&[]);
    drop(Trainer::start(cfg, &started, &mut Silent).unwrap());
    let finished = scratch.path().join("finished");
    copy_dir(&started, &finished);
    resume_to_end(&finished).unwrap();
    let expected = outcome(&finished);
    let train_steps: Vec<u64> = expected
        .0
        .iter()
        .filter(|v| v["kind"] == "train")
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(train_steps, vec![1, 2]);
    Runs {
        scratch,
        started,
        finished,
        expected,
    }
}

#[test]
fn a_crash_at_any_write_while_training_leaves_a_run_that_resumes_with_every_log_line() {
    let r = runs();
    // The RL steps' lines, checkpoint 1, the final evaluation, checkpoint 2
    // and the summary.
    let n = crash_at_every_write(&r.started, r.scratch.path(), &r.expected);
    assert!(n >= 20, "only {n} writes while training");
}

#[test]
fn a_crash_at_any_write_while_resuming_a_finished_run_loses_nothing() {
    let r = runs();
    // The logs' rewrite, the final evaluation again, the re-save of
    // checkpoint 2 over itself, the summary.
    let n = crash_at_every_write(&r.finished, r.scratch.path(), &r.expected);
    assert!(n >= 10, "only {n} writes resuming a finished run");
}

/// transformers' `generate` on a checkpoint stops at `<|im_end|>`, as the
/// rollouts do: every checkpoint's generation_config.json names it first.
#[test]
fn every_checkpoint_names_im_end_as_the_end_of_generation() {
    let r = runs();
    for step in 0..=2 {
        let dir = r.finished.join(format!("checkpoints/step-{step}"));
        let tokenizer = agentrl_tokenizer::ChatTokenizer::load(&dir).unwrap();
        let text = fs::read_to_string(dir.join("generation_config.json")).unwrap();
        let g: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            g["eos_token_id"][0],
            tokenizer.im_end_id(),
            "step {step}: {g}"
        );
        assert_eq!(
            g["pad_token_id"],
            tokenizer.endoftext_id().unwrap(),
            "step {step}: {g}"
        );
    }
}
