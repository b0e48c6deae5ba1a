//! One Qwen2 decoder layer as a single candle op with a hand-written
//! backward (as llm.c does for GPT-2), over packed sequences.
//!
//! Why: built from candle ops, a layer is ~40 graph nodes whose elementwise
//! steps each allocate, make a pass over memory and synchronise candle's own
//! thread pool against the GEMM's; profiling a training step showed more
//! time spinning in that pool's barrier than in most kernels. Here the
//! layer is GEMMs (the `gemm` crate, as candle uses) plus fused row passes
//! on one pool: RMSNorm, RoPE with the head transpose, flash-style attention
//! ([`crate::attention`]), SwiGLU, residuals — and their exact adjoints.
//!
//! The op takes the layer input `x: [N, d]` (N = every real token of the
//! batch, no padding) and one flat tensor holding all the layer's
//! parameters, concatenated from their `Var`s with candle's differentiable
//! `cat` — so candle's autograd hands each `Var` its slice of the gradient
//! this op returns. Activations the backward needs are kept inside the op
//! (the graph holds the op as long as it holds the output).

use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use crate::attention::{self, Heads};
use crate::host::{storage_slice, tensor_from, with_slices};
use crate::kernels::{
    assume_written, par_chunks2_mut, par_chunks_map, par_fill, par_map, rms_norm_rows,
    swiglu_bwd_into, swiglu_into, write_slice, Mm, Real,
};
use crate::lora::LoraTarget;
use crate::lora_layer::{LayerLora, GATE_UP, QKV};
use crate::precision::Precision;

/// Where each packed token sits: segment `s` owns rows
/// `offsets[s]..offsets[s + 1]`, row r is at position `pos[r]` of its
/// sequence, and `prefix[s] = Some(p)` when segment `s` continues the
/// shared prompt that segment `p` holds (see [`crate::attention`]).
#[derive(Debug, Clone)]
pub(crate) struct Packing {
    pub offsets: Vec<usize>,
    pub pos: Vec<usize>,
    pub prefix: Vec<Option<usize>>,
    /// Per input sequence: its own segment, and the length and segment of
    /// the prompt it shares (0 and `None` when it shares none).
    sequences: Vec<(usize, usize, Option<usize>)>,
}

/// The fewest tokens worth sharing: below this a copy costs less than the bookkeeping.
pub(crate) const MIN_SHARED_PREFIX: usize = 16;

impl Packing {
    /// The packing of sequences with these lengths, one segment each.
    pub(crate) fn of_lengths(lengths: impl IntoIterator<Item = usize>) -> Self {
        let mut offsets = vec![0];
        let mut pos = Vec::new();
        for len in lengths {
            pos.extend(0..len);
            offsets.push(offsets[offsets.len() - 1] + len);
        }
        let count = offsets.len() - 1;
        Self {
            offsets,
            pos,
            prefix: vec![None; count],
            sequences: (0..count).map(|s| (s, 0, None)).collect(),
        }
    }

