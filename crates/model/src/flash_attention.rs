//! Attention without the score matrix: `softmax(scale · q kᵀ) v` as one op
//! whose forward keeps the row log-sum-exps instead of the `[B, H, T, S]`
//! probabilities, and whose backward recomputes them tile by tile
//! (FlashAttention-2). On a GPU in bf16 at head dims 64 and 128 it runs
//! `kernels/flash_attention.cu` (tensor cores); everywhere else the same op
//! runs on the host (f32/f64) with a backward of plain candle ops, so the
//! op's contract is tested on every machine.
//!
//! The masking is crate::ops' causal softmax's: query i of batch element b
//! sees keys `pads[b] ..= i + S - T`; a query that sees none gives zeros.

#[cfg(feature = "cuda")]
use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

use crate::kernels::Real;

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// Whether [`flash_attention`] runs its GPU kernels for this dtype, device
/// and head dim (bf16 on a CUDA device, head dim 64 or 128, kernels built:
/// wmma's bf16 tiles need `CUDA_COMPUTE_CAP` 80 or later); elsewhere the
/// materialised softmax is the faster path and callers keep it.
pub fn flash_attention_applies(dtype: DType, device: &Device, head_dim: usize) -> bool {
    device.is_cuda() && dtype == DType::BF16 && matches!(head_dim, 64 | 128) && kernels_built()
}

/// Whether the PTX holds the kernels (`kernels/flash_attention.cu` compiles
/// them only for compute capability 8.0 and later).
fn kernels_built() -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::FLASH_ATTENTION
            .ptx
            .contains("flash_fwd_bf16_hd64")
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Attention of queries `q: [B, H, T, D]` over keys and values
/// `k, v: [B, G, S, D]` (`S ≥ T`, H a multiple of G: query head h reads kv
/// head h / (H / G)), scores scaled by `scale`, causal with left pads as
/// above (`pads` empty or one per batch element). Returns `[B, T, H, D]`,
/// the heads back beside each other for the output projection.
/// Differentiable in q, k and v. Any strides with a contiguous last dim.
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pads: &[usize],
    scale: f64,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (kb, g, s, kd) = k.dims4()?;
    if (kb, kd) != (b, d) || v.dims() != k.dims() || g == 0 || h % g != 0 || s < t {
        candle_core::bail!(
            "flash attention: q {:?}, k {:?}, v {:?} do not fit",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    if !pads.is_empty() && pads.len() != b {
        candle_core::bail!("flash attention: {} pads for {b} sequences", pads.len())
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        candle_core::bail!("flash attention: q, k and v differ in dtype")
    }
    let (q, k, v) = (dense_rows(q)?, dense_rows(k)?, dense_rows(v)?);
    let op = FlashAttention {
        pads: pads.to_vec(),
        scale,
        #[cfg(feature = "cuda")]
        saved: Mutex::new(None),
    };
    q.apply_op3(&k, &v, op)
}

/// `x` itself when its last dim is contiguous, else a contiguous copy.
fn dense_rows(x: &Tensor) -> Result<Tensor> {
    if x.stride()[3] == 1 {
        Ok(x.clone())
    } else {
        x.contiguous()
    }
}

/// The op: its masking and scale, and on a GPU what the forward leaves for
/// the backward (the row log-sum-exps and the pads on the device).
struct FlashAttention {
    pads: Vec<usize>,
    scale: f64,
    #[cfg(feature = "cuda")]
    saved: Mutex<Option<Arc<gpu::Saved>>>,
}

/// A `[B, H or G, rows, D]` view's element strides (batch, head, row) and
/// its first element, from its layout.
#[derive(Clone, Copy, Debug)]
struct RowView {
    start: usize,
    b: usize,
    h: usize,
    i: usize,
}

impl RowView {
    fn of(l: &Layout) -> Self {
        let st = l.stride();
        Self {
            start: l.start_offset(),
            b: st[0],
            h: st[1],
            i: st[2],
        }
    }

    fn at(&self, b: usize, h: usize, i: usize) -> usize {
        self.start + b * self.b + h * self.h + i * self.i
    }
}

/// The sizes of one application: B, H, G, T, S, D.
#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    h: usize,
    g: usize,
    t: usize,
    s: usize,
    d: usize,
}

impl Dims {
    fn of(q: &Layout, k: &Layout) -> Self {
        let (qd, kd) = (q.dims(), k.dims());
        Self {
            b: qd[0],
            h: qd[1],
            g: kd[1],
            t: qd[2],
            s: kd[2],
            d: qd[3],
        }
    }
}

