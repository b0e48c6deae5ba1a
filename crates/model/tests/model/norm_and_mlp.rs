//! RMSNorm, SwiGLU's product and a projection's bias on the test device
//! (`AGENTRL_TEST_DEVICE`; on a GPU, `kernels/rms_norm.cu`,
//! `kernels/swiglu.cu` and `kernels/bias.cu`) against candle's composites in
//! f64 on the host: outputs and the gradients of a weighted sum with
//! respect to every input.

use agentrl_model::bias::add_bias;
use agentrl_model::ops::{rms_norm, swiglu};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::device::{host_f64 as host, max_abs_diff, test_device};

type Op = fn(&Tensor, &Tensor) -> Tensor;

fn fused_rms(x: &Tensor, w: &Tensor) -> Tensor {
    rms_norm(x, w, 1e-6).expect("a fused RMSNorm here").unwrap()
}

fn composite_rms(x: &Tensor, w: &Tensor) -> Tensor {
    let inv = x
        .sqr()
        .and_then(|t| t.mean_keepdim(candle_core::D::Minus1))
        .and_then(|t| t.affine(1.0, 1e-6))
        .and_then(|t| t.sqrt())
        .and_then(|t| t.recip())
        .unwrap();
    x.broadcast_mul(&inv)
        .and_then(|t| t.broadcast_mul(w))
        .unwrap()
}

fn fused_swiglu(a: &Tensor, b: &Tensor) -> Tensor {
    swiglu(a, b).expect("a fused SwiGLU here").unwrap()
}

fn composite_swiglu(a: &Tensor, b: &Tensor) -> Tensor {
    (a.silu().unwrap() * b).unwrap()
}

fn fused_bias(y: &Tensor, b: &Tensor) -> Tensor {
    add_bias(y, b).unwrap()
}

fn composite_bias(y: &Tensor, b: &Tensor) -> Tensor {
    y.broadcast_add(b).unwrap()
}

/// One op under test: its fused and composite forms and its second input
/// (RMSNorm's is the `[d]` weight).
struct Case<'a> {
    name: &'static str,
    fused: Op,
    composite: Op,
    second: &'a [f64],
    second_dims: &'a [usize],
}

/// `[output, d/d first, d/d second]` as f64 of `op` on `x: dims` and the
/// case's second input, in `dtype` on `dev`, weighted by `c`.
fn run(
    op: Op,
    case: &Case,
    x: &[f64],
    c: &[f64],
    dims: &[usize],
    (dev, dtype): (&Device, DType),
) -> [Vec<f64>; 3] {
    let make = |v: &[f64], d: &[usize]| {
        Tensor::from_vec(v.to_vec(), d, dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let xv = Var::from_tensor(&make(x, dims)).unwrap();
    let yv = Var::from_tensor(&make(case.second, case.second_dims)).unwrap();
    let out = op(xv.as_tensor(), yv.as_tensor());
    let grads = (&out * make(c, dims))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    [
        host(&out),
        host(grads.get(xv.as_tensor()).unwrap()),
        host(grads.get(yv.as_tensor()).unwrap()),
    ]
}

#[test]
fn rms_norm_swiglu_and_bias_on_the_test_device_match_the_f64_composites() {
    let dev = test_device();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut dtypes = vec![(DType::F32, 1e-4)];
    if dev.is_cuda() {
        dtypes.push((DType::BF16, 0.1));
    }
    // 300 rows: more than one row per dw partial chunk on a GPU.
    for (rows, d) in [(4, 8), (300, 1100)] {
        let dims = [rows, d];
        let n = rows * d;
        let x: Vec<f64> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let y: Vec<f64> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let w: Vec<f64> = (0..d).map(|_| rng.random_range(0.5..1.5)).collect();
        let c: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let cases = [
            Case {
                name: "rms norm",
                fused: fused_rms,
                composite: composite_rms,
                second: &w,
                second_dims: &[d],
            },
            Case {
                name: "bias",
                fused: fused_bias,
                composite: composite_bias,
                second: &w,
                second_dims: &[d],
            },
            Case {
                name: "swiglu",
                fused: fused_swiglu,
                composite: composite_swiglu,
                second: &y,
                second_dims: &dims,
            },
        ];
        for case in &cases {
            let reference = run(
                case.composite,
                case,
                &x,
                &c,
                &dims,
                (&Device::Cpu, DType::F64),
            );
            for &(dtype, tol) in &dtypes {
                let got = run(case.fused, case, &x, &c, &dims, (&dev, dtype));
                for (k, what) in [
                    "output",
                    "first input's gradient",
                    "second input's gradient",
                ]
                .iter()
                .enumerate()
                {
                    // The weight's (and the bias's) gradient sums over every row:
                    // its error grows like √rows.
                    let scale = if k == 2 && case.name != "swiglu" {
                        (rows as f64).sqrt()
                    } else {
                        1.0
                    };
                    let e = max_abs_diff(&got[k], &reference[k]);
                    assert!(
                        e < tol * scale,
                        "{} {rows}x{d} {dtype:?}: {what} off by {e}",
                        case.name
                    );
                }
            }
        }
    }
}
