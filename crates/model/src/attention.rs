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
//! Segment `s` owns rows `offsets[s]..offsets[s + 1]`; its row `i` attends
//! to its rows `0..=i` (no padding exists) and, when `prefix[s] = Some(p)`,
//! first to every row of segment `p`: a prompt several sequences share
//! (a GRPO group's) is packed and computed once, and each continuation
//! attends to it as if it were its own first rows. The backward sums the
//! continuations' gradients into the shared rows, which is exactly the
//! gradient of the unshared batch.

use std::borrow::Cow;

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

/// How packed rows form segments: segment `s` owns rows
/// `offsets[s]..offsets[s + 1]`; `prefix[s] = Some(p)` puts every row of
/// segment `p` (which has no prefix itself) before them as keys. An empty
/// `prefix` means no segment has one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segments<'a> {
    pub offsets: &'a [usize],
    pub prefix: &'a [Option<usize>],
}

impl<'a> Segments<'a> {
    /// Segments without shared prefixes.
    #[cfg(test)]
    pub(crate) fn plain(offsets: &'a [usize]) -> Self {
        Self {
            offsets,
            prefix: &[],
        }
    }

    fn count(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// `(base, len)` of segment `s`'s own rows.
    fn own(&self, s: usize) -> (usize, usize) {
        (self.offsets[s], self.offsets[s + 1] - self.offsets[s])
    }

    /// `(base, len)` of the rows segment `s` sees before its own.
    fn shared(&self, s: usize) -> Option<(usize, usize)> {
        self.prefix.get(s).copied().flatten().map(|p| self.own(p))
    }

    /// Keys (or values) of head `g` segment `s` sees: the shared rows, then its own.
    fn keys<'b, T: Real>(
        &self,
        buf: &'b [T],
        g: usize,
        n: usize,
        hd: usize,
        s: usize,
    ) -> Cow<'b, [T]> {
        let (base, len) = self.own(s);
        let own = rows(buf, g, n, hd, base, len);
        match self.shared(s) {
            None => Cow::Borrowed(own),
            Some((pb, pl)) => Cow::Owned([rows(buf, g, n, hd, pb, pl), own].concat()),
        }
    }
}

/// Rows, segments and a rough operation count (`per_score` operations per
/// query-key pair and head-width element) of one pass over `segs`.
fn extent(segs: Segments<'_>, shape: Heads, per_score: usize) -> (usize, usize, usize) {
    let count = segs.count();
    let work = (0..count)
        .map(|s| {
            let len = segs.own(s).1;
            len * (len + segs.shared(s).map_or(0, |p| p.1))
        })
        .sum::<usize>()
        * shape.head_dim
        * shape.heads
        * per_score;
    (*segs.offsets.last().unwrap_or(&0), count, work)
}

/// Causal softmax of the block's scores in place: row `r` (query `i0 + r`,
/// counting any shared rows before it) keeps keys `0..=i0 + r`, the rest become 0. Returns nothing; writes each
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

/// Forward: `out` and `lse` of every head of every segment.
pub(crate) fn forward<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    segs: Segments<'_>,
    shape: Heads,
) -> (Vec<T>, Vec<T>) {
    let (n, count, work) = extent(segs, shape, 2);
    let (hd, heads) = (shape.head_dim, shape.heads);
    // One task per (segment, head); each returns its rows of out and lse.
    let parts = par_map(count * heads, work, |task| {
        let (s, h) = (task / heads, task % heads);
        let (base, len) = segs.own(s);
        let g = h / shape.rep();
        let qs = rows(q, h, n, hd, base, len);
        let (ks, vs) = (segs.keys(k, g, n, hd, s), segs.keys(v, g, n, hd, s));
        let past = ks.len() / hd - len;
        let mut out = vec![T::ZERO; len * hd];
        let mut lse = vec![T::ZERO; len];
        let mut scores = vec![T::ZERO; BLOCK.min(len) * (past + len)];
        for i0 in (0..len).step_by(BLOCK) {
            let i1 = (i0 + BLOCK).min(len);
            let (r, keys) = (i1 - i0, past + i1);
            let sc = &mut scores[..r * keys];
            Mm::nt(r, keys, hd)
                .single()
                .run(sc, &qs[i0 * hd..i1 * hd], &ks[..keys * hd]);
            block_softmax(sc, keys, past + i0, &mut lse[i0..i1], false);
            Mm::nn(r, hd, keys)
                .single()
                .run(&mut out[i0 * hd..i1 * hd], sc, &vs[..keys * hd]);
        }
        (out, lse)
    });
    let part = |s: usize, h: usize| &parts[s * heads + h];
    let out = gather_heads(heads, n, hd, segs.offsets, |s, h| &part(s, h).0[..]);
    let lse = gather_heads(heads, n, 1, segs.offsets, |s, h| &part(s, h).1[..]);
    (out, lse)
}

