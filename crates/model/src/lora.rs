//! LoRA adapters (Hu et al., 2021) on the attention and MLP projections,
//! in PEFT's layout.
//!
//! An adapted projection computes `x·(W + s·B·A)ᵀ` with `A: [r, in]`,
//! `B: [out, r]` and `s = lora_alpha / r` (`lora_alpha / √r` with rsLoRA).
//! The base weight W stays frozen. On the fused CPU training path each
//! layer's op takes A and B beside the frozen base and adds `s·(x·Aᵀ)·Bᵀ`
//! itself, so its backward computes A's and B's gradients with rank-sized
//! products and no weight gradient (`LoraAdapter::factors`,
//! `crate::lora_layer`). Elsewhere (the composite path, inference) the
//! adapted weight `W + s·B·A` is built with candle ops, so autograd hands A
//! and B their gradients through it. Neither path has dropout on the
//! adapter's input: an adapter with `lora_dropout > 0` serves (dropout is
//! off at inference) but is refused for training
//! ([`LoraAdapter::check_trainable`]).
//!
//! On disk, `adapter_config.json` and `adapter_model.safetensors` with
//! PEFT's tensor names
//! (`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`),
//! which PEFT's `PeftModel.from_pretrained` and vLLM's `/v1/load_lora_adapter` read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::checkpoint::write_tensors;
use crate::qwen2::Model;
use crate::{ModelConfig, ModelError};

/// The PEFT adapter's configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The PEFT adapter's weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// Where a checkpoint directory keeps its adapter: beside the base weights
/// (which transformers then loads as a plain model), in this subdirectory.
pub const ADAPTER_DIR: &str = "adapter";
/// PEFT's prefix of every tensor name of a causal-LM adapter.
const PEFT_PREFIX: &str = "base_model.model.";

/// A projection LoRA can adapt, by PEFT's module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    QProj,
    /// `self_attn.k_proj`.
    KProj,
    /// `self_attn.v_proj`.
    VProj,
    /// `self_attn.o_proj`.
    OProj,
    /// `mlp.gate_proj`.
    GateProj,
    /// `mlp.up_proj`.
    UpProj,
    /// `mlp.down_proj`.
    DownProj,
}

impl LoraTarget {
    /// Every projection, in the layer's order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// PEFT's (and transformers') module name, e.g. `q_proj`.
    pub fn name(self) -> &'static str {
        self.module_path()
            .split_once('.')
            .map_or("", |(_, name)| name)
    }

    /// The module's path inside a decoder layer, e.g. `self_attn.q_proj`.
    pub fn module_path(self) -> &'static str {
        match self {
            LoraTarget::QProj => "self_attn.q_proj",
            LoraTarget::KProj => "self_attn.k_proj",
            LoraTarget::VProj => "self_attn.v_proj",
            LoraTarget::OProj => "self_attn.o_proj",
            LoraTarget::GateProj => "mlp.gate_proj",
            LoraTarget::UpProj => "mlp.up_proj",
            LoraTarget::DownProj => "mlp.down_proj",
        }
    }

    /// The module named `name` (PEFT's names), or an error listing them.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                format!(
                    "unknown module `{name}` in target_modules (LoRA here adapts {})",
                    Self::ALL.map(Self::name).join(", ")
                )
            })
    }

    /// The projection weight's `(out, in)` under `cfg`.
    pub fn shape(self, cfg: &ModelConfig) -> (usize, usize) {
        let d = cfg.hidden_size;
        let q = cfg.num_attention_heads * cfg.head_dim();
        let kv = cfg.num_kv_heads() * cfg.head_dim();
        let f = cfg.intermediate_size;
        match self {
            LoraTarget::QProj => (q, d),
            LoraTarget::KProj | LoraTarget::VProj => (kv, d),
            LoraTarget::OProj => (d, q),
            LoraTarget::GateProj | LoraTarget::UpProj => (f, d),
            LoraTarget::DownProj => (d, f),
        }
    }
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An adapter's hyperparameters (PEFT's `LoraConfig` fields of the same names).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank r of every adapter.
    pub r: usize,
    /// `lora_alpha`: the update is scaled by `alpha / r`.
    pub alpha: f64,
    /// `lora_dropout` on the adapter's input; only 0 can be trained here.
    pub dropout: f64,
    /// The adapted projections of every layer.
    pub target_modules: Vec<LoraTarget>,
    /// rsLoRA: scale by `alpha / √r` instead (read from PEFT files; off by default).
    pub use_rslora: bool,
}

