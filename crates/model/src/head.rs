//! The LM head fused with log-softmax, the target gather and the entropy:
//! one op from the final hidden states of the packed tokens to each
//! position's `log p(next token)` and `H(p)`, laid out padded per sequence,
//! with its own backward. The `[M, V]` logits of the M scored rows are the
//! only vocabulary-wide buffer, made once and read once more by the backward.
//!
//! Only the rows whose outputs are asked for go through the head: a row with
//! no next token (the last of its sequence) or one the caller does not score
//! (a prompt token, which no loss reads) costs nothing there. Prompts are
//! most of the tokens of a warm-start or RL batch (85% of a perception
//! batch in the default run), so the logits' and the input gradient's
//! products, the weight's gradient and the passes over the vocabulary
//! shrink by that much.

use std::mem::MaybeUninit;
use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::block::Packing;
use crate::host::{storage_slice, tensor_from, with_slices};
use crate::kernels::{
    assume_written, dot, exp_shifted_sum, par_chunks_mut, par_fill, write_slice, Mm, Real,
};
use crate::precision::Precision;

/// What the backward reads.
struct Saved<T> {
    /// Empty when the op recomputes them in its backward.
    logits: Vec<T>,
    lse: Vec<T>,
    entropy: Vec<T>,
}

/// `(h: [N, d], w: [V, d])` → `[2, B, W]`: plane 0 the log-prob of each
/// scored row's next token, plane 1 the entropy of its next-token
/// distribution; row `t` of sequence `b` lands at `[·, b, t]`, zeros at
/// every position that is not scored.
pub(crate) struct LmHeadOp<T> {
    /// The packed rows that go through the head, in order.
    rows: Vec<usize>,
    /// Per scored row, its next token.
    targets: Vec<u32>,
    /// Per scored row, its index into one plane of the padded output.
    slots: Vec<usize>,
    /// The number of sequences B.
    batch: usize,
    /// Padded width W (longest sequence − 1).
    width: usize,
    /// The logits' product and its two backward products.
    precision: Precision,
    /// Keep no logits between the forward and the backward, which
    /// computes them again (gradient checkpointing): `[M, V]` floats, as
    /// large as the activations of several decoder layers.
    recompute: bool,
    saved: Mutex<Option<Saved<T>>>,
}

impl<T: Real> LmHeadOp<T> {
    /// The op for sequences `seqs` packed as `packing`. With `scored`, only
    /// position `t` of sequence `i` with `scored[i][t] != 0` is computed
    /// (entries past a row's end count as 0); without it, every position
    /// that has a next token.
    pub(crate) fn new(
        packing: &Packing,
        seqs: &[Vec<u32>],
        scored: Option<&[Vec<f32>]>,
        precision: Precision,
    ) -> Self {
        let width = seqs
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        let (mut rows, mut targets, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for (i, s) in seqs.iter().enumerate() {
            let wanted = scored.map(|m| m.get(i).map_or(&[][..], Vec::as_slice));
            for (t, &next) in s.iter().skip(1).enumerate() {
                if wanted.is_some_and(|m| !is_scored(m, t)) {
                    continue;
                }
                rows.push(packing.row_of(i, t));
                targets.push(next);
                slots.push(i * width + t);
            }
        }
        Self {
            rows,
            targets,
            slots,
            batch: seqs.len(),
            width,
            precision,
            recompute: false,
            saved: Mutex::new(None),
        }
    }

    /// The op that keeps no logits when `on` and recomputes them in its
    /// backward, with the same bits.
    pub(crate) fn recomputing(self, on: bool) -> Self {
        Self {
            recompute: on,
            ..self
        }
    }

    /// Each scored row's logits, `[M, V]`, with the bits a pass over all
    /// N rows gives it.
    fn logits(&self, h: &[T], w: &[T], (n, d, vocab): (usize, usize, usize)) -> Vec<T> {
        Mm::nt(self.rows.len(), vocab, d)
            .routed_as(n)
            .precision(self.precision)
            .product(&self.gather(h, d), w)
    }

    /// The scored rows of `h` (`[N, d]`), gathered into `[M, d]`.
    fn gather(&self, h: &[T], d: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(self.rows.len() * d);
        for &r in &self.rows {
            out.extend_from_slice(&h[r * d..(r + 1) * d]);
        }
        out
    }

    /// `[M, width]` rows of the scored rows put back in place: `[n, width]`,
    /// zeros in every row that is not scored.
    fn scatter(&self, part: &[T], width: usize, n: usize) -> Vec<T> {
        let mut out = vec![T::ZERO; n * width];
        for (row, &r) in part.chunks_exact(width).zip(&self.rows) {
            out[r * width..(r + 1) * width].copy_from_slice(row);
        }
        out
    }
}

/// Whether entry `t` of a row of scored positions is scored: a nonzero
/// entry; entries past the row's end are not.
pub(crate) fn is_scored(row: &[f32], t: usize) -> bool {
    row.get(t).is_some_and(|&x| x != 0.0)
}

fn poisoned() -> candle_core::Error {
    candle_core::Error::Msg("lm head: lock poisoned".into())
}

impl<T: Real> CustomOp2 for LmHeadOp<T> {
    fn name(&self) -> &'static str {
        "agentrl-lm-head-logprob-entropy"
    }

