//! A projection's bias, `y + b` over the rows of `y`, as one op whose
//! gradient for `b` (the column sums of the output's gradient) is summed in
//! f32 whatever the storage type.
//!
//! As candle's `broadcast_add`, the forward read `b` through a broadcast
//! view and the backward summed the gradient with candle's reduction, which
//! adds in the storage type: in bf16 a q/k/v bias's gradient, a sum over
//! every token of the batch, rounded to 8 bits at each step. On a GPU
//! `kernels/bias.cu` sums rows in chunks into f32 partials and then the
//! partials in chunk order (no atomics, the same bits every run); on the
//! host the sums are f64.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use crate::host::storage_slice;
use crate::kernels::Real;

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// Rows a block of the column-sum kernel adds up before the partials' pass.
#[cfg(feature = "cuda")]
const ROWS_PER_CHUNK: usize = 64;

/// `y: [m, n]` plus `b: [n]` on every row, differentiably; candle's
/// `broadcast_add` where the op has no kernel (other dtypes on the host).
pub fn add_bias(y: &Tensor, b: &Tensor) -> Result<Tensor> {
    let y = y.contiguous()?;
    let (_, n) = y.dims2()?;
    if !crate::ops::fused_or_gpu_ok(&y) || b.dims() != [n] || b.dtype() != y.dtype() {
        return y.broadcast_add(b);
    }
    y.apply_op2(&b.contiguous()?, BiasAdd)
}

/// `[m, n] + [n]`.
struct BiasAdd;

/// The column sums `[n]` of a contiguous `[m, n]` (no gradient).
struct ColumnSums;

fn host_bias_add<T: Real>(y: &[T], b: &[T]) -> Vec<T> {
    y.chunks(b.len().max(1))
        .flat_map(|row| row.iter().zip(b).map(|(&a, &c)| a + c))
        .collect()
}

fn host_column_sums<T: Real>(g: &[T], n: usize) -> Vec<T> {
    let mut sums = vec![0f64; n];
    for row in g.chunks(n.max(1)) {
        for (s, &x) in sums.iter_mut().zip(row) {
            *s += x.to_f64();
        }
    }
    sums.into_iter().map(T::from_f64).collect()
}

impl CustomOp2 for BiasAdd {
    fn name(&self) -> &'static str {
        "agentrl-bias-add"
    }

    fn cpu_fwd(
        &self,
        ys: &CpuStorage,
        yl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match ys {
            CpuStorage::F32(_) => f32::storage(host_bias_add(
                storage_slice::<f32>(ys, yl, "bias input")?,
                storage_slice::<f32>(bs, bl, "bias")?,
            )),
            CpuStorage::F64(_) => f64::storage(host_bias_add(
                storage_slice::<f64>(ys, yl, "bias input")?,
                storage_slice::<f64>(bs, bl, "bias")?,
            )),
            _ => candle_core::bail!("bias add on the host: f32 or f64"),
        };
        Ok((out, yl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        ys: &CudaStorage,
        yl: &Layout,
        bs: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        Ok((gpu::bias_add((ys, yl), (bs, bl))?, yl.shape().clone()))
    }

    fn bwd(
        &self,
        _y: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let db = grad.contiguous()?.apply_op1_no_bwd(&ColumnSums)?;
        Ok((Some(grad.clone()), Some(db)))
    }
}

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "agentrl-column-sums"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, n) = l.shape().dims2()?;
        let out = match s {
            CpuStorage::F32(_) => f32::storage(host_column_sums(
                storage_slice::<f32>(s, l, "column sums")?,
                n,
            )),
            CpuStorage::F64(_) => f64::storage(host_column_sums(
                storage_slice::<f64>(s, l, "column sums")?,
                n,
            )),
            _ => candle_core::bail!("column sums on the host: f32 or f64"),
        };
        Ok((out, Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (_, n) = l.shape().dims2()?;
        Ok((gpu::column_sums(s, l)?, Shape::from(n)))
    }
}

