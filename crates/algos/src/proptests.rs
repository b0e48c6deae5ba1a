//! Property tests: estimators stay finite for any finite rewards.

use proptest::prelude::*;

use crate::advantage::*;

fn finite(rows: &[Vec<f32>]) -> bool {
    rows.iter().flatten().all(|x| x.is_finite())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn advantages_are_finite_for_any_finite_rewards(
        scores in prop::collection::vec(-1e6f32..1e6, 1..24),
        n_groups in 1usize..6,
        gamma in 0.0f32..=1.0,
        lam in 0.0f32..=1.0,
        mask_bits in prop::collection::vec(any::<bool>(), 24),
    ) {
        let ids: Vec<usize> = (0..scores.len()).map(|i| i % n_groups).collect();
        for norm in [true, false] {
            let a = grpo(&scores, &ids, norm, GRPO_EPS).unwrap();
            prop_assert!(a.iter().all(|x| x.is_finite()));
        }
        prop_assert!(rloo(&scores, &ids).unwrap().iter().all(|x| x.is_finite()));

        // One token row per score: rewards on policy tokens only.
        let masks: Vec<Vec<f32>> = scores
            .iter()
            .enumerate()
            .map(|(i, _)| (0..4).map(|t| if mask_bits[(i + t) % 24] || t == 3 { 1.0 } else { 0.0 }).collect())
            .collect();
        let rewards: Vec<Vec<f32>> = scores
            .iter()
            .zip(&masks)
            .map(|(&s, m)| m.iter().enumerate().map(|(t, &m)| if t == 3 { s } else { s * 0.01 * m }).collect())
            .collect();
        let values: Vec<Vec<f32>> = rewards.iter().map(|r| r.iter().map(|x| x * 0.5).collect()).collect();
        prop_assert!(finite(&reinforce_plus_plus(&rewards, &masks, gamma).unwrap()));
        let out = gae(&rewards, &values, &masks, gamma, lam, true).unwrap();
        prop_assert!(finite(&out.advantages) && finite(&out.returns));
        let turn_ids: Vec<Vec<i32>> = masks
            .iter()
            .map(|m| m.iter().enumerate().map(|(t, &m)| if m == 1.0 { (t / 2) as i32 } else { -1 }).collect())
            .collect();
        let cfg = BiLevelGaeConfig { gamma, lam, turn_gamma: gamma, turn_lam: lam, whiten: true };
        let out = gae_bilevel(&rewards, &values, &turn_ids, &cfg).unwrap();
        prop_assert!(finite(&out.advantages) && finite(&out.returns));
        let keys: Vec<Vec<u64>> = rewards.iter().map(|r| (0..r.len() as u64).map(|k| k % 2).collect()).collect();
        prop_assert!(finite(&gigpo(&scores, &ids, &keys, &rewards, gamma, 1.0, true).unwrap()));
    }
}
