//! [`PolicyModel`]: the trainable policy (parameters in a `VarMap`), with
//! checkpoint I/O, differentiable per-token log-probs and batched KV-cache sampling.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{read_tensors, write_tensors, CONFIG_FILE, WEIGHTS_FILE};
use crate::decode::SequenceCache;
use crate::lora::{adapter_dir_of, LoraAdapter, LoraConfig, ADAPTER_DIR};
use crate::qwen2::{param_specs, Model, ParamInit, VALUE_HEAD_BIAS, VALUE_HEAD_WEIGHT};
use crate::sampling::{Followup, Generation, SamplingParams, SamplingRng};
use crate::steer::{PromptTokenLogprob, Steer};
use crate::{ModelConfig, ModelError, Precision};
use agentrl_sampling::Steering;

/// Seed of the fresh value head added to a checkpoint that has none.
const VALUE_HEAD_SEED: u64 = 0x5641_4c55_4548_4541;

/// Per-token quantities of a batch of sequences (see [`PolicyModel::sequence_logprobs`]).
#[derive(Debug, Clone)]
pub struct SequenceLogprobs {
    /// `[B, T-1]`: log p(token t+1 | tokens ..=t); 0-padded past each sequence's end.
    pub logprobs: Tensor,
    /// `[B, T-1]`: entropy of the next-token distribution at position t.
    pub entropy: Tensor,
    /// `[B, T]`: value-head output at every position, if the model has a value head.
    pub values: Option<Tensor>,
    /// `[B, T-1]`, same dtype as `logprobs`: 1 where token t+1 is a real token, 0 on padding.
    pub mask: Tensor,
}

/// Per-token log-probs `[B, T-1]`, entropies `[B, T-1]` and values `[B, T]`.
type Outputs = (Tensor, Tensor, Option<Tensor>);

/// Ragged sequences with the dims of their right-padded batch `[B, T]`.
#[derive(Clone, Copy)]
struct Ragged<'a> {
    seqs: &'a [Vec<u32>],
    /// The positions to compute (see [`PolicyModel::scored_logprobs`]); all when `None`.
    scored: Option<&'a [Vec<f32>]>,
    /// The number of sequences.
    b: usize,
    /// The longest sequence's length.
    t: usize,
}

/// The policy: a Qwen2/Llama transformer whose parameters live in `varmap`
/// under their Hugging Face names, plus an optional scalar value head.
pub struct PolicyModel {
    /// The architecture.
    pub config: ModelConfig,
    /// Trainable parameters by Hugging Face name.
    pub varmap: VarMap,
    /// Where the parameters live.
    pub device: Device,
    /// Graph-building model for training (shares storage with `varmap`).
    model: Model,
    /// The same weights detached, for sampling: no autograd graph is built.
    infer: Model,
    dtype: DType,
    with_value_head: bool,
    /// Whether [`PolicyModel::sequence_logprobs`] may use the fused layer ops.
    fused_training: bool,
    /// Whether the fused path computes a prompt that several scored
    /// sequences share once (see [`PolicyModel::set_prefix_sharing`]).
    share_prefixes: bool,
    /// The CPU's large matrix products in the fused forward and backward
    /// (see [`PolicyModel::set_precision`]).
    precision: Precision,
    /// Whether the fused backward recomputes the forward's activations
    /// instead of keeping them (see [`PolicyModel::set_gradient_checkpointing`]).
    recompute_activations: bool,
    /// Whether generation runs through candle's graph ops even where the
    /// host decoder could (it always does off the CPU).
    graph_decode: bool,
    /// The LoRA adapter, when one is attached: then only it (and a value
    /// head) is trained, and every forward sees `W + s·B·A`.
    lora: Option<LoraAdapter>,
    /// The first trained decoder layer, when only the top layers are
    /// trained (see [`PolicyModel::train_top_layers`]).
    first_trained_layer: Option<usize>,
}

impl std::fmt::Debug for PolicyModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyModel")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .field("with_value_head", &self.with_value_head)
            .field("lora", &self.lora.as_ref().map(LoraAdapter::config))
            .finish()
    }
}

/// `n` draws of Normal(0, std) from `rng` (Box–Muller, so identical on every machine).
fn normal_vec(rng: &mut ChaCha8Rng, n: usize, std: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln stays finite
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let a = 2.0 * std::f64::consts::PI * u2;
        out.push(r * a.cos() * std);
        out.push(r * a.sin() * std);
    }
    out.truncate(n);
    out
}

fn init_tensor(
    shape: &[usize],
    init: ParamInit,
    std: f64,
    rng: &mut ChaCha8Rng,
    dtype: DType,
    device: &Device,
) -> Result<Tensor, ModelError> {
    let n: usize = shape.iter().product();
    let t = match init {
        ParamInit::Normal => Tensor::from_vec(normal_vec(rng, n, std), shape, device)?,
        ParamInit::Zeros => Tensor::zeros(shape, DType::F64, device)?,
        ParamInit::Ones => Tensor::ones(shape, DType::F64, device)?,
    };
    Ok(t.to_dtype(dtype)?)
}

