//! Credit reaches the move that earned it, on real FrozenLake rollouts.
//!
//! A scripted policy plays Down or Right at random on 4×4 maps (not
//! slippery), and the trainer's own advantage computation (batch masks,
//! estimator, turn-to-token mapping) scores the turns. Grouped by what the
//! player faced, the mean advantage of each move's policy tokens must say
//! what the map says: a step into a hole is worse than the step beside it,
//! and on the bottom row, where Down stays in place, Right is better.
//! Advantages that reach another trajectory's row make these means equal;
//! a step advantage with the wrong sign reverses the step part's. (A shift
//! by one turn goes unseen: a random walk's consecutive returns are too
//! alike.) These figures are also why the default run's failure to read
//! the map is not a credit bug: the signal is there, per situation.

use std::collections::BTreeMap;

use agentrl_algos::AdvEstimator;
use agentrl_env_core::{EnvParams, Split, TaskSpec};
use agentrl_rollout::{run_rollouts, Generation, PolicyFn, SamplingParams, Trajectory};
use agentrl_trainer::batch::{PpoBatch, Scoring};
use agentrl_trainer::config::AlgorithmSection;
use agentrl_trainer::{advantages, Silent, Trainer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common;

/// What the player faces before a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Situation {
    /// Not on the bottom row, a hole below, ice to the right.
    HoleBelow,
    /// Not on the bottom row, ice below, a hole to the right.
    HoleRight,
    /// On the bottom row with ice to the right: Down stays in place.
    BottomRow,
}

/// The situation of the player on `observation` (rows of `P _ O G`), if it
/// is one of the three the test compares.
fn situation(observation: &str) -> Option<Situation> {
    let rows: Vec<Vec<char>> = observation.lines().map(|l| l.chars().collect()).collect();
    let (i, j) = rows
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.iter().position(|&c| c == 'P').map(|j| (i, j)))?;
    let below = rows.get(i + 1).map(|r| r[j]);
    let right = rows[i].get(j + 1).copied();
    match (below, right) {
        (Some('O'), Some('_')) => Some(Situation::HoleBelow),
        (Some('_'), Some('O')) => Some(Situation::HoleRight),
        (None, Some('_')) => Some(Situation::BottomRow),
        _ => None,
    }
}

/// 64 maps × 8 episodes of a policy that answers Down or Right with equal odds.
fn random_walks(t: &Trainer) -> Vec<Trajectory> {
    let mut params = EnvParams::new();
    params.insert("is_slippery".into(), false.into());
    let (mut envs, mut groups) = (Vec::new(), Vec::new());
    for g in 0..64u64 {
        let spec = TaskSpec::new("frozenlake", Split::Train, "easy", g);
        for _ in 0..8 {
            envs.push(agentrl_envs::make_env(&spec, &params).unwrap());
            groups.push(g as usize);
        }
    }
    let reply = |mv: &str| {
        let mut tokens = t
            .tokenizer
            .encode(&format!("<think></think><answer>{mv}</answer>"))
            .unwrap();
        tokens.push(t.tokenizer.im_end_id());
        tokens
    };
    let (down, right) = (reply("Down"), reply("Right"));
    let mut policy = PolicyFn::new(
        |prompts: &[Vec<u32>], _: &SamplingParams, rng: &mut ChaCha8Rng| {
            Ok(prompts
                .iter()
                .map(|_| {
                    let tokens = if rng.random_bool(0.5) { &down } else { &right }.clone();
                    Generation {
                        logprobs: vec![-0.7; tokens.len()],
                        tokens,
                        stopped: true,
                    }
                })
                .collect())
        },
    );
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    run_rollouts(
        &mut policy,
        &t.tokenizer,
        envs,
        &groups,
        &t.cfg.rollout,
        &mut rng,
    )
    .unwrap()
}

/// A trainer on the smoke config moved to 8-turn FrozenLake, then `overrides`.
fn trainer(dir: &tempfile::TempDir, overrides: &[&str]) -> Trainer {
    let base = [
        "name=credit",
        "env.name=frozenlake",
        "sft.demos=0",
        "rollout.max_turns=8",
        "rollout.max_actions_per_turn=1",
        "rollout.max_actions=8",
        "rollout.response_length=16",
    ];
    let cfg = common::smoke_with(&[&base[..], overrides].concat());
    Trainer::start(cfg, &dir.path().join("run"), &mut Silent).unwrap()
}

