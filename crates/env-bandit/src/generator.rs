//! Which arm is which, and how each is described, drawn from the task RNG.

use agentrl_env_core::Split;
use rand::Rng;

/// Name pairs of the train and validation splits (RAGEN trains on Phoenix / Dragon).
pub const TRAIN_PAIRS: &[(&str, &str)] = &[
    ("Phoenix", "Dragon"),
    ("Falcon", "Tortoise"),
    ("Lantern", "Comet"),
    ("Oak", "Lightning"),
    ("Harbor", "Volcano"),
];

/// Name pairs held out for the test split: never seen in training.
pub const TEST_PAIRS: &[(&str, &str)] = &[
    ("Anchor", "Meteor"),
    ("Willow", "Tempest"),
    ("Granite", "Aurora"),
];

/// Plain-text descriptions of the safe (low) arm for the easy level; `{}` is
/// the payout. Several phrasings so that the agent must read, not pattern-match.
const LOW_PLAIN: &[&str] = &[
    "pays exactly {} every time it is pulled",
    "always gives a small, certain reward of {}",
    "is perfectly steady: each pull returns {}, never more, never less",
];

/// Symbolic descriptions for the hard level: no numbers, only what the arm
/// stands for (as RAGEN's bandit asks the agent to reason from the names).
const LOW_SYMBOLIC: &[&str] = &[
    "is said to bring a modest but reliable blessing to everyone who chooses it",
    "stands for caution: it never disappoints, yet it never dazzles",
    "is the keeper of small, steady comforts",
];
const HIGH_SYMBOLIC: &[&str] = &[
    "guards a great treasure that it grants only now and then; the bold are often turned away empty-handed",
    "stands for fortune favouring the brave: rare, dramatic windfalls whose long-run worth outshines any small certainty",
    "is fickle and fierce, yet those who keep faith in it gain far more over time than the timid do",
];

/// One drawn bandit task.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Arm names in display order (index 0 is shown as arm 1).
    pub names: [String; 2],
    /// Descriptions in display order.
    pub descriptions: [String; 2],
    /// Display index (0 or 1) of the high-expectation (risky) arm.
    pub high: usize,
}

/// Draw a task: the name pair (from the split's pool), which name is the
/// high arm, the display order and the phrasing. `symbolic` selects the hard
/// level's number-free descriptions.
pub fn draw<R: Rng>(
    rng: &mut R,
    split: Split,
    symbolic: bool,
    low_reward: f64,
    high_reward: f64,
    high_prob: f64,
) -> Task {
    let pool = match split {
        Split::Train | Split::Val => TRAIN_PAIRS,
        Split::Test => TEST_PAIRS,
    };
    let (a, b) = pool[rng.random_range(0..pool.len())];
    let swap_roles = rng.random::<bool>();
    let (high_name, low_name) = if swap_roles { (b, a) } else { (a, b) };
    let (low_desc, high_desc) = if symbolic {
        (
            LOW_SYMBOLIC[rng.random_range(0..LOW_SYMBOLIC.len())].to_string(),
            HIGH_SYMBOLIC[rng.random_range(0..HIGH_SYMBOLIC.len())].to_string(),
        )
    } else {
        let pct = format!("{}", (high_prob * 100.0 * 100.0).round() / 100.0);
        // Three phrasings of the risky arm, chosen like the safe arm's.
        let high = match rng.random_range(0..3) {
            0 => format!("pays {high_reward} with a {pct}% chance and nothing otherwise"),
            1 => format!("is a gamble: {pct}% of pulls return {high_reward}, the rest return 0"),
            _ => {
                format!("usually gives nothing, but sometimes (a {pct}% chance) pays {high_reward}")
            }
        };
        let low =
            LOW_PLAIN[rng.random_range(0..LOW_PLAIN.len())].replace("{}", &low_reward.to_string());
        (low, high)
    };
    let high_first = rng.random::<bool>();
    let high = if high_first { 0 } else { 1 };
    let mut names = [low_name.to_string(), low_name.to_string()];
    let mut descriptions = [low_desc.clone(), low_desc];
    names[high] = high_name.to_string();
    descriptions[high] = high_desc;
    Task {
        names,
        descriptions,
        high,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn test_split_uses_only_held_out_pairs() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let train: Vec<&str> = TRAIN_PAIRS.iter().flat_map(|(a, b)| [*a, *b]).collect();
        for _ in 0..200 {
            let t = draw(&mut rng, Split::Test, false, 0.1, 1.0, 0.25);
            assert!(t.names.iter().all(|n| !train.contains(&n.as_str())));
            let t = draw(&mut rng, Split::Val, false, 0.1, 1.0, 0.25);
            assert!(t.names.iter().all(|n| train.contains(&n.as_str())));
        }
    }

    #[test]
    fn roles_and_order_are_both_drawn() {
        let mut rng = ChaCha8Rng::seed_from_u64(10);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..400 {
            let t = draw(&mut rng, Split::Train, false, 0.1, 1.0, 0.25);
            if t.names.contains(&"Phoenix".to_string()) {
                seen.insert((t.names[t.high].clone(), t.high));
            }
        }
        // Phoenix and Dragon each appear as the high arm, in both positions.
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    #[test]
    fn easy_descriptions_state_the_payouts() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for _ in 0..50 {
            let t = draw(&mut rng, Split::Train, false, 0.1, 1.0, 0.25);
            assert!(t.descriptions[t.high].contains("25%"));
            assert!(t.descriptions[1 - t.high].contains("0.1"));
        }
    }
}