    /// The packing of `seqs` that computes a prompt several of them share
    /// once, and the packed token ids. Each sequence's shareable part is
    /// the longest it has in common with any other sequence, cut before its
    /// position `first_free[i]` (a position whose output is read per
    /// sequence, such as a scored one) and leaving it one row of its own;
    /// sequences whose shareable parts are the same tokens, at least
    /// [`MIN_SHARED_PREFIX`] of them, form a group (a GRPO group's prompt,
    /// not the system prompt every task starts with).
    pub(crate) fn sharing_prefixes(seqs: &[Vec<u32>], first_free: &[usize]) -> (Self, Vec<u32>) {
        let lcp = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let cap: Vec<usize> = (0..seqs.len())
            .map(|i| {
                first_free
                    .get(i)
                    .copied()
                    .unwrap_or(0)
                    .min(seqs[i].len().saturating_sub(1))
            })
            .collect();
        let shareable: Vec<usize> = (0..seqs.len())
            .map(|i| {
                (0..seqs.len())
                    .filter(|&j| j != i && cap[i] >= MIN_SHARED_PREFIX)
                    .map(|j| lcp(&seqs[i], &seqs[j]).min(cap[i]).min(cap[j]))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        // Groups in order of their first member: (shared length, members).
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut by_prefix: std::collections::HashMap<&[u32], usize> =
            std::collections::HashMap::new();
        for (i, &len) in shareable.iter().enumerate() {
            if len < MIN_SHARED_PREFIX {
                groups.push((0, vec![i]));
                continue;
            }
            let g = *by_prefix.entry(&seqs[i][..len]).or_insert_with(|| {
                groups.push((len, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i);
        }
        let mut offsets = vec![0];
        let (mut pos, mut ids, mut prefix) = (Vec::new(), Vec::new(), Vec::new());
        let mut sequences = vec![(0, 0, None); seqs.len()];
        let mut push = |tokens: &[u32], start: usize, shared: Option<usize>| {
            pos.extend(start..start + tokens.len());
            ids.extend_from_slice(tokens);
            offsets.push(offsets[offsets.len() - 1] + tokens.len());
            prefix.push(shared);
            offsets.len() - 2
        };
        for (shared, members) in groups {
            let first = members[0];
            if members.len() < 2 {
                sequences[first] = (push(&seqs[first], 0, None), 0, None);
                continue;
            }
            let p = push(&seqs[first][..shared], 0, None);
            for i in members {
                sequences[i] = (push(&seqs[i][shared..], shared, Some(p)), shared, Some(p));
            }
        }
        (
            Self {
                offsets,
                pos,
                prefix,
                sequences,
            },
            ids,
        )
    }

    /// Total rows.
    pub(crate) fn rows(&self) -> usize {
        self.pos.len()
    }

    /// The packed row of position `t` of input sequence `i`.
    pub(crate) fn row_of(&self, i: usize, t: usize) -> usize {
        let (own, shared, prefix) = self.sequences[i];
        match prefix {
            Some(p) if t < shared => self.offsets[p] + t,
            _ => self.offsets[own] + t - shared,
        }
    }

    /// The attention's view of the segments.
    pub(crate) fn segments(&self) -> crate::attention::Segments<'_> {
        crate::attention::Segments {
            offsets: &self.offsets,
            prefix: &self.prefix,
        }
    }
}

/// A layer's sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerShape {
    pub d: usize,
    pub heads: Heads,
    pub ffn: usize,
    pub bias: bool,
    pub eps: f64,
}

impl LayerShape {
    pub(crate) fn q_dim(&self) -> usize {
        self.heads.heads * self.heads.head_dim
    }
    pub(crate) fn kv_dim(&self) -> usize {
        self.heads.kv_heads * self.heads.head_dim
    }

    /// Where each parameter lies in the flat pack, in the order of
    /// [`crate::qwen2::Model::layer_params`]: q, k, v, o, gate, up, down,
    /// input norm, post-attention norm, then q, k, v biases when present.
    pub(crate) fn pack(&self) -> PackOffsets {
        let (d, q, kv, f) = (self.d, self.q_dim(), self.kv_dim(), self.ffn);
        let sizes = [
            q * d,
            kv * d,
            kv * d,
            d * q,
            f * d,
            f * d,
            d * f,
            d,
            d,
            if self.bias { q } else { 0 },
            if self.bias { kv } else { 0 },
            if self.bias { kv } else { 0 },
        ];
        let mut at = [0usize; 13];
        for (i, s) in sizes.iter().enumerate() {
            at[i + 1] = at[i] + s;
        }
        PackOffsets { at }
    }
}

/// Start offsets of the parameters in the pack (13 boundaries, 12 ranges).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PackOffsets {
    at: [usize; 13],
}

/// Indices of the parameters in [`PackOffsets`].
#[derive(Clone, Copy)]
enum P {
    Q = 0,
    // Read only through the q..=v span (its position in the pack is what counts).
    #[allow(dead_code)]
    K,
    V,
    O,
    Gate,
    Up,
    Down,
    Ln1,
    Ln2,
    QB,
    // Read only through the q..=v bias span, as K.
    #[allow(dead_code)]
    KB,
    VB,
}

impl PackOffsets {
    /// Where parameters `first..=last` lie in the pack.
    fn range(&self, first: P, last: P) -> std::ops::Range<usize> {
        self.at[first as usize]..self.at[last as usize + 1]
    }
    fn get<'a, T>(&self, pack: &'a [T], p: P) -> &'a [T] {
        &pack[self.range(p, p)]
    }
    /// Parameters `first..=last`, adjacent in the pack: q, k, v stacked are
    /// one `[q + 2·kv, d]` weight, gate and up one `[2·ffn, d]`, so each
    /// group is one GEMM instead of two or three narrow ones.
    fn span<'a, T>(&self, pack: &'a [T], first: P, last: P) -> &'a [T] {
        &pack[self.range(first, last)]
    }
    fn get_mut<'a, T>(&self, pack: &'a mut [T], p: P) -> &'a mut [T] {
        &mut pack[self.range(p, p)]
    }
    /// The pack's length.
    pub(crate) fn total(&self) -> usize {
        self.at[12]
    }
}

/// Rotary tables for positions `0..len`, `[len, head_dim / 2]` each.
#[derive(Debug)]
pub(crate) struct Rope<T> {
    pub cos: Vec<T>,
    pub sin: Vec<T>,
}

/// Activations of one forward kept for the backward.
struct Saved<T> {
    xn1: Vec<T>,
    inv1: Vec<T>,
    /// `[heads, N, hd]` rotated, scaled queries; `[kv, N, hd]` rotated keys and values.
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    lse: Vec<T>,
    /// Attention output, `[N, heads · hd]` row-major (o_proj's input).
    att: Vec<T>,
    y1: Vec<T>,
    xn2: Vec<T>,
    inv2: Vec<T>,
    /// `[N, 2·ffn]`: each row's gate projection, then its up projection.
    gate_up: Vec<T>,
}

/// The decoder-layer op for one forward pass.
pub(crate) struct DecoderLayerOp<T> {
    pub shape: LayerShape,
    pub packing: Arc<Packing>,
    pub rope: Arc<Rope<T>>,
    /// The projections' products, forward and backward (attention and the
    /// elementwise ops stay f32).
    pub precision: Precision,
    /// The layer's LoRA adapters, read from the op's third input
    /// ([`CustomOp3`]); the pack's weights are then the frozen base.
    pub lora: Option<LayerLora>,
    /// Keep nothing from the forward and run it again in the backward
    /// (gradient checkpointing): the activations of one layer are held at
    /// a time instead of every layer's.
    pub recompute: bool,
    saved: Mutex<Option<Saved<T>>>,
}

