//! The Qwen2/Llama transformer.
//!
//! Same shape as candle-transformers' model files (rotary tables, attention,
//! MLP, decoder layer, model; each `new(cfg, vb)` + `forward`), written from
//! differentiable candle ops: candle's fused `softmax_last_dim`, `rms_norm`
//! and `rope` have no backward pass and silently cut the gradient, so none of
//! them is used on a path that needs one. Every op on the training path
//! carries a `// grad:` note saying why it back-propagates.
//!
//! Training on the CPU does not go through these per-op modules but through
//! `Model::fused_logprobs`: each decoder layer as one op with a
//! hand-written backward (the `block` module) and a fused LM head
//! (the `head` module), tested against this composite path (which stays the
//! reference, and the path on other devices and dtypes). Generation runs on
//! [`crate::decode`].
//!
//! Weight names follow Hugging Face (`model.layers.N.self_attn.q_proj.weight`,
//! ...), so a `VarBuilder` over a `VarMap` filled from a checkpoint builds it.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use std::sync::Arc;

use crate::attention::Heads;
use crate::block::{DecoderLayerOp, LayerShape, Packing, Rope};
use crate::config::ModelConfig;
use crate::head::LmHeadOp;
use crate::host::with_slices;
use crate::kernels::Real;
use crate::lora::{LoraFactors, LoraTarget};
use crate::lora_layer::LayerLora;
use crate::precision::Precision;

/// Name of the optional value head's weight (`[1, hidden]`); transformers ignores it.
pub const VALUE_HEAD_WEIGHT: &str = "value_head.weight";
/// Name of the optional value head's bias (`[1]`).
pub const VALUE_HEAD_BIAS: &str = "value_head.bias";

/// How a parameter is initialised in a fresh model (Hugging Face's `_init_weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamInit {
    /// Normal(0, initializer_range): linear and embedding weights.
    Normal,
    /// All zeros: biases.
    Zeros,
    /// All ones: RMSNorm gains.
    Ones,
}

/// Every parameter the configuration implies, in a fixed order:
/// (Hugging Face name, shape, initialisation).
pub fn param_specs(
    cfg: &ModelConfig,
    with_value_head: bool,
) -> Vec<(String, Vec<usize>, ParamInit)> {
    let d = cfg.hidden_size;
    let hd = cfg.head_dim();
    let q_out = cfg.num_attention_heads * hd;
    let kv_out = cfg.num_kv_heads() * hd;
    let ffn = cfg.intermediate_size;
    let mut v = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, d],
        ParamInit::Normal,
    )];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for (proj, out) in [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)] {
            let name = format!("{p}.self_attn.{proj}");
            v.push((format!("{name}.weight"), vec![out, d], ParamInit::Normal));
            if cfg.qkv_bias() {
                v.push((format!("{name}.bias"), vec![out], ParamInit::Zeros));
            }
        }
        let weights = [
            ("self_attn.o_proj", vec![d, q_out], ParamInit::Normal),
            ("mlp.gate_proj", vec![ffn, d], ParamInit::Normal),
            ("mlp.up_proj", vec![ffn, d], ParamInit::Normal),
            ("mlp.down_proj", vec![d, ffn], ParamInit::Normal),
            ("input_layernorm", vec![d], ParamInit::Ones),
            ("post_attention_layernorm", vec![d], ParamInit::Ones),
        ];
        for (name, shape, init) in weights {
            v.push((format!("{p}.{name}.weight"), shape, init));
        }
    }
    v.push(("model.norm.weight".to_string(), vec![d], ParamInit::Ones));
    if !cfg.tie_word_embeddings {
        v.push((
            "lm_head.weight".to_string(),
            vec![cfg.vocab_size, d],
            ParamInit::Normal,
        ));
    }
    if with_value_head {
        v.push((VALUE_HEAD_WEIGHT.to_string(), vec![1, d], ParamInit::Normal));
        v.push((VALUE_HEAD_BIAS.to_string(), vec![1], ParamInit::Zeros));
    }
    v
}

/// `x @ w^T + b` for `x: [.., in]`, `w: [out, in]` (PyTorch layout), `b: [out]`.
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let mut out_dims = x.dims().to_vec();
    let Some(last) = out_dims.last_mut() else {
        candle_core::bail!("linear: input must have at least one dimension")
    };
    let in_dim = *last;
    *last = w.dim(0)?;
    let rows = x.elem_count() / in_dim.max(1);
    // grad: reshape is a view with backward; the projection's backward is two
    // GEMMs, the weight's gradient in the weight's layout (crate::projection).
    let y = crate::projection::project(&x.reshape((rows, in_dim))?, w)?;
    // grad: the bias's gradient is the column sums of y's, in f32 or wider
    // (crate::bias).
    let y = match b {
        Some(b) => crate::bias::add_bias(&y, b)?,
        None => y,
    };
    y.reshape(out_dims)
}

/// Softmax over the last dimension from differentiable ops.
pub(crate) fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    // The max shift does not change the softmax; detaching it only drops a
    // gradient term that is exactly zero, and keeps exp() from overflowing.
    let m = x.max_keepdim(D::Minus1)?.detach();
    // grad: broadcast_sub, exp, sum_keepdim and broadcast_div all have backward rules.
    let e = x.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&s)
}

/// Log-softmax over the last dimension (`x - logsumexp(x)`) and the logsumexp itself.
pub(crate) fn log_softmax_last_dim(x: &Tensor) -> Result<(Tensor, Tensor)> {
    // Detached max: logsumexp(x) = m + log Σ exp(x - m) for any constant m,
    // so its gradient through m is zero; the full softmax gradient flows via exp.
    let m = x.max_keepdim(D::Minus1)?.detach();
    // grad: broadcast_sub, exp, sum_keepdim, log, broadcast_add all differentiate.
    let lse = x
        .broadcast_sub(&m)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        .broadcast_add(&m)?;
    Ok((x.broadcast_sub(&lse)?, lse))
}

