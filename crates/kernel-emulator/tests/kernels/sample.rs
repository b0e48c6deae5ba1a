//! `sample.cu`: greedy picks, inverse-CDF draws and non-finite rows.

use agentrl_kernel_emulator::kernels::*;
use agentrl_kernel_emulator::{launch, Grid, Shared};

use crate::*;

/// What one launch wrote per row.
struct Picks {
    token: Vec<u32>,
    logprob: Vec<f32>,
    bad: Vec<i32>,
    bad_value: Vec<f32>,
}

/// The kernel over `u.len()` rows of `v` logits in blocks of `threads`.
fn run_f32(logits: &[f32], v: usize, u: &[f64], inv_t: f32, threads: u32) -> Picks {
    let rows = u.len();
    let (mut x, mut u) = (logits.to_vec(), u.to_vec());
    let mut p = Picks {
        token: vec![u32::MAX; rows],
        logprob: vec![f32::NAN; rows],
        bad: vec![i32::MIN; rows],
        bad_value: vec![f32::NAN; rows],
    };
    let (xp, up) = (Shared::of(&mut x), Shared::of(&mut u));
    let (tp, lp) = (Shared::of(&mut p.token), Shared::of(&mut p.logprob));
    let (bp, bv) = (Shared::of(&mut p.bad), Shared::of(&mut p.bad_value));
    // SAFETY: x holds rows × v logits, the rest one value per row.
    unsafe {
        launch(Grid::linear(rows as u32, threads), || {
            sample_rows_f32(
                xp.ptr(),
                v as i32,
                up.ptr(),
                inv_t,
                tp.ptr(),
                lp.ptr(),
                bp.ptr(),
                bv.ptr(),
            )
        })
    }
    .unwrap();
    p
}

/// log Σ e^x of a row, in f64.
fn lse(row: &[f32]) -> f64 {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x.into()));
    m + row
        .iter()
        .map(|&x| (f64::from(x) - m).exp())
        .sum::<f64>()
        .ln()
}

#[test]
fn greedy_takes_the_lowest_index_among_maxima() {
    let v = 3000;
    let mut x = random(2 * v, 5.0, 50);
    x[1234] = 9.0;
    x[2900] = 9.0; // a tie: the lower index wins
    x[v + 17] = 7.5;
    let p = run_f32(&x, v, &[-1.0, -1.0], 1.0, 1024);
    assert_eq!(p.token, [1234, 17]);
    assert_eq!(p.bad, [-1, -1]);
    for r in 0..2 {
        let want = f64::from(x[r * v + p.token[r] as usize]) - lse(&x[r * v..][..v]);
        assert_close("greedy log-prob", &[f64::from(p.logprob[r])], &[want], 1e-5);
    }
}

#[test]
fn draws_fall_in_the_bucket_of_their_uniform() {
    // Segments of 20, 1 (some threads with none) and 3 logits, and a temperature.
    let cases = [
        (5000usize, 1.0f32, 51u64, 256),
        (100, 1.0, 52, 128),
        (3001, 1.0 / 0.7, 53, 1024),
    ];
    for (v, inv_t, seed, threads) in cases {
        let draws = [0.0, 0.25, 0.5, 0.731, 0.999_999, 0.1234];
        let rows = draws.len();
        let x = random(rows * v, 4.0, seed);
        let p = run_f32(&x, v, &draws, inv_t, threads);
        for r in 0..rows {
            let row = &x[r * v..][..v];
            let m = row.iter().fold(f32::NEG_INFINITY, |m, &a| m.max(a));
            let w: Vec<f64> = row
                .iter()
                .map(|&a| f64::from(((a - m) * inv_t).exp()))
                .collect();
            let total: f64 = w.iter().sum();
            let target = draws[r] * total;
            let t = p.token[r] as usize;
            let before: f64 = w[..t].iter().sum();
            // The pick's bucket holds the target, up to the sums' rounding.
            let slack = 1e-5 * total;
            assert!(
                before - slack <= target && target <= before + w[t] + slack,
                "v {v}, u {}: token {t} spans [{before}, {}], target {target}",
                draws[r],
                before + w[t]
            );
            let want = f64::from(row[t]) - lse(row);
            assert_close(
                "sampled log-prob",
                &[f64::from(p.logprob[r])],
                &[want],
                1e-5,
            );
            assert_eq!(p.bad[r], -1);
        }
    }
}

#[test]
fn draws_follow_the_softmax_over_many_uniforms() {
    // 4 tokens, probabilities e^x / Σ: a grid of uniforms lands on each in
    // proportion.
    let x = [0.0f32, 1.0, 2.0, -1.0];
    let n = 400;
    let draws: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) / n as f64).collect();
    let logits: Vec<f32> = draws.iter().flat_map(|_| x).collect();
    let p = run_f32(&logits, 4, &draws, 1.0, 32);
    let z: f64 = x.iter().map(|&a| f64::from(a).exp()).sum();
    for (k, &a) in x.iter().enumerate() {
        let share = p.token.iter().filter(|&&t| t as usize == k).count() as f64 / n as f64;
        let want = f64::from(a).exp() / z;
        assert!(
            (share - want).abs() <= 1.0 / n as f64,
            "token {k}: {share} against {want}"
        );
    }
}

#[test]
fn a_non_finite_logit_is_reported_not_sampled() {
    let v = 2000;
    let mut x = random(3 * v, 3.0, 54);
    x[v + 1500] = f32::NAN;
    x[v + 1700] = f32::INFINITY;
    x[2 * v + 3] = f32::NEG_INFINITY;
    let p = run_f32(&x, v, &[0.5, 0.5, -1.0], 1.0, 256);
    assert_eq!(p.bad, [-1, 1500, 3]);
    assert!(p.bad_value[1].is_nan());
    assert_eq!(p.bad_value[2], f32::NEG_INFINITY);
}

#[test]
fn bf16_logits_are_read_as_their_values() {
    let v = 1500;
    let x = random(v, 4.0, 55);
    let mut xb = to_bf16(&x);
    let rounded: Vec<f32> = xb.iter().map(|b| b.to_f32()).collect();
    let want = run_f32(&rounded, v, &[0.37], 1.0, 512);
    let (mut u, mut token, mut logprob, mut bad, mut bad_value) =
        (vec![0.37], vec![0u32], vec![0f32], vec![0i32], vec![0f32]);
    let (xp, up, tp, lp, bp, bv) = (
        Shared::of(&mut xb),
        Shared::of(&mut u),
        Shared::of(&mut token),
        Shared::of(&mut logprob),
        Shared::of(&mut bad),
        Shared::of(&mut bad_value),
    );
    // SAFETY: one row of v logits, one value of each output.
    unsafe {
        launch(Grid::linear(1, 512), || {
            sample_rows_bf16(
                xp.ptr(),
                v as i32,
                up.ptr(),
                1.0,
                tp.ptr(),
                lp.ptr(),
                bp.ptr(),
                bv.ptr(),
            )
        })
    }
    .unwrap();
    assert_eq!(
        (token[0], logprob[0], bad[0]),
        (want.token[0], want.logprob[0], -1)
    );
}