impl<T: Real> DecoderLayerOp<T> {
    pub(crate) fn new(
        shape: LayerShape,
        packing: Arc<Packing>,
        rope: Arc<Rope<T>>,
        precision: Precision,
    ) -> Self {
        Self {
            shape,
            packing,
            rope,
            precision,
            lora: None,
            recompute: false,
            saved: Mutex::new(None),
        }
    }

    /// The op that keeps no activations when `on` and recomputes them in
    /// its backward, with the same bits.
    pub(crate) fn recomputing(self, on: bool) -> Self {
        Self {
            recompute: on,
            ..self
        }
    }

    /// The op with LoRA adapters on the projections `lora` names, applied
    /// with [`Tensor::apply_op3`] (input, frozen pack, adapters' flat factors).
    pub(crate) fn with_lora(self, lora: LayerLora) -> Self {
        Self {
            lora: Some(lora),
            ..self
        }
    }
}

/// Rotate-half RoPE of one head-wide row at cos/sin `c`, `s`, scaled;
/// `adjoint` applies the transpose rotation (the forward's gradient).
#[inline]
fn rotate_row<T: Real>(
    src: &[T],
    dst: &mut [MaybeUninit<T>],
    c: &[T],
    s: &[T],
    scale: T,
    adjoint: bool,
) {
    let half = c.len();
    let (a, b) = src[..2 * half].split_at(half);
    let (d1, d2) = dst[..2 * half].split_at_mut(half);
    if adjoint {
        for i in 0..half {
            d1[i].write((a[i] * c[i] + b[i] * s[i]) * scale);
            d2[i].write((b[i] * c[i] - a[i] * s[i]) * scale);
        }
    } else {
        for i in 0..half {
            d1[i].write((a[i] * c[i] - b[i] * s[i]) * scale);
            d2[i].write((b[i] * c[i] + a[i] * s[i]) * scale);
        }
    }
}

/// Columns `off..off + heads·hd` of the row-major `[N, stride]` matrix `x`
/// moved into `[heads, N, hd]`, each head-row rotated (rotate-half RoPE at
/// its row's position) and scaled when `rope` is given, copied otherwise.
/// Reads q, k and v straight out of the fused projection's output.
fn to_heads<T: Real>(
    x: &[T],
    (stride, off): (usize, usize),
    heads: usize,
    hd: usize,
    pos: &[usize],
    rope: Option<(&Rope<T>, T)>,
) -> Vec<T> {
    let n = pos.len();
    let half = hd / 2;
    // One task per head of the head-major output.
    let fill = |h: usize, dst: &mut [MaybeUninit<T>]| {
        for r in 0..n {
            let at = r * stride + off + h * hd;
            let (src, d) = (&x[at..at + hd], &mut dst[r * hd..(r + 1) * hd]);
            match rope {
                Some((rope, scale)) => {
                    let p = pos[r];
                    let (c, s) = (
                        &rope.cos[p * half..(p + 1) * half],
                        &rope.sin[p * half..(p + 1) * half],
                    );
                    rotate_row(src, d, c, s, scale, false);
                }
                None => write_slice(d, src),
            }
        }
    };
    // SAFETY: each task writes all n rows of its head, `hd` wide (the rotation
    // writes both halves of an even `hd`).
    unsafe { par_fill(heads * n * hd, n * hd, heads * n * hd * 4, fill) }
}

/// The adjoint of [`to_heads`] for q, k and v at once: the `[N, q + 2·kv]`
/// gradient of the fused projection's output, from `dq: [heads, N, hd]`
/// and `dk`, `dv: [kv_heads, N, hd]` (q and k rotated back, q rescaled).
#[allow(clippy::too_many_arguments)]
fn qkv_from_heads<T: Real>(
    dq: &[T],
    dk: &[T],
    dv: &[T],
    (nh, nkv, hd): (usize, usize, usize),
    pos: &[usize],
    rope: &Rope<T>,
    scale: T,
) -> Vec<T> {
    let n = pos.len();
    let half = hd / 2;
    let (q_dim, kv_dim) = (nh * hd, nkv * hd);
    let width = q_dim + 2 * kv_dim;
    // One task per row of the row-major output.
    let fill = |r: usize, row: &mut [MaybeUninit<T>]| {
        let p = pos[r];
        let (c, s) = (
            &rope.cos[p * half..(p + 1) * half],
            &rope.sin[p * half..(p + 1) * half],
        );
        let (rq, rest) = row.split_at_mut(q_dim);
        let (rk, rv) = rest.split_at_mut(kv_dim);
        // Head h's row r in a head-major buffer.
        let at = |h: usize| (h * n + r) * hd..(h * n + r + 1) * hd;
        for h in 0..nh {
            rotate_row(&dq[at(h)], &mut rq[h * hd..(h + 1) * hd], c, s, scale, true);
        }
        for g in 0..nkv {
            rotate_row(
                &dk[at(g)],
                &mut rk[g * hd..(g + 1) * hd],
                c,
                s,
                T::ONE,
                true,
            );
            write_slice(&mut rv[g * hd..(g + 1) * hd], &dv[at(g)]);
        }
    };
    // SAFETY: each row's q, k and v columns (`width` in all) are written above.
    unsafe { par_fill(n * width, width, n * width * 4, fill) }
}

