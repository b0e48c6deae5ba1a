//! What the trainer's whole-run tests share: their configs start from
//! `configs/smoke.toml` and override what they test, and a run directory
//! can be copied as if a kill had left it.
#![allow(dead_code)] // each test binary uses its own subset

use std::fs;
use std::path::Path;

use agentrl_trainer::config::SMOKE_CONFIG;
use agentrl_trainer::TrainConfig;

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
