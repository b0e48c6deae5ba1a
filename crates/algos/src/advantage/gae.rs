//! Generalized Advantage Estimation with a critic: token-level over the
//! policy tokens of a multi-turn sequence, and RAGEN's bi-level variant.

use std::collections::BTreeMap;

use super::reinforce::check_unit_interval;
use crate::error::{AlgoError, Result};
use crate::stats::{check_masks, check_ragged, check_rewards_on_policy, masked_whiten};

/// Per-token advantages and value targets.
#[derive(Debug, Clone, PartialEq)]
pub struct GaeOutput {
    /// Advantage per token (whitened over policy tokens if asked); 0 on
    /// non-policy tokens.
    pub advantages: Vec<Vec<f32>>,
    /// Value targets `A + V` from the *unwhitened* advantages; 0 on
    /// non-policy tokens (the value loss masks them anyway).
    pub returns: Vec<Vec<f32>>,
}

/// Token-level GAE over the policy tokens (verl's `gae` with its
/// observation-token skipping, RAGEN's multi-turn GAE):
///
/// ```text
/// δ_t = r_t + γ · V_next(t) − V_t
/// A_t = δ_t + γλ · A_next(t)
/// R_t = A_t + V_t                       (value target)
/// ```
///
/// for policy tokens `t` (mask 1), where `next(t)` is the next *policy*
/// token of the sequence: observation tokens in between are skipped, their
/// values unused. After the last policy token the episode is terminal
/// (`V = 0, A = 0`); a truncated episode is also treated as terminal, as in
/// verl. If `whiten`, advantages are then whitened over all policy tokens
/// of the batch ([`masked_whiten`]); returns use the raw advantages.
///
/// With γ = λ = 1 this reduces to `A_t = Σ_{k ≥ t} r_k − V_t`.
///
/// # Errors
/// Shape and mask errors; [`AlgoError::RewardOnNonPolicyToken`] for a
/// non-zero reward on a mask-0 token (GAE would drop it);
/// [`AlgoError::InvalidParam`] for γ or λ outside [0, 1].
pub fn gae(
    token_rewards: &[Vec<f32>],
    values: &[Vec<f32>],
    masks: &[Vec<f32>],
    gamma: f32,
    lam: f32,
    whiten: bool,
) -> Result<GaeOutput> {
    check_ragged("values", token_rewards, values)?;
    check_ragged("masks", token_rewards, masks)?;
    check_masks(masks)?;
    check_rewards_on_policy(token_rewards, masks)?;
    check_unit_interval("gamma", gamma)?;
    check_unit_interval("lam", lam)?;
    let (g, gl) = (gamma as f64, gamma as f64 * lam as f64);
    let mut advantages = Vec::with_capacity(token_rewards.len());
    let mut returns = Vec::with_capacity(token_rewards.len());
    for ((r, v), m) in token_rewards.iter().zip(values).zip(masks) {
        let mut adv = vec![0.0f32; r.len()];
        let mut ret = vec![0.0f32; r.len()];
        let (mut next_value, mut next_adv) = (0.0f64, 0.0f64);
        for t in (0..r.len()).rev() {
            if m[t] != 1.0 {
                continue; // observation token: the chain passes through
            }
            let delta = r[t] as f64 + g * next_value - v[t] as f64;
            next_adv = delta + gl * next_adv;
            next_value = v[t] as f64;
            adv[t] = next_adv as f32;
            ret[t] = (next_adv + v[t] as f64) as f32;
        }
        advantages.push(adv);
        returns.push(ret);
    }
    if whiten {
        advantages = masked_whiten(&advantages, masks)?;
    }
    Ok(GaeOutput {
        advantages,
        returns,
    })
}

/// Parameters of [`gae_bilevel`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BiLevelGaeConfig {
    /// Token-level discount within a turn (verl `gamma`).
    pub gamma: f32,
    /// Token-level λ within a turn (verl `lam`).
    pub lam: f32,
    /// Turn-level discount across turns (RAGEN `high_level_gamma`).
    pub turn_gamma: f32,
    /// Turn-level λ across turns (RAGEN uses `lam` here; kept separate).
    pub turn_lam: f32,
    /// Whiten the advantages over policy tokens afterwards.
    pub whiten: bool,
}

