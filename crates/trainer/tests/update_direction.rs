//! The policy-gradient update moves probability the right way: after one
//! update, replies that scored above their group's mean are more likely and
//! those below are less likely. Checks the sign of the loss, the alignment of
//! advantages with the shifted log-prob frame, and the loss mask, end to end
//! through the trainer.

use agentrl_env_core::{Split, TaskSpec};
use agentrl_rollout::{run_rollouts, Trajectory};
use agentrl_trainer::{LocalPolicy, Silent, StepMetrics, TrainConfig, Trainer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const CONFIG: &str = r#"
name = "update-direction"
[env]
name = "bandit"
[model]
vocab_size = 320
hidden_size = 32
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
intermediate_size = 64
[sft]
demos = 0
[actor]
lr = 1e-3
ppo_mini_batch_size = 64
[rollout]
n = 8
env_groups = 2
max_turns = 1
response_length = 8
[trainer]
total_training_steps = 0
val_tasks = 2
"#;

/// Summed log-probability of each trajectory's policy tokens.
fn policy_logprob(t: &Trainer, trajs: &[Trajectory]) -> Vec<f32> {
    let seqs: Vec<Vec<u32>> = trajs.iter().map(|x| x.tokens.clone()).collect();
    let out = t.model.sequence_logprobs(&seqs).unwrap();
    let rows = out.logprobs.to_vec2::<f32>().unwrap();
    trajs
        .iter()
        .zip(rows)
        .map(|(x, row)| {
            x.loss_mask
                .iter()
                .skip(1)
                .zip(row)
                .filter(|(&m, _)| m == 1)
                .map(|(_, lp)| lp)
                .sum()
        })
        .collect()
}

#[test]
fn update_raises_above_mean_replies_and_lowers_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig::from_toml(CONFIG, &[]).unwrap();
    let mut t = Trainer::start(cfg, &dir.path().join("run"), &mut Silent).unwrap();
    let mut envs = Vec::new();
    let mut groups = Vec::new();
    for g in 0..2 {
        let spec = TaskSpec::new("bandit", Split::Train, "easy", g as u64);
        for _ in 0..8 {
            envs.push(agentrl_envs::make_env(&spec, &Default::default()).unwrap());
            groups.push(g);
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut trajs = {
        let mut policy = LocalPolicy { model: &t.model };
        run_rollouts(
            &mut policy,
            &t.tokenizer,
            envs,
            &groups,
            &t.cfg.rollout,
            &mut rng,
        )
        .unwrap()
    };
    // Arbitrary outcomes: every other sample of each group "succeeds".
    for (i, x) in trajs.iter_mut().enumerate() {
        let last = x.turns.last_mut().expect("every rollout has a turn");
        last.env_reward = if i % 2 == 0 { 1.0 } else { 0.0 };
        last.penalty = 0.0;
    }
    let before = policy_logprob(&t, &trajs);
    let mut m = StepMetrics::default();
    t.update(&trajs, 1, &mut m).unwrap();
    let after = policy_logprob(&t, &trajs);
    let delta: Vec<f32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let up: f32 = delta.iter().step_by(2).sum::<f32>() / 8.0;
    let down: f32 = delta.iter().skip(1).step_by(2).sum::<f32>() / 8.0;
    assert!(m.grad_norm > 0.0, "the update had no gradient");
    assert!(
        up > 0.0 && down < 0.0,
        "mean change of log-prob: above-mean replies {up}, below-mean {down}"
    );
}
