//! `agentrl study generalisation` end to end at the smallest size (a d 32
//! model, one RL step per arm, two tasks per cell): every arm trains, every
//! policy is evaluated, and the report has the matrix, the forgetting
//! table, the failure-label table and its figures, in Markdown and in one
//! self-contained HTML page.

use crate::common::{agentrl_line, ok_stdout};

/// The smallest study: d 32, one RL step an arm, two tasks a cell.
const STUDY: &str = "study generalisation --quick --tasks 2 --k 1 --quiet \
    model.hidden_size=32 model.intermediate_size=64 sft.demos=8 sft.epochs=1 \
    trainer.total_training_steps=1 trainer.test_freq=0 trainer.val_tasks=2 \
    rollout.env_groups=2 rollout.n=2";

#[test]
fn the_study_trains_every_arm_and_reports_every_question() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("study");
    ok_stdout(&agentrl_line(STUDY, &["--out", out.to_str().unwrap()]));
    for arm in [
        "easy-only",
        "hard-only",
        "easy-to-hard",
        "valid-actions",
        "scaling-inter",
        "mixture",
        "sequential",
    ] {
        assert!(out.join(arm).join("summary.json").is_file(), "{arm}");
    }
    let study: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("study.json")).unwrap()).unwrap();
    assert_eq!(study["experiments"].as_array().unwrap().len(), 6);
    // The held-in/held-out matrix: the start and all seven trained policies.
    assert_eq!(study["experiments"][1]["rows"].as_array().unwrap().len(), 8);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for part in [
        "## Held-in and held-out environments",
        "| Δ frozenlake/easy only − start |",
        "| forgetting (best earlier − end) |",
        "## Failure labels",
        "confirmation_bias",
        "## Learning curves",
        "## Turns and tokens over training",
    ] {
        assert!(md.contains(part), "report.md lacks {part:?}");
    }
    let figures = md.matches("](figures/").count();
    assert!(figures >= 3, "{figures} figures");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(html.matches("data:image/png;base64,").count(), figures);
    assert!(
        !html.contains("src=\"figures/"),
        "the page needs no other file"
    );
}
