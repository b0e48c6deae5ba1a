//! Causal grouped-query attention over packed sequences, forward and
//! backward, for the fused training layer ([`crate::block`]).
//!
//! Flash-style: each (sequence, head) is processed in blocks of query rows;
//! a block's scores against the keys it may see live in a scratch of
//! `block × keys`, and the backward recomputes them from the saved
//! log-sum-exp instead of keeping any `T × T` matrix per head.
//!
//! Layouts (head-major over the packed rows, `N` rows in all):
//! `q: [heads, N, hd]` (already rotated and scaled by 1/√hd),
//! `k, v: [kv_heads, N, hd]`, `out: [heads, N, hd]`, `lse: [heads, N]`.
//! Sequence `s` owns rows `offsets[s]..offsets[s + 1]`; its row `i` attends
//! to its rows `0..=i` only (no padding exists).

use crate::kernels::{
    dot, exp_shifted_sum, par_chunks_mut, par_fill, par_map, write_slice, Mm, Real,
};

/// Query rows per block.
const BLOCK: usize = 64;

/// Head counts and width.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    fn rep(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// The rows `base..base + len` of head `h` in a `[heads, N, hd]` buffer.
fn rows<T>(buf: &[T], h: usize, n: usize, hd: usize, base: usize, len: usize) -> &[T] {
    let start = (h * n + base) * hd;
    &buf[start..start + len * hd]
}

/// Rows, sequences and a rough operation count (`per_score` operations per
/// query-key pair and head-width element) of one pass over `offsets`.
fn extent(offsets: &[usize], shape: Heads, per_score: usize) -> (usize, usize, usize) {
    let seqs = offsets.len().saturating_sub(1);
    let work = (0..seqs)
        .map(|s| (offsets[s + 1] - offsets[s]).pow(2))
        .sum::<usize>()
        * shape.head_dim
        * shape.heads
        * per_score;
    (*offsets.last().unwrap_or(&0), seqs, work)
}

/// Causal softmax of the block's scores in place: row `r` (query `i0 + r`)
/// keeps keys `0..=i0 + r`, the rest become 0. Returns nothing; writes each
/// row's log-sum-exp into `lse` when given, else uses it to form `p`.
fn block_softmax<T: Real>(s: &mut [T], keys: usize, i0: usize, lse: &mut [T], have_lse: bool) {
    for (r, (row, l)) in s.chunks_exact_mut(keys).zip(lse.iter_mut()).enumerate() {
        let valid = i0 + r + 1;
        let (seen, hidden) = row.split_at_mut(valid);
        if have_lse {
            exp_shifted_sum(seen, *l);
        } else {
            let m = seen.iter().fold(T::NEG_INFINITY, |a, &b| a.max(b));
            let sum = exp_shifted_sum(seen, m);
            let inv = T::ONE / sum;
            for x in seen.iter_mut() {
                *x *= inv;
            }
            *l = m + sum.ln();
        }
        hidden.iter_mut().for_each(|x| *x = T::ZERO);
    }
}

/// Forward: `out` and `lse` of every head of every sequence.
pub(crate) fn forward<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    offsets: &[usize],
    shape: Heads,
) -> (Vec<T>, Vec<T>) {
    let (n, seqs, work) = extent(offsets, shape, 2);
    let (hd, heads) = (shape.head_dim, shape.heads);
    // One task per (sequence, head); each returns its rows of out and lse.
    let parts = par_map(seqs * heads, work, |task| {
        let (s, h) = (task / heads, task % heads);
        let (base, len) = (offsets[s], offsets[s + 1] - offsets[s]);
        let g = h / shape.rep();
        let (qs, ks, vs) = (
            rows(q, h, n, hd, base, len),
            rows(k, g, n, hd, base, len),
            rows(v, g, n, hd, base, len),
        );
        let mut out = vec![T::ZERO; len * hd];
        let mut lse = vec![T::ZERO; len];
        let mut scores = vec![T::ZERO; BLOCK.min(len) * len];
        for i0 in (0..len).step_by(BLOCK) {
            let i1 = (i0 + BLOCK).min(len);
            let (r, keys) = (i1 - i0, i1);
            let sc = &mut scores[..r * keys];
            Mm::nt(r, keys, hd)
                .single()
                .run(sc, &qs[i0 * hd..i1 * hd], ks);
            block_softmax(sc, keys, i0, &mut lse[i0..i1], false);
            Mm::nn(r, hd, keys)
                .single()
                .run(&mut out[i0 * hd..i1 * hd], sc, vs);
        }
        (out, lse)
    });
    let part = |s: usize, h: usize| &parts[s * heads + h];
    let out = gather_heads(heads, n, hd, offsets, |s, h| &part(s, h).0[..]);
    let lse = gather_heads(heads, n, 1, offsets, |s, h| &part(s, h).1[..]);
    (out, lse)
}

