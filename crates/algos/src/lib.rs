//! RL algorithms for agentrl as pure, hand-checked functions.
//!
//! - [`advantage`]: GAE (token-level and bi-level), GRPO / Dr.GRPO, RLOO,
//!   REINFORCE++, GiGPO, and helpers to spread advantages onto tokens — on
//!   plain `f32` slices.
//! - [`filter`]: the StarPO-S top-std group filter.
//! - [`loss`]: PPO clipped policy loss (ε_low / ε_high, dual clip), KL
//!   estimators k1/k2/k3, clipped value loss, entropy, loss aggregation — on
//!   candle tensors `[B, T]`.
//!
//! Names follow verl so that configs port by eye: `adv_estimator`
//! ([`AdvEstimator`]), `kl_loss_type` ([`KlKind`]), `loss_agg_mode`
//! ([`LossAgg`]). Every function states its formula in its doc comment and
//! validates its inputs instead of panicking.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub mod advantage;
pub mod error;
pub mod filter;
pub mod loss;
pub mod stats;

pub use advantage::gae::masks_from_turn_ids;
pub use advantage::{
    gae, gae_bilevel, gigpo, grpo, kl_in_reward, reinforce_plus_plus, rloo, sequence_to_tokens,
    turns_to_tokens, BiLevelGaeConfig, GaeOutput, GRPO_EPS,
};
pub use error::{AlgoError, Result};
pub use filter::{top_std_groups, GroupFilterResult};
pub use loss::{
    aggregate, entropy_bonus, entropy_from_logits, kl_penalty, ppo_policy_loss, ragged_to_tensor,
    value_loss, KlKind, LossAgg, PolicyLoss, PpoClip, ValueLoss,
};
pub use stats::{explained_variance, masked_mean, masked_whiten, unbiased_std};

/// Which advantage estimator the trainer uses (verl `algorithm.adv_estimator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvEstimator {
    /// GAE with a critic ([`gae()`], or [`gae_bilevel`] when bi-level is on).
    Gae,
    /// GRPO / Dr.GRPO ([`grpo()`]).
    #[default]
    Grpo,
    /// RLOO ([`rloo()`]).
    Rloo,
    /// REINFORCE++ ([`reinforce_plus_plus`]).
    ReinforcePlusPlus,
    /// GiGPO ([`gigpo()`]).
    Gigpo,
}

impl AdvEstimator {
    /// All estimators, in config-name order.
    pub const ALL: [AdvEstimator; 5] = [
        AdvEstimator::Gae,
        AdvEstimator::Grpo,
        AdvEstimator::Rloo,
        AdvEstimator::ReinforcePlusPlus,
        AdvEstimator::Gigpo,
    ];

    /// The config string (verl name).
    pub fn as_str(self) -> &'static str {
        match self {
            AdvEstimator::Gae => "gae",
            AdvEstimator::Grpo => "grpo",
            AdvEstimator::Rloo => "rloo",
            AdvEstimator::ReinforcePlusPlus => "reinforce_plus_plus",
            AdvEstimator::Gigpo => "gigpo",
        }
    }

    /// True if the estimator needs a value head (critic).
    pub fn needs_critic(self) -> bool {
        matches!(self, AdvEstimator::Gae)
    }

    /// True if the estimator needs G > 1 samples per task to be meaningful.
    pub fn needs_groups(self) -> bool {
        matches!(
            self,
            AdvEstimator::Grpo | AdvEstimator::Rloo | AdvEstimator::Gigpo
        )
    }
}

impl fmt::Display for AdvEstimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AdvEstimator {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Self> {
        AdvEstimator::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| AlgoError::UnknownName {
                kind: "adv_estimator",
                name: s.to_string(),
                expected: "gae, grpo, rloo, reinforce_plus_plus, gigpo",
            })
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_round_trip_through_fromstr_and_serde() {
        for e in AdvEstimator::ALL {
            assert_eq!(e.as_str().parse::<AdvEstimator>().unwrap(), e);
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(json, format!("\"{}\"", e.as_str()));
            assert_eq!(serde_json::from_str::<AdvEstimator>(&json).unwrap(), e);
        }
        assert!("ppo".parse::<AdvEstimator>().is_err());
        for (name, kind) in [
            ("kl", KlKind::Kl),
            ("mse", KlKind::Mse),
            ("low_var_kl", KlKind::LowVarKl),
        ] {
            assert_eq!(name.parse::<KlKind>().unwrap(), kind);
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{name}\""));
        }
        assert_eq!("k1".parse::<KlKind>().unwrap(), KlKind::Kl);
        assert_eq!(
            serde_json::from_str::<KlKind>("\"k3\"").unwrap(),
            KlKind::LowVarKl
        );
        for (name, agg) in [
            ("token-mean", LossAgg::TokenMean),
            ("seq-mean-token-sum", LossAgg::SeqMeanTokenSum),
            ("seq-mean-token-mean", LossAgg::SeqMeanTokenMean),
        ] {
            assert_eq!(name.parse::<LossAgg>().unwrap(), agg);
            assert_eq!(serde_json::to_string(&agg).unwrap(), format!("\"{name}\""));
        }
        assert!("token_mean".parse::<LossAgg>().is_err());
    }
}
