//! Each kernel of `crates/model/kernels`, run under the CPU emulation of
//! the CUDA thread model, against an f64 reference written from the
//! kernel's formula (f32 storage to ~1e-5, bf16 storage to its rounding).

mod bias;
mod decode_attention;
mod embedding;
mod flash_attention;
mod kv_cache;
mod multi_tensor;
mod rms_norm;
mod rope;
mod sample;
mod softmax;
mod swiglu;
mod token_loss;

use agentrl_kernel_emulator::{bf16, Grid};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` values uniform in [-scale, scale), from `seed`.
pub fn random(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// `v` in bf16 storage.
pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// `v` read back as f64.
pub fn bf16_f64(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| f64::from(x.to_f32())).collect()
}

/// `v` as f64.
pub fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// The model crate's `row_blocks`: one block per row, whole warps up to 1024.
pub fn row_blocks(rows: usize, width: usize) -> Grid {
    Grid::linear(
        rows as u32,
        (width.div_ceil(32) * 32).clamp(32, 1024) as u32,
    )
}

/// Panics naming the first element where |got − want| > tol·(1 + |want|).
#[track_caller]
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: {g} against {w}"
        );
    }
}
