//! Finite-difference gradient checks (f64) for every parameter tensor, and
//! optimizer behaviour: AdamW arithmetic, exact resume, clipping, training.

use agentrl_model::{clip_grad_norm, AdamW, AdamWConfig, ModelConfig, PolicyModel};
use candle_core::{DType, Device, Tensor, Var};

use crate::finite_difference::{assert_gradient_matches, var_names};

fn tiny_config(model_type: &str, tied: bool) -> ModelConfig {
    let mut c = ModelConfig::new_qwen2(13, 8, 2, 2, 1, 12);
    c.model_type = model_type.to_string();
    c.tie_word_embeddings = tied;
    c.max_position_embeddings = 16;
    // Larger weights than 0.02 so that attention and norms are far from linear.
    c.initializer_range = 0.5;
    c
}

const SEQS: [&[u32]; 2] = [&[1, 5, 7, 2, 11, 3], &[4, 12, 0]];

/// A scalar touching every output: weighted log-probs, entropies and values.
fn loss(model: &PolicyModel) -> Tensor {
    let seqs: Vec<Vec<u32>> = SEQS.iter().map(|s| s.to_vec()).collect();
    loss_of(model, &seqs)
}

fn loss_of(model: &PolicyModel, seqs: &[Vec<u32>]) -> Tensor {
    let out = model.sequence_logprobs(seqs).unwrap();
    let (b, t1) = out.logprobs.dims2().unwrap();
    let w: Vec<f64> = (0..b * t1).map(|i| 0.3 + 0.1 * (i % 5) as f64).collect();
    let w = Tensor::from_vec(w, (b, t1), &Device::Cpu).unwrap();
    let lp = (&out.logprobs * &w)
        .unwrap()
        .mul(&out.mask)
        .unwrap()
        .sum_all()
        .unwrap();
    let ent = (&out.entropy * &out.mask)
        .unwrap()
        .sum_all()
        .unwrap()
        .affine(0.7, 0.)
        .unwrap();
    let mut total = (lp + ent).unwrap();
    if let Some(v) = out.values {
        // Weighted squares at the real positions (values past a sequence's
        // end are unspecified).
        let t = v.dim(1).unwrap();
        let vw: Vec<f64> = (0..v.elem_count())
            .map(|i| {
                let real = i % t < seqs[i / t].len();
                if real {
                    1.0 - 0.2 * (i % 4) as f64
                } else {
                    0.0
                }
            })
            .collect();
        let vw = Tensor::from_vec(vw, v.dims(), &Device::Cpu).unwrap();
        let vs = (v.sqr().unwrap() * vw).unwrap().sum_all().unwrap();
        total = (total + vs).unwrap();
    }
    total
}

fn check_model(config: &ModelConfig, with_value_head: bool) {
    let model =
        PolicyModel::new_random_with_dtype(config, with_value_head, 17, DType::F64, &Device::Cpu)
            .unwrap();
    let grads = loss(&model).backward().unwrap();
    // Up to 12 spread-out elements per tensor keep the test fast.
    let picks = |n: usize| (0..n.min(12)).map(move |k| k * n / n.min(12));
    for (name, var) in model.named_vars().unwrap() {
        assert_gradient_matches(&name, &var, &grads, picks, || {
            loss(&model).to_scalar::<f64>().unwrap()
        });
    }
}

#[test]
fn finite_differences_match_autograd_for_every_parameter_qwen2_untied_with_value_head() {
    check_model(&tiny_config("qwen2", false), true);
}

#[test]
fn finite_differences_match_autograd_for_every_parameter_llama_tied() {
    check_model(&tiny_config("llama", true), false);
}

