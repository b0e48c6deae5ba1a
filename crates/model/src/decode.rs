//! Generation without autograd: a hand-written forward over *packed* rows
//! (every sequence's new tokens one after another, no padding) that reads
//! the weights in place, per-sequence KV caches that outlive a `generate`
//! call, and the sampling loop in which finished sequences leave the batch.
//!
//! Why not candle's graph: a decode step is a few dozen tiny ops whose
//! tensor bookkeeping and allocations cost more than their arithmetic, and
//! left-padded batches waste work and need masks. Here the projections are
//! GEMMs over `[rows, d]` slices (the `gemm` crate, as candle uses) and
//! attention runs per row over that row's own cache, so sequences of any
//! lengths share a step.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::batch_cache::BatchRow;
#[cfg(target_arch = "x86_64")]
use crate::gemm_bf16::PackedWeight;
use crate::host::with_slices;
use crate::kernels::{
    axpy, dot, exp_shifted_sum, num_threads, par_chunks_mut, rms_norm_rows, swiglu_in_place, Mm,
};
#[cfg(target_arch = "x86_64")]
use crate::kernels::{has_avx2, simd};
use crate::precision::Precision;
use crate::qwen2::Model;
use crate::sampling::{
    empty_generations, push_token, Followup, Generation, SamplingParams, SamplingRng,
};
use crate::steer::Steer;
use crate::{ModelConfig, ModelError};

/// The key/value cache of one sequence, kept between `generate` calls so a
/// later turn encodes only the tokens it adds (see
/// [`crate::PolicyModel::generate_cached`]).
///
/// It remembers the tokens it was built from, so a context that diverges
/// from them (a retokenised or truncated dialogue) reuses only the common
/// prefix. The keys and values belong to the weights they were computed
/// with: after an optimizer step, [`SequenceCache::clear`] it (or make a new one).
#[derive(Debug, Clone)]
pub struct SequenceCache {
    /// The sequence so far: its cached positions, then at most one sampled
    /// token not yet fed back (generation stops before encoding its last token).
    tokens: Vec<u32>,
    /// Positions whose keys and values are stored.
    cached: usize,
    /// Positions `0..prefix.len` read from a prompt several sequences share
    /// (the members of a GRPO group on their first turn): stored once, read
    /// by each. `None`: every position is the cache's own.
    prefix: Option<Arc<SharedPrefix>>,
    /// Per layer, `[capacity, kv_heads · head_dim]` rotated keys of the
    /// positions from the shared prefix's end on, position-major.
    k: Vec<Vec<f32>>,
    /// Per layer, values in the same layout.
    v: Vec<Vec<f32>>,
    /// Floats per position per layer (kv_heads · head_dim).
    kv_dim: usize,
    /// Off the CPU: the keys and values live in the batch caches of the
    /// graph decoder call that last encoded the sequence, and `k`, `v`
    /// and `prefix` are unused ([`crate::batch_cache`]).
    on_device: Option<BatchRow>,
}

/// Keys and values of a prompt's positions `0..len`, shared by the caches
/// of the sequences that continue it (read-only once shared).
#[derive(Debug)]
struct SharedPrefix {
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// One layer's keys and values of a sequence, as attention reads them:
/// position `j` from the shared prefix when `j < base`, else from the
/// sequence's own rows (`j − base`).
#[derive(Clone, Copy)]
struct LayerKv<'a> {
    base: usize,
    shared_k: &'a [f32],
    shared_v: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

impl<'a> LayerKv<'a> {
    /// Positions `from..to` as at most two runs, each stored contiguously
    /// (the part in the shared prefix, then the sequence's own):
    /// `(first, end, keys, values)`, the slices starting at `first`'s row.
    fn runs(
        self,
        from: usize,
        to: usize,
        kv_dim: usize,
    ) -> impl Iterator<Item = (usize, usize, &'a [f32], &'a [f32])> {
        let shared = (from < self.base).then(|| {
            let at = from * kv_dim;
            let end = to.min(self.base);
            (from, end, &self.shared_k[at..], &self.shared_v[at..])
        });
        let first = from.max(self.base);
        let own = (first < to).then(|| {
            let at = (first - self.base) * kv_dim;
            (first, to, &self.k[at..], &self.v[at..])
        });
        shared.into_iter().chain(own)
    }
}

impl SequenceCache {
    /// An empty cache for a model with this configuration.
    pub fn new(config: &ModelConfig) -> Self {
        let layers = config.num_hidden_layers;
        Self {
            tokens: Vec::new(),
            cached: 0,
            prefix: None,
            k: vec![Vec::new(); layers],
            v: vec![Vec::new(); layers],
            kv_dim: config.num_kv_heads() * config.head_dim(),
            on_device: None,
        }
    }

    /// The sequence so far (context plus generated tokens).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many leading positions of [`SequenceCache::tokens`] have their keys and values stored.
    pub fn cached_len(&self) -> usize {
        self.cached
    }

    /// Forgets everything (keeps the memory of its own positions for reuse).
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.cached = 0;
        self.prefix = None;
        self.on_device = None;
    }

    /// Where the graph decoder left this sequence's keys and values, if it
    /// was the last to encode it.
    pub(crate) fn on_device(&self) -> Option<&BatchRow> {
        self.on_device.as_ref()
    }

    /// Makes the cache stand for `tokens`, of which the first `cached` have
    /// their keys and values in `row` (a graph decoder call's batch caches).
    pub(crate) fn hold_on_device(&mut self, tokens: &[u32], cached: usize, row: BatchRow) {
        self.clear();
        self.tokens.extend_from_slice(tokens);
        self.cached = cached;
        self.on_device = Some(row);
    }

    /// Whether the cache was made for a model of `config`'s shape.
    pub(crate) fn fits(&self, config: &ModelConfig) -> bool {
        self.k.len() == config.num_hidden_layers
            && self.kv_dim == config.num_kv_heads() * config.head_dim()
    }

    /// Where the cache's own positions start (the shared prefix's length).
    fn base(&self) -> usize {
        self.prefix.as_ref().map_or(0, |p| p.len)
    }

