//! Attention's causal softmax on the test device (`AGENTRL_TEST_DEVICE`; on
//! a GPU, the kernels of `kernels/softmax.cu`) against the host's fused
//! op in f64: probabilities and the gradient of a weighted sum, with and
//! without left padding, for a cache (more keys than queries) and without.

use agentrl_model::ops::left_padded_causal_softmax;
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::device::{host_f64 as host, max_abs_diff, test_device};

/// `(probabilities, gradient)` as f64 for scores `[2, 3, t, s]` on `dev`.
fn run(
    x: &[f64],
    w: &[f64],
    dims: (usize, usize, usize, usize),
    pads: &[usize],
    dev: &Device,
    dtype: DType,
) -> [Vec<f64>; 2] {
    let scores = Tensor::from_vec(x.to_vec(), dims, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let scores = Var::from_tensor(&scores).unwrap();
    let w = Tensor::from_vec(w.to_vec(), dims, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let p = left_padded_causal_softmax(scores.as_tensor(), pads).unwrap();
    let grads = (&p * &w).unwrap().sum_all().unwrap().backward().unwrap();
    [host(&p), host(grads.get(scores.as_tensor()).unwrap())]
}

#[test]
fn causal_softmax_on_the_test_device_matches_the_host() {
    let dev = test_device();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut dtypes = vec![(DType::F32, 1e-5)];
    if dev.is_cuda() {
        dtypes.push((DType::BF16, 2e-2));
    }
    for (t, s) in [(5, 5), (3, 7), (1, 1300)] {
        for pads in [vec![], vec![2, 0]] {
            let dims = (2, 3, t, s);
            let n = 2 * 3 * t * s;
            let x: Vec<f64> = (0..n).map(|_| rng.random_range(-5.0..5.0)).collect();
            let w: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let reference = run(&x, &w, dims, &pads, &Device::Cpu, DType::F64);
            for &(dtype, tol) in &dtypes {
                let got = run(&x, &w, dims, &pads, &dev, dtype);
                for (k, what) in ["probabilities", "gradient"].iter().enumerate() {
                    let d = max_abs_diff(&got[k], &reference[k]);
                    assert!(
                        d < tol,
                        "t {t} s {s} pads {pads:?} {dtype:?}: {what} off by {d}"
                    );
                }
                // Masked keys are exactly zero.
                for (i, (&g, &r)) in got[0].iter().zip(&reference[0]).enumerate() {
                    assert!(r != 0.0 || g == 0.0, "masked entry {i} is {g}");
                }
            }
        }
    }
}
