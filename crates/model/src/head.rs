//! The LM head fused with log-softmax, the target gather and the entropy:
//! one op from the final hidden states of the packed tokens to each
//! position's `log p(next token)` and `H(p)`, laid out padded per sequence,
//! with its own backward. The `[N, V]` logits are the only vocabulary-wide
//! buffer, made once and read once more by the backward.

use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::block::Packing;
use crate::host::{storage_slice, tensor_from, with_slices};
use crate::kernels::{
    assume_written, dot, exp_shifted_sum, par_chunks_mut, par_fill, write_slice, Mm, Real,
};

/// Marks a row with no next token (the last of its sequence).
const NO_TARGET: u32 = u32::MAX;

/// What the backward reads.
struct Saved<T> {
    logits: Vec<T>,
    lse: Vec<T>,
    entropy: Vec<T>,
}

/// `(h: [N, d], w: [V, d])` → `[2, B, W]`: plane 0 the log-prob of each
/// row's next token, plane 1 the entropy of its next-token distribution;
/// row `t` of sequence `b` lands at `[·, b, t]` for `t < len_b − 1`, zeros elsewhere.
pub(crate) struct LmHeadOp<T> {
    packing: Arc<Packing>,
    /// Per packed row, the next token or [`NO_TARGET`].
    targets: Vec<u32>,
    /// Padded width W (longest sequence − 1).
    width: usize,
    saved: Mutex<Option<Saved<T>>>,
}

impl<T: Real> LmHeadOp<T> {
    /// The op for sequences `seqs` packed as `packing`.
    pub(crate) fn new(packing: Arc<Packing>, seqs: &[Vec<u32>]) -> Self {
        let mut targets = Vec::with_capacity(packing.rows());
        for s in seqs {
            targets.extend(s.iter().skip(1).copied());
            targets.push(NO_TARGET);
        }
        let width = seqs
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        Self {
            packing,
            targets,
            width,
            saved: Mutex::new(None),
        }
    }

    fn batch(&self) -> usize {
        self.packing.offsets.len() - 1
    }

    /// Index into one plane of the padded output of packed row `r`, if it has a target.
    fn slot(&self, r: usize, seq: usize) -> Option<usize> {
        (self.targets[r] != NO_TARGET).then(|| seq * self.width + self.packing.pos[r])
    }

    /// The sequence of each packed row.
    fn row_seq(&self) -> Vec<usize> {
        let o = &self.packing.offsets;
        (0..o.len() - 1)
            .flat_map(|s| std::iter::repeat_n(s, o[s + 1] - o[s]))
            .collect()
    }
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
        let n = self.packing.rows();
        let (vocab, d) = wl.shape().dims2()?;
        if h.len() != n * d {
            candle_core::bail!("lm head: input has {} values for {n} rows of {d}", h.len())
        }
        let logits = Mm::nt(n, vocab, d).product(h, w);
        // Per row: log-sum-exp and entropy H = lse − Σ p z.
        let mut stats = vec![T::ZERO; n * 2];
        // Rows per task, so that each task reuses one scratch row.
        const ROWS: usize = 64;
        par_chunks_mut(&mut stats, 2 * ROWS, n * vocab * 4, |blk, sts| {
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
        let (b, width) = (self.batch(), self.width);
        let mut out = vec![T::ZERO; 2 * b * width];
        let (lse, entropy): (Vec<T>, Vec<T>) = stats.chunks_exact(2).map(|s| (s[0], s[1])).unzip();
        for (r, seq) in self.row_seq().into_iter().enumerate() {
            if let Some(at) = self.slot(r, seq) {
                let t = self.targets[r] as usize;
                out[at] = logits[r * vocab + t] - lse[r];
                out[b * width + at] = entropy[r];
            }
        }
        *self.saved.lock().map_err(|_| poisoned())? = Some(Saved {
            logits,
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
        let n = self.packing.rows();
        let (vocab, d) = w.dims2()?;
        let (b, width) = (self.batch(), self.width);
        let row_seq = self.row_seq();
        let (dh, dw) = with_slices::<T, _>(&[h, w, grad], "lm head backward", |v| {
            let (hv, wv, g) = (v[0], v[1], v[2]);
            // dz_j = −p_j (g_lp + g_H (z_j − lse + H)) + g_lp [j = target].
            let fill = |r: usize, dr: &mut [MaybeUninit<T>]| {
                let Some(at) = self.slot(r, row_seq[r]) else {
                    // A row no output reads: no gradient.
                    dr.iter_mut().for_each(|x| {
                        x.write(T::ZERO);
                    });
                    return;
                };
                let (glp, gh) = (g[at], g[b * width + at]);
                let (lse, ent) = (s.lse[r], s.entropy[r]);
                let z = &s.logits[r * vocab..(r + 1) * vocab];
                // dr ← p = exp(z − lse) (the vector exp for f32), then the gradient.
                write_slice(dr, z);
                // SAFETY: every element of dr was just written.
                let dr = unsafe { assume_written(dr) };
                exp_shifted_sum(dr, lse);
                for (o, &x) in dr.iter_mut().zip(z) {
                    *o = -*o * (glp + gh * (x - lse + ent));
                }
                dr[self.targets[r] as usize] += glp;
            };
            // SAFETY: each row is written whole, zeros or the gradient.
            let dz = unsafe { par_fill(n * vocab, vocab, n * vocab * 4, fill) };
            let dh = Mm::nn(n, d, vocab).product(&dz, wv);
            let dw = Mm::tn(vocab, d, n).product(&dz, hv);
            (dh, dw)
        })?;
        Ok((
            Some(tensor_from(dh, h.shape().clone())),
            Some(tensor_from(dw, w.shape().clone())),
        ))
    }
}