    /// Layer `l` as attention reads it.
    fn layer(&self, l: usize) -> LayerKv<'_> {
        let (shared_k, shared_v) = match &self.prefix {
            Some(p) => (&p.k[l][..], &p.v[l][..]),
            None => (&[][..], &[][..]),
        };
        LayerKv {
            base: self.base(),
            shared_k,
            shared_v,
            k: &self.k[l],
            v: &self.v[l],
        }
    }

    /// Makes room for `positions` positions in every layer, growing
    /// geometrically so a long dialogue reallocates O(log n) times.
    fn reserve(&mut self, positions: usize) {
        let need = positions.saturating_sub(self.base()) * self.kv_dim;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            if buf.len() < need {
                buf.resize(need.max(2 * buf.len()), 0.0);
            }
        }
    }

    /// How many leading positions of `context` this cache would serve: the
    /// cached part of the common prefix, short of the context's last token
    /// (always encoded: the next sample needs its logits).
    pub fn reusable_for(&self, context: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        common.min(self.cached).min(context.len().saturating_sub(1))
    }

    /// Points the cache at `context`, keeping what [`Self::reusable_for`]
    /// says, and returns where encoding starts.
    fn retarget(&mut self, context: &[u32]) -> usize {
        if self.on_device.take().is_some() {
            // Keys on a device: none of them are in the host rows.
            self.cached = 0;
        }
        let keep = self.reusable_for(context);
        if keep < self.base() {
            self.own_prefix(keep);
        }
        self.cached = keep;
        self.tokens.clear();
        self.tokens.extend_from_slice(context);
        keep
    }

    /// Copies the shared prefix's first `keep` positions into the cache's
    /// own rows and stops sharing (a context that leaves the shared prompt
    /// before its end; the own positions after it are dropped).
    fn own_prefix(&mut self, keep: usize) {
        let Some(prefix) = self.prefix.take() else {
            return;
        };
        let span = ..keep * self.kv_dim;
        let layers = self.k.iter_mut().zip(&prefix.k);
        for (own, shared) in layers.chain(self.v.iter_mut().zip(&prefix.v)) {
            own.clear();
            own.extend_from_slice(&shared[span]);
        }
    }

    /// Turns this cache's positions `0..cached` into a prefix that twins
    /// can share: they move into a shared block, and the cache keeps its
    /// own rows (empty, with their memory) for the positions after them.
    /// Only for a cache with no shared prefix yet.
    fn share_encoded(&mut self) -> Arc<SharedPrefix> {
        debug_assert!(self.prefix.is_none());
        let len = self.cached * self.kv_dim;
        let take = |bufs: &mut Vec<Vec<f32>>| -> Vec<Vec<f32>> {
            bufs.iter_mut()
                .map(|b| {
                    let rest = b.split_off(len);
                    std::mem::replace(b, rest)
                })
                .collect()
        };
        let shared = Arc::new(SharedPrefix {
            len: self.cached,
            k: take(&mut self.k),
            v: take(&mut self.v),
        });
        self.prefix = Some(shared.clone());
        shared
    }
}

/// Sizes the forward needs, from the configuration.
#[derive(Debug, Clone, Copy)]
struct Dims {
    d: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    eps: f32,
}

impl Dims {
    fn of(cfg: &ModelConfig) -> Self {
        Self {
            d: cfg.hidden_size,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_kv_heads(),
            head_dim: cfg.head_dim(),
            ffn: cfg.intermediate_size,
            vocab: cfg.vocab_size,
            eps: cfg.rms_norm_eps as f32,
        }
    }
    fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
    fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One decoder layer's weights as host f32 slices (PyTorch layouts).
struct LayerView<'a> {
    q_w: &'a [f32],
    q_b: Option<&'a [f32]>,
    k_w: &'a [f32],
    k_b: Option<&'a [f32]>,
    v_w: &'a [f32],
    v_b: Option<&'a [f32]>,
    o_w: &'a [f32],
    gate: &'a [f32],
    up: &'a [f32],
    down: &'a [f32],
    input_ln: &'a [f32],
    post_ln: &'a [f32],
}

/// The whole model's weights as host f32 slices.
struct ModelView<'a> {
    dims: Dims,
    embed: &'a [f32],
    layers: Vec<LayerView<'a>>,
    norm: &'a [f32],
    lm_head: &'a [f32],
    /// `[max_positions, head_dim / 2]` rotary tables.
    cos: &'a [f32],
    sin: &'a [f32],
    /// The projections and LM head in bf16, packed once per call, when the
    /// products run in bf16 (x86-64 only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    bf16: Option<Bf16Weights>,
}

/// A decoder layer's projections packed in bf16 (built on x86-64 only).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Bf16Layer {
    /// q, k and v stacked: one product per step (and one pass over its input).
    qkv: PackedWeight,
    o: PackedWeight,
    /// gate and up stacked, as training's fused layer has them.
    gate_up: PackedWeight,
    down: PackedWeight,
}

/// Every projection and the LM head packed in bf16 (half the bytes a decode
/// step reads in f32).
#[cfg(target_arch = "x86_64")]
struct Bf16Weights {
    layers: Vec<Bf16Layer>,
    lm_head: PackedWeight,
}

// Elsewhere there is no bf16 GEMM: these exist only for the signatures
// that name them and are never built.
#[cfg(not(target_arch = "x86_64"))]
enum Bf16Weights {}
#[cfg(not(target_arch = "x86_64"))]
enum PackedWeight {}

#[cfg(target_arch = "x86_64")]
impl Bf16Weights {
    fn pack(w: &ModelView) -> Self {
        let dims = w.dims;
        let (d, q_dim, kv_dim, ffn) = (dims.d, dims.q_dim(), dims.kv_dim(), dims.ffn);
        let layers = w
            .layers
            .iter()
            .map(|l| Bf16Layer {
                qkv: PackedWeight::stacked(&[(l.q_w, q_dim), (l.k_w, kv_dim), (l.v_w, kv_dim)], d),
                o: PackedWeight::new(l.o_w, d, q_dim),
                gate_up: PackedWeight::stacked(&[(l.gate, ffn), (l.up, ffn)], d),
                down: PackedWeight::new(l.down, d, ffn),
            })
            .collect();
        Self {
            layers,
            lm_head: PackedWeight::new(w.lm_head, dims.vocab, d),
        }
    }
}

/// One projection's weights: f32, and packed bf16 when the products run in bf16.
#[derive(Clone, Copy)]
struct Weight<'a> {
    f32: &'a [f32],
    #[cfg(target_arch = "x86_64")]
    bf16: Option<&'a PackedWeight>,
}

impl<'a> Weight<'a> {
    /// An f32 weight.
    fn f32(w: &'a [f32]) -> Self {
        Self {
            f32: w,
            #[cfg(target_arch = "x86_64")]
            bf16: None,
        }
    }

    /// `y[rows, n_out] (+)= x[rows, n_in] · wᵀ`.
    fn apply(self, y: &mut [f32], x: &[f32], (n_in, n_out): (usize, usize), accumulate: bool) {
        #[cfg(target_arch = "x86_64")]
        if let Some(p) = self.bf16 {
            return p.apply(y, x, accumulate);
        }
        let rows = x.len() / n_in;
        Mm::nt(rows, n_out, n_in)
            .add_if(accumulate)
            .run(y, x, self.f32);
    }
}

/// `t` as a contiguous f32 CPU tensor: itself (shared storage) when it
/// already is one, else a converted copy.
fn host_f32(t: &Tensor) -> candle_core::Result<Tensor> {
    if t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous() {
        Ok(t.clone())
    } else {
        t.to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .contiguous()
    }
}

