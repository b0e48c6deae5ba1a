//! avg@k and pass@k over tasks sampled several times, with 95% confidence
//! intervals. Pure functions of per-task counts.
//!
//! Each task `i` is played `n_i` times with `c_i` successes.
//! - avg@k: the mean over tasks of `c_i / n_i`, the expected success of one
//!   sample (the generalisation study's avg@8);
//! - pass@k: the mean over tasks of the unbiased estimator
//!   `1 − C(n−c, k) / C(n, k)` of "at least one of k samples succeeds"
//!   (Chen et al. 2021, Codex/HumanEval); with `n == k` it is 1 when any
//!   sample succeeded.
//!
//! The interval of either is a Student-t interval over the per-task values
//! (`mean ± t(0.975, m−1) · s / √m` for `m` tasks, clamped to [0, 1]): the
//! tasks are the independent units, the samples of one task are not. When
//! every task scores 0 (or every task 1) the t interval would have zero
//! width, which claims a certainty 64 tasks do not give: the interval is then
//! Clopper-Pearson's exact one for 0 of m (m of m) tasks, `[0, 1 − 0.025^(1/m)]`
//! (`[0.025^(1/m), 1]`). Other equal values keep the zero-width t interval;
//! with one task there is none.

use serde::{Deserialize, Serialize};

/// Successes of one task: `successes` of `samples` plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskOutcomes {
    pub samples: usize,
    pub successes: usize,
}

/// A mean over tasks and its 95% interval (`None` with fewer than two tasks).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub mean: f64,
    /// `[low, high]`, clamped to [0, 1].
    pub ci95: Option<[f64; 2]>,
}

/// What [`avg_at_k`] and [`pass_at_k`] refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EstimateError {
    #[error("no tasks")]
    NoTasks,
    #[error("k must be at least 1")]
    ZeroK,
    #[error("a task has {successes} successes in {samples} samples")]
    MoreSuccessesThanSamples { samples: usize, successes: usize },
    #[error("pass@{k} needs at least {k} samples per task; a task has {samples}")]
    TooFewSamples { k: usize, samples: usize },
}

/// The unbiased pass@k of one task with `c` successes in `n` samples:
/// `1 − C(n−c, k)/C(n, k)`, computed as `1 − ∏_{i=n−c+1}^{n} (1 − k/i)`
/// (Codex's numerically stable form). Meaningful for `c ≤ n` and `k ≤ n`
/// ([`pass_at_k`] checks both).
pub fn pass_at_k_one(n: usize, c: usize, k: usize) -> f64 {
    if n.saturating_sub(c) < k {
        // Every draw of k samples contains a success.
        return 1.0;
    }
    let fail_all: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    1.0 - fail_all
}

/// avg@k: mean per-task success rate, with its interval.
pub fn avg_at_k(tasks: &[TaskOutcomes]) -> Result<Estimate, EstimateError> {
    check(tasks, 1)?;
    let rates: Vec<f64> = tasks
        .iter()
        .map(|t| t.successes as f64 / t.samples as f64)
        .collect();
    Ok(mean_with_ci95(&rates))
}

/// pass@k: mean per-task unbiased pass@k, with its interval.
pub fn pass_at_k(tasks: &[TaskOutcomes], k: usize) -> Result<Estimate, EstimateError> {
    check(tasks, k)?;
    let values: Vec<f64> = tasks
        .iter()
        .map(|t| pass_at_k_one(t.samples, t.successes, k))
        .collect();
    Ok(mean_with_ci95(&values))
}

fn check(tasks: &[TaskOutcomes], k: usize) -> Result<(), EstimateError> {
    if tasks.is_empty() {
        return Err(EstimateError::NoTasks);
    }
    if k == 0 {
        return Err(EstimateError::ZeroK);
    }
    for t in tasks {
        if t.successes > t.samples {
            return Err(EstimateError::MoreSuccessesThanSamples {
                samples: t.samples,
                successes: t.successes,
            });
        }
        if t.samples < k {
            return Err(EstimateError::TooFewSamples {
                k,
                samples: t.samples,
            });
        }
    }
    Ok(())
}