/// Gradients of [`forward`]: `(dq, dk, dv)` in the layouts of `q, k, v`,
/// given `d_out` (same layout as `out`) and `delta[h, i] = d_out · out` per row.
/// Shared rows get the sum of what every segment reading them passes back.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    lse: &[T],
    d_out: &[T],
    delta: &[T],
    segs: Segments<'_>,
    shape: Heads,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (n, count, work) = extent(segs, shape, 5);
    let (hd, kvh, rep) = (shape.head_dim, shape.kv_heads, shape.rep());
    // One task per (segment, kv head): it owns dk and dv of the keys it
    // sees, and the dq of the query heads sharing that kv head.
    let parts = par_map(count * kvh, work, |task| {
        let (s, g) = (task / kvh, task % kvh);
        let (base, len) = segs.own(s);
        let (ks, vs) = (segs.keys(k, g, n, hd, s), segs.keys(v, g, n, hd, s));
        let past = ks.len() / hd - len;
        let mut dq = vec![T::ZERO; rep * len * hd];
        let mut dk = vec![T::ZERO; (past + len) * hd];
        let mut dv = vec![T::ZERO; (past + len) * hd];
        let cap = BLOCK.min(len) * (past + len);
        let (mut p, mut ds) = (vec![T::ZERO; cap], vec![T::ZERO; cap]);
        for (hr, dqh) in dq.chunks_exact_mut(len * hd).enumerate() {
            let h = g * rep + hr;
            let qs = rows(q, h, n, hd, base, len);
            let dos = rows(d_out, h, n, hd, base, len);
            let mut l = lse[h * n + base..h * n + base + len].to_vec();
            let dl = &delta[h * n + base..h * n + base + len];
            for i0 in (0..len).step_by(BLOCK) {
                let i1 = (i0 + BLOCK).min(len);
                let (r, keys) = (i1 - i0, past + i1);
                let (pb, dsb) = (&mut p[..r * keys], &mut ds[..r * keys]);
                let (qb, dob) = (&qs[i0 * hd..i1 * hd], &dos[i0 * hd..i1 * hd]);
                let (kb, vb) = (&ks[..keys * hd], &vs[..keys * hd]);
                // P from the saved log-sum-exp.
                Mm::nt(r, keys, hd).single().run(pb, qb, kb);
                block_softmax(pb, keys, past + i0, &mut l[i0..i1], true);
                // dV += Pᵀ dO;  dP = dO Vᵀ;  dS = P ⊙ (dP − δ).
                Mm::tn(keys, hd, r)
                    .add()
                    .single()
                    .run(&mut dv[..keys * hd], pb, dob);
                Mm::nt(r, keys, hd).single().run(dsb, dob, vb);
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
                    .run(&mut dqh[i0 * hd..i1 * hd], dsb, kb);
                Mm::tn(keys, hd, r)
                    .add()
                    .single()
                    .run(&mut dk[..keys * hd], dsb, qb);
            }
        }
        (dq, dk, dv, past)
    });
    let part = |s: usize, g: usize| &parts[s * kvh + g];
    let dq = gather_heads(shape.heads, n, hd, segs.offsets, |s, h| {
        let (len, hr) = (segs.own(s).1, h % rep);
        &part(s, h / rep).0[hr * len * hd..(hr + 1) * len * hd]
    });
    // Each part's own rows follow the `past` shared ones.
    let mut dk = gather_heads(kvh, n, hd, segs.offsets, |s, g| {
        let p = part(s, g);
        &p.1[p.3 * hd..]
    });
    let mut dv = gather_heads(kvh, n, hd, segs.offsets, |s, g| {
        let p = part(s, g);
        &p.2[p.3 * hd..]
    });
    // The shared rows' gradients: what each reader passed back, in segment
    // order (a fixed order, so a run keeps its bits).
    for s in 0..count {
        let Some((pb, pl)) = segs.shared(s) else {
            continue;
        };
        for g in 0..kvh {
            let (_, pdk, pdv, past) = part(s, g);
            debug_assert_eq!(*past, pl);
            let at = (g * n + pb) * hd;
            for (dst, src) in [(&mut dk, pdk), (&mut dv, pdv)] {
                for (o, &x) in dst[at..at + pl * hd].iter_mut().zip(&src[..pl * hd]) {
                    *o += x;
                }
            }
        }
    }
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

    /// Naive attention: explicit scores, causal mask, softmax, weighted sum;
    /// a segment with a prefix sees all of the prefix's rows first.
    fn naive(q: &[f64], k: &[f64], v: &[f64], segs: Segments<'_>, sh: Heads) -> Vec<f64> {
        let n = *segs.offsets.last().unwrap();
        let hd = sh.head_dim;
        let mut out = vec![0.0; sh.heads * n * hd];
        for s in 0..segs.count() {
            let (base, len) = segs.own(s);
            let shared: Vec<usize> = segs.shared(s).map_or(vec![], |(b, l)| (b..b + l).collect());
            for h in 0..sh.heads {
                let g = h / sh.rep();
                for i in base..base + len {
                    let keys: Vec<usize> = shared.iter().copied().chain(base..=i).collect();
                    let qi = &q[(h * n + i) * hd..(h * n + i + 1) * hd];
                    let sc: Vec<f64> = keys
                        .iter()
                        .map(|&j| dot(qi, &k[(g * n + j) * hd..(g * n + j + 1) * hd]))
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                    for (jj, &j) in keys.iter().enumerate() {
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

    /// A 20-row prompt (segment 0) shared by segments 1 (5 rows) and 2 (70
    /// rows, two query blocks), and a plain 3-row segment.
    const SHARED_OFFSETS: [usize; 5] = [0, 20, 25, 95, 98];
    const SHARED_PREFIX: [Option<usize>; 4] = [None, Some(0), Some(0), None];

    fn shared() -> Segments<'static> {
        Segments {
            offsets: &SHARED_OFFSETS,
            prefix: &SHARED_PREFIX,
        }
    }

    fn inputs(n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let hd = SHAPE.head_dim;
        (
            rand(SHAPE.heads * n * hd, 1),
            rand(SHAPE.kv_heads * n * hd, 2),
            rand(SHAPE.kv_heads * n * hd, 3),
        )
    }

    fn max_diff(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn forward_matches_naive_attention_over_ragged_sequences() {
        for segs in [Segments::plain(&OFFSETS), shared()] {
            let (q, k, v) = inputs(*segs.offsets.last().unwrap());
            let (out, _) = forward(&q, &k, &v, segs, SHAPE);
            let err = max_diff(&out, &naive(&q, &k, &v, segs, SHAPE));
            assert!(err < 1e-12, "{err}");
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        for segs in [Segments::plain(&OFFSETS), shared()] {
            let n = *segs.offsets.last().unwrap();
            let (q, k, v) = inputs(n);
            let w = rand(SHAPE.heads * n * SHAPE.head_dim, 4);
            // L = Σ w ⊙ out.
            let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
                let (o, _) = forward(q, k, v, segs, SHAPE);
                o.iter().zip(&w).map(|(a, b)| a * b).sum()
            };
            let (out, lse) = forward(&q, &k, &v, segs, SHAPE);
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
            let (dq, dk, dv) = backward(&q, &k, &v, &lse, &w, &dl, segs, SHAPE);
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

    /// A shared prompt computed once gives each continuation the outputs it
    /// gets with its own copy of the prompt, and the prompt the sum of the
    /// copies' gradients.
    #[test]
    fn a_shared_prefix_equals_its_copies() {
        let hd = SHAPE.head_dim;
        let segs = shared();
        let n = SHARED_OFFSETS[4];
        let (q, k, v) = inputs(n);
        let w = rand(SHAPE.heads * n * hd, 5);
        // The copies' layout: prompt + segment 1, prompt + segment 2, segment 3.
        let order: Vec<usize> = (0..20)
            .chain(20..25)
            .chain(0..20)
            .chain(25..95)
            .chain(95..98)
            .collect();
        let m = order.len();
        let copy = |x: &[f64], heads: usize| -> Vec<f64> {
            let mut out = vec![0.0; heads * m * hd];
            for h in 0..heads {
                for (r, &src) in order.iter().enumerate() {
                    out[(h * m + r) * hd..(h * m + r + 1) * hd]
                        .copy_from_slice(&x[(h * n + src) * hd..(h * n + src + 1) * hd]);
                }
            }
            out
        };
        let (qc, kc, vc) = (
            copy(&q, SHAPE.heads),
            copy(&k, SHAPE.kv_heads),
            copy(&v, SHAPE.kv_heads),
        );
        // Only the continuations' outputs carry loss in the copied layout (the
        // prompt copies' own outputs are read by nobody when shared).
        let mut wc = copy(&w, SHAPE.heads);
        for h in 0..SHAPE.heads {
            for r in (0..20).chain(25..45) {
                wc[(h * m + r) * hd..(h * m + r + 1) * hd].fill(0.0);
            }
        }
        let mut ws = w.clone();
        for h in 0..SHAPE.heads {
            ws[(h * n) * hd..(h * n + 20) * hd].fill(0.0);
        }
        let copies = Segments::plain(&[0, 25, 115, 118]);
        let (out_s, lse_s) = forward(&q, &k, &v, segs, SHAPE);
        let (out_c, lse_c) = forward(&qc, &kc, &vc, copies, SHAPE);
        for h in 0..SHAPE.heads {
            for (r, &src) in order.iter().enumerate().skip(20) {
                if (25..45).contains(&r) {
                    continue;
                }
                let a = &out_s[(h * n + src) * hd..(h * n + src + 1) * hd];
                let b = &out_c[(h * m + r) * hd..(h * m + r + 1) * hd];
                assert!(max_diff(a, b) < 1e-12);
            }
        }
        let (dq_s, dk_s, _) = backward(
            &q,
            &k,
            &v,
            &lse_s,
            &ws,
            &delta(&ws, &out_s, hd),
            segs,
            SHAPE,
        );
        let (dq_c, dk_c, _) = backward(
            &qc,
            &kc,
            &vc,
            &lse_c,
            &wc,
            &delta(&wc, &out_c, hd),
            copies,
            SHAPE,
        );
        // dk of a prompt row = the sum over its two copies.
        for g in 0..SHAPE.kv_heads {
            for r in 0..20 {
                let s = &dk_s[(g * n + r) * hd..(g * n + r + 1) * hd];
                for c in 0..hd {
                    let sum = dk_c[(g * m + r) * hd + c] + dk_c[(g * m + 25 + r) * hd + c];
                    assert!((s[c] - sum).abs() < 1e-12);
                }
            }
        }
        // A continuation's dq is its copy's.
        for h in 0..SHAPE.heads {
            let a = &dq_s[(h * n + 30) * hd..(h * n + 31) * hd];
            let b = &dq_c[(h * m + 50) * hd..(h * m + 51) * hd];
            assert!(max_diff(a, b) < 1e-12);
        }
    }
}
