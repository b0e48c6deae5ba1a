//! RAGEN-2's template-collapse diagnostics (arXiv 2604.06268, their
//! `docs/reference_mutual_information_metrics.md`): does the reasoning `Z`
//! still depend on the input `X`?
//!
//! From the cross log-probabilities `ℓ_j(z_i) = log p(z_i | x_j)` of every
//! sampled reasoning under every distinct prompt of the batch (the batch's
//! empirical, uniform prompt distribution over N prompts):
//!
//! ```text
//! matched_i  = ℓ_{own(i)}(z_i)                          log p(z_i | x_i)
//! marginal_i = logsumexp_j ℓ_j(z_i) − log N             log p_mix(z_i)
//! H(Z|X)     = −mean_i matched_i
//! H(Z)       = −mean_i marginal_i
//! I(X;Z)     =  mean_i (matched_i − marginal_i)  ≤ log N
//! retrieval  =  mean_i [argmax_j ℓ_j(z_i) = own(i)]   (chance 1/N)
//! ```
//!
//! Each in two variants: per sequence (ℓ summed over z's tokens) and per
//! token (ℓ divided by z's length before the log-sum-exp). Low I(X;Z) with a
//! high H(Z|X) is template collapse: varied reasoning that ignores the input.

use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};

/// The diagnostics of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TemplateCollapse {
    /// Mutual information I(X;Z), per token (nats).
    pub mi: f64,
    /// I(X;Z) per sequence.
    pub mi_seq: f64,
    /// H(Z|X) per token.
    pub conditional_entropy: f64,
    /// H(Z|X) per sequence.
    pub conditional_entropy_seq: f64,
    /// H(Z) under the prompt mixture, per token.
    pub reasoning_entropy: f64,
    /// H(Z) per sequence.
    pub reasoning_entropy_seq: f64,
    /// Share of samples whose own prompt explains them best (ties count
    /// against, so a prompt-blind policy scores 0, not 1).
    pub retrieval_accuracy: f64,
    /// `log N`, the most I(X;Z) can be with N prompts.
    pub mi_upper_bound: f64,
    /// (samples, distinct prompts) the estimate used.
    pub samples: usize,
    pub prompts: usize,
}

