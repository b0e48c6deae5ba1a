//! Small statistics and validation helpers on plain `f32` slices.
//!
//! Sums are accumulated in `f64` so that results do not depend on summation
//! order more than necessary; outputs are `f32`.

use std::collections::BTreeMap;

use crate::error::{AlgoError, Result};

/// Variance floor inside [`masked_whiten`], as verl's `masked_whiten`
/// (`(x − mean) · rsqrt(var + 1e-8)`).
pub const WHITEN_EPS: f64 = 1e-8;

/// Indices of the members of each group, keyed by group id (sorted, so
/// iteration order is deterministic).
pub(crate) fn group_members(group_ids: &[usize]) -> BTreeMap<usize, Vec<usize>> {
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, &g) in group_ids.iter().enumerate() {
        groups.entry(g).or_default().push(i);
    }
    groups
}

/// Arithmetic mean; 0 for an empty slice.
pub(crate) fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Unbiased (Bessel-corrected, n − 1) standard deviation, the convention of
/// `torch.std` that verl and RAGEN use. 0 for fewer than two values.
pub fn unbiased_std(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    let ss: f64 = xs.iter().map(|x| (x - m) * (x - m)).sum();
    (ss / (xs.len() - 1) as f64).sqrt()
}

/// True when every value equals the first (used to return exact zeros).
pub(crate) fn all_equal(xs: &[f64]) -> bool {
    xs.windows(2).all(|w| w[0] == w[1])
}

pub(crate) fn check_len(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(AlgoError::LengthMismatch {
            what: what.to_string(),
            expected,
            got,
        })
    }
}

/// Checks that `rows` has the same ragged shape as `like`.
pub(crate) fn check_ragged<T, U>(what: &str, like: &[Vec<T>], rows: &[Vec<U>]) -> Result<()> {
    check_len(what, like.len(), rows.len())?;
    for (i, (a, b)) in like.iter().zip(rows).enumerate() {
        check_len(&format!("{what}[{i}]"), a.len(), b.len())?;
    }
    Ok(())
}

/// Checks that every mask entry is exactly 0 or 1.
pub(crate) fn check_masks(masks: &[Vec<f32>]) -> Result<()> {
    for (seq, row) in masks.iter().enumerate() {
        for (pos, &value) in row.iter().enumerate() {
            if value != 0.0 && value != 1.0 {
                return Err(AlgoError::InvalidMask { seq, pos, value });
            }
        }
    }
    Ok(())
}

/// Rejects non-zero rewards on tokens with mask 0 (they would be dropped).
pub(crate) fn check_rewards_on_policy(rewards: &[Vec<f32>], masks: &[Vec<f32>]) -> Result<()> {
    for (seq, (r_row, m_row)) in rewards.iter().zip(masks).enumerate() {
        for (pos, (&reward, &m)) in r_row.iter().zip(m_row).enumerate() {
            if m == 0.0 && reward != 0.0 {
                return Err(AlgoError::RewardOnNonPolicyToken { seq, pos, reward });
            }
        }
    }
    Ok(())
}

/// Batch whitening over the tokens whose mask is 1, as verl's
/// `masked_whiten`: `(x − μ) / sqrt(σ² + 1e-8)` with μ and the unbiased σ²
/// taken over all masked tokens of the batch. Positions with mask 0 are set
/// to 0 (verl leaves them unspecified; zero is what every caller wants).
///
/// With a single masked token σ² is taken as 0 (verl raises), so that token
/// whitens to 0; with none, everything is 0.
pub fn masked_whiten(rows: &[Vec<f32>], masks: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
    check_ragged("masks", rows, masks)?;
    check_masks(masks)?;
    let vals: Vec<f64> = rows
        .iter()
        .zip(masks)
        .flat_map(|(r, m)| {
            r.iter()
                .zip(m)
                .filter(|(_, &m)| m == 1.0)
                .map(|(&x, _)| x as f64)
        })
        .collect();
    let mu = mean(&vals);
    let sd = unbiased_std(&vals);
    let scale = 1.0 / (sd * sd + WHITEN_EPS).sqrt();
    Ok(rows
        .iter()
        .zip(masks)
        .map(|(r, m)| {
            r.iter()
                .zip(m)
                .map(|(&x, &m)| {
                    if m == 1.0 {
                        ((x as f64 - mu) * scale) as f32
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect())
}

/// Masked mean of a ragged batch: Σ m·x / Σ m (0 when no token is masked in).
pub fn masked_mean(rows: &[Vec<f32>], masks: &[Vec<f32>]) -> Result<f32> {
    check_ragged("masks", rows, masks)?;
    let mut sum = 0.0f64;
    let mut n = 0.0f64;
    for (r, m) in rows.iter().zip(masks) {
        for (&x, &m) in r.iter().zip(m) {
            sum += x as f64 * m as f64;
            n += m as f64;
        }
    }
    Ok(if n > 0.0 { (sum / n) as f32 } else { 0.0 })
}

/// Explained variance of a critic, `1 − Var[R − V] / Var[R]` over the
/// masked tokens (CleanRL's diagnostic; 1 = perfect, 0 = no better than a
/// constant, negative = worse). Returns NaN when `Var[R]` is 0 (undefined),
/// as CleanRL does, so callers log it rather than a misleading number.
pub fn explained_variance(
    values: &[Vec<f32>],
    returns: &[Vec<f32>],
    masks: &[Vec<f32>],
) -> Result<f32> {
    check_ragged("returns", values, returns)?;
    check_ragged("masks", values, masks)?;
    let mut rets = Vec::new();
    let mut diffs = Vec::new();
    for ((v, r), m) in values.iter().zip(returns).zip(masks) {
        for ((&v, &r), &m) in v.iter().zip(r).zip(m) {
            if m == 1.0 {
                rets.push(r as f64);
                diffs.push(r as f64 - v as f64);
            }
        }
    }
    // Population variance, as numpy's np.var in CleanRL; the ratio is the
    // same either way.
    let var = |xs: &[f64]| {
        let m = mean(xs);
        mean(&xs.iter().map(|x| (x - m) * (x - m)).collect::<Vec<_>>())
    };
    let var_r = var(&rets);
    if var_r == 0.0 {
        return Ok(f32::NAN);
    }
    Ok((1.0 - var(&diffs) / var_r) as f32)
}
