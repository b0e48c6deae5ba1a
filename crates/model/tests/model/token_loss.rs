//! The LM head's loss op on the test device (`AGENTRL_TEST_DEVICE`; on a
//! GPU, the kernels of `kernels/token_loss.cu`) against candle's composite
//! ops in f64 on the host: log-probs, entropies and the gradient of a
//! weighted sum of both, over vocabularies that take one and many strides
//! of a block's threads.

use agentrl_model::token_loss::token_logprobs_entropy;
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::device::{host_f64 as host, max_abs_diff, test_device};

/// `(log-probs, entropies, gradient)` as f64 for logits `x: [rows, v]` on `dev` in `dtype`.
fn outputs(x: &[f64], t: &[u32], w: &[f64], v: usize, dev: &Device, dtype: DType) -> [Vec<f64>; 3] {
    let rows = t.len();
    let logits = Tensor::from_vec(x.to_vec(), (rows, v), dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let logits = Var::from_tensor(&logits).unwrap();
    let targets = Tensor::from_vec(t.to_vec(), rows, dev).unwrap();
    let (lp, h) = token_logprobs_entropy(logits.as_tensor(), &targets).unwrap();
    // On a GPU the outputs are f32 whatever the logits' dtype.
    if dev.is_cuda() {
        assert_eq!((lp.dtype(), h.dtype()), (DType::F32, DType::F32));
    }
    let w = Tensor::from_vec(w.to_vec(), (2, rows), dev)
        .unwrap()
        .to_dtype(lp.dtype())
        .unwrap();
    let loss = ((&lp * w.get(0).unwrap()).unwrap().sum_all().unwrap()
        + (&h * w.get(1).unwrap()).unwrap().sum_all().unwrap())
    .unwrap();
    let grads = loss.backward().unwrap();
    [
        host(&lp),
        host(&h),
        host(grads.get(logits.as_tensor()).unwrap()),
    ]
}

#[test]
fn token_loss_on_the_test_device_matches_the_f64_composite() {
    let dev = test_device();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut dtypes = vec![(DType::F32, 1e-4)];
    if dev.is_cuda() {
        dtypes.push((DType::BF16, 0.1));
    }
    for v in [40, 1000, 50_000] {
        let rows = 5;
        let x: Vec<f64> = (0..rows * v).map(|_| rng.random_range(-6.0..6.0)).collect();
        let t: Vec<u32> = (0..rows).map(|_| rng.random_range(0..v as u32)).collect();
        let w: Vec<f64> = (0..2 * rows).map(|_| rng.random_range(-1.0..1.0)).collect();
        let reference = outputs(&x, &t, &w, v, &Device::Cpu, DType::F64);
        for &(dtype, tol) in &dtypes {
            let got = outputs(&x, &t, &w, v, &dev, dtype);
            for (k, what) in ["log-probs", "entropies", "gradient"].iter().enumerate() {
                let d = max_abs_diff(&got[k], &reference[k]);
                assert!(d < tol, "v {v} {dtype:?}: {what} off by {d}");
                assert!(
                    got[k].iter().all(|g| g.is_finite()),
                    "v {v} {dtype:?}: {what} not finite"
                );
            }
        }
    }
}
