//! The optimizer's CUDA passes over many tensors in one launch each
//! (`kernels/multi_tensor.cu`): the gradients' sum of squares, their
//! scaling by the clipping factor, and the AdamW update. Launched per
//! parameter, a 0.5B model's ~290 parameters made clipping and AdamW a
//! sixth of a bf16 training step on an H200 (17 + 10 ms of 166 ms), almost
//! all of it launches and allocations.
//!
//! The kernels read a table of element addresses: each tensor must be
//! contiguous, on one CUDA device, of one float dtype per launch; tensors of
//! several dtypes make one launch per dtype. A function here returns `None`
//! when its tensors do not qualify, and the caller takes the per-tensor path.

use std::collections::BTreeMap;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::{DType, Result, Storage, Tensor};

use crate::cuda::{launch, MULTI_TENSOR};

/// Elements per block: a 0.5B model is ~7,500 blocks.
const CHUNK: u64 = 1 << 16;
/// Threads per block.
const THREADS: u32 = 512;

/// Where a contiguous tensor's elements live on its CUDA device.
struct Address {
    dev: CudaDevice,
    /// The first element's address.
    at: u64,
    /// The kernel-name suffix of the dtype.
    suffix: &'static str,
    /// Bytes per element.
    size: u64,
    /// Elements.
    n: u64,
}

/// `t`'s [`Address`]; `None` off CUDA, for other dtypes and for
/// non-contiguous tensors.
fn address(t: &Tensor) -> Option<Address> {
    if !t.is_contiguous() {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        return None;
    };
    let stream = cs.device().cuda_stream();
    let (base, size, suffix) = match &cs.slice {
        CudaStorageSlice::F32(s) => (s.device_ptr(&stream).0, 4, "f32"),
        CudaStorageSlice::BF16(s) => (s.device_ptr(&stream).0, 2, "bf16"),
        CudaStorageSlice::F16(s) => (s.device_ptr(&stream).0, 2, "f16"),
        _ => return None,
    };
    Some(Address {
        dev: cs.device().clone(),
        at: base + (layout.start_offset() * size) as u64,
        suffix,
        size: size as u64,
        n: t.elem_count() as u64,
    })
}

/// One launch's tables: `fields` u64 per tensor (addresses, then the count)
/// and (tensor, first element) per block.
struct Tables {
    dev: CudaDevice,
    suffix: &'static str,
    tensors: Vec<u64>,
    chunks: Vec<u64>,
}

impl Tables {
    fn push(&mut self, addresses: &[u64], n: u64) {
        let k = (self.tensors.len() / (addresses.len() + 1)) as u64;
        self.tensors.extend(addresses);
        self.tensors.push(n);
        self.chunks
            .extend((0..n).step_by(CHUNK as usize).flat_map(|start| [k, start]));
    }

    /// Both tables on the device.
    fn upload(&self) -> Result<(CudaSlice<u64>, CudaSlice<u64>)> {
        Ok((
            self.dev.clone_htod(&self.tensors)?,
            self.dev.clone_htod(&self.chunks)?,
        ))
    }