/// `[heads, N, hd]` → `[N, heads · hd]` (the attention output).
fn heads_to_rows<T: Real>(x: &[T], heads: usize, hd: usize, n: usize) -> Vec<T> {
    let fill = |r: usize, dst: &mut [MaybeUninit<T>]| {
        for h in 0..heads {
            let at = (h * n + r) * hd;
            write_slice(&mut dst[h * hd..(h + 1) * hd], &x[at..at + hd]);
        }
    };
    // SAFETY: each row's `heads` blocks of `hd` fill its `heads · hd` columns.
    unsafe { par_fill(x.len(), heads * hd, x.len(), fill) }
}

/// `y = x · wᵀ (+ b)` over rows; a new buffer.
fn linear<T: Real>(
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    (n_in, n_out): (usize, usize),
    precision: Precision,
) -> Vec<T> {
    let rows = x.len() / n_in;
    let mm = Mm::nt(rows, n_out, n_in).precision(precision);
    let Some(b) = b else {
        return mm.product(x, w);
    };
    let mut y = Vec::with_capacity(rows * n_out);
    for _ in 0..rows {
        y.extend_from_slice(b);
    }
    mm.add().run(&mut y, x, w);
    y
}

/// Backward of a projection `y = x·Wᵀ` (`W: [out, in]`) given `dy`:
/// [`PackGrad::linear`] writes `dW = dyᵀ·x` and puts `dy·W` into `dx`
/// (adding to it when `accumulate`, as when several projections read one `x`).
/// The layer's parameter gradient being filled, beside the pack it is for.
struct PackGrad<'a, T> {
    dp: Vec<T>,
    po: PackOffsets,
    pack: &'a [T],
    rows: usize,
    /// Whether the weights' gradients are wanted: a frozen layer's are not,
    /// and skipping them halves the projection products of its backward.
    weights: bool,
    precision: Precision,
}

impl<T: Real> PackGrad<'_, T> {
    /// Writes the gradient of parameter `p`, when the weights' are wanted.
    fn set(&mut self, p: P, values: &[T]) {
        if self.weights {
            self.po.get_mut(&mut self.dp, p).copy_from_slice(values);
        }
    }

    /// Adds the column sums of `dy` (`[rows, width]`) to the gradient of the
    /// adjacent biases `first..=last` (`width` values together), when the
    /// weights' are wanted.
    fn bias_span(&mut self, (first, last): (P, P), dy: &[T]) {
        if self.weights {
            let span = self.po.range(first, last);
            let width = span.len();
            column_sums(&mut self.dp[span], dy, width);
        }
    }

    /// Backward of the projection `y = x·Wᵀ` by parameter `p` (`x: [rows, in]`);
    /// returns `dx`.
    fn linear(&mut self, p: P, dy: &[T], x: &[T]) -> Vec<T> {
        self.linear_span((p, p), dy, x)
    }

    /// [`Self::linear`] for the stacked weight of parameters `first..=last`
    /// (see [`PackOffsets::span`]), `dy` holding their outputs side by side
    /// per row.
    fn linear_span(&mut self, (first, last): (P, P), dy: &[T], x: &[T]) -> Vec<T> {
        let rows = self.rows.max(1);
        let (n_in, n_out) = (x.len() / rows, dy.len() / rows);
        let span = self.po.range(first, last);
        if self.weights {
            Mm::tn(n_out, n_in, rows).precision(self.precision).run(
                &mut self.dp[span.clone()],
                dy,
                x,
            );
        }
        Mm::nn(rows, n_in, n_out)
            .precision(self.precision)
            .product(dy, &self.pack[span])
    }
}

/// RMSNorm over rows, returning the output and each row's 1/rms.
fn rms_norm<T: Real>(x: &[T], w: &[T], d: usize, eps: f64) -> (Vec<T>, Vec<T>) {
    let rows = x.len() / d;
    let mut y = vec![T::ZERO; x.len()];
    let mut inv = vec![T::ZERO; rows];
    let eps = T::from_f64(eps);
    par_chunks2_mut(&mut y, d * 64, &mut inv, 64, x.len() * 3, |c, yc, ic| {
        let xs = &x[c * 64 * d..c * 64 * d + yc.len()];
        rms_norm_rows(yc, xs, w, d, eps, Some(ic));
    });
    (y, inv)
}

/// Rows per task of the passes that also sum over rows (norm weight and
/// bias gradients): each task sums its rows, the partial sums are added in
/// task order, so the result does not depend on the thread count.
const SUM_ROWS: usize = 128;