/// The keys query `i` of batch element `b` sees.
fn seen_keys(pads: &[usize], b: usize, i: usize, z: Dims) -> std::ops::Range<usize> {
    let lo = pads.get(b).copied().unwrap_or(0);
    lo..(i + z.s - z.t + 1).min(z.s).max(lo)
}

/// The forward on the host, `[B, T, H, D]`, summing in f64.
fn host_forward<T: Real>(
    (q, k, v): (&[T], &[T], &[T]),
    (qv, kv, vv): (RowView, RowView, RowView),
    z: Dims,
    pads: &[usize],
    scale: f64,
) -> Vec<T> {
    let mut out = vec![T::ZERO; z.b * z.t * z.h * z.d];
    let rep = z.h / z.g;
    let mut p = Vec::with_capacity(z.s);
    for b in 0..z.b {
        for h in 0..z.h {
            let g = h / rep;
            for i in 0..z.t {
                let keys = seen_keys(pads, b, i, z);
                if keys.is_empty() {
                    continue; // a padding query: zeros
                }
                let qi = qv.at(b, h, i);
                p.clear();
                p.extend(keys.clone().map(|j| {
                    let kj = kv.at(b, g, j);
                    let dot: f64 = (0..z.d)
                        .map(|c| q[qi + c].to_f64() * k[kj + c].to_f64())
                        .sum();
                    scale * dot
                }));
                let m = p.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = p
                    .iter_mut()
                    .map(|x| {
                        *x = (*x - m).exp();
                        *x
                    })
                    .sum();
                let o = ((b * z.t + i) * z.h + h) * z.d;
                for c in 0..z.d {
                    let acc: f64 = keys
                        .clone()
                        .zip(&p)
                        .map(|(j, pj)| pj * v[vv.at(b, g, j) + c].to_f64())
                        .sum();
                    out[o + c] = T::from_f64(acc / sum);
                }
            }
        }
    }
    out
}

impl CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "agentrl-flash-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let z = Dims::of(l1, l2);
        let views = (RowView::of(l1), RowView::of(l2), RowView::of(l3));
        let shape = Shape::from((z.b, z.t, z.h, z.d));
        macro_rules! typed {
            ($t:ty) => {
                if let (Some(q), Some(k), Some(v)) = (
                    <$t as Real>::slice(s1),
                    <$t as Real>::slice(s2),
                    <$t as Real>::slice(s3),
                ) {
                    let out = host_forward::<$t>((q, k, v), views, z, &self.pads, self.scale);
                    return Ok((<$t as Real>::storage(out), shape));
                }
            };
        }
        typed!(f32);
        typed!(f64);
        candle_core::bail!("flash attention on the host: f32/f64 only, every input the same")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let z = Dims::of(l1, l2);
        let (out, saved) = gpu::forward([(s1, l1), (s2, l2), (s3, l3)], z, &self.pads, self.scale)?;
        *self.saved.lock().map_err(|_| poisoned())? = Some(Arc::new(saved));
        Ok((out, Shape::from((z.b, z.t, z.h, z.d))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        {
            let saved = self.saved.lock().map_err(|_| poisoned())?.clone();
            if let Some(saved) = saved {
                let (dq, dk, dv) = gpu::backward([q, k, v], out, grad, &saved, self.scale)?;
                return Ok((Some(dq), Some(dk), Some(dv)));
            }
        }
        let _ = out;
        let (dq, dk, dv) = composite_backward(q, k, v, grad, &self.pads, self.scale)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

#[cfg(feature = "cuda")]
fn poisoned() -> candle_core::Error {
    candle_core::Error::Msg("flash attention: a panic poisoned the saved state".into())
}

/// The gradients of q, k and v from the materialised probabilities, with
/// plain candle ops (any device and float type): dV = Pᵀ dO,
/// dS = P ∘ (dO Vᵀ − rowsum(P ∘ dO Vᵀ)) · scale, dQ = dS K, dK = dSᵀ Q,
/// the query heads of a kv head stacked along the rows so that one product
/// sums over them.
fn composite_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    grad: &Tensor,
    pads: &[usize],
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, h, t, d) = q.dims4()?;
    let (_, g, s, _) = k.dims4()?;
    let rows = h / g * t;
    let (q, k, v) = (q.detach(), k.detach(), v.detach());
    let qg = q.contiguous()?.reshape((b, g, rows, d))?;
    let k = k.contiguous()?;
    let v = v.contiguous()?;
    let scores = (qg.matmul(&k.t()?)? * scale)?.reshape((b, h, t, s))?;
    let p = crate::ops::left_padded_causal_softmax(&scores, pads)?.reshape((b, g, rows, s))?;
    // grad: [B, T, H, D] → [B, G, rows, D].
    let dout = grad
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, g, rows, d))?;
    let dv = p.t()?.matmul(&dout)?;
    let dp = dout.matmul(&v.t()?)?;
    let row = (&dp * &p)?.sum_keepdim(3)?;
    let ds = ((&p * dp.broadcast_sub(&row)?)? * scale)?;
    let dq = ds.matmul(&k)?.reshape((b, h, t, d))?;
    let dk = ds.t()?.matmul(&qg)?;
    Ok((dq, dk, dv))
}