    fn cpu_fwd(
        &self,
        hs: &CpuStorage,
        hl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let h = storage_slice::<T>(hs, hl, "lm head input")?;
        let w = storage_slice::<T>(ws, wl, "lm head weight")?;
        let (n, d) = hl.shape().dims2()?;
        let vocab = wl.shape().dims2()?.0;
        if let Some(&r) = self.rows.last().filter(|&&r| r >= n) {
            candle_core::bail!("lm head: scored row {r} of an input of {n} rows")
        }
        let m = self.rows.len();
        let logits = self.logits(h, w, (n, d, vocab));
        // Per row: log-sum-exp and entropy H = lse − Σ p z.
        let mut stats = vec![T::ZERO; m * 2];
        // Rows per task, so that each task reuses one scratch row.
        const ROWS: usize = 64;
        par_chunks_mut(&mut stats, 2 * ROWS, m * vocab * 4, |blk, sts| {
            let mut e = vec![T::ZERO; vocab];
            for (i, st) in sts.chunks_exact_mut(2).enumerate() {
                let r = blk * ROWS + i;
                let z = &logits[r * vocab..(r + 1) * vocab];
                let m = z.iter().fold(T::NEG_INFINITY, |a, &b| a.max(b));
                e.copy_from_slice(z);
                // e ← exp(z − m) (the vector exp for f32), Σ e, Σ e·z.
                let sum = exp_shifted_sum(&mut e, m);
                let pz = dot(&e, z);
                let lse = m + sum.ln();
                st[0] = lse;
                st[1] = lse - pz / sum;
            }
        });
        let (b, width) = (self.batch, self.width);
        let mut out = vec![T::ZERO; 2 * b * width];
        let (lse, entropy): (Vec<T>, Vec<T>) = stats.chunks_exact(2).map(|s| (s[0], s[1])).unzip();
        for (i, (&at, &t)) in self.slots.iter().zip(&self.targets).enumerate() {
            out[at] = logits[i * vocab + t as usize] - lse[i];
            out[b * width + at] = entropy[i];
        }
        *self.saved.lock().map_err(|_| poisoned())? = Some(Saved {
            logits: if self.recompute { Vec::new() } else { logits },
            lse,
            entropy,
        });
        Ok((T::storage(out), Shape::from((2, b, width))))
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let guard = self.saved.lock().map_err(|_| poisoned())?;
        let Some(s) = guard.as_ref() else {
            candle_core::bail!("lm head: backward before forward")
        };
        let (n, d) = h.dims2()?;
        let vocab = w.dims2()?.0;
        let (b, width, m) = (self.batch, self.width, self.rows.len());
        let (dh, dw) = with_slices::<T, _>(&[h, w, grad], "lm head backward", |v| {
            let (hv, wv, g) = (v[0], v[1], v[2]);
            // dz_j = −p_j (g_lp + g_H (z_j − lse + H)) + g_lp [j = target],
            // into `dr` (holding z on entry) from row i's logits `z`.
            let grad_row = |i: usize, dr: &mut [T], z: &[T]| {
                let at = self.slots[i];
                let (glp, gh) = (g[at], g[b * width + at]);
                let (lse, ent) = (s.lse[i], s.entropy[i]);
                // dr ← p = exp(z − lse) (the vector exp for f32), then the gradient.
                exp_shifted_sum(dr, lse);
                for (o, &x) in dr.iter_mut().zip(z) {
                    *o = -*o * (glp + gh * (x - lse + ent));
                }
                dr[self.targets[i] as usize] += glp;
            };
            let dz = if self.recompute {
                // The logits again, turned into dz in place: one [M, V]
                // buffer where keeping them needed two.
                let mut dz = self.logits(hv, wv, (n, d, vocab));
                const ROWS: usize = 64;
                par_chunks_mut(&mut dz, ROWS * vocab, m * vocab * 4, |blk, rows| {
                    let mut z = vec![T::ZERO; vocab];
                    for (i, dr) in rows.chunks_exact_mut(vocab).enumerate() {
                        z.copy_from_slice(dr);
                        grad_row(blk * ROWS + i, dr, &z);
                    }
                });
                dz
            } else {
                let fill = |i: usize, dr: &mut [MaybeUninit<T>]| {
                    let z = &s.logits[i * vocab..(i + 1) * vocab];
                    write_slice(dr, z);
                    // SAFETY: every element of dr was just written.
                    grad_row(i, unsafe { assume_written(dr) }, z);
                };
                // SAFETY: each row is written whole.
                unsafe { par_fill(m * vocab, vocab, m * vocab * 4, fill) }
            };
            // Rows that are not scored get no gradient from the head.
            let dh = Mm::nn(m, d, vocab)
                .precision(self.precision)
                .product(&dz, wv);
            let dh = self.scatter(&dh, d, n);
            // The weight's gradient sums over the scored rows alone: rows
            // no loss reads add nothing to it, and in an RL batch they are
            // most rows (a [V, d] × [d, N] product over them would cost more
            // than the rest of the head).
            // A frozen head (a tied embedding left out of training) wants none.
            let dw = w.track_op().then(|| {
                Mm::tn(vocab, d, m)
                    .precision(self.precision)
                    .product(&dz, &self.gather(hv, d))
            });
            (dh, dw)
        })?;
        Ok((
            Some(tensor_from(dh, h.shape().clone())),
            dw.map(|dw| tensor_from(dw, w.shape().clone())),
        ))
    }
}