/// Gradients of [`forward`]: `(dq, dk, dv)` in the layouts of `q, k, v`,
/// given `d_out` (same layout as `out`) and `delta[h, i] = d_out · out` per row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    lse: &[T],
    d_out: &[T],
    delta: &[T],
    offsets: &[usize],
    shape: Heads,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (n, seqs, work) = extent(offsets, shape, 5);
    let (hd, kvh, rep) = (shape.head_dim, shape.kv_heads, shape.rep());
    // One task per (sequence, kv head): it owns dk and dv of those rows, and
    // the dq of the query heads sharing that kv head.
    let parts = par_map(seqs * kvh, work, |task| {
        let (s, g) = (task / kvh, task % kvh);
        let (base, len) = (offsets[s], offsets[s + 1] - offsets[s]);
        let (ks, vs) = (rows(k, g, n, hd, base, len), rows(v, g, n, hd, base, len));
        let mut dq = vec![T::ZERO; rep * len * hd];
        let mut dk = vec![T::ZERO; len * hd];
        let mut dv = vec![T::ZERO; len * hd];
        let cap = BLOCK.min(len) * len;
        let (mut p, mut ds) = (vec![T::ZERO; cap], vec![T::ZERO; cap]);
        for (hr, dqh) in dq.chunks_exact_mut(len * hd).enumerate() {
            let h = g * rep + hr;
            let qs = rows(q, h, n, hd, base, len);
            let dos = rows(d_out, h, n, hd, base, len);
            let mut l = lse[h * n + base..h * n + base + len].to_vec();
            let dl = &delta[h * n + base..h * n + base + len];
            for i0 in (0..len).step_by(BLOCK) {
                let i1 = (i0 + BLOCK).min(len);
                let (r, keys) = (i1 - i0, i1);
                let (pb, dsb) = (&mut p[..r * keys], &mut ds[..r * keys]);
                let (qb, dob) = (&qs[i0 * hd..i1 * hd], &dos[i0 * hd..i1 * hd]);
                // P from the saved log-sum-exp.
                Mm::nt(r, keys, hd).single().run(pb, qb, ks);
                block_softmax(pb, keys, i0, &mut l[i0..i1], true);
                // dV += Pᵀ dO;  dP = dO Vᵀ;  dS = P ⊙ (dP − δ).
                Mm::tn(keys, hd, r)
                    .add()
                    .single()
                    .run(&mut dv[..keys * hd], pb, dob);
                Mm::nt(r, keys, hd).single().run(dsb, dob, vs);
                for (row, (pr, dr)) in pb
                    .chunks_exact(keys)
                    .zip(dsb.chunks_exact_mut(keys))
                    .enumerate()
                {
                    let d = dl[i0 + row];
                    for (x, &pv) in dr.iter_mut().zip(pr) {
                        *x = pv * (*x - d);
                    }
                }
                // dQ = dS K;  dK += dSᵀ Q.
                Mm::nn(r, hd, keys)
                    .single()
                    .run(&mut dqh[i0 * hd..i1 * hd], dsb, ks);
                Mm::tn(keys, hd, r)
                    .add()
                    .single()
                    .run(&mut dk[..keys * hd], dsb, qb);
            }
        }
        (dq, dk, dv)
    });
    let part = |s: usize, g: usize| &parts[s * kvh + g];
    let dq = gather_heads(shape.heads, n, hd, offsets, |s, h| {
        let (len, hr) = (offsets[s + 1] - offsets[s], h % rep);
        &part(s, h / rep).0[hr * len * hd..(hr + 1) * len * hd]
    });
    let dk = gather_heads(kvh, n, hd, offsets, |s, g| &part(s, g).1[..]);
    let dv = gather_heads(kvh, n, hd, offsets, |s, g| &part(s, g).2[..]);
    (dq, dk, dv)
}

/// A head-major `[heads, N, width]` buffer gathered from per-task parts:
/// `part(s, h)` is head `h`'s `width`-wide rows of sequence `s`, in order.
fn gather_heads<'a, T: Real>(
    heads: usize,
    n: usize,
    width: usize,
    offsets: &[usize],
    part: impl Fn(usize, usize) -> &'a [T] + Sync + Send,
) -> Vec<T> {
    assert_eq!(offsets.first(), Some(&0), "packed rows start at 0");
    assert_eq!(offsets.last(), Some(&n), "packed rows end at N");
    let fill = |h: usize, dst: &mut [std::mem::MaybeUninit<T>]| {
        for s in 0..offsets.len() - 1 {
            let rows = offsets[s] * width..offsets[s + 1] * width;
            // Panics unless the part is exactly its sequence's rows.
            write_slice(&mut dst[rows], part(s, h));
        }
    };
    // SAFETY: the offsets run from 0 to n in order (asserted above, and
    // ascending by construction), so the sequences' row ranges tile each
    // head's n rows, and write_slice fills each range whole or panics.
    unsafe { par_fill(heads * n * width, n * width, heads * n * width, fill) }
}

