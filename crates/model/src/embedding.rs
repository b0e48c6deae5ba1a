//! The token embedding as one op with its own backward, for a GPU.
//!
//! candle's `index_select` differentiates through `index_add`, whose CUDA
//! kernel gives the whole table's gradient to one block that walks every
//! token in turn and adds in the storage type: slow for a batch of
//! thousands of tokens, and in bf16 a prompt repeated across the batch
//! rounds its row's sum at every term. [`Embedding`]'s backward
//! ([`EmbeddingGrad`], `kernels/embedding.cu`) sums each id's rows in token
//! order in f32 and writes each touched row once. The CPU versions compute
//! the same contract (the sum in f64) and are what the op is tested
//! against; the model uses the op on a GPU only.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::kernels::Real;
use crate::ops::contiguous_slice;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// `w[ids]`: rows `[n, d]` of the table `w: [V, d]` for `ids: [n]` (u32).
struct Embedding;

/// The gradient of [`Embedding`]'s table: inputs `(g: [n, d], ids: [n])`,
/// output `[vocab, d]` with row `i` the sum, in token order, of the rows of
/// `g` whose id is `i` (zero for ids no token has).
struct EmbeddingGrad {
    vocab: usize,
}

/// The u32 ids of a contiguous CPU input.
fn host_ids<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [u32]> {
    let CpuStorage::U32(v) = s else {
        candle_core::bail!("embedding: ids must be u32")
    };
    contiguous_slice(v, l)
}

/// A contiguous CPU float input as `T`, or `None` for another type.
fn host_rows<'a, T: Real>(s: &'a CpuStorage, l: &Layout) -> Result<Option<&'a [T]>> {
    T::slice(s).map(|v| contiguous_slice(v, l)).transpose()
}

fn gather<T: Real>(w: &[T], ids: &[u32], d: usize) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(ids.len() * d);
    for &id in ids {
        let Some(row) = w.get(id as usize * d..(id as usize + 1) * d) else {
            candle_core::bail!(
                "embedding: id {id} is past the table's {} rows",
                w.len() / d
            )
        };
        out.extend_from_slice(row);
    }
    Ok(out)
}

fn scatter_sum<T: Real>(g: &[T], ids: &[u32], vocab: usize, d: usize) -> Vec<T> {
    let mut sum = vec![0f64; vocab * d];
    for (k, &id) in ids.iter().enumerate() {
        if (id as usize) < vocab {
            for (s, x) in sum[id as usize * d..][..d].iter_mut().zip(&g[k * d..][..d]) {
                *s += x.to_f64();
            }
        }
    }
    sum.into_iter().map(T::from_f64).collect()
}

impl CustomOp2 for Embedding {
    fn name(&self) -> &'static str {
        "agentrl-embedding"
    }

    fn cpu_fwd(
        &self,
        ws: &CpuStorage,
        wl: &Layout,
        is: &CpuStorage,
        il: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, d) = wl.shape().dims2()?;
        let ids = host_ids(is, il)?;
        let shape = Shape::from((ids.len(), d));
        if let Some(w) = host_rows::<f32>(ws, wl)? {
            return Ok((f32::storage(gather(w, ids, d)?), shape));
        }
        if let Some(w) = host_rows::<f64>(ws, wl)? {
            return Ok((f64::storage(gather(w, ids, d)?), shape));
        }
        candle_core::bail!("embedding: f32/f64 tables only on the CPU")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        ws: &CudaStorage,
        wl: &Layout,
        is: &CudaStorage,
        il: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (_, d) = wl.shape().dims2()?;
        let n = il.shape().elem_count();
        Ok((on_gpu::gather(ws, wl, is, il)?, Shape::from((n, d))))
    }

    fn bwd(
        &self,
        w: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = EmbeddingGrad { vocab: w.dim(0)? };
        let dw = grad_res.contiguous()?.apply_op2_no_bwd(ids, &grad)?;
        Ok((Some(dw), None))
    }
}

impl CustomOp2 for EmbeddingGrad {
    fn name(&self) -> &'static str {
        "agentrl-embedding-grad"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        is: &CpuStorage,
        il: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, d) = gl.shape().dims2()?;
        let ids = host_ids(is, il)?;
        let shape = Shape::from((self.vocab, d));
        if let Some(g) = host_rows::<f32>(gs, gl)? {
            return Ok((f32::storage(scatter_sum(g, ids, self.vocab, d)), shape));
        }
        if let Some(g) = host_rows::<f64>(gs, gl)? {
            return Ok((f64::storage(scatter_sum(g, ids, self.vocab, d)), shape));
        }
        candle_core::bail!("embedding gradient: f32/f64 only on the CPU")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gs: &CudaStorage,
        gl: &Layout,
        is: &CudaStorage,
        il: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (_, d) = gl.shape().dims2()?;
        let out = on_gpu::scatter_sum(gs, gl, is, il, self.vocab)?;
        Ok((out, Shape::from((self.vocab, d))))
    }
}

/// The most columns `embedding_bwd` takes: 32 per thread of a 256-thread block.
const MAX_GPU_WIDTH: usize = 32 * 256;

/// The rows of `table: [V, d]` for `ids` (u32, any shape), `[ids.len(), d]`,
/// differentiably as [`Embedding`] on a CUDA device; `None` elsewhere (the
/// caller uses candle's `index_select`).
pub(crate) fn embedding(table: &Tensor, ids: &Tensor) -> Option<Result<Tensor>> {
    let fits = table.device().is_cuda()
        && table.rank() == 2
        && table.is_contiguous()
        && table.dim(1).is_ok_and(|d| d <= MAX_GPU_WIDTH)
        && ids.dtype() == candle_core::DType::U32;
    fits.then(|| {
        let ids = ids.flatten_all()?.contiguous()?;
        table.apply_op2(&ids, Embedding)
    })
}

