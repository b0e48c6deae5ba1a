//! Bridges between candle tensors and the host slices the hand-written
//! kernels work on: read a CPU storage in place, run a closure over the
//! contiguous data of several tensors under their read locks, and wrap a
//! result vector as a tensor without copying it.

use candle_core::{CpuStorage, Layout, Result, Shape, Storage, Tensor};

use crate::kernels::Real;

/// The contiguous data of a CPU storage of type `T` (`what` names it in errors).
pub(crate) fn storage_slice<'a, T: Real>(
    s: &'a CpuStorage,
    l: &Layout,
    what: &str,
) -> Result<&'a [T]> {
    let v =
        T::slice(s).ok_or_else(|| candle_core::Error::Msg(format!("{what}: unexpected dtype")))?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("{what}: must be contiguous"),
    }
}

/// Runs `f` on the contiguous host data of `tensors` (made contiguous
/// first), read in place under their storage read locks.
pub(crate) fn with_slices<T: Real, R>(
    tensors: &[&Tensor],
    what: &str,
    f: impl FnOnce(&[&[T]]) -> R,
) -> Result<R> {
    let tensors = tensors
        .iter()
        .map(|t| t.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let guards: Vec<_> = tensors.iter().map(|t| t.storage_and_layout()).collect();
    let mut slices = Vec::with_capacity(guards.len());
    for (storage, layout) in &guards {
        match &**storage {
            Storage::Cpu(c) => slices.push(storage_slice::<T>(c, layout, what)?),
            _ => candle_core::bail!("{what}: CPU tensors only"),
        }
    }
    Ok(f(&slices))
}

/// A CPU tensor owning `v` (no copy), outside any autograd graph.
pub(crate) fn tensor_from<T: Real>(v: Vec<T>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(
        Storage::Cpu(T::storage(v)),
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    )
}
