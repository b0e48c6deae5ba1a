//! The model configuration, deserialised from a Hugging Face `config.json`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// The rotary-embedding block transformers 5 writes (`rope_parameters`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// RMSNorm ε.
    #[serde(default = "default_rms_eps")]
    pub rms_norm_eps: f64,
    /// Rotary base as released Qwen2.5/Llama checkpoints write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Rotary base as transformers 5 writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// Longest sequence the rotary tables are built for.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have biases; defaults to true for `qwen2`, false otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

    /// Checks that the configuration describes a model this crate implements.
    pub fn validate(&self) -> Result<(), String> {
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
                return Err(format!("{name} must be positive"));
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_kv_heads()) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.num_kv_heads()
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        if self.hidden_act != "silu" {
            return Err(format!(
                "hidden_act `{}` is not supported (only silu)",
                self.hidden_act
            ));
        }
        if let Some(rp) = &self.rope_parameters {
            if let Some(t) = &rp.rope_type {
                if t != "default" {
                    return Err(format!("rope_type `{t}` is not supported (only default)"));
                }
            }
        }
        if let Some(v) = self.extra.get("rope_scaling") {
            if !v.is_null() {
                return Err("rope_scaling is not supported".to_string());
            }
        }
        if let Some(v) = self.extra.get("mlp_bias") {
            if v.as_bool() == Some(true) {
                return Err("mlp_bias = true is not supported".to_string());
            }
        }
        if !(self.rope_theta().is_finite() && self.rope_theta() > 0.0) {
            return Err("rope_theta must be positive".to_string());
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 {
            return Err("rms_norm_eps must be non-negative".to_string());
        }
        Ok(())
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
