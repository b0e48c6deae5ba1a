//! Keys and values a sequence keeps on the model's device between graph
//! decoder calls ([`crate::graph_decode`]), so a multi-turn dialogue
//! encodes only what a turn adds there too.
//!
//! A call's batch caches (`[B, kv, capacity, hd]` per layer) outlive it:
//! each sequence's [`crate::SequenceCache`] points at its row of them
//! ([`BatchRow`]). The next call copies each reused prefix from there into
//! its own batch caches in one launch per tensor ([`copy_rows`],
//! `kernels/kv_cache.cu`), then encodes the rest. A call's batch caches
//! are freed once no sequence points at them.

use std::sync::Arc;

use candle_core::{CpuStorage, DType, Device, InplaceOp2, Layout, Result, Tensor};

use crate::qwen2::LayerKvCache;

/// Where a sequence's keys and values sit in the batch caches of the call
/// that last encoded it: row `row`, position 0 at slot `start`.
#[derive(Debug, Clone)]
pub(crate) struct BatchRow {
    /// That call's caches, one per layer.
    pub layers: Arc<Vec<LayerKvCache>>,
    pub row: usize,
    pub start: usize,
}

impl BatchRow {
    /// Whether this row can serve a model of `layers` layers with this
    /// kv geometry, dtype and device (a cache filled by another model is
    /// not reused).
    pub(crate) fn serves(
        &self,
        layers: usize,
        kv_hd: (usize, usize),
        dtype: DType,
        dev: &Device,
    ) -> bool {
        self.layers.len() == layers
            && self.layers.iter().all(|c| {
                let (k, _) = c.tensors();
                let dims = k.dims();
                k.dtype() == dtype
                    && k.device().same_device(dev)
                    && dims.len() == 4
                    && (dims[1], dims[3]) == kv_hd
                    && self.row < dims[0]
            })
    }
}

/// One run of cached positions moved between batch caches: `len`
/// positions of every kv head from slot `src_slot` of row `src_row` to
/// slot `dst_slot` of row `dst_row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowCopy {
    pub dst_row: usize,
    pub dst_slot: usize,
    pub src_row: usize,
    pub src_slot: usize,
    pub len: usize,
}

/// `dst, src: [rows, kv, cap, hd]` (each its own rows and capacity, the
/// same kv and hd) and the copies between them, checked to stay inside both.
struct CopyRows<'a>(&'a [RowCopy]);

/// (kv, hd, dst rows, dst cap, src rows, src cap), or the error naming the mismatch.
fn copy_geometry(dl: &Layout, sl: &Layout, copies: &[RowCopy]) -> Result<[usize; 6]> {
    let ([db, dkv, dcap, dhd], [sb, skv, scap, shd]) = (dl.dims(), sl.dims()) else {
        candle_core::bail!("kv copy: caches {:?} and {:?}", dl.dims(), sl.dims())
    };
    if (dkv, dhd) != (skv, shd) {
        candle_core::bail!("kv copy: caches {:?} and {:?}", dl.dims(), sl.dims())
    }
    for c in copies {
        let inside = |row: usize, slot: usize, rows: usize, cap: usize| {
            row < rows && slot.checked_add(c.len).is_some_and(|end| end <= cap)
        };
        if !inside(c.dst_row, c.dst_slot, *db, *dcap) || !inside(c.src_row, c.src_slot, *sb, *scap)
        {
            candle_core::bail!(
                "kv copy: {c:?} outside caches {:?} and {:?}",
                dl.dims(),
                sl.dims()
            )
        }
    }
    Ok([*dkv, *dhd, *db, *dcap, *sb, *scap])
}

