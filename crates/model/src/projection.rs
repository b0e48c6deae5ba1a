//! `x · wᵀ`, the product of every projection, as one op whose weight
//! gradient comes out in the weight's own layout.
//!
//! Built from candle's `matmul` of `w.t()`, the weight's gradient is the
//! gradient of the transposed view, `xᵀ · g` (`[in, out]`), which autograd
//! then transposes back: a strided copy of every weight-sized gradient
//! each step (on a GPU an uncoalesced kernel per weight, the LM head's
//! `[V, d]` among them). [`Projection`]'s backward asks the GEMM for
//! `gᵀ · x` (`[out, in]`) directly; the GEMM reads transposed operands
//! through their strides, so nothing is copied. The forward is the same
//! call as before, on any device.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// `x: [m, k]` times `w: [n, k]` transposed: `[m, n]`.
struct Projection;

/// `(m, n, k)` of a projection, or why the shapes do not make one.
fn sizes(xl: &Layout, wl: &Layout) -> Result<(usize, usize, usize)> {
    let (m, k) = xl.shape().dims2()?;
    let (n, k_w) = wl.shape().dims2()?;
    if k != k_w {
        candle_core::bail!("projection: input [{m}, {k}] against weight [{n}, {k_w}]")
    }
    Ok((m, n, k))
}

/// The product on any backend: the storage's own GEMM, with the weight's
/// layout transposed (a view, as `w.t()` is).
fn product<S: BackendStorage>(x: &S, xl: &Layout, w: &S, wl: &Layout) -> Result<(S, Shape)> {
    let (m, n, k) = sizes(xl, wl)?;
    let y = x.matmul(w, (1, m, n, k), xl, &wl.transpose(0, 1)?)?;
    Ok((y, Shape::from((m, n))))
}

impl CustomOp2 for Projection {
    fn name(&self) -> &'static str {
        "agentrl-projection"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        product(xs, xl, ws, wl)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        product(xs, xl, ws, wl)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // dx = g · w ([m, n] · [n, k]); dw = gᵀ · x ([n, m] · [m, k]), the
        // transposed g read through its strides (which the GEMMs take for
        // a contiguous g: a no-op for the gradients candle hands over).
        let grad = grad.contiguous()?;
        let dx = grad.matmul(w)?;
        let dw = grad.t()?.matmul(x)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// `x · wᵀ` for `x: [m, k]` and `w: [n, k]`, differentiably, the weight's
/// gradient computed in its own `[n, k]` layout.
pub(crate) fn project(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.apply_op2(w, Projection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::{max_abs_diff, weighted_grad};
    use candle_core::{Device, Var};

    fn values(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64 + seed) * 0.731).sin()).collect()
    }

    /// The op against candle's `matmul` of `w.t()`: the same forward, and
    /// the same gradients for both operands.
    #[test]
    fn projection_and_its_gradients_match_matmul_of_the_transpose() {
        let dev = Device::Cpu;
        let (m, n, k) = (5, 3, 4);
        let x = Var::from_vec(values(m * k, 1.0), (m, k), &dev).unwrap();
        let w = Var::from_vec(values(n * k, 2.0), (n, k), &dev).unwrap();
        let weights = Tensor::from_vec(values(m * n, 3.0), (m, n), &dev).unwrap();
        let ours = project(x.as_tensor(), w.as_tensor()).unwrap();
        let theirs = x.as_tensor().matmul(&w.as_tensor().t().unwrap()).unwrap();
        assert_eq!(ours.dims(), &[m, n]);
        assert_eq!(max_abs_diff(&ours, &theirs), 0.0);
        let (dx, dw) = (
            weighted_grad(&ours, &weights, &x),
            weighted_grad(&ours, &weights, &w),
        );
        let (dx_ref, dw_ref) = (
            weighted_grad(&theirs, &weights, &x),
            weighted_grad(&theirs, &weights, &w),
        );
        assert_eq!(dw.dims(), &[n, k]);
        assert!(dw.is_contiguous());
        assert!(max_abs_diff(&dx, &dx_ref) < 1e-12);
        assert!(max_abs_diff(&dw, &dw_ref) < 1e-12);
    }

    #[test]
    fn mismatched_widths_are_refused_by_name() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 3), candle_core::DType::F32, &dev).unwrap();
        let w = Tensor::zeros((4, 5), candle_core::DType::F32, &dev).unwrap();
        let err = project(&x, &w).unwrap_err().to_string();
        assert!(err.contains("input [2, 3] against weight [4, 5]"), "{err}");
    }
}