impl PolicyModel {
    /// A freshly initialised f32 model (Hugging Face init: normal(0,
    /// `initializer_range`) weights, zero biases, unit norms), seeded so the
    /// same config and seed give the same weights on every machine.
    pub fn new_random(
        config: &ModelConfig,
        with_value_head: bool,
        seed: u64,
        device: &Device,
    ) -> Result<Self, ModelError> {
        Self::new_random_with_dtype(config, with_value_head, seed, DType::F32, device)
    }

    /// [`PolicyModel::new_random`] in a chosen float dtype (f64 for gradient checks).
    pub fn new_random_with_dtype(
        config: &ModelConfig,
        with_value_head: bool,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(|msg| ModelError::Config {
            path: "<in memory>".into(),
            msg,
        })?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        for (name, shape, init) in param_specs(config, with_value_head) {
            let t = init_tensor(
                &shape,
                init,
                config.initializer_range,
                &mut rng,
                dtype,
                device,
            )?;
            tensors.insert(name, t);
        }
        Self::from_tensors(config.clone(), tensors, with_value_head, dtype, device)
    }

    /// Builds the model around `tensors` (names and shapes already checked).
    fn from_tensors(
        config: ModelConfig,
        tensors: BTreeMap<String, Tensor>,
        with_value_head: bool,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let varmap = VarMap::new();
        {
            let mut data = varmap
                .data()
                .lock()
                .map_err(|_| ModelError::InvalidInput("parameter map lock poisoned".into()))?;
            for (name, t) in tensors {
                data.insert(name, Var::from_tensor(&t)?);
            }
        }
        let vb = VarBuilder::from_varmap(&varmap, dtype, device);
        let model = Model::new(&config, with_value_head, vb)?;
        let infer = model.detach();
        Ok(Self {
            config,
            varmap,
            device: device.clone(),
            model,
            infer,
            dtype,
            with_value_head,
            fused_training: true,
            share_prefixes: true,
            precision: Precision::F32,
            recompute_activations: false,
            graph_decode: false,
            lora: None,
            first_trained_layer: None,
        })
    }

    /// Loads a Hugging Face directory (`config.json` + `model.safetensors` or
    /// sharded safetensors with `model.safetensors.index.json`), or a GGUF
    /// file (see [`crate::gguf`]), as f32. bf16/f16 weights are converted
    /// and GGUF tensors dequantised on the CPU. With `with_value_head`, a
    /// checkpoint without `value_head.*` gets a fresh (seeded) value head.
    pub fn load(dir: &Path, with_value_head: bool, device: &Device) -> Result<Self, ModelError> {
        let gguf = crate::gguf::is_gguf(dir);
        let (config, mut stored) = if gguf {
            crate::gguf::read_checkpoint(dir)?
        } else {
            (
                ModelConfig::from_file(&dir.join(CONFIG_FILE))?,
                read_tensors(dir)?,
            )
        };
        let mut rng = ChaCha8Rng::seed_from_u64(VALUE_HEAD_SEED);
        let mut tensors = BTreeMap::new();
        for (name, shape, init) in param_specs(&config, with_value_head) {
            let is_value_head = name == VALUE_HEAD_WEIGHT || name == VALUE_HEAD_BIAS;
            match stored.remove(&name) {
                Some(lt) => {
                    if lt.tensor.dims() != shape.as_slice() {
                        return Err(ModelError::ShapeMismatch {
                            name,
                            path: lt.file,
                            expected: shape,
                            got: lt.tensor.dims().to_vec(),
                        });
                    }
                    let t = lt.tensor.to_dtype(DType::F32)?.to_device(device)?;
                    tensors.insert(name, t);
                }
                None if is_value_head => {
                    let t = init_tensor(
                        &shape,
                        init,
                        config.initializer_range,
                        &mut rng,
                        DType::F32,
                        device,
                    )?;
                    tensors.insert(name, t);
                }
                None => {
                    return Err(ModelError::MissingTensor {
                        name,
                        path: dir.to_path_buf(),
                    })
                }
            }
        }
        let mut model = Self::from_tensors(config, tensors, with_value_head, DType::F32, device)?;
        if let Some(adapter) = adapter_dir_of(dir).filter(|_| !gguf) {
            model.load_adapter(&adapter)?;
        }
        Ok(model)
    }

