//! Rollout filtering: keep the groups the policy is most uncertain about,
//! by a fixed share (StarPO-S, [`top_std_groups`]) or by a share of the
//! batch's reward signal (RAGEN-2's SNR-adaptive filter, [`snr_groups`]).

use crate::error::{AlgoError, Result};
use crate::stats::{check_len, group_members, unbiased_std};

/// What [`top_std_groups`] kept, plus the in-group std diagnostics RAGEN logs.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupFilterResult {
    /// Ids of the kept groups, ascending.
    pub kept_groups: Vec<usize>,
    /// Per trajectory (same order as the input): true if its group is kept.
    pub kept_mask: Vec<bool>,
    /// Mean over all groups of the in-group (unbiased) std of raw scores.
    pub std_before: f32,
    /// The same mean over the kept groups only.
    pub std_after: f32,
}

/// StarPO-S filter (RAGEN, arXiv 2504.20073): rank groups by the unbiased
/// std of their members' **raw** trajectory scores and keep the top
/// `ceil(keep_ratio × n_groups)` groups (at least one).
///
/// ```text
/// s_g  = std_unbiased({ R_i : group_ids[i] = g })     (0 for a singleton)
/// keep = the k groups with the largest s_g, k = max(1, ceil(keep_ratio · n_groups))
/// ```
///
/// Ties in `s_g` are broken by the smaller group id, so the result is
/// deterministic. `keep_ratio = 1` keeps every group. The product
/// `keep_ratio · n_groups` is rounded up after removing a 1e-6 tolerance so
/// that e.g. 0.3 × 10 keeps 3 groups, not 4 (0.3 · 10 = 3.0000000000000004
/// in binary floating point).
///
/// **Pitfall (RAGEN):** pass the raw environment scores, before format
/// penalties are folded in and before any GRPO normalisation. RAGEN's code
/// reads scores after normalisation was written into the same tensor, where
/// every non-degenerate group has std ≈ 1 and the ranking is meaningless.
///
/// # Errors
/// Length mismatch; [`AlgoError::InvalidParam`] unless `0 < keep_ratio <= 1`.
pub fn top_std_groups(
    raw_scores: &[f32],
    group_ids: &[usize],
    keep_ratio: f32,
) -> Result<GroupFilterResult> {
    check_len("group_ids", raw_scores.len(), group_ids.len())?;
    check_share("rollout_filter_ratio", keep_ratio)?;
    let stds = group_stds(raw_scores, group_ids);
    let n_groups = stds.len();
    let k =
        ((keep_ratio as f64 * n_groups as f64 - 1e-6).ceil() as usize).clamp(1, n_groups.max(1));

    let mut ranked = stds.clone();
    // Largest std first; equal stds keep ascending id order (stable sort).
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut kept_groups: Vec<usize> = ranked.iter().take(k).map(|&(g, _)| g).collect();
    kept_groups.sort_unstable();

    Ok(GroupFilterResult::of_kept(kept_groups, &stds, group_ids))
}