impl LoraConfig {
    /// The factor s of `W + s·B·A`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    /// Checks the values: a positive rank, a finite alpha, dropout in
    /// [0, 1), at least one target and none twice.
    pub fn validate(&self) -> Result<(), String> {
        if self.r == 0 {
            return Err("r must be positive".into());
        }
        if !self.alpha.is_finite() {
            return Err(format!("lora_alpha {} must be finite", self.alpha));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!("lora_dropout {} must be in [0, 1)", self.dropout));
        }
        if self.target_modules.is_empty() {
            return Err("target_modules is empty: name at least one projection".into());
        }
        let unique: BTreeSet<_> = self.target_modules.iter().collect();
        if unique.len() != self.target_modules.len() {
            return Err("target_modules names a module twice".into());
        }
        Ok(())
    }
}

/// One adapted projection: `A: [r, in]`, `B: [out, r]`.
#[derive(Debug, Clone)]
struct AdaptedProjection {
    layer: usize,
    target: LoraTarget,
    a: Var,
    b: Var,
}

impl AdaptedProjection {
    /// PEFT's name of this projection's A (`"A"`) or B (`"B"`) weight.
    fn tensor_name(&self, which: &str) -> String {
        peft_tensor_name(self.layer, self.target, which)
    }
}

fn peft_tensor_name(layer: usize, target: LoraTarget, which: &str) -> String {
    format!(
        "{PEFT_PREFIX}model.layers.{layer}.{}.lora_{which}.weight",
        target.module_path()
    )
}

/// An adapter's factors for the fused training forward
/// ([`LoraAdapter::factors`]).
#[derive(Debug, Clone)]
pub(crate) struct LoraFactors {
    /// Per layer: `(target, A, B)` of each adapted projection, in layer order.
    pub layers: Vec<Vec<(LoraTarget, Tensor, Tensor)>>,
    pub rank: usize,
    pub scale: f64,
}

/// The LoRA adapters of one model: an A and a B per adapted projection of every layer.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    config: LoraConfig,
    /// Sorted by (layer, target).
    projections: Vec<AdaptedProjection>,
    /// What the adapter was loaded with, written back when saved alone.
    base_model_name_or_path: Option<String>,
}