/// Root-mean-square layer norm: `x / sqrt(mean(x²) + ε) * w`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    /// Detached weights: candle's fused (gradient-free) kernel is allowed.
    inference: bool,
}

impl RmsNorm {
    /// Loads the gain `weight: [d]`.
    pub fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get(size, "weight")?,
            eps,
            inference: false,
        })
    }

    /// Detached weights; with `inference`, candle's gradient-free kernel may serve.
    fn detached(&self, inference: bool) -> Self {
        Self {
            weight: self.weight.detach(),
            eps: self.eps,
            inference,
        }
    }

    /// The gain cast to `dtype` (differentiably).
    fn cast(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            weight: self.weight.to_dtype(dtype)?,
            ..*self
        })
    }

    /// `x: [.., d]` → `[.., d]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.inference && x.is_contiguous() {
            // No gradient is needed here, so candle's fused kernel may serve.
            return candle_nn::ops::rms_norm(x, &self.weight, self.eps as f32);
        }
        // grad: fused CPU kernel with its own bwd for x and w (crate::ops).
        if let Some(y) = crate::ops::rms_norm(x, &self.weight, self.eps) {
            return y;
        }
        // grad: sqr (2x), mean_keepdim (sum then affine), affine (+ε), sqrt and
        // recip all have backward rules; unlike candle_nn::ops::rms_norm.
        let inv_rms = x
            .sqr()?
            .mean_keepdim(D::Minus1)?
            .affine(1.0, self.eps)?
            .sqrt()?
            .recip()?;
        // grad: broadcast_mul differentiates both operands (reduces over broadcast dims for w).
        x.broadcast_mul(&inv_rms)?.broadcast_mul(&self.weight)
    }
}

/// Cos/sin tables for the positions of one forward pass: `[B', T, head_dim / 2]`
/// with B' = 1 (same positions for every sequence) or B.
#[derive(Debug, Clone)]
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
    /// For a decode step (`[B, 1, head_dim]`): each row's cos then sin in
    /// one tensor, as the step's fused kernels read them
    /// ([`RotaryEmbedding::step_tables`]).
    packed: Option<Tensor>,
}

/// Rotary position embeddings in Hugging Face's rotate-half convention:
/// `x·cos + rotate_half(x)·sin` with `rotate_half([x1, x2]) = [-x2, x1]`
/// and `cos = [cos(pθ), cos(pθ)]` over the two halves.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    /// `[max_positions, head_dim / 2]`, built once.
    cos: Tensor,
    sin: Tensor,
    /// `[max_positions, head_dim]`: cos then sin per position.
    packed: Tensor,
}

impl RotaryEmbedding {
    /// Builds the tables for `max_position_embeddings` positions (computed in f64, stored in `dtype`).
    pub fn new(cfg: &ModelConfig, dtype: DType, dev: &Device) -> Result<Self> {
        let half = cfg.head_dim() / 2;
        let n = cfg.max_position_embeddings;
        let theta = cfg.rope_theta();
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / cfg.head_dim() as f64))
            .collect();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            for f in &inv_freq {
                // Rounding the angle to f32 first matches transformers, which
                // forms `position * inv_freq` in float32.
                let a = (p as f32 * *f as f32) as f64;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (n, half), dev)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (n, half), dev)?.to_dtype(dtype)?;
        let packed = Tensor::cat(&[&cos, &sin], 1)?;
        Ok(Self { cos, sin, packed })
    }

    /// Tables for positions `offset..offset + t`, identical for every sequence.
    pub fn tables_contiguous(&self, offset: usize, t: usize) -> Result<RopeTables> {
        let half = self.cos.dim(1)?;
        let cos = self.cos.narrow(0, offset, t)?.reshape((1, t, half))?;
        let sin = self.sin.narrow(0, offset, t)?.reshape((1, t, half))?;
        Ok(RopeTables {
            cos,
            sin,
            packed: None,
        })
    }

    /// Tables for per-sequence positions `positions: [B, T]` (u32).
    pub fn tables_for(&self, positions: &Tensor) -> Result<RopeTables> {
        let (b, t) = positions.dims2()?;
        let half = self.cos.dim(1)?;
        let flat = positions.flatten_all()?;
        let cos = self.cos.index_select(&flat, 0)?.reshape((b, t, half))?;
        let sin = self.sin.index_select(&flat, 0)?.reshape((b, t, half))?;
        Ok(RopeTables {
            cos,
            sin,
            packed: None,
        })
    }

    /// Tables for a decode step's positions `positions: [B, 1]` (u32) in
    /// one gather: the packed `[B, 1, head_dim]` the step's fused kernels
    /// read, with cos and sin as its two halves (views).
    pub fn step_tables(&self, positions: &Tensor) -> Result<RopeTables> {
        let (b, t) = positions.dims2()?;
        let hd = self.packed.dim(1)?;
        let packed = self
            .packed
            .index_select(&positions.flatten_all()?, 0)?
            .reshape((b, t, hd))?;
        Ok(RopeTables {
            cos: packed.narrow(2, 0, hd / 2)?,
            sin: packed.narrow(2, hd / 2, hd / 2)?,
            packed: Some(packed),
        })
    }

    /// Largest position + 1 the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// The tables in `dtype`.
    fn cast(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            cos: self.cos.to_dtype(dtype)?,
            sin: self.sin.to_dtype(dtype)?,
            packed: self.packed.to_dtype(dtype)?,
        })
    }
}