fn logsumexp(xs: &[f64]) -> f64 {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// The diagnostics from `cross[i][j] = Σ_t log p(z_i,t | x_j, z_i,<t)`,
/// `z_len[i]` (tokens of z_i, ≥ 1) and `own[i]` (the column of z_i's prompt).
///
/// # Errors
/// No samples, ragged rows, fewer than 2 prompts (nothing to tell apart), an
/// `own` column out of range, an empty reasoning, or a non-finite entry.
pub fn template_collapse(
    cross: &[Vec<f64>],
    z_len: &[usize],
    own: &[usize],
) -> Result<TemplateCollapse> {
    let m = cross.len();
    let invalid = |reason: String| AlgoError::InvalidParam {
        name: "template_collapse",
        reason,
    };
    if m == 0 {
        return Err(invalid("no (prompt, reasoning) samples".into()));
    }
    crate::stats::check_len("z_len", m, z_len.len())?;
    crate::stats::check_len("own", m, own.len())?;
    let n = cross[0].len();
    if n < 2 {
        return Err(invalid(format!("{n} distinct prompt(s): need at least 2")));
    }
    for (i, row) in cross.iter().enumerate() {
        crate::stats::check_len(&format!("cross[{i}]"), n, row.len())?;
        if own[i] >= n {
            return Err(invalid(format!("own[{i}] = {} with {n} prompts", own[i])));
        }
        if z_len[i] == 0 {
            return Err(invalid(format!("sample {i} has an empty reasoning")));
        }
        if let Some(v) = row.iter().find(|v| !v.is_finite()) {
            return Err(invalid(format!("cross[{i}] holds {v}")));
        }
    }
    let ln_n = (n as f64).ln();
    let (mut matched_seq, mut marginal_seq, mut matched_tok, mut marginal_tok) =
        (0.0, 0.0, 0.0, 0.0);
    let mut hits = 0usize;
    for (i, row) in cross.iter().enumerate() {
        let per_token: Vec<f64> = row.iter().map(|v| v / z_len[i] as f64).collect();
        matched_seq += row[own[i]];
        marginal_seq += logsumexp(row) - ln_n;
        matched_tok += per_token[own[i]];
        marginal_tok += logsumexp(&per_token) - ln_n;
        // The own prompt must beat every other one strictly.
        if row
            .iter()
            .enumerate()
            .all(|(j, &v)| j == own[i] || v < row[own[i]])
        {
            hits += 1;
        }
    }
    let mf = m as f64;
    Ok(TemplateCollapse {
        mi: (matched_tok - marginal_tok) / mf,
        mi_seq: (matched_seq - marginal_seq) / mf,
        conditional_entropy: -matched_tok / mf,
        conditional_entropy_seq: -matched_seq / mf,
        reasoning_entropy: -marginal_tok / mf,
        reasoning_entropy_seq: -marginal_seq / mf,
        retrieval_accuracy: hits as f64 / mf,
        mi_upper_bound: ln_n,
        samples: m,
        prompts: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn prompt_blind_reasoning_has_zero_mutual_information() {
        // Every z is as likely under every prompt: p(z|x) = p_mix(z).
        let cross = vec![vec![-2.0, -2.0], vec![-3.0, -3.0], vec![-1.0, -1.0]];
        let t = template_collapse(&cross, &[2, 3, 1], &[0, 1, 1]).unwrap();
        assert!(close(t.mi, 0.0) && close(t.mi_seq, 0.0));
        // H(Z|X) per sequence = (2 + 3 + 1) / 3; per token = (1 + 1 + 1) / 3.
        assert!(close(t.conditional_entropy_seq, 2.0));
        assert!(close(t.conditional_entropy, 1.0));
        assert!(close(t.reasoning_entropy_seq, 2.0));
        assert_eq!(t.retrieval_accuracy, 0.0);
        assert!(close(t.mi_upper_bound, 2f64.ln()));
        assert_eq!((t.samples, t.prompts), (3, 2));
    }

    #[test]
    fn prompt_specific_reasoning_reaches_log_n() {
        // z_i is certain under its own prompt and impossible (≈) under the other.
        let cross = vec![vec![0.0, -1e9], vec![-1e9, 0.0]];
        let t = template_collapse(&cross, &[1, 1], &[0, 1]).unwrap();
        assert!(close(t.mi_seq, 2f64.ln()));
        assert!(close(t.mi, 2f64.ln()));
        assert!(close(t.conditional_entropy_seq, 0.0));
        assert_eq!(t.retrieval_accuracy, 1.0);
    }

    #[test]
    fn hand_computed_mixed_case() {
        // One sample, z of 2 tokens, own prompt 0:
        //   ℓ = [ln 0.5, ln 0.25] (sequence log-probs)
        //   matched_seq = ln 0.5; marginal_seq = ln((0.5 + 0.25) / 2) = ln 0.375
        //   MI_seq = ln(0.5 / 0.375) = ln(4/3)
        //   per token: ℓ/2 = [ln √0.5, ln √0.25] = [ln 0.707107, ln 0.5]
        //   MI_tok = ln 0.707107 − ln((0.707107 + 0.5) / 2) = ln(0.707107 / 0.603553)
        let cross = vec![vec![0.5f64.ln(), 0.25f64.ln()]];
        let t = template_collapse(&cross, &[2], &[0]).unwrap();
        assert!(close(t.mi_seq, (4.0f64 / 3.0).ln()));
        let s = 0.5f64.sqrt();
        assert!(close(t.mi, (s / ((s + 0.5) / 2.0)).ln()));
        assert!(close(t.conditional_entropy_seq, -(0.5f64.ln())));
        assert!(close(t.reasoning_entropy_seq, -(0.375f64.ln())));
        assert_eq!(t.retrieval_accuracy, 1.0);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(template_collapse(&[], &[], &[]).is_err());
        assert!(
            template_collapse(&[vec![-1.0]], &[1], &[0]).is_err(),
            "one prompt"
        );
        assert!(
            template_collapse(&[vec![-1.0, -2.0]], &[0], &[0]).is_err(),
            "empty z"
        );
        assert!(
            template_collapse(&[vec![-1.0, -2.0]], &[1], &[2]).is_err(),
            "own"
        );
        assert!(template_collapse(&[vec![-1.0, f64::NAN]], &[1], &[0]).is_err());
        assert!(template_collapse(&[vec![-1.0, -2.0], vec![-1.0]], &[1, 1], &[0, 0]).is_err());
        assert!(template_collapse(&[vec![-1.0, -2.0]], &[1, 1], &[0]).is_err());
    }
}