/// `delta[h, i] = d_out[h, i] · out[h, i]` (the softmax backward's row term).
#[cfg(test)]
pub(crate) fn delta<T: Real>(d_out: &[T], out: &[T], hd: usize) -> Vec<T> {
    d_out
        .chunks_exact(hd)
        .zip(out.chunks_exact(hd))
        .map(|(a, b)| dot(a, b))
        .collect()
}

/// `delta` from the row-major `[N, heads · hd]` forms of `d_out` and
/// `out` (o_proj's input and its gradient), laid out `[heads, N]`.
pub(crate) fn delta_rows<T: Real>(d_out: &[T], out: &[T], heads: usize, hd: usize) -> Vec<T> {
    let n = d_out.len() / (heads * hd).max(1);
    let mut delta = vec![T::ZERO; heads * n];
    par_chunks_mut(&mut delta, n, d_out.len() * 2, |h, dh| {
        for (r, v) in dh.iter_mut().enumerate() {
            let at = r * heads * hd + h * hd;
            *v = dot(&d_out[at..at + hd], &out[at..at + hd]);
        }
    });
    delta
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// Naive attention: explicit scores, causal mask, softmax, weighted sum.
    fn naive(q: &[f64], k: &[f64], v: &[f64], offsets: &[usize], sh: Heads) -> Vec<f64> {
        let n = *offsets.last().unwrap();
        let hd = sh.head_dim;
        let mut out = vec![0.0; sh.heads * n * hd];
        for s in 0..offsets.len() - 1 {
            for h in 0..sh.heads {
                let g = h / sh.rep();
                for i in offsets[s]..offsets[s + 1] {
                    let qi = &q[(h * n + i) * hd..(h * n + i + 1) * hd];
                    let sc: Vec<f64> = (offsets[s]..=i)
                        .map(|j| dot(qi, &k[(g * n + j) * hd..(g * n + j + 1) * hd]))
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                    for (jj, j) in (offsets[s]..=i).enumerate() {
                        let p = (sc[jj] - m).exp() / z;
                        for c in 0..hd {
                            out[(h * n + i) * hd + c] += p * v[(g * n + j) * hd + c];
                        }
                    }
                }
            }
        }
        out
    }

    const SHAPE: Heads = Heads {
        heads: 4,
        kv_heads: 2,
        head_dim: 6,
    };

    /// Sequences of 1, 70 (two query blocks) and 5 rows.
    const OFFSETS: [usize; 4] = [0, 1, 71, 76];

    fn inputs() -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let n = OFFSETS[3];
        let hd = SHAPE.head_dim;
        (
            rand(SHAPE.heads * n * hd, 1),
            rand(SHAPE.kv_heads * n * hd, 2),
            rand(SHAPE.kv_heads * n * hd, 3),
        )
    }

    #[test]
    fn forward_matches_naive_attention_over_ragged_sequences() {
        let (q, k, v) = inputs();
        let (out, _) = forward(&q, &k, &v, &OFFSETS, SHAPE);
        let want = naive(&q, &k, &v, &OFFSETS, SHAPE);
        let err = out
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(err < 1e-12, "{err}");
    }

    #[test]
    fn backward_matches_finite_differences() {
        let (q, k, v) = inputs();
        let n = OFFSETS[3];
        let w = rand(SHAPE.heads * n * SHAPE.head_dim, 4);
        // L = Σ w ⊙ out.
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let (o, _) = forward(q, k, v, &OFFSETS, SHAPE);
            o.iter().zip(&w).map(|(a, b)| a * b).sum()
        };
        let (out, lse) = forward(&q, &k, &v, &OFFSETS, SHAPE);
        let dl = delta(&w, &out, SHAPE.head_dim);
        // The row-major form the layer uses gives the same numbers.
        let hd = SHAPE.head_dim;
        let to_rows = |x: &[f64]| -> Vec<f64> {
            let mut r = vec![0.0; x.len()];
            for h in 0..SHAPE.heads {
                for i in 0..n {
                    r[(i * SHAPE.heads + h) * hd..(i * SHAPE.heads + h + 1) * hd]
                        .copy_from_slice(&x[(h * n + i) * hd..(h * n + i + 1) * hd]);
                }
            }
            r
        };
        assert_eq!(
            delta_rows(&to_rows(&w), &to_rows(&out), SHAPE.heads, hd),
            dl
        );
        let (dq, dk, dv) = backward(&q, &k, &v, &lse, &w, &dl, &OFFSETS, SHAPE);
        let eps = 1e-6;
        for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
            let base = [&q, &k, &v][which];
            for i in (0..base.len()).step_by(37) {
                let mut up = [q.clone(), k.clone(), v.clone()];
                up[which][i] += eps;
                let mut down = [q.clone(), k.clone(), v.clone()];
                down[which][i] -= eps;
                let fd = (loss(&up[0], &up[1], &up[2]) - loss(&down[0], &down[1], &down[2]))
                    / (2.0 * eps);
                assert!(
                    (fd - grad[i]).abs() < 1e-7 * (1.0 + fd.abs()),
                    "input {which} elem {i}: {} vs {fd}",
                    grad[i]
                );
            }
        }
    }
}