/// Rotates `x: [B, T, heads, head_dim]`; returns the same shape.
fn apply_rope(x: &Tensor, tab: &RopeTables, inference: bool) -> Result<Tensor> {
    if inference {
        // No gradient is needed, so candle's fused rope (same rotate-half
        // convention, [B, T, H, D] layout) may serve.
        let (cos, sin) = if tab.cos.dim(0)? == 1 {
            (tab.cos.squeeze(0)?, tab.sin.squeeze(0)?)
        } else {
            (tab.cos.clone(), tab.sin.clone())
        };
        return candle_nn::rotary_emb::rope_thd(&x.contiguous()?, &cos, &sin);
    }
    let hd = x.dim(3)?;
    let half = hd / 2;
    // [B', T, half] → [B', T, 1, half] to broadcast over the heads.
    let cos = tab.cos.unsqueeze(2)?;
    let sin = tab.sin.unsqueeze(2)?;
    // grad: narrow's backward pads the gradient back with zeros; broadcast_mul,
    // sub/add and cat (backward = narrow) all differentiate. The tables are constants.
    let x1 = x.narrow(3, 0, half)?;
    let x2 = x.narrow(3, half, half)?;
    let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let r2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[&r1, &r2], 3)
}

/// Rotates `x: [B, T, heads, hd]`, scales it and returns `[B, heads, T, hd]` contiguous.
fn rope_to_heads(x: &Tensor, tab: &RopeTables, scale: f64, inference: bool) -> Result<Tensor> {
    if !inference && tab.cos.dim(0)? == 1 {
        // grad: one op (CPU, or kernels/rope.cu on a GPU) whose bwd is its
        // adjoint rotation (crate::ops).
        if let Some(y) =
            crate::ops::rope_to_heads(x, &tab.cos.squeeze(0)?, &tab.sin.squeeze(0)?, scale)
        {
            return y;
        }
    }
    // grad: apply_rope's ops, affine, transpose and contiguous (a copy) all differentiate.
    let y = apply_rope(x, tab, inference)?;
    let y = if scale != 1.0 {
        y.affine(scale, 0.0)?
    } else {
        y
    };
    y.transpose(1, 2)?.contiguous()
}

/// Per-layer key/value cache for generation (no gradient): preallocated
/// `[B, kv_heads, capacity, head_dim]` buffers filled in place.
#[derive(Debug, Clone)]
pub struct LayerKvCache {
    k: Tensor,
    v: Tensor,
    len: usize,
}

impl LayerKvCache {
    /// Empty cache for `b` sequences and up to `capacity` positions.
    pub fn new(
        cfg: &ModelConfig,
        b: usize,
        capacity: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<Self> {
        let shape = (b, cfg.num_kv_heads(), capacity, cfg.head_dim());
        Ok(Self {
            k: Tensor::zeros(shape, dtype, dev)?,
            v: Tensor::zeros(shape, dtype, dev)?,
            len: 0,
        })
    }

    /// Number of positions already cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.k.dims()[2]
    }

    /// The key and value buffers, `[B, kv, capacity, hd]`.
    pub(crate) fn tensors(&self) -> (&Tensor, &Tensor) {
        (&self.k, &self.v)
    }

    /// Copies runs of positions (keys and values) from another batch's
    /// cache of the same layer into this one ([`crate::batch_cache`]).
    pub(crate) fn copy_rows_from(
        &self,
        src: &LayerKvCache,
        copies: &[crate::batch_cache::RowCopy],
    ) -> Result<()> {
        crate::batch_cache::copy_rows(&self.k, &src.k, copies)?;
        crate::batch_cache::copy_rows(&self.v, &src.v, copies)
    }

    /// Counts the first `len` positions as cached (filled by
    /// [`Self::copy_rows_from`], or left padding): the next append goes there.
    pub(crate) fn start_at(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            candle_core::bail!(
                "kv cache: {len} positions in a cache of {}",
                self.capacity()
            )
        }
        self.len = len;
        Ok(())
    }

    /// Appends `k, v: [B, kv, T, hd]` and returns views of everything cached,
    /// `[B, kv, len, hd]` (strided views; candle's matmul takes them without a copy).
    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        if self.len + t > self.k.dim(2)? {
            candle_core::bail!(
                "kv cache overflow: {} + {} > {}",
                self.len,
                t,
                self.k.dim(2)?
            )
        }
        self.k.slice_set(&k.contiguous()?, 2, self.len)?;
        self.v.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len += t;
        Ok((
            self.k.narrow(2, 0, self.len)?,
            self.v.narrow(2, 0, self.len)?,
        ))
    }

    /// Writes one step's `k, v: [B, kv, 1, hd]` at the position `slot` (a
    /// one-element u32 tensor on the cache's device) holds and returns the
    /// whole caches, `[B, kv, capacity, hd]`: a fixed-shape decode step
    /// ([`crate::fixed_step`]). The count of cached positions is left alone.
    fn write_at(&self, k: &Tensor, v: &Tensor, slot: &Tensor) -> Result<(Tensor, Tensor)> {
        crate::fixed_step::write_at_slot(&self.k, k, slot)?;
        crate::fixed_step::write_at_slot(&self.v, v, slot)?;
        Ok((self.k.clone(), self.v.clone()))
    }
}

/// What a layer's attention attends over besides its input `[B, T, d]`: the
/// rotary tables of the input's positions, the first `pads[b]` keys of batch
/// element b being left padding no query sees (empty = no padding), and the
/// layer's KV cache to append to and attend over (none: only the input's keys).
pub struct AttentionScope<'a> {
    /// The rotary tables for the input's positions.
    pub rope: &'a RopeTables,
    /// Left padding per batch element, in keys; empty = none.
    pub pads: &'a [usize],
    /// The layer's cache of earlier keys and values.
    pub cache: Option<&'a mut LayerKvCache>,
    /// For a one-token step with a cache: the cache position (a one-element
    /// u32 tensor on the device) the token's key and value go to; attention
    /// then runs over the whole cache, each row seeing keys `pads[b] ..=`
    /// that position (a fixed-shape step, see the `fixed_step` module). `None`:
    /// the keys are appended and attention runs over those cached.
    pub slot: Option<&'a Tensor>,
    /// Whether attention may run as one [`crate::flash_attention`] op where
    /// its GPU kernels apply (not for a slot step, which a CUDA graph
    /// replays over the materialised scores).
    pub flash: bool,
}

