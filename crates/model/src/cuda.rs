//! The crate's own CUDA kernels (`kernels/*.cu`, compiled to PTX by
//! `build.rs`) and what every launch of them needs.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView};
use candle_core::{Layout, Result};

/// One PTX module of `kernels/`, loaded once per device under its name.
pub(crate) struct Module {
    pub name: &'static str,
    pub ptx: &'static str,
}

/// `kernels/adamw.cu`.
pub(crate) const ADAMW: Module = Module {
    name: "agentrl_adamw",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/adamw.ptx")),
};

/// `kernels/token_loss.cu`.
pub(crate) const TOKEN_LOSS: Module = Module {
    name: "agentrl_token_loss",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/token_loss.ptx")),
};

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
