//! RL algorithms for agentrl as pure, hand-checked functions.
//!
//! - [`advantage`]: GAE (token-level and bi-level), GRPO / Dr.GRPO, RLOO,
//!   REINFORCE++, GiGPO, and helpers to spread advantages onto tokens — on
//!   plain `f32` slices.
//! - [`filter`]: the StarPO-S top-std group filter and RAGEN-2's SNR-adaptive one.
//! - [`template_collapse`]: RAGEN-2's H(Z|X) and I(X;Z) diagnostics.
//! - [`loss`]: PPO clipped policy loss (ε_low / ε_high, dual clip), KL
//!   estimators k1/k2/k3, clipped value loss, entropy, loss aggregation — on
//!   candle tensors `[B, T]`.
//!
//! Names follow verl so that configs port by eye: `adv_estimator`
//! ([`AdvEstimator`]), `kl_loss_type` ([`KlKind`]), `loss_agg_mode`
//! ([`LossAgg`]). Every function states its formula in its doc comment and
//! validates its inputs instead of panicking.

use serde::{Deserialize, Serialize};

/// `as_str`, `Display` and `FromStr` of a config enum from one table of
/// `Variant => "name" | "alias"…` (the serde attributes spell the same
/// names; a test checks they agree).
macro_rules! config_names {
    ($ty:ident, $key:literal, $expected:literal,
     { $($variant:ident => $name:literal $(| $alias:literal)*),+ $(,)? }) => {
        impl $ty {
            /// The config string (verl name).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::AlgoError;
            fn from_str(s: &str) -> $crate::Result<Self> {
                match s {
                    $($name $(| $alias)* => Ok($ty::$variant),)+
                    _ => Err($crate::AlgoError::UnknownName {
                        kind: $key,
                        name: s.to_string(),
                        expected: $expected,
                    }),
                }
            }
        }
    };
}

pub mod advantage;
pub mod error;
pub mod filter;
pub mod loss;
pub mod stats;
pub mod template_collapse;

pub use advantage::gae::masks_from_turn_ids;
pub use advantage::{
    gae, gae_bilevel, gigpo, grpo, kl_in_reward, reinforce_plus_plus, rloo, sequence_to_tokens,
    turns_to_tokens, BiLevelGaeConfig, GaeOutput, GRPO_EPS,
};
pub use error::{AlgoError, Result};
pub use filter::{snr_groups, top_std_groups, GroupFilterResult};
pub use loss::{
    aggregate, entropy_bonus, entropy_from_logits, kl_penalty, ppo_policy_loss, ragged_to_tensor,
    value_loss, KlKind, LossAgg, PolicyLoss, PpoClip, ValueLoss,
};
pub use stats::{explained_variance, masked_mean, masked_whiten, unbiased_std};
pub use template_collapse::{template_collapse, TemplateCollapse};

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

config_names!(AdvEstimator, "adv_estimator", "gae, grpo, rloo, reinforce_plus_plus, gigpo", {
    Gae => "gae",
    Grpo => "grpo",
    Rloo => "rloo",
    ReinforcePlusPlus => "reinforce_plus_plus",
    Gigpo => "gigpo",
});

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    /// `name` parses to `value`, and serde reads it and writes `written`.
    fn same_name<T>(name: &str, written: &str, value: T)
    where
        T: std::str::FromStr
            + Serialize
            + serde::de::DeserializeOwned
            + PartialEq
            + std::fmt::Debug,
        T::Err: std::fmt::Debug,
    {
        assert_eq!(name.parse::<T>().unwrap(), value);
        let json = format!("\"{name}\"");
        assert_eq!(serde_json::from_str::<T>(&json).unwrap(), value, "{name}");
        assert_eq!(
            serde_json::to_string(&value).unwrap(),
            format!("\"{written}\"")
        );
    }

    #[test]
    fn config_names_agree_between_fromstr_and_serde() {
        for e in AdvEstimator::ALL {
            same_name(e.as_str(), e.as_str(), e);
        }
        assert!("ppo".parse::<AdvEstimator>().is_err());
        for (name, written, kind) in [
            ("kl", "kl", KlKind::Kl),
            ("k1", "kl", KlKind::Kl),
            ("mse", "mse", KlKind::Mse),
            ("k2", "mse", KlKind::Mse),
            ("low_var_kl", "low_var_kl", KlKind::LowVarKl),
            ("k3", "low_var_kl", KlKind::LowVarKl),
        ] {
            same_name(name, written, kind);
        }
        for agg in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenMean,
        ] {
            same_name(agg.as_str(), agg.as_str(), agg);
        }
        assert!("token_mean".parse::<LossAgg>().is_err());
    }
}