/// Runs `f` on a view of `model`'s weights, read in place (under their
/// storage read locks) when they are contiguous f32 on the CPU, with their
/// bf16 forms when `precision` is bf16.
fn with_view<R>(
    model: &Model,
    cfg: &ModelConfig,
    precision: Precision,
    f: impl FnOnce(&ModelView) -> Result<R, ModelError>,
) -> Result<R, ModelError> {
    let tensors = model
        .inference_tensors()
        .into_iter()
        .map(host_f32)
        .collect::<candle_core::Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = tensors.iter().collect();
    with_slices::<f32, _>(&refs, "inference weights", |slices| {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut view = ModelView::from_slices(Dims::of(cfg), model.qkv_bias(), slices)?;
        #[cfg(target_arch = "x86_64")]
        if precision == Precision::Bf16 && precision.available() {
            view.bf16 = Some(Bf16Weights::pack(&view));
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = precision;
        f(&view)
    })?
}

impl<'a> ModelView<'a> {
    /// Splits the slices listed by [`Model::inference_tensors`].
    fn from_slices(dims: Dims, bias: bool, s: &[&'a [f32]]) -> Result<Self, ModelError> {
        let per_layer = if bias { 12 } else { 9 };
        let bad = || ModelError::InvalidInput("inference weights: unexpected tensor list".into());
        let [embed, norm, lm_head, cos, sin, rest @ ..] = s else {
            return Err(bad());
        };
        if rest.len() % per_layer != 0 {
            return Err(bad());
        }
        let layers = rest
            .chunks(per_layer)
            .map(|l| LayerView {
                q_w: l[0],
                k_w: l[1],
                v_w: l[2],
                o_w: l[3],
                gate: l[4],
                up: l[5],
                down: l[6],
                input_ln: l[7],
                post_ln: l[8],
                q_b: bias.then(|| l[9]),
                k_b: bias.then(|| l[10]),
                v_b: bias.then(|| l[11]),
            })
            .collect();
        Ok(Self {
            dims,
            embed,
            layers,
            norm,
            lm_head,
            cos,
            sin,
            bf16: None,
        })
    }

    /// Layer `l`'s projections packed in bf16, when the products run in bf16.
    fn bf16_layer(&self, l: usize) -> Option<&Bf16Layer> {
        #[cfg(target_arch = "x86_64")]
        return self.bf16.as_ref().map(|b| &b.layers[l]);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = l;
            None
        }
    }
}

/// Work buffers of one forward, reused across the decode steps of a call.
#[derive(Default)]
struct Scratch {
    h: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The stacked products' outputs (q | k | v, then gate | up).
    stacked: Vec<f32>,
    last: Vec<f32>,
    logits: Vec<f32>,
}

/// Sizes `buf` to `n` elements (growing only; contents are overwritten by the caller).
fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// Where a packed row comes from: its sequence (index into the caches) and position.
#[derive(Clone, Copy)]
struct Row {
    seq: usize,
    pos: usize,
}

/// Rotates each head of `x: [heads · hd]` for position `pos` (rotate-half
/// convention, as [`crate::qwen2::RotaryEmbedding`]) and scales it.
fn rope_row(x: &mut [f32], cos: &[f32], sin: &[f32], pos: usize, hd: usize, scale: f32) {
    let half = hd / 2;
    let (c, s) = (
        &cos[pos * half..(pos + 1) * half],
        &sin[pos * half..(pos + 1) * half],
    );
    for head in x.chunks_exact_mut(hd) {
        let (x1, x2) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = (a * c[i] - b * s[i]) * scale;
            x2[i] = (b * c[i] + a * s[i]) * scale;
        }
    }
}

/// Keys per block of the online softmax (scores live on the stack).
const KEY_BLOCK: usize = 128;

/// `scores[j] = q · k[j·stride ..][..n]`: one query against a block of
/// cached keys (AVX2 when the CPU has it).
fn dot_rows(scores: &mut [f32], q: &[f32], k: &[f32], stride: usize, n: usize) {
    let len = scores.len();
    if len == 0 {
        return;
    }
    let (q, k) = (&q[..n], &k[..(len - 1) * stride + n]);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2/FMA detected; the slices above hold what it reads.
        return unsafe {
            simd::dot_rows_ptr(scores.as_mut_ptr(), q.as_ptr(), k.as_ptr(), stride, len, n)
        };
    }
    for (j, s) in scores.iter_mut().enumerate() {
        *s = dot(q, &k[j * stride..j * stride + n]);
    }
}

/// `o += Σ_j p[j] · v[j·stride ..][..n]`, keys in order (AVX2 when the CPU
/// has it, with `o` in registers across the keys).
fn axpy_rows(o: &mut [f32], p: &[f32], v: &[f32], stride: usize) {
    let (len, n) = (p.len(), o.len());
    if len == 0 {
        return;
    }
    let v = &v[..(len - 1) * stride + n];
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2/FMA detected; the slices above hold what it reads.
        return unsafe {
            simd::axpy_rows_ptr(o.as_mut_ptr(), p.as_ptr(), v.as_ptr(), stride, len, n)
        };
    }
    for (j, &pj) in p.iter().enumerate() {
        axpy(o, pj, &v[j * stride..j * stride + n]);
    }
}

/// Causal attention of one query row `q: [heads · hd]` (already rotated and
/// scaled) over keys/values `0..=pos` of one layer's cache, into `out`.
/// Online softmax over key blocks: no buffer grows with the context.
fn attend_row(out: &mut [f32], q: &[f32], kv: LayerKv, pos: usize, dims: Dims) {
    attend_row_from(out, q, kv, 0, pos, dims, None);
}

/// One head's online softmax so far: the largest score and the sum of the
/// scores' exponentials relative to it (the output beside it unnormalised).
#[derive(Clone, Copy, Debug)]
struct Partial {
    max: f32,
    sum: f32,
}

impl Partial {
    const EMPTY: Self = Self {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };

    /// Takes in a block of scores: `scores` become their exponentials
    /// relative to the new maximum, and `o` (the unnormalised output so
    /// far) is rescaled to it. `o` then needs the block's `P·V` added.
    fn absorb(&mut self, scores: &mut [f32], o: &mut [f32]) {
        let block_max = scores.iter().fold(f32::NEG_INFINITY, |a, &s| a.max(s));
        let max = self.max.max(block_max);
        if self.max > f32::NEG_INFINITY && max > self.max {
            let c = (self.max - max).exp();
            self.sum *= c;
            o.iter_mut().for_each(|x| *x *= c);
        }
        self.max = max;
        self.sum += exp_shifted_sum(scores, max);
    }
}

