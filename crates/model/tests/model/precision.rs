//! bf16 products on the CPU (`PolicyModel::set_precision`): log-probs,
//! entropies and every gradient within bf16's rounding of the f32 path's, and
//! generation (whose projections then read bf16 weights) consistent with
//! bf16 scoring. Skipped, saying so, on CPUs without AVX512-BF16. Then the
//! GPU's bf16, autocast through casts of the f32 weights: the casts' own
//! gradients on the host, and the whole model against f32 on a GPU.

use agentrl_model::{ModelConfig, PolicyModel, Precision, SamplingParams};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::device::{max_abs_diff, test_device};
use crate::finite_difference::{logprob_entropy_objective, values};

fn config() -> ModelConfig {
    // Widths past the kernel's 64-column strips and 6-row tiles, an odd
    // projection width, biases (Qwen2), tied embeddings.
    let mut c = ModelConfig::new_qwen2(301, 96, 2, 4, 2, 136);
    c.max_position_embeddings = 64;
    c.initializer_range = 0.1;
    c
}

fn model(precision: Precision) -> PolicyModel {
    let mut m = PolicyModel::new_random(&config(), false, 3, &Device::Cpu).unwrap();
    m.set_precision(precision).unwrap();
    m
}

fn sequences() -> Vec<Vec<u32>> {
    (0..5u32)
        .map(|s| {
            (0..12 + 7 * s)
                .map(|t| (t * 37 + s * 101 + 5) % 301)
                .collect()
        })
        .collect()
}

fn bf16_here() -> bool {
    let here = Precision::Bf16.available();
    if !here {
        eprintln!("no AVX512-BF16 on this CPU: the bf16 checks are not run");
    }
    here
}

/// ‖a − b‖ / ‖b‖.
fn relative(a: &[f64], b: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm.max(1e-300)).sqrt()
}

/// Every parameter's gradient in `got` (a model and the gradients of its
/// objective) against the same parameter's in `want`: there, of `dtype`
/// where one is given, and within `tol` of it (relative, as [`relative`]).
fn assert_gradients_close(
    (got_model, got): (&PolicyModel, &GradStore),
    (want_model, want): (&PolicyModel, &GradStore),
    dtype: Option<DType>,
    tol: f64,
    what: &str,
) {
    let pairs = got_model.named_vars().unwrap().into_iter();
    for ((name, g), (_, w)) in pairs.zip(want_model.named_vars().unwrap()) {
        let a = got
            .get(g.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no {what} gradient"));
        if let Some(dtype) = dtype {
            assert_eq!(a.dtype(), dtype, "{name}: the {what} gradient's dtype");
        }
        let r = relative(&values(a), &values(want.get(w.as_tensor()).unwrap()));
        assert!(r < tol, "{name}: {what} gradient off by {r} (relative)");
    }
}

#[test]
fn bf16_log_probs_and_gradients_stay_within_bf16_rounding_of_f32() {
    if !bf16_here() {
        return;
    }
    let (full, half) = (model(Precision::F32), model(Precision::Bf16));
    let seqs = sequences();
    let lp = |m: &PolicyModel| values(&m.sequence_logprobs(&seqs).unwrap().logprobs);
    let (lp32, lp16) = (lp(&full), lp(&half));
    let worst = max_abs_diff(&lp32, &lp16);
    let mean = lp32
        .iter()
        .zip(&lp16)
        .map(|(a, b)| (a - b).abs())
        .sum::<f64>()
        / lp32.len() as f64;
    eprintln!("log-probs: worst {worst} mean {mean}");
    // bf16 keeps 8 significant bits (relative rounding 2⁻⁹ per input).
    assert!(
        worst < 0.1 && mean < 0.01,
        "log-probs differ by {mean} on average, {worst} at worst"
    );
    assert!(worst > 0.0, "bf16 gave the f32 bits: it did not run");

    let g32 = logprob_entropy_objective(&full, &seqs).backward().unwrap();
    let g16 = logprob_entropy_objective(&half, &seqs).backward().unwrap();
    assert_gradients_close((&half, &g16), (&full, &g32), None, 0.05, "bf16");
}

#[test]
fn bf16_generation_matches_bf16_scoring() {
    if !bf16_here() {
        return;
    }
    let half = model(Precision::Bf16);
    let full = model(Precision::F32);
    let prompts: Vec<Vec<u32>> = sequences().into_iter().map(|s| s[..9].to_vec()).collect();
    let params = SamplingParams {
        max_new_tokens: 12,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        stop_tokens: vec![],
    };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let gens = half.generate(&prompts, &params, &mut rng).unwrap();
    let seqs: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&gens)
        .map(|(p, g)| p.iter().chain(&g.tokens).copied().collect())
        .collect();
    let scored = |m: &PolicyModel| -> Vec<Vec<f32>> {
        m.sequence_logprobs(&seqs)
            .unwrap()
            .logprobs
            .to_vec2()
            .unwrap()
    };
    let (lp16, lp32) = (scored(&half), scored(&full));
    let (mut worst16, mut worst32) = (0f32, 0f32);
    for (i, (p, g)) in prompts.iter().zip(&gens).enumerate() {
        for (j, got) in g.logprobs.iter().enumerate() {
            let t = p.len() - 1 + j;
            worst16 = worst16.max((got - lp16[i][t]).abs());
            worst32 = worst32.max((got - lp32[i][t]).abs());
        }
    }
    eprintln!("bf16 generation vs bf16 scoring {worst16}, vs f32 scoring {worst32}");
    // The same bf16 products on both sides; attention's f32 sums run in
    // another order, and a last-bit difference in an activation can round
    // it to the neighbouring bf16.
    assert!(worst16 < 0.01, "bf16 generation vs bf16 scoring: {worst16}");
    assert!(worst32 < 0.1, "bf16 generation vs f32 scoring: {worst32}");
    assert!(
        3.0 * worst16 < worst32,
        "bf16 generation is nearer f32 scoring than bf16's"
    );
}

