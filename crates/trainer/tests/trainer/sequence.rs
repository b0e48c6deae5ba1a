//! Sequential training end to end with a tiny model: stage 2 starts from
//! stage 1's final policy, every stage's env is evaluated after every
//! stage, and the forgetting table is written.

use std::fs;

use agentrl_env_core::{EnvParams, TaskSpec};
use agentrl_trainer::sequence::{run_sequence, SequenceEval, SequenceStage};
use agentrl_trainer::{Silent, TrainConfig};

use crate::common;

/// A tiny model on non-slippery 3×3 FrozenLake, one RL step a stage.
const BASE: &str = "name=sequence-test env.params.is_slippery=false env.params.size=3 \
    rollout.max_turns=2 trainer.total_training_steps=1 trainer.save_freq=0";

#[test]
fn each_stage_continues_the_last_and_every_env_is_evaluated_after_each() {
    let base = common::tiny_frozenlake(BASE);
    let stages = vec![
        SequenceStage::parse("frozenlake:easy:1", 1).unwrap(),
        SequenceStage::parse("bandit:easy:2", 1).unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let make = |spec: &TaskSpec, params: &EnvParams| agentrl_envs::make_env(spec, params);
    let eval = SequenceEval {
        make: &make,
        tasks: 2,
        k: 2,
        temperature: 1.0,
        seed: 0,
    };
    let (summaries, rows) = run_sequence(&base, &stages, dir.path(), &eval, &mut Silent).unwrap();
    assert_eq!(summaries.len(), 2);
    assert_eq!((summaries[0].steps, summaries[1].steps), (1, 2));
    let names: Vec<&str> = rows.iter().map(|r| r.row.as_str()).collect();
    assert_eq!(
        names,
        [
            "start",
            "after stage 1 (frozenlake/easy)",
            "after stage 2 (bandit/easy)"
        ]
    );
    for r in &rows {
        let cells: Vec<String> = r
            .cells
            .iter()
            .map(|c| format!("{}/{}/{}", c.env, c.difficulty, c.failures.episodes))
            .collect();
        assert_eq!(cells, ["frozenlake/easy/4", "bandit/easy/4"], "{}", r.row);
    }
    // Stage 1 trained the tokenizer on both envs; stage 2 loaded stage 1's
    // final weights and did no warm start of its own.
    let first = dir.path().join("stage-1-frozenlake");
    let second = dir.path().join("stage-2-bandit");
    let c1 = TrainConfig::load(Some(&first.join("config.toml")), &[]).unwrap();
    assert_eq!(c1.model.tokenizer_envs, ["bandit"]);
    let c2 = TrainConfig::load(Some(&second.join("config.toml")), &[]).unwrap();
    assert_eq!(
        std::path::PathBuf::from(&c2.model.path),
        first.join("checkpoints").join("step-1")
    );
    assert_eq!(c2.sft.demos, 0);
    assert_eq!(c2.env.name, "bandit");
    assert!(
        c2.env.params.is_empty(),
        "frozenlake's params stay with frozenlake"
    );
    let metrics = fs::read_to_string(second.join("metrics.jsonl")).unwrap();
    assert!(!metrics.contains("\"kind\":\"sft\""));
    // The rows start from stage 1's step-0 policy and the stages' ends.
    assert_eq!(rows[0].checkpoint, first.join("checkpoints").join("step-0"));
    assert_eq!(
        rows[2].checkpoint,
        second.join("checkpoints").join("step-2")
    );
    let table = fs::read_to_string(dir.path().join("forgetting.md")).unwrap();
    assert!(
        table.contains("| forgetting (best earlier − end) |"),
        "{table}"
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("matrix.jsonl"))
            .unwrap()
            .lines()
            .count(),
        3
    );
}
