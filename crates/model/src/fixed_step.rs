//! The ops of a fixed-shape decode step: one whose varying inputs (the
//! tokens, their positions, the cache slot they are written to) live in
//! device memory and are rewritten in place before each step, so that every
//! launch of one step is also a launch of the next and a CUDA graph captured
//! once can replay them ([`crate::graph_decode`]).
//!
//! - [`upload`]: host values into an existing u32 tensor, in place;
//! - [`write_at_slot`]: a step's keys or values into a KV cache at the
//!   position a u32 tensor holds (`kernels/kv_cache.cu`);
//! - [`decode_softmax`]: attention probabilities over a whole cache, each
//!   row seeing keys `pads[b] ..= last` with `last` read from a tensor
//!   (`kernels/softmax.cu`).
//!
//! Each runs on the CPU too (f32/f64 for the softmax), so the decoder that
//! uses them is tested on every machine.

use candle_core::{CpuStorage, CustomOp2, InplaceOp1, InplaceOp3, Layout, Result, Shape, Tensor};

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