/// RAGEN-2's SNR-adaptive filter (arXiv 2604.06268, "linear" top-p mode):
/// rank the groups by the unbiased std of their **raw** scores, leave out the
/// zero-variance ones, and keep the smallest prefix of the ranking whose stds
/// add up to a `top_p` share of all groups' stds.
///
/// ```text
/// s_g       = std_unbiased({ R_i : group_ids[i] = g })
/// threshold = top_p · Σ_g s_g − eps
/// keep      = the longest-std groups g_1, g_2, … (s_g > 0) until Σ_kept s ≥ threshold
/// ```
///
/// Unlike StarPO-S's fixed ratio, how many groups survive follows how much
/// signal the batch has: one decisive group can be the whole update, and a
/// batch where every group agrees keeps **nothing** (the step is skipped).
/// `top_p ≥ 1` keeps every group with a nonzero std. Ties keep the smaller
/// group id first.
///
/// # Errors
/// Length mismatch; [`AlgoError::InvalidParam`] unless `0 < top_p <= 1` and
/// `eps >= 0` (both finite).
pub fn snr_groups(
    raw_scores: &[f32],
    group_ids: &[usize],
    top_p: f32,
    eps: f32,
) -> Result<GroupFilterResult> {
    check_len("group_ids", raw_scores.len(), group_ids.len())?;
    check_share("rollout_filter_top_p", top_p)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(AlgoError::InvalidParam {
            name: "rollout_filter_eps",
            reason: format!("must be finite and >= 0, got {eps}"),
        });
    }
    let stds = group_stds(raw_scores, group_ids);
    let mut ranked: Vec<(usize, f64)> = stds.iter().copied().filter(|&(_, s)| s > 0.0).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = ranked.iter().map(|&(_, s)| s).sum();
    let threshold = top_p as f64 * total - eps as f64;
    let mut kept_groups = Vec::new();
    let mut cumulative = 0.0;
    for &(g, s) in &ranked {
        if cumulative >= threshold {
            break;
        }
        cumulative += s;
        kept_groups.push(g);
    }
    kept_groups.sort_unstable();
    Ok(GroupFilterResult::of_kept(kept_groups, &stds, group_ids))
}

/// A filter's share parameter `name` must be in (0, 1].
fn check_share(name: &'static str, value: f32) -> Result<()> {
    if value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(AlgoError::InvalidParam {
            name,
            reason: format!("must be in (0, 1], got {value}"),
        })
    }
}

/// (group id, unbiased std of its members' raw scores), in ascending id order.
fn group_stds(raw_scores: &[f32], group_ids: &[usize]) -> Vec<(usize, f64)> {
    group_members(group_ids)
        .into_iter()
        .map(|(g, members)| {
            let xs: Vec<f64> = members.iter().map(|&i| raw_scores[i] as f64).collect();
            (g, unbiased_std(&xs))
        })
        .collect()
}

impl GroupFilterResult {
    /// The result of keeping `kept_groups` (ascending) out of groups with
    /// in-group stds `stds` (ascending ids).
    fn of_kept(kept_groups: Vec<usize>, stds: &[(usize, f64)], group_ids: &[usize]) -> Self {
        let mean_std = |it: &mut dyn Iterator<Item = f64>| {
            let (sum, n) = it.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
            if n == 0 {
                0.0
            } else {
                (sum / n as f64) as f32
            }
        };
        let std_before = mean_std(&mut stds.iter().map(|&(_, s)| s));
        let std_after = mean_std(
            &mut stds
                .iter()
                .filter(|(g, _)| kept_groups.binary_search(g).is_ok())
                .map(|&(_, s)| s),
        );
        let kept_mask = group_ids
            .iter()
            .map(|g| kept_groups.binary_search(g).is_ok())
            .collect();
        Self {
            kept_groups,
            kept_mask,
            std_before,
            std_after,
        }
    }