/// The copies on host data (`dst`, `src` contiguous from their starts).
fn copy_on_host<T: Copy>(
    dst: &mut [T],
    src: &[T],
    copies: &[RowCopy],
    [kv, hd, _, dcap, _, scap]: [usize; 6],
) {
    for c in copies {
        for h in 0..kv {
            let to = ((c.dst_row * kv + h) * dcap + c.dst_slot) * hd;
            let from = ((c.src_row * kv + h) * scap + c.src_slot) * hd;
            dst[to..to + c.len * hd].copy_from_slice(&src[from..from + c.len * hd]);
        }
    }
}

impl InplaceOp2 for CopyRows<'_> {
    fn name(&self) -> &'static str {
        "agentrl-kv-copy"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
    ) -> Result<()> {
        let geometry = copy_geometry(dl, sl, self.0)?;
        let (Some((d0, d1)), Some((s0, s1))) = (dl.contiguous_offsets(), sl.contiguous_offsets())
        else {
            candle_core::bail!("kv copy: the caches must be contiguous")
        };
        macro_rules! copy {
            ($($variant:ident),+) => {
                match (dst, src) {
                    $((CpuStorage::$variant(d), CpuStorage::$variant(s)) => {
                        copy_on_host(&mut d[d0..d1], &s[s0..s1], self.0, geometry)
                    })+
                    _ => candle_core::bail!("kv copy: the caches differ in dtype"),
                }
            };
        }
        copy!(F32, F64, BF16, F16);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        src: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> Result<()> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::CudaStorageSlice as S;

        let geometry = copy_geometry(dl, sl, self.0)?;
        if self.0.is_empty() {
            return Ok(());
        }
        let dev = dst.device().clone();
        match (&mut dst.slice, &src.slice) {
            (S::F32(d), S::F32(s)) => {
                copy_on_gpu(&dev, "kv_copy_rows_f32", (d, dl), (s, sl), self.0, geometry)
            }
            (S::BF16(d), S::BF16(s)) => copy_on_gpu(
                &dev,
                "kv_copy_rows_bf16",
                (d, dl),
                (s, sl),
                self.0,
                geometry,
            ),
            (S::F16(d), S::F16(s)) => {
                copy_on_gpu(&dev, "kv_copy_rows_f16", (d, dl), (s, sl), self.0, geometry)
            }
            _ => candle_core::bail!("kv copy: the caches differ in dtype, or no kernel"),
        }
    }
}

/// `kernels/kv_cache.cu`'s `kv_copy_rows_T`: one launch for every copy.
#[cfg(feature = "cuda")]
fn copy_on_gpu<T: candle_core::cuda_backend::cudarc::driver::DeviceRepr>(
    dev: &candle_core::CudaDevice,
    kernel: &str,
    (dst, dl): (
        &mut candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        &Layout,
    ),
    (src, sl): (
        &candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        &Layout,
    ),
    copies: &[RowCopy],
    [kv, hd, _, dcap, _, scap]: [usize; 6],
) -> Result<()> {
    use crate::cuda::{launch, u32_arg, view, KV_CACHE};
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    let Some((d0, d1)) = dl.contiguous_offsets() else {
        candle_core::bail!("kv copy: the caches must be contiguous")
    };
    let narrow = |x: usize| u32_arg(x, "kv copy");
    let mut table = Vec::with_capacity(5 * copies.len());
    for c in copies {
        for x in [c.dst_row, c.dst_slot, c.src_row, c.src_slot, c.len] {
            table.push(narrow(x)?);
        }
    }
    // One grid row per copy: the y dimension holds 65,535.
    if copies.len() > 65_535 {
        candle_core::bail!(
            "kv copy: {} copies in one launch (at most 65,535)",
            copies.len()
        )
    }
    let n = narrow(copies.len())?;
    let table = dev.clone_htod(&table)?;
    let mut dst = dst.slice_mut(d0..d1);
    let src = view(src, sl, "kv copy source")?;
    let longest = copies.iter().map(|c| c.len).max().unwrap_or(0);
    // Blocks of 256 threads over the longest copy's kv · len · hd values
    // (grid-strided past 1024 blocks), one grid row per copy.
    let blocks = (kv * longest * hd).div_ceil(256).clamp(1, 1024) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, n, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let (kv, hd, dcap, scap) = (narrow(kv)?, narrow(hd)?, narrow(dcap)?, narrow(scap)?);
    // kv_copy_rows_T(dst, src, copies, kv, dst_cap, src_cap, hd).
    launch!(dev, KV_CACHE, kernel, cfg, &mut dst, &src, &table, &kv, &dcap, &scap, &hd)
}