    /// Writes `config.json` and `model.safetensors` (f32, Hugging Face names;
    /// no `lm_head.weight` when tied; the value head as `value_head.*`, which
    /// transformers ignores), each atomically: a kill mid-save leaves every
    /// file either as it was or fully written. An attached LoRA adapter goes
    /// to `adapter/` in PEFT's layout, its base being `dir` itself (the
    /// unmerged base weights; [`PolicyModel::load`] attaches it again).
    /// Tokenizer files are the caller's.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        self.save_base(dir)?;
        if let Some(lora) = &self.lora {
            let base = std::path::absolute(dir).map_err(|e| ModelError::io(dir, e))?;
            lora.save(&dir.join(ADAPTER_DIR), Some(&base.to_string_lossy()))?;
        }
        Ok(())
    }

    /// Writes a Hugging Face checkpoint whose weights have the LoRA adapter
    /// merged in (`W + s·B·A`): a plain model for transformers or vLLM, with
    /// no adapter. Fails when no adapter is attached.
    pub fn save_merged(&self, dir: &Path) -> Result<(), ModelError> {
        let Some(lora) = &self.lora else {
            return Err(ModelError::Adapter {
                path: dir.to_path_buf(),
                msg: "the model has no LoRA adapter to merge".into(),
            });
        };
        let mut tensors: BTreeMap<String, Tensor> = self
            .named_vars()?
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().detach()))
            .collect();
        let merged = lora.merged_weights(&tensors)?;
        tensors.extend(merged);
        Self::from_tensors(
            self.config.clone(),
            tensors,
            self.with_value_head,
            self.dtype,
            &self.device,
        )?
        .save_base(dir)
    }

    /// Attaches a fresh LoRA adapter (PEFT's initialisation, seeded; B = 0 so
    /// the model's outputs do not change). From then on only the adapter and
    /// a value head are trainable. Fails when one is already attached.
    pub fn attach_lora(&mut self, config: LoraConfig, seed: u64) -> Result<(), ModelError> {
        let adapter =
            LoraAdapter::new_random(&self.config, config, seed, self.dtype, &self.device)?;
        self.attach(adapter)
    }

    /// Attaches the PEFT adapter in `dir` (`adapter_config.json`,
    /// `adapter_model.safetensors`). Fails when one is already attached or
    /// the adapter does not fit this model.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<(), ModelError> {
        let adapter = LoraAdapter::load(dir, &self.config, self.dtype, &self.device)?;
        self.attach(adapter)
    }

    /// A model sharing this one's base weights (nothing is copied) with the
    /// PEFT adapter in `dir` attached instead of any current one: several
    /// adapters served over one base.
    pub fn with_adapter(&self, dir: &Path) -> Result<Self, ModelError> {
        let adapter = LoraAdapter::load(dir, &self.config, self.dtype, &self.device)?;
        Ok(Self {
            config: self.config.clone(),
            varmap: self.varmap.clone(),
            device: self.device.clone(),
            model: self.model.clone(),
            infer: self.infer.clone(),
            dtype: self.dtype,
            with_value_head: self.with_value_head,
            fused_training: self.fused_training,
            share_prefixes: self.share_prefixes,
            precision: self.precision,
            recompute_activations: self.recompute_activations,
            graph_decode: self.graph_decode,
            lora: Some(adapter),
            first_trained_layer: self.first_trained_layer,
        })
    }

    fn attach(&mut self, adapter: LoraAdapter) -> Result<(), ModelError> {
        if self.first_trained_layer.is_some() {
            return Err(ModelError::InvalidInput(
                "a LoRA adapter and training only the top layers do not combine".into(),
            ));
        }
        if self.lora.is_some() {
            return Err(ModelError::Adapter {
                path: "<in memory>".into(),
                msg: "the model already has a LoRA adapter".into(),
            });
        }
        self.lora = Some(adapter);
        Ok(())
    }

    /// The attached LoRA adapter, if any.
    pub fn lora(&self) -> Option<&LoraAdapter> {
        self.lora.as_ref()
    }

    /// From now on train only the top `layers` decoder layers, the final
    /// norm, an untied LM head and a value head: the embeddings and the
    /// layers below stay as they are, and a training backward stops at the
    /// lowest trained layer. `layers` = the model's depth trains every layer
    /// but leaves the embeddings frozen. Refused with a LoRA adapter (which
    /// already freezes the base) and for 0 or more layers than the model has.
    pub fn train_top_layers(&mut self, layers: usize) -> Result<(), ModelError> {
        let depth = self.config.num_hidden_layers;
        if layers == 0 || layers > depth {
            return Err(ModelError::InvalidInput(format!(
                "cannot train the top {layers} layers of a {depth}-layer model (1..={depth})"
            )));
        }
        if self.lora.is_some() {
            return Err(ModelError::InvalidInput(
                "training only the top layers and a LoRA adapter do not combine: the adapter already freezes the base".into(),
            ));
        }
        self.first_trained_layer = Some(depth - layers);
        Ok(())
    }

    /// The transformer a training forward runs: the model itself (its lower
    /// layers frozen when only the top ones train), or with a LoRA adapter
    /// its frozen base with `W + s·B·A` (differentiable in A, B).
    fn training_model(&self) -> Result<Cow<'_, Model>, ModelError> {
        self.computing(match (&self.lora, self.first_trained_layer) {
            (None, None) => Cow::Borrowed(&self.model),
            (None, Some(first)) => Cow::Owned(self.model.frozen_below(first)),
            (Some(lora), _) => Cow::Owned(lora.apply(&self.model.frozen(), false)?),
        })
    }

    /// The transformer inference runs: the detached weights, with a LoRA
    /// adapter merged in (rebuilt per call, so it follows optimizer updates).
    fn inference_model(&self) -> Result<Cow<'_, Model>, ModelError> {
        self.computing(match &self.lora {
            None => Cow::Borrowed(&self.infer),
            Some(lora) => Cow::Owned(lora.apply(&self.infer, true)?),
        })
    }

    /// [`PolicyModel::save`] without the adapter.
    fn save_base(&self, dir: &Path) -> Result<(), ModelError> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let mut config = self.config.clone();
        // The weights are written as f32 whatever the source checkpoint was.
        config
            .extra
            .insert("dtype".to_string(), serde_json::json!("float32"));
        if config.extra.contains_key("torch_dtype") {
            config
                .extra
                .insert("torch_dtype".to_string(), serde_json::json!("float32"));
        }
        let json = serde_json::to_string_pretty(&config).map_err(|e| ModelError::Config {
            path: dir.join(CONFIG_FILE),
            msg: e.to_string(),
        })?;
        let cfg_path = dir.join(CONFIG_FILE);
        agentrl_durable::write(&cfg_path, json).map_err(|e| ModelError::io(&cfg_path, e))?;
        let tensors: BTreeMap<String, Tensor> = self
            .named_vars()?
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        write_tensors(&dir.join(WEIGHTS_FILE), &tensors)
    }

    /// Every parameter of the base model (and value head) with its Hugging
    /// Face name, sorted by name; a LoRA adapter's are [`LoraAdapter::named_vars`].
    pub fn named_vars(&self) -> Result<Vec<(String, Var)>, ModelError> {
        let data = self
            .varmap
            .data()
            .lock()
            .map_err(|_| ModelError::InvalidInput("parameter map lock poisoned".into()))?;
        let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    }

    /// Every trainable parameter with its name, in name order: every
    /// parameter, those of the top layers when only they train
    /// ([`PolicyModel::train_top_layers`]), or with a LoRA adapter only its
    /// A and B (PEFT's names) and the value head. Fails for an adapter with dropout, which cannot be
    /// trained here ([`LoraAdapter::check_trainable`]).
    pub fn trainable_named_vars(&self) -> Result<Vec<(String, Var)>, ModelError> {
        let all = self.named_vars()?;
        let Some(lora) = &self.lora else {
            return Ok(match self.first_trained_layer {
                None => all,
                Some(first) => all
                    .into_iter()
                    .filter(|(n, _)| self.trains_top_layer_param(n, first))
                    .collect(),
            });
        };
        lora.check_trainable()?;
        let mut v = lora.named_vars();
        v.extend(
            all.into_iter()
                .filter(|(n, _)| n == VALUE_HEAD_WEIGHT || n == VALUE_HEAD_BIAS),
        );
        Ok(v)
    }

    /// Whether parameter `name` trains when layers `first..` do: theirs,
    /// the final norm's, an untied head's and the value head's.
    fn trains_top_layer_param(&self, name: &str, first: usize) -> bool {
        if let Some(rest) = name.strip_prefix("model.layers.") {
            let layer = rest.split('.').next().and_then(|i| i.parse::<usize>().ok());
            return layer.is_some_and(|l| l >= first);
        }
        name == "model.norm.weight"
            || (name == "lm_head.weight" && !self.config.tie_word_embeddings)
            || name == VALUE_HEAD_WEIGHT
            || name == VALUE_HEAD_BIAS
    }

    /// Every trainable parameter (see [`PolicyModel::trainable_named_vars`]),
    /// in name order (a stable order for optimizer state). Fails, rather than
    /// answering an empty list an optimizer would silently "train", when the
    /// parameter map cannot be read.
    pub fn trainable_vars(&self) -> Result<Vec<Var>, ModelError> {
        Ok(self
            .trainable_named_vars()?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// Total number of scalar parameters of the base model (and value head).
    pub fn num_parameters(&self) -> Result<usize, ModelError> {
        Ok(self.trainable_vars()?.iter().map(|v| v.elem_count()).sum())
    }

    /// The float dtype of the parameters.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether the model has a value head.
    pub fn has_value_head(&self) -> bool {
        self.with_value_head
    }

    /// Chooses the training forward of [`PolicyModel::sequence_logprobs`]:
    /// the fused layer ops with hand-written backward passes (the default;
    /// used on CPU in f32/f64) or candle's composite ops (the reference the
    /// fused path is tested against; used anyway on other devices/dtypes).
    pub fn set_fused_training(&mut self, on: bool) {
        self.fused_training = on;
    }

    /// Whether attention runs as the flash op where its GPU kernels apply
    /// (bf16 on a CUDA device, head dim 64 or 128), in training and in
    /// sampling's prefill; on by default (see `Model::set_flash_attention`).
    pub fn set_flash_attention(&mut self, on: bool) {
        self.model.set_flash_attention(on);
        self.infer.set_flash_attention(on);
    }

    /// Whether [`PolicyModel::scored_logprobs`] on the fused path computes a
    /// prompt that several sequences share (a GRPO group's: at least 16
    /// leading tokens, none of them scored) once, with each sequence's own
    /// tokens attending to it; the gradient the shared rows receive is the
    /// sum over the sequences, so the results are those of the unshared
    /// batch up to rounding. On by default: a group of 8 single-turn
    /// replies to a long prompt costs about an eighth of the tokens.
    pub fn set_prefix_sharing(&mut self, on: bool) {
        self.share_prefixes = on;
    }

    /// Runs the large products in `precision`; weights, their gradients and
    /// the optimizer state stay f32 either way.
    ///
    /// On the CPU, the fused forward and backward's products (every
    /// projection and the LM head) in bf16 round their inputs to bfloat16
    /// and sum in f32, as PyTorch's bf16 autocast does; the host decoder
    /// follows: each `generate` call packs the projections and the LM head
    /// in bf16 once (half the bytes a decode step reads). An error where this
    /// CPU lacks it (bf16 needs AVX512-BF16).
    ///
    /// On a GPU, bf16 is autocast: each training forward and each sampling
    /// call computes through a bf16 copy of the f32 weights made by
    /// differentiable casts, so activations and products are bf16, the
    /// gradients arrive at the f32 weights in f32, and log-probs and values
    /// come out in f32. An error for weights that are not f32.
    pub fn set_precision(&mut self, precision: Precision) -> Result<(), ModelError> {
        if self.device.is_cpu() && !precision.available() {
            return Err(ModelError::InvalidInput(format!(
                "precision {precision}: this CPU has no AVX512-BF16 (use f32)"
            )));
        }
        if precision != Precision::F32 && !self.device.is_cpu() && self.dtype != DType::F32 {
            return Err(ModelError::InvalidInput(format!(
                "precision {precision} on a GPU casts f32 weights; these are {:?}",
                self.dtype
            )));
        }
        self.precision = precision;
        Ok(())
    }

    /// The dtype a GPU model computes in under autocast (see
    /// [`PolicyModel::set_precision`]); `None`: the weights' own.
    fn autocast(&self) -> Option<DType> {
        (self.precision == Precision::Bf16 && !self.device.is_cpu()).then_some(DType::BF16)
    }

    /// `model` itself, or its copy in the autocast dtype.
    fn computing<'a>(&self, model: Cow<'a, Model>) -> Result<Cow<'a, Model>, ModelError> {
        Ok(match self.autocast() {
            Some(dtype) => Cow::Owned(model.cast(dtype)?),
            None => model,
        })
    }

    /// Gradient checkpointing on the fused CPU path: each decoder layer and
    /// the LM head keep nothing from the forward but their input, and the
    /// backward runs each forward again just before its own backward. An
    /// update then holds one layer's activations at a time instead of all
    /// of them (and one vocabulary-wide buffer instead of two) for about a
    /// third more compute; the gradients have the same bits either way.
    pub fn set_gradient_checkpointing(&mut self, on: bool) {
        self.recompute_activations = on;
    }

    /// The precision of the fused path's large products.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Generates through candle's graph ops on the model's device (left-padded
    /// batch, per-layer KV caches, fixed-shape decode steps) instead of the
    /// host decoder. Off the CPU this path is always taken; on the CPU it is
    /// what the host decoder is tested against (and `bench rollout
    /// --graph-decode` runs it). Its caches are rows of each call's batch
    /// caches ([`PolicyModel::generate_cached`]).
    pub fn set_graph_decode(&mut self, on: bool) {
        self.graph_decode = on;
    }

    /// The graph-building transformer (for callers that need hidden states);
    /// with a LoRA adapter, its frozen base with the adapter applied.
    pub fn model(&self) -> Result<Cow<'_, Model>, ModelError> {
        self.training_model()
    }

    fn check_ids(&self, seqs: &[Vec<u32>]) -> Result<(), ModelError> {
        let v = self.config.vocab_size as u32;
        for (i, s) in seqs.iter().enumerate() {
            if let Some(&bad) = s.iter().find(|&&t| t >= v) {
                return Err(ModelError::InvalidInput(format!(
                    "sequence {i}: token id {bad} >= vocab_size {v}"
                )));
            }
        }
        Ok(())
    }

    /// Logits `[B, T, V]` of `input_ids: [B, T]` (u32), causal attention,
    /// positions `0..T`, in the weights' dtype. Differentiable.
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor, ModelError> {
        check_sequence_length(input_ids, self.model.rotary().max_positions())?;
        Ok(self
            .training_model()?
            .forward(input_ids)?
            .to_dtype(self.dtype)?)
    }

    /// [`PolicyModel::forward`] without building an autograd graph.
    pub fn forward_no_grad(&self, input_ids: &Tensor) -> Result<Tensor, ModelError> {
        check_sequence_length(input_ids, self.infer.rotary().max_positions())?;
        Ok(self
            .inference_model()?
            .forward(input_ids)?
            .to_dtype(self.dtype)?)
    }

    /// Per-token log-probs, entropies and values of ragged `seqs` (right-padded
    /// internally), differentiable with respect to every parameter.
    ///
    /// With T the longest length: `logprobs[b, t] = log p(seqs[b][t+1] | seqs[b][..=t])`
    /// for `t < T-1`, computed as `logit - logsumexp(logits)` with the max shift
    /// detached; `entropy[b, t] = -Σ p log p` of the same distribution;
    /// `values[b, t]` the value head at position t; `mask[b, t] = 1` iff
    /// `t + 1 < seqs[b].len()`. Padded entries are finite and masked.
    pub fn sequence_logprobs(&self, seqs: &[Vec<u32>]) -> Result<SequenceLogprobs, ModelError> {
        self.logprobs_of(seqs, None)
    }

    /// [`PolicyModel::sequence_logprobs`] at the positions a loss reads:
    /// `logprobs[b, t]` and `entropy[b, t]` are computed where
    /// `scored[b][t] != 0` (the shifted frame: entry `t` scores token
    /// `t + 1`; entries past a row's end count as 0) and are 0 elsewhere,
    /// with no gradient. `values` and `mask` are as there.
    ///
    /// On the fused CPU path only the scored rows go through the LM head
    /// and its backward: a batch whose loss reads its replies, not its
    /// prompts, skips most of the head's work. Elsewhere every position is
    /// computed, then the rest zeroed.
    pub fn scored_logprobs(
        &self,
        seqs: &[Vec<u32>],
        scored: &[Vec<f32>],
    ) -> Result<SequenceLogprobs, ModelError> {
        if scored.len() != seqs.len() {
            return Err(ModelError::InvalidInput(format!(
                "{} rows of scored positions for {} sequences",
                scored.len(),
                seqs.len()
            )));
        }
        self.logprobs_of(seqs, Some(scored))
    }

    fn logprobs_of(
        &self,
        seqs: &[Vec<u32>],
        scored: Option<&[Vec<f32>]>,
    ) -> Result<SequenceLogprobs, ModelError> {
        if seqs.is_empty() {
            return Err(ModelError::InvalidInput("empty batch".into()));
        }
        self.check_ids(seqs)?;
        let b = seqs.len();
        let t = seqs.iter().map(Vec::len).max().unwrap_or(0);
        if t < 2 {
            return Err(ModelError::InvalidInput(
                "sequences need at least 2 tokens to have a next-token target".into(),
            ));
        }
        if t > self.model.rotary().max_positions() {
            return Err(ModelError::InvalidInput(format!(
                "sequence length {t} > max_position_embeddings {}",
                self.model.rotary().max_positions()
            )));
        }
        let mut mask = vec![0f32; b * (t - 1)];
        for (i, s) in seqs.iter().enumerate() {
            for j in 0..s.len().saturating_sub(1) {
                mask[i * (t - 1) + j] = 1.0;
            }
        }
        let batch = Ragged { seqs, scored, b, t };
        let (logprobs, entropy, values) = if self.fused_training && self.model.supports_fused() {
            self.fused_outputs(batch)?
        } else {
            self.composite_outputs(&*self.training_model()?, batch)?
        };
        // In the log-probs' dtype (f32 on a GPU whatever the model's).
        let mask = Tensor::from_vec(mask, (b, t - 1), &self.device)?.to_dtype(logprobs.dtype())?;
        Ok(SequenceLogprobs {
            logprobs,
            entropy,
            values,
            mask,
        })
    }

    /// Log-probs, entropies `[B, T-1]` and values `[B, T]` of the fused path:
    /// packed tokens through the fused layer ops, scattered back to the
    /// padded layout. A LoRA adapter goes into the layer ops beside the
    /// frozen base (no weight-sized gradient products), not merged into it.
    fn fused_outputs(&self, batch: Ragged<'_>) -> Result<Outputs, ModelError> {
        let Ragged { seqs, scored, b, t } = batch;
        let (model, factors) = match &self.lora {
            Some(lora) => (
                Cow::Owned(self.model.frozen()),
                Some(lora.factors(self.config.num_hidden_layers)),
            ),
            None => (self.training_model()?, None),
        };
        let (out, hn, packing) = model.fused_logprobs(
            seqs,
            scored,
            self.share_prefixes,
            (self.precision, self.recompute_activations),
            factors.as_ref(),
        )?;
        // grad: get (narrow + squeeze) passes the gradient to its plane.
        let (logprobs, entropy) = (out.get(0)?, out.get(1)?);
        let values = match model.values(&hn)? {
            Some(v) => {
                // [N] → [B, T]: row b·T + p reads the packed row of position
                // p of sequence b, or the appended zero past the sequence's end.
                let n = packing.rows();
                let mut map = vec![n as u32; b * t];
                for (i, s) in seqs.iter().enumerate() {
                    for p in 0..s.len() {
                        map[i * t + p] = packing.row_of(i, p) as u32;
                    }
                }
                let map = Tensor::from_vec(map, b * t, &self.device)?;
                let padded = Tensor::cat(&[&v, &v.zeros_like()?.narrow(0, 0, 1)?], 0)?;
                // grad: cat and index_select (backward: index_add) differentiate.
                Some(padded.index_select(&map, 0)?.reshape((b, t))?)
            }
            None => None,
        };
        Ok((logprobs, entropy, values))
    }

    /// The same outputs from candle's composite ops on a right-padded batch.
    fn composite_outputs(&self, model: &Model, batch: Ragged<'_>) -> Result<Outputs, ModelError> {
        let Ragged { seqs, scored, b, t } = batch;
        let mut ids = vec![0u32; b * t];
        for (i, s) in seqs.iter().enumerate() {
            ids[i * t..i * t + s.len()].copy_from_slice(s);
        }
        let ids = Tensor::from_vec(ids, (b, t), &self.device)?;
        // Right padding needs no key mask: causal attention keeps real tokens
        // from ever seeing the pads that follow them.
        let rope = model.rotary().tables_contiguous(0, t)?;
        let h = model.forward_hidden(&ids, &rope, &[], None)?; // [B, T, d]
        let values = model.values(&h)?; // [B, T]
                                        // Only positions 0..T-1 predict a token: skip the last row's LM head.
        let logits = model.logits(&h.narrow(1, 0, t - 1)?)?; // [B, T-1, V]
        let targets = ids.narrow(1, 1, t - 1)?.contiguous()?; // [B, T-1]
        let (logprobs, entropy) = crate::token_loss::token_logprobs_entropy(&logits, &targets)?;
        // Values in the log-probs' dtype (f32 under autocast, as the returns
        // they are compared with).
        let values = values.map(|v| v.to_dtype(logprobs.dtype())).transpose()?;
        let Some(scored) = scored else {
            return Ok((logprobs, entropy, values));
        };
        let mut keep = vec![0f32; b * (t - 1)];
        for (i, (row, s)) in scored.iter().zip(seqs).enumerate() {
            for p in 0..s.len().saturating_sub(1) {
                if crate::head::is_scored(row, p) {
                    keep[i * (t - 1) + p] = 1.0;
                }
            }
        }
        let keep = Tensor::from_vec(keep, (b, t - 1), &self.device)?.to_dtype(logprobs.dtype())?;
        Ok(((logprobs * &keep)?, (entropy * &keep)?, values))
    }

    /// Samples continuations of ragged `prompts` in one batch with a KV cache.
    ///
    /// Each result equals generating that prompt alone (sequences are packed,
    /// not padded, and attend only to their own keys). Sampling uses `rng` in
    /// a fixed order (sequence by sequence, step by step); a sequence leaves
    /// the batch when it emits a stop token or reaches `max_new_tokens`. The
    /// returned log-probs are under the untempered policy (log-softmax of the
    /// raw logits), whatever `temperature`/`top_k`/`top_p` were. No autograd
    /// graph is built.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Generation>, ModelError> {
        let mut caches: Vec<SequenceCache> = prompts.iter().map(|_| self.new_cache()).collect();
        self.generate_cached(&mut caches, prompts, params, rng)
    }

    /// An empty per-sequence KV cache for [`PolicyModel::generate_cached`].
    pub fn new_cache(&self) -> SequenceCache {
        SequenceCache::new(&self.config)
    }

    /// [`PolicyModel::generate`] that keeps each sequence's keys and values
    /// in `caches[i]` between calls, so a multi-turn caller encodes only what
    /// a turn adds.
    ///
    /// `contexts[i]` is the whole sequence so far (e.g. the dialogue with the
    /// newest observation). The cache reuses the positions it already holds
    /// for the longest common prefix of its [`SequenceCache::tokens`] and the
    /// context, encodes the rest, samples, and afterwards stands for the
    /// context followed by the generated tokens. The tokens and log-probs are
    /// those of [`PolicyModel::generate`] on the same contexts (up to float
    /// rounding: the cached keys were computed in other chunks), and with the
    /// same `rng` the same draws are made. A cache holds keys of the weights
    /// it was filled with: clear it after an optimizer step. Off the CPU
    /// (the graph decoder) a cache points at its row of the call's batch
    /// caches on the device, and the next call copies what it reuses from
    /// there; the batch encodes every context's last n tokens, n the most
    /// any row's cache leaves to encode.
    pub fn generate_cached(
        &self,
        caches: &mut [SequenceCache],
        contexts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Generation>, ModelError> {
        self.decode(
            caches,
            contexts,
            params,
            SamplingRng::Shared(rng),
            Steer::none(),
            None,
        )
    }

    /// [`PolicyModel::generate`] with one random stream per prompt:
    /// `rngs[i]` alone draws prompt `i`'s tokens, so each continuation is
    /// the same whatever other prompts share the batch (a server batching
    /// independent requests, each with its own seed).
    pub fn generate_independent(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rngs: &mut [ChaCha8Rng],
    ) -> Result<Vec<Generation>, ModelError> {
        self.decode_per_sequence(prompts, params, rngs, Steer::none())
    }

    /// [`PolicyModel::generate_independent`] steered per sequence: before
    /// each token of sequence `i` is chosen, `steering` may adjust its
    /// logits (penalties, logit bias); after, it sees the token with its
    /// raw row and may end the sequence there. The log-probs returned stay
    /// the raw policy's. With a steering that adjusts nothing and never ends
    /// a sequence, the result is `generate_independent`'s.
    pub fn generate_steered(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rngs: &mut [ChaCha8Rng],
        steering: &mut dyn Steering,
    ) -> Result<Vec<Generation>, ModelError> {
        self.decode_per_sequence(prompts, params, rngs, Steer::by(steering))
    }

    /// Fresh caches and one random stream per prompt, checked, then [`Self::decode`].
    fn decode_per_sequence(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        rngs: &mut [ChaCha8Rng],
        steer: Steer<'_>,
    ) -> Result<Vec<Generation>, ModelError> {
        if rngs.len() != prompts.len() {
            return Err(ModelError::InvalidInput(format!(
                "{} random streams for {} prompts",
                rngs.len(),
                prompts.len()
            )));
        }
        let mut caches: Vec<SequenceCache> = prompts.iter().map(|_| self.new_cache()).collect();
        self.decode(
            &mut caches,
            prompts,
            params,
            SamplingRng::PerSequence(rngs),
            steer,
            None,
        )
    }

    /// The log-prob of each token of `prompt` after the first given the
    /// tokens before it, its rank, and the `k` most likely tokens at that
    /// position (OpenAI's `echo` with `logprobs`, vLLM's `prompt_logprobs`),
    /// under the raw distribution. The prompt runs through the model in
    /// chunks over a KV cache, so memory grows with its length, not its square.
    pub fn prompt_logprobs(
        &self,
        prompt: &[u32],
        k: usize,
    ) -> Result<Vec<PromptTokenLogprob>, ModelError> {
        let model = self.inference_model()?;
        crate::steer::prompt_logprobs(&model, &self.config, prompt, k)
    }

    /// Continuous batching: [`PolicyModel::generate_cached`] in which a
    /// sequence whose continuation has ended is handed to `next` at once,
    /// with its index and generation, and goes on with the context `next`
    /// gives (a dialogue's next turn) or leaves the batch. A new context is
    /// encoded in the same forward passes as the other sequences' next
    /// tokens, reusing what the sequence's cache holds when `keep_cache`,
    /// so no sequence waits for the slowest of a turn. The call returns
    /// when every sequence is done (or `next` aborts); every generation
    /// goes to `next`, none is returned. The draws are made step by step
    /// in sequence order, as in `generate_cached`: the same calls and
    /// answers give the same tokens. Returns the context positions served
    /// from caches, continued contexts included.
    ///
    /// Only the host decoder batches continuously (see
    /// [`PolicyModel::batches_continuously`]); elsewhere this is an error.
    pub fn generate_continuous(
        &self,
        caches: &mut [SequenceCache],
        contexts: &[Vec<u32>],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
        keep_cache: bool,
        next: &mut dyn FnMut(usize, Generation) -> Followup,
    ) -> Result<usize, ModelError> {
        let mut checked = |i: usize, gen: Generation| match next(i, gen) {
            Followup::Continue(ctx) => {
                let one = std::slice::from_ref(&ctx);
                self.check_contexts(one, params).map_err(|e| {
                    ModelError::InvalidInput(format!("sequence {i} continued: {e}"))
                })?;
                Ok(Followup::Continue(ctx))
            }
            other => Ok(other),
        };
        let mut follow = crate::decode::Continuation {
            next: &mut checked,
            keep_cache,
            reused: 0,
        };
        let rng = SamplingRng::Shared(rng);
        self.decode(
            caches,
            contexts,
            params,
            rng,
            Steer::none(),
            Some(&mut follow),
        )?;
        Ok(follow.reused)
    }

    /// Whether [`PolicyModel::generate_continuous`] serves this model: the
    /// host decoder, on the CPU (the graph decoder's fixed-shape batches
    /// do not take new contexts mid-call).
    pub fn batches_continuously(&self) -> bool {
        self.host_decoder_serves()
    }

    /// Checks the sampling params, the contexts and the caches of a generation.
    fn check_inputs(
        &self,
        caches: &[SequenceCache],
        contexts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<(), ModelError> {
        crate::sampling::validate(params)?;
        if caches.len() != contexts.len() {
            return Err(ModelError::InvalidInput(format!(
                "{} caches for {} contexts",
                caches.len(),
                contexts.len()
            )));
        }
        if let Some(i) = caches.iter().position(|c| !c.fits(&self.config)) {
            return Err(ModelError::InvalidInput(format!(
                "cache {i} was made for a model of another shape"
            )));
        }
        self.check_contexts(contexts, params)
    }

    /// Token ids in the vocabulary, no empty context, and room for every
    /// context and its continuation in the rotary tables.
    fn check_contexts(
        &self,
        contexts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<(), ModelError> {
        self.check_ids(contexts)?;
        if let Some(i) = contexts.iter().position(Vec::is_empty) {
            return Err(ModelError::InvalidInput(format!("prompt {i} is empty")));
        }
        let longest = contexts.iter().map(Vec::len).max().unwrap_or(0);
        // The last sampled token is never fed back, so positions up to
        // context + max_new - 1 are encoded.
        let positions = longest + params.max_new_tokens.saturating_sub(1);
        if positions > self.infer.rotary().max_positions() {
            return Err(ModelError::InvalidInput(format!(
                "prompt length {longest} + max_new_tokens {} exceeds max_position_embeddings {}",
                params.max_new_tokens,
                self.infer.rotary().max_positions()
            )));
        }
        Ok(())
    }

    /// Checks the inputs of a generation and runs it; a `follow` (continuous
    /// batching) only on the host decoder.
    fn decode(
        &self,
        caches: &mut [SequenceCache],
        contexts: &[Vec<u32>],
        params: &SamplingParams,
        rng: SamplingRng<'_>,
        mut steer: Steer<'_>,
        follow: Option<&mut crate::decode::Continuation<'_>>,
    ) -> Result<Vec<Generation>, ModelError> {
        self.check_inputs(caches, contexts, params)?;
        let host = self.host_decoder_serves();
        if !host && follow.is_some() {
            return Err(ModelError::InvalidInput(
                "continuous batching runs on the host decoder (a model on the CPU)".into(),
            ));
        }
        let model = self.inference_model()?;
        if !host {
            return crate::graph_decode::generate(
                &model,
                &self.config,
                caches,
                contexts,
                params,
                rng,
                &mut steer,
            );
        }
        crate::decode::generate(
            &model,
            &self.config,
            caches,
            contexts,
            params,
            self.precision,
            rng,
            &mut steer,
            follow,
        )
    }

    /// Whether the host decoder serves this model: weights on the CPU (off
    /// it, every weight would be copied to the host per call) and the
    /// graph decoder not asked for.
    fn host_decoder_serves(&self) -> bool {
        !self.graph_decode && self.infer.device().is_cpu()
    }
}

/// `input_ids: [B, T]` must have 1 to `max_positions` positions.
fn check_sequence_length(input_ids: &Tensor, max_positions: usize) -> Result<(), ModelError> {
    let t = input_ids.dim(1)?;
    if t == 0 || t > max_positions {
        return Err(ModelError::InvalidInput(format!(
            "sequence length {t} outside 1..={max_positions}"
        )));
    }
    Ok(())
}
