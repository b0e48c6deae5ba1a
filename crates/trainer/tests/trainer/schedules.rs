//! ScalingInter-RL's turn schedule, the difficulty curriculum and the
//! mixture in a real (tiny) run: each step trains on what the schedule
//! says, logs it, and a run resumed in the middle of a stage continues
//! exactly as the uninterrupted run did.

use std::fs;
use std::path::Path;

use agentrl_trainer::TrainConfig;
use serde_json::Value;

use crate::common::{tiny_frozenlake, whole_and_resumed};

/// A tiny model on non-slippery FrozenLake: five RL steps, a checkpoint after each; the
/// turn budget grows 1 → 2 → 3 every 2 steps and the curriculum moves from
/// easy to hard at step 3.
const STAGED: &str = "name=schedule-test env.params.is_slippery=false rollout.max_turns=3 \
    rollout.max_turns_schedule=[1,2,3] rollout.max_turns_stage_steps=2 \
    curriculum.difficulties=[\"easy\",\"hard\"] curriculum.stage_steps=3 \
    trainer.total_training_steps=5";

#[test]
fn each_step_plays_its_stage_and_a_resume_mid_stage_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    // Killed after step 3: inside the turn budget's second stage (steps
    // 2-3) and the curriculum's second (steps 3-5).
    let cfg = tiny_frozenlake(STAGED);
    let (whole, resumed) = whole_and_resumed(cfg, 3, dir.path());
    let train: Vec<&Value> = whole.iter().filter(|v| v["kind"] == "train").collect();
    let turns: Vec<u64> = train
        .iter()
        .map(|v| v["max_turns"].as_u64().unwrap())
        .collect();
    assert_eq!(turns, [1, 2, 2, 3, 3], "stage = step / 2, the last holding");
    let difficulty: Vec<&str> = train
        .iter()
        .map(|v| v["difficulty"].as_str().unwrap())
        .collect();
    assert_eq!(difficulty, ["easy", "easy", "hard", "hard", "hard"]);
    // No episode outlasts its step's budget.
    for v in &train {
        assert!(
            v["turns"].as_f64().unwrap() <= v["max_turns"].as_f64().unwrap(),
            "{v}"
        );
    }
    assert_eq!(
        resumed, whole,
        "the resumed run's records are the uninterrupted run's"
    );
}

#[test]
fn a_threshold_curriculum_keeps_its_stage_across_a_resume() {
    // The shipped 3x3 setup: its warm start reaches the goal now and then
    // (1 of 64 validation maps). Validation every 2 steps; 1% success on
    // the current stage's difficulty moves training to `hard`.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/frozenlake-3x3.toml");
    let text = fs::read_to_string(path).unwrap()
        + "\n[curriculum]\ndifficulties = [\"easy\", \"hard\"]\nadvance_at = 0.01\n";
    let overrides: Vec<String> = [
        "trainer.total_training_steps=5",
        "trainer.test_freq=2",
        "trainer.save_freq=1",
        "trainer.val_greedy=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cfg = TrainConfig::from_toml(&text, &overrides).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Killed after step 4, whose validation moved the curriculum on.
    let (whole, resumed) = whole_and_resumed(cfg, 4, dir.path());
    let checks: Vec<(u64, f64)> = whole
        .iter()
        .filter(|v| v["kind"] == "eval_curriculum")
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["success_rate"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(checks.len(), 2, "validated at steps 2 and 4: {checks:?}");
    assert!(checks[0].1 < 0.01 && checks[1].1 >= 0.01, "{checks:?}");
    let difficulty: Vec<&str> = whole
        .iter()
        .filter(|v| v["kind"] == "train")
        .map(|v| v["difficulty"].as_str().unwrap())
        .collect();
    assert_eq!(difficulty, ["easy", "easy", "easy", "easy", "hard"]);
    // Resumed after step 4, the stage reached there still holds: step 5
    // trains on `hard` as in the uninterrupted run.
    assert_eq!(resumed, whole);
}

#[test]
fn a_mixture_deals_each_step_between_its_envs_and_logs_each() {
    // Each step one 3×3 FrozenLake task and one bandit task.
    let cfg = tiny_frozenlake(
        "name=mixture-test rollout.max_turns=2 trainer.total_training_steps=2 \
        mixture=[{name=\"frozenlake\",difficulty=\"easy\",weight=1.0,params={is_slippery=false,size=3}},\
        {name=\"bandit\",weight=1.0}]",
    );
    let dir = tempfile::tempdir().unwrap();
    let (whole, resumed) = whole_and_resumed(cfg, 1, dir.path());
    assert_eq!(resumed, whole);
    for v in whole.iter().filter(|v| v["kind"] == "train") {
        let per_env = v["per_env"].as_object().unwrap();
        let keys: Vec<&String> = per_env.keys().collect();
        assert_eq!(keys, ["bandit/easy", "frozenlake/easy"], "{v}");
        // One task of each env a step, two samples each.
        for figures in per_env.values() {
            assert_eq!(figures["n"], 2, "{v}");
        }
    }
    // Validation covers each env and pools them.
    let before: Vec<&Value> = whole
        .iter()
        .filter(|v| v["phase"] == "before" && v["kind"] == "eval_env")
        .collect();
    assert_eq!(before.len(), 2);
    let pooled = whole
        .iter()
        .find(|v| v["phase"] == "before" && v["kind"] == "eval")
        .unwrap();
    assert_eq!(pooled["n"], 4);
    let summary: Value =
        serde_json::from_str(&fs::read_to_string(dir.path().join("whole/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["env"], "frozenlake+bandit");
    assert!(
        summary["after_per_env"]["bandit/easy"]["n"] == 2,
        "{summary}"
    );
}
