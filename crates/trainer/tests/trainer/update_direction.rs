//! The policy-gradient update moves probability the right way: after one
//! update, replies that scored above their group's mean are more likely and
//! those below are less likely. Checks the sign of the loss, the alignment of
//! advantages with the shifted log-prob frame, and the loss mask, end to end
//! through the trainer. And `critic.lr` is the value head's learning rate, and
//! the paths the default run does not take (GAE, the KL loss, KL in the
//! reward, several epochs over mini-batches) each do what they say.

use agentrl_env_core::{Split, TaskSpec};
use agentrl_rollout::{run_rollouts, Trajectory};
use agentrl_trainer::batch::ModelRows;
use agentrl_trainer::ppo::UpdateStats;
use agentrl_trainer::trainer::rl_learning_rates;
use agentrl_trainer::{sft, LocalPolicy, Silent, Trainer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::common;

/// What this test changes in `configs/smoke.toml`: groups of 8, no warm start,
/// one update with the whole batch as one mini-batch.
const OVERRIDES: &[&str] = &[
    "name=update-direction",
    "sft.demos=0",
    // An untrained model's replies are all malformed, and by default a malformed
    // turn gets no positive credit; this test fakes the outcomes, so it credits them.
    "algorithm.credit_malformed_turns=true",
    "actor.lr=1e-3",
    "actor.ppo_mini_batch_size=64",
    "rollout.n=8",
    "trainer.total_training_steps=1",
];

/// Summed log-probability of each trajectory's policy tokens (each of its
/// sequences scored on its own).
fn policy_logprob(t: &Trainer, trajs: &[Trajectory]) -> Vec<f32> {
    let model_rows = ModelRows::of(trajs.iter());
    let out = t.model.sequence_logprobs(&model_rows.seqs).unwrap();
    let rows = model_rows.join(out.logprobs.to_vec2::<f32>().unwrap());
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

/// A trainer on the smoke config with `OVERRIDES`, then `overrides`, in a
/// fresh directory.
fn start(overrides: &[&str]) -> (tempfile::TempDir, Trainer) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::smoke_with(&[OVERRIDES, overrides].concat());
    let t = Trainer::start(cfg, &dir.path().join("run"), &mut Silent).unwrap();
    (dir, t)
}

/// Two groups of 8 rollouts of the run's env where, whatever was played,
/// every other sample of each group "succeeds".
fn rollouts(t: &Trainer) -> Vec<Trajectory> {
    let mut envs = Vec::new();
    let mut groups = Vec::new();
    for g in 0..2 {
        let spec = TaskSpec::new(&t.cfg.env.name, Split::Train, "easy", g as u64);
        for _ in 0..8 {
            envs.push(agentrl_envs::make_env(&spec, &Default::default()).unwrap());
            groups.push(g);
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut trajs = {
        let mut policy = LocalPolicy::new(&t.model);
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
    for (i, x) in trajs.iter_mut().enumerate() {
        let last = x.turns.last_mut().expect("every rollout has a turn");
        last.env_reward = if i % 2 == 0 { 1.0 } else { 0.0 };
        last.penalty = 0.0;
    }
    trajs
}

#[test]
fn update_raises_above_mean_replies_and_lowers_the_rest() {
    update_moves_the_right_way(&[]);
}

#[test]
fn update_moves_the_right_way_with_a_turn_per_sequence() {
    // Three-turn FrozenLake episodes, each turn its own sequence: the
    // advantages reach every turn's tokens through the per-sequence rows.
    update_moves_the_right_way(&[
        "env.name=frozenlake",
        "rollout.max_turns=3",
        "rollout.history_turns=1",
    ]);
}

#[test]
fn update_moves_the_right_way_through_a_lora_adapter() {
    // Only the adapter's A and B train (B starts at zero, so the first
    // gradient reaches B alone): the same direction through `W + s·B·A`.
    update_moves_the_right_way(&["lora.enabled=true", "lora.r=4", "actor.lr=1e-2"]);
}

fn update_moves_the_right_way(overrides: &[&str]) {
    let (_dir, mut t) = start(overrides);
    let trajs = rollouts(&t);
    if t.cfg.rollout.history_turns.is_some() {
        assert!(trajs
            .iter()
            .all(|x| x.sequence_ranges().len() == x.turns.len()));
        assert!(trajs.iter().any(|x| x.turns.len() > 1));
    }
    let before = policy_logprob(&t, &trajs);
    let lr = rl_learning_rates(&t.cfg, 1);
    let stats = t.update(trajs.clone(), 1, lr).unwrap();
    let after = policy_logprob(&t, &trajs);
    let delta: Vec<f32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let up: f32 = delta.iter().step_by(2).sum::<f32>() / 8.0;
    let down: f32 = delta.iter().skip(1).step_by(2).sum::<f32>() / 8.0;
    assert!(stats.grad_norm > 0.0, "the update had no gradient");
    assert!(
        up > 0.0 && down < 0.0,
        "mean change of log-prob: above-mean replies {up}, below-mean {down}"
    );
}

/// Every weight, flattened, split into (value head, the rest).
fn weights(t: &Trainer) -> (Vec<f32>, Vec<f32>) {
    let mut head = Vec::new();
    let mut rest = Vec::new();
    for (name, var) in t.model.named_vars().unwrap() {
        let flat = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        match name.starts_with("value_head.") {
            true => head.extend(flat),
            false => rest.extend(flat),
        }
    }
    (head, rest)
}

/// Largest change of any weight.
fn moved(before: &[f32], after: &[f32]) -> f32 {
    before
        .iter()
        .zip(after)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn critic_lr_sets_the_value_heads_step_and_nothing_else() {
    // One GAE update at two critic learning rates 10^4 apart, from the same
    // weights on the same rollouts: Adam's first step moves a weight by about
    // its learning rate, so the value head moves ~10^4 times further, and
    // the actor's weights move exactly alike.
    let run = |critic_lr: &str| {
        let (_dir, mut t) = start(&["algorithm.adv_estimator=gae", critic_lr]);
        let trajs = rollouts(&t);
        let (head, rest) = weights(&t);
        t.update(trajs, 1, rl_learning_rates(&t.cfg, 1)).unwrap();
        let (head_after, rest_after) = weights(&t);
        let actor_moved = moved(&rest, &rest_after);
        (moved(&head, &head_after), rest_after, actor_moved)
    };
    let (slow_head, slow_rest, slow_actor) = run("critic.lr=1e-6");
    let (fast_head, fast_rest, fast_actor) = run("critic.lr=1e-2");
    assert!(
        slow_head > 0.0 && slow_actor > 0.0,
        "{slow_head} {slow_actor}"
    );
    assert!(
        fast_head > 1000.0 * slow_head,
        "value head moved {fast_head} at lr 1e-2, {slow_head} at 1e-6"
    );
    assert_eq!(fast_actor, slow_actor);
    assert_eq!(
        fast_rest, slow_rest,
        "the actor's step does not depend on critic.lr"
    );
}

/// The update paths the default run does not take, each checked on updates
/// of the same faked rollouts: GAE with the critic, the KL loss, KL in the
/// reward, several PPO epochs over mini-batches.
fn two_updates(overrides: &[&str]) -> (UpdateStats, UpdateStats) {
    let (_dir, mut t) = start(overrides);
    let trajs = rollouts(&t);
    let first = t
        .update(trajs.clone(), 1, rl_learning_rates(&t.cfg, 1))
        .unwrap();
    let second = t.update(trajs, 2, rl_learning_rates(&t.cfg, 2)).unwrap();
    (first, second)
}

#[test]
fn gae_trains_the_critic_on_every_update() {
    let (a, b) = two_updates(&["algorithm.adv_estimator=gae"]);
    for s in [a, b] {
        assert!(s.value_loss.is_finite() && s.value_loss > 0.0, "{s:?}");
    }
}

#[test]
fn kl_loss_is_zero_against_the_reference_itself_then_grows() {
    let (a, b) = two_updates(&["actor.use_kl_loss=true", "actor.kl_loss_coef=0.1"]);
    // The first update starts from the reference (step-0) weights.
    assert!(a.kl.abs() < 1e-6, "{a:?}");
    assert!(b.kl > 0.0 && b.kl.is_finite(), "{b:?}");
}

#[test]
fn a_kl_schedule_sets_each_steps_weight() {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1e-9);
    let (_, fixed) = two_updates(&["actor.use_kl_loss=true", "actor.kl_loss_coef=0.1"]);
    let (_, plain) = two_updates(&[]);
    // Weight 0 on step 1, 0.1 from step 2: step 1 scores no reference and
    // (the policy being the reference, its KL gradient is 0 anyway) leaves
    // the weights as the fixed weight's step 1 does.
    let (a, b) = two_updates(&[
        "actor.use_kl_loss=true",
        "actor.kl_loss_coef_schedule=[0.0, 0.1]",
        "actor.kl_loss_coef_stage_steps=1",
    ]);
    assert_eq!(a.kl, 0.0, "{a:?}");
    assert!(
        b.kl > 0.0 && close(b.kl, fixed.kl),
        "{b:?} against {fixed:?}"
    );
    assert!(
        close(b.grad_norm, fixed.grad_norm),
        "{b:?} against {fixed:?}"
    );
    // 0.1 on step 1, 0 from step 2: step 2 is the update without a KL term.
    let (_, b) = two_updates(&[
        "actor.use_kl_loss=true",
        "actor.kl_loss_coef_schedule=[0.1, 0.0]",
        "actor.kl_loss_coef_stage_steps=1",
    ]);
    assert_eq!(b.kl, 0.0, "{b:?}");
    assert!(
        close(b.grad_norm, plain.grad_norm),
        "{b:?} against {plain:?}"
    );
    assert!(
        !close(plain.grad_norm, fixed.grad_norm),
        "{plain:?} {fixed:?}"
    );
}

#[test]
fn kl_in_the_reward_changes_the_update_once_the_policy_moved() {
    let (plain_a, plain_b) = two_updates(&[]);
    let (kl_a, kl_b) = two_updates(&["algorithm.use_kl_in_reward=true", "algorithm.kl_coef=0.5"]);
    // First update: the policy is the reference, the KL is 0, nothing differs.
    assert_eq!(plain_a.pg_loss, kl_a.pg_loss);
    assert_eq!(plain_a.grad_norm, kl_a.grad_norm);
    // Second: the penalty moves the advantages.
    assert_ne!(plain_b.pg_loss, kl_b.pg_loss);
}

#[test]
fn several_epochs_over_minibatches_move_off_the_sampling_policy() {
    let (single, _) = two_updates(&[]);
    // One update on fresh samples: the ratio is 1 everywhere.
    assert_eq!((single.approx_kl, single.clip_fraction), (0.0, 0.0));
    let (multi, _) = two_updates(&["actor.ppo_epochs=3", "actor.ppo_mini_batch_size=4"]);
    assert!(multi.approx_kl.abs() > 0.0, "{multi:?}");
    assert!((0.0..=1.0).contains(&multi.clip_fraction), "{multi:?}");
}

#[test]
fn micro_batches_add_up_to_the_mini_batch_under_every_loss_mode() {
    // Three-turn FrozenLake, a sequence per turn, with every loss term on:
    // the same two updates taken whole and in micro-batches of 3
    // trajectories (6 passes, the last of 1) give the same figures, the
    // second update's read after the first's optimizer step.
    for agg in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] {
        let agg = format!("actor.loss_agg_mode={agg}");
        let base = [
            "env.name=frozenlake",
            "rollout.max_turns=3",
            "rollout.history_turns=1",
            "algorithm.adv_estimator=gae",
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef=0.1",
            "actor.entropy_coeff=0.01",
            "actor.ppo_epochs=2",
            agg.as_str(),
        ];
        let whole = two_updates(&base);
        let parts = two_updates(&[&base[..], &["actor.ppo_micro_batch_size=3"]].concat());
        for (w, p) in [(whole.0, parts.0), (whole.1, parts.1)] {
            let figures = |s: &UpdateStats| {
                [
                    s.entropy,
                    s.kl,
                    s.approx_kl,
                    s.clip_fraction,
                    s.grad_norm,
                    s.pg_loss,
                    s.value_loss,
                ]
            };
            for (a, b) in figures(&w).into_iter().zip(figures(&p)) {
                assert!(
                    (a - b).abs() <= 1e-4 * a.abs().max(1e-3),
                    "{agg}: whole {w:?}\nmicro-batched {p:?}"
                );
            }
            assert!(w.grad_norm > 0.0 && w.value_loss > 0.0, "{w:?}");
        }
        assert!(whole.1.kl > 0.0, "{:?}", whole.1);
    }
}

#[test]
fn warm_start_micro_batches_add_up_to_the_batch() {
    // The warm start's loss and every gradient, from one pass over 16
    // rollouts and from passes of 3 (the last of 1).
    let (_dir, t) = start(&["env.name=frozenlake", "rollout.max_turns=3"]);
    let trajs = rollouts(&t);
    let batch: Vec<&Trajectory> = trajs.iter().collect();
    let vars = t.model.trainable_vars().unwrap();
    let (whole_loss, whole) = sft::batch_nll_grads(&t.model, &batch, 16, &vars).unwrap();
    let (parts_loss, parts) = sft::batch_nll_grads(&t.model, &batch, 3, &vars).unwrap();
    let (whole, parts) = (whole.unwrap(), parts.unwrap());
    assert!((whole_loss - parts_loss).abs() <= 1e-5 * whole_loss.abs());
    let mut largest = 0f32;
    for v in &vars {
        let a = whole.get(v.as_tensor()).unwrap();
        let b = parts.get(v.as_tensor()).unwrap();
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        let scale = a.abs().unwrap().max_all().unwrap();
        let (diff, scale) = (
            diff.to_scalar::<f32>().unwrap(),
            scale.to_scalar::<f32>().unwrap(),
        );
        assert!(diff <= 1e-4 * scale.max(1e-6), "{diff} against {scale}");
        largest = largest.max(scale);
    }
    assert!(largest > 0.0, "no gradient at all");
}