/// Copies each run of `copies` from `src` into `dst` (both `[rows, kv,
/// cap, hd]` caches on one device, of one dtype), in place.
pub(crate) fn copy_rows(dst: &Tensor, src: &Tensor, copies: &[RowCopy]) -> Result<()> {
    dst.inplace_op2(src, &CopyRows(copies))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_move_every_head_of_their_runs_and_nothing_else() {
        let (kv, hd) = (2, 3);
        let src = Tensor::arange(0f32, (3 * kv * 5 * hd) as f32, &Device::Cpu)
            .unwrap()
            .reshape((3, kv, 5, hd))
            .unwrap();
        let dst = Tensor::full(-1f32, (2, kv, 7, hd), &Device::Cpu).unwrap();
        let copies = [
            RowCopy {
                dst_row: 0,
                dst_slot: 4,
                src_row: 2,
                src_slot: 1,
                len: 3,
            },
            RowCopy {
                dst_row: 1,
                dst_slot: 0,
                src_row: 0,
                src_slot: 0,
                len: 1,
            },
        ];
        copy_rows(&dst, &src, &copies).unwrap();
        let d: Vec<Vec<Vec<Vec<f32>>>> = (0..2)
            .map(|r| dst.get(r).unwrap().to_vec3::<f32>().unwrap())
            .collect();
        let s: Vec<Vec<Vec<Vec<f32>>>> = (0..3)
            .map(|r| src.get(r).unwrap().to_vec3::<f32>().unwrap())
            .collect();
        for (r, row) in d.iter().enumerate() {
            for (h, head) in row.iter().enumerate() {
                for (p, pos) in head.iter().enumerate() {
                    let want = match (r, p) {
                        (0, 4..=6) => s[2][h][p - 3].clone(),
                        (1, 0) => s[0][h][0].clone(),
                        _ => vec![-1.0; hd],
                    };
                    assert_eq!(pos, &want, "row {r} head {h} slot {p}");
                }
            }
        }
    }

    #[test]
    fn a_copy_past_either_cache_is_an_error_naming_it() {
        let src = Tensor::zeros((1, 2, 5, 4), DType::F32, &Device::Cpu).unwrap();
        let dst = Tensor::zeros((2, 2, 6, 4), DType::F32, &Device::Cpu).unwrap();
        for bad in [
            RowCopy {
                dst_row: 2,
                dst_slot: 0,
                src_row: 0,
                src_slot: 0,
                len: 1,
            },
            RowCopy {
                dst_row: 0,
                dst_slot: 3,
                src_row: 0,
                src_slot: 0,
                len: 4,
            },
            RowCopy {
                dst_row: 0,
                dst_slot: 0,
                src_row: 1,
                src_slot: 0,
                len: 1,
            },
            RowCopy {
                dst_row: 0,
                dst_slot: 0,
                src_row: 0,
                src_slot: 2,
                len: 4,
            },
        ] {
            let err = copy_rows(&dst, &src, &[bad]).unwrap_err().to_string();
            assert!(err.contains("outside caches"), "{bad:?}: {err}");
        }
        let other = Tensor::zeros((1, 1, 5, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(copy_rows(&dst, &other, &[]).is_err(), "kv heads differ");
        let bf16 = Tensor::zeros((1, 2, 5, 4), DType::BF16, &Device::Cpu).unwrap();
        assert!(copy_rows(&dst, &bf16, &[]).is_err(), "dtypes differ");
    }
}
