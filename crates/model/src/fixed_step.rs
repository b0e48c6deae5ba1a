//! The ops of a fixed-shape decode step: one whose varying inputs (the
//! tokens, their positions, the cache slot they are written to) live in
//! device memory and are rewritten in place before each step, so that every
//! launch of one step is also a launch of the next and a CUDA graph captured
//! once can replay them ([`crate::graph_decode`]).
//!
//! - [`upload`]: host values into an existing u32 tensor, in place;
//! - [`write_at_slot`]: a step's keys or values into a KV cache at the
//!   position a u32 tensor holds (`kernels/kv_cache.cu`);
//! - [`decode_attention`]: a step's whole attention over the caches in one
//!   launch, each row seeing keys `pads[b] ..= last` with `last` read from a
//!   tensor (`kernels/decode_attention.cu`);
//! - [`decode_softmax`]: the probabilities alone, for head dims past that
//!   kernel's (`kernels/softmax.cu`).
//!
//! Each runs on the CPU too (f32/f64 for the attention and the softmax), so
//! the decoder that uses them is tested on every machine.

use candle_core::{
    CpuStorage, CustomOp2, InplaceOp1, InplaceOp3, Layout, Result, Shape, Storage, StorageRef,
    Tensor,
};

use crate::host::storage_slice;
use crate::kernels::Real;
use crate::ops::{causal_softmax_rows, ScoreRows};

/// The u32 a one-element tensor on the CPU holds.
fn host_u32(s: &CpuStorage, l: &Layout, what: &str) -> Result<u32> {
    match s {
        CpuStorage::U32(v) => v
            .get(l.start_offset())
            .copied()
            .ok_or_else(|| candle_core::Error::Msg(format!("{what}: empty"))),
        _ => candle_core::bail!("{what}: expected u32"),
    }
}

/// Host values written over a contiguous u32 tensor of as many elements.
struct Upload<'a>(&'a [u32]);

impl InplaceOp1 for Upload<'_> {
    fn name(&self) -> &'static str {
        "agentrl-upload"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let (CpuStorage::U32(v), Some((a, b))) = (s, l.contiguous_offsets()) else {
            candle_core::bail!("upload: the target must be a contiguous u32 tensor")
        };
        if b - a != self.0.len() {
            candle_core::bail!("upload: {} values into {} elements", self.0.len(), b - a)
        }
        v[a..b].copy_from_slice(self.0);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        use candle_core::backend::BackendStorage;
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("upload: the target must be contiguous")
        };
        if b - a != self.0.len() {
            candle_core::bail!("upload: {} values into {} elements", self.0.len(), b - a)
        }
        use candle_core::cuda_backend::WrapErr;
        // The stream's own copy, not candle's: under candle's graph-capture
        // cache a copy would keep every distinct upload's bytes.
        let stream = s.device().cuda_stream();
        let candle_core::cuda_backend::CudaStorageSlice::U32(v) = &mut s.slice else {
            candle_core::bail!("upload: the target must be u32")
        };
        let mut dst = v.slice_mut(a..b);
        stream.memcpy_htod(self.0, &mut dst).w()
    }
}

/// Writes `values` over `target` (a contiguous u32 tensor of as many
/// elements) in place, on its device.
pub(crate) fn upload(target: &Tensor, values: &[u32]) -> Result<()> {
    target.inplace_op1(&Upload(values))
}

/// `fresh: [B, kv, 1, hd]` into the cache `[B, kv, cap, hd]` at the slot.
struct WriteAtSlot;

impl InplaceOp3 for WriteAtSlot {
    fn name(&self) -> &'static str {
        "agentrl-kv-write"
    }

    fn cpu_fwd(
        &self,
        cache: &mut CpuStorage,
        cl: &Layout,
        fresh: &CpuStorage,
        fl: &Layout,
        slot: &CpuStorage,
        sl: &Layout,
    ) -> Result<()> {
        let (_, cap, hd) = cache_shape(cl, fl)?;
        let at = host_u32(slot, sl, "kv write slot")? as usize;
        if at >= cap {
            candle_core::bail!("kv write: slot {at} past a cache of {cap}")
        }
        if hd == 0 {
            return Ok(());
        }
        let (Some((c0, _)), Some((f0, f1))) = (cl.contiguous_offsets(), fl.contiguous_offsets())
        else {
            candle_core::bail!("kv write: cache and values must be contiguous")
        };
        macro_rules! copy_rows {
            ($($variant:ident),+) => {
                match (cache, fresh) {
                    $((CpuStorage::$variant(c), CpuStorage::$variant(f)) => {
                        for (r, row) in f[f0..f1].chunks(hd).enumerate() {
                            let to = c0 + (r * cap + at) * hd;
                            c[to..to + hd].copy_from_slice(row);
                        }
                    })+
                    _ => candle_core::bail!("kv write: cache and values differ in dtype"),
                }
            };
        }
        copy_rows!(F32, F64, BF16, F16);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        cache: &mut candle_core::CudaStorage,
        cl: &Layout,
        fresh: &candle_core::CudaStorage,
        fl: &Layout,
        slot: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> Result<()> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::{CudaDType, CudaStorageSlice as S};

        let (rows, cap, hd) = cache_shape(cl, fl)?;
        let dev = cache.device().clone();
        let slot = crate::cuda::view(u32::as_cuda_slice(slot)?, sl, "kv write slot")?;
        let geometry = (rows as u64, cap as u32, hd as u32);
        match (&mut cache.slice, &fresh.slice) {
            (S::F32(c), S::F32(f)) => {
                kv_write_on_gpu(&dev, "kv_write_f32", (c, cl), (f, fl), &slot, geometry)
            }
            (S::BF16(c), S::BF16(f)) => {
                kv_write_on_gpu(&dev, "kv_write_bf16", (c, cl), (f, fl), &slot, geometry)
            }
            (S::F16(c), S::F16(f)) => {
                kv_write_on_gpu(&dev, "kv_write_f16", (c, cl), (f, fl), &slot, geometry)
            }
            _ => candle_core::bail!("kv write: cache and values differ in dtype, or no kernel"),
        }
    }
}

