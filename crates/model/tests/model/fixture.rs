//! The model against transformers' own outputs for the qwen2-tiny fixture
//! (tests/data/qwen2-tiny, copied from /work/shared/fixtures), on the device
//! `AGENTRL_TEST_DEVICE` names (CPU by default; see `device/mod.rs`).

use agentrl_model::{PolicyModel, SamplingParams};
use candle_core::Tensor;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::device::test_device;
use crate::qwen2_tiny::{f64s, fixture_dir, reference, u32s};

/// The reference, the model, and the reference's token ids under `key`.
fn fixture_with(key: &str) -> (Value, PolicyModel, Vec<u32>) {
    let r = reference();
    let ids = u32s(&r[key]);
    (r, load(), ids)
}

/// A 1-D tensor's values as f64 on the host.
fn host_f64(t: &Tensor) -> Vec<f64> {
    t.to_dtype(candle_core::DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn load() -> PolicyModel {
    PolicyModel::load(&fixture_dir(), false, &test_device()).unwrap()
}

fn assert_close(ours: &[f64], theirs: &[f64], tol: f64, what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            (a - b).abs() <= tol,
            "{what}[{i}]: ours {a} vs transformers {b}"
        );
    }
}

fn logits_of(model: &PolicyModel, ids: &[u32]) -> Vec<Vec<f64>> {
    let input = Tensor::new(ids, &model.device)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = model.forward(&input).unwrap().squeeze(0).unwrap();
    logits
        .to_dtype(candle_core::DType::F64)
        .unwrap()
        .to_vec2()
        .unwrap()
}

#[test]
fn logits_match_transformers_within_1e4() {
    let (r, model, ids) = fixture_with("input_ids");
    let logits = logits_of(&model, &ids);
    assert_close(
        &logits[ids.len() - 1],
        &f64s(&r["logits_last"]),
        1e-4,
        "logits_last",
    );
    for (i, row) in r["logits_first_rows"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_close(&logits[i], &f64s(row), 1e-4, &format!("logits row {i}"));
    }
    let lse: Vec<f64> = logits
        .iter()
        .map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
        })
        .collect();
    assert_close(&lse, &f64s(&r["logsumexp_per_position"]), 1e-4, "logsumexp");
}

#[test]
fn rope_theta_accepted_from_either_config_key_alone() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture_dir();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let r = reference();
    let ids = u32s(&r["input_ids"]);
    let want = f64s(&r["logits_last"]);
    for drop in ["rope_theta", "rope_parameters"] {
        let mut c = cfg.clone();
        c.as_object_mut().unwrap().remove(drop);
        std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
        let model = PolicyModel::load(dir.path(), false, &test_device()).unwrap();
        let logits = logits_of(&model, &ids);
        assert_close(&logits[ids.len() - 1], &want, 1e-4, drop);
    }
}

#[test]
fn greedy_continuation_matches_transformers_exactly() {
    let (r, model, ids) = fixture_with("input_ids");
    let want = u32s(&r["greedy_new_ids"]);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let g = model
        .generate(&[ids], &SamplingParams::greedy(want.len()), &mut rng)
        .unwrap();
    assert_eq!(g[0].tokens, want);
    assert!(!g[0].stopped);
}

#[test]
fn second_sequence_logprobs_match_transformers() {
    let (r, model, ids) = fixture_with("second_input_ids");
    let out = model.sequence_logprobs(&[ids]).unwrap();
    let lp = host_f64(&out.logprobs.squeeze(0).unwrap());
    assert_close(
        &lp,
        &f64s(&r["second_logprobs_of_next_token"]),
        1e-4,
        "logprobs",
    );
}

#[test]
fn nll_and_every_parameter_gradient_match_transformers() {
    let (r, model, ids) = fixture_with("input_ids");
    let out = model.sequence_logprobs(&[ids]).unwrap();
    let nll = out.logprobs.mean_all().unwrap().neg().unwrap();
    let nll_value = nll.to_scalar::<f32>().unwrap() as f64;
    let want_nll = r["nll_mean"].as_f64().unwrap();
    assert!(
        (nll_value - want_nll).abs() < 1e-5,
        "nll {nll_value} vs {want_nll}"
    );

    let grads = nll.backward().unwrap();
    let stats = r["grad_stats"].as_object().unwrap();
    let named = model.named_vars().unwrap();
    assert_eq!(named.len(), stats.len(), "parameter count");
    for (name, var) in &named {
        let st = &stats[name.as_str()];
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let g = g.to_dtype(candle_core::DType::F64).unwrap();
        let norm = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            .sqrt();
        let want = st["norm"].as_f64().unwrap();
        assert!(
            (norm - want).abs() <= 1e-3 * want,
            "{name}: grad norm {norm} vs transformers {want}"
        );
        let sum = g.sum_all().unwrap().to_scalar::<f64>().unwrap();
        let want_sum = st["sum"].as_f64().unwrap();
        assert!(
            (sum - want_sum).abs() <= 1e-3 * want + 1e-5,
            "{name}: grad sum {sum} vs transformers {want_sum}"
        );
    }
    let (_, ln0) = named
        .iter()
        .find(|(n, _)| n == "model.layers.0.input_layernorm.weight")
        .unwrap();
    let full = host_f64(grads.get(ln0.as_tensor()).unwrap());
    assert_close(
        &full,
        &f64s(&r["grad_full_layer0_input_layernorm"]),
        1e-5,
        "full grad",
    );
}