/// [`attend_row`] over keys `from..=pos` only, continuing each head's
/// online softmax from `start` (its output so far, unnormalised, already in
/// `out`), or from nothing when `start` is `None`; `out` ends normalised.
fn attend_row_from(
    out: &mut [f32],
    q: &[f32],
    kv: LayerKv,
    from: usize,
    pos: usize,
    dims: Dims,
    start: Option<&[Partial]>,
) {
    let (hd, kv_dim) = (dims.head_dim, dims.kv_dim());
    let rep = dims.heads / dims.kv_heads;
    let n = pos + 1;
    let mut scores = [0f32; KEY_BLOCK];
    for (h, (o, qh)) in out.chunks_exact_mut(hd).zip(q.chunks_exact(hd)).enumerate() {
        let off = (h / rep) * hd;
        let mut part = match start {
            Some(parts) => parts[h],
            None => {
                o.fill(0.0);
                Partial::EMPTY
            }
        };
        for start in (from..n).step_by(KEY_BLOCK) {
            let len = KEY_BLOCK.min(n - start);
            let block = &mut scores[..len];
            // A block that crosses the shared prefix's end is read in two
            // runs: the same scores and, keys in order, the same sums.
            let runs = || kv.runs(start, start + len, kv_dim);
            for (at, end, k, _) in runs() {
                let part = &mut block[at - start..end - start];
                dot_rows(part, qh, &k[off..], kv_dim, hd);
            }
            part.absorb(block, o);
            for (at, end, _, v) in runs() {
                axpy_rows(o, &block[at - start..end - start], &v[off..], kv_dim);
            }
        }
        let inv = 1.0 / part.sum;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Keys per block of [`attend_prefix`]'s online softmax.
const PREFIX_BLOCK: usize = 512;

/// Attention of `queries` query rows (`q`: `[queries, hd]`, rotated and
/// scaled) over the first `len` positions of one kv head of a shared
/// prefix (`k`, `v`: position-major rows `kv_dim` apart, starting at the
/// head's slice). Returns the unnormalised outputs `[queries, hd]` and each
/// row's [`Partial`], for [`attend_row_from`] to continue over the
/// sequence's own keys. The members of a group and the query heads of a kv
/// head read the prefix together, as GEMMs: it is read once per step
/// instead of once per member and head.
fn attend_prefix(
    q: &[f32],
    queries: usize,
    k: &[f32],
    v: &[f32],
    len: usize,
    hd: usize,
    kv_dim: usize,
) -> (Vec<f32>, Vec<Partial>) {
    let mut o = vec![0f32; queries * hd];
    let mut parts = vec![Partial::EMPTY; queries];
    let mut scores = vec![0f32; queries * PREFIX_BLOCK.min(len)];
    for start in (0..len).step_by(PREFIX_BLOCK) {
        let n = PREFIX_BLOCK.min(len - start);
        let s = &mut scores[..queries * n];
        let at = start * kv_dim;
        Mm::nt_b_rows(queries, n, hd, kv_dim)
            .single()
            .run(s, q, &k[at..]);
        for ((row, part), o) in s
            .chunks_exact_mut(n)
            .zip(&mut parts)
            .zip(o.chunks_exact_mut(hd))
        {
            part.absorb(row, o);
        }
        Mm::nn_b_rows(queries, hd, n, kv_dim)
            .single()
            .add()
            .run(&mut o, s, &v[at..]);
    }
    (o, parts)
}

/// The decode rows (not `blocked`) whose caches share a prompt prefix,
/// grouped by prefix in order of first appearance: `(a row's sequence,
/// rows)`.
fn prefix_groups(
    rows: &[Row],
    caches: &[SequenceCache],
    blocked: &[bool],
) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let Some(prefix) = (!blocked[r])
            .then(|| caches[row.seq].prefix.as_ref())
            .flatten()
        else {
            continue;
        };
        let same = |&(seq, _): &(usize, Vec<usize>)| {
            caches[seq]
                .prefix
                .as_ref()
                .is_some_and(|p| Arc::ptr_eq(p, prefix))
        };
        match groups.iter().position(same) {
            Some(g) => groups[g].1.push(r),
            None => groups.push((row.seq, vec![r])),
        }
    }
    groups
}

/// Prefill runs shorter than this attend row by row ([`attend_row`]).
const BLOCK_RUN_MIN: usize = 8;
/// Query rows per score block of [`attend_run`]: its scratch is at most this
/// many rows × the context.
const QUERY_BLOCK: usize = 64;

/// The maximal runs of `rows` that belong to one sequence at consecutive
/// positions, as (first row, length): a prefill chunk is one run, a decode
/// step is one run of 1 per sequence.
fn runs_of(rows: &[Row]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        match runs.last_mut() {
            Some((start, len))
                if rows[*start].seq == row.seq && rows[*start].pos + *len == row.pos =>
            {
                *len += 1
            }
            _ => runs.push((r, 1)),
        }
    }
    runs
}

/// Causal attention of head `h` for `len` consecutive query rows of one
/// sequence (`q`: `len` rows of `[heads · hd]`, rotated and scaled; the first
/// at position `pos0`) over that sequence's cached keys and values, as GEMMs:
/// scores `Q·Kᵀ` a block of query rows at a time, a causal softmax per row,
/// then `P·V`. Returns `[len, hd]`. The same sums as [`attend_row`] in
/// another order: a prefill chunk costs a few GEMMs instead of one short dot
/// product and axpy per (row, key).
fn attend_run(q: &[f32], kv: LayerKv, pos0: usize, len: usize, h: usize, dims: Dims) -> Vec<f32> {
    let (hd, q_dim, kv_dim) = (dims.head_dim, dims.q_dim(), dims.kv_dim());
    let off = (h / (dims.heads / dims.kv_heads)) * hd;
    let keys = pos0 + len;
    let gather = |values: bool| -> Vec<f32> {
        let mut out = Vec::with_capacity(keys * hd);
        for (at, end, k, v) in kv.runs(0, keys, kv_dim) {
            let src = if values { v } else { k };
            for j in 0..end - at {
                out.extend_from_slice(&src[j * kv_dim + off..j * kv_dim + off + hd]);
            }
        }
        out
    };
    let (kh, vh) = (gather(false), gather(true));
    let mut out = vec![0f32; len * hd];
    let mut scores = Vec::new();
    for qb in (0..len).step_by(QUERY_BLOCK) {
        let m = QUERY_BLOCK.min(len - qb);
        // Keys visible to the block's last row.
        let seen = pos0 + qb + m;
        let mut qh = Vec::with_capacity(m * hd);
        for i in qb..qb + m {
            qh.extend_from_slice(&q[i * q_dim + h * hd..i * q_dim + (h + 1) * hd]);
        }
        scores.clear();
        scores.resize(m * seen, 0f32);
        Mm::nt(m, seen, hd).single().run(&mut scores, &qh, &kh);
        for (i, row) in scores.chunks_exact_mut(seen).enumerate() {
            let visible = pos0 + qb + i + 1;
            let (live, masked) = row.split_at_mut(visible);
            let mx = live.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum = exp_shifted_sum(live, mx);
            let inv = 1.0 / sum;
            live.iter_mut().for_each(|x| *x *= inv);
            masked.fill(0.0);
        }
        Mm::nn(m, hd, seen)
            .single()
            .run(&mut out[qb * hd..(qb + m) * hd], &scores, &vh);
    }
    out
}

