//! `agentrl train` end to end: a killed run resumes from its last checkpoint
//! with no lost or repeated step, and ends where an uninterrupted run ends.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{agentrl, agentrl_line, failure_stderr, ok_stdout, BIN, SMOKE};

/// `configs/smoke.toml`, a seconds-long run on the bandit, made a little
/// longer and wider: six RL steps, a checkpoint after each.
const OVERRIDES: &[&str] = &[
    "name=resume-test",
    "model.vocab_size=300",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=4",
    "model.num_key_value_heads=2",
    "sft.demos=8",
    "trainer.total_training_steps=6",
    "trainer.val_tasks=4",
];

fn train(out: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.arg("train")
        .arg(SMOKE)
        .args(OVERRIDES)
        .arg("--out")
        .arg(out)
        .arg("--quiet");
    c.stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// (step, reward_mean, grad_norm, pg_loss) of every train line.
fn train_lines(run: &Path) -> Vec<(u64, String, String, String)> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["reward_mean"].to_string(),
                v["grad_norm"].to_string(),
                v["pg_loss"].to_string(),
            )
        })
        .collect()
}

#[test]
fn killed_run_resumes_without_lost_or_repeated_steps() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let killed = dir.path().join("killed");

    assert!(train(&whole).status().unwrap().success());

    // Kill the second run (SIGKILL) once it has checkpointed step 2.
    let mut child = train(&killed).spawn().unwrap();
    let start = Instant::now();
    while !killed
        .join("checkpoints/step-2/trainer_state.json")
        .exists()
    {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "run never reached step 2"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("run ended before it could be killed: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let status = Command::new(BIN)
        .arg("train")
        .arg("--resume")
        .arg(&killed)
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());

    let resumed = train_lines(&killed);
    let steps: Vec<u64> = resumed.iter().map(|l| l.0).collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 5, 6], "every step exactly once");
    assert_eq!(
        resumed,
        train_lines(&whole),
        "resumed run matches the uninterrupted one"
    );
    assert!(killed.join("summary.json").is_file());
}

#[test]
fn out_into_an_existing_run_is_an_error_unless_resuming() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::write(run.join("config.toml"), "name = \"earlier\"\n").unwrap();
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"kind\":\"train\",\"step\":1}\n",
    )
    .unwrap();
    let err = failure_stderr(&train(&run).stderr(Stdio::piped()).output().unwrap());
    assert!(err.contains("--out") && err.contains("--resume"), "{err}");
    // Nothing of the earlier run was touched, nothing of a new one written.
    assert_eq!(
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap(),
        "{\"kind\":\"train\",\"step\":1}\n"
    );
    assert!(!run.join("checkpoints").exists());
}

#[test]
fn config_problems_are_all_named_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let line = "train rollout.temperature=-1 rollout.top_p=5 model.vocab_size=1000000000000 \
        trainer.total_training_steps=0";
    let err = failure_stderr(&agentrl_line(line, &["--out", run.to_str().unwrap()]));
    for key in [
        "rollout.temperature",
        "rollout.top_p",
        "model.vocab_size",
        "trainer.total_training_steps",
    ] {
        assert!(err.contains(key), "{key}: {err}");
    }
    assert!(!run.exists(), "no run directory for an invalid config");
}

#[test]
fn bad_config_key_is_named() {
    let err = failure_stderr(&agentrl(&["train", "actor.lrr=1", "--print-config"]));
    assert!(err.contains("lrr"), "{err}");
}

#[test]
fn print_config_shows_the_resolved_default() {
    let text = ok_stdout(&agentrl(&["train", "trainer.seed=9", "--print-config"]));
    assert!(text.contains("seed = 9"), "{text}");
    assert!(text.contains("adv_estimator = \"gigpo\""), "{text}");
}

#[test]
fn best_validation_is_kept_beside_the_latest_and_playable() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("best");
    let mut cmd = train(&run);
    cmd.args([
        "trainer.test_freq=2",
        "trainer.val_temperature=1.0",
        "trainer.val_tasks=8",
    ]);
    assert!(cmd.status().unwrap().success());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    // The best is the first of the highest sampled validations (before, every
    // test_freq steps, after); greedy ones are reported but never picked.
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let evals: Vec<(u64, f64)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "eval" && !v["phase"].as_str().unwrap().ends_with("greedy"))
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["success_rate"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        evals.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![0, 2, 4, 6]
    );
    let top = evals.iter().map(|e| e.1).fold(f64::MIN, f64::max);
    let first_top = evals.iter().find(|e| e.1 == top).unwrap();
    assert_eq!(summary["best"]["step"].as_u64().unwrap(), first_top.0);
    assert_eq!(summary["best"]["success_rate"].as_f64().unwrap(), top);
    for key in ["before_greedy", "after_greedy"] {
        assert!(summary[key]["success_rate"].is_number(), "{key}: {summary}");
    }
    let best = run.join("checkpoints").join("best");
    assert!(best.join("model.safetensors").is_file());
    assert!(!run.join("checkpoints").join("best.tmp").exists());
    // The best checkpoint plays with its run's config.
    let best = best.to_str().unwrap();
    ok_stdout(&agentrl_line(
        "eval --env bandit --n 4 --json --policy",
        &[best],
    ));
}
