//! The precision of the large matrix products on the CPU.

use serde::{Deserialize, Serialize};

/// What the CPU's large matrix products (the projections and the LM head,
/// forward and backward) round their inputs to. Weights, optimizer state,
/// activations and every other op stay f32 either way.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 inputs and sums.
    #[default]
    F32,
    /// Inputs rounded to bfloat16 (to nearest even), products summed in f32,
    /// as PyTorch's bf16 autocast does for a linear layer. Needs AVX512-BF16
    /// (AMD Zen 4 and later, Intel Sapphire Rapids and later).
    Bf16,
}

impl Precision {
    /// Whether this CPU runs the precision's products (f32 always).
    pub fn available(self) -> bool {
        match self {
            Precision::F32 => true,
            #[cfg(target_arch = "x86_64")]
            Precision::Bf16 => crate::gemm_bf16::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Precision::Bf16 => false,
        }
    }

    /// The name configs and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(format!(
                "unknown precision {other:?}: expected \"f32\" or \"bf16\""
            )),
        }
    }
}