/// The fused training path (packed tokens, one op per layer with a
/// hand-written backward, fused head) against candle's composite ops, in
/// f64: the same outputs and the same gradient for every parameter, on
/// ragged batches whose longest sequence spans two attention blocks.
#[test]
fn fused_training_path_equals_the_composite_ops() {
    for (model_type, tied, value_head) in [("qwen2", false, true), ("llama", true, false)] {
        let mut config = tiny_config(model_type, tied);
        config.max_position_embeddings = 80;
        let mut model =
            PolicyModel::new_random_with_dtype(&config, value_head, 3, DType::F64, &Device::Cpu)
                .unwrap();
        // 152 packed rows: the row-summing passes (norm weight and bias
        // gradients, 128 rows per task) add more than one partial sum.
        let seqs: Vec<Vec<u32>> = vec![
            (0..70).map(|i| (i * 5 + 1) % 13).collect(),
            vec![4, 12, 0],
            (0..9).map(|i| (i * 3 + 2) % 13).collect(),
            (0..70).map(|i| (i * 7 + 3) % 13).collect(),
        ];
        let run = |model: &PolicyModel| {
            let out = model.sequence_logprobs(&seqs).unwrap();
            let masked =
                |t: &Tensor| -> Vec<Vec<f64>> { (t * &out.mask).unwrap().to_vec2().unwrap() };
            let values = out.values.as_ref().map(|v| {
                // Values past a sequence's end are unspecified: keep the real positions.
                let v: Vec<Vec<f64>> = v.to_vec2().unwrap();
                v.iter()
                    .zip(&seqs)
                    .flat_map(|(r, s)| r[..s.len()].to_vec())
                    .collect::<Vec<f64>>()
            });
            let grads = loss_of(model, &seqs).backward().unwrap();
            let g: Vec<Vec<f64>> = model
                .trainable_vars()
                .unwrap()
                .iter()
                .map(|v| {
                    grads
                        .get(v.as_tensor())
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap()
                })
                .collect();
            (masked(&out.logprobs), masked(&out.entropy), values, g)
        };
        let fused = run(&model);
        model.set_fused_training(false);
        let composite = run(&model);
        let close = |a: &[f64], b: &[f64], what: &str| {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-10 * (1.0 + y.abs()),
                    "{model_type} {what}[{i}]: {x} vs {y}"
                );
            }
        };
        close(&fused.0.concat(), &composite.0.concat(), "logprobs");
        close(&fused.1.concat(), &composite.1.concat(), "entropy");
        if let (Some(a), Some(b)) = (&fused.2, &composite.2) {
            close(a, b, "values");
        }
        assert_eq!(fused.2.is_some(), value_head);
        let names = var_names(model.named_vars().unwrap());
        for ((a, b), name) in fused.3.iter().zip(&composite.3).zip(&names) {
            close(a, b, name);
        }
    }
}

/// `scored_logprobs` computes the head at the scored positions alone: there
/// it gives the composite ops' `sequence_logprobs` (the reference), elsewhere
/// zeros, and a loss over the scored positions has the reference's gradient
/// for every parameter; on the fused path and on the composite ops, in f64.
#[test]
fn scored_positions_alone_give_the_full_pass_outputs_and_gradients() {
    let mut config = tiny_config("qwen2", false);
    config.max_position_embeddings = 80;
    let mut model =
        PolicyModel::new_random_with_dtype(&config, true, 5, DType::F64, &Device::Cpu).unwrap();
    let seqs: Vec<Vec<u32>> = vec![
        (0..70).map(|i| (i * 5 + 1) % 13).collect(),
        vec![4, 12, 0],
        (0..9).map(|i| (i * 3 + 2) % 13).collect(),
    ];
    // A reply span per row, a row scored nowhere, and entries past a row's
    // end (which count as unscored).
    let scored: Vec<Vec<f32>> = vec![
        (0..69)
            .map(|t| f32::from((30..45).contains(&t) || t == 68))
            .collect(),
        vec![0.0; 5],
        (0..8).map(|t| f32::from(t % 3 == 1)).collect(),
    ];
    let (b, width) = (seqs.len(), 69);
    let keep: Vec<f64> = (0..b * width)
        .map(|i| f64::from(scored[i / width].get(i % width).copied().unwrap_or(0.0)))
        .collect();
    let keep = Tensor::from_vec(keep, (b, width), &Device::Cpu).unwrap();
    let weights: Vec<f64> = (0..b * width).map(|i| 0.3 + 0.1 * (i % 5) as f64).collect();
    let weights = Tensor::from_vec(weights, (b, width), &Device::Cpu).unwrap();
    let loss = |lp: &Tensor, ent: &Tensor| -> Tensor {
        let lp = (lp * &weights)
            .unwrap()
            .mul(&keep)
            .unwrap()
            .sum_all()
            .unwrap();
        let ent = (ent * &keep)
            .unwrap()
            .sum_all()
            .unwrap()
            .affine(0.7, 0.)
            .unwrap();
        (lp + ent).unwrap()
    };
    let grads_of = |model: &PolicyModel, lp: &Tensor, ent: &Tensor| -> Vec<Vec<f64>> {
        let g = loss(lp, ent).backward().unwrap();
        let vars = model.trainable_vars().unwrap();
        vars.iter()
            .map(|v| match g.get(v.as_tensor()) {
                Some(t) => t.flatten_all().unwrap().to_vec1().unwrap(),
                None => vec![0.0; v.elem_count()],
            })
            .collect()
    };
    model.set_fused_training(false);
    let full = model.sequence_logprobs(&seqs).unwrap();
    let g_full = grads_of(&model, &full.logprobs, &full.entropy);
    for fused in [true, false] {
        model.set_fused_training(fused);
        let part = model.scored_logprobs(&seqs, &scored).unwrap();
        let both = |t: &Tensor| -> Vec<f64> { t.flatten_all().unwrap().to_vec1().unwrap() };
        let k = both(&keep);
        for (what, f, p) in [
            ("logprobs", both(&full.logprobs), both(&part.logprobs)),
            ("entropy", both(&full.entropy), both(&part.entropy)),
        ] {
            for (i, ((x, y), k)) in f.iter().zip(&p).zip(&k).enumerate() {
                let want = if *k != 0.0 { *x } else { 0.0 };
                assert!(
                    (y - want).abs() <= 1e-10 * (1.0 + want.abs()),
                    "fused {fused}: {what}[{i}] = {y}, want {want}"
                );
            }
        }
        let g_part = grads_of(&model, &part.logprobs, &part.entropy);
        let names = var_names(model.named_vars().unwrap());
        for ((a, b), name) in g_full.iter().zip(&g_part).zip(&names) {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-10 * (1.0 + x.abs()),
                    "fused {fused}: grad {name}[{i}]: {y} vs {x}"
                );
            }
        }
        let err = model.scored_logprobs(&seqs, &scored[..2]).unwrap_err();
        assert!(
            err.to_string()
                .contains("2 rows of scored positions for 3 sequences"),
            "{err}"
        );
    }
}

