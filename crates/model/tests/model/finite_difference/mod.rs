//! The finite-difference check the gradient tests share (f64 parameters),
//! the parameter reads around it, and a few-step AdamW fit.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

/// A tensor's values as f64 on the host, flattened.
#[allow(dead_code)] // public for the test files that read values themselves
pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The names of named parameters (`named_vars`, `trainable_named_vars`), in order.
pub fn var_names(vars: Vec<(String, Var)>) -> Vec<String> {
    vars.into_iter().map(|(name, _)| name).collect()
}

/// Checks autograd's gradient of `var` in `grads` against the central
/// difference (ε = 1e-5) of the scalar `f` at the elements `picks(len)`, to a
/// relative 1e-6, and that `f` depends on `var` at all; `what` names the
/// tensor in messages. `var` keeps its values.
pub fn assert_gradient_matches<I: IntoIterator<Item = usize>>(
    what: &str,
    var: &Var,
    grads: &GradStore,
    picks: impl FnOnce(usize) -> I,
    f: impl Fn() -> f64,
) {
    const EPS: f64 = 1e-5;
    let grad = values(
        grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{what}: no gradient")),
    );
    let flat = values(var.as_tensor());
    let set = |i: usize, x: f64| {
        let mut v = flat.clone();
        v[i] = x;
        var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
            .unwrap();
    };
    let mut nonzero = false;
    for i in picks(flat.len()) {
        set(i, flat[i] + EPS);
        let up = f();
        set(i, flat[i] - EPS);
        let down = f();
        set(i, flat[i]);
        let fd = (up - down) / (2.0 * EPS);
        nonzero |= fd.abs() > 1e-8;
        assert!(
            (fd - grad[i]).abs() <= 1e-6 * (1.0 + fd.abs()),
            "{what}[{i}]: autograd {} vs finite difference {fd}",
            grad[i]
        );
    }
    assert!(nonzero, "{what}: the scalar does not depend on it");
}

/// Trains `model`'s trainable parameters for `steps` AdamW steps (lr 2e-2,
/// no weight decay) on the negative log-likelihood of two fixed sequences;
/// the loss before and after.
#[allow(dead_code)] // public for the test files that train a few steps
pub fn fit_two_sequences(model: &agentrl_model::PolicyModel, steps: usize) -> (f32, f32) {
    use agentrl_model::{AdamW, AdamWConfig};
    let adamw = AdamWConfig {
        lr: 2e-2,
        weight_decay: 0.0,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(model.trainable_vars().unwrap(), adamw).unwrap();
    let seqs = vec![vec![1u32, 2, 3, 4, 5, 6, 7, 8], vec![9, 8, 7, 6]];
    let nll = || {
        let out = model.sequence_logprobs(&seqs).unwrap();
        (&out.logprobs * &out.mask)
            .unwrap()
            .sum_all()
            .unwrap()
            .neg()
            .unwrap()
    };
    let first = nll().to_scalar::<f32>().unwrap();
    for _ in 0..steps {
        let grads = nll().backward().unwrap();
        opt.step(&grads).unwrap();
    }
    (first, nll().to_scalar::<f32>().unwrap())
}

/// Weighted log-probs plus half the entropies of `seqs` under `model`,
/// summed over real tokens: a scalar that depends on every weight.
#[allow(dead_code)] // public for the test files that differentiate it
pub fn logprob_entropy_objective(model: &agentrl_model::PolicyModel, seqs: &[Vec<u32>]) -> Tensor {
    let out = model.sequence_logprobs(seqs).unwrap();
    let (b, t1) = out.logprobs.dims2().unwrap();
    let w: Vec<f64> = (0..b * t1).map(|i| 0.2 + 0.15 * (i % 4) as f64).collect();
    let w = Tensor::from_vec(w, (b, t1), out.logprobs.device())
        .unwrap()
        .to_dtype(out.logprobs.dtype())
        .unwrap();
    let lp = (&out.logprobs * &w).unwrap();
    let ent = out.entropy.affine(0.5, 0.0).unwrap();
    ((lp + ent).unwrap() * &out.mask)
        .unwrap()
        .sum_all()
        .unwrap()
}