    fn blocks(&self) -> usize {
        self.chunks.len() / 2
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.blocks() as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// Groups rows of tensors by dtype into [`Tables`]; `None` if any tensor of
/// a row does not qualify, the rows' tensors differ in dtype, device or
/// length, or a group would need more blocks than a grid holds.
fn tables(rows: &[Vec<&Tensor>]) -> Option<Vec<Tables>> {
    let mut groups: BTreeMap<&'static str, Tables> = BTreeMap::new();
    for row in rows {
        let mut addresses = Vec::with_capacity(row.len());
        let mut first: Option<(CudaDevice, &'static str, u64)> = None;
        for t in row {
            let Address {
                dev, at, suffix, n, ..
            } = address(t)?;
            match &first {
                None => first = Some((dev, suffix, n)),
                Some((d, s, m)) if d.id() == dev.id() && *s == suffix && *m == n => {}
                Some(_) => return None,
            }
            addresses.push(at);
        }
        let (dev, suffix, n) = first?;
        if n == 0 {
            continue;
        }
        let group = groups.entry(suffix).or_insert_with(|| Tables {
            dev: dev.clone(),
            suffix,
            tensors: Vec::new(),
            chunks: Vec::new(),
        });
        if group.dev.id() != dev.id() {
            return None;
        }
        group.push(&addresses, n);
    }
    let groups: Vec<Tables> = groups.into_values().collect();
    groups
        .iter()
        .all(|g| u32::try_from(g.blocks()).is_ok())
        .then_some(groups)
}

/// Σ g² over `grads` in f64 (each block's f32 sum of at most 65,536 squares
/// read back and added in block order: the same value on every run);
/// `None` if the tensors do not qualify.
pub(crate) fn sum_of_squares(grads: &[&Tensor]) -> Result<Option<f64>> {
    let rows: Vec<Vec<&Tensor>> = grads.iter().map(|&g| vec![g]).collect();
    let Some(groups) = tables(&rows) else {
        return Ok(None);
    };
    let mut total = 0f64;
    for t in &groups {
        let dev = &t.dev;
        let (tensors, chunks) = t.upload()?;
        // SAFETY: the kernel writes one partial per block.
        let partial = unsafe { dev.alloc::<f32>(t.blocks())? };
        // multi_sum_squares_T(tensors, chunks, chunk, partial): block b sums
        // the squares of its chunk into partial[b]. The addresses cover each
        // tensor's n elements, which `grads` keeps alive past the read-back.
        launch!(
            dev,
            MULTI_TENSOR,
            &format!("multi_sum_squares_{}", t.suffix),
            t.config(),
            &tensors,
            &chunks,
            &CHUNK,
            &partial
        )?;
        total += dev
            .clone_dtoh(&partial)?
            .iter()
            .map(|&p| f64::from(p))
            .sum::<f64>();
    }
    Ok(Some(total))
}

/// `g ← g · coef` in place for every tensor of `grads`, each storage once
/// (two gradients may be one tensor); `false`, with nothing changed, if the
/// tensors do not qualify or two of them overlap without being the same.
///
/// The caller must own the gradients: every tensor sharing their storage
/// sees the change.
pub(crate) fn scale_in_place(grads: &[&Tensor], coef: f64) -> Result<bool> {
    let mut spans: Vec<(u64, u64, &Tensor)> = Vec::with_capacity(grads.len());
    for &g in grads {
        let Some(a) = address(g) else {
            return Ok(false);
        };
        spans.push((a.at, a.at + a.n * a.size, g));
    }
    spans.sort_by_key(|&(start, end, _)| (start, end));
    spans.dedup_by_key(|&mut (start, end, _)| (start, end));
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Ok(false);
    }
    let rows: Vec<Vec<&Tensor>> = spans.iter().map(|&(_, _, g)| vec![g]).collect();
    let Some(groups) = tables(&rows) else {
        return Ok(false);
    };
    let coef = coef as f32;
    for t in &groups {
        let dev = &t.dev;
        let (tensors, chunks) = t.upload()?;
        // multi_scale_T(tensors, chunks, chunk, coef): each element of each
        // (distinct, non-overlapping) tensor once.
        launch!(
            dev,
            MULTI_TENSOR,
            &format!("multi_scale_{}", t.suffix),
            t.config(),
            &tensors,
            &chunks,
            &CHUNK,
            &coef
        )?;
    }
    Ok(true)
}

/// The scalars of one AdamW step, as the kernel takes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWScalars {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// `1 − lr·weight_decay`.
    pub keep: f32,
    pub bc1: f32,
    pub bc2: f32,
}

/// One AdamW step of every `(θ, g, m, v)` in place; `false`, with nothing
/// changed, if the tensors do not qualify (each row one dtype, length and
/// device, all contiguous).
///
/// The caller must own θ, m and v (the optimizer's variables and moments).
pub(crate) fn adamw(params: &[[&Tensor; 4]], c: AdamWScalars) -> Result<bool> {
    let rows: Vec<Vec<&Tensor>> = params.iter().map(|p| p.to_vec()).collect();
    let Some(groups) = tables(&rows) else {
        return Ok(false);
    };
    for t in &groups {
        let dev = &t.dev;
        let (tensors, chunks) = t.upload()?;
        // multi_adamw_T(tensors, chunks, chunk, lr, β1, β2, ε, keep, bc1,
        // bc2): rows (θ, g, m, v, n), each element of each row once.
        launch!(
            dev,
            MULTI_TENSOR,
            &format!("multi_adamw_{}", t.suffix),
            t.config(),
            &tensors,
            &chunks,
            &CHUNK,
            &c.lr,
            &c.beta1,
            &c.beta2,
            &c.eps,
            &c.keep,
            &c.bc1,
            &c.bc2
        )?;
    }
    Ok(true)
}

/// Whether `dtype` has the kernels.
pub(crate) fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}