/// [`Embedding`] and [`EmbeddingGrad`] by the kernels of `kernels/embedding.cu`.
#[cfg(feature = "cuda")]
mod on_gpu {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, LaunchConfig, ValidAsZeroBits,
    };
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    use crate::cuda::{elementwise_blocks, launch, on_float_slice, view, EMBEDDING};

    fn as_u32(v: usize, what: &str) -> Result<u32> {
        u32::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("embedding: {what} {v} is too large")))
    }

    pub fn gather(
        ws: &CudaStorage,
        wl: &Layout,
        is: &CudaStorage,
        il: &Layout,
    ) -> Result<CudaStorage> {
        let dev = ws.device();
        let ids = view(is.as_cuda_slice::<u32>()?, il, "embedding ids")?;
        on_float_slice!(&ws.slice, "embedding", |w, suffix| {
            gather_typed(dev, suffix, (w, wl), &ids, il.shape().elem_count())
        })
    }

    fn gather_typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        (w, wl): (&CudaSlice<T>, &Layout),
        ids: &CudaView<'_, u32>,
        n: usize,
    ) -> Result<CudaStorage> {
        let (v, d) = wl.shape().dims2()?;
        let w = view(w, wl, "embedding table")?;
        // SAFETY: the kernel writes all n·d values.
        let out = unsafe { dev.alloc::<T>(n * d)? };
        let (n64, d32, v32) = (n as u64, as_u32(d, "width")?, as_u32(v, "vocabulary")?);
        // embedding_fwd_T(w, ids, out, n, d, v): grid-strided over n·d.
        launch!(
            dev,
            EMBEDDING,
            &format!("embedding_fwd_{suffix}"),
            elementwise_blocks(n * d),
            &w,
            ids,
            &out,
            &n64,
            &d32,
            &v32
        )?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    pub fn scatter_sum(
        gs: &CudaStorage,
        gl: &Layout,
        is: &CudaStorage,
        il: &Layout,
        vocab: usize,
    ) -> Result<CudaStorage> {
        let dev = gs.device();
        let ids = view(is.as_cuda_slice::<u32>()?, il, "embedding ids")?;
        on_float_slice!(&gs.slice, "embedding gradient", |g, suffix| {
            scatter_typed(dev, suffix, (g, gl), &ids, vocab)
        })
    }

    fn scatter_typed<T: DeviceRepr + CudaDType + ValidAsZeroBits>(
        dev: &CudaDevice,
        suffix: &str,
        (g, gl): (&CudaSlice<T>, &Layout),
        ids: &CudaView<'_, u32>,
        vocab: usize,
    ) -> Result<CudaStorage> {
        let (n, d) = gl.shape().dims2()?;
        let g = view(g, gl, "embedding gradient")?;
        // Rows of ids no token has stay zero.
        let dw = dev.alloc_zeros::<T>(vocab * d)?;
        if n > 0 {
            let (n32, d32, v32) = (
                as_u32(n, "token count")?,
                as_u32(d, "width")?,
                as_u32(vocab, "vocabulary")?,
            );
            // embedding_bwd_T(ids, g, dw, n, d, v): one block of 256 per
            // token (d ≤ 32 · 256, checked by `embedding`).
            let cfg = LaunchConfig {
                grid_dim: (n32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                dev,
                EMBEDDING,
                &format!("embedding_bwd_{suffix}"),
                cfg,
                ids,
                &g,
                &dw,
                &n32,
                &d32,
                &v32
            )?;
        }
        Ok(CudaStorage::wrap_cuda_slice(dw, dev.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{max_abs_diff, weighted_grad};
    use candle_core::{DType, Device, Var};

    /// The op's forward and gradient against candle's `index_select`, whose
    /// backward is `index_add`, on a batch with repeated ids.
    #[test]
    fn embedding_op_and_its_gradient_match_index_select() {
        let dev = Device::Cpu;
        let (v, d) = (11usize, 6usize);
        let table: Vec<f64> = (0..v * d).map(|i| (i as f64 * 0.37).sin()).collect();
        let w = Var::from_tensor(&Tensor::from_vec(table, (v, d), &dev).unwrap()).unwrap();
        let ids = Tensor::new(&[3u32, 7, 3, 0, 10, 3, 7], &dev).unwrap();
        let weights: Vec<f64> = (0..7 * d).map(|i| (i as f64 * 0.11).cos()).collect();
        let weights = Tensor::from_vec(weights, (7, d), &dev).unwrap();
        let ours = w.as_tensor().apply_op2(&ids, Embedding).unwrap();
        let theirs = w.as_tensor().index_select(&ids, 0).unwrap();
        assert_eq!(max_abs_diff(&ours, &theirs), 0.0);
        let go = weighted_grad(&ours, &weights, &w);
        let gt = weighted_grad(&theirs, &weights, &w);
        assert_eq!(go.dims(), &[v, d]);
        assert!(max_abs_diff(&go, &gt) < 1e-12);
        // Row 3 sums three tokens' weights; row 1 has none.
        assert!(
            go.get(1)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
                == 0.0
        );
    }

    #[test]
    fn an_id_past_the_table_is_refused_by_name() {
        let w = Tensor::zeros((4, 3), DType::F32, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[1u32, 9], &Device::Cpu).unwrap();
        let err = w.apply_op2(&ids, Embedding).unwrap_err().to_string();
        assert!(err.contains("id 9 is past the table's 4 rows"), "{err}");
    }

    #[test]
    fn the_model_uses_the_op_on_a_gpu_only() {
        let w = Tensor::zeros((4, 3), DType::F32, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[1u32], &Device::Cpu).unwrap();
        assert!(embedding(&w, &ids).is_none());
    }
}
