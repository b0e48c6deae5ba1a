use candle_core::{Device, Tensor, Var};

use super::*;

fn t2(rows: &[&[f32]]) -> Tensor {
    let v: Vec<Vec<f32>> = rows.iter().map(|r| r.to_vec()).collect();
    ragged_to_tensor(&v, &Device::Cpu).unwrap()
}

fn scalar(t: &Tensor) -> f32 {
    t.to_scalar::<f32>().unwrap()
}

fn close(a: f32, b: f32, tol: f32) {
    assert!((a - b).abs() <= tol, "{a} vs {b}");
}

#[test]
fn aggregation_modes_differ_on_ragged_masks() {
    // row 0: 4 policy tokens [1, 2, 3, 4]; row 1: 1 policy token [10] (+ padding).
    //   token-mean          = (1+2+3+4+10) / 5         = 4
    //   seq-mean-token-sum  = ((1+2+3+4) + 10) / 2     = 10
    //   seq-mean-token-mean = (10/4 + 10/1) / 2        = 6.25
    let loss = t2(&[&[1.0, 2.0, 3.0, 4.0], &[10.0, 99.0, 99.0, 99.0]]);
    let mask = t2(&[&[1.0, 1.0, 1.0, 1.0], &[1.0, 0.0, 0.0, 0.0]]);
    close(
        scalar(&aggregate(&loss, &mask, LossAgg::TokenMean).unwrap()),
        4.0,
        1e-5,
    );
    close(
        scalar(&aggregate(&loss, &mask, LossAgg::SeqMeanTokenSum).unwrap()),
        10.0,
        1e-5,
    );
    close(
        scalar(&aggregate(&loss, &mask, LossAgg::SeqMeanTokenMean).unwrap()),
        6.25,
        1e-5,
    );
}

#[test]
fn aggregation_of_empty_mask_is_zero_not_nan() {
    let loss = t2(&[&[1.0, 2.0]]);
    let mask = t2(&[&[0.0, 0.0]]);
    for agg in [
        LossAgg::TokenMean,
        LossAgg::SeqMeanTokenSum,
        LossAgg::SeqMeanTokenMean,
    ] {
        assert_eq!(scalar(&aggregate(&loss, &mask, agg).unwrap()), 0.0);
    }
}

/// The unweighted token-mean PPO loss, the setting of most tests below.
fn token_mean_ppo(
    lp: &Tensor,
    old: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    clip: &PpoClip,
) -> PolicyLoss {
    ppo_policy_loss(lp, old, adv, mask, clip, LossAgg::TokenMean, None).unwrap()
}

#[test]
fn ppo_loss_at_ratio_one_is_minus_mean_advantage() {
    // logπ = logπ_old → r = 1 everywhere, nothing clipped, loss = −mean(A)
    // over policy tokens: −(1 − 2 + 3 + 0.5 + 0) / 5 = −0.5 (the masked 9 is ignored).
    let lp = t2(&[&[-1.0, -2.0, -0.5], &[-0.1, -3.0, -1.0]]);
    let adv = t2(&[&[1.0, -2.0, 3.0], &[0.5, 9.0, 0.0]]);
    let mask = t2(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 1.0]]);
    let out = token_mean_ppo(&lp, &lp, &adv, &mask, &PpoClip::default());
    close(scalar(&out.loss), -0.5, 1e-6);
    assert_eq!(out.clip_fraction, 0.0);
    assert_eq!(out.clip_fraction_lower, 0.0);
    assert_eq!(out.approx_kl, 0.0);
}