/// `y = rows of x · wᵀ (+ b)`: a linear layer over packed rows.
fn linear_rows(y: &mut [f32], x: &[f32], w: Weight, b: Option<&[f32]>, n_in: usize, n_out: usize) {
    if let Some(b) = b {
        for r in y.chunks_exact_mut(n_out) {
            r.copy_from_slice(b);
        }
    }
    w.apply(y, x, (n_in, n_out), b.is_some());
}

/// Encodes the packed `rows` (token ids `ids`, one per row) into their
/// sequences' caches and writes the logits of the rows flagged in `emit`
/// (in row order) to `scratch.logits`, `[emitted, vocab]`.
fn forward(
    w: &ModelView,
    caches: &mut [SequenceCache],
    ids: &[u32],
    rows: &[Row],
    emit: &[bool],
    s: &mut Scratch,
) {
    let dims = w.dims;
    let (d, hd, q_dim, kv_dim, ffn) =
        (dims.d, dims.head_dim, dims.q_dim(), dims.kv_dim(), dims.ffn);
    let n = rows.len();
    let scale = 1.0 / (hd as f32).sqrt();
    let h = sized(&mut s.h, n * d);
    for (hr, &id) in h.chunks_exact_mut(d).zip(ids) {
        let id = id as usize;
        hr.copy_from_slice(&w.embed[id * d..(id + 1) * d]);
    }
    for (li, layer) in w.layers.iter().enumerate() {
        // Attention block: h += o(attend(rope(q), rope(k), v)) of norm(h).
        let xn = sized(&mut s.xn, n * d);
        rms_norm_rows(xn, h, layer.input_ln, d, dims.eps, None);
        let q = sized(&mut s.q, n * q_dim);
        let k = sized(&mut s.k, n * kv_dim);
        let v = sized(&mut s.v, n * kv_dim);
        let qkv_dim = q_dim + 2 * kv_dim;
        let stacked = w.bf16_layer(li).map(|b| {
            let qkv = sized(&mut s.stacked, n * qkv_dim);
            // The biases first and the product added, as `linear_rows` does.
            let biases = [(layer.q_b, q_dim), (layer.k_b, kv_dim), (layer.v_b, kv_dim)];
            let biased = biases.iter().any(|(b, _)| b.is_some());
            if biased {
                for row in qkv.chunks_exact_mut(qkv_dim) {
                    let mut col = 0;
                    for (b, width) in biases {
                        match b {
                            Some(b) => row[col..col + width].copy_from_slice(b),
                            None => row[col..col + width].fill(0.0),
                        }
                        col += width;
                    }
                }
            }
            b.qkv.apply(qkv, xn, biased);
            qkv
        });
        if let Some(qkv) = stacked {
            // Each row's q | k | v into their buffers.
            let mut col = 0;
            for (out, width) in [(&mut *q, q_dim), (&mut *k, kv_dim), (&mut *v, kv_dim)] {
                for (o, row) in out.chunks_exact_mut(width).zip(qkv.chunks_exact(qkv_dim)) {
                    o.copy_from_slice(&row[col..col + width]);
                }
                col += width;
            }
        } else {
            linear_rows(q, xn, Weight::f32(layer.q_w), layer.q_b, d, q_dim);
            linear_rows(k, xn, Weight::f32(layer.k_w), layer.k_b, d, kv_dim);
            linear_rows(v, xn, Weight::f32(layer.v_w), layer.v_b, d, kv_dim);
        }
        for (r, row) in rows.iter().enumerate() {
            rope_row(
                &mut q[r * q_dim..(r + 1) * q_dim],
                w.cos,
                w.sin,
                row.pos,
                hd,
                scale,
            );
            let kr = &mut k[r * kv_dim..(r + 1) * kv_dim];
            rope_row(kr, w.cos, w.sin, row.pos, hd, 1.0);
            let c = &mut caches[row.seq];
            let at = (row.pos - c.base()) * kv_dim;
            c.k[li][at..at + kv_dim].copy_from_slice(kr);
            c.v[li][at..at + kv_dim].copy_from_slice(&v[r * kv_dim..(r + 1) * kv_dim]);
        }
        let att = sized(&mut s.att, n * q_dim);
        let caches_ro: &[SequenceCache] = caches;
        let q_ro: &[f32] = q;
        // Long prefill runs go through GEMMs, a task per (run, head); the
        // other rows (decode steps, short chunks) attend one by one.
        let long: Vec<(usize, usize)> = runs_of(rows)
            .into_iter()
            .filter(|&(_, len)| len >= BLOCK_RUN_MIN)
            .collect();
        let mut blocked = vec![false; n];
        for &(start, len) in &long {
            blocked[start..start + len].fill(true);
        }
        let tasks: Vec<(usize, usize, usize)> = long
            .iter()
            .flat_map(|&(start, len)| (0..dims.heads).map(move |h| (start, len, h)))
            .collect();
        let run_head = |&(start, len, h): &(usize, usize, usize)| {
            let row = rows[start];
            let c = &caches_ro[row.seq];
            let qs = &q_ro[start * q_dim..(start + len) * q_dim];
            attend_run(qs, c.layer(li), row.pos, len, h, dims)
        };
        let blocks: Vec<Vec<f32>> = if num_threads() > 1 && tasks.len() > 1 {
            use rayon::prelude::*;
            tasks.par_iter().map(run_head).collect()
        } else {
            tasks.iter().map(run_head).collect()
        };
        // The shared prefixes' part of the other rows' attention, a task
        // per (prefix, kv head); each row then goes on over its own keys.
        let groups = prefix_groups(rows, caches_ro, &blocked);
        let rep = dims.heads / dims.kv_heads;
        let prefix_tasks: Vec<(usize, usize)> = (0..groups.len())
            .flat_map(|g| (0..dims.kv_heads).map(move |kh| (g, kh)))
            .collect();
        let prefix_head = |&(g, kh): &(usize, usize)| {
            let (seq, members) = &groups[g];
            let kv = caches_ro[*seq].layer(li);
            let mut qg = Vec::with_capacity(members.len() * rep * hd);
            for &r in members {
                let at = r * q_dim + kh * rep * hd;
                qg.extend_from_slice(&q_ro[at..at + rep * hd]);
            }
            let off = kh * hd;
            let (k, v) = (&kv.shared_k[off..], &kv.shared_v[off..]);
            attend_prefix(&qg, members.len() * rep, k, v, kv.base, hd, kv_dim)
        };
        let prefix_parts: Vec<(Vec<f32>, Vec<Partial>)> =
            if num_threads() > 1 && prefix_tasks.len() > 1 {
                use rayon::prelude::*;
                prefix_tasks.par_iter().map(prefix_head).collect()
            } else {
                prefix_tasks.iter().map(prefix_head).collect()
            };
        let mut parts = vec![Partial::EMPTY; if groups.is_empty() { 0 } else { n * dims.heads }];
        let mut prefixed = vec![false; n];
        for (&(g, kh), (o, p)) in prefix_tasks.iter().zip(&prefix_parts) {
            for (i, &r) in groups[g].1.iter().enumerate() {
                prefixed[r] = true;
                let (h0, at) = (kh * rep, r * q_dim + kh * rep * hd);
                att[at..at + rep * hd].copy_from_slice(&o[i * rep * hd..(i + 1) * rep * hd]);
                parts[r * dims.heads + h0..r * dims.heads + h0 + rep]
                    .copy_from_slice(&p[i * rep..(i + 1) * rep]);
            }
        }
        let work = rows
            .iter()
            .zip(&blocked)
            .filter(|(_, &b)| !b)
            .map(|(r, _)| (r.pos + 1) * q_dim * 4)
            .sum();
        let parts_ro: &[Partial] = &parts;
        par_chunks_mut(att, q_dim, work, |r, out| {
            if blocked[r] {
                return;
            }
            let row = rows[r];
            let kv = caches_ro[row.seq].layer(li);
            let qr = &q_ro[r * q_dim..(r + 1) * q_dim];
            if prefixed[r] {
                let start = &parts_ro[r * dims.heads..(r + 1) * dims.heads];
                attend_row_from(out, qr, kv, kv.base, row.pos, dims, Some(start));
            } else {
                attend_row(out, qr, kv, row.pos, dims);
            }
        });
        for (&(start, _, head), block) in tasks.iter().zip(&blocks) {
            for (i, src) in block.chunks_exact(hd).enumerate() {
                let at = (start + i) * q_dim + head * hd;
                att[at..at + hd].copy_from_slice(src);
            }
        }
        match w.bf16_layer(li) {
            Some(b) => b.o.apply(h, att, true),
            None => Weight::f32(layer.o_w).apply(h, att, (q_dim, d), true),
        }

        // MLP block: h += down(silu(gate(x)) · up(x)) of x = norm(h).
        let xn = sized(&mut s.xn, n * d);
        rms_norm_rows(xn, h, layer.post_ln, d, dims.eps, None);
        if let Some(b) = w.bf16_layer(li) {
            // gate | up in one product; the activation overwrites each row's
            // gate half, which the down projection reads in place.
            let gu = sized(&mut s.stacked, n * 2 * ffn);
            b.gate_up.apply(gu, xn, false);
            par_chunks_mut(gu, 2 * ffn, n * ffn * 8, |_, row| {
                let (g, u) = row.split_at_mut(ffn);
                swiglu_in_place(g, u);
            });
            b.down.apply_rows(h, gu, 2 * ffn, true);
        } else {
            let g = sized(&mut s.gate, n * ffn);
            let u = sized(&mut s.up, n * ffn);
            Weight::f32(layer.gate).apply(g, xn, (d, ffn), false);
            Weight::f32(layer.up).apply(u, xn, (d, ffn), false);
            let u_ro: &[f32] = u;
            par_chunks_mut(g, ffn, n * ffn * 8, |r, gr| {
                swiglu_in_place(gr, &u_ro[r * ffn..(r + 1) * ffn]);
            });
            Weight::f32(layer.down).apply(h, g, (ffn, d), true);
        }
    }
    // Final norm and LM head, only for the rows whose next token is sampled.
    let picked: Vec<usize> = (0..n).filter(|&r| emit[r]).collect();
    let last = sized(&mut s.last, picked.len() * d);
    for (lr, &r) in last.chunks_exact_mut(d).zip(&picked) {
        rms_norm_rows(lr, &h[r * d..(r + 1) * d], w.norm, d, dims.eps, None);
    }
    let logits = sized(&mut s.logits, picked.len() * dims.vocab);
    let head = Weight {
        f32: w.lm_head,
        #[cfg(target_arch = "x86_64")]
        bf16: w.bf16.as_ref().map(|b| &b.lm_head),
    };
    head.apply(logits, last, (d, dims.vocab), false);
}

