//! Perception pre-training and the perception updates between RL steps in
//! a real (tiny) FrozenLake run: the pre-training lowers the loss of
//! reading held-out states, every RL step logs its perception updates, and
//! a resumed run repeats them exactly (the examples are rebuilt from the
//! config or from the step's rollouts, not saved), whichever states those
//! updates read (`actor.perception_states`).

use serde_json::Value;

use crate::common::{tiny_frozenlake, whole_and_resumed};

const PERCEIVING: &str = "name=perception-test env.params.is_slippery=false \
    rollout.max_turns=3 rollout.response_length=24 sft.perceive=true \
    sft.perception_steps=40 sft.perception_tasks=16 sft.perception_batch_size=8 \
    sft.perception_lr=3e-3 actor.perception_steps_per_update=2 \
    trainer.total_training_steps=3";

#[test]
fn perception_is_learnt_before_rl_kept_during_it_and_replayed_on_resume() {
    perceive_then_keep_reading("walks");
}

#[test]
fn perception_updates_on_the_rollouts_states_are_logged_and_replayed_on_resume() {
    perceive_then_keep_reading("rollouts");
}

fn perceive_then_keep_reading(states: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{PERCEIVING} actor.perception_states={states}");
    let (whole, resumed) = whole_and_resumed(tiny_frozenlake(&config), 1, dir.path());
    let pre = whole
        .iter()
        .find(|r| r["kind"] == "perception")
        .expect("a perception line in metrics.jsonl");
    let before = pre["held_out_loss_before"].as_f64().unwrap();
    let after = pre["held_out_loss_after"].as_f64().unwrap();
    assert!(after < 0.7 * before, "held-out loss {before} -> {after}");
    let steps: Vec<&Value> = whole
        .iter()
        .filter(|r| r.get("kept_groups").is_some())
        .collect();
    assert_eq!(steps.len(), 3, "{whole:?}");
    for s in &steps {
        let loss = s["perception_loss"]
            .as_f64()
            .expect("a perception loss every step");
        assert!(loss.is_finite() && loss > 0.0, "{s}");
    }
    // Steps 2 and 3 of the resumed run are those of the whole run.
    assert_eq!(whole[whole.len() - 2..], resumed[resumed.len() - 2..]);
}

/// Perception updates on the rollouts' states of an env without a
/// perception stop the run at its first step with an error naming the key.
#[test]
fn rollout_perception_on_an_env_without_one_is_an_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::common::smoke_with(&[
        "actor.perception_steps_per_update=1",
        "actor.perception_states=rollouts",
        "trainer.total_training_steps=1",
    ]);
    let err = agentrl_trainer::Trainer::start(cfg, dir.path(), &mut agentrl_trainer::Silent)
        .and_then(|mut t| t.train(&mut agentrl_trainer::Silent).map(|_| ()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("actor.perception_states") && err.contains("no perception"),
        "{err}"
    );
}

/// Showing the reading in the prompt on an env that has none (the smoke
/// config's bandit) stops the run before anything is written, naming the
/// key.
#[test]
fn showing_readings_of_an_env_without_one_is_an_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::common::smoke_with(&["rollout.show_perception=true"]);
    let err = agentrl_trainer::Trainer::start(cfg, dir.path(), &mut agentrl_trainer::Silent)
        .err()
        .expect("a run that cannot show readings does not start")
        .to_string();
    assert!(
        err.contains("rollout.show_perception") && err.contains("no reading"),
        "{err}"
    );
    // Nothing written: the same directory takes the corrected run.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
