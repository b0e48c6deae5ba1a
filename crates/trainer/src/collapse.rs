//! The Echo Trap watch: the signals RAGEN saw before a run collapsed —
//! in-group reward std and entropy falling, gradient-norm spikes, training
//! success dropping from its best — checked after every RL step against the
//! thresholds of `[collapse]`, so a run says so in its log when it happens.

use serde::{Deserialize, Serialize};

use crate::template_collapse::MiTarget;

/// Thresholds of the watch (the `[collapse]` config section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CollapseConfig {
    /// Steps averaged into each signal (a moving window).
    pub window: usize,
    /// In-group reward std collapse: the window's mean fell below this after
    /// it had once been at least twice as high (a run that never found a
    /// reward difference has nothing to lose).
    pub min_in_group_std: f64,
    /// Entropy collapse: the window's mean entropy fell below this share of
    /// the first window's.
    pub entropy_ratio: f64,
    /// Gradient-norm spike: a step's norm above this multiple of the median
    /// of the window before it.
    pub grad_norm_spike: f64,
    /// Success drop: the window's mean training success fell this far (in
    /// success-rate units) below the best window so far.
    pub success_drop: f64,
    /// RAGEN-2's template-collapse diagnostics (H(Z|X), I(X;Z)) every this
    /// many steps (0 = never); they cost one no-grad pass over
    /// `mi_samples` × (distinct prompts) short sequences.
    pub mi_every: usize,
    /// (prompt, reasoning) pairs per estimate.
    pub mi_samples: usize,
    /// What Z is: `reasoning` (RAGEN-2) or `reply`.
    pub mi_target: MiTarget,
}

impl Default for CollapseConfig {
    fn default() -> Self {
        Self {
            window: 5,
            min_in_group_std: 0.05,
            entropy_ratio: 0.3,
            grad_norm_spike: 5.0,
            success_drop: 0.2,
            mi_every: 10,
            mi_samples: 16,
            mi_target: MiTarget::Reasoning,
        }
    }
}

impl CollapseConfig {
    /// Problems with the thresholds, as (key, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut p = Vec::new();
        if self.window == 0 {
            p.push(("collapse.window", "must be at least 1".to_string()));
        }
        let checks = [
            ("collapse.min_in_group_std", self.min_in_group_std),
            ("collapse.entropy_ratio", self.entropy_ratio),
            ("collapse.grad_norm_spike", self.grad_norm_spike),
            ("collapse.success_drop", self.success_drop),
        ];
        for (key, v) in checks {
            if !(v.is_finite() && v >= 0.0) {
                p.push((key, format!("{v} must be a finite number >= 0")));
            }
        }
        p
    }
}

/// One collapse signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollapseSignal {
    InGroupStd,
    Entropy,
    GradNormSpike,
    SuccessDrop,
}

impl CollapseSignal {
    /// What the warning says.
    pub fn describe(self) -> &'static str {
        match self {
            CollapseSignal::InGroupStd => {
                "in-group reward std collapsed (groups stopped disagreeing)"
            }
            CollapseSignal::Entropy => "entropy collapsed (the policy stopped exploring)",
            CollapseSignal::GradNormSpike => "gradient-norm spike",
            CollapseSignal::SuccessDrop => "training success dropped from its best",
        }
    }
}

/// What one RL step tells the watch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSignals {
    pub in_group_std: f64,
    pub success: f64,
    /// The update's entropy and gradient norm; `None` when the step took no
    /// update (nothing to measure).
    pub update: Option<(f64, f64)>,
}

/// The watch's memory of the run so far.
#[derive(Debug, Clone, Default)]
pub struct CollapseWatch {
    cfg: CollapseConfig,
    std: Vec<f64>,
    success: Vec<f64>,
    entropy: Vec<f64>,
    grad_norm: Vec<f64>,
    peak_std: f64,
    best_success: f64,
    first_entropy: Option<f64>,
    /// The state signals raised now (edge-triggered warnings).
    active: Vec<CollapseSignal>,
}