/// The op on a CUDA device: `kernels/flash_attention.cu`'s launches.
#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, LaunchConfig,
    };
    use candle_core::cuda_backend::CudaStorageSlice;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result, Storage, Tensor};
    use half::bf16;

    use super::{Dims, RowView};
    use crate::cuda::{elementwise_blocks, launch, upload_pads, FLASH_ATTENTION};

    /// `Strides` of the kernels: element strides (batch, head, row).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Strides {
        b: i64,
        h: i64,
        i: i64,
    }

    /// `Sizes` of the kernels.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Sizes {
        heads: i32,
        kv_heads: i32,
        t: i32,
        s: i32,
        n_pads: i32,
        scale: f32,
    }

    // SAFETY: both are plain #[repr(C)] values matching the kernels' structs.
    unsafe impl DeviceRepr for Strides {}
    // SAFETY: as above.
    unsafe impl DeviceRepr for Sizes {}

    /// What the forward leaves for the backward.
    pub struct Saved {
        lse: CudaSlice<f32>,
        pads: CudaSlice<u32>,
        n_pads: usize,
    }

    fn too_large(z: Dims) -> candle_core::Error {
        candle_core::Error::Msg(format!(
            "flash attention: {z:?} is too large for the kernels"
        ))
    }

    fn sizes(z: Dims, n_pads: usize, scale: f64) -> Result<Sizes> {
        let c = |v: usize| i32::try_from(v).map_err(|_| too_large(z));
        Ok(Sizes {
            heads: c(z.h)?,
            kv_heads: c(z.g)?,
            t: c(z.t)?,
            s: c(z.s)?,
            n_pads: c(n_pads)?,
            scale: scale as f32,
        })
    }

    fn strides(v: RowView) -> Strides {
        Strides {
            b: v.b as i64,
            h: v.h as i64,
            i: v.i as i64,
        }
    }

    /// `blocks` × `heads` × B blocks of `threads` threads.
    fn grid(z: Dims, blocks: usize, heads: usize, threads: u32) -> Result<LaunchConfig> {
        let c = |v: usize| u32::try_from(v).map_err(|_| too_large(z));
        if heads > 65_535 || z.b > 65_535 || blocks == 0 {
            return Err(too_large(z));
        }
        Ok(LaunchConfig {
            grid_dim: (c(blocks)?, c(heads)?, c(z.b)?),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        })
    }

    /// The forward's warps a block (16 query rows each): 4 at head dim 64,
    /// 2 at 128, as the kernel file instantiates them.
    fn forward_warps(d: usize) -> usize {
        if d == 64 {
            4
        } else {
            2
        }
    }

    /// The bf16 slice of `s` from `l`'s first element on.
    fn bf16_view<'a>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, bf16>> {
        match &s.slice {
            CudaStorageSlice::BF16(x) => Ok(x.slice(l.start_offset()..)),
            _ => candle_core::bail!("flash attention: the GPU kernels take bf16"),
        }
    }

    fn at_origin(l: &Layout) -> RowView {
        RowView {
            start: 0,
            ..RowView::of(l)
        }
    }

    /// The output `[B, T, H, D]` and what the backward needs.
    pub fn forward(
        [(q, ql), (k, kl), (v, vl)]: [(&CudaStorage, &Layout); 3],
        z: Dims,
        pads: &[usize],
        scale: f64,
    ) -> Result<(CudaStorage, Saved)> {
        if !matches!(z.d, 64 | 128) {
            candle_core::bail!(
                "flash attention on a GPU: head dim {} (the kernels take 64 and 128)",
                z.d
            )
        }
        let dev = q.device().clone();
        let pads_dev = upload_pads(&dev, pads)?;
        let (qv, kv, vv) = (bf16_view(q, ql)?, bf16_view(k, kl)?, bf16_view(v, vl)?);
        let n = z.b * z.t * z.h * z.d;
        // SAFETY: the kernel writes every row < t of every (batch, head),
        // all D columns, and the log-sum-exp of each.
        let out = unsafe { dev.alloc::<bf16>(n)? };
        let lse = unsafe { dev.alloc::<f32>(z.b * z.h * z.t)? };
        let o_strides = Strides {
            b: (z.t * z.h * z.d) as i64,
            h: z.d as i64,
            i: (z.h * z.d) as i64,
        };
        let warps = forward_warps(z.d);
        let cfg = grid(z, z.t.div_ceil(16 * warps), z.h, 32 * warps as u32)?;
        let sz = sizes(z, pads.len(), scale)?;
        let (qs, ks, vs) = (
            strides(at_origin(ql)),
            strides(at_origin(kl)),
            strides(at_origin(vl)),
        );
        launch!(
            dev,
            FLASH_ATTENTION,
            &format!("flash_fwd_bf16_hd{}", z.d),
            cfg,
            &qv,
            &kv,
            &vv,
            &out,
            &lse,
            &pads_dev,
            &sz,
            &qs,
            &ks,
            &vs,
            &o_strides
        )?;
        let saved = Saved {
            lse,
            pads: pads_dev,
            n_pads: pads.len(),
        };
        Ok((CudaStorage::wrap_cuda_slice(out, dev), saved))
    }

    /// The CUDA storage of a tensor the forward ran on.
    fn on_gpu(s: &Storage) -> Result<&CudaStorage> {
        match s {
            Storage::Cuda(c) => Ok(c),
            _ => candle_core::bail!("flash attention: a GPU forward with host gradients"),
        }
    }

    /// A tensor of `shape` over a bf16 buffer the kernels filled.
    fn tensor(buf: CudaSlice<bf16>, dev: &CudaDevice, shape: &[usize]) -> Tensor {
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(buf, dev.clone()));
        Tensor::from_storage(storage, shape, BackpropOp::none(), false)
    }

    /// What the dK/dV and dQ kernels read in common, in their argument
    /// order: q, k, v and dO with their strides, the forward's row
    /// log-sum-exps, the rows' Δ and the pads.
    struct Recompute<'a> {
        dev: &'a CudaDevice,
        z: Dims,
        sizes: Sizes,
        inputs: [&'a CudaView<'a, bf16>; 4],
        strides: [Strides; 4],
        lse: &'a CudaSlice<f32>,
        delta: &'a CudaSlice<f32>,
        pads: &'a CudaSlice<u32>,
    }

    impl Recompute<'_> {
        /// dK and dV by `kernel` (`flash_dkdv`: a block per key block of a
        /// kv head, bf16 out; `flash_dkdv_heads`: of a query head, f32 out),
        /// a block per key block of each of `heads` heads, written at `out`.
        fn key_grads<O: DeviceRepr>(
            &self,
            kernel: &str,
            heads: usize,
            (dk, dv): (&CudaSlice<O>, &CudaSlice<O>),
            out: Strides,
        ) -> Result<()> {
            let (z, [q, k, v, dout], [qs, ks, vs, ds]) = (self.z, self.inputs, &self.strides);
            launch!(
                self.dev,
                FLASH_ATTENTION,
                &format!("{kernel}_bf16_hd{}", z.d),
                grid(z, z.s.div_ceil(32), heads, 128)?,
                q,
                k,
                v,
                dout,
                self.lse,
                self.delta,
                dk,
                dv,
                self.pads,
                &self.sizes,
                qs,
                ks,
                vs,
                ds,
                &out,
                &out
            )
        }

        /// dQ, a block per 32 query rows of each head, written at `out`.
        fn query_grads(&self, dq: &CudaSlice<bf16>, out: Strides) -> Result<()> {
            let (z, [q, k, v, dout], [qs, ks, vs, ds]) = (self.z, self.inputs, &self.strides);
            launch!(
                self.dev,
                FLASH_ATTENTION,
                &format!("flash_dq_bf16_hd{}", z.d),
                grid(z, z.t.div_ceil(32), z.h, 128)?,
                q,
                k,
                v,
                dout,
                self.lse,
                self.delta,
                dq,
                self.pads,
                &self.sizes,
                qs,
                ks,
                vs,
                ds,
                &out
            )
        }
    }

    /// dq `[B, H, T, D]`, dk and dv `[B, G, S, D]` (contiguous).
    pub fn backward(
        [q, k, v]: [&Tensor; 3],
        out: &Tensor,
        grad: &Tensor,
        saved: &Saved,
        scale: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let grad = grad.contiguous()?;
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (os, ol) = out.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (qc, kc, vc) = (on_gpu(&qs)?, on_gpu(&ks)?, on_gpu(&vs)?);
        let (oc, gc) = (on_gpu(&os)?, on_gpu(&gs)?);
        let z = Dims::of(ql, kl);
        let dev = qc.device().clone();
        let (qv, kv, vv) = (bf16_view(qc, ql)?, bf16_view(kc, kl)?, bf16_view(vc, vl)?);
        let (ov, gv) = (bf16_view(oc, ol)?, bf16_view(gc, gl)?);
        let sz = sizes(z, saved.n_pads, scale)?;
        let (q_st, k_st, v_st) = (
            strides(at_origin(ql)),
            strides(at_origin(kl)),
            strides(at_origin(vl)),
        );
        // out and grad: [B, T, H, D] as (batch, head, row) strides.
        let bthd = |l: &Layout| {
            let st = l.stride();
            Strides {
                b: st[0] as i64,
                h: st[2] as i64,
                i: st[1] as i64,
            }
        };
        let (o_st, g_st) = (bthd(ol), bthd(gl));
        let dense = |heads: usize, rows: usize| Strides {
            b: (heads * rows * z.d) as i64,
            h: (rows * z.d) as i64,
            i: z.d as i64,
        };
        // SAFETY (the four allocations): delta gets every row < t; dq every
        // row < t of every head, dk and dv every key row < s of every kv
        // head, all D columns (a key block no row sees stores its zeros;
        // with grouped heads the sum writes every element).
        let delta = unsafe { dev.alloc::<f32>(z.b * z.h * z.t)? };
        let dq = unsafe { dev.alloc::<bf16>(z.b * z.h * z.t * z.d)? };
        let dk = unsafe { dev.alloc::<bf16>(z.b * z.g * z.s * z.d)? };
        let dv = unsafe { dev.alloc::<bf16>(z.b * z.g * z.s * z.d)? };
        let (heads, t, d) = (
            sz.heads,
            sz.t,
            i32::try_from(z.d).map_err(|_| too_large(z))?,
        );
        launch!(
            dev,
            FLASH_ATTENTION,
            "flash_delta_bf16",
            grid(z, z.t.div_ceil(4), z.h, 128)?,
            &ov,
            &gv,
            &delta,
            &heads,
            &t,
            &d,
            &o_st,
            &g_st
        )?;
        let (dq_st, dkv_st) = (dense(z.h, z.t), dense(z.g, z.s));
        let recompute = Recompute {
            dev: &dev,
            z,
            sizes: sz,
            inputs: [&qv, &kv, &vv, &gv],
            strides: [q_st, k_st, v_st, g_st],
            lse: &saved.lse,
            delta: &delta,
            pads: &saved.pads,
        };
        if z.h == z.g {
            recompute.key_grads("flash_dkdv", z.g, (&dk, &dv), dkv_st)?;
        } else {
            // Grouped heads: a block per query head (H / G times the blocks,
            // each walking one head's rows), its share of dk and dv in f32,
            // then the shares of each group added in head order.
            let n = z.b * z.h * z.s * z.d;
            // SAFETY: a block per (key block, query head, batch) stores every
            // key row < s of its head, all D columns.
            let dk_heads = unsafe { dev.alloc::<f32>(n)? };
            let dv_heads = unsafe { dev.alloc::<f32>(n)? };
            recompute.key_grads(
                "flash_dkdv_heads",
                z.h,
                (&dk_heads, &dv_heads),
                dense(z.h, z.s),
            )?;
            let b32 = i32::try_from(z.b).map_err(|_| too_large(z))?;
            launch!(
                dev,
                FLASH_ATTENTION,
                "flash_sum_heads_bf16",
                elementwise_blocks(z.b * z.g * z.s * z.d),
                &dk_heads,
                &dv_heads,
                &dk,
                &dv,
                &b32,
                &sz,
                &d,
                &dkv_st,
                &dkv_st
            )?;
        }
        recompute.query_grads(&dq, dq_st)?;
        Ok((
            tensor(dq, &dev, &[z.b, z.h, z.t, z.d]),
            tensor(dk, &dev, &[z.b, z.g, z.s, z.d]),
            tensor(dv, &dev, &[z.b, z.g, z.s, z.d]),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{max_abs_diff, rand_tensor, weighted_grad};
    use candle_core::Var;

    /// Attention written out independently of the op: k and v repeated per
    /// query head, an additive mask, padding rows zeroed after the softmax.
    fn materialised(q: &Tensor, k: &Tensor, v: &Tensor, pads: &[usize], scale: f64) -> Tensor {
        let (b, h, t, d) = q.dims4().unwrap();
        let (_, g, s, _) = k.dims4().unwrap();
        let repeat = |x: &Tensor| {
            x.unsqueeze(2)
                .unwrap()
                .expand((b, g, h / g, s, d))
                .unwrap()
                .reshape((b, h, s, d))
                .unwrap()
        };
        let (k, v) = (repeat(k), repeat(v));
        let scores = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
        let (mut mask, mut rows) = (Vec::new(), Vec::new());
        for &lo in &pads[..b] {
            for i in 0..t {
                let seen = |j: usize| lo <= j && j <= i + s - t;
                mask.extend((0..s).map(|j| if seen(j) { 0.0 } else { -1e30 }));
                rows.push(if (0..s).any(seen) { 1.0 } else { 0.0 });
            }
        }
        let mask = Tensor::from_vec(mask, (b, 1, t, s), &Device::Cpu).unwrap();
        let rows = Tensor::from_vec(rows, (b, 1, t, 1), &Device::Cpu).unwrap();
        let p = crate::qwen2::softmax_last_dim(&scores.broadcast_add(&mask).unwrap()).unwrap();
        let p = p.broadcast_mul(&rows).unwrap();
        p.matmul(&v)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
    }

    #[test]
    fn forward_and_gradients_match_the_materialised_attention() {
        // Two query heads per kv head, two cached keys, and a sequence
        // whose first four keys are padding (its queries 0 and 1 see none).
        let (b, h, g, t, s, d) = (2, 4, 2, 5, 7, 8);
        let pads = [0, 4];
        let scale = 0.3;
        let q = Var::from_tensor(&rand_tensor(&[b, h, t, d], 1)).unwrap();
        let k = Var::from_tensor(&rand_tensor(&[b, g, s, d], 2)).unwrap();
        // v as the model hands it over: a transposed view of [B, S, G, D].
        let v_rows = Var::from_tensor(&rand_tensor(&[b, s, g, d], 3)).unwrap();
        let v = v_rows.transpose(1, 2).unwrap();
        let w = rand_tensor(&[b, t, h, d], 4);
        let got = flash_attention(&q, &k, &v, &pads, scale).unwrap();
        let want = materialised(&q, &k, &v, &pads, scale);
        assert_eq!(got.dims(), [b, t, h, d]);
        assert!(max_abs_diff(&got, &want) < 1e-12);
        for x in [&q, &k, &v_rows] {
            let (gf, gm) = (weighted_grad(&got, &w, x), weighted_grad(&want, &w, x));
            assert!(
                max_abs_diff(&gf, &gm) < 1e-10,
                "gradient off by {}",
                max_abs_diff(&gf, &gm)
            );
        }
        // The padding queries: zero output and no gradient.
        let dq = weighted_grad(&got, &w, &q);
        for i in 0..2 {
            let o = got
                .get(1)
                .unwrap()
                .get(i)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap();
            let g = dq
                .get(1)
                .unwrap()
                .narrow(1, i, 1)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap();
            assert_eq!(o.to_scalar::<f64>().unwrap(), 0.0);
            assert_eq!(g.to_scalar::<f64>().unwrap(), 0.0);
        }
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        let q = rand_tensor(&[1, 4, 3, 8], 1);
        let k = rand_tensor(&[1, 3, 3, 8], 2);
        let err = flash_attention(&q, &k, &k, &[], 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("do not fit"), "{err}");
        let k = rand_tensor(&[1, 2, 2, 8], 2);
        let err = flash_attention(&q, &k, &k, &[], 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("do not fit"), "fewer keys than queries: {err}");
        let k = rand_tensor(&[1, 2, 3, 8], 2);
        let err = flash_attention(&q, &k, &k, &[0, 0], 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("2 pads for 1 sequences"), "{err}");
    }
}