/// Bi-level GAE (RAGEN's `compute_bi_level_gae_advantage_return`): a
/// turn-level GAE across turns, then a token-level GAE inside each turn that
/// bootstraps from the turn-level value target.
///
/// Tokens carry `turn_ids[i][t]`: the 0-based turn of a policy token, −1
/// for every non-policy token. For turn `k` (ordered by id) let `e_k` be its
/// last token, `V_k = V[e_k]` and `r_k` the sum of the token rewards of turn
/// `k` (per-turn reward and, on the last turn, the outcome):
///
/// ```text
/// turn level:   δ_k = r_k + γ_T · V_{k+1} − V_k          (V_K = 0, terminal)
///               Â_k = δ_k + γ_T λ_T · Â_{k+1}
///               y_k = Â_k + V_k                            (turn value target)
/// token level,  A[e_k] = y_k − V[e_k] = Â_k
/// inside k:     A[p_j] = γ · V[p_{j+1}] − V[p_j] + γλ · A[p_{j+1}]
///               for the earlier tokens p_0 < … < p_{n−1} = e_k of turn k
/// returns       R = A + V
/// ```
///
/// The turn's reward enters only through `y_k` on its last token, so it is
/// not counted twice. Differences from RAGEN: turns are given explicitly by
/// `turn_ids` (RAGEN finds turn ends by non-zero rewards, which misses any
/// turn whose reward is exactly 0), and λ_T is separate from λ.
///
/// # Errors
/// Shape errors; [`AlgoError::InvalidTurnId`] for ids below −1;
/// [`AlgoError::RewardOnNonPolicyToken`] for a reward on a −1 token;
/// [`AlgoError::InvalidParam`] for a discount or λ outside [0, 1].
pub fn gae_bilevel(
    token_rewards: &[Vec<f32>],
    values: &[Vec<f32>],
    turn_ids: &[Vec<i32>],
    cfg: &BiLevelGaeConfig,
) -> Result<GaeOutput> {
    check_ragged("values", token_rewards, values)?;
    check_ragged("turn_ids", token_rewards, turn_ids)?;
    check_unit_interval("gamma", cfg.gamma)?;
    check_unit_interval("lam", cfg.lam)?;
    check_unit_interval("turn_gamma", cfg.turn_gamma)?;
    check_unit_interval("turn_lam", cfg.turn_lam)?;
    let masks = masks_from_turn_ids(turn_ids)?;
    check_rewards_on_policy(token_rewards, &masks)?;
    let (g, gl) = (cfg.gamma as f64, cfg.gamma as f64 * cfg.lam as f64);
    let (gt, gtl) = (
        cfg.turn_gamma as f64,
        cfg.turn_gamma as f64 * cfg.turn_lam as f64,
    );

    let mut advantages = Vec::with_capacity(token_rewards.len());
    let mut returns = Vec::with_capacity(token_rewards.len());
    for ((r, v), ids) in token_rewards.iter().zip(values).zip(turn_ids) {
        // Positions of each turn, turns ordered by id.
        let mut turns: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (p, &k) in ids.iter().enumerate() {
            if k >= 0 {
                turns.entry(k).or_default().push(p);
            }
        }
        let turns: Vec<Vec<usize>> = turns.into_values().collect();
        let turn_value = |k: usize| turns[k].last().map_or(0.0, |&e| v[e] as f64);

        // Turn level, backwards across turns.
        let mut turn_adv = vec![0.0f64; turns.len()];
        let mut next_adv = 0.0f64;
        for k in (0..turns.len()).rev() {
            let reward: f64 = turns[k].iter().map(|&p| r[p] as f64).sum();
            let next_value = if k + 1 < turns.len() {
                turn_value(k + 1)
            } else {
                0.0
            };
            let delta = reward + gt * next_value - turn_value(k);
            next_adv = delta + gtl * next_adv;
            turn_adv[k] = next_adv;
        }

        // Token level inside each turn, bootstrapping from y_k.
        let mut adv = vec![0.0f32; r.len()];
        let mut ret = vec![0.0f32; r.len()];
        for (k, positions) in turns.iter().enumerate() {
            let n = positions.len();
            let mut a = turn_adv[k]; // A[e_k] = y_k − V[e_k] = Â_k
            for j in (0..n).rev() {
                let p = positions[j];
                if j + 1 < n {
                    let delta = g * v[positions[j + 1]] as f64 - v[p] as f64;
                    a = delta + gl * a;
                }
                adv[p] = a as f32;
                ret[p] = (a + v[p] as f64) as f32;
            }
        }
        advantages.push(adv);
        returns.push(ret);
    }
    if cfg.whiten {
        advantages = masked_whiten(&advantages, &masks)?;
    }
    Ok(GaeOutput {
        advantages,
        returns,
    })
}