fn window_mean(xs: &[f64], w: usize) -> Option<f64> {
    (xs.len() >= w).then(|| xs[xs.len() - w..].iter().sum::<f64>() / w as f64)
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl CollapseWatch {
    pub fn new(cfg: CollapseConfig) -> Self {
        Self {
            cfg,
            ..Self::default()
        }
    }

    /// The signals that hold after the steps seen so far.
    pub fn active(&self) -> &[CollapseSignal] {
        &self.active
    }

    /// Take one step's figures. Returns what this step newly raised: a state
    /// signal (std, entropy, success) once when it starts to hold, a spike
    /// every time one happens.
    pub fn observe(&mut self, s: StepSignals) -> Vec<CollapseSignal> {
        let w = self.cfg.window.max(1);
        let mut holds = Vec::new();
        let mut raised = Vec::new();

        self.std.push(s.in_group_std);
        if let Some(m) = window_mean(&self.std, w) {
            self.peak_std = self.peak_std.max(m);
            if m < self.cfg.min_in_group_std && self.peak_std >= 2.0 * self.cfg.min_in_group_std {
                holds.push(CollapseSignal::InGroupStd);
            }
        }

        self.success.push(s.success);
        if let Some(m) = window_mean(&self.success, w) {
            self.best_success = self.best_success.max(m);
            if m < self.best_success - self.cfg.success_drop {
                holds.push(CollapseSignal::SuccessDrop);
            }
        }

        if let Some((entropy, grad_norm)) = s.update {
            if self.grad_norm.len() >= w {
                let before = median(&self.grad_norm[self.grad_norm.len() - w..]);
                if before > 0.0 && grad_norm > self.cfg.grad_norm_spike * before {
                    raised.push(CollapseSignal::GradNormSpike);
                }
            }
            self.grad_norm.push(grad_norm);
            self.entropy.push(entropy);
            if let Some(m) = window_mean(&self.entropy, w) {
                let first = *self.first_entropy.get_or_insert(m);
                if m < self.cfg.entropy_ratio * first {
                    holds.push(CollapseSignal::Entropy);
                }
            }
        } else if self.active.contains(&CollapseSignal::Entropy) {
            // No update, no new entropy: the entropy signal stands as it was.
            holds.push(CollapseSignal::Entropy);
        }

        holds.sort_by_key(|s| *s as u8);
        raised.extend(holds.iter().filter(|h| !self.active.contains(h)));
        self.active = holds;
        raised
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(std: f64, success: f64, entropy: f64, grad: f64) -> StepSignals {
        StepSignals {
            in_group_std: std,
            success,
            update: Some((entropy, grad)),
        }
    }

    fn cfg() -> CollapseConfig {
        CollapseConfig {
            window: 2,
            ..CollapseConfig::default()
        }
    }

    #[test]
    fn a_healthy_run_raises_nothing() {
        let mut w = CollapseWatch::new(cfg());
        for i in 0..20 {
            let r = w.observe(step(0.4, 0.1 + 0.01 * i as f64, 0.5, 0.2));
            assert!(r.is_empty(), "step {i}: {r:?}");
        }
    }

    #[test]
    fn a_run_that_never_had_signal_is_not_a_std_collapse() {
        let mut w = CollapseWatch::new(cfg());
        for _ in 0..10 {
            assert!(w.observe(step(0.0, 0.0, 0.5, 0.2)).is_empty());
        }
    }

    #[test]
    fn std_collapse_is_raised_once_when_the_window_falls() {
        let mut w = CollapseWatch::new(cfg());
        assert!(w.observe(step(0.4, 0.5, 0.5, 0.2)).is_empty());
        assert!(w.observe(step(0.4, 0.5, 0.5, 0.2)).is_empty());
        // Window (0.4 + 0.0) / 2 = 0.2: not yet below 0.05.
        assert!(w.observe(step(0.0, 0.5, 0.5, 0.2)).is_empty());
        // Window 0.0 < 0.05, peak 0.4 ≥ 0.1: raised, then held silently.
        assert_eq!(
            w.observe(step(0.0, 0.5, 0.5, 0.2)),
            vec![CollapseSignal::InGroupStd]
        );
        assert!(w.observe(step(0.0, 0.5, 0.5, 0.2)).is_empty());
        assert_eq!(w.active(), &[CollapseSignal::InGroupStd]);
        // Recovery clears it; a second fall raises it again.
        w.observe(step(0.4, 0.5, 0.5, 0.2));
        assert!(w.active().is_empty());
        w.observe(step(0.0, 0.5, 0.5, 0.2));
        assert_eq!(
            w.observe(step(0.0, 0.5, 0.5, 0.2)),
            vec![CollapseSignal::InGroupStd]
        );
    }

    #[test]
    fn entropy_collapse_is_measured_against_the_first_window() {
        let mut w = CollapseWatch::new(cfg());
        w.observe(step(0.4, 0.5, 1.0, 0.2));
        w.observe(step(0.4, 0.5, 1.0, 0.2)); // first window: 1.0
        assert!(w.observe(step(0.4, 0.5, 0.4, 0.2)).is_empty()); // 0.7
        assert!(w.observe(step(0.4, 0.5, 0.31, 0.2)).is_empty()); // 0.355 ≥ 0.3
        assert_eq!(
            w.observe(step(0.4, 0.5, 0.2, 0.2)), // 0.255 < 0.3
            vec![CollapseSignal::Entropy]
        );
        // A step without an update keeps the signal, and raises nothing new.
        let skipped = StepSignals {
            in_group_std: 0.4,
            success: 0.5,
            update: None,
        };
        assert!(w.observe(skipped).is_empty());
        assert_eq!(w.active(), &[CollapseSignal::Entropy]);
    }

    #[test]
    fn grad_norm_spikes_are_raised_each_time() {
        let mut w = CollapseWatch::new(cfg());
        w.observe(step(0.4, 0.5, 0.5, 0.1));
        w.observe(step(0.4, 0.5, 0.5, 0.3)); // median of [0.1, 0.3] = 0.2
        assert!(w.observe(step(0.4, 0.5, 0.5, 0.9)).is_empty()); // 0.9 < 5 × 0.2
                                                                 // median of [0.3, 0.9] = 0.6; 3.3 > 3.0.
        assert_eq!(
            w.observe(step(0.4, 0.5, 0.5, 3.3)),
            vec![CollapseSignal::GradNormSpike]
        );
        // median of [0.9, 3.3] = 2.1; 10.8 > 10.5.
        assert_eq!(
            w.observe(step(0.4, 0.5, 0.5, 10.8)),
            vec![CollapseSignal::GradNormSpike]
        );
    }

    #[test]
    fn success_drop_is_measured_from_the_best_window() {
        let mut w = CollapseWatch::new(cfg());
        w.observe(step(0.4, 0.6, 0.5, 0.2));
        w.observe(step(0.4, 0.6, 0.5, 0.2)); // best 0.6
        assert!(w.observe(step(0.4, 0.3, 0.5, 0.2)).is_empty()); // 0.45 ≥ 0.4
        let r = w.observe(step(0.4, 0.3, 0.5, 0.2)); // 0.3 < 0.4
        assert_eq!(r, vec![CollapseSignal::SuccessDrop]);
    }

    #[test]
    fn bad_thresholds_are_named() {
        let c = CollapseConfig {
            window: 0,
            entropy_ratio: f64::NAN,
            success_drop: -1.0,
            ..CollapseConfig::default()
        };
        let keys: Vec<&str> = c.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            vec![
                "collapse.window",
                "collapse.entropy_ratio",
                "collapse.success_drop"
            ]
        );
        assert!(CollapseConfig::default().problems().is_empty());
    }
}