#[test]
fn ppo_clip_fraction_with_asymmetric_clip() {
    // ε_low = 0.2, ε_high = 0.28: clip range [0.8, 1.28]. logπ_old = 0, logπ = ln r.
    //   r=1.5,  A=+1: ℓ1=−1.5,  ℓ2=−1.28 → clipped,   ℓ=−1.28
    //   r=1.1,  A=+1: ℓ1=ℓ2=−1.1         → unclipped, ℓ=−1.1
    //   r=0.7,  A=+1: ℓ1=−0.7, ℓ2=−0.8   → unclipped, ℓ=−0.7
    //   r=0.7,  A=−1: ℓ1=0.7,  ℓ2=0.8    → clipped,   ℓ=0.8 (< dual bound 3)
    //   r=1.25, A=+1: inside 1.28 (a symmetric 0.2 clip would cut it) ℓ=−1.25
    // clip fraction = 2/5 = 0.4; loss = (−1.28 −1.1 −0.7 +0.8 −1.25)/5 = −3.53/5 = −0.706
    // approx_kl = −mean(ln r) = −(0.405465 + 0.095310 − 0.356675·2 + 0.223144)/5 = −0.0021138
    let r = [1.5f32, 1.1, 0.7, 0.7, 1.25];
    let lp = t2(&[&r.map(f32::ln)]);
    let old = t2(&[&[0.0; 5]]);
    let adv = t2(&[&[1.0, 1.0, 1.0, -1.0, 1.0]]);
    let mask = t2(&[&[1.0; 5]]);
    let clip = PpoClip {
        clip_ratio_low: 0.2,
        clip_ratio_high: 0.28,
        clip_ratio_c: Some(3.0),
    };
    let out = token_mean_ppo(&lp, &old, &adv, &mask, &clip);
    close(scalar(&out.loss), -0.706, 1e-5);
    close(out.clip_fraction, 0.4, 1e-6);
    close(out.clip_fraction_lower, 0.0, 1e-6);
    close(out.approx_kl, -0.0021138, 1e-6);
    // Symmetric 0.2 clips the r=1.25 token too: 3/5.
    let sym = PpoClip {
        clip_ratio_high: 0.2,
        ..clip
    };
    let out = token_mean_ppo(&lp, &old, &adv, &mask, &sym);
    close(out.clip_fraction, 0.6, 1e-6);
}

#[test]
fn ppo_dual_clip_caps_negative_advantage_loss() {
    // clip [0.8, 1.28], c = 3:
    //   r=5, A=−1: ℓ1=5, ℓ2=1.28 → ℓclip=5; ℓ3=3 → dual-clipped ℓ=3
    //   r=2, A=−1: ℓclip=2 < 3 → ℓ=2
    //   r=5, A=+1: ℓ1=−5, ℓ2=−1.28 → ℓ=−1.28 (dual clip only for A<0)
    // with dual clip: loss = (3 + 2 − 1.28)/3 = 1.24, lower fraction 1/3
    // without:        loss = (5 + 2 − 1.28)/3 = 1.906667
    // ε clip (ℓ2 > ℓ1): r=5,A=−1: 1.28 > 5 no; r=2,A=−1: 1.28 > 2 no;
    //   r=5,A=+1: −1.28 > −5 yes → clip fraction 1/3.
    let lp = t2(&[&[5f32.ln(), 2f32.ln(), 5f32.ln()]]);
    let old = t2(&[&[0.0; 3]]);
    let adv = t2(&[&[-1.0, -1.0, 1.0]]);
    let mask = t2(&[&[1.0; 3]]);
    let clip = PpoClip::default();
    let out = token_mean_ppo(&lp, &old, &adv, &mask, &clip);
    close(scalar(&out.loss), 1.24, 1e-5);
    close(out.clip_fraction_lower, 1.0 / 3.0, 1e-6);
    close(out.clip_fraction, 1.0 / 3.0, 1e-6);
    let no_dual = PpoClip {
        clip_ratio_c: None,
        ..clip
    };
    let out = token_mean_ppo(&lp, &old, &adv, &mask, &no_dual);
    close(scalar(&out.loss), 1.906667, 1e-5);
    assert_eq!(out.clip_fraction_lower, 0.0);
}

#[test]
fn ppo_rejects_dual_clip_bound_at_most_one() {
    let x = t2(&[&[0.0]]);
    let clip = PpoClip {
        clip_ratio_c: Some(1.0),
        ..PpoClip::default()
    };
    assert!(ppo_policy_loss(&x, &x, &x, &x, &clip, LossAgg::TokenMean, None).is_err());
}

