//! The `[lora]` section: train LoRA adapters on a frozen base instead of
//! every weight (off by default).

use agentrl_model::{LoraConfig, LoraTarget};
use serde::{Deserialize, Serialize};

/// LoRA for RL: adapters on the projections `target_modules` names
/// (PEFT's names), saved with every checkpoint in PEFT's layout
/// (`checkpoints/*/adapter/`). The SFT warm start, when there is one,
/// trains the whole model first; the adapter is attached after it, on the
/// warmed-up model as the frozen base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    /// Train LoRA adapters (RL updates only them and a value head).
    pub enabled: bool,
    /// Rank of every adapter.
    pub r: usize,
    /// The update is scaled by `lora_alpha / r`.
    pub lora_alpha: f64,
    /// Dropout on the adapter's input: only 0 can be trained here (the
    /// layer ops have no dropout; a trained adapter serves with any value).
    pub lora_dropout: f64,
    /// The adapted projections of every layer, PEFT's names: q_proj,
    /// k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
    pub target_modules: Vec<String>,
    /// Seed of A's initialisation (B starts at zero).
    pub init_seed: u64,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            enabled: false,
            r: 8,
            lora_alpha: 16.0,
            lora_dropout: 0.0,
            target_modules: LoraTarget::ALL
                .iter()
                .map(|t| t.name().to_string())
                .collect(),
            init_seed: 0,
        }
    }
}

impl LoraSection {
    /// Whether the section is the default one (left out of a run's `config.toml`).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The adapter's hyperparameters, or `(lora.key, why)` for the first bad value.
    pub fn adapter_config(&self) -> Result<LoraConfig, (String, String)> {
        let target_modules = self
            .target_modules
            .iter()
            .map(|name| LoraTarget::parse(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| ("lora.target_modules".to_string(), why))?;
        let config = LoraConfig {
            r: self.r,
            alpha: self.lora_alpha,
            dropout: self.lora_dropout,
            target_modules,
            use_rslora: false,
        };
        config.validate().map_err(|why| {
            // LoraConfig's messages start with the PEFT key they are about.
            let key = why.split(' ').next().unwrap_or_default();
            (format!("lora.{key}"), why)
        })?;
        Ok(config)
    }

    /// Values out of range or that cannot be trained, as `(lora.key, why)`;
    /// none when LoRA is off.
    pub fn problems(&self) -> Vec<(String, String)> {
        if !self.enabled {
            return Vec::new();
        }
        let mut out = Vec::new();
        if let Err(problem) = self.adapter_config() {
            out.push(problem);
        }
        if self.lora_dropout > 0.0 {
            out.push((
                "lora.lora_dropout".to_string(),
                format!(
                    "{} cannot be trained: the adapter is merged into each layer's weight (W + s·B·A) before the fused layer op, where dropout on the adapter's input has no form; set it to 0",
                    self.lora_dropout
                ),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_every_bad_value_is_named() {
        let d = LoraSection::default();
        assert!(!d.enabled && d.problems().is_empty());
        assert_eq!(d.adapter_config().unwrap().target_modules.len(), 7);
        let on = LoraSection { enabled: true, ..d };
        assert!(on.problems().is_empty());
        for (bad, key) in [
            (LoraSection { r: 0, ..on.clone() }, "lora.r"),
            (
                LoraSection {
                    lora_dropout: 0.1,
                    ..on.clone()
                },
                "lora.lora_dropout",
            ),
            (
                LoraSection {
                    target_modules: vec!["q_proj".into(), "qproj".into()],
                    ..on.clone()
                },
                "lora.target_modules",
            ),
            (
                LoraSection {
                    target_modules: vec![],
                    ..on.clone()
                },
                "lora.target_modules",
            ),
        ] {
            let problems = bad.problems();
            assert!(
                problems.iter().any(|(k, _)| k == key),
                "{key}: {problems:?}"
            );
        }
    }
}