/// Grouped-query self-attention with optional q/k/v biases.
#[derive(Debug, Clone)]
pub struct Attention {
    q_w: Tensor,
    q_b: Option<Tensor>,
    k_w: Tensor,
    k_b: Option<Tensor>,
    v_w: Tensor,
    v_b: Option<Tensor>,
    o_w: Tensor,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    inference: bool,
}

impl Attention {
    /// Loads `q_proj`, `k_proj`, `v_proj` (with biases when the config says so) and `o_proj`.
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let d = cfg.hidden_size;
        let hd = cfg.head_dim();
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_kv_heads());
        let bias = cfg.qkv_bias();
        let get_b = |name: &str, n: usize| -> Result<Option<Tensor>> {
            if bias {
                Ok(Some(vb.pp(name).get(n, "bias")?))
            } else {
                Ok(None)
            }
        };
        Ok(Self {
            q_w: vb.pp("q_proj").get((nh * hd, d), "weight")?,
            q_b: get_b("q_proj", nh * hd)?,
            k_w: vb.pp("k_proj").get((nkv * hd, d), "weight")?,
            k_b: get_b("k_proj", nkv * hd)?,
            v_w: vb.pp("v_proj").get((nkv * hd, d), "weight")?,
            v_b: get_b("v_proj", nkv * hd)?,
            o_w: vb.pp("o_proj").get((d, nh * hd), "weight")?,
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
            inference: false,
        })
    }

    fn detached(&self, inference: bool) -> Self {
        let d = |t: &Option<Tensor>| t.as_ref().map(Tensor::detach);
        Self {
            q_w: self.q_w.detach(),
            q_b: d(&self.q_b),
            k_w: self.k_w.detach(),
            k_b: d(&self.k_b),
            v_w: self.v_w.detach(),
            v_b: d(&self.v_b),
            o_w: self.o_w.detach(),
            inference,
            ..*self
        }
    }

    /// Every weight and bias cast to `dtype` (differentiably).
    fn cast(&self, dtype: DType) -> Result<Self> {
        let c = |t: &Tensor| t.to_dtype(dtype);
        let cb = |t: &Option<Tensor>| t.as_ref().map(c).transpose();
        Ok(Self {
            q_w: c(&self.q_w)?,
            q_b: cb(&self.q_b)?,
            k_w: c(&self.k_w)?,
            k_b: cb(&self.k_b)?,
            v_w: c(&self.v_w)?,
            v_b: cb(&self.v_b)?,
            o_w: c(&self.o_w)?,
            ..*self
        })
    }

    /// A fixed-shape decode step's attention (sampling only) for `x: [B, 1,
    /// d]`: q's bias and rotation (row b's cos then sin in `cs: [B, 1,
    /// hd]`) applied inside the attention kernel, k's in one launch before
    /// its write to `cache` at `slot`, 1/sqrt(hd) as the attention's scale:
    /// five launches besides the projections' GEMMs (v's bias, k's rotation,
    /// the two cache writes, the attention), where the composite took nine
    /// ([`crate::fixed_step`]).
    fn decode_step(
        &self,
        x: &Tensor,
        cs: &Tensor,
        cache: &LayerKvCache,
        slot: &Tensor,
        pads: &[usize],
    ) -> Result<Tensor> {
        use crate::fixed_step::{decode_attention, rope_step, RowPrep};
        let (b, hd) = (x.dim(0)?, self.head_dim);
        let heads = |y: Tensor, n: usize| y.reshape((b, 1, n, hd))?.transpose(1, 2);
        let q = linear(x, &self.q_w, None)?;
        let k_prep = RowPrep {
            bias: self.k_b.as_ref(),
            rope: Some(cs),
        };
        let k = rope_step(&linear(x, &self.k_w, None)?, k_prep, self.n_kv)?;
        let v = linear(x, &self.v_w, self.v_b.as_ref())?;
        let (k, v) = cache.write_at(&heads(k, self.n_kv)?, &heads(v, self.n_kv)?, slot)?;
        let q_prep = RowPrep {
            bias: self.q_b.as_ref(),
            rope: Some(cs),
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let out = decode_attention(&heads(q, self.n_heads)?, q_prep, &k, &v, pads, slot, scale)?;
        linear(&out, &self.o_w, None)
    }

    /// `x: [B, T, d]`; causal attention over S = cached + T keys (query i
    /// sees keys `..= i + S - T`), of which the first `pads[b]` of batch
    /// element b are left padding no query sees (empty = no padding).
    /// Returns `[B, T, d]`.
    pub fn forward(&self, x: &Tensor, scope: AttentionScope<'_>) -> Result<Tensor> {
        let AttentionScope {
            rope,
            pads,
            cache,
            slot,
            flash,
        } = scope;
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (self.n_heads, self.n_kv, self.head_dim);
        let rep = nh / nkv;
        // A fixed-shape decode step with the step's packed tables
        // (`RotaryEmbedding::step_tables`): the fused ops. Past their head
        // dim (or without those tables) the composite below, with the
        // bounded softmax.
        if let (Some(slot), Some(cs), Some(c)) = (slot, &rope.packed, &cache) {
            if t == 1 && hd <= crate::fixed_step::DECODE_ATTENTION_MAX_HEAD_DIM {
                return self.decode_step(x, cs, c, slot, pads);
            }
        }
        // [B, T, heads, hd], rotated, then [B, heads, T, hd].
        // grad: linear, reshape, rope (see apply_rope), transpose and contiguous (copy) differentiate.
        let q = linear(x, &self.q_w, self.q_b.as_ref())?.reshape((b, t, nh, hd))?;
        let k = linear(x, &self.k_w, self.k_b.as_ref())?.reshape((b, t, nkv, hd))?;
        let v = linear(x, &self.v_w, self.v_b.as_ref())?.reshape((b, t, nkv, hd))?;
        // Scaling q (smaller than the scores) by 1/sqrt(hd) inside the rotation.
        let q = rope_to_heads(&q, rope, 1.0 / (hd as f64).sqrt(), self.inference)?;
        let k = rope_to_heads(&k, rope, 1.0, self.inference)?;
        let flash = flash
            && slot.is_none()
            && crate::flash_attention::flash_attention_applies(x.dtype(), x.device(), hd);
        // The flash kernels read v through its strides: no transposing copy.
        let v = match (flash, &cache) {
            (true, None) => v.transpose(1, 2)?,
            _ => v.transpose(1, 2)?.contiguous()?,
        };
        let (k, v) = match (cache, slot) {
            (Some(c), Some(slot)) => c.write_at(&k, &v, slot)?,
            (Some(c), None) => c.append(&k, &v)?,
            (None, _) => (k, v),
        };
        if flash {
            // grad: the op's own backward recomputes the probabilities
            // (crate::flash_attention); q is already scaled.
            let out = crate::flash_attention::flash_attention(&q, &k, &v, pads, 1.0)?;
            return linear(&out.reshape((b, t, nh * hd))?, &self.o_w, None);
        }
        let s = k.dim(2)?;
        // Grouped-query attention without copying k/v `rep` times: query head
        // h uses kv head h / rep (transformers' repeat_kv), so group the rep
        // query heads of one kv head into the row dimension.
        // q: [B, kv, rep*T, hd] @ k^T: [B, kv, hd, S] → [B, kv, rep*T, S] → [B, heads, T, S].
        let q = q.reshape((b, nkv, rep * t, hd))?;
        // grad: matmul's backward is two matmuls; reshape is a view.
        let scores = q.matmul(&k.t()?)?.reshape((b, nh, t, s))?;
        // grad: the fused causal softmax has its own bwd (crate::ops).
        let probs = match slot {
            Some(slot) => crate::fixed_step::decode_softmax(&scores, pads, slot)?,
            None => crate::ops::left_padded_causal_softmax(&scores, pads)?,
        };
        // [B, kv, rep*T, S] @ [B, kv, S, hd] → [B, kv, rep*T, hd] → [B, heads, T, hd] → [B, T, heads*hd].
        let out = probs
            .reshape((b, nkv, rep * t, s))?
            .matmul(&v)?
            .reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))?;
        linear(&out, &self.o_w, None)
    }
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

