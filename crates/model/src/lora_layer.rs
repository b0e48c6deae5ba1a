//! The LoRA terms of the fused decoder layer ([`crate::block`]). With the
//! base weights frozen, an adapted projection adds `s·(x·Aᵀ)·Bᵀ` to its
//! output, and the backward gives A and B their gradients with rank-sized
//! products only — `dA = s·(dy·B)ᵀ·x`, `dB = s·dyᵀ·(x·Aᵀ)`, and
//! `dx += s·(dy·B)·A` — where a merged weight `W + s·B·A` pays the
//! weight-sized `dW = dyᵀ·x` (a third of a layer's training products) and
//! then reduces it to A and B.

use std::ops::Range;

use crate::block::LayerShape;
use crate::kernels::{Mm, Real, Strides};
use crate::lora::LoraTarget;

/// A layer's LoRA adapters as the fused op reads them from its third input:
/// for each adapted projection in layer order (q, k, v, o, gate, up, down),
/// `A: [r, in]` then `B: [out, r]`, flattened and concatenated.
#[derive(Debug, Clone)]
pub(crate) struct LayerLora {
    /// The adapted projections, in layer order.
    pub targets: Vec<LoraTarget>,
    pub rank: usize,
    /// `s`: `lora_alpha / r` (or `/ √r` with rsLoRA).
    pub scale: f64,
}

/// The projections that read the input norm's output (one fused product).
pub(crate) const QKV: [LoraTarget; 3] = [LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj];
/// The projections that read the post-attention norm's output.
pub(crate) const GATE_UP: [LoraTarget; 2] = [LoraTarget::GateProj, LoraTarget::UpProj];

/// Where one adapted projection sits: its input width, its output columns
/// `col..col + out` within rows `width` wide, and its A and B in the flat input.
struct Site {
    target: LoraTarget,
    inn: usize,
    out: usize,
    width: usize,
    col: usize,
    a: Range<usize>,
    b: Range<usize>,
}

impl LayerLora {
    /// The adapted projections' sites, in the flat input's order.
    fn sites(&self, shape: &LayerShape) -> Vec<Site> {
        let (d, q, kv, f) = (shape.d, shape.q_dim(), shape.kv_dim(), shape.ffn);
        let qkv = q + 2 * kv;
        let r = self.rank;
        let mut at = 0;
        self.targets
            .iter()
            .map(|&target| {
                // (in, out, output row width, first column) of each projection
                // in the layer's fused products.
                let (inn, out, width, col) = match target {
                    LoraTarget::QProj => (d, q, qkv, 0),
                    LoraTarget::KProj => (d, kv, qkv, q),
                    LoraTarget::VProj => (d, kv, qkv, q + kv),
                    LoraTarget::OProj => (q, d, d, 0),
                    LoraTarget::GateProj => (d, f, 2 * f, 0),
                    LoraTarget::UpProj => (d, f, 2 * f, f),
                    LoraTarget::DownProj => (f, d, d, 0),
                };
                let a = at..at + r * inn;
                let b = a.end..a.end + out * r;
                at = b.end;
                Site {
                    target,
                    inn,
                    out,
                    width,
                    col,
                    a,
                    b,
                }
            })
            .collect()
    }

    /// The sites of the adapted projections among `which`.
    fn sites_among<'w>(
        &self,
        shape: &LayerShape,
        which: &'w [LoraTarget],
    ) -> impl Iterator<Item = Site> + 'w {
        self.sites(shape)
            .into_iter()
            .filter(move |site| which.contains(&site.target))
    }

    /// Values in the flat input.
    pub(crate) fn len(&self, shape: &LayerShape) -> usize {
        self.sites(shape).last().map_or(0, |s| s.b.end)
    }

    /// Adds `s·(x·Aᵀ)·Bᵀ` of each adapted projection among `which` (those
    /// that read `x`) to its columns of `y`.
    pub(crate) fn forward<T: Real>(
        &self,
        shape: &LayerShape,
        which: &[LoraTarget],
        y: &mut [T],
        x: &[T],
        flat: &[T],
    ) {
        if x.is_empty() {
            return;
        }
        for site in self.sites_among(shape, which) {
            let n = x.len() / site.inn;
            let u = self.scaled_down(x, &flat[site.a.clone()], site.inn);
            Mm::nt(n, site.out, self.rank).add().run_strided(
                &mut y[site.col..],
                Strides {
                    rs: site.width,
                    cs: 1,
                },
                &u,
                &flat[site.b.clone()],
            );
        }
    }

    /// The backward of [`LayerLora::forward`] given `dy`, the gradient of
    /// the whole output `y`: adds each term's `dx` to `dx` and writes its
    /// A's and B's gradients into their places in `grad` (laid out as the
    /// flat input).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Real>(
        &self,
        shape: &LayerShape,
        which: &[LoraTarget],
        dy: &[T],
        x: &[T],
        dx: &mut [T],
        flat: &[T],
        grad: &mut [T],
    ) {
        if x.is_empty() {
            return;
        }
        let (r, s) = (self.rank, T::from_f64(self.scale));
        for site in self.sites_among(shape, which) {
            let n = x.len() / site.inn;
            let (a, b) = (&flat[site.a.clone()], &flat[site.b.clone()]);
            // This projection's columns of dy: [n, out], rows `width` apart.
            let dy = &dy[site.col..];
            let rows = Strides {
                rs: site.width,
                cs: 1,
            };
            // g = s·dy·B: [n, r].
            let mut g = vec![T::ZERO; n * r];
            Mm::nn(n, r, site.out).a_strides(rows).run(&mut g, dy, b);
            g.iter_mut().for_each(|v| *v *= s);
            Mm::tn(r, site.inn, n).run(&mut grad[site.a.clone()], &g, x);
            Mm::nn(n, site.inn, r).add().run(dx, &g, a);
            // dB = dyᵀ·(s·x·Aᵀ): dy read as its transpose.
            let u = self.scaled_down(x, a, site.inn);
            Mm::tn(site.out, r, n)
                .a_strides(Strides {
                    rs: 1,
                    cs: site.width,
                })
                .run(&mut grad[site.b.clone()], dy, &u);
        }
    }

    /// `s·x·Aᵀ`: `[n, r]` for `x: [n, inn]`. Computed as its transpose
    /// `A·xᵀ`, a product of r ≤ 32 rows that the decode steps' kernel runs
    /// in one pass over `x` (as `x·Aᵀ` the GEMM packs all of `x` for r columns).
    fn scaled_down<T: Real>(&self, x: &[T], a: &[T], inn: usize) -> Vec<T> {
        let (n, r) = (x.len() / inn, self.rank);
        let ut = Mm::nt(r, n, inn).product(a, x);
        let s = T::from_f64(self.scale);
        let mut u = vec![T::ZERO; n * r];
        for (i, row) in ut.chunks_exact(n).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                u[j * r + i] = v * s;
            }
        }
        u
    }
}