/// Continuous batching (see [`crate::PolicyModel::generate_continuous`]):
/// who says how a sequence goes on once its continuation has ended.
pub(crate) struct Continuation<'a> {
    /// Sequence `i`'s continuation has ended: its next context (checked),
    /// or done, or stop the batch.
    pub next: &'a mut dyn FnMut(usize, Generation) -> Result<Followup, ModelError>,
    /// A continued sequence reuses what its cache holds (off: it encodes
    /// its new context from the first token).
    pub keep_cache: bool,
    /// Context positions served from caches so far, continued contexts
    /// included.
    pub reused: usize,
}

/// Samples a continuation of each `contexts[i]`, reusing and extending
/// `caches[i]`; see [`crate::PolicyModel::generate_cached`] for the contract.
/// With a `follow`, a sequence whose continuation ends is handed to it and
/// may go on with a new context, encoded in the same forward passes as the
/// other sequences' next tokens (every generation then goes to `follow`).
/// The caller has validated ids, lengths, parameters and the caches' shape.
#[allow(clippy::too_many_arguments)]
pub(crate) fn generate(
    model: &Model,
    cfg: &ModelConfig,
    caches: &mut [SequenceCache],
    contexts: &[Vec<u32>],
    params: &SamplingParams,
    precision: Precision,
    mut rng: SamplingRng<'_>,
    steer: &mut Steer<'_>,
    mut follow: Option<&mut Continuation<'_>>,
) -> Result<Vec<Generation>, ModelError> {
    let mut gens = empty_generations(contexts.len());
    if follow.as_ref().is_some_and(|c| !c.keep_cache) {
        caches.iter_mut().for_each(SequenceCache::clear);
    }
    let starts: Vec<usize> = caches
        .iter_mut()
        .zip(contexts)
        .map(|(c, ctx)| c.retarget(ctx))
        .collect();
    if let Some(c) = follow.as_deref_mut() {
        c.reused += starts.iter().sum::<usize>();
    }
    if params.max_new_tokens == 0 || contexts.is_empty() {
        return Ok(gens);
    }
    // A context that repeats an earlier one from the same cached start (the
    // members of a GRPO group on their first turn) is encoded once: its twin
    // takes the leader's keys, values and logits, which are what encoding it
    // again would give.
    let mut first_seen: std::collections::HashMap<(usize, &[u32]), usize> =
        std::collections::HashMap::new();
    let leader: Vec<usize> = contexts
        .iter()
        .enumerate()
        .map(|(i, ctx)| *first_seen.entry((starts[i], &ctx[..])).or_insert(i))
        .collect();
    // Twins encoded from the first position share the leader's keys and
    // values instead of copying them (stored once, read once per group
    // member from the caches nearest the core); their own rows then hold
    // only the new tokens.
    let shares = |j: usize| leader[j] != j && starts[j] == 0;
    let mut has_twin = vec![false; contexts.len()];
    for j in (0..contexts.len()).filter(|&j| shares(j)) {
        has_twin[leader[j]] = true;
    }
    // The last sampled token is never fed back.
    let positions = |ctx: &Vec<u32>| ctx.len() + params.max_new_tokens - 1;
    for (j, (c, ctx)) in caches.iter_mut().zip(contexts).enumerate() {
        if !shares(j) {
            c.reserve(positions(ctx));
        }
    }
    with_view(model, cfg, precision, |w| {
        let mut scratch = Scratch::default();
        // Step 0 encodes every uncached context token of each leader; later
        // steps one token per live sequence.
        let mut active: Vec<usize> = (0..contexts.len()).collect();
        let mut ids: Vec<u32> = Vec::new();
        let mut rows: Vec<Row> = Vec::new();
        let mut emit: Vec<bool> = Vec::new();
        for (i, ctx) in contexts.iter().enumerate() {
            if leader[i] != i {
                continue;
            }
            for (pos, &t) in ctx.iter().enumerate().skip(starts[i]) {
                ids.push(t);
                rows.push(Row { seq: i, pos });
                emit.push(pos + 1 == ctx.len());
            }
        }
        // Per sequence, its row of the step's logits.
        let mut logit_row = vec![0usize; contexts.len()];
        let mut first_step = true;
        // Twins that take their leader's keys, values and logits after the
        // next forward: (twin, leader, where the twin's cache starts). At
        // first the twins that do not share a prompt, later sequences
        // continued with a context another continued with in the same step.
        let mut step_twins: Vec<(usize, usize, usize)> = leader
            .iter()
            .enumerate()
            .filter(|&(j, &i)| j != i && !shares(j))
            .map(|(j, &i)| (j, i, starts[j]))
            .collect();
        // Per sequence going on with a new context: where its encoding starts.
        let mut encode_from: Vec<Option<usize>> = vec![None; contexts.len()];
        loop {
            forward(w, caches, &ids, &rows, &emit, &mut scratch);
            let emitted = rows.iter().zip(&emit).filter(|(_, &e)| e).map(|(r, _)| r);
            for (k, r) in emitted.enumerate() {
                caches[r.seq].cached = r.pos + 1;
                logit_row[r.seq] = k;
            }
            for (j, i, start) in step_twins.drain(..) {
                copy_encoded(caches, i, j, start);
                logit_row[j] = logit_row[i];
            }
            if std::mem::take(&mut first_step) {
                let mut prefixes: Vec<Option<Arc<SharedPrefix>>> = vec![None; contexts.len()];
                for i in (0..contexts.len()).filter(|&i| has_twin[i]) {
                    prefixes[i] = Some(caches[i].share_encoded());
                }
                for (j, &i) in leader.iter().enumerate().filter(|&(j, _)| shares(j)) {
                    if let Some(prefix) = &prefixes[i] {
                        let c = &mut caches[j];
                        c.prefix = Some(prefix.clone());
                        c.cached = prefix.len;
                        c.reserve(positions(&contexts[j]));
                    }
                    logit_row[j] = logit_row[i];
                }
            }
            let vocab = w.dims.vocab;
            // The rows' token choices in parallel (a pass over a real
            // vocabulary each), the draws in the order of `active`.
            let picks = steer.choose_rows(
                &scratch.logits,
                vocab,
                &active,
                &logit_row,
                &gens,
                params,
                &mut rng,
            )?;
            let mut still = Vec::with_capacity(active.len());
            for (&i, (tok, lp, go_on)) in active.iter().zip(picks) {
                caches[i].tokens.push(tok);
                if push_token(&mut gens[i], tok, lp, params) && go_on {
                    still.push(i);
                    continue;
                }
                let Some(follow) = follow.as_deref_mut() else {
                    continue;
                };
                match (follow.next)(i, std::mem::take(&mut gens[i]))? {
                    Followup::Continue(ctx) => {
                        let c = &mut caches[i];
                        if !follow.keep_cache {
                            c.clear();
                        }
                        let start = c.retarget(&ctx);
                        c.reserve(positions(&ctx));
                        follow.reused += start;
                        encode_from[i] = Some(start);
                        still.push(i);
                    }
                    Followup::Done => {}
                    Followup::Abort => return Ok(gens),
                }
            }
            active = still;
            if active.is_empty() {
                return Ok(gens);
            }
            ids.clear();
            rows.clear();
            emit.clear();
            // As on the first step, a context continued twice from the same
            // start (GRPO members in the same state) is encoded once.
            let mut step_leaders: std::collections::HashMap<(usize, &[u32]), usize> =
                std::collections::HashMap::new();
            for &i in &active {
                let c = &caches[i];
                let continued = encode_from[i].take();
                if let Some(start) = continued {
                    let leader = *step_leaders.entry((start, &c.tokens[..])).or_insert(i);
                    if leader != i {
                        step_twins.push((i, leader, start));
                        continue;
                    }
                }
                // A new context's uncached tokens, else the last sampled one.
                let from = continued.unwrap_or(c.tokens.len() - 1);
                for (pos, &t) in c.tokens.iter().enumerate().skip(from) {
                    ids.push(t);
                    rows.push(Row { seq: i, pos });
                    emit.push(pos + 1 == c.tokens.len());
                }
            }
        }
    })
}

