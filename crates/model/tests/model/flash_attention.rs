//! The flash attention op on the test device (`AGENTRL_TEST_DEVICE`; on a
//! GPU in bf16, the kernels of `kernels/flash_attention.cu`) against the
//! host's op in f64: output and the gradients of q, k and v, at head dims 64
//! and 128, with grouped heads, left pads and cached keys; and a whole model
//! on a GPU scoring and differentiating the same with the op as with the
//! materialised softmax.

use agentrl_model::flash_attention::{flash_attention, flash_attention_applies};
use agentrl_model::{ModelConfig, PolicyModel};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::device::{host_f64 as host, max_abs_diff, test_device};

/// `[output, dq, dk, dv]` as f64 for q `[B, H, T, D]`, k `[B, G, S, D]` and
/// v given as `[B, S, G, D]` (passed on as its transposed view), under the
/// loss Σ out ⊙ w.
#[allow(clippy::too_many_arguments)]
fn run(
    (q, k, v, w): (&[f64], &[f64], &[f64], &[f64]),
    (b, h, g, t, s, d): (usize, usize, usize, usize, usize, usize),
    pads: &[usize],
    dev: &Device,
    dtype: DType,
) -> [Vec<f64>; 4] {
    let var = |x: &[f64], shape: (usize, usize, usize, usize)| {
        let t = Tensor::from_vec(x.to_vec(), shape, dev).unwrap();
        Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
    };
    let (qv, kv, vv) = (
        var(q, (b, h, t, d)),
        var(k, (b, g, s, d)),
        var(v, (b, s, g, d)),
    );
    let w = Tensor::from_vec(w.to_vec(), (b, t, h, d), dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let v_heads = vv.transpose(1, 2).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let out = flash_attention(&qv, &kv, &v_heads, pads, scale).unwrap();
    let loss = (&out * &w).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let grad = |x: &Var| host(grads.get(x.as_tensor()).expect("a gradient"));
    [host(&out), grad(&qv), grad(&kv), grad(&vv)]
}

#[test]
fn flash_attention_on_the_test_device_matches_the_host() {
    let dev = test_device();
    // The host op takes f32/f64; the GPU kernels take bf16.
    let (dtype, tol) = if dev.is_cuda() {
        (DType::BF16, 3e-2)
    } else {
        (DType::F32, 1e-5)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    // (B, H, G, T, S, D): causal training shapes, and a prefill after cached keys.
    let cases = [
        ((2, 4, 2, 45, 45, 64), vec![0, 9]),
        ((2, 2, 1, 19, 52, 64), vec![3, 36]),
        ((1, 2, 2, 37, 38, 128), vec![]),
    ];
    for (dims @ (b, h, g, t, s, d), pads) in cases {
        let mut draw =
            |n: usize| -> Vec<f64> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (q, k, v) = (
            draw(b * h * t * d),
            draw(b * g * s * d),
            draw(b * g * s * d),
        );
        let w = draw(b * t * h * d);
        let inputs = (&q[..], &k[..], &v[..], &w[..]);
        let want = run(inputs, dims, &pads, &Device::Cpu, DType::F64);
        let got = run(inputs, dims, &pads, &dev, dtype);
        for (n, what) in ["output", "dq", "dk", "dv"].iter().enumerate() {
            let scale = want[n].iter().fold(0.0f64, |a, x| a.max(x.abs()));
            let off = max_abs_diff(&got[n], &want[n]);
            assert!(
                off <= tol * scale.max(1e-3),
                "{dims:?} pads {pads:?} {dtype:?}: {what} off by {off} (largest {scale})"
            );
        }
    }
}

/// Weighted log-probs and entropies of `seqs` summed over real tokens, and
/// its gradient for every parameter, as f64.
fn scored(model: &PolicyModel, seqs: &[Vec<u32>]) -> (Vec<f64>, Vec<Vec<f64>>) {
    let out = model.sequence_logprobs(seqs).unwrap();
    let objective = ((&out.logprobs + out.entropy.affine(0.5, 0.0).unwrap()).unwrap() * &out.mask)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = objective.backward().unwrap();
    let per_param = model
        .named_vars()
        .unwrap()
        .iter()
        .map(|(name, v)| {
            host(
                grads
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("{name}: no gradient")),
            )
        })
        .collect();
    (host(&out.logprobs), per_param)
}

#[test]
fn a_model_scores_and_learns_the_same_through_flash_attention() {
    let dev = test_device();
    if !flash_attention_applies(DType::BF16, &dev, 64) {
        eprintln!("the flash kernels need bf16 on a CUDA device: the model comparison is not run");
        return;
    }
    // Head dims 64 (Qwen2.5-0.5B's) and 128, grouped heads, ragged
    // sequences (left pads) longer than a tile.
    for (hidden, heads, kv) in [(128, 2, 1), (256, 2, 2)] {
        let mut cfg = ModelConfig::new_qwen2(301, hidden, 2, heads, kv, 200);
        cfg.max_position_embeddings = 128;
        cfg.initializer_range = 0.1;
        let model = |flash: bool| {
            let mut m =
                PolicyModel::new_random_with_dtype(&cfg, false, 3, DType::BF16, &dev).unwrap();
            m.set_flash_attention(flash);
            m
        };
        let seqs: Vec<Vec<u32>> = (0..4u32)
            .map(|s| {
                (0..20 + 23 * s)
                    .map(|t| (t * 37 + s * 101 + 5) % 301)
                    .collect()
            })
            .collect();
        let (lp_flash, g_flash) = scored(&model(true), &seqs);
        let (lp_plain, g_plain) = scored(&model(false), &seqs);
        let off = max_abs_diff(&lp_flash, &lp_plain);
        assert!(off < 0.1, "hidden {hidden}: log-probs differ by {off}");
        for (n, (a, b)) in g_flash.iter().zip(&g_plain).enumerate() {
            let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
            let diff: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
            let rel = norm(&diff) / norm(b).max(1e-12);
            assert!(
                rel < 5e-2,
                "hidden {hidden}: gradient {n} differs by {rel} (relative)"
            );
        }
    }
}