/// Sequences that share a prompt (a GRPO group's) give, with the prompt
/// computed once, the log-probs, entropies, values and gradients of the
/// unshared pass: a group of three replies to one 40-token prompt (one of
/// them a single token), a pair whose shared part is cut short by a
/// member's early scored position, and a sequence sharing too little.
#[test]
fn a_prompt_shared_by_several_sequences_is_computed_once_with_the_same_results() {
    let mut config = tiny_config("qwen2", false);
    config.max_position_embeddings = 80;
    let mut model =
        PolicyModel::new_random_with_dtype(&config, true, 9, DType::F64, &Device::Cpu).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 13).collect();
    let other: Vec<u32> = (0..30).map(|i| (i * 5 + 1) % 13).collect();
    let with = |base: &[u32], tail: &[u32]| -> Vec<u32> { [base, tail].concat() };
    let seqs: Vec<Vec<u32>> = vec![
        with(&prompt, &[1, 2, 3, 4, 5]),
        with(&other, &[9, 9, 1]),
        with(&prompt, &[6]),
        with(&other, &[2, 0, 4, 4, 8, 1]),
        with(&prompt, &[7, 7, 0, 12]),
        with(&prompt[..10], &[3, 3, 3]),
    ];
    // Each reply scored from the position predicting its first token; the
    // second pair member also at position 20 (so the pair shares 20 tokens).
    let mut scored: Vec<Vec<f32>> = seqs
        .iter()
        .zip([40, 30, 40, 30, 40, 10])
        .map(|(s, p)| (0..s.len() - 1).map(|t| f32::from(t + 1 >= p)).collect())
        .collect();
    scored[3][20] = 1.0;
    let b = seqs.len();
    let width = seqs.iter().map(Vec::len).max().unwrap() - 1;
    let t = width + 1;
    let keep: Vec<f64> = (0..b * width)
        .map(|i| f64::from(scored[i / width].get(i % width).copied().unwrap_or(0.0)))
        .collect();
    let keep = Tensor::from_vec(keep, (b, width), &Device::Cpu).unwrap();
    let weights: Vec<f64> = (0..b * width).map(|i| 0.3 + 0.1 * (i % 5) as f64).collect();
    let weights = Tensor::from_vec(weights, (b, width), &Device::Cpu).unwrap();
    let value_w: Vec<f64> = (0..b * t)
        .map(|i| f64::from(u8::from(i % t < seqs[i / t].len())) * (1.0 - 0.2 * (i % 4) as f64))
        .collect();
    let value_w = Tensor::from_vec(value_w, (b, t), &Device::Cpu).unwrap();
    let run = |model: &PolicyModel| -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let out = model.scored_logprobs(&seqs, &scored).unwrap();
        let values = out.values.clone().unwrap();
        let loss = ((&out.logprobs * &weights)
            .unwrap()
            .mul(&keep)
            .unwrap()
            .sum_all()
            .unwrap()
            + (&out.entropy * &keep)
                .unwrap()
                .sum_all()
                .unwrap()
                .affine(0.7, 0.)
                .unwrap())
        .unwrap();
        let loss = (loss
            + (values.sqr().unwrap() * &value_w)
                .unwrap()
                .sum_all()
                .unwrap())
        .unwrap();
        let g = loss.backward().unwrap();
        let flat = |t: &Tensor| -> Vec<f64> { t.flatten_all().unwrap().to_vec1().unwrap() };
        let vals = flat(&values)
            .into_iter()
            .enumerate()
            .map(|(i, v)| if i % t < seqs[i / t].len() { v } else { 0.0 })
            .collect();
        let outputs = vec![flat(&out.logprobs), flat(&out.entropy), vals];
        let grads = model
            .trainable_vars()
            .unwrap()
            .iter()
            .map(|v| match g.get(v.as_tensor()) {
                Some(t) => flat(t),
                None => vec![0.0; v.elem_count()],
            })
            .collect();
        (outputs, grads)
    };
    model.set_prefix_sharing(false);
    let (want_out, want_grads) = run(&model);
    model.set_fused_training(false);
    let (composite_out, _) = run(&model);
    model.set_fused_training(true);
    model.set_prefix_sharing(true);
    let (got_out, got_grads) = run(&model);
    let names = var_names(model.named_vars().unwrap());
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-10 * (1.0 + x.abs());
    for (what, (a, (b, c))) in ["logprobs", "entropy", "values"]
        .iter()
        .zip(want_out.iter().zip(got_out.iter().zip(&composite_out)))
    {
        for (i, ((x, y), z)) in a.iter().zip(b).zip(c).enumerate() {
            assert!(
                close(*x, *y) && close(*z, *y),
                "{what}[{i}]: shared {y}, unshared {x}, composite {z}"
            );
        }
    }
    for ((a, b), name) in want_grads.iter().zip(&got_grads).zip(&names) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(close(*x, *y), "grad {name}[{i}]: shared {y}, unshared {x}");
        }
    }
}

