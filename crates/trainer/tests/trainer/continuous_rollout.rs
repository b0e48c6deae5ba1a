//! Rollouts by the local model with continuous batching: under greedy
//! decoding (no draws to reorder) they play the lock-step turns'
//! trajectories, and the KV caches serve the same prompt tokens.

use agentrl_env_core::{Split, TaskSpec};
use agentrl_rollout::{run_rollouts, RolloutConfig, Trajectory};
use agentrl_trainer::{LocalPolicy, PromptTokens, Silent, Trainer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::common;

/// Multi-turn FrozenLake, a 2-layer model, no warm start, greedy replies.
const OVERRIDES: &[&str] = &[
    "name=continuous",
    "env.name=frozenlake",
    "model.num_hidden_layers=2",
    "sft.demos=0",
    "rollout.n=3",
    "rollout.max_turns=4",
    "rollout.response_length=6",
    "rollout.temperature=0.0",
    "trainer.total_training_steps=1",
];

/// Six episodes (2 tasks × 3 samples) by the model under `rollout`.
fn play(t: &Trainer, rollout: &RolloutConfig, reuse: bool) -> (Vec<Trajectory>, PromptTokens) {
    let mut envs = Vec::new();
    let mut groups = Vec::new();
    for g in 0..2u64 {
        let spec = TaskSpec::new("frozenlake", Split::Train, "easy", g);
        for _ in 0..3 {
            envs.push(agentrl_envs::make_env(&spec, &Default::default()).unwrap());
            groups.push(g as usize);
        }
    }
    let mut policy = LocalPolicy::with_cache_reuse(&t.model, reuse);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let trajs = run_rollouts(&mut policy, &t.tokenizer, envs, &groups, rollout, &mut rng).unwrap();
    (trajs, policy.prompt_tokens())
}

#[test]
fn greedy_continuous_rollouts_play_the_lockstep_trajectories() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::smoke_with(OVERRIDES);
    let t = Trainer::start(cfg, &dir.path().join("run"), &mut Silent).unwrap();
    assert!(t.model.batches_continuously());
    let lockstep = t.cfg.rollout.clone();
    let continuous = RolloutConfig {
        continuous_batching: true,
        ..lockstep.clone()
    };
    let (want, want_used) = play(&t, &lockstep, true);
    assert!(
        want.iter().any(|x| x.turns.len() > 1),
        "the test needs multi-turn episodes"
    );
    for reuse in [true, false] {
        let (got, used) = play(&t, &continuous, reuse);
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.tokens, b.tokens, "reuse {reuse}, trajectory {i}: tokens");
            assert_eq!(a.loss_mask, b.loss_mask, "trajectory {i}: loss mask");
            assert_eq!(a.turns.len(), b.turns.len(), "trajectory {i}: turns");
        }
        // The same prompts, served from the caches as lock-step serves them.
        let total = want_used.reused + want_used.encoded;
        assert_eq!(used.reused + used.encoded, total, "reuse {reuse}");
        match reuse {
            true => assert_eq!(used, want_used),
            false => assert_eq!(used.reused, 0),
        }
    }
}