/// `kernels/kv_cache.cu`'s `kernel` over a cache and a step's values.
#[cfg(feature = "cuda")]
fn kv_write_on_gpu<T: candle_core::cuda_backend::cudarc::driver::DeviceRepr>(
    dev: &candle_core::CudaDevice,
    kernel: &str,
    (cache, cl): (
        &mut candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        &Layout,
    ),
    (fresh, fl): (
        &candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        &Layout,
    ),
    slot: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, u32>,
    (rows, cap, hd): (u64, u32, u32),
) -> Result<()> {
    use crate::cuda::{elementwise_blocks, launch, view, KV_CACHE};
    let Some((c0, c1)) = cl.contiguous_offsets() else {
        candle_core::bail!("kv write: the cache must be contiguous")
    };
    let mut cache = cache.slice_mut(c0..c1);
    let fresh = view(fresh, fl, "kv write values")?;
    let cfg = elementwise_blocks(rows as usize * hd as usize);
    // kv_write_T(cache, fresh, slot, rows, cap, hd): value i of `fresh`
    // (row i / hd) to position *slot of its row, grid-strided; the slot is
    // checked against cap on the device.
    launch!(dev, KV_CACHE, kernel, cfg, &mut cache, &fresh, slot, &rows, &cap, &hd)
}

/// (rows = B·kv, cap, hd) of a cache `[B, kv, cap, hd]` and the step's
/// `[B, kv, 1, hd]` values, or the error naming the mismatch.
fn cache_shape(cache: &Layout, fresh: &Layout) -> Result<(usize, usize, usize)> {
    let (c, f) = (cache.dims(), fresh.dims());
    match (c, f) {
        ([b, kv, cap, hd], [fb, fkv, 1, fhd]) if (b, kv, hd) == (fb, fkv, fhd) => {
            Ok((b * kv, *cap, *hd))
        }
        _ => candle_core::bail!("kv write: values {f:?} for a cache {c:?}"),
    }
}

/// Writes the step's `fresh: [B, kv, 1, hd]` into `cache: [B, kv, cap, hd]`
/// at the position `slot` (a one-element u32 tensor) holds, in place.
pub(crate) fn write_at_slot(cache: &Tensor, fresh: &Tensor, slot: &Tensor) -> Result<()> {
    cache.inplace_op3(&fresh.contiguous()?, slot, &WriteAtSlot)
}

/// Softmax over the last dim of scores `[B, .., 1, S]`, row of batch
/// element b seeing keys `pads[b] ..= last` (masked keys get exactly 0).
struct DecodeSoftmax<'a> {
    pads: &'a [usize],
}

impl DecodeSoftmax<'_> {
    /// Rows per batch element and keys per row, checked against the pads.
    fn geometry(&self, dims: &[usize]) -> Result<(usize, usize)> {
        let (Some(&s), Some(&b)) = (dims.last(), dims.first()) else {
            candle_core::bail!("decode softmax: scores of no dimension")
        };
        if dims.len() < 3 || dims[dims.len() - 2] != 1 || b != self.pads.len() {
            candle_core::bail!(
                "decode softmax: scores {dims:?} for {} pads",
                self.pads.len()
            )
        }
        let rows = dims.iter().product::<usize>() / s.max(1);
        Ok((rows / b.max(1), s))
    }
}

