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
