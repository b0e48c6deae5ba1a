//! The device the model tests that honour it run on: `AGENTRL_TEST_DEVICE`
//! = `cpu` (the default) or `cuda` (device 0; needs the `cuda` feature and
//! a GPU, so CI never sets it). Declared once in `main.rs`; a module uses it
//! with `use crate::device`.

use candle_core::Device;

/// The device named by `AGENTRL_TEST_DEVICE`.
pub fn test_device() -> Device {
    match std::env::var("AGENTRL_TEST_DEVICE").as_deref() {
        Err(_) | Ok("") | Ok("cpu") => Device::Cpu,
        Ok("cuda") => {
            agentrl_model::open_cuda(0).expect("AGENTRL_TEST_DEVICE=cuda: no CUDA device 0")
        }
        Ok(other) => panic!("AGENTRL_TEST_DEVICE={other}: expected cpu or cuda"),
    }
}

/// `t`'s values as f64 on the host, flattened (for comparing a device's
/// results with a host reference).
pub fn host_f64(t: &candle_core::Tensor) -> Vec<f64> {
    let t = t.to_dtype(candle_core::DType::F64).unwrap();
    let t = t.to_device(&Device::Cpu).unwrap();
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// The largest |a − b| over two equally long slices.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared results differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
