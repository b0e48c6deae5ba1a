//! `--device cpu|cuda`: where a command's model runs.

use agentrl_model::candle_core::Device;
use anyhow::Context;

/// Where a command's model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// The CPU, with candle's thread count.
    Cpu,
    /// CUDA device 0 (needs a build with the `cuda` feature).
    Cuda,
}

impl DeviceArg {
    /// The name `--device` takes.
    pub fn name(self) -> &'static str {
        match self {
            DeviceArg::Cpu => "cpu",
            DeviceArg::Cuda => "cuda",
        }
    }

    /// The candle device; an error naming the build flag when there is no CUDA.
    pub fn open(self) -> anyhow::Result<Device> {
        match self {
            DeviceArg::Cpu => Ok(Device::Cpu),
            DeviceArg::Cuda => agentrl_model::open_cuda(0).context(
                "--device cuda: no CUDA device 0 (build with `--features agentrl-model/cuda`)",
            ),
        }
    }
}
