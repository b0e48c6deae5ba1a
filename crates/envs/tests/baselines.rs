//! The expert and random-play baselines of the envs that list their
//! available actions (ALFWorld, BabyAI, TextCraft): the expert solves at
//! least 99% of the tasks of every difficulty, random play stays far below.

use agentrl_env_core::testing;
use agentrl_envs::{find, make_env, Env, EnvParams, Split, TaskSpec};
use rand::SeedableRng;

/// Env, most random successes in 200 episodes per level, random seed.
const RANDOM_BASELINES: [(&str, usize, u64); 3] = [
    ("alfworld", 150, 11),
    ("babyai", 190, 5),
    ("textcraft", 190, 7),
];

/// The env `name` of `difficulty` and `seed` in the train split, default params.
fn maker(name: &'static str) -> impl Fn(&str, u64) -> Box<dyn Env> {
    move |difficulty, seed| {
        let spec = TaskSpec::new(name, Split::Train, difficulty, seed);
        make_env(&spec, &EnvParams::new()).unwrap_or_else(|e| panic!("{spec}: {e}"))
    }
}

#[test]
fn expert_solves_at_least_99_percent_per_difficulty() {
    for (name, _, _) in RANDOM_BASELINES {
        let difficulties = find(name).unwrap().difficulties;
        testing::assert_expert_solves(name, difficulties, maker(name), 200, 198);
    }
}

/// Prints the random-policy baseline (uniform over available actions) and
/// steps/s; asserts only that random play is far below the expert.
#[test]
fn random_policy_baseline_and_throughput() {
    for (name, max_successes, seed) in RANDOM_BASELINES {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let levels = ["easy", "medium", "hard"];
        testing::assert_random_play_below(
            name,
            &levels,
            maker(name),
            (200, max_successes),
            &mut rng,
        );
    }
}
