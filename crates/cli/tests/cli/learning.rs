//! The product's core claim in small: `agentrl train` on the shipped quick
//! config (FrozenLake 3×3, a format-only warm start, 20 GRPO steps, seed 0)
//! raises held-out success well above where the warm start left it.

use crate::common;

const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../configs/frozenlake-3x3.toml"
);

#[test]
fn rl_lifts_held_out_success_on_frozenlake_3x3() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    common::train(CONFIG, &[], &run);

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let before = summary["before"]["success_rate"].as_f64().unwrap();
    let after = summary["after"]["success_rate"].as_f64().unwrap();
    assert_eq!(summary["steps"], 20);
    // The warm start picks legal moves at random: it almost never reaches
    // the goal. Seed 0 measured 1.6% -> 29.7% (64 held-out maps; seeds 1 and
    // 2: 3.1% -> 29.7% and 3.1% -> 45.3%).
    assert!(before <= 0.10, "warm start already succeeds: {before}");
    assert!(
        after >= before + 0.15,
        "RL did not lift held-out success enough: {before} -> {after}"
    );
}