/// The mean of `values` and its Student-t 95% interval, clamped to [0, 1]
/// (values are rates); when every value is 0, or every one 1, the exact
/// Clopper-Pearson interval of 0 (m) successes in m tasks instead. No
/// interval for fewer than two values.
pub fn mean_with_ci95(values: &[f64]) -> Estimate {
    let m = values.len();
    let mean = values.iter().sum::<f64>() / m.max(1) as f64;
    if m < 2 {
        return Estimate { mean, ci95: None };
    }
    // P(0 of m | p) = (1 − p)^m = 0.025 at the upper end.
    let exact_edge = 0.025f64.powf(1.0 / m as f64);
    if values.iter().all(|&v| v == 0.0) {
        return Estimate {
            mean,
            ci95: Some([0.0, 1.0 - exact_edge]),
        };
    }
    if values.iter().all(|&v| v == 1.0) {
        return Estimate {
            mean,
            ci95: Some([exact_edge, 1.0]),
        };
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (m - 1) as f64;
    let half = t_quantile_975(m - 1) * (var / m as f64).sqrt();
    Estimate {
        mean,
        ci95: Some([(mean - half).max(0.0), (mean + half).min(1.0)]),
    }
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom (the
/// two-sided 95% critical value): tabulated to 4 decimals for 1..=30, then
/// the Cornish-Fisher expansion around the normal quantile (error < 1e-4
/// from df 30 on). `df = 0` has no quantile: infinity.
pub fn t_quantile_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010,
        2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739,
        2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        _ => {
            let z: f64 = 1.959_963_984_540_054;
            let v = df as f64;
            let g1 = (z.powi(3) + z) / 4.0;
            let g2 = (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / 96.0;
            let g3 = (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / 384.0;
            let g4 = (79.0 * z.powi(9) + 776.0 * z.powi(7) + 1482.0 * z.powi(5)
                - 1920.0 * z.powi(3)
                - 945.0 * z)
                / 92160.0;
            z + g1 / v + g2 / v.powi(2) + g3 / v.powi(3) + g4 / v.powi(4)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(samples: usize, successes: usize) -> TaskOutcomes {
        TaskOutcomes { samples, successes }
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() < tol
    }

    #[test]
    fn pass_at_k_matches_the_binomial_ratio_by_hand() {
        // n 4, c 1, k 2: 1 − C(3,2)/C(4,2) = 1 − 3/6.
        assert!(close(pass_at_k_one(4, 1, 2), 0.5, 1e-12));
        // n 8, c 2, k 4: 1 − C(6,4)/C(8,4) = 1 − 15/70.
        assert!(close(pass_at_k_one(8, 2, 4), 1.0 - 15.0 / 70.0, 1e-12));
        // n 5, c 2, k 1: pass@1 is the success rate.
        assert!(close(pass_at_k_one(5, 2, 1), 0.4, 1e-12));
        // n == k: any success.
        assert_eq!(pass_at_k_one(8, 0, 8), 0.0);
        assert_eq!(pass_at_k_one(8, 1, 8), 1.0);
        // n − c < k: every draw holds a success.
        assert_eq!(pass_at_k_one(6, 4, 3), 1.0);
    }

    #[test]
    fn avg_and_pass_at_k_over_tasks_by_hand() {
        // Three tasks of 4 samples with 0, 1 and 4 successes, k = 2:
        // avg = (0 + 1/4 + 1)/3; pass@2 = (0 + 1/2 + 1)/3.
        let tasks = [task(4, 0), task(4, 1), task(4, 4)];
        let avg = avg_at_k(&tasks).unwrap();
        assert!(close(avg.mean, 1.25 / 3.0, 1e-12), "{avg:?}");
        let pass = pass_at_k(&tasks, 2).unwrap();
        assert!(close(pass.mean, 0.5, 1e-12), "{pass:?}");
        // pass@k never falls below avg@k.
        assert!(pass.mean >= avg.mean);
    }

    #[test]
    fn the_interval_is_students_t_over_per_task_values_by_hand() {
        // Values 0.5, 0.25, 0.75, 0.5: mean 0.5, s² = (0 + 1/16 + 1/16 + 0)/3
        // = 1/24, se = √(1/96) = 0.102062, t(0.975, 3) = 3.1824, half-width 0.324802.
        let e = mean_with_ci95(&[0.5, 0.25, 0.75, 0.5]);
        assert_eq!(e.mean, 0.5);
        let [lo, hi] = e.ci95.unwrap();
        assert!(close(lo, 0.5 - 0.324802, 1e-5), "{lo}");
        assert!(close(hi, 0.5 + 0.324802, 1e-5), "{hi}");
        // Clamped to [0, 1]: 1, 0, 1, 1 has mean 0.75, s 0.5, half-width 0.7956.
        let e = mean_with_ci95(&[1.0, 0.0, 1.0, 1.0]);
        assert_eq!(e.ci95, Some([0.0, 1.0]));
        // Equal values: zero width; one value: no interval.
        assert_eq!(mean_with_ci95(&[0.25, 0.25]).ci95, Some([0.25, 0.25]));
        // Every task 0 or every task 1: Clopper-Pearson's exact interval,
        // 1 − 0.025^(1/64) = 0.056009 for 64 tasks, 0.841886 for 2.
        let [lo, hi] = mean_with_ci95(&[0.0; 64]).ci95.unwrap();
        assert_eq!(lo, 0.0);
        assert!(close(hi, 0.056009, 1e-6), "{hi}");
        let [lo, hi] = mean_with_ci95(&[1.0; 16]).ci95.unwrap();
        assert!(close(lo, 0.794093, 1e-6), "{lo}");
        assert_eq!(hi, 1.0);
        let [_, hi] = mean_with_ci95(&[0.0, 0.0]).ci95.unwrap();
        assert!(close(hi, 0.841886, 1e-6), "{hi}");
        assert_eq!(mean_with_ci95(&[0.25]).ci95, None);
    }

    #[test]
    fn t_quantiles_match_the_table_and_approach_the_normal() {
        assert_eq!(t_quantile_975(1), 12.7062);
        assert_eq!(t_quantile_975(9), 2.2622);
        // Past the table: t(40) = 2.0211, t(60) = 2.0003, t(120) = 1.9799.
        assert!(close(t_quantile_975(40), 2.0211, 1e-4));
        assert!(close(t_quantile_975(60), 2.0003, 1e-4));
        assert!(close(t_quantile_975(120), 1.9799, 1e-4));
        // Continuous at the table's end and decreasing toward z = 1.96.
        assert!(close(t_quantile_975(31), 2.0395, 1e-4));
        assert!(t_quantile_975(10_000) > 1.95996 && t_quantile_975(10_000) < 1.9604);
        assert!(t_quantile_975(0).is_infinite());
    }

    #[test]
    fn bad_counts_are_errors() {
        assert_eq!(avg_at_k(&[]), Err(EstimateError::NoTasks));
        assert_eq!(pass_at_k(&[task(4, 1)], 0), Err(EstimateError::ZeroK));
        assert_eq!(
            pass_at_k(&[task(2, 1)], 4),
            Err(EstimateError::TooFewSamples { k: 4, samples: 2 })
        );
        assert!(matches!(
            avg_at_k(&[task(2, 3)]),
            Err(EstimateError::MoreSuccessesThanSamples { .. })
        ));
    }
}