impl Mlp {
    /// Loads `gate_proj`, `up_proj`, `down_proj` (no biases).
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate: vb.pp("gate_proj").get((f, d), "weight")?,
            up: vb.pp("up_proj").get((f, d), "weight")?,
            down: vb.pp("down_proj").get((d, f), "weight")?,
        })
    }

    fn detach(&self) -> Self {
        Self {
            gate: self.gate.detach(),
            up: self.up.detach(),
            down: self.down.detach(),
        }
    }

    /// The three weights cast to `dtype` (differentiably).
    fn cast(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            gate: self.gate.to_dtype(dtype)?,
            up: self.up.to_dtype(dtype)?,
            down: self.down.to_dtype(dtype)?,
        })
    }

    /// `x: [B, T, d]` → `[B, T, d]` (through `[B, T, ffn]`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // grad: silu is a unary op with a backward rule (σ(x)(1 + x(1-σ(x))));
        // mul differentiates both operands.
        let g = linear(x, &self.gate, None)?;
        let u = linear(x, &self.up, None)?;
        // On a GPU, one op with its own backward (crate::ops::swiglu); the
        // CPU keeps candle's silu and mul, the reference its fused path is
        // tested against.
        if x.device().is_cuda() {
            if let Some(h) = crate::ops::swiglu(&g, &u) {
                return linear(&h?, &self.down, None);
            }
        }
        linear(&(g.silu()? * u)?, &self.down, None)
    }
}

/// One pre-norm decoder block: `h = x + attn(norm(x)); h + mlp(norm(h))`.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    attn: Attention,
    mlp: Mlp,
    input_ln: RmsNorm,
    post_ln: RmsNorm,
}

impl DecoderLayer {
    /// Loads `self_attn`, `mlp`, `input_layernorm`, `post_attention_layernorm`.
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            attn: Attention::new(cfg, vb.pp("self_attn"))?,
            mlp: Mlp::new(cfg, vb.pp("mlp"))?,
            input_ln: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps, vb.pp("input_layernorm"))?,
            post_ln: RmsNorm::new(
                cfg.hidden_size,
                cfg.rms_norm_eps,
                vb.pp("post_attention_layernorm"),
            )?,
        })
    }

    fn detached(&self, inference: bool) -> Self {
        Self {
            attn: self.attn.detached(inference),
            mlp: self.mlp.detach(),
            input_ln: self.input_ln.detached(inference),
            post_ln: self.post_ln.detached(inference),
        }
    }

    fn cast(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            attn: self.attn.cast(dtype)?,
            mlp: self.mlp.cast(dtype)?,
            input_ln: self.input_ln.cast(dtype)?,
            post_ln: self.post_ln.cast(dtype)?,
        })
    }

    /// `x: [B, T, d]` → `[B, T, d]`.
    pub fn forward(&self, x: &Tensor, scope: AttentionScope<'_>) -> Result<Tensor> {
        // grad: residual adds pass the gradient to both branches.
        let h = (x + self.attn.forward(&self.input_ln.forward(x)?, scope)?)?;
        &h + self.mlp.forward(&self.post_ln.forward(&h)?)?
    }
}