impl LoraAdapter {
    /// A fresh adapter as PEFT initialises one: A from Kaiming-uniform with
    /// a = √5 (uniform in ±1/√in), B zeros, so the adapted model starts as
    /// the base. Seeded: the same seed gives the same A on every machine.
    pub fn new_random(
        model: &ModelConfig,
        config: LoraConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(|msg| ModelError::Adapter {
            path: "<in memory>".into(),
            msg,
        })?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut projections = Vec::new();
        for layer in 0..model.num_hidden_layers {
            for &target in &sorted(&config.target_modules) {
                let (out, inp) = target.shape(model);
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f64> = (0..config.r * inp)
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Tensor::from_vec(a, (config.r, inp), device)?.to_dtype(dtype)?;
                let b = Tensor::zeros((out, config.r), dtype, device)?;
                projections.push(AdaptedProjection {
                    layer,
                    target,
                    a: Var::from_tensor(&a)?,
                    b: Var::from_tensor(&b)?,
                });
            }
        }
        Ok(Self {
            config,
            projections,
            base_model_name_or_path: None,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// Every A and B with PEFT's name, sorted by name (a stable order for optimizer state).
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let mut v: Vec<(String, Var)> = self
            .projections
            .iter()
            .flat_map(|p| {
                [
                    (p.tensor_name("A"), p.a.clone()),
                    (p.tensor_name("B"), p.b.clone()),
                ]
            })
            .collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    }

    /// Number of scalar adapter parameters.
    pub fn num_parameters(&self) -> usize {
        self.projections
            .iter()
            .map(|p| p.a.elem_count() + p.b.elem_count())
            .sum()
    }

    /// Fails when the adapter cannot be trained here: dropout on the
    /// adapter's input acts on `x` before A, which a merged weight cannot
    /// express, and ignoring it would train a different model than asked.
    pub fn check_trainable(&self) -> Result<(), ModelError> {
        if self.config.dropout > 0.0 {
            return Err(ModelError::InvalidInput(format!(
                "LoRA dropout {} cannot be trained: the adapter is merged into each layer's weight (W + s·B·A) before the fused layer op, where dropout on the adapter's input has no form; set lora_dropout = 0",
                self.config.dropout
            )));
        }
        Ok(())
    }

    /// `base` with every adapted projection's weight replaced by `W + s·B·A`.
    /// With `detach`, A and B enter as constants (inference, merging);
    /// otherwise the result is differentiable in A and B, and only there
    /// when `base` holds detached weights.
    pub(crate) fn apply(&self, base: &Model, detach: bool) -> Result<Model, ModelError> {
        let mut model = base.clone();
        let s = self.config.scale();
        for p in &self.projections {
            let (a, b) = if detach {
                (p.a.as_tensor().detach(), p.b.as_tensor().detach())
            } else {
                (p.a.as_tensor().clone(), p.b.as_tensor().clone())
            };
            // grad: matmul and affine differentiate in A and B; the add passes
            // the gradient to the delta (the base weight is a constant).
            let delta = b.matmul(&a)?.affine(s, 0.0)?;
            let w = model.projection_mut(p.layer, p.target)?;
            *w = (&*w + delta)?;
        }
        Ok(model)
    }

    /// The adapters as the fused training path reads them: per layer, its
    /// adapted projections in layer order with their A and B (differentiable
    /// in both), beside the rank and scale. The base weights stay as they
    /// are: each layer's op adds the adapters' terms itself.
    pub(crate) fn factors(&self, layers: usize) -> LoraFactors {
        let mut per_layer = vec![Vec::new(); layers];
        // `projections` is sorted by (layer, target): layer order within a layer.
        for p in &self.projections {
            if let Some(l) = per_layer.get_mut(p.layer) {
                l.push((p.target, p.a.as_tensor().clone(), p.b.as_tensor().clone()));
            }
        }
        LoraFactors {
            layers: per_layer,
            rank: self.config.r,
            scale: self.config.scale(),
        }
    }

    /// Each adapted projection's merged weight `W + s·B·A` under its Hugging
    /// Face name (`model.layers.{i}.self_attn.q_proj.weight`), given the base weights by name.
    pub(crate) fn merged_weights(
        &self,
        base: &BTreeMap<String, Tensor>,
    ) -> Result<BTreeMap<String, Tensor>, ModelError> {
        let s = self.config.scale();
        let mut out = BTreeMap::new();
        for p in &self.projections {
            let name = format!("model.layers.{}.{}.weight", p.layer, p.target.module_path());
            let w = base.get(&name).ok_or_else(|| ModelError::MissingTensor {
                name: name.clone(),
                path: "<in memory>".into(),
            })?;
            let delta =
                p.b.as_tensor()
                    .detach()
                    .matmul(&p.a.as_tensor().detach())?
                    .affine(s, 0.0)?;
            out.insert(name, (w.detach() + delta)?);
        }
        Ok(out)
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` (f32)
    /// into `dir`, each atomically. `base_model_name_or_path` names the base
    /// (written as JSON null when unknown).
    pub fn save(
        &self,
        dir: &Path,
        base_model_name_or_path: Option<&str>,
    ) -> Result<(), ModelError> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let base = base_model_name_or_path.or(self.base_model_name_or_path.as_deref());
        let c = &self.config;
        let targets: Vec<&str> = c.target_modules.iter().map(|t| t.name()).collect();
        // Every field PEFT's LoraConfig needs to read the adapter back as
        // trained; the rest keep PEFT's defaults.
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": c.r,
            "lora_alpha": c.alpha,
            "lora_dropout": c.dropout,
            "target_modules": targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": c.use_rslora,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        });
        let path = dir.join(ADAPTER_CONFIG_FILE);
        let text = serde_json::to_string_pretty(&config).map_err(|e| ModelError::Adapter {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        agentrl_durable::write(&path, text).map_err(|e| ModelError::io(&path, e))?;
        let tensors: BTreeMap<String, Tensor> = self
            .named_vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        write_tensors(&dir.join(ADAPTER_WEIGHTS_FILE), &tensors)
    }

    /// Reads a PEFT adapter directory for a model of configuration `model`,
    /// in `dtype` on `device`. Anything this crate would have to ignore to
    /// load it (DoRA, biases, rank patterns, a module it does not adapt, a
    /// tensor too many or missing, a shape off the rank) is an error naming it.
    pub fn load(
        dir: &Path,
        model: &ModelConfig,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
        let bad = |path: &Path, msg: String| ModelError::Adapter {
            path: path.to_path_buf(),
            msg,
        };
        let json: Value =
            serde_json::from_str(&text).map_err(|e| bad(&config_path, e.to_string()))?;
        let (config, base) = parse_peft_config(&json).map_err(|m| bad(&config_path, m))?;
        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        let bytes = std::fs::read(&weights_path).map_err(|e| ModelError::io(&weights_path, e))?;
        let mut stored = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .map_err(|e| bad(&weights_path, e.to_string()))?;
        let mut projections = Vec::new();
        for layer in 0..model.num_hidden_layers {
            for &target in &sorted(&config.target_modules) {
                let (out, inp) = target.shape(model);
                let mut take = |which: &str, shape: [usize; 2]| -> Result<Var, ModelError> {
                    let name = peft_tensor_name(layer, target, which);
                    let t = stored
                        .remove(&name)
                        .ok_or_else(|| bad(&weights_path, format!("missing tensor `{name}`")))?;
                    if t.dims() != shape {
                        let rank_at = if which == "A" { 0 } else { 1 };
                        let rank_off = t.dims().len() == 2 && t.dims()[rank_at] != config.r;
                        return Err(bad(
                            &weights_path,
                            format!(
                                "tensor `{name}` has shape {:?}, expected {shape:?}{}",
                                t.dims(),
                                if rank_off {
                                    format!(
                                        " (rank mismatch: adapter_config.json says r = {})",
                                        config.r
                                    )
                                } else {
                                    String::new()
                                }
                            ),
                        ));
                    }
                    Ok(Var::from_tensor(&t.to_dtype(dtype)?.to_device(device)?)?)
                };
                let a = take("A", [config.r, inp])?;
                let b = take("B", [out, config.r])?;
                projections.push(AdaptedProjection {
                    layer,
                    target,
                    a,
                    b,
                });
            }
        }
        if let Some(extra) = stored.keys().next() {
            return Err(bad(
                &weights_path,
                format!(
                    "unexpected tensor `{extra}`: not the lora_A/lora_B weight of a module target_modules lists ({}) in one of the model's {} layers",
                    config.target_modules.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
                    model.num_hidden_layers
                ),
            ));
        }
        Ok(Self {
            config,
            projections,
            base_model_name_or_path: base,
        })
    }
}

/// The targets in the layer's order.
fn sorted(targets: &[LoraTarget]) -> Vec<LoraTarget> {
    let set: BTreeSet<LoraTarget> = targets.iter().copied().collect();
    set.into_iter().collect()
}

/// The adapter configuration in PEFT's `adapter_config.json`, and its
/// `base_model_name_or_path`; an error for anything that would change the
/// model in a way this crate does not implement.
fn parse_peft_config(json: &Value) -> Result<(LoraConfig, Option<String>), String> {
    let get = |key: &str| json.get(key).filter(|v| !v.is_null());
    match get("peft_type").and_then(Value::as_str) {
        Some("LORA") => {}
        Some(other) => return Err(format!("peft_type `{other}` is not LORA")),
        None => return Err("no peft_type (expected \"LORA\")".into()),
    }
    if let Some(task) = get("task_type") {
        if task.as_str() != Some("CAUSAL_LM") {
            return Err(format!("task_type {task} is not CAUSAL_LM"));
        }
    }
    let r = get("r")
        .and_then(Value::as_u64)
        .ok_or("r is missing or not a positive integer")? as usize;
    let alpha = get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or("lora_alpha is missing or not a number")?;
    // PEFT's own default when the key is absent.
    let dropout = match get("lora_dropout") {
        None => 0.0,
        Some(v) => v.as_f64().ok_or("lora_dropout is not a number")?,
    };
    let target_modules = match get("target_modules") {
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| {
                n.as_str()
                    .ok_or_else(|| format!("target_modules entry {n} is not a string"))
                    .and_then(LoraTarget::parse)
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::String(s)) => {
            return Err(format!(
                "target_modules `{s}` is a regular expression; only a list of module names is supported"
            ))
        }
        _ => return Err("target_modules is missing or not a list".into()),
    };
    let flag = |key: &str| get(key).and_then(Value::as_bool).unwrap_or(false);
    for (key, what) in [
        ("fan_in_fan_out", "transposed (Conv1D) weights"),
        ("use_dora", "DoRA"),
        ("lora_bias", "LoRA biases"),
    ] {
        if flag(key) {
            return Err(format!("{key} = true ({what}) is not supported"));
        }
    }
    if let Some(bias) = get("bias") {
        if bias.as_str() != Some("none") {
            return Err(format!("bias {bias} is not supported (only \"none\")"));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if get(key)
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
        {
            return Err(format!(
                "{key} is not supported (one r and alpha for every module)"
            ));
        }
    }
    for key in [
        "layers_to_transform",
        "modules_to_save",
        "layer_replication",
    ] {
        if get(key).is_some_and(|v| !v.as_array().is_some_and(Vec::is_empty)) {
            return Err(format!("{key} is not supported"));
        }
    }
    let config = LoraConfig {
        r,
        alpha,
        dropout,
        target_modules,
        use_rslora: flag("use_rslora"),
    };
    config.validate()?;
    let base = get("base_model_name_or_path")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok((config, base))
}

/// Where a checkpoint directory's adapter would be, if it has one.
pub fn adapter_dir_of(checkpoint: &Path) -> Option<PathBuf> {
    let dir = checkpoint.join(ADAPTER_DIR);
    dir.join(ADAPTER_CONFIG_FILE).is_file().then_some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LoraConfig {
        LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.0,
            target_modules: vec![LoraTarget::QProj, LoraTarget::DownProj],
            use_rslora: false,
        }
    }

    #[test]
    fn targets_parse_by_peft_names_and_reject_others() {
        for t in LoraTarget::ALL {
            assert_eq!(LoraTarget::parse(t.name()), Ok(t));
        }
        let e = LoraTarget::parse("lm_head").unwrap_err();
        assert!(
            e.contains("unknown module `lm_head`") && e.contains("q_proj"),
            "{e}"
        );
    }

    #[test]
    fn peft_config_round_trips_and_refuses_what_is_not_implemented() {
        let (c, base) = parse_peft_config(&json!({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
            "target_modules": ["q_proj", "down_proj"], "bias": "none",
            "base_model_name_or_path": "Qwen/Qwen2.5-0.5B", "rank_pattern": {},
            "modules_to_save": null, "layers_to_transform": null,
        }))
        .unwrap();
        assert_eq!(c, config());
        assert_eq!(c.scale(), 2.0);
        assert_eq!(base.as_deref(), Some("Qwen/Qwen2.5-0.5B"));
        let ok =
            json!({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]});
        for (key, value, says) in [
            ("peft_type", json!("IA3"), "peft_type `IA3`"),
            ("use_dora", json!(true), "DoRA"),
            ("bias", json!("all"), "bias"),
            ("target_modules", json!(".*proj"), "regular expression"),
            (
                "target_modules",
                json!(["q_proj", "embed_tokens"]),
                "unknown module `embed_tokens`",
            ),
            ("rank_pattern", json!({"q_proj": 8}), "rank_pattern"),
            ("modules_to_save", json!(["lm_head"]), "modules_to_save"),
            ("r", json!(0), "r must be positive"),
            ("fan_in_fan_out", json!(true), "fan_in_fan_out"),
        ] {
            let mut j = ok.clone();
            j[key] = value;
            let e = parse_peft_config(&j).unwrap_err();
            assert!(e.contains(says), "{key}: {e}");
        }
    }

    #[test]
    fn validate_names_each_bad_value() {
        let bad = [
            (LoraConfig { r: 0, ..config() }, "r must"),
            (
                LoraConfig {
                    dropout: 1.0,
                    ..config()
                },
                "lora_dropout",
            ),
            (
                LoraConfig {
                    alpha: f64::NAN,
                    ..config()
                },
                "lora_alpha",
            ),
            (
                LoraConfig {
                    target_modules: vec![],
                    ..config()
                },
                "empty",
            ),
            (
                LoraConfig {
                    target_modules: vec![LoraTarget::QProj, LoraTarget::QProj],
                    ..config()
                },
                "twice",
            ),
        ];
        for (c, says) in bad {
            assert!(c.validate().unwrap_err().contains(says), "{c:?}");
        }
        assert_eq!(
            LoraConfig {
                use_rslora: true,
                ..config()
            }
            .scale(),
            4.0
        );
    }
}
