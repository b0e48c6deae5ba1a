//! Rollouts that keep each dialogue's KV cache between turns play exactly the
//! trajectories that re-encoding every turn from the first token plays: same
//! tokens, masks and turns, log-probs equal within float tolerance.

use agentrl_env_core::{Split, TaskSpec};
use agentrl_rollout::{run_rollouts, Generation, Policy, PolicyFn, SamplingParams, Trajectory};
use agentrl_trainer::{LocalPolicy, PromptTokens, Silent, Trainer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::common;

/// What this test changes in `configs/smoke.toml`: multi-turn FrozenLake, a
/// 2-layer model, no warm start, sampling at temperature 1.
const OVERRIDES: &[&str] = &[
    "name=cache-reuse",
    "env.name=frozenlake",
    "model.num_hidden_layers=2",
    "sft.demos=0",
    "rollout.n=3",
    "rollout.max_turns=4",
    "rollout.response_length=6",
    "rollout.temperature=1.0",
    "trainer.total_training_steps=1",
];

/// Six multi-turn FrozenLake episodes (2 tasks × 3 samples) by `policy`.
fn play(t: &Trainer, policy: LocalPolicy<'_>) -> (Vec<Trajectory>, Vec<Generation>, PromptTokens) {
    let mut envs = Vec::new();
    let mut groups = Vec::new();
    for g in 0..2u64 {
        let spec = TaskSpec::new("frozenlake", Split::Train, "easy", g);
        for _ in 0..3 {
            envs.push(agentrl_envs::make_env(&spec, &Default::default()).unwrap());
            groups.push(g as usize);
        }
    }
    // Every generation the policy hands out, recorded on the way.
    let mut inner = policy;
    let mut generations = Vec::new();
    let mut recording = PolicyFn::new(
        |prompts: &[Vec<u32>], params: &SamplingParams, rng: &mut ChaCha8Rng| {
            let gens = inner.generate(prompts, params, rng)?;
            generations.extend(gens.iter().cloned());
            Ok(gens)
        },
    );
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let trajs = run_rollouts(
        &mut recording,
        &t.tokenizer,
        envs,
        &groups,
        &t.cfg.rollout,
        &mut rng,
    )
    .unwrap();
    let used = inner.prompt_tokens();
    (trajs, generations, used)
}

#[test]
fn cached_rollouts_equal_full_re_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::smoke_with(OVERRIDES);
    let t = Trainer::start(cfg, &dir.path().join("run"), &mut Silent).unwrap();
    let (fresh, fresh_gens, fresh_used) = play(&t, LocalPolicy::without_cache_reuse(&t.model));
    let (cached, cached_gens, cached_used) = play(&t, LocalPolicy::new(&t.model));
    assert!(
        fresh.iter().any(|x| x.turns.len() > 1),
        "the test needs multi-turn episodes"
    );
    assert_eq!(fresh.len(), cached.len());
    for (i, (a, b)) in fresh.iter().zip(&cached).enumerate() {
        assert_eq!(a.tokens, b.tokens, "trajectory {i}: tokens");
        assert_eq!(a.loss_mask, b.loss_mask, "trajectory {i}: loss mask");
        let replies = |x: &Trajectory| x.turns.iter().map(|t| t.reply.clone()).collect::<Vec<_>>();
        assert_eq!(replies(a), replies(b), "trajectory {i}: replies");
    }
    assert_eq!(fresh_gens.len(), cached_gens.len());
    for (a, b) in fresh_gens.iter().zip(&cached_gens) {
        assert_eq!(a.tokens, b.tokens);
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "log-prob {x} re-encoded, {y} cached");
        }
    }
    // Same prompts either way; the cached path encoded only what turns added.
    assert_eq!(fresh_used.reused, 0);
    assert_eq!(fresh_used.encoded, cached_used.encoded + cached_used.reused);
    assert!(
        cached_used.reused > cached_used.encoded,
        "later turns should come mostly from the cache: {cached_used:?}"
    );
}