#[test]
fn ppo_loss_gradient_flows_to_logprobs_only_where_unclipped() {
    // token 0: r=1, A=2 → dℓ/dlogπ = −A·r = −2, / 3 tokens (token-mean) = −0.666667
    // token 1: r=1.5 > 1.28, A=1 → clipped → gradient 0
    // token 2: masked out → gradient 0
    let lp = Var::from_tensor(&t2(&[&[0.0, 1.5f32.ln(), 0.0]])).unwrap();
    let old = t2(&[&[0.0; 3]]);
    let adv = t2(&[&[2.0, 1.0, 5.0]]);
    let mask = t2(&[&[1.0, 1.0, 0.0]]);
    let out = token_mean_ppo(lp.as_tensor(), &old, &adv, &mask, &PpoClip::default());
    let grads = out.loss.backward().unwrap();
    let g = grads.get(lp.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
    // token-mean over 2 policy tokens: −2 / 2 = −1
    close(g[0][0], -1.0, 1e-5);
    close(g[0][1], 0.0, 1e-7);
    close(g[0][2], 0.0, 1e-7);
}

#[test]
fn kl_estimators_on_hand_values() {
    // d = logπ − logπ_ref:
    //   token 0: −1 − (−1.5) = 0.5 → k1 0.5, k2 0.125, k3 = e^{−0.5} + 0.5 − 1 = 0.1065307
    //   token 1: −2 − (−1)   = −1  → k1 −1,  k2 0.5,   k3 = e^{1} − 1 − 1 = 0.7182818
    //   token 2: −30 − 0     = −30 → k3: ref−logπ = 30 → clamp 20 → e^20 − 21 → clamp 10
    let lp = t2(&[&[-1.0, -2.0, -30.0]]);
    let rf = t2(&[&[-1.5, -1.0, 0.0]]);
    let k1 = kl_penalty(&lp, &rf, KlKind::Kl)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let k2 = kl_penalty(&lp, &rf, KlKind::Mse)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let k3 = kl_penalty(&lp, &rf, KlKind::LowVarKl)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for (got, want) in k1[0].iter().zip([0.5, -1.0, -30.0]) {
        close(*got, want, 1e-6);
    }
    for (got, want) in k2[0].iter().zip([0.125, 0.5, 450.0]) {
        close(*got, want, 1e-4);
    }
    for (got, want) in k3[0].iter().zip([0.1065307, 0.7182818, 10.0]) {
        close(*got, want, 1e-5);
    }
}

#[test]
fn value_loss_takes_the_pessimistic_clipped_term() {
    // c = 0.2, V_old = 0.5 → clip range [0.3, 0.7]
    //   V=1.0, R=2: V_clip=0.7; (1−2)²=1, (0.7−2)²=1.69 → 1.69 (clipped)
    //   V=0.0, R=0: V_clip=0.3; 0,        0.09         → 0.09 (clipped)
    //   V=0.5, R=0: V_clip=0.5; 0.25,     0.25         → 0.25
    // loss = ½ · (1.69 + 0.09 + 0.25)/3 = 0.3383333; clip fraction 2/3
    let v = Var::from_tensor(&t2(&[&[1.0, 0.0, 0.5]])).unwrap();
    let old = t2(&[&[0.5; 3]]);
    let ret = t2(&[&[2.0, 0.0, 0.0]]);
    let mask = t2(&[&[1.0; 3]]);
    let out = value_loss(v.as_tensor(), &old, &ret, &mask, 0.2, LossAgg::TokenMean).unwrap();
    close(scalar(&out.loss), 0.3383333, 1e-6);
    close(out.clip_fraction, 2.0 / 3.0, 1e-6);
    // Gradient: clipped tokens 0 and 1 get none (their max is the constant
    // clipped term); token 2 is a tie, split evenly between two paths that
    // both lead to V: ½ · 2(V−R)/3 = (0.5)/3 = 0.1666667.
    let g = out.loss.backward().unwrap();
    let g = g.get(v.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
    close(g[0][0], 0.0, 1e-7);
    close(g[0][1], 0.0, 1e-7);
    close(g[0][2], 0.1666667, 1e-6);
}

#[test]
fn entropy_of_uniform_and_skewed_logits() {
    // [0, 0] → ln 2 = 0.6931472; [0, ln 3] → p = (0.25, 0.75),
    // H = −(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351
    let logits =
        Tensor::from_vec(vec![0.0f32, 0.0, 0.0, 3f32.ln()], (1, 2, 2), &Device::Cpu).unwrap();
    let h = entropy_from_logits(&logits)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    close(h[0][0], std::f32::consts::LN_2, 1e-6);
    close(h[0][1], 0.5623351, 1e-6);
    let mask = t2(&[&[1.0, 0.0]]);
    let e = entropy_bonus(
        &Tensor::new(&[[1.0f32, 5.0]], &Device::Cpu).unwrap(),
        &mask,
        LossAgg::TokenMean,
    )
    .unwrap();
    close(scalar(&e), 1.0, 1e-6);
}

#[test]
fn shape_mismatch_is_an_error() {
    let a = t2(&[&[0.0, 0.0]]);
    let b = t2(&[&[0.0, 0.0, 0.0]]);
    assert!(aggregate(&a, &b, LossAgg::TokenMean).is_err());
    assert!(kl_penalty(&a, &b, KlKind::Kl).is_err());
}

/// Central finite differences of `f` at `x` (f64), one coordinate at a time.
fn numeric_grad(x: &[f64], shape: &[usize], f: &dyn Fn(&Tensor) -> f64) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let mut plus = x.to_vec();
            let mut minus = x.to_vec();
            plus[i] += h;
            minus[i] -= h;
            let tp = Tensor::from_vec(plus, shape, &Device::Cpu).unwrap();
            let tm = Tensor::from_vec(minus, shape, &Device::Cpu).unwrap();
            (f(&tp) - f(&tm)) / (2.0 * h)
        })
        .collect()
}