/// The ops by `kernels/bias.cu`.
#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    use super::ROWS_PER_CHUNK;
    use crate::cuda::{elementwise_blocks, launch, on_float_slice, view, BIAS};
    use candle_core::backend::BackendStorage;

    fn too_large(what: &str) -> candle_core::Error {
        candle_core::Error::Msg(format!("{what}: sizes past the kernel's"))
    }

    pub fn bias_add(
        (y, yl): (&CudaStorage, &Layout),
        (b, bl): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let dev = y.device().clone();
        on_float_slice!(&y.slice, "bias add", |v, suffix| {
            add_typed(&dev, suffix, (v, yl), (b, bl))
        })
    }

    fn add_typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        (y, yl): (&CudaSlice<T>, &Layout),
        (b, bl): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let (m, n) = yl.shape().dims2()?;
        let y = view(y, yl, "bias input")?;
        let b = view(T::as_cuda_slice(b)?, bl, "bias")?;
        let (count, cols) = (
            (m * n) as u64,
            u32::try_from(n).map_err(|_| too_large("bias add"))?,
        );
        // SAFETY: the kernel writes every one of the m·n elements.
        let out = unsafe { dev.alloc::<T>(m * n)? };
        // bias_add_T(y, b, out, n, cols): grid-strided over the elements.
        launch!(
            dev,
            BIAS,
            &format!("bias_add_{suffix}"),
            elementwise_blocks(m * n),
            &y,
            &b,
            &out,
            &count,
            &cols
        )?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    pub fn column_sums(g: &CudaStorage, gl: &Layout) -> Result<CudaStorage> {
        let dev = g.device().clone();
        on_float_slice!(&g.slice, "column sums", |v, suffix| {
            sums_typed(&dev, suffix, (v, gl))
        })
    }

    fn sums_typed<T: DeviceRepr + CudaDType>(
        dev: &CudaDevice,
        suffix: &str,
        (g, gl): (&CudaSlice<T>, &Layout),
    ) -> Result<CudaStorage> {
        let (m, n) = gl.shape().dims2()?;
        let g = view(g, gl, "column sums input")?;
        let chunks = m.div_ceil(ROWS_PER_CHUNK).max(1);
        let i32_of = |v: usize| i32::try_from(v).map_err(|_| too_large("column sums"));
        let (rows, cols, per, chunks32) = (
            i32_of(m)?,
            i32_of(n)?,
            i32_of(ROWS_PER_CHUNK)?,
            i32_of(chunks)?,
        );
        let col_blocks = u32::try_from(n.div_ceil(256)).map_err(|_| too_large("column sums"))?;
        // SAFETY: block (c, k) writes partial[c · n + j] for its 256 columns
        // j < n, every chunk c; the finish writes each of the n sums.
        let partial = unsafe { dev.alloc::<f32>(chunks * n)? };
        let out = unsafe { dev.alloc::<T>(n)? };
        // column_sums_partial_T(g, partial, rows, cols, per).
        launch!(
            dev,
            BIAS,
            &format!("column_sums_partial_{suffix}"),
            LaunchConfig {
                grid_dim: (chunks32 as u32, col_blocks, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            },
            &g,
            &partial,
            &rows,
            &cols,
            &per
        )?;
        // column_sums_finish_T(partial, out, chunks, cols): a thread a column.
        launch!(
            dev,
            BIAS,
            &format!("column_sums_finish_{suffix}"),
            LaunchConfig {
                grid_dim: (col_blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            },
            &partial,
            &out,
            &chunks32,
            &cols
        )?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{max_abs_diff, rand_tensor, weighted_grad};
    use candle_core::{DType, Var};

    #[test]
    fn bias_add_and_its_gradients_match_broadcast_add() {
        let y = Var::from_tensor(&rand_tensor(&[7, 5], 1)).unwrap();
        let b = Var::from_tensor(&rand_tensor(&[5], 2)).unwrap();
        let w = rand_tensor(&[7, 5], 3);
        let got = add_bias(&y, &b).unwrap();
        let want = y.broadcast_add(&b).unwrap();
        assert!(max_abs_diff(&got, &want) < 1e-15);
        for x in [&y, &b] {
            let d = max_abs_diff(&weighted_grad(&got, &w, x), &weighted_grad(&want, &w, x));
            assert!(d < 1e-12, "gradient off by {d}");
        }
    }

    #[test]
    fn other_shapes_and_dtypes_fall_back_to_broadcast_add() {
        let y = rand_tensor(&[3, 4], 1).to_dtype(DType::BF16).unwrap();
        let b = rand_tensor(&[4], 2).to_dtype(DType::BF16).unwrap();
        let got = add_bias(&y, &b).unwrap();
        assert_eq!(got.dtype(), DType::BF16);
        assert_eq!(got.dims(), [3, 4]);
        let e = add_bias(&rand_tensor(&[3, 4], 1), &rand_tensor(&[3], 2)).unwrap_err();
        assert!(e.to_string().contains("shape"), "{e}");
    }
}
