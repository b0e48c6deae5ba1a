//! RL measurably improves a tiny policy: a seeded FrozenLake run whose warm
//! start teaches only the reply format (every demonstrated move is random),
//! so whatever the agent knows about reaching the goal afterwards it learnt
//! from reward. Held-out validation seeds, same seeds before and after.

use agentrl_trainer::{Silent, TrainConfig, Trainer};

const CONFIG: &str = r#"
name = "learning-test"

[env]
name = "frozenlake"
difficulty = "easy"

[env.params]
is_slippery = false

[model]
vocab_size = 384
hidden_size = 64
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
intermediate_size = 192

[sft]
demos = 128
epochs = 2
lr = 2e-3
expert_noise = 1.0

[actor]
lr = 1e-3
lr_warmup_steps = 5

[rollout]
n = 8
env_groups = 4
max_turns = 8
max_actions_per_turn = 1
max_actions = 8
response_length = 16
rollout_filter_ratio = 0.5

[trainer]
total_training_steps = 24
test_freq = 0
save_freq = 0
val_tasks = 48
val_temperature = 0.5
seed = 0
"#;

#[test]
fn rl_lifts_held_out_success_over_a_format_only_warm_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig::from_toml(CONFIG, &[]).unwrap();
    let mut trainer = Trainer::start(cfg, &dir.path().join("run"), &mut Silent).unwrap();
    let summary = trainer.train(&mut Silent).unwrap();
    let (before, after) = (summary.before.success_rate, summary.after.success_rate);
    eprintln!(
        "frozenlake held-out success {before:.3} -> {after:.3} in {:.0}s",
        summary.wall_seconds
    );
    assert!(
        after >= before + 0.15,
        "RL did not lift held-out success: {before:.3} -> {after:.3}"
    );
}
