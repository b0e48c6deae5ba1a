//! The model configuration, deserialised from a Hugging Face `config.json`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// Most parameters a configuration may describe: 10^11, 400 GB of f32
/// weights before gradients and optimizer state. A larger count is a typo
/// (a digit too many in `vocab_size`) that would otherwise abort the process
/// on a failed allocation instead of failing with a message.
pub const MAX_PARAMETERS: u64 = 100_000_000_000;

/// Most positions the rotary tables are built for (2^24; the longest
/// released context is 10M).
pub const MAX_POSITIONS: usize = 1 << 24;

/// The rotary-embedding block transformers 5 writes (`rope_parameters`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RopeParameters {
    /// The rotary base θ.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Only `"default"` (plain RoPE) is supported.
    #[serde(default)]
    pub rope_type: Option<String>,
    /// Anything else transformers wrote here, kept for round-tripping.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A Qwen2/Llama-family configuration as found in Hugging Face `config.json`.
///
/// Unknown keys are kept in `extra` so that a loaded-then-saved config keeps
/// everything transformers needs.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ModelConfig {
    /// `"qwen2"` or `"llama"` (others of the same architecture are accepted).
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// Vocabulary size (rows of the embedding matrix).
    pub vocab_size: usize,
    /// Model width d.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (grouped-query attention); defaults to the query heads.
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// RMSNorm ε.
    #[serde(default = "default_rms_eps")]
    pub rms_norm_eps: f64,
    /// Rotary base as released Qwen2.5/Llama checkpoints write it.
    pub rope_theta: Option<f64>,
    /// Rotary base as transformers 5 writes it.
    pub rope_parameters: Option<RopeParameters>,
    /// Longest sequence the rotary tables are built for.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have biases; defaults to true for `qwen2`, false otherwise.
    pub attention_bias: Option<bool>,
    /// Standard deviation of the normal initialisation.
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Must be `"silu"` (SwiGLU).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Every other key of `config.json`, kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn default_model_type() -> String {
    "qwen2".to_string()
}
fn default_rms_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    4096
}
fn default_init_range() -> f64 {
    0.02
}
fn default_act() -> String {
    "silu".to_string()
}

impl ModelConfig {
    /// A small Qwen2-style config for models trained from scratch: d 128,
    /// 4 layers, 4 query heads / 2 key-value heads, ffn 448 (3.5×), tied
    /// embeddings, q/k/v biases, θ = 10000, 2048 positions.
    pub fn tiny(vocab_size: usize) -> Self {
        Self::new_qwen2(vocab_size, 128, 4, 4, 2, 448)
    }