/// Checks the autograd gradient of the scalar `f` at `x` against central
/// differences; returns the autograd gradient.
fn assert_grad_matches_finite_differences(
    x: &[f64],
    shape: &[usize],
    f: &dyn Fn(&Tensor) -> Tensor,
) -> Vec<f64> {
    let var =
        Var::from_tensor(&Tensor::from_vec(x.to_vec(), shape, &Device::Cpu).unwrap()).unwrap();
    let grads = f(var.as_tensor()).backward().unwrap();
    let analytic: Vec<f64> = grads
        .get(var.as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let numeric = numeric_grad(x, shape, &|x| f(x).to_scalar::<f64>().unwrap());
    for (a, n) in analytic.iter().zip(&numeric) {
        assert!(
            (a - n).abs() < 1e-6,
            "analytic {analytic:?}\nnumeric  {numeric:?}"
        );
    }
    analytic
}

#[test]
fn loss_gradients_match_finite_differences() {
    // f64 tensors, points chosen away from every clip boundary and kink, so
    // the loss is smooth around them: some tokens are clipped (gradient 0),
    // one is dual-clipped, the rest are not.
    let shape = (2, 4);
    let dev = Device::Cpu;
    // ratios r = exp(lp − old): 1.105 (A>0, inside), 0.819 (A<0, inside),
    // 2.014 (A>0, ε-clipped), 0.223 (A<0, ε-clipped), 1.105 (inside),
    // 4.055 (A<0, dual-clipped at c = 3), masked, 0.905 (inside).
    let lp: Vec<f64> = vec![-0.9, -1.2, -0.3, -2.0, -0.5, 0.4, -0.05, -1.1];
    let old = Tensor::from_vec(
        vec![-1.0f64, -1.0, -1.0, -0.5, -0.6, -1.0, -0.9, -1.0],
        shape,
        &dev,
    )
    .unwrap();
    let adv = Tensor::from_vec(
        vec![1.0f64, -0.5, 2.0, -1.5, 0.7, -1.0, 1.0, 0.3],
        shape,
        &dev,
    )
    .unwrap();
    let refl = Tensor::from_vec(
        vec![-1.1f64, -0.8, -0.6, -1.9, -0.4, -1.5, -0.3, -1.3],
        shape,
        &dev,
    )
    .unwrap();
    let mask =
        Tensor::from_vec(vec![1.0f64, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0], shape, &dev).unwrap();
    let clip = PpoClip::default();
    let total = |x: &Tensor| -> Tensor {
        let pl =
            ppo_policy_loss(x, &old, &adv, &mask, &clip, LossAgg::SeqMeanTokenMean, None).unwrap();
        let k3 = aggregate(
            &kl_penalty(x, &refl, KlKind::LowVarKl).unwrap(),
            &mask,
            LossAgg::TokenMean,
        )
        .unwrap();
        let k2 = aggregate(
            &kl_penalty(x, &refl, KlKind::Mse).unwrap(),
            &mask,
            LossAgg::SeqMeanTokenSum,
        )
        .unwrap();
        ((pl.loss + (k3 * 0.3).unwrap()).unwrap() + (k2 * 0.1).unwrap()).unwrap()
    };
    let analytic = assert_grad_matches_finite_differences(&lp, &[2, 4], &total);
    // The masked token (row 1, col 2) gets no gradient at all.
    assert_eq!(analytic[6], 0.0);

    // Value loss, in the values.
    let vals: Vec<f64> = vec![0.1, 0.9, 0.45, -0.15, 0.3, 0.0, 0.7, 1.4];
    let old_v = Tensor::from_vec(
        vec![0.0f64, 0.5, 0.5, 0.0, 0.25, 0.1, 0.7, 1.0],
        shape,
        &dev,
    )
    .unwrap();
    let ret = Tensor::from_vec(
        vec![1.0f64, 0.0, 0.5, -1.0, 0.3, 0.2, 0.0, 2.0],
        shape,
        &dev,
    )
    .unwrap();
    let vtotal = |x: &Tensor| {
        value_loss(x, &old_v, &ret, &mask, 0.2, LossAgg::TokenMean)
            .unwrap()
            .loss
    };
    assert_grad_matches_finite_differences(&vals, &[2, 4], &vtotal);
}

#[test]
fn entropy_gradient_matches_finite_differences() {
    let logits: Vec<f64> = vec![0.3, -1.0, 2.0, 0.5, 0.5, -0.7];
    let dev = Device::Cpu;
    let mask = Tensor::from_vec(vec![1.0f64, 1.0], (1, 2), &dev).unwrap();
    let f = |x: &Tensor| {
        entropy_bonus(&entropy_from_logits(x).unwrap(), &mask, LossAgg::TokenMean).unwrap()
    };
    assert_grad_matches_finite_differences(&logits, &[1, 2, 3], &f);
}

#[test]
fn token_weights_scale_each_token_loss_and_its_gradient() {
    // Ratio 1 (logπ = logπ_old), so ℓ_t = −A_t (no clip; the dual clip's
    // bound c·|A| = 6 is above 2). Weights 2, 0.5, 1:
    //   weighted ℓ = [−2, 1, −3], token-mean = −4/3;
    //   ∂loss/∂logπ_t = −A_t·w_t·r / 3 = [−2/3, 1/3, −1].
    let lp = Var::from_tensor(&t2(&[&[-0.5, -1.0, -2.0]])).unwrap();
    let adv = t2(&[&[1.0, -2.0, 3.0]]);
    let mask = t2(&[&[1.0, 1.0, 1.0]]);
    let w = t2(&[&[2.0, 0.5, 1.0]]);
    let clip = PpoClip::default();
    let old = lp.as_tensor().detach();
    let weighted = |w: Option<&Tensor>| {
        ppo_policy_loss(
            lp.as_tensor(),
            &old,
            &adv,
            &mask,
            &clip,
            LossAgg::TokenMean,
            w,
        )
    };
    let out = weighted(Some(&w)).unwrap();
    close(scalar(&out.loss), -4.0 / 3.0, 1e-5);
    let grad = out.loss.backward().unwrap();
    let g: Vec<f32> = grad
        .get(&lp)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    for (got, want) in g.iter().zip([-2.0 / 3.0, 1.0 / 3.0, -1.0]) {
        close(*got, want, 1e-5);
    }
    // Without weights it is exactly the loss of weights 1 (same bits).
    let plain = weighted(None).unwrap();
    let ones = weighted(Some(&t2(&[&[1.0, 1.0, 1.0]]))).unwrap();
    assert_eq!(scalar(&plain.loss).to_bits(), scalar(&ones.loss).to_bits());
    close(scalar(&plain.loss), -2.0 / 3.0, 1e-5);
    // Weights of another shape are an error.
    let short = t2(&[&[1.0, 1.0]]);
    assert!(weighted(Some(&short)).is_err());
}