/// Adds `parts` (each `n` wide) in order into `out`.
fn add_parts<T: Real>(out: &mut [T], parts: Vec<Vec<T>>) {
    out.iter_mut().for_each(|v| *v = T::ZERO);
    for p in parts {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
}

/// Backward of `y = x · r · w` (r = 1/rms per row) given `g = dL/dy`:
/// adds `dx = r·(g⊙w) − x·r³·Σ(g⊙w⊙x)/d` to `dx` and returns `dw = Σ_rows g⊙x·r`.
fn rms_norm_bwd<T: Real>(dx: &mut [T], x: &[T], inv: &[T], w: &[T], g: &[T], d: usize) -> Vec<T> {
    let dn = T::from_f64(d as f64);
    let parts = par_chunks_map(dx, d * SUM_ROWS, x.len() * 5, |blk, dxb| {
        let mut dw = vec![T::ZERO; d];
        for (i, dr) in dxb.chunks_exact_mut(d).enumerate() {
            let r = blk * SUM_ROWS + i;
            let (xr, gr, rr) = (&x[r * d..(r + 1) * d], &g[r * d..(r + 1) * d], inv[r]);
            let mut dot = T::ZERO;
            for j in 0..d {
                dot += gr[j] * w[j] * xr[j];
            }
            let c = rr * rr * rr * dot / dn;
            for j in 0..d {
                dr[j] += rr * gr[j] * w[j] - xr[j] * c;
                dw[j] += gr[j] * xr[j] * rr;
            }
        }
        dw
    });
    let mut dw = vec![T::ZERO; d];
    add_parts(&mut dw, parts);
    dw
}

/// Σ over rows of `x: [rows, n]` into `out: [n]`.
fn column_sums<T: Real>(out: &mut [T], x: &[T], n: usize) {
    let blocks = (x.len() / n.max(1)).div_ceil(SUM_ROWS);
    let parts = par_map(blocks, x.len(), |blk| {
        let mut acc = vec![T::ZERO; n];
        let rows = &x[(blk * SUM_ROWS * n).min(x.len())..((blk + 1) * SUM_ROWS * n).min(x.len())];
        for row in rows.chunks_exact(n) {
            for (o, v) in acc.iter_mut().zip(row) {
                *o += *v;
            }
        }
        acc
    });
    add_parts(out, parts);
}

/// The sizes one pass reads, unpacked once.
struct Sizes {
    d: usize,
    f: usize,
    hd: usize,
    nh: usize,
    nkv: usize,
    q_dim: usize,
    kv_dim: usize,
    n: usize,
}

impl<T: Real> DecoderLayerOp<T> {
    fn sizes(&self) -> Sizes {
        let sh = self.shape;
        Sizes {
            d: sh.d,
            f: sh.ffn,
            hd: sh.heads.head_dim,
            nh: sh.heads.heads,
            nkv: sh.heads.kv_heads,
            q_dim: sh.q_dim(),
            kv_dim: sh.kv_dim(),
            n: self.packing.rows(),
        }
    }

    fn forward(&self, x: &[T], pack: &[T], lora: Option<&[T]>) -> (Vec<T>, Saved<T>) {
        let Sizes {
            d,
            f,
            hd,
            nh,
            nkv,
            q_dim,
            kv_dim,
            n,
        } = self.sizes();
        let (sh, po, pk) = (self.shape, self.shape.pack(), &self.packing);
        // Attention block.
        let (xn1, inv1) = rms_norm(x, po.get(pack, P::Ln1), d, sh.eps);
        let qkv_bias = sh.bias.then(|| po.span(pack, P::QB, P::VB));
        let qkv_dim = q_dim + 2 * kv_dim;
        let prec = self.precision;
        let mut qkv = linear(
            &xn1,
            po.span(pack, P::Q, P::V),
            qkv_bias,
            (d, qkv_dim),
            prec,
        );
        self.lora_forward(&QKV, &mut qkv, &xn1, lora);
        let scale = T::from_f64(1.0 / (hd as f64).sqrt());
        let (rope, pos) = (&*self.rope, &pk.pos[..]);
        let q = to_heads(&qkv, (qkv_dim, 0), nh, hd, pos, Some((rope, scale)));
        let k = to_heads(&qkv, (qkv_dim, q_dim), nkv, hd, pos, Some((rope, T::ONE)));
        let v = to_heads(&qkv, (qkv_dim, q_dim + kv_dim), nkv, hd, pos, None);
        drop(qkv);
        let (out, lse) = attention::forward(&q, &k, &v, pk.segments(), sh.heads);
        let att = heads_to_rows(&out, nh, hd, n);
        let mut y1 = x.to_vec();
        Mm::nt(n, d, q_dim)
            .precision(prec)
            .add()
            .run(&mut y1, &att, po.get(pack, P::O));
        self.lora_forward(&[LoraTarget::OProj], &mut y1, &att, lora);
        // MLP block.
        let (xn2, inv2) = rms_norm(&y1, po.get(pack, P::Ln2), d, sh.eps);
        let mut gate_up = linear(&xn2, po.span(pack, P::Gate, P::Up), None, (d, 2 * f), prec);
        self.lora_forward(&GATE_UP, &mut gate_up, &xn2, lora);
        let act = swiglu(&gate_up, f);
        let mut y = y1.clone();
        Mm::nt(n, d, f)
            .precision(prec)
            .add()
            .run(&mut y, &act, po.get(pack, P::Down));
        self.lora_forward(&[LoraTarget::DownProj], &mut y, &act, lora);
        let saved = Saved {
            xn1,
            inv1,
            q,
            k,
            v,
            lse,
            att,
            y1,
            xn2,
            inv2,
            gate_up,
        };
        (y, saved)
    }

    /// The gradients of the input and of the pack, each only when `wanted`
    /// (candle asks for both, even of a frozen layer's pack or an input that
    /// no parameter precedes).
    fn backward(
        &self,
        x: &[T],
        pack: &[T],
        lora: Option<&[T]>,
        dy: &[T],
        s: &Saved<T>,
        wanted: Wanted,
    ) -> Grads<T> {
        let z = self.sizes();
        let (d, f, hd, n) = (z.d, z.f, z.hd, z.n);
        let (nh, nkv, q_dim) = (z.nh, z.nkv, z.q_dim);
        let (sh, po, pk) = (self.shape, self.shape.pack(), &self.packing);
        let mut grad = PackGrad {
            dp: if wanted.pack {
                vec![T::ZERO; po.total()]
            } else {
                Vec::new()
            },
            po,
            pack,
            rows: n,
            weights: wanted.pack,
            precision: self.precision,
        };
        let mut dlora = lora.map(|l| vec![T::ZERO; l.len()]);
        // MLP: y = y1 + act·Wdᵀ, act = silu(gate) ⊙ up.
        let act = swiglu(&s.gate_up, f);
        let mut da = grad.linear(P::Down, dy, &act);
        self.lora_backward(
            &[LoraTarget::DownProj],
            (dy, &act),
            &mut da,
            lora,
            &mut dlora,
        );
        drop(act);
        let d_gate_up = swiglu_bwd(&da, &s.gate_up, f);
        drop(da);
        let mut dxn2 = grad.linear_span((P::Gate, P::Up), &d_gate_up, &s.xn2);
        self.lora_backward(&GATE_UP, (&d_gate_up, &s.xn2), &mut dxn2, lora, &mut dlora);
        drop(d_gate_up);
        let mut dy1 = dy.to_vec();
        let dln2 = rms_norm_bwd(&mut dy1, &s.y1, &s.inv2, po.get(pack, P::Ln2), &dxn2, d);
        grad.set(P::Ln2, &dln2);
        drop(dxn2);
        // Attention: y1 = x + att·Woᵀ.
        let mut datt = grad.linear(P::O, &dy1, &s.att);
        self.lora_backward(
            &[LoraTarget::OProj],
            (&dy1, &s.att),
            &mut datt,
            lora,
            &mut dlora,
        );
        let d_out = to_heads(&datt, (q_dim, 0), nh, hd, &pk.pos, None);
        let delta = attention::delta_rows(&datt, &s.att, nh, hd);
        drop(datt);
        let (dq, dk, dv) = attention::backward(
            &s.q,
            &s.k,
            &s.v,
            &s.lse,
            &d_out,
            &delta,
            pk.segments(),
            sh.heads,
        );
        let scale = T::from_f64(1.0 / (hd as f64).sqrt());
        let d_qkv = qkv_from_heads(&dq, &dk, &dv, (nh, nkv, hd), &pk.pos, &self.rope, scale);
        drop((dq, dk, dv));
        if sh.bias {
            // The q, k and v biases are adjacent in the pack, as their columns in d_qkv.
            grad.bias_span((P::QB, P::VB), &d_qkv);
        }
        let mut dxn1 = grad.linear_span((P::Q, P::V), &d_qkv, &s.xn1);
        self.lora_backward(&QKV, (&d_qkv, &s.xn1), &mut dxn1, lora, &mut dlora);
        let mut dx = dy1;
        let dln1 = rms_norm_bwd(&mut dx, x, &s.inv1, po.get(pack, P::Ln1), &dxn1, d);
        grad.set(P::Ln1, &dln1);
        // The input norm's weight gradient needs dxn1, so a first trainable
        // layer (whose input has no gradient) computes dx anyway.
        Grads {
            input: wanted.input.then_some(dx),
            pack: wanted.pack.then_some(grad.dp),
            lora: dlora,
        }
    }

    /// Adds the LoRA terms of the projections `which`, which read `x`, to
    /// their output `y` (when the op has adapters).
    fn lora_forward(&self, which: &[LoraTarget], y: &mut [T], x: &[T], flat: Option<&[T]>) {
        if let (Some(lora), Some(flat)) = (&self.lora, flat) {
            lora.forward(&self.shape, which, y, x, flat);
        }
    }

    /// The backward of [`Self::lora_forward`] from `(dy, x)`: adds to `dx`
    /// and fills the adapters' gradient `grad`.
    fn lora_backward(
        &self,
        which: &[LoraTarget],
        (dy, x): (&[T], &[T]),
        dx: &mut [T],
        flat: Option<&[T]>,
        grad: &mut Option<Vec<T>>,
    ) {
        if let (Some(lora), Some(flat), Some(grad)) = (&self.lora, flat, grad.as_mut()) {
            lora.backward(&self.shape, which, dy, x, dx, flat, grad);
        }
    }
}

/// The gradients a layer's backward returns, each `None` when not wanted.
struct Grads<T> {
    input: Option<Vec<T>>,
    pack: Option<Vec<T>>,
    /// The adapters' flat factors' (with LoRA).
    lora: Option<Vec<T>>,
}

/// Which gradients a layer's backward computes.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    /// The layer input's (none when no parameter precedes the layer).
    input: bool,
    /// The parameter pack's (none when the layer is frozen).
    pack: bool,
}