/// [`DecodeSoftmax`] on the host: the attention softmax's rows with every
/// row bounded at `last`.
fn decode_softmax_rows<T: Real>(
    x: &[T],
    pads: &[usize],
    rows_per_batch: usize,
    s: usize,
    last: usize,
) -> Vec<T> {
    let mut y = vec![T::ZERO; x.len()];
    if s > 0 {
        let rows = ScoreRows {
            t: 1,
            s,
            rows_per_batch,
            pads,
            last: Some(last),
        };
        causal_softmax_rows(0, x, &mut y, rows);
    }
    y
}

impl CustomOp2 for DecodeSoftmax<'_> {
    fn name(&self) -> &'static str {
        "agentrl-decode-softmax"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (per, s) = self.geometry(l1.dims())?;
        let last = host_u32(s2, l2, "decode softmax bound")? as usize;
        let out = match s1 {
            CpuStorage::F32(_) => {
                let x = storage_slice::<f32>(s1, l1, "scores")?;
                f32::storage(decode_softmax_rows(x, self.pads, per, s, last))
            }
            CpuStorage::F64(_) => {
                let x = storage_slice::<f64>(s1, l1, "scores")?;
                f64::storage(decode_softmax_rows(x, self.pads, per, s, last))
            }
            _ => candle_core::bail!("decode softmax on the CPU takes f32 or f64 scores"),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (per, s) = self.geometry(l1.dims())?;
        let y = crate::ops::softmax_on_gpu::decode((s1, l1), (s2, l2), self.pads, s, per)?;
        Ok((y, l1.shape().clone()))
    }
}

/// [`DecodeSoftmax`] of `scores: [B, .., 1, S]` with the bound `last` (a
/// one-element u32 tensor on the scores' device).
pub(crate) fn decode_softmax(scores: &Tensor, pads: &[usize], last: &Tensor) -> Result<Tensor> {
    scores
        .contiguous()?
        .apply_op2_no_bwd(last, &DecodeSoftmax { pads })
}

/// The largest head dim [`decode_attention`] takes (its kernel keeps 8
/// output dims a lane).
pub(crate) const DECODE_ATTENTION_MAX_HEAD_DIM: usize = 256;

/// What a decode step does to a query or key row as it comes out of its
/// projection's GEMM before use: the projection's bias added, then the
/// rotary embedding at the row's position.
#[derive(Clone, Copy, Default)]
pub(crate) struct RowPrep<'a> {
    /// `[heads · D]`, one bias per head.
    pub bias: Option<&'a Tensor>,
    /// `[B, 1, D]`: row b's cos (first half) and sin (second half), the
    /// rotary tables' `packed` form.
    pub rope: Option<&'a Tensor>,
}

impl RowPrep<'_> {
    /// The bias and tables, contiguous, checked against `b` rows of `heads`
    /// heads of `d` (d even to rotate).
    fn checked(&self, b: usize, heads: usize, d: usize, what: &str) -> Result<[Option<Tensor>; 2]> {
        let bias = match self.bias {
            Some(x) if x.elem_count() == heads * d => Some(x.contiguous()?),
            Some(x) => {
                candle_core::bail!("{what}: a bias of {:?} for {heads} heads of {d}", x.dims())
            }
            None => None,
        };
        let rope = match self.rope {
            Some(x) if x.elem_count() == b * d && d.is_multiple_of(2) => Some(x.contiguous()?),
            Some(x) => {
                candle_core::bail!("{what}: rotary tables {:?} for {b} rows of {d}", x.dims())
            }
            None => None,
        };
        Ok([bias, rope])
    }
}

/// A checked [`RowPrep`]'s bias and tables, each read-locked while a kernel
/// reads it.
type PrepGuards<'a> = [Option<(StorageRef<'a>, &'a Layout)>; 2];

/// Locks what [`RowPrep::checked`] gave.
fn lock_prep(prep: &[Option<Tensor>; 2]) -> PrepGuards<'_> {
    prep.each_ref()
        .map(|t| t.as_ref().map(Tensor::storage_and_layout))
}

/// The kernels' flags for a prepared bias and tables: 1 adds the bias, 2
/// rotates.
#[cfg(feature = "cuda")]
fn prep_flags<X>([bias, rope]: &[Option<X>; 2]) -> i32 {
    i32::from(bias.is_some()) | (i32::from(rope.is_some()) << 1)
}

/// Row `x` (one head's D values) with `bias` (that head's) added and
/// rotated by `cs` (the row's cos then sin), in f64.
fn prepared_row<T: Real>(x: &[T], bias: Option<&[T]>, cs: Option<&[T]>) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    if let Some(bias) = bias {
        for (y, b) in y.iter_mut().zip(bias) {
            *y += b.to_f64();
        }
    }
    if let Some(cs) = cs {
        let half = y.len() / 2;
        for j in 0..half {
            let (c, s) = (cs[j].to_f64(), cs[half + j].to_f64());
            let (a, e) = (y[j], y[half + j]);
            y[j] = a * c - e * s;
            y[half + j] = e * c + a * s;
        }
    }
    y
}