    /// The same result without the kept groups whose raw scores all agree
    /// (std 0): they carry no task signal, only whatever penalties differ,
    /// and training on those alone drives the entropy down before any
    /// success is found (RAGEN-2 excludes zero-variance groups likewise).
    /// `std_after` is recomputed over what remains (0 when nothing does).
    ///
    /// # Errors
    /// Length mismatch between `raw_scores`, `group_ids` and the mask.
    pub fn without_zero_std(self, raw_scores: &[f32], group_ids: &[usize]) -> Result<Self> {
        check_len("group_ids", raw_scores.len(), group_ids.len())?;
        check_len("kept_mask", group_ids.len(), self.kept_mask.len())?;
        let stds = group_stds(raw_scores, group_ids);
        let kept_groups: Vec<usize> = stds
            .iter()
            .filter(|&&(g, s)| s > 0.0 && self.kept_groups.binary_search(&g).is_ok())
            .map(|&(g, _)| g)
            .collect();
        Ok(Self {
            std_before: self.std_before,
            ..Self::of_kept(kept_groups, &stds, group_ids)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_std_groups_are_dropped_from_what_was_kept() {
        let (s, g) = example();
        // Keep 3 of 4 by std (g2, g0, g3), then also every group: g1 (std 0) goes.
        let kept = top_std_groups(&s, &g, 0.75).unwrap();
        let dropped = kept.clone().without_zero_std(&s, &g).unwrap();
        assert_eq!(dropped, kept, "nothing with std 0 was kept");
        let all = top_std_groups(&s, &g, 1.0).unwrap();
        let dropped = all.without_zero_std(&s, &g).unwrap();
        assert_eq!(dropped.kept_groups, vec![0, 2, 3]);
        assert_eq!(
            dropped.kept_mask,
            vec![true, true, false, false, true, true, true, true]
        );
        // 1/√2, 10/√2 and 0.5/√2.
        let want = (0.5f32.sqrt() + 50f32.sqrt() + 0.125f32.sqrt()) / 3.0;
        assert!((dropped.std_after - want).abs() < 1e-5);
        // Nothing left: an empty update.
        let flat = top_std_groups(&[1.0, 1.0], &[0, 0], 1.0).unwrap();
        let none = flat.without_zero_std(&[1.0, 1.0], &[0, 0]).unwrap();
        assert!(none.kept_groups.is_empty() && none.kept_mask == vec![false, false]);
        assert_eq!(none.std_after, 0.0);
    }

    // 4 groups of 2:
    //   g0 [0, 1]      std = |0−1|/√2 = 0.707107
    //   g1 [1, 1]      std = 0
    //   g2 [0, 10]     std = 7.071068
    //   g3 [0.5, 0]    std = 0.353553
    fn example() -> (Vec<f32>, Vec<usize>) {
        (
            vec![0.0, 1.0, 1.0, 1.0, 0.0, 10.0, 0.5, 0.0],
            vec![0, 0, 1, 1, 2, 2, 3, 3],
        )
    }

    /// Both filters keep g2 and g0 of [`example`] at the ratios the tests use.
    fn assert_keeps_g0_and_g2(f: &GroupFilterResult) {
        assert_eq!(f.kept_groups, vec![0, 2]);
        let kept = [true, true, false, false, true, true, false, false];
        assert_eq!(f.kept_mask, kept);
        assert!((f.std_before - 2.032932).abs() < 1e-5);
        assert!((f.std_after - 3.889087).abs() < 1e-5);
    }

    #[test]
    fn filter_keeps_highest_std_groups() {
        // ratio 0.5 → ceil(2) = 2 groups: g2 (7.07) and g0 (0.707).
        // std_before = (0.707107 + 0 + 7.071068 + 0.353553)/4 = 2.032932
        // std_after  = (0.707107 + 7.071068)/2 = 3.889087
        let (s, g) = example();
        let f = top_std_groups(&s, &g, 0.5).unwrap();
        assert_keeps_g0_and_g2(&f);
        // ratio 0.25 → 1 group; ratio 0.01 still keeps 1.
        assert_eq!(top_std_groups(&s, &g, 0.25).unwrap().kept_groups, vec![2]);
        assert_eq!(top_std_groups(&s, &g, 0.01).unwrap().kept_groups, vec![2]);
    }

    #[test]
    fn filter_keeps_all_at_ratio_one() {
        let (s, g) = example();
        let f = top_std_groups(&s, &g, 1.0).unwrap();
        assert_eq!(f.kept_groups, vec![0, 1, 2, 3]);
        assert!(f.kept_mask.iter().all(|&k| k));
        assert_eq!(f.std_before, f.std_after);
    }

    #[test]
    fn filter_uses_raw_scores_not_normalised_ones() {
        // On raw scores g2 ([0, 10]) is by far the most uncertain group.
        let (s, g) = example();
        assert_eq!(top_std_groups(&s, &g, 0.25).unwrap().kept_groups, vec![2]);
        // After GRPO normalisation every non-degenerate group of 2 becomes
        // [−0.707, +0.707] with std 1 (RAGEN's pitfall): the ranking carries
        // no information, which is why the filter must see raw scores.
        let normalised = crate::advantage::grpo(&s, &g, true, 0.0).unwrap();
        let f = top_std_groups(&normalised, &g, 1.0).unwrap();
        // std_before = (1 + 0 + 1 + 1) / 4 = 0.75
        assert!((f.std_before - 0.75).abs() < 1e-5);
    }

    #[test]
    fn filter_breaks_ties_by_group_id_and_rounds_ratio_robustly() {
        // 10 groups with equal std: 0.3 × 10 keeps exactly 3, the lowest ids.
        let scores: Vec<f32> = (0..20).map(|i| (i % 2) as f32).collect();
        let ids: Vec<usize> = (0..20).map(|i| 9 - i / 2).collect();
        let f = top_std_groups(&scores, &ids, 0.3).unwrap();
        assert_eq!(f.kept_groups, vec![0, 1, 2]);
    }

    #[test]
    fn snr_keeps_the_top_p_share_of_the_signal() {
        // stds: g2 7.071068, g0 0.707107, g3 0.353553, g1 0 → total 8.131728.
        let (s, g) = example();
        // 0.9 · 8.131728 − 0.01 = 7.308555: g2 alone (7.071) is short, + g0 reaches 7.778.
        let f = snr_groups(&s, &g, 0.9, 0.01).unwrap();
        assert_keeps_g0_and_g2(&f);
        // 0.8 · 8.131728 − 0.01 = 6.495: g2 alone suffices.
        assert_eq!(snr_groups(&s, &g, 0.8, 0.01).unwrap().kept_groups, vec![2]);
        // top_p = 1 keeps every group with signal, never the zero-std g1.
        assert_eq!(
            snr_groups(&s, &g, 1.0, 0.0).unwrap().kept_groups,
            vec![0, 2, 3]
        );
    }

    #[test]
    fn snr_keeps_nothing_when_no_group_has_signal() {
        let f = snr_groups(&[1.0, 1.0, 0.0, 0.0], &[0, 0, 1, 1], 0.9, 0.01).unwrap();
        assert!(f.kept_groups.is_empty());
        assert_eq!(f.kept_mask, vec![false; 4]);
        assert_eq!((f.std_before, f.std_after), (0.0, 0.0));
    }

    #[test]
    fn snr_breaks_ties_by_group_id() {
        // Three groups of std 0.707107 each; 0.5 of the total needs two of them.
        let f = snr_groups(
            &[0.0, 1.0, 1.0, 0.0, 0.0, 1.0],
            &[2, 2, 1, 1, 0, 0],
            0.5,
            0.0,
        )
        .unwrap();
        assert_eq!(f.kept_groups, vec![0, 1]);
    }

    #[test]
    fn snr_rejects_bad_parameters() {
        let (s, g) = example();
        assert!(snr_groups(&s, &g, 0.0, 0.01).is_err());
        assert!(snr_groups(&s, &g, 1.5, 0.01).is_err());
        assert!(snr_groups(&s, &g, 0.9, -1.0).is_err());
        assert!(snr_groups(&s, &g, 0.9, f32::NAN).is_err());
        assert!(snr_groups(&s[..3], &g, 0.9, 0.01).is_err());
    }

    #[test]
    fn filter_rejects_bad_ratio() {
        let (s, g) = example();
        assert!(top_std_groups(&s, &g, 0.0).is_err());
        assert!(top_std_groups(&s, &g, 1.5).is_err());
        assert!(top_std_groups(&s, &g, f32::NAN).is_err());
    }
}