/// `silu(gate) ⊙ up` per row of `gate_up: [N, 2f]` (gate then up), as `[N, f]`.
fn swiglu<T: Real>(gate_up: &[T], f: usize) -> Vec<T> {
    let len = gate_up.len() / 2;
    let fill = |r: usize, out: &mut [MaybeUninit<T>]| {
        let (gate, up) = gate_up[2 * f * r..2 * f * (r + 1)].split_at(f);
        swiglu_into(out, gate, up);
    };
    // SAFETY: swiglu_into writes every element of each f-wide row.
    unsafe { par_fill(len, f, len * 8, fill) }
}

/// Backward of [`swiglu`]: from `da: [N, f]`, `[N, 2f]` rows of d gate then
/// d up (see [`swiglu_bwd_into`]).
fn swiglu_bwd<T: Real>(da: &[T], gate_up: &[T], f: usize) -> Vec<T> {
    let fill = |r: usize, out: &mut [MaybeUninit<T>]| {
        let (dg, du) = out.split_at_mut(f);
        write_slice(dg, &da[f * r..f * (r + 1)]);
        // SAFETY: every element of dg was just written.
        let dg = unsafe { assume_written(dg) };
        let (gate, up) = gate_up[2 * f * r..2 * f * (r + 1)].split_at(f);
        swiglu_bwd_into(dg, du, gate, up);
    };
    // SAFETY: each row's d gate half is copied then updated, and
    // swiglu_bwd_into writes its d up half.
    unsafe { par_fill(gate_up.len(), 2 * f, gate_up.len() * 5, fill) }
}