/// Mean advantage of every (situation, move) under `alg`, read from the
/// policy tokens of each turn; checks on the way that all policy tokens of
/// one turn carry one advantage.
fn mean_advantages(batch: &PpoBatch, alg: &AlgorithmSection) -> Means {
    let targets = advantages::compute(alg, &batch.trajs, &batch.masks, None, None).unwrap();
    let mut sums: BTreeMap<(Situation, String), (f64, usize)> = BTreeMap::new();
    for (x, row) in batch.trajs.iter().zip(&targets.advantages) {
        for turn in &x.turns {
            // Row entry p - 1 is the advantage of token p (the shifted frame).
            let values: Vec<f32> = (turn.start.max(1)..turn.end)
                .filter(|&p| x.loss_mask[p] == 1)
                .map(|p| row[p - 1])
                .collect();
            assert!(!values.is_empty(), "a turn without policy tokens");
            assert!(
                values.iter().all(|&v| v == values[0]),
                "one turn's tokens carry several advantages: {values:?}"
            );
            let (Some(s), [mv]) = (situation(&turn.observation), turn.actions.as_slice()) else {
                continue;
            };
            let e = sums.entry((s, mv.clone())).or_insert((0.0, 0));
            e.0 += values[0] as f64;
            e.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(k, (sum, n))| {
            assert!(n >= 20, "{k:?} met only {n} times");
            (k, sum / n as f64)
        })
        .collect()
}

type Means = BTreeMap<(Situation, String), f64>;

/// The random walks of a trainer configured by `overrides`, as its batch.
fn batch(overrides: &[&str]) -> (tempfile::TempDir, Trainer, PpoBatch) {
    let dir = tempfile::tempdir().unwrap();
    let t = trainer(&dir, overrides);
    let trajs = random_walks(&t);
    assert!(trajs.iter().any(|x| x.success) && trajs.iter().any(|x| !x.success));
    let scoring = Scoring {
        old: false,
        reference: None,
        chunk: 32,
    };
    let batch = PpoBatch::build(trajs, &t.model, &scoring).unwrap();
    (dir, t, batch)
}

/// Each move scores below the move beside it that the map favours, by `margin`.
fn check_moves(m: &Means, margin: f64, what: &str) {
    let a = |s: Situation, mv: &str| m[&(s, mv.to_string())];
    let report = format!("{what}: {m:?}");
    assert!(
        a(Situation::HoleBelow, "Down") + margin < a(Situation::HoleBelow, "Right"),
        "{report}"
    );
    assert!(
        a(Situation::HoleRight, "Right") + margin < a(Situation::HoleRight, "Down"),
        "{report}"
    );
    assert!(
        a(Situation::BottomRow, "Down") + margin / 2.0 < a(Situation::BottomRow, "Right"),
        "{report}"
    );
}

#[test]
fn grpo_credits_each_move_with_its_episode() {
    // Episode-level credit only: a step into a hole ends a failed episode,
    // so it scores below the step beside it.
    let (_dir, t, batch) = batch(&["algorithm.adv_estimator=grpo"]);
    let m = mean_advantages(&batch, &t.cfg.algorithm);
    assert!(
        m[&(Situation::HoleBelow, "Down".to_string())] < -0.1,
        "{m:?}"
    );
    check_moves(&m, 0.2, "grpo");
}

#[test]
fn gigpo_step_advantage_credits_the_move_not_only_the_episode() {
    // GiGPO = the episode's Dr.GRPO advantage + the step advantage among the
    // turns of one group on the same square. The step part alone, GiGPO minus
    // Dr.GRPO on the same batch, must favour the same moves on its own.
    let (_dir, t, batch) = batch(&[
        "algorithm.adv_estimator=gigpo",
        "algorithm.norm_adv_by_std_in_grpo=false",
        "algorithm.gamma=0.95",
    ]);
    let gigpo = mean_advantages(&batch, &t.cfg.algorithm);
    check_moves(&gigpo, 0.2, "gigpo");
    let episode_only = AlgorithmSection {
        adv_estimator: AdvEstimator::Grpo,
        ..t.cfg.algorithm.clone()
    };
    let episode = mean_advantages(&batch, &episode_only);
    let step: Means = gigpo
        .iter()
        .map(|(k, v)| (k.clone(), v - episode[k]))
        .collect();
    check_moves(&step, 0.05, "gigpo's step part");
}