/// The decoder stack with embedding, final norm, LM head and optional value head.
#[derive(Debug, Clone)]
pub struct Model {
    embed: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `[V, d]`; the embedding matrix itself when tied.
    lm_head: Tensor,
    value_head: Option<(Tensor, Tensor)>,
    rotary: RotaryEmbedding,
    /// Sizes of every layer, for the fused training op.
    layer_shape: LayerShape,
    dtype: DType,
    device: Device,
    /// Whether attention runs as the flash op where its kernels apply
    /// (see [`Model::set_flash_attention`]).
    flash_attention: bool,
}

impl Model {
    /// Builds the model from `vb` (Hugging Face names); `with_value_head` adds
    /// `value_head.weight: [1, d]` and `value_head.bias: [1]`.
    pub fn new(cfg: &ModelConfig, with_value_head: bool, vb: VarBuilder) -> Result<Self> {
        let d = cfg.hidden_size;
        let m = vb.pp("model");
        let embed = m.pp("embed_tokens").get((cfg.vocab_size, d), "weight")?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(cfg, m.pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(d, cfg.rms_norm_eps, m.pp("norm"))?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            vb.pp("lm_head").get((cfg.vocab_size, d), "weight")?
        };
        let value_head = if with_value_head {
            let v = vb.pp("value_head");
            Some((v.get((1, d), "weight")?, v.get(1, "bias")?))
        } else {
            None
        };
        Ok(Self {
            embed,
            layers,
            norm,
            lm_head,
            value_head,
            rotary: RotaryEmbedding::new(cfg, vb.dtype(), vb.device())?,
            layer_shape: LayerShape {
                d,
                heads: Heads {
                    heads: cfg.num_attention_heads,
                    kv_heads: cfg.num_kv_heads(),
                    head_dim: cfg.head_dim(),
                },
                ffn: cfg.intermediate_size,
                bias: cfg.qkv_bias(),
                eps: cfg.rms_norm_eps,
            },
            dtype: vb.dtype(),
            device: vb.device().clone(),
            flash_attention: true,
        })
    }

    /// Whether attention runs as one [`crate::flash_attention`] op (its
    /// forward keeps row log-sum-exps, not the `[B, H, T, S]` probabilities)
    /// where its GPU kernels apply: bf16 on a CUDA device at head dim 64 or
    /// 128. On by default; off, every device materialises the scores.
    pub fn set_flash_attention(&mut self, on: bool) {
        self.flash_attention = on;
    }

    /// The same model computing in `dtype`: every weight cast to it by a
    /// differentiable cast, so gradients reach the weights here in their own
    /// dtype (autocast: f32 weights, bf16 products). A tied LM head is cast
    /// once with the embedding.
    pub fn cast(&self, dtype: DType) -> Result<Self> {
        let embed = self.embed.to_dtype(dtype)?;
        let lm_head = if self.lm_head.id() == self.embed.id() {
            embed.clone()
        } else {
            self.lm_head.to_dtype(dtype)?
        };
        let value_head = match &self.value_head {
            Some((w, b)) => Some((w.to_dtype(dtype)?, b.to_dtype(dtype)?)),
            None => None,
        };
        Ok(Self {
            embed,
            layers: self
                .layers
                .iter()
                .map(|l| l.cast(dtype))
                .collect::<Result<_>>()?,
            norm: self.norm.cast(dtype)?,
            lm_head,
            value_head,
            rotary: self.rotary.cast(dtype)?,
            layer_shape: self.layer_shape,
            dtype,
            device: self.device.clone(),
            flash_attention: self.flash_attention,
        })
    }

    /// The same model on detached copies of the weights (shared storage, so
    /// optimizer updates show through) for inference without an autograd graph.
    pub fn detach(&self) -> Self {
        self.detached(true)
    }

    /// The same model on detached (frozen) copies of every weight but the
    /// value head's, still on the differentiable ops: the base a LoRA
    /// adapter trains on, where the gradient reaches the inputs of every
    /// layer and no base weight.
    pub(crate) fn frozen(&self) -> Self {
        Self {
            value_head: self.value_head.clone(),
            ..self.detached(false)
        }
    }