impl<T: Real> DecoderLayerOp<T> {
    /// The op's forward over its inputs' storage (the adapters' flat
    /// factors third, with LoRA); keeps what the backward needs.
    fn run_forward(
        &self,
        (xs, xl): (&CpuStorage, &Layout),
        (ps, pl): (&CpuStorage, &Layout),
        lora: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let x = storage_slice::<T>(xs, xl, "decoder layer input")?;
        let pack = storage_slice::<T>(ps, pl, "decoder layer parameters")?;
        let n = self.packing.rows();
        if x.len() != n * self.shape.d || pack.len() != self.shape.pack().total() {
            candle_core::bail!(
                "decoder layer: x has {} values for {n} rows of {}, the pack {} for {}",
                x.len(),
                self.shape.d,
                pack.len(),
                self.shape.pack().total()
            )
        }
        let flat = match (lora, &self.lora) {
            (Some((ls, ll)), Some(layout)) => {
                let flat = storage_slice::<T>(ls, ll, "decoder layer LoRA factors")?;
                if flat.len() != layout.len(&self.shape) {
                    candle_core::bail!(
                        "decoder layer: {} LoRA values for {} adapted projections of rank {} ({} expected)",
                        flat.len(),
                        layout.targets.len(),
                        layout.rank,
                        layout.len(&self.shape)
                    )
                }
                Some(flat)
            }
            (None, None) => None,
            _ => candle_core::bail!("decoder layer: LoRA factors and their layout come together"),
        };
        let (y, saved) = self.forward(x, pack, flat);
        *self
            .saved
            .lock()
            .map_err(|_| candle_core::Error::Msg("decoder layer: lock poisoned".into()))? =
            (!self.recompute).then_some(saved);
        Ok((T::storage(y), xl.shape().clone()))
    }

    /// The op's backward: the gradients of the input, the pack and (with
    /// LoRA) the adapters' flat factors, each where candle tracks it.
    fn run_backward(
        &self,
        x: &Tensor,
        pack: &Tensor,
        lora: Option<&Tensor>,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let guard = self
            .saved
            .lock()
            .map_err(|_| candle_core::Error::Msg("decoder layer: lock poisoned".into()))?;
        if guard.is_none() && !self.recompute {
            candle_core::bail!("decoder layer: backward before forward")
        }
        let wanted = Wanted {
            input: x.track_op(),
            pack: pack.track_op(),
        };
        let mut inputs = vec![x, pack, dy];
        inputs.extend(lora);
        let grads = with_slices::<T, _>(&inputs, "decoder layer backward", |v| {
            let (x, pack, dy, lora) = (v[0], v[1], v[2], v.get(3).copied());
            match guard.as_ref() {
                Some(saved) => self.backward(x, pack, lora, dy, saved, wanted),
                // Gradient checkpointing: this layer's forward again, from
                // its input (the forward's bits: it sums in a fixed order).
                None => {
                    let (_, saved) = self.forward(x, pack, lora);
                    self.backward(x, pack, lora, dy, &saved, wanted)
                }
            }
        })?;
        Ok((
            grads.input.map(|g| tensor_from(g, x.shape().clone())),
            grads.pack.map(|g| tensor_from(g, pack.shape().clone())),
            lora.zip(grads.lora)
                .map(|(l, g)| tensor_from(g, l.shape().clone())),
        ))
    }
}

impl<T: Real> CustomOp2 for DecoderLayerOp<T> {
    fn name(&self) -> &'static str {
        "agentrl-decoder-layer"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ps: &CpuStorage,
        pl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.run_forward((xs, xl), (ps, pl), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        pack: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dp, _) = self.run_backward(x, pack, None, dy)?;
        Ok((dx, dp))
    }
}

