//! What the trainer's whole-run tests share: their configs start from
//! `configs/smoke.toml` and override what they test, and a run directory
//! can be copied as if a kill had left it.
#![allow(dead_code)] // each test binary uses its own subset

use std::fs;
use std::path::Path;

use agentrl_trainer::config::SMOKE_CONFIG;
use agentrl_trainer::run_dir::RunDir;
use agentrl_trainer::{Silent, TrainConfig, Trainer};
use serde_json::Value;

/// `configs/smoke.toml` with `overrides` (`key=value`, as `agentrl train`
/// takes them) applied in order.
pub fn smoke_with(overrides: &[&str]) -> TrainConfig {
    let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
    TrainConfig::from_toml(SMOKE_CONFIG, &overrides).unwrap()
}

/// The smoke run moved to FrozenLake with one move a turn and a random-move
/// warm start, then the whitespace-separated `overrides`.
pub fn tiny_frozenlake(overrides: &str) -> TrainConfig {
    let base = "model.vocab_size=300 env.name=frozenlake sft.expert_noise=1.0 \
        rollout.max_actions_per_turn=1 trainer.val_greedy=false";
    let all: Vec<&str> = base
        .split_whitespace()
        .chain(overrides.split_whitespace())
        .collect();
    smoke_with(&all)
}

/// Copy the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The train and eval records of a run, less wall-clock times.
pub fn records(dir: &Path) -> Vec<Value> {
    fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if let Value::Object(m) = &mut v {
                m.retain(|k, _| !k.ends_with("seconds"));
            }
            v
        })
        .collect()
}

/// Train `config` into `dir`, then copy it as if killed right after
/// checkpoint `kill_after`, resume the copy, and return both directories'
/// records for comparison.
pub fn whole_and_resumed(
    cfg: TrainConfig,
    kill_after: usize,
    dir: &Path,
) -> (Vec<Value>, Vec<Value>) {
    let whole = dir.join("whole");
    Trainer::start(cfg, &whole, &mut Silent)
        .unwrap()
        .train(&mut Silent)
        .unwrap();
    // A kill after checkpoint `kill_after` leaves `latest` naming it and
    // the logs holding whatever later steps wrote; resuming drops those.
    let killed = dir.join("killed");
    copy_dir(&whole, &killed);
    fs::remove_file(killed.join("summary.json")).unwrap();
    RunDir::open(&killed)
        .unwrap()
        .set_latest(kill_after)
        .unwrap();
    let mut t = Trainer::resume(&killed).unwrap();
    assert_eq!(t.state.step, kill_after);
    t.train(&mut Silent).unwrap();
    (records(&whole), records(&killed))
}