    /// A Qwen2-style config with the given shape (tied embeddings, q/k/v
    /// biases, θ = 10000, 2048 positions, init std 0.02).
    pub fn new_qwen2(
        vocab_size: usize,
        hidden_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
        intermediate_size: usize,
    ) -> Self {
        let mut extra = BTreeMap::new();
        extra.insert(
            "architectures".to_string(),
            serde_json::json!(["Qwen2ForCausalLM"]),
        );
        ModelConfig {
            model_type: "qwen2".to_string(),
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: Some(num_key_value_heads),
            head_dim: None,
            rms_norm_eps: 1e-6,
            rope_theta: Some(10_000.0),
            rope_parameters: Some(RopeParameters {
                rope_theta: Some(10_000.0),
                rope_type: Some("default".to_string()),
                extra: BTreeMap::new(),
            }),
            max_position_embeddings: 2048,
            tie_word_embeddings: true,
            attention_bias: None,
            initializer_range: 0.02,
            hidden_act: "silu".to_string(),
            extra,
        }
    }

    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let cfg: ModelConfig = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        cfg.validate().map_err(|msg| ModelError::Config {
            path: path.to_path_buf(),
            msg,
        })?;
        Ok(cfg)
    }

    /// The configuration of a model source: the metadata of a GGUF file
    /// ([`crate::gguf::is_gguf`]), else `config.json` in the directory `path`.
    pub fn from_source(path: &Path) -> Result<Self, ModelError> {
        if crate::gguf::is_gguf(path) {
            crate::gguf::read_config(path)
        } else {
            Self::from_file(&path.join(crate::checkpoint::CONFIG_FILE))
        }
    }

    /// Checks that the configuration describes a model this crate implements
    /// (the first of [`ModelConfig::problems`]).
    pub fn validate(&self) -> Result<(), String> {
        match self.problems().into_iter().next() {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }

    /// Everything that keeps this configuration from describing a model this
    /// crate implements and can hold in memory, each message starting with
    /// the key it is about.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_kv_heads()),
            ("head_dim", self.head_dim()),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in positive {
            if v == 0 {
                out.push(format!("{name} must be positive"));
            }
        }
        if self.num_kv_heads() > 0 && !self.num_attention_heads.is_multiple_of(self.num_kv_heads())
        {
            out.push(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.num_kv_heads()
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            out.push(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        if self.max_position_embeddings > MAX_POSITIONS {
            out.push(format!(
                "max_position_embeddings {} is more than the {MAX_POSITIONS} positions a rotary table is built for",
                self.max_position_embeddings
            ));
        }
        match self.parameter_count() {
            Some(n) if n <= MAX_PARAMETERS => {}
            count => out.push(format!(
                "vocab_size {} × hidden_size {} with {} layers of intermediate_size {} make {} parameters, more than the {MAX_PARAMETERS} this crate holds (a digit too many?)",
                self.vocab_size,
                self.hidden_size,
                self.num_hidden_layers,
                self.intermediate_size,
                count.map_or("over 2^64".to_string(), |n| n.to_string()),
            )),
        }
        if self.hidden_act != "silu" {
            out.push(format!(
                "hidden_act `{}` is not supported (only silu)",
                self.hidden_act
            ));
        }
        if let Some(rp) = &self.rope_parameters {
            if let Some(t) = &rp.rope_type {
                if t != "default" {
                    out.push(format!("rope_type `{t}` is not supported (only default)"));
                }
            }
        }
        if let Some(v) = self.extra.get("rope_scaling") {
            if !v.is_null() {
                out.push("rope_scaling is not supported".to_string());
            }
        }
        if let Some(v) = self.extra.get("mlp_bias") {
            if v.as_bool() == Some(true) {
                out.push("mlp_bias = true is not supported".to_string());
            }
        }
        if !(self.rope_theta().is_finite() && self.rope_theta() > 0.0) {
            out.push("rope_theta must be positive".to_string());
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            out.push("rms_norm_eps must be finite and non-negative".to_string());
        }
        if !(self.initializer_range.is_finite() && self.initializer_range >= 0.0) {
            out.push("initializer_range must be finite and non-negative".to_string());
        }
        out
    }

    /// Number of weights the configuration implies (embeddings; per layer the
    /// attention projections with their q/k/v biases, the SwiGLU MLP and two
    /// norms; the final norm; an untied LM head), or `None` when the count
    /// overflows 64 bits. The value head is not counted.
    pub fn parameter_count(&self) -> Option<u64> {
        let n = |x: usize| x as u64;
        let (d, v, hd) = (n(self.hidden_size), n(self.vocab_size), n(self.head_dim()));
        let q_width = n(self.num_attention_heads).checked_mul(hd)?;
        let kv_width = n(self.num_kv_heads()).checked_mul(hd)?;
        let bias = if self.qkv_bias() {
            q_width.checked_add(kv_width.checked_mul(2)?)?
        } else {
            0
        };
        let attention = d
            .checked_mul(q_width.checked_add(kv_width.checked_mul(2)?)?)?
            .checked_add(q_width.checked_mul(d)?)?
            .checked_add(bias)?;
        let mlp = d.checked_mul(n(self.intermediate_size))?.checked_mul(3)?;
        let layer = attention.checked_add(mlp)?.checked_add(d.checked_mul(2)?)?;
        let embeddings = v.checked_mul(d)?;
        let head = if self.tie_word_embeddings {
            0
        } else {
            embeddings
        };
        n(self.num_hidden_layers)
            .checked_mul(layer)?
            .checked_add(embeddings)?
            .checked_add(head)?
            .checked_add(d)
    }

    /// Key/value heads (GQA); the query head count when unset.
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Rotary base: `rope_parameters.rope_theta`, else top-level `rope_theta`, else 10000.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|r| r.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10_000.0)
    }

    /// Whether q/k/v projections carry biases (Qwen2 yes, Llama no unless `attention_bias`).
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(self.model_type == "qwen2")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyModel;
    use candle_core::Device;

    #[test]
    fn parameter_count_is_the_number_of_weights_a_model_gets() {
        let tied = ModelConfig::new_qwen2(300, 32, 2, 4, 2, 64);
        let untied_llama = ModelConfig {
            model_type: "llama".into(),
            tie_word_embeddings: false,
            ..ModelConfig::new_qwen2(300, 32, 3, 4, 1, 48)
        };
        for cfg in [tied, untied_llama] {
            let model = PolicyModel::new_random(&cfg, false, 0, &Device::Cpu).unwrap();
            assert_eq!(
                cfg.parameter_count(),
                Some(model.num_parameters().unwrap() as u64),
                "{cfg:?}"
            );
        }
    }

    #[test]
    fn an_absurd_shape_is_a_problem_not_an_allocation() {
        let huge = ModelConfig::new_qwen2(1_000_000_000_000, 128, 2, 4, 2, 384);
        let e = huge.validate().unwrap_err();
        assert!(e.starts_with("vocab_size 1000000000000"), "{e}");
        let overflow = ModelConfig::new_qwen2(usize::MAX, usize::MAX / 2, 2, 4, 2, 384);
        assert!(overflow.parameter_count().is_none());
        assert!(
            overflow.problems().iter().any(|p| p.contains("over 2^64")),
            "{:?}",
            overflow.problems()
        );
        let long = ModelConfig {
            max_position_embeddings: 1 << 40,
            ..ModelConfig::new_qwen2(300, 32, 2, 4, 2, 64)
        };
        assert!(long
            .validate()
            .unwrap_err()
            .starts_with("max_position_embeddings"));
        // Every problem is reported, not only the first.
        let zeros = ModelConfig {
            hidden_act: "gelu".into(),
            ..ModelConfig::new_qwen2(0, 32, 0, 4, 2, 64)
        };
        let all = zeros.problems();
        assert!(all.len() >= 3, "{all:?}");
        assert!(ModelConfig::new_qwen2(300, 32, 2, 4, 2, 64)
            .problems()
            .is_empty());
    }
}
