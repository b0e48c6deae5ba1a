//! The graph decoder's token choice on a CUDA device (`kernels/sample.cu`):
//! a step brings back a token, its log-prob and a finiteness flag per row
//! instead of the whole `[B, V]` logits (for Qwen2.5's 151,936-token
//! vocabulary, 9.7 MB a step at B = 16 in f32, then a host pass over them).
//!
//! The draws are the host sampler's: each row's uniform comes from its
//! sequence's stream, in the same order ([`crate::sampling::sample_rows`]),
//! and picks its token by inverse CDF over the vocabulary in order, so the
//! distribution is the same; where a uniform lands within rounding of a
//! bucket's edge the device's sums (f32 per segment, f64 across) may pick
//! the neighbouring token. Only plain sampling runs here: top-k, top-p
//! and steering stay on the host.

use candle_core::backend::BackendStorage;
use candle_core::{Result, Storage, Tensor};

use crate::cuda::{launch, on_float_slice, row_blocks, view, SAMPLE};

/// One row's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum DeviceChoice {
    /// The token and its untempered log-probability.
    Token(u32, f32),
    /// The row's first NaN or infinite logit: its id and value.
    NonFinite { token: usize, value: f32 },
}

/// A token for each row of `logits` (`[B, V]` on a CUDA device): row r
/// greedy where `draws[r] < 0`, else drawn from softmax(logits / T) with
/// the uniform `draws[r]` in [0, 1) (`inv_t` = 1/T).
pub(crate) fn sample_rows(logits: &Tensor, draws: &[f64], inv_t: f32) -> Result<Vec<DeviceChoice>> {
    let (b, v) = logits.dims2()?;
    if draws.len() != b {
        candle_core::bail!("device sampling: {} draws for {b} rows", draws.len())
    }
    let Ok(v32) = i32::try_from(v) else {
        candle_core::bail!("device sampling: a vocabulary of {v} tokens")
    };
    let logits = logits.contiguous()?;
    let (storage, layout) = logits.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        candle_core::bail!("device sampling: the logits are not on a CUDA device")
    };
    let dev = cs.device().clone();
    let u = dev.clone_htod(draws)?;
    // SAFETY (the four allocations): the kernel writes bad[r] for every
    // row, and token, logprob (finite rows) or bad_value (the others);
    // only those are read below.
    let token = unsafe { dev.alloc::<u32>(b)? };
    let logprob = unsafe { dev.alloc::<f32>(b)? };
    let bad = unsafe { dev.alloc::<i32>(b)? };
    let bad_value = unsafe { dev.alloc::<f32>(b)? };
    let cfg = row_blocks(b, v)?;
    on_float_slice!(&cs.slice, "device sampling", |x, suffix| {
        let x = view(x, layout, "logits")?;
        // sample_rows_T(logits, v, u, inv_t, token, logprob, bad, bad_value):
        // one block (at most 1024 threads, whole warps) per row of v logits.
        launch!(
            dev,
            SAMPLE,
            &format!("sample_rows_{suffix}"),
            cfg,
            &x,
            &v32,
            &u,
            &inv_t,
            &token,
            &logprob,
            &bad,
            &bad_value
        )
    })?;
    let (token, logprob) = (dev.clone_dtoh(&token)?, dev.clone_dtoh(&logprob)?);
    let (bad, bad_value) = (dev.clone_dtoh(&bad)?, dev.clone_dtoh(&bad_value)?);
    Ok((0..b)
        .map(|r| match usize::try_from(bad[r]) {
            Ok(token) => DeviceChoice::NonFinite {
                token,
                value: bad_value[r],
            },
            Err(_) => DeviceChoice::Token(token[r], logprob[r]),
        })
        .collect())
}