/// The host data of a prepared bias and tables.
fn prep_slices<'a, T: Real>(
    guards: &'a PrepGuards<'_>,
    what: &str,
) -> Result<[Option<&'a [T]>; 2]> {
    let [bias, cs] = guards.each_ref().map(|g| {
        g.as_ref()
            .map(|(s, l)| match &**s {
                Storage::Cpu(c) => storage_slice::<T>(c, l, what),
                _ => candle_core::bail!("{what}: inputs on different devices"),
            })
            .transpose()
    });
    Ok([bias?, cs?])
}

/// The CUDA storages of a prepared bias and tables.
#[cfg(feature = "cuda")]
type CudaPrep<'a> = [Option<(&'a candle_core::CudaStorage, &'a Layout)>; 2];

/// [`prep_slices`] on a GPU: the storages, for [`prep_views`].
#[cfg(feature = "cuda")]
fn prep_storages<'a>(guards: &'a PrepGuards<'_>, what: &str) -> Result<CudaPrep<'a>> {
    let [bias, cs] = guards.each_ref().map(|g| {
        g.as_ref()
            .map(|(s, l)| match &**s {
                Storage::Cuda(c) => Ok((c, *l)),
                _ => candle_core::bail!("{what}: inputs on different devices"),
            })
            .transpose()
    });
    Ok([bias?, cs?])
}

/// Views of a prepared bias and tables on the GPU as `T` (an error where
/// one holds another dtype).
#[cfg(feature = "cuda")]
fn prep_views<'a, T: candle_core::cuda_backend::CudaDType>(
    prep: CudaPrep<'a>,
    what: &str,
) -> Result<[Option<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>>; 2]> {
    let [bias, cs] = prep.map(|x| {
        x.map(|(s, l)| crate::cuda::view(T::as_cuda_slice(s)?, l, what))
            .transpose()
    });
    Ok([bias?, cs?])
}

