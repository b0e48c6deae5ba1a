//! The crate's own CUDA kernels (`kernels/*.cu`, compiled to PTX by
//! `build.rs`) and what every launch of them needs.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig};
use candle_core::{CudaDevice, Layout, Result};

/// One PTX module of `kernels/`, loaded once per device under its name.
pub(crate) struct Module {
    pub name: &'static str,
    pub ptx: &'static str,
}

/// `kernels/bias.cu`.
pub(crate) const BIAS: Module = Module {
    name: "agentrl_bias",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/bias.ptx")),
};

/// `kernels/decode_attention.cu`.
pub(crate) const DECODE_ATTENTION: Module = Module {
    name: "agentrl_decode_attention",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/decode_attention.ptx")),
};

/// `kernels/embedding.cu`.
pub(crate) const EMBEDDING: Module = Module {
    name: "agentrl_embedding",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/embedding.ptx")),
};

/// `kernels/flash_attention.cu`.
pub(crate) const FLASH_ATTENTION: Module = Module {
    name: "agentrl_flash_attention",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/flash_attention.ptx")),
};

/// `kernels/kv_cache.cu`.
pub(crate) const KV_CACHE: Module = Module {
    name: "agentrl_kv_cache",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/kv_cache.ptx")),
};

/// `kernels/multi_tensor.cu`.
pub(crate) const MULTI_TENSOR: Module = Module {
    name: "agentrl_multi_tensor",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/multi_tensor.ptx")),
};

/// `kernels/rms_norm.cu`.
pub(crate) const RMS_NORM: Module = Module {
    name: "agentrl_rms_norm",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/rms_norm.ptx")),
};

/// `kernels/rope.cu`.
pub(crate) const ROPE: Module = Module {
    name: "agentrl_rope",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/rope.ptx")),
};

/// `kernels/sample.cu`.
pub(crate) const SAMPLE: Module = Module {
    name: "agentrl_sample",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/sample.ptx")),
};

/// `kernels/softmax.cu`.
pub(crate) const SOFTMAX: Module = Module {
    name: "agentrl_softmax",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/softmax.ptx")),
};

/// `kernels/swiglu.cu`.
pub(crate) const SWIGLU: Module = Module {
    name: "agentrl_swiglu",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/swiglu.ptx")),
};

/// `kernels/token_loss.cu`.
pub(crate) const TOKEN_LOSS: Module = Module {
    name: "agentrl_token_loss",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/token_loss.ptx")),
};

/// Left pads as the attention kernels read them: one u32 per batch element
/// (they read `pads[b]` only when their pad count is above 0; one 0 stands
/// in for none). Through candle's upload, which under CUDA-graph capture
/// serves the buffer an uncaptured step filled.
pub(crate) fn upload_pads(dev: &CudaDevice, pads: &[usize]) -> Result<CudaSlice<u32>> {
    let host: Vec<u32> = match pads {
        [] => vec![0],
        _ => pads
            .iter()
            .map(|&p| {
                u32::try_from(p).map_err(|_| candle_core::Error::Msg(format!("a pad of {p} keys")))
            })
            .collect::<Result<_>>()?,
    };
    dev.clone_htod(&host)
}

/// `v` as a u32 kernel argument, or an error naming `what`.
pub(crate) fn u32_arg(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("{what}: {v} past u32")))
}

/// The contiguous elements that `layout` picks out of `s`.
pub(crate) fn view<'a, T>(
    s: &'a CudaSlice<T>,
    layout: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(s.slice(a..b)),
        None => candle_core::bail!("{what} must be contiguous"),
    }
}

/// One block per row of `width` values (whole warps, up to 1024 threads)
/// over `rows` rows; an error for no rows (each block reads and writes its
/// row, so a block over an empty buffer would go out of bounds).
pub(crate) fn row_blocks(rows: usize, width: usize) -> Result<LaunchConfig> {
    let Ok(grid) = u32::try_from(rows) else {
        candle_core::bail!("{rows} rows is more than a grid holds")
    };
    if grid == 0 {
        candle_core::bail!("a row kernel over no rows")
    }
    Ok(LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: ((width.div_ceil(32) * 32).clamp(32, 1024) as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One block of 256 threads per 256 elements, grid-strided past 2¹⁶ blocks.
pub(crate) fn elementwise_blocks(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `$body` with `$v` bound to the `CudaSlice` of a float `CudaStorageSlice`
/// and `$suffix` to its kernel-name suffix (`f32`, `bf16`, `f16`); an error
/// naming `$what` for other dtypes.
macro_rules! on_float_slice {
    ($slice:expr, $what:expr, |$v:ident, $suffix:ident| $body:expr) => {{
        use candle_core::cuda_backend::CudaStorageSlice as S;
        match $slice {
            S::F32($v) => {
                let $suffix = "f32";
                $body
            }
            S::BF16($v) => {
                let $suffix = "bf16";
                $body
            }
            S::F16($v) => {
                let $suffix = "f16";
                $body
            }
            _ => candle_core::bail!("{}: no CUDA kernel for this dtype", $what),
        }
    }};
}
pub(crate) use on_float_slice;

/// Launches `$kernel` of `$module` on `$dev` (a `CudaDevice`) with
/// `$cfg` and the arguments in order; evaluates to `Result<()>`.
///
/// # Safety
/// Expands to an `unsafe` launch: the arguments must match the kernel's
/// parameters in number, type and order, and every pointer must cover
/// what the kernel reads and writes for `$cfg`.
macro_rules! launch {
    ($dev:expr, $module:expr, $kernel:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
        use candle_core::cuda_backend::WrapErr;
        let func = $dev.get_or_load_custom_func($kernel, $module.name, $module.ptx)?;
        let mut builder = func.builder();
        $( builder.arg($arg); )+
        // SAFETY: see the macro's contract; the caller states why it holds.
        unsafe { builder.launch($cfg) }.w().map(|_| ())
    }};
}
pub(crate) use launch;