/// The loss mask implied by turn ids: 1 where `turn_id >= 0`, 0 where −1.
///
/// # Errors
/// [`AlgoError::InvalidTurnId`] for an id below −1.
pub fn masks_from_turn_ids(turn_ids: &[Vec<i32>]) -> Result<Vec<Vec<f32>>> {
    turn_ids
        .iter()
        .enumerate()
        .map(|(seq, ids)| {
            ids.iter()
                .enumerate()
                .map(|(pos, &k)| match k {
                    -1 => Ok(0.0),
                    k if k >= 0 => Ok(1.0),
                    k => Err(AlgoError::InvalidTurnId {
                        seq,
                        pos,
                        turn_id: k,
                        reason: "must be >= 0 for policy tokens or -1 otherwise".into(),
                    }),
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::close_rows as close;

    // [obs, p, p | obs | p, p]: turn 1 = positions 1–2 (penalty −0.1 on its
    // last token), turn 2 = positions 4–5 (outcome 1.0 on the last policy
    // token). Observation values are 9.0 so any leak of them shows.
    type Rows = Vec<Vec<f32>>;

    /// `out` holds one episode with these advantages and returns (within 1e-6).
    fn close_episode(out: &GaeOutput, advantages: &[f32], returns: &[f32]) {
        close(&out.advantages, &[advantages.to_vec()], 1e-6);
        close(&out.returns, &[returns.to_vec()], 1e-6);
    }

    /// Bi-level GAE with every γ and λ 1 and no whitening.
    fn undiscounted() -> BiLevelGaeConfig {
        BiLevelGaeConfig {
            gamma: 1.0,
            lam: 1.0,
            turn_gamma: 1.0,
            turn_lam: 1.0,
            whiten: false,
        }
    }

    fn two_turn() -> (Rows, Rows, Rows) {
        (
            vec![vec![0.0, 0.0, -0.1, 0.0, 0.0, 1.0]],
            vec![vec![9.0, 0.5, 0.4, 9.0, 0.6, 0.7]],
            vec![vec![0.0, 1.0, 1.0, 0.0, 1.0, 1.0]],
        )
    }

    #[test]
    fn gae_gamma1_lam1_is_return_minus_value() {
        // returns-to-go over policy tokens: 0.9, 0.9, 1.0, 1.0
        // A = G − V = 0.9−0.5, 0.9−0.4, 1.0−0.6, 1.0−0.7 = 0.4, 0.5, 0.4, 0.3
        let (r, v, m) = two_turn();
        let out = gae(&r, &v, &m, 1.0, 1.0, false).unwrap();
        close(&out.advantages, &[vec![0.0, 0.4, 0.5, 0.0, 0.4, 0.3]], 1e-6);
        close(&out.returns, &[vec![0.0, 0.9, 0.9, 0.0, 1.0, 1.0]], 1e-6);
    }

    #[test]
    fn gae_multi_turn_skips_observation_tokens() {
        // γ = 0.9, λ = 0.8, γλ = 0.72; backwards over policy tokens:
        //   t=5: δ = 1 + 0 − 0.7 = 0.3                 A = 0.3
        //   t=4: δ = 0 + 0.9·0.7 − 0.6 = 0.03          A = 0.03 + 0.72·0.3 = 0.246
        //   t=2: δ = −0.1 + 0.9·0.6 − 0.4 = 0.04       A = 0.04 + 0.72·0.246 = 0.21712
        //   t=1: δ = 0 + 0.9·0.4 − 0.5 = −0.14         A = −0.14 + 0.72·0.21712 = 0.0163264
        // returns = A + V = 0.5163264, 0.61712, 0.846, 1.0
        let (r, v, m) = two_turn();
        let out = gae(&r, &v, &m, 0.9, 0.8, false).unwrap();
        // The one episode's advantages, then its returns.
        close_episode(
            &out,
            &[0.0, 0.0163264, 0.21712, 0.0, 0.246, 0.3],
            &[0.0, 0.5163264, 0.61712, 0.0, 0.846, 1.0],
        );
        // Whitened: mean = 0.7794464/4 = 0.1948616, unbiased std = 0.1238810
        // A_w = (A − mean)/std; returns unchanged.
        let w = gae(&r, &v, &m, 0.9, 0.8, true).unwrap();
        close(
            &w.advantages,
            &[vec![0.0, -1.441183, 0.179676, 0.0, 0.412803, 0.848705]],
            1e-4,
        );
        assert_eq!(w.returns, out.returns);
    }

    #[test]
    fn gae_bilevel_two_turns() {
        // turn rewards r_0 = −0.1, r_1 = 1.0; turn values V_0 = V[2] = 0.4,
        // V_1 = V[5] = 0.7; γ_T = 0.95, λ_T = 0.9 (γ_Tλ_T = 0.855).
        //   k=1: δ = 1.0 − 0.7 = 0.3                      Â_1 = 0.3,    y_1 = 1.0
        //   k=0: δ = −0.1 + 0.95·0.7 − 0.4 = 0.165        Â_0 = 0.165 + 0.855·0.3 = 0.4215,
        //                                                  y_0 = 0.8215
        // token level, γ = 0.9, λ = 0.8 (γλ = 0.72):
        //   turn 0: A[2] = 0.4215;  A[1] = 0.9·0.4 − 0.5 + 0.72·0.4215 = 0.16348
        //   turn 1: A[5] = 0.3;     A[4] = 0.9·0.7 − 0.6 + 0.72·0.3 = 0.246
        // returns = A + V = 0.66348, 0.8215, 0.846, 1.0
        let (r, v, _) = two_turn();
        let ids = vec![vec![-1, 0, 0, -1, 1, 1]];
        let cfg = BiLevelGaeConfig {
            gamma: 0.9,
            lam: 0.8,
            turn_gamma: 0.95,
            turn_lam: 0.9,
            whiten: false,
        };
        let out = gae_bilevel(&r, &v, &ids, &cfg).unwrap();
        // The one episode's advantages, then its returns.
        close_episode(
            &out,
            &[0.0, 0.16348, 0.4215, 0.0, 0.246, 0.3],
            &[0.0, 0.66348, 0.8215, 0.0, 0.846, 1.0],
        );
    }

    #[test]
    fn gae_bilevel_counts_zero_reward_turns() {
        // A middle turn with reward exactly 0 is still a turn (RAGEN would
        // merge it into the next one). γ_T = λ_T = γ = λ = 1, values 0:
        // every token's advantage is the total future reward 1.0.
        let r = vec![vec![0.0, 0.0, 0.0, 1.0]];
        let v = vec![vec![0.0; 4]];
        let ids = vec![vec![0, -1, 1, 2]];
        let cfg = undiscounted();
        let out = gae_bilevel(&r, &v, &ids, &cfg).unwrap();
        close(&out.advantages, &[vec![1.0, 0.0, 1.0, 1.0]], 1e-6);
    }

    #[test]
    fn gae_rejects_outcome_on_observation_token() {
        let r = vec![vec![0.0, 1.0]];
        let v = vec![vec![0.0, 0.0]];
        let m = vec![vec![1.0, 0.0]];
        assert!(matches!(
            gae(&r, &v, &m, 1.0, 1.0, false),
            Err(AlgoError::RewardOnNonPolicyToken { pos: 1, .. })
        ));
        let ids = vec![vec![0, -2]];
        let cfg = undiscounted();
        assert!(matches!(
            gae_bilevel(&[vec![0.0, 0.0]], &v, &ids, &cfg),
            Err(AlgoError::InvalidTurnId { turn_id: -2, .. })
        ));
    }
}