    /// The same model with the embeddings and the layers below `first`
    /// frozen (detached, still on the differentiable ops), and the head too
    /// when it is the tied embedding: the gradient stops at layer `first`,
    /// whose backward is the last to run.
    pub(crate) fn frozen_below(&self, first: usize) -> Self {
        let tied = self.lm_head.id() == self.embed.id();
        Self {
            embed: self.embed.detach(),
            layers: self
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    if i < first {
                        l.detached(false)
                    } else {
                        l.clone()
                    }
                })
                .collect(),
            lm_head: if tied {
                self.lm_head.detach()
            } else {
                self.lm_head.clone()
            },
            ..self.clone()
        }
    }

    /// The weight of projection `target` of layer `layer`, to replace by an adapted one.
    pub(crate) fn projection_mut(
        &mut self,
        layer: usize,
        target: LoraTarget,
    ) -> Result<&mut Tensor> {
        let n = self.layers.len();
        let Some(l) = self.layers.get_mut(layer) else {
            candle_core::bail!("layer {layer} of a {n}-layer model")
        };
        Ok(match target {
            LoraTarget::QProj => &mut l.attn.q_w,
            LoraTarget::KProj => &mut l.attn.k_w,
            LoraTarget::VProj => &mut l.attn.v_w,
            LoraTarget::OProj => &mut l.attn.o_w,
            LoraTarget::GateProj => &mut l.mlp.gate,
            LoraTarget::UpProj => &mut l.mlp.up,
            LoraTarget::DownProj => &mut l.mlp.down,
        })
    }

    fn detached(&self, inference: bool) -> Self {
        Self {
            embed: self.embed.detach(),
            layers: self.layers.iter().map(|l| l.detached(inference)).collect(),
            norm: self.norm.detached(inference),
            lm_head: self.lm_head.detach(),
            value_head: self
                .value_head
                .as_ref()
                .map(|(w, b)| (w.detach(), b.detach())),
            rotary: self.rotary.clone(),
            layer_shape: self.layer_shape,
            dtype: self.dtype,
            device: self.device.clone(),
            flash_attention: self.flash_attention,
        }
    }

    /// The rotary tables (for callers building per-sequence positions).
    pub fn rotary(&self) -> &RotaryEmbedding {
        &self.rotary
    }

    /// Whether a value head exists.
    pub fn has_value_head(&self) -> bool {
        self.value_head.is_some()
    }

    /// Final normed hidden states `[B, T, d]` for `ids: [B, T]` (u32).
    /// `rope` holds the tables for the positions; attention is causal and
    /// skips the first `pads[b]` keys of sequence b (left padding; empty =
    /// none); `caches` (one per layer) are appended to when given.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        rope: &RopeTables,
        pads: &[usize],
        caches: Option<&mut [LayerKvCache]>,
    ) -> Result<Tensor> {
        self.hidden(ids, rope, pads, caches, None)
    }

    /// [`Model::forward_hidden`] of a one-token step `ids: [B, 1]` whose
    /// keys and values go to the cache position `slot` holds (a one-element
    /// u32 tensor on the device), attending over the whole caches: every
    /// launch of one such step is a launch of the next, only the contents
    /// of `ids`, the rope tables' positions and `slot` differ
    /// ([`crate::fixed_step`]).
    pub(crate) fn forward_hidden_at_slot(
        &self,
        ids: &Tensor,
        rope: &RopeTables,
        pads: &[usize],
        caches: &mut [LayerKvCache],
        slot: &Tensor,
    ) -> Result<Tensor> {
        self.hidden(ids, rope, pads, Some(caches), Some(slot))
    }

    fn hidden(
        &self,
        ids: &Tensor,
        rope: &RopeTables,
        pads: &[usize],
        caches: Option<&mut [LayerKvCache]>,
        slot: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let flat = ids.flatten_all()?;
        // grad: on a GPU one op whose backward sums each id's rows in f32
        // (crate::embedding); elsewhere index_select, whose backward is
        // index_add into the embedding rows.
        let rows = match crate::embedding::embedding(&self.embed, &flat) {
            Some(rows) => rows?,
            None => self.embed.index_select(&flat, 0)?,
        };
        let mut h = rows.reshape((b, t, ()))?;
        let mut layer_caches = match caches {
            Some(caches) if caches.len() != self.layers.len() => {
                candle_core::bail!("expected {} layer caches", self.layers.len())
            }
            Some(caches) => Some(caches.iter_mut()),
            None => None,
        };
        for layer in &self.layers {
            let cache = layer_caches.as_mut().and_then(Iterator::next);
            h = layer.forward(
                &h,
                AttentionScope {
                    rope,
                    pads,
                    cache,
                    slot,
                    flash: self.flash_attention,
                },
            )?;
        }
        self.norm.forward(&h)
    }

    /// LM logits `[.., V]` of normed hidden states `[.., d]`.
    pub fn logits(&self, h: &Tensor) -> Result<Tensor> {
        // grad: through linear; for tied weights the gradient adds to the embedding's.
        linear(h, &self.lm_head, None)
    }

    /// Scalar values `[B, T]` of normed hidden states `[B, T, d]`, if the value head exists.
    pub fn values(&self, h: &Tensor) -> Result<Option<Tensor>> {
        match &self.value_head {
            Some((w, b)) => Ok(Some(linear(h, w, Some(b))?.squeeze(D::Minus1)?)),
            None => Ok(None),
        }
    }

    /// Logits `[B, T, V]` of `ids: [B, T]` at positions `0..T`, causal attention.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dim(1)?;
        let rope = self.rotary.tables_contiguous(0, t)?;
        let h = self.forward_hidden(ids, &rope, &[], None)?;
        self.logits(&h)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The weights' dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether the attention projections carry biases.
    pub(crate) fn qkv_bias(&self) -> bool {
        self.layers.first().is_some_and(|l| l.attn.q_b.is_some())
    }

    /// The tensors the hand-written inference forward reads
    /// ([`crate::decode`]), in its order: embedding, final norm, LM head,
    /// rotary cos and sin, then each layer's [`Model::layer_params`].
    pub(crate) fn inference_tensors(&self) -> Vec<&Tensor> {
        let mut v = vec![
            &self.embed,
            &self.norm.weight,
            &self.lm_head,
            &self.rotary.cos,
            &self.rotary.sin,
        ];
        for l in 0..self.layers.len() {
            v.extend(self.layer_params(l));
        }
        v
    }

    /// Layer `l`'s parameters in the order of [`crate::block::LayerShape::pack`]:
    /// q, k, v, o, gate, up, down, the two norms, then (when present) the q, k, v biases.
    pub(crate) fn layer_params(&self, l: usize) -> Vec<&Tensor> {
        let layer = &self.layers[l];
        let a = &layer.attn;
        let mut v = vec![
            &a.q_w,
            &a.k_w,
            &a.v_w,
            &a.o_w,
            &layer.mlp.gate,
            &layer.mlp.up,
            &layer.mlp.down,
            &layer.input_ln.weight,
            &layer.post_ln.weight,
        ];
        if let (Some(q), Some(k), Some(b)) = (&a.q_b, &a.k_b, &a.v_b) {
            v.extend([q, k, b]);
        }
        v
    }

    /// Whether [`Model::fused_logprobs`] runs here (CPU, f32 or f64).
    pub(crate) fn supports_fused(&self) -> bool {
        self.device.is_cpu() && matches!(self.dtype, DType::F32 | DType::F64)
    }

    /// The fused training forward of ragged `seqs` (packed, no padding):
    /// `[2, B, T−1]` next-token log-probs (plane 0) and entropies (plane 1),
    /// zero past each sequence's end and at positions `scored` leaves out
    /// (see [`LmHeadOp::new`]), and the final normed hidden states `[N, d]`
    /// of the packed tokens. Differentiable with respect to every
    /// parameter: each decoder layer is one [`DecoderLayerOp`] with its own
    /// backward, the head one [`LmHeadOp`]. With `share` and `scored`,
    /// sequences that share an unscored prompt pack it once
    /// ([`Packing::sharing_prefixes`]). With `lora`, the model's weights are
    /// a frozen base and each layer's op adds the adapters' terms, so the
    /// backward computes the gradients of A and B without the weights'.
    /// The large products run in `precision`; with `recompute` the layers
    /// and the head keep no activations for the backward, which computes
    /// them again (gradient checkpointing; the same bits). Callers check
    /// [`Model::supports_fused`] first.
    pub(crate) fn fused_logprobs(
        &self,
        seqs: &[Vec<u32>],
        scored: Option<&[Vec<f32>]>,
        share: bool,
        (precision, recompute): (Precision, bool),
        lora: Option<&LoraFactors>,
    ) -> Result<(Tensor, Tensor, Arc<Packing>)> {
        let how = (precision, recompute);
        match self.dtype {
            DType::F32 => self.fused_logprobs_in::<f32>(seqs, scored, share, how, lora),
            DType::F64 => self.fused_logprobs_in::<f64>(seqs, scored, share, how, lora),
            dt => candle_core::bail!("fused training forward: {dt:?} is not supported"),
        }
    }

    fn fused_logprobs_in<T: Real>(
        &self,
        seqs: &[Vec<u32>],
        scored: Option<&[Vec<f32>]>,
        share: bool,
        (precision, recompute): (Precision, bool),
        lora: Option<&LoraFactors>,
    ) -> Result<(Tensor, Tensor, Arc<Packing>)> {
        let (packing, ids) = match scored.filter(|_| share) {
            // A sequence's rows up to its first scored position (the one
            // predicting its first scored token) are not read per sequence.
            Some(rows) => {
                let first_free: Vec<usize> = seqs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let row = rows.get(i).map_or(&[][..], Vec::as_slice);
                        (0..s.len())
                            .find(|&t| crate::head::is_scored(row, t))
                            .unwrap_or(s.len())
                    })
                    .collect();
                Packing::sharing_prefixes(seqs, &first_free)
            }
            None => (
                Packing::of_lengths(seqs.iter().map(Vec::len)),
                seqs.concat(),
            ),
        };
        let packing = Arc::new(packing);
        let longest = seqs.iter().map(Vec::len).max().unwrap_or(0);
        let ids = Tensor::from_vec(ids, packing.rows(), &self.device)?;
        let half = self.rotary.cos.dim(1)?;
        let table = |t: &Tensor| -> Result<Vec<T>> {
            with_slices::<T, _>(&[&t.narrow(0, 0, longest)?], "rotary table", |v| {
                v[0].to_vec()
            })
        };
        let rope = Arc::new(Rope {
            cos: table(&self.rotary.cos)?,
            sin: table(&self.rotary.sin)?,
        });
        debug_assert_eq!(rope.cos.len(), longest * half);
        // grad: index_select's backward is index_add into the embedding rows.
        let mut h = self.embed.index_select(&ids, 0)?; // [N, d]
        for l in 0..self.layers.len() {
            // grad: flatten_all and cat hand each parameter its slice of the pack's gradient.
            let flat = self
                .layer_params(l)
                .into_iter()
                .map(|t| t.flatten_all())
                .collect::<Result<Vec<_>>>()?;
            let pack = Tensor::cat(&flat, 0)?;
            let op = DecoderLayerOp::<T>::new(
                self.layer_shape,
                packing.clone(),
                rope.clone(),
                precision,
            )
            .recomputing(recompute);
            let adapted = lora.and_then(|f| {
                let adapters = f.layers.get(l).filter(|a| !a.is_empty())?;
                Some((f, adapters))
            });
            h = match adapted {
                // grad: the layer op's own backward (crate::block).
                None => h.apply_op2(&pack, op)?,
                Some((factors_of, adapters)) => {
                    // grad: flatten_all and cat hand A and B their slices.
                    let mut factors = Vec::with_capacity(2 * adapters.len());
                    for (_, a, b) in adapters {
                        factors.push(a.flatten_all()?);
                        factors.push(b.flatten_all()?);
                    }
                    let factors = Tensor::cat(&factors, 0)?;
                    let layout = LayerLora {
                        targets: adapters.iter().map(|(t, _, _)| *t).collect(),
                        rank: factors_of.rank,
                        scale: factors_of.scale,
                    };
                    // grad: the layer op's own backward, A and B's included.
                    h.apply_op3(&pack, &factors, op.with_lora(layout))?
                }
            };
        }
        let hn = self.norm.forward(&h)?;
        // grad: the fused head's own backward (crate::head).
        let out = hn.apply_op2(
            &self.lm_head,
            LmHeadOp::<T>::new(&packing, seqs, scored, precision).recomputing(recompute),
        )?;
        Ok((out, hn, packing))
    }
}

impl Module for Model {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Model::forward(self, ids)
    }
}

/// The additive value for masked attention scores off the fused CPU path:
/// large and finite so that a fully masked row gives a uniform softmax, not NaN.
pub(crate) fn mask_value(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => -6.0e4,
        _ => -1.0e9,
    }
}