/// Gives cache `to` the keys and values cache `from` holds past position
/// `start` (both stand for the same context), and its cached length. Each
/// side may read its first positions from a shared prefix; `to`'s starts
/// no later than `start` (its retarget saw to that).
fn copy_encoded(caches: &mut [SequenceCache], from: usize, to: usize, start: usize) {
    let (src, dst) = if from < to {
        let (a, b) = caches.split_at_mut(to);
        (&a[from], &mut b[0])
    } else {
        let (a, b) = caches.split_at_mut(from);
        (&b[0], &mut a[to])
    };
    let (kv_dim, dst_base) = (src.kv_dim, dst.base());
    debug_assert!(dst_base <= start);
    for l in 0..src.k.len() {
        for (at, end, k, v) in src.layer(l).runs(start, src.cached, kv_dim) {
            let n = (end - at) * kv_dim;
            let to_at = (at - dst_base) * kv_dim;
            dst.k[l][to_at..to_at + n].copy_from_slice(&k[..n]);
            dst.v[l][to_at..to_at + n].copy_from_slice(&v[..n]);
        }
    }
    dst.cached = src.cached;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn fill(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let x = i
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn blocked_prefill_attention_equals_row_by_row() {
        // GQA (4 query heads on 2 kv heads), a run that starts after 37
        // cached positions and spans more than one query block.
        let dims = attention_dims();
        let (pos0, len) = (37, QUERY_BLOCK + 9);
        let keys = pos0 + len;
        let k = fill(keys * dims.kv_dim(), 1);
        let v = fill(keys * dims.kv_dim(), 2);
        let q = fill(len * dims.q_dim(), 3);
        let hd = dims.head_dim;
        let kv = whole(&k, &v);
        for h in 0..dims.heads {
            let blocked = attend_run(&q, kv, pos0, len, h, dims);
            for i in 0..len {
                let mut row = vec![0f32; dims.q_dim()];
                let qi = &q[i * dims.q_dim()..(i + 1) * dims.q_dim()];
                attend_row(&mut row, qi, kv, pos0 + i, dims);
                for (a, b) in blocked[i * hd..(i + 1) * hd]
                    .iter()
                    .zip(&row[h * hd..(h + 1) * hd])
                {
                    assert!((a - b).abs() < 1e-5, "head {h} row {i}: {a} vs {b}");
                }
            }
        }
    }

    /// GQA: 4 query heads on 2 kv heads of 16.
    fn attention_dims() -> Dims {
        Dims {
            d: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            ffn: 1,
            vocab: 1,
            eps: 1e-6,
        }
    }

    /// Keys and values all the sequence's own.
    fn whole<'a>(k: &'a [f32], v: &'a [f32]) -> LayerKv<'a> {
        LayerKv {
            base: 0,
            shared_k: &[],
            shared_v: &[],
            k,
            v,
        }
    }

    #[test]
    fn a_shared_prefix_gives_the_bits_of_one_cache() {
        let dims = attention_dims();
        let kv_dim = dims.kv_dim();
        let keys = 2 * KEY_BLOCK + 40;
        let (k, v) = (fill(keys * kv_dim, 4), fill(keys * kv_dim, 5));
        let q = fill(keys * dims.q_dim(), 6);
        // The prefix ends inside the first key block, on its edge, and
        // inside a later one.
        for base in [20, KEY_BLOCK, KEY_BLOCK + 57] {
            let split = LayerKv {
                base,
                shared_k: &k[..base * kv_dim],
                shared_v: &v[..base * kv_dim],
                k: &k[base * kv_dim..],
                v: &v[base * kv_dim..],
            };
            for pos in [base - 1, base, base + 3, keys - 1] {
                let qi = &q[pos * dims.q_dim()..(pos + 1) * dims.q_dim()];
                let (mut a, mut b) = (vec![0f32; dims.q_dim()], vec![0f32; dims.q_dim()]);
                attend_row(&mut a, qi, whole(&k, &v), pos, dims);
                attend_row(&mut b, qi, split, pos, dims);
                assert_eq!(a, b, "row at {pos}, prefix of {base}");
            }
            let (pos0, len) = (base - 5, keys - base + 5);
            let qs = &q[pos0 * dims.q_dim()..];
            for h in 0..dims.heads {
                let a = attend_run(qs, whole(&k, &v), pos0, len, h, dims);
                assert_eq!(
                    a,
                    attend_run(qs, split, pos0, len, h, dims),
                    "run, head {h}"
                );
            }
        }
    }

    #[test]
    fn a_prefix_read_by_a_group_then_own_keys_equals_attention_row_by_row() {
        let dims = attention_dims();
        let (hd, kv_dim, q_dim) = (dims.head_dim, dims.kv_dim(), dims.q_dim());
        let rep = dims.heads / dims.kv_heads;
        // One prefix within a key block of the GEMM path, one over two.
        for base in [37, PREFIX_BLOCK + 37] {
            let (pk, pv) = (fill(base * kv_dim, 7), fill(base * kv_dim, 8));
            // Three members with 1, 4 and KEY_BLOCK + 3 positions of their own.
            let own = [1, 4, KEY_BLOCK + 3];
            let keys: Vec<(Vec<f32>, Vec<f32>)> = own
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    (
                        fill(len * kv_dim, 10 + i as u32),
                        fill(len * kv_dim, 20 + i as u32),
                    )
                })
                .collect();
            let q = fill(own.len() * q_dim, 9);
            let layer = |i: usize| LayerKv {
                base,
                shared_k: &pk,
                shared_v: &pv,
                k: &keys[i].0,
                v: &keys[i].1,
            };
            let mut got = vec![0f32; own.len() * q_dim];
            let mut parts = vec![Partial::EMPTY; own.len() * dims.heads];
            for kh in 0..dims.kv_heads {
                let qg: Vec<f32> = (0..own.len())
                    .flat_map(|i| q[i * q_dim + kh * rep * hd..][..rep * hd].to_vec())
                    .collect();
                let off = kh * hd;
                let (o, p) = attend_prefix(
                    &qg,
                    own.len() * rep,
                    &pk[off..],
                    &pv[off..],
                    base,
                    hd,
                    kv_dim,
                );
                for i in 0..own.len() {
                    let at = i * q_dim + kh * rep * hd;
                    got[at..at + rep * hd].copy_from_slice(&o[i * rep * hd..(i + 1) * rep * hd]);
                    let h0 = i * dims.heads + kh * rep;
                    parts[h0..h0 + rep].copy_from_slice(&p[i * rep..(i + 1) * rep]);
                }
            }
            for (i, &len) in own.iter().enumerate() {
                let pos = base + len - 1;
                let qi = &q[i * q_dim..(i + 1) * q_dim];
                let out = &mut got[i * q_dim..(i + 1) * q_dim];
                let start = &parts[i * dims.heads..(i + 1) * dims.heads];
                attend_row_from(out, qi, layer(i), base, pos, dims, Some(start));
                let mut want = vec![0f32; q_dim];
                attend_row(&mut want, qi, layer(i), pos, dims);
                for (j, (a, b)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "prefix {base}, member {i}, [{j}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn twins_share_their_leaders_prompt_and_keep_only_their_new_tokens() {
        use rand::SeedableRng;
        let cfg = ModelConfig::new_qwen2(50, 32, 2, 4, 2, 48);
        let model = crate::PolicyModel::new_random(&cfg, false, 1, &Device::Cpu).unwrap();
        let prompt: Vec<u32> = (0..20).map(|t| (t * 7) % 50).collect();
        let prompts = vec![prompt.clone(), prompt.clone(), prompt, vec![1, 2, 3]];
        let mut caches: Vec<SequenceCache> = (0..4).map(|_| model.new_cache()).collect();
        let params = SamplingParams {
            max_new_tokens: 5,
            ..SamplingParams::default()
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        model
            .generate_cached(&mut caches, &prompts, &params, &mut rng)
            .unwrap();
        let shared = caches[0]
            .prefix
            .clone()
            .expect("the leader shares its prompt");
        assert_eq!(shared.len, 20);
        for twin in &caches[1..3] {
            assert!(Arc::ptr_eq(&shared, twin.prefix.as_ref().unwrap()));
            // Room for the 4 new positions fed back, not for the prompt.
            assert_eq!(twin.k[0].len(), 4 * twin.kv_dim);
        }
        assert!(caches[3].prefix.is_none(), "a prompt of its own");
    }

    #[test]
    fn runs_split_at_a_new_sequence_or_a_gap() {
        let rows =
            [(0, 3), (0, 4), (0, 5), (1, 0), (1, 2), (2, 7)].map(|(seq, pos)| Row { seq, pos });
        assert_eq!(runs_of(&rows), vec![(0, 3), (3, 1), (4, 1), (5, 1)]);
    }
}