#[test]
fn bf16_log_probs_track_transformers_autocast() {
    if !bf16_here() {
        return;
    }
    // transformers' log-probs of the fixture's next tokens in f32 and under
    // CPU bf16 autocast (scripts/bf16_autocast_reference.py).
    let dir = crate::qwen2_tiny::fixture_dir();
    let text = std::fs::read_to_string(dir.join("reference_bf16.json")).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let theirs = |key: &str| -> Vec<f64> {
        let v = reference[key].as_array().unwrap();
        v.iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (t32, t16) = (theirs("logprobs_f32"), theirs("logprobs_bf16_autocast"));
    let ids = crate::qwen2_tiny::u32s(&crate::qwen2_tiny::reference()["input_ids"]);
    let ours = |precision| {
        let mut m = PolicyModel::load(&dir, false, &Device::Cpu).unwrap();
        m.set_precision(precision).unwrap();
        values(
            &m.sequence_logprobs(std::slice::from_ref(&ids))
                .unwrap()
                .logprobs,
        )
    };
    let (o32, o16) = (ours(Precision::F32), ours(Precision::Bf16));
    let worst = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let same32 = worst(&o32, &t32);
    let (ours, autocast) = (worst(&o16, &t32), worst(&t16, &t32));
    let apart = worst(&o16, &t16);
    eprintln!("f32 vs f32 {same32}; from f32: bf16 {ours}, autocast {autocast}; apart {apart}");
    assert!(same32 < 1e-4, "f32 log-probs off transformers' by {same32}");
    // Autocast also rounds attention's inputs and the projections' outputs
    // to bf16; agentrl keeps those f32. So its bf16 stays at most as far
    // from f32 as autocast does (2026-11-29: 0.037 vs 0.059).
    assert!(ours > 0.0, "bf16 gave the f32 bits: it did not run");
    assert!(
        ours <= autocast,
        "bf16 is {ours} from f32, autocast {autocast}"
    );
    assert!(apart < 0.1, "bf16 and autocast differ by {apart}");
}

#[test]
fn a_cast_model_computes_in_its_dtype_and_differentiates_into_the_weights() {
    // The autocast mechanism on the host: an f64 model computing through an
    // f32 copy made by casts gives the f64 logits to f32 rounding, and its
    // gradients reach every f64 weight, close to the f64 model's own.
    let m =
        PolicyModel::new_random_with_dtype(&config(), false, 3, DType::F64, &Device::Cpu).unwrap();
    let base = m.model().unwrap();
    let cast = base.cast(DType::F32).unwrap();
    let ids: Vec<u32> = sequences()[2].clone();
    let ids = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let (l64, l32) = (base.forward(&ids).unwrap(), cast.forward(&ids).unwrap());
    assert_eq!(l32.dtype(), DType::F32);
    let off = max_abs_diff(&values(&l64), &values(&l32));
    assert!(off < 1e-3, "f32 logits off by {off}");
    // Fixed weights in [-1, 1) for the objective Σ logits ⊙ weights.
    let n = l64.elem_count();
    let weights: Vec<f64> = (0..n).map(|i| (i * 37 % 17) as f64 / 8.5 - 1.0).collect();
    let weights = Tensor::from_vec(weights, l64.dims(), &Device::Cpu).unwrap();
    let grads = |l: &Tensor| {
        (l * weights.to_dtype(l.dtype()).unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap()
    };
    let (g64, g32) = (grads(&l64), grads(&l32));
    // The weights' own dtype, f64, through the cast.
    assert_gradients_close((&m, &g32), (&m, &g64), Some(DType::F64), 1e-4, "cast");
}

#[test]
fn bf16_autocast_on_a_gpu_stays_within_bf16_rounding_of_f32() {
    let dev = test_device();
    if !dev.is_cuda() {
        eprintln!("autocast is the GPU's bf16: the comparison is not run on the CPU");
        return;
    }
    let full = PolicyModel::new_random(&config(), false, 3, &dev).unwrap();
    let mut half = PolicyModel::new_random(&config(), false, 3, &dev).unwrap();
    half.set_precision(Precision::Bf16).unwrap();
    let seqs = sequences();
    let (out32, out16) = (
        full.sequence_logprobs(&seqs).unwrap(),
        half.sequence_logprobs(&seqs).unwrap(),
    );
    assert_eq!(out16.logprobs.dtype(), DType::F32);
    let worst = max_abs_diff(&values(&out32.logprobs), &values(&out16.logprobs));
    assert!(
        worst < 0.1 && worst > 0.0,
        "bf16 autocast log-probs off by {worst}"
    );
    let g32 = logprob_entropy_objective(&full, &seqs).backward().unwrap();
    let g16 = logprob_entropy_objective(&half, &seqs).backward().unwrap();
    // f32 weights get f32 gradients.
    assert_gradients_close(
        (&half, &g16),
        (&full, &g32),
        Some(DType::F32),
        0.05,
        "bf16 autocast",
    );
}