/// The layer with LoRA adapters: input, frozen pack, adapters' flat factors.
impl<T: Real> CustomOp3 for DecoderLayerOp<T> {
    fn name(&self) -> &'static str {
        "agentrl-decoder-layer-lora"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ps: &CpuStorage,
        pl: &Layout,
        ls: &CpuStorage,
        ll: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.run_forward((xs, xl), (ps, pl), Some((ls, ll)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        pack: &Tensor,
        lora: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.run_backward(x, pack, Some(lora), dy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, s: f64) -> Vec<f64> {
        (0..n).map(|i| (i as f64 * s).sin()).collect()
    }

    /// Sequences with the same prompt (a group's task) form a group that
    /// shares it up to their first scored position; the system prompt that
    /// every task starts with does not merge the groups, and a sequence
    /// scored too early, or sharing only that, stays alone.
    #[test]
    fn sequences_sharing_a_prompt_pack_it_once() {
        let system: Vec<u32> = (0..20).collect();
        let a = [&system[..], &(100..130).collect::<Vec<u32>>()].concat();
        let b = [&system[..], &(200..230).collect::<Vec<u32>>()].concat();
        let seqs = vec![
            [&a[..], &[1, 2]].concat(),
            [&b[..], &[3]].concat(),
            [&a[..], &[4]].concat(),
            [&b[..], &[5, 6]].concat(),
            [&a[..], &[7]].concat(),
            [&system[..], &(300..310).collect::<Vec<u32>>(), &[8]].concat(),
            [&a[..], &[9]].concat(),
        ];
        // Replies are scored from position 49 (predicting token 50); the
        // last sequence from position 10.
        let (p, ids) = Packing::sharing_prefixes(&seqs, &[49, 49, 49, 49, 49, 30, 10]);
        // Segments in order of first appearance: task a's 49 shared tokens
        // and the rest of sequences 0, 2, 4; task b's and 1, 3; then 5 and 6 whole.
        assert_eq!(p.offsets, vec![0, 49, 52, 54, 56, 105, 107, 110, 141, 192]);
        assert_eq!(
            p.prefix,
            vec![
                None,
                Some(0),
                Some(0),
                Some(0),
                None,
                Some(4),
                Some(4),
                None,
                None
            ]
        );
        assert_eq!(ids.len(), 192);
        assert_eq!(&ids[..49], &a[..49]);
        assert_eq!(&ids[49..52], &seqs[0][49..]);
        assert_eq!(p.pos[49], 49);
        // Every position of every sequence maps to a row holding its token.
        for (i, s) in seqs.iter().enumerate() {
            for (t, &tok) in s.iter().enumerate() {
                let r = p.row_of(i, t);
                assert_eq!((ids[r], p.pos[r]), (tok, t), "sequence {i} position {t}");
            }
        }
        // Nothing to share: one segment each, in order.
        let (p, ids) = Packing::sharing_prefixes(&seqs, &[0; 7]);
        assert_eq!(p.offsets, vec![0, 52, 103, 154, 206, 257, 288, 339]);
        assert!(p.prefix.iter().all(Option::is_none));
        assert_eq!(ids, seqs.concat());
    }

    /// A backward asked for only one of its gradients gives exactly that
    /// gradient of the full backward.
    #[test]
    fn a_backward_computes_only_the_wanted_gradients_and_those_exactly() {
        let shape = LayerShape {
            d: 8,
            heads: Heads {
                heads: 2,
                kv_heads: 1,
                head_dim: 4,
            },
            ffn: 12,
            bias: true,
            eps: 1e-6,
        };
        let packing = Arc::new(Packing::of_lengths([5, 3]));
        let len = 5;
        let rope = Arc::new(Rope {
            cos: seq(len * 2, 0.7).iter().map(|v| v.cos()).collect(),
            sin: seq(len * 2, 0.7).iter().map(|v| v.sin()).collect(),
        });
        let op = DecoderLayerOp::<f64>::new(shape, packing, rope, Precision::F32);
        let (x, pack) = (seq(8 * 8, 0.31), seq(shape.pack().total(), 0.53));
        let dy = seq(8 * 8, 0.17);
        let (_, saved) = op.forward(&x, &pack, None);
        let run = |input, pack_too| {
            let wanted = Wanted {
                input,
                pack: pack_too,
            };
            let g = op.backward(&x, &pack, None, &dy, &saved, wanted);
            assert!(g.lora.is_none());
            (g.input, g.pack)
        };
        let (dx, dp) = run(true, true);
        let (dx, dp) = (dx.unwrap(), dp.unwrap());
        assert!(dp.iter().all(|v| v.is_finite()) && dp.iter().any(|&v| v != 0.0));
        assert_eq!(run(true, false), (Some(dx.clone()), None));
        assert_eq!(run(false, true), (None, Some(dp)));
    }

    #[test]
    fn row_summing_passes_over_several_tasks_match_plain_sums() {
        // 300 rows: three tasks of SUM_ROWS, the last one partial.
        let (rows, d) = (300, 5);
        let (x, g, w) = (seq(rows * d, 0.37), seq(rows * d, 0.91), seq(d, 1.3));
        let inv = seq(rows, 0.23).iter().map(|v| 1.5 + v).collect::<Vec<_>>();
        let mut dx = seq(rows * d, 0.11);
        let dx0 = dx.clone();
        let dw = rms_norm_bwd(&mut dx, &x, &inv, &w, &g, d);
        for j in 0..d {
            let want: f64 = (0..rows)
                .map(|r| g[r * d + j] * x[r * d + j] * inv[r])
                .sum();
            assert!((dw[j] - want).abs() < 1e-12, "dw[{j}]");
        }
        for r in 0..rows {
            let dot: f64 = (0..d).map(|j| g[r * d + j] * w[j] * x[r * d + j]).sum();
            let c = inv[r].powi(3) * dot / d as f64;
            for j in 0..d {
                let want = dx0[r * d + j] + inv[r] * g[r * d + j] * w[j] - x[r * d + j] * c;
                assert!((dx[r * d + j] - want).abs() < 1e-12, "dx[{r}, {j}]");
            }
        }
        let mut sums = vec![7.0; d];
        column_sums(&mut sums, &x, d);
        for j in 0..d {
            let want: f64 = (0..rows).map(|r| x[r * d + j]).sum();
            assert!((sums[j] - want).abs() < 1e-12, "column {j}");
        }
    }
}