#[test]
fn adamw_matches_pytorch_update_rule() {
    let dev = Device::Cpu;
    let var = Var::from_tensor(&Tensor::new(&[1.0f64, -2.0, 0.5], &dev).unwrap()).unwrap();
    let cfg = AdamWConfig {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = AdamW::new(vec![var.clone()], cfg).unwrap();
    let mut theta = [1.0f64, -2.0, 0.5];
    let (mut m, mut v) = ([0f64; 3], [0f64; 3]);
    for step in 1..=3 {
        // loss = Σ c_i θ_i² → g = 2 c θ
        let c = Tensor::new(&[1.0f64, 2.0, 3.0], &dev).unwrap();
        let l = (var.as_tensor().sqr().unwrap() * &c)
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = l.backward().unwrap();
        opt.step(&grads).unwrap();
        for i in 0..3 {
            let g = 2.0 * (i as f64 + 1.0) * theta[i];
            theta[i] *= 1.0 - cfg.lr * cfg.weight_decay;
            m[i] = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * g;
            v[i] = cfg.beta2 * v[i] + (1.0 - cfg.beta2) * g * g;
            let mh = m[i] / (1.0 - cfg.beta1.powi(step));
            let vh = v[i] / (1.0 - cfg.beta2.powi(step));
            theta[i] -= cfg.lr * mh / (vh.sqrt() + cfg.eps);
        }
        let got: Vec<f64> = var.as_tensor().to_vec1().unwrap();
        for i in 0..3 {
            assert!(
                (got[i] - theta[i]).abs() < 1e-12,
                "step {step}: {got:?} vs {theta:?}"
            );
        }
    }
    assert_eq!(opt.step_count(), 3);
}

/// The AdamW step on the test device (on a GPU, `kernels/multi_tensor.cu`)
/// against the f64 rule on the host, over enough parameters for many
/// blocks; then a save and reload of its moments continues bit for bit.
#[test]
fn adamw_on_the_test_device_follows_the_update_rule_and_resumes() {
    let dev = crate::device::test_device();
    let cfg = AdamWConfig {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let n = 3001;
    let init: Vec<f64> = (0..n)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 25.0)
        .collect();
    let coef: Vec<f64> = (0..n).map(|i| 0.5 + (i % 7) as f64).collect();
    let var = Var::from_tensor(
        &Tensor::from_vec(init.iter().map(|&x| x as f32).collect::<Vec<_>>(), n, &dev).unwrap(),
    )
    .unwrap();
    let c = Tensor::from_vec(coef.iter().map(|&x| x as f32).collect::<Vec<_>>(), n, &dev).unwrap();
    // loss = Σ c_i θ_i² → g = 2 c θ
    let grads_of = |var: &Var| {
        (var.as_tensor().sqr().unwrap() * &c)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap()
    };
    let mut opt = AdamW::new(vec![var.clone()], cfg).unwrap();
    let (mut theta, mut m, mut v) = (init.clone(), vec![0f64; n], vec![0f64; n]);
    for step in 1..=3 {
        opt.step(&grads_of(&var)).unwrap();
        for i in 0..n {
            let g = 2.0 * coef[i] * theta[i];
            m[i] = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * g;
            v[i] = cfg.beta2 * v[i] + (1.0 - cfg.beta2) * g * g;
            let mh = m[i] / (1.0 - cfg.beta1.powi(step));
            let vh = v[i] / (1.0 - cfg.beta2.powi(step));
            theta[i] =
                theta[i] * (1.0 - cfg.lr * cfg.weight_decay) - cfg.lr * mh / (vh.sqrt() + cfg.eps);
        }
        let got: Vec<f32> = var
            .as_tensor()
            .to_device(&Device::Cpu)
            .unwrap()
            .to_vec1()
            .unwrap();
        for i in 0..n {
            let d = (got[i] as f64 - theta[i]).abs();
            assert!(
                d < 1e-5 * (1.0 + theta[i].abs()),
                "step {step}, θ[{i}] off by {d}"
            );
        }
    }
    // Saved moments reload into a fresh optimizer that takes the same next step.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adamw.safetensors");
    opt.save_state(&path).unwrap();
    let twin = Var::from_tensor(&var.as_tensor().copy().unwrap()).unwrap();
    let mut resumed = AdamW::new(vec![twin.clone()], cfg).unwrap();
    resumed.load_state(&path).unwrap();
    opt.step(&grads_of(&var)).unwrap();
    resumed.step(&grads_of(&twin)).unwrap();
    let host = |v: &Var| -> Vec<f32> {
        v.as_tensor()
            .to_device(&Device::Cpu)
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    assert_eq!(host(&var), host(&twin));
}

/// Clipping then AdamW over several parameters on the test device (on a
/// GPU, one launch each for the sum of squares, the scaling and the update,
/// `kernels/multi_tensor.cu`), against the f64 rules on the host; one
/// parameter spans more than one 65,536-element chunk; in f32 and bf16.
#[test]
fn clipping_and_adamw_on_the_test_device_cover_several_parameters() {
    // bf16 within its rounding: each stored value is rounded once on a GPU
    // (several times through candle's ops on the CPU).
    for (dtype, tol_g, tol_theta) in [(DType::F32, 1e-6, 1e-5), (DType::BF16, 8e-3, 1.6e-2)] {
        clip_then_step(dtype, tol_g, tol_theta);
    }
}

fn clip_then_step(dtype: DType, tol_g: f64, tol_theta: f64) {
    let dev = crate::device::test_device();
    let cfg = AdamWConfig {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let sizes = [3usize, 70_001, 1000];
    let vars: Vec<Var> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let host: Vec<f32> = (0..n)
                .map(|i| (((i * 37 + k * 11) % 101) as f32 - 50.0) / 25.0)
                .collect();
            let t = Tensor::from_vec(host, n, &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            Var::from_tensor(&t).unwrap()
        })
        .collect();
    let host = |t: &Tensor| -> Vec<f64> {
        let t = t
            .to_dtype(DType::F64)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap();
        t.to_vec1().unwrap()
    };
    // The parameters as stored (bf16 rounds them).
    let init: Vec<Vec<f64>> = vars.iter().map(|v| host(v.as_tensor())).collect();
    // loss = Σ θ² / 2 over all parameters → g = θ.
    let loss = vars
        .iter()
        .map(|v| v.as_tensor().sqr().unwrap().sum_all().unwrap())
        .reduce(|a, b| (a + b).unwrap())
        .unwrap();
    let mut grads = loss.affine(0.5, 0.0).unwrap().backward().unwrap();
    let norm: f64 = init.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
    let max_norm = 10.0;
    let got = clip_grad_norm(&mut grads, &vars, max_norm).unwrap();
    assert!(
        (got - norm).abs() < 1e-5 * norm,
        "{dtype:?}: norm {got} against {norm}"
    );
    let coef = max_norm / (norm + 1e-6);
    let mut opt = AdamW::new(vars.clone(), cfg).unwrap();
    opt.step(&grads).unwrap();
    for (var, theta0) in vars.iter().zip(&init) {
        let g_host = host(grads.get(var.as_tensor()).unwrap());
        let got = host(var.as_tensor());
        for i in 0..theta0.len() {
            let g = theta0[i] * coef;
            let dg = (g_host[i] - g).abs();
            assert!(
                dg <= tol_g * (1.0 + g.abs()),
                "{dtype:?}: g[{i}] off by {dg}"
            );
            let m = (1.0 - cfg.beta1) * g / (1.0 - cfg.beta1);
            let v = (1.0 - cfg.beta2) * g * g / (1.0 - cfg.beta2);
            let want =
                theta0[i] * (1.0 - cfg.lr * cfg.weight_decay) - cfg.lr * m / (v.sqrt() + cfg.eps);
            let d = (got[i] - want).abs();
            assert!(
                d < tol_theta * (1.0 + want.abs()),
                "{dtype:?}: θ[{i}] off by {d}"
            );
        }
    }
}

fn nll(model: &PolicyModel) -> Tensor {
    let seqs = vec![vec![1u32, 2, 3, 4, 5, 6, 7, 8], vec![9, 8, 7, 6]];
    let out = model.sequence_logprobs(&seqs).unwrap();
    let total = (&out.logprobs * &out.mask).unwrap().sum_all().unwrap();
    let n = out.mask.sum_all().unwrap();
    total.div(&n).unwrap().neg().unwrap()
}

fn train_steps(model: &PolicyModel, opt: &mut AdamW, steps: usize) -> Vec<f32> {
    let vars = model.trainable_vars().unwrap();
    (0..steps)
        .map(|_| {
            let l = nll(model);
            let mut grads = l.backward().unwrap();
            clip_grad_norm(&mut grads, &vars, 1.0).unwrap();
            opt.step(&grads).unwrap();
            l.to_scalar::<f32>().unwrap()
        })
        .collect()
}

fn weights(model: &PolicyModel) -> Vec<Vec<f32>> {
    model
        .trainable_vars()
        .unwrap()
        .iter()
        .map(|v| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect()
}

#[test]
fn training_updates_every_parameter_and_lowers_the_loss() {
    let model = PolicyModel::new_random(&ModelConfig::tiny(16), true, 4, &Device::Cpu).unwrap();
    let before = weights(&model);
    let cfg = AdamWConfig {
        lr: 3e-3,
        weight_decay: 0.0,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(model.trainable_vars().unwrap(), cfg).unwrap();
    // The value head gets no gradient from the NLL, so it must stay put.
    let losses = train_steps(&model, &mut opt, 20);
    let after = weights(&model);
    for ((name, _), (b, a)) in model
        .named_vars()
        .unwrap()
        .iter()
        .zip(before.iter().zip(&after))
    {
        if name.starts_with("value_head") {
            assert_eq!(b, a, "{name} moved without a gradient");
        } else {
            assert_ne!(
                b, a,
                "{name} was not updated: the gradient did not reach it"
            );
        }
    }
    assert!(losses[19] < losses[0] - 0.5, "{losses:?}");
}

#[test]
fn resume_from_saved_model_and_optimizer_state_is_bit_identical() {
    let dev = Device::Cpu;
    let cfg = AdamWConfig::default();
    let model = PolicyModel::new_random(&ModelConfig::tiny(16), false, 5, &dev).unwrap();
    let mut opt = AdamW::new(model.trainable_vars().unwrap(), cfg).unwrap();
    train_steps(&model, &mut opt, 3);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let state = dir.path().join("optimizer.safetensors");
    opt.save_state(&state).unwrap();
    let cont = train_steps(&model, &mut opt, 3);

    let resumed = PolicyModel::load(dir.path(), false, &dev).unwrap();
    let mut opt2 = AdamW::new(resumed.trainable_vars().unwrap(), cfg).unwrap();
    opt2.load_state(&state).unwrap();
    assert_eq!(opt2.step_count(), 3);
    let again = train_steps(&resumed, &mut opt2, 3);
    assert_eq!(cont, again);
    assert_eq!(weights(&model), weights(&resumed));
}

#[test]
fn optimizer_state_for_other_variables_is_rejected() {
    let dev = Device::Cpu;
    let a = PolicyModel::new_random(&ModelConfig::tiny(16), false, 5, &dev).unwrap();
    let b = PolicyModel::new_random(&ModelConfig::tiny(32), false, 5, &dev).unwrap();
    let opt = AdamW::new(a.trainable_vars().unwrap(), AdamWConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opt.safetensors");
    opt.save_state(&path).unwrap();
    let mut other = AdamW::new(b.trainable_vars().unwrap(), AdamWConfig::default()).unwrap();
    let err = other.load_state(&path).unwrap_err();
    assert!(err.to_string().contains("opt.safetensors"), "{err}");
}

/// The gradients of ½ Σ |x|² over `vars`: each equals its variable's value.
fn grads_equal_to_values(vars: &[&Var]) -> candle_core::backprop::GradStore {
    let squares = vars
        .iter()
        .map(|v| v.as_tensor().sqr().unwrap().sum_all().unwrap())
        .collect::<Vec<_>>();
    let total = squares[1..]
        .iter()
        .fold(squares[0].clone(), |acc, t| (acc + t).unwrap());
    total.affine(0.5, 0.0).unwrap().backward().unwrap()
}

#[test]
fn clip_grad_norm_returns_pre_clip_norm_and_scales_to_max() {
    let dev = Device::Cpu;
    let a = Var::from_tensor(&Tensor::new(&[3.0f32, 0.0], &dev).unwrap()).unwrap();
    let b = Var::from_tensor(&Tensor::new(&[4.0f32], &dev).unwrap()).unwrap();
    let mut grads = grads_equal_to_values(&[&a, &b]);
    let vars = vec![a.clone(), b.clone()];
    let norm = clip_grad_norm(&mut grads, &vars, 1.0).unwrap();
    assert!((norm - 5.0).abs() < 1e-6);
    let ga: Vec<f32> = grads.get(a.as_tensor()).unwrap().to_vec1().unwrap();
    let gb: Vec<f32> = grads.get(b.as_tensor()).unwrap().to_vec1().unwrap();
    let clipped = (ga[0].powi(2) + ga[1].powi(2) + gb[0].powi(2)).sqrt();
    assert!((clipped - 1.0).abs() < 1e-5, "{clipped}");
    // Below the threshold nothing changes.
    let norm2 = clip_grad_norm(&mut grads, &vars, 10.0).unwrap();
    assert!((norm2 - 1.0).abs() < 1e-5);
    let ga2: Vec<f32> = grads.get(a.as_tensor()).unwrap().to_vec1().unwrap();
    assert_eq!(ga, ga2);
}

#[test]
fn clip_grad_norm_of_gradients_off_the_host_path_sums_every_entry() {
    // bf16 gradients take the device path (row sums, one read-back) even on the CPU.
    let dev = Device::Cpu;
    let bf = |v: &[f32], shape: &[usize]| {
        let t = Tensor::from_vec(v.to_vec(), shape, &dev).unwrap();
        Var::from_tensor(&t.to_dtype(candle_core::DType::BF16).unwrap()).unwrap()
    };
    let a = bf(&[0.0, 2.0, 0.0, 1.0, 2.0, 0.0], &[2, 3]);
    let b = bf(&[4.0], &[1]);
    let mut grads = grads_equal_to_values(&[&a, &b]);
    let norm = clip_grad_norm(&mut grads, &[a.clone(), b.clone()], 1.0).unwrap();
    // √(2² + 1² + 2² + 4²) = 5.
    assert!((norm - 5.0).abs() < 1e-6, "{norm}");
    let gb = grads.get(b.as_tensor()).unwrap();
    let gb: Vec<f32> = gb
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!((gb[0] - 0.8).abs() < 1e-2, "{gb:?}");
}