/// A decode step's keys `x: [B, 1, heads · D]` (as their projection's GEMM
/// gives them) with `prep`'s bias added and rotated at each row's position,
/// in one launch on a GPU (`kernels/rope.cu`'s `rope_step`): the same shape.
pub(crate) fn rope_step(x: &Tensor, prep: RowPrep<'_>, heads: usize) -> Result<Tensor> {
    let (b, t, width) = x.dims3()?;
    if t != 1 || heads == 0 || width % heads != 0 {
        candle_core::bail!("rope step: {:?} for {heads} heads", x.dims())
    }
    let d = width / heads;
    let prep = prep.checked(b, heads, d, "rope step")?;
    if prep[1].is_none() {
        candle_core::bail!("rope step: no rotary tables")
    }
    let x = x.contiguous()?;
    let (xs, xl) = x.storage_and_layout();
    let guards = lock_prep(&prep);
    let storage = match &*xs {
        Storage::Cpu(xc) => {
            macro_rules! host {
                ($t:ty) => {{
                    let x = storage_slice::<$t>(xc, xl, "rope step")?;
                    let [bias, Some(cs)] = prep_slices::<$t>(&guards, "rope step")? else {
                        candle_core::bail!("rope step: no rotary tables")
                    };
                    let mut out = Vec::with_capacity(x.len());
                    for (r, row) in x.chunks(d).enumerate() {
                        let h = r % heads;
                        let bias = bias.map(|v| &v[h * d..(h + 1) * d]);
                        let cs = &cs[(r / heads) * d..(r / heads + 1) * d];
                        out.extend(
                            prepared_row(row, bias, Some(cs))
                                .into_iter()
                                .map(<$t>::from_f64),
                        );
                    }
                    <$t>::storage(out)
                }};
            }
            Storage::Cpu(match xc {
                CpuStorage::F32(_) => host!(f32),
                CpuStorage::F64(_) => host!(f64),
                _ => candle_core::bail!("rope step on the CPU takes f32 or f64"),
            })
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(xc) => {
            let prep = prep_storages(&guards, "rope step")?;
            Storage::Cuda(rope_step_on_gpu((xc, xl), prep, (b, heads, d))?)
        }
        _ => candle_core::bail!("rope step: no kernel for this device"),
    };
    Ok(Tensor::from_storage(
        storage,
        (b, 1, width),
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

/// [`rope_step`] by `kernels/rope.cu`, with the prepared bias (if any) and
/// tables.
#[cfg(feature = "cuda")]
fn rope_step_on_gpu(
    (x, xl): (&candle_core::CudaStorage, &Layout),
    prep: CudaPrep<'_>,
    (b, heads, d): (usize, usize, usize),
) -> Result<candle_core::CudaStorage> {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::CudaStorageSlice as S;

    use crate::cuda::{elementwise_blocks, launch, u32_arg, view, ROPE};

    let dev = x.device().clone();
    let narrow = |v: usize| u32_arg(v, "rope step");
    let (bu, hu, du) = (narrow(b)?, narrow(heads)?, narrow(d)?);
    let cfg = elementwise_blocks(b * heads * d / 2);
    let flags = prep_flags(&prep);
    macro_rules! typed {
        ($xs:expr, $t:ty, $name:expr) => {{
            let xv = view($xs, xl, "rope step keys")?;
            let [bias, Some(cs)] = prep_views::<$t>(prep, "rope step input")? else {
                candle_core::bail!("rope step: no rotary tables")
            };
            // No bias: the kernel reads none (flag 1 unset); x stands in.
            let bias = bias.as_ref().unwrap_or(&xv);
            let cs = &cs;
            // SAFETY: the kernel writes every value of every (row, head).
            let out = unsafe { dev.alloc::<$t>(b * heads * d)? };
            // rope_step_T(x, bias, cs, out, b, heads, d, flags).
            launch!(dev, ROPE, $name, cfg, &xv, bias, cs, &out, &bu, &hu, &du, &flags)?;
            candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
        }};
    }
    Ok(match &x.slice {
        S::F32(v) => typed!(v, f32, "rope_step_f32"),
        S::BF16(v) => typed!(v, half::bf16, "rope_step_bf16"),
        S::F16(v) => typed!(v, half::f16, "rope_step_f16"),
        _ => candle_core::bail!("rope step: no CUDA kernel for this dtype"),
    })
}

/// One decode step's attention: the query `q: [B, H, 1, D]` of each (batch,
/// head), with `prep`'s bias and rotation applied as it is read (the raw
/// projection, then; none: q as it is), over the whole caches `k, v: [B,
/// G, cap, D]` of its kv head (h / (H / G)), row b seeing keys `pads[b]
/// ..= last` (a one-element u32 tensor on the device, clamped to the
/// cache; no key: zeros), scores scaled by `scale`. Returns `[B, 1, H·D]`,
/// ready for the output projection; no gradient (a decode step only
/// samples).
pub(crate) fn decode_attention(
    q: &Tensor,
    prep: RowPrep<'_>,
    k: &Tensor,
    v: &Tensor,
    pads: &[usize],
    last: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (kb, g, cap, kd) = k.dims4()?;
    if t != 1 || (kb, kd) != (b, d) || v.dims() != k.dims() || g == 0 || h % g != 0 || cap == 0 {
        candle_core::bail!(
            "decode attention: q {:?} over caches {:?} and {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    if pads.len() != b || d > DECODE_ATTENTION_MAX_HEAD_DIM {
        candle_core::bail!(
            "decode attention: {} pads for {b} rows, head dim {d}",
            pads.len()
        )
    }
    let geometry = DecodeGeometry { b, h, g, cap, d };
    let prep = prep.checked(b, h, d, "decode attention")?;
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (ls, ll) = last.storage_and_layout();
    let guards = lock_prep(&prep);
    let storage = match (&*qs, &*ks, &*vs, &*ls) {
        (Storage::Cpu(qc), Storage::Cpu(kc), Storage::Cpu(vc), Storage::Cpu(lc)) => {
            let last = host_u32(lc, ll, "decode attention bound")? as usize;
            let inputs = [(qc, ql), (kc, kl), (vc, vl)];
            macro_rules! host {
                ($t:ty) => {{
                    <$t>::storage(host_decode_attention::<$t>(
                        inputs,
                        prep_slices::<$t>(&guards, "decode attention")?,
                        geometry,
                        pads,
                        last,
                        scale,
                    )?)
                }};
            }
            Storage::Cpu(match qc {
                CpuStorage::F32(_) => host!(f32),
                CpuStorage::F64(_) => host!(f64),
                _ => candle_core::bail!("decode attention on the CPU takes f32 or f64"),
            })
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(qc), Storage::Cuda(kc), Storage::Cuda(vc), Storage::Cuda(lc)) => {
            Storage::Cuda(decode_attention_on_gpu(
                [(qc, ql), (kc, kl), (vc, vl)],
                prep_storages(&guards, "decode attention")?,
                (lc, ll),
                geometry,
                pads,
                scale,
            )?)
        }
        _ => candle_core::bail!("decode attention: inputs on different devices"),
    };
    Ok(Tensor::from_storage(
        storage,
        (b, 1, h * d),
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

/// The sizes of a decode step's attention: B, heads, kv heads, cache, head dim.
#[derive(Clone, Copy)]
struct DecodeGeometry {
    b: usize,
    h: usize,
    g: usize,
    cap: usize,
    d: usize,
}

/// [`decode_attention`] on the host, summing in f64.
fn host_decode_attention<T: Real>(
    [(q, ql), (k, kl), (v, vl)]: [(&CpuStorage, &Layout); 3],
    [q_bias, cs]: [Option<&[T]>; 2],
    z: DecodeGeometry,
    pads: &[usize],
    last: usize,
    scale: f64,
) -> Result<Vec<T>> {
    let q = storage_slice::<T>(q, ql, "decode attention q")?;
    let k = storage_slice::<T>(k, kl, "decode attention keys")?;
    let v = storage_slice::<T>(v, vl, "decode attention values")?;
    let mut out = vec![T::ZERO; z.b * z.h * z.d];
    let hi = last.min(z.cap - 1);
    let mut p = Vec::with_capacity(z.cap);
    for (b, &lo) in pads.iter().enumerate().take(z.b) {
        if lo > hi {
            continue; // no key: zeros
        }
        for h in 0..z.h {
            let g = h / (z.h / z.g);
            let row = |j: usize| ((b * z.g + g) * z.cap + j) * z.d;
            let qi = (b * z.h + h) * z.d;
            let qh = prepared_row(
                &q[qi..qi + z.d],
                q_bias.map(|x| &x[h * z.d..(h + 1) * z.d]),
                cs.map(|x| &x[b * z.d..(b + 1) * z.d]),
            );
            p.clear();
            p.extend((lo..=hi).map(|j| {
                let dot: f64 = (0..z.d).map(|c| qh[c] * k[row(j) + c].to_f64()).sum();
                scale * dot
            }));
            let m = p.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = p
                .iter_mut()
                .map(|x| {
                    *x = (*x - m).exp();
                    *x
                })
                .sum();
            for c in 0..z.d {
                let acc: f64 = (lo..=hi)
                    .zip(&p)
                    .map(|(j, pj)| pj * v[row(j) + c].to_f64())
                    .sum();
                out[qi + c] = T::from_f64(acc / total);
            }
        }
    }
    Ok(out)
}

/// [`decode_attention`] by `kernels/decode_attention.cu`: a block of 8
/// warps per (head, batch element).
#[cfg(feature = "cuda")]
fn decode_attention_on_gpu(
    [(q, ql), (k, kl), (v, vl)]: [(&candle_core::CudaStorage, &Layout); 3],
    prep: CudaPrep<'_>,
    (last, ll): (&candle_core::CudaStorage, &Layout),
    z: DecodeGeometry,
    pads: &[usize],
    scale: f64,
) -> Result<candle_core::CudaStorage> {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::{CudaDType, CudaStorageSlice as S};

    use crate::cuda::{launch, upload_pads, view, DECODE_ATTENTION};

    let dev = q.device().clone();
    let too_large = || candle_core::Error::Msg("decode attention: sizes past the kernel's".into());
    let i32_of = |v: usize| i32::try_from(v).map_err(|_| too_large());
    let (heads, kv, cap, hd) = (i32_of(z.h)?, i32_of(z.g)?, i32_of(z.cap)?, i32_of(z.d)?);
    let n_pads = i32_of(pads.len())?;
    let pads = upload_pads(&dev, pads)?;
    let last = view(u32::as_cuda_slice(last)?, ll, "decode attention bound")?;
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(z.h).map_err(|_| too_large())?,
            u32::try_from(z.b).map_err(|_| too_large())?,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let scale = scale as f32;
    let flags = prep_flags(&prep);
    macro_rules! typed {
        ($qs:expr, $ks:expr, $vs:expr, $t:ty, $name:expr) => {{
            let (qv, kv_, vv) = (
                view($qs, ql, "decode q")?,
                view($ks, kl, "decode keys")?,
                view($vs, vl, "decode values")?,
            );
            let [q_bias, cs] = prep_views::<$t>(prep, "decode q bias or tables")?;
            // q stands in for what the flags leave out (never read).
            let (q_bias, cs) = (q_bias.as_ref().unwrap_or(&qv), cs.as_ref().unwrap_or(&qv));
            // SAFETY: the kernel writes all hd values of every (batch, head).
            let out = unsafe { dev.alloc::<$t>(z.b * z.h * z.d)? };
            // decode_attention_T(q, k, v, out, pads, n_pads, last, heads,
            // kv_heads, cap, hd, scale, q_bias, cs, flags): a block per
            // (head, batch element).
            launch!(
                dev,
                DECODE_ATTENTION,
                $name,
                cfg,
                &qv,
                &kv_,
                &vv,
                &out,
                &pads,
                &n_pads,
                &last,
                &heads,
                &kv,
                &cap,
                &hd,
                &scale,
                q_bias,
                cs,
                &flags
            )?;
            candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
        }};
    }
    Ok(match (&q.slice, &k.slice, &v.slice) {
        (S::F32(a), S::F32(b), S::F32(c)) => typed!(a, b, c, f32, "decode_attention_f32"),
        (S::BF16(a), S::BF16(b), S::BF16(c)) => {
            typed!(a, b, c, half::bf16, "decode_attention_bf16")
        }
        (S::F16(a), S::F16(b), S::F16(c)) => typed!(a, b, c, half::f16, "decode_attention_f16"),
        _ => candle_core::bail!("decode attention: q, k and v differ in dtype, or no kernel"),
    })
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;

    #[test]
    fn a_step_writes_its_slot_and_attends_up_to_it() {
        let dev = Device::Cpu;
        // [B = 1, kv = 1, cap = 4, hd = 2], positions 0 and 1 written.
        let cache = Tensor::new(&[[[[1f32, 1.], [2., 2.], [0., 0.], [0., 0.]]]], &dev).unwrap();
        let slot = Tensor::zeros(1, DType::U32, &dev).unwrap();
        upload(&slot, &[2]).unwrap();
        let fresh = Tensor::new(&[[[[3f32, 4.]]]], &dev).unwrap();
        write_at_slot(&cache, &fresh, &slot).unwrap();
        let rows: Vec<Vec<f32>> = cache
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        assert_eq!(rows, [[1., 1.], [2., 2.], [3., 4.], [0., 0.]]);
        // Keys 0..=2 share the mass; key 3 (not yet written) gets exactly 0,
        // and a pad of 1 hides key 0 too.
        let scores = Tensor::zeros((2, 1, 1, 4), DType::F32, &dev).unwrap();
        let p: Vec<f32> = decode_softmax(&scores, &[0, 1], &slot)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let third = 1.0 / 3.0;
        assert_eq!(p, [third, third, third, 0.0, 0.0, 0.5, 0.5, 0.0]);
    }

    #[test]
    fn decode_attention_equals_the_scores_softmax_and_product() {
        use crate::ops::tests::{max_abs_diff, rand_tensor};
        let dev = Device::Cpu;
        // B 3, 4 query heads over 2 kv heads, a cache of 6, hd 4; the bound
        // at 4 (key 5 unwritten), row 1 padded by 2, row 2 past the bound.
        let q = rand_tensor(&[3, 4, 1, 4], 1);
        let (k, v) = (rand_tensor(&[3, 2, 6, 4], 2), rand_tensor(&[3, 2, 6, 4], 3));
        let last = Tensor::zeros(1, DType::U32, &dev).unwrap();
        upload(&last, &[4]).unwrap();
        let pads = [0, 2, 5];
        let got = decode_attention(&q, RowPrep::default(), &k, &v, &pads, &last, 0.5).unwrap();
        // The materialised step: q grouped by kv head, scores, the bounded
        // softmax, the product with v, the heads side by side.
        let scores = (q
            .reshape((3, 2, 2, 4))
            .unwrap()
            .matmul(&k.t().unwrap())
            .unwrap()
            * 0.5)
            .unwrap()
            .reshape((3, 4, 1, 6))
            .unwrap();
        let p = decode_softmax(&scores, &pads, &last).unwrap();
        let want = p
            .reshape((3, 2, 2, 6))
            .unwrap()
            .matmul(&v)
            .unwrap()
            .reshape((3, 1, 16))
            .unwrap();
        assert_eq!(got.dims(), [3, 1, 16]);
        assert!(max_abs_diff(&got, &want) < 1e-12);
        // Row 2 sees no key: zeros.
        let row2: Vec<f64> = got
            .get(2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(row2.iter().all(|&x| x == 0.0));
        let e = decode_attention(&q, RowPrep::default(), &k, &v, &pads[..2], &last, 0.5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 pads for 3 rows"), "{e}");
        let e = decode_attention(&k, RowPrep::default(), &k, &v, &pads, &last, 0.5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("decode attention: q"), "{e}");
    }

    /// Row b's cos and sin `[B, 1, D]` at position `positions[b]`, and the
    /// same as candle's rope tables `[B, 1, D/2]` each.
    fn step_tables(positions: &[usize], d: usize) -> (Tensor, Tensor, Tensor) {
        let half = d / 2;
        let angle = |p: usize, j: usize| p as f64 / 10_000f64.powf(2.0 * j as f64 / d as f64);
        let table = |f: fn(f64) -> f64| -> Vec<f64> {
            positions
                .iter()
                .flat_map(|&p| (0..half).map(move |j| f(angle(p, j))))
                .collect()
        };
        let (cos, sin) = (table(f64::cos), table(f64::sin));
        let b = positions.len();
        let cs: Vec<f64> = (0..b)
            .flat_map(|i| {
                [
                    &cos[i * half..(i + 1) * half],
                    &sin[i * half..(i + 1) * half],
                ]
                .concat()
            })
            .collect();
        let dev = Device::Cpu;
        (
            Tensor::from_vec(cs, (b, 1, d), &dev).unwrap(),
            Tensor::from_vec(cos, (b, 1, half), &dev).unwrap(),
            Tensor::from_vec(sin, (b, 1, half), &dev).unwrap(),
        )
    }

    /// `x: [B, 1, heads·D]` plus `bias`, rotated by candle's rope (`[B, T,
    /// H, D]` layout): the composite the step ops replace.
    fn composite_rope(
        x: &Tensor,
        bias: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        heads: usize,
    ) -> Tensor {
        let (b, _, width) = x.dims3().unwrap();
        let y = x
            .broadcast_add(bias)
            .unwrap()
            .reshape((b, 1, heads, width / heads))
            .unwrap();
        let y = candle_nn::rotary_emb::rope_thd(&y, cos, sin).unwrap();
        y.reshape((b, 1, width)).unwrap()
    }

    #[test]
    fn rope_step_is_the_bias_then_the_rotary_embedding() {
        use crate::ops::tests::{max_abs_diff, rand_tensor};
        let (b, heads, d) = (3, 2, 8);
        let x = rand_tensor(&[b, 1, heads * d], 11);
        let bias = rand_tensor(&[heads * d], 12);
        let (cs, cos, sin) = step_tables(&[0, 7, 300], d);
        let prep = RowPrep {
            bias: Some(&bias),
            rope: Some(&cs),
        };
        let got = rope_step(&x, prep, heads).unwrap();
        let want = composite_rope(&x, &bias, &cos, &sin, heads);
        assert_eq!(got.dims(), [b, 1, heads * d]);
        assert!(max_abs_diff(&got, &want) < 1e-12);
        let zero = bias.zeros_like().unwrap();
        let plain = RowPrep {
            bias: None,
            rope: Some(&cs),
        };
        let got = rope_step(&x, plain, heads).unwrap();
        assert!(max_abs_diff(&got, &composite_rope(&x, &zero, &cos, &sin, heads)) < 1e-12);
        let e = rope_step(&x, RowPrep::default(), heads)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no rotary tables"), "{e}");
        let e = rope_step(&x, prep, 3).unwrap_err().to_string();
        assert!(e.contains("for 3 heads"), "{e}");
    }

    #[test]
    fn decode_attention_of_a_raw_query_equals_attention_of_the_prepared_one() {
        use crate::ops::tests::{max_abs_diff, rand_tensor};
        let dev = Device::Cpu;
        let (b, heads, d) = (2, 4, 8);
        let q = rand_tensor(&[b, 1, heads * d], 21);
        let bias = rand_tensor(&[heads * d], 22);
        let (k, v) = (
            rand_tensor(&[b, 2, 5, d], 23),
            rand_tensor(&[b, 2, 5, d], 24),
        );
        let (cs, cos, sin) = step_tables(&[4, 9], d);
        let last = Tensor::zeros(1, DType::U32, &dev).unwrap();
        upload(&last, &[3]).unwrap();
        let heads_of = |x: &Tensor| {
            x.reshape((b, 1, heads, d))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
        };
        let prep = RowPrep {
            bias: Some(&bias),
            rope: Some(&cs),
        };
        let got = decode_attention(&heads_of(&q), prep, &k, &v, &[0, 1], &last, 0.3).unwrap();
        let prepared = heads_of(&composite_rope(&q, &bias, &cos, &sin, heads));
        let want =
            decode_attention(&prepared, RowPrep::default(), &k, &v, &[0, 1], &last, 0.3).unwrap();
        assert!(max_abs_diff(&got, &want) < 1e-12);
        let short = bias.narrow(0, 0, d).unwrap();
        let bad = RowPrep {
            bias: Some(&short),
            rope: Some(&cs),
        };
        let e = decode_attention(&heads_of(&q), bad, &k, &v, &[0, 1], &last, 0.3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a bias of [8] for 4 heads"), "{e}");
    }

    #[test]
    fn bad_steps_are_errors_naming_the_problem() {
        let dev = Device::Cpu;
        let slot = Tensor::zeros(1, DType::U32, &dev).unwrap();
        let e = upload(&slot, &[1, 2]).unwrap_err().to_string();
        assert!(e.contains("2 values into 1"), "{e}");
        let cache = Tensor::zeros((1, 1, 4, 2), DType::F32, &dev).unwrap();
        upload(&slot, &[4]).unwrap();
        let fresh = Tensor::zeros((1, 1, 1, 2), DType::F32, &dev).unwrap();
        let e = write_at_slot(&cache, &fresh, &slot)
            .unwrap_err()
            .to_string();
        assert!(e.contains("slot 4 past a cache of 4"), "{e}");
        let wide = Tensor::zeros((1, 1, 1, 3), DType::F32, &dev).unwrap();
        let e = write_at_slot(&cache, &wide, &slot).unwrap_err().to_string();
        assert!(e.contains("kv write"), "{e}");
        let scores = Tensor::zeros((2, 1, 1, 4), DType::F32, &dev).unwrap();
        let e = decode_softmax(&scores, &[0], &slot)
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 pads"), "{e}");
    }
}
