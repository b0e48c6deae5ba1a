//! The model's CUDA kernels (`crates/model/kernels/*.cu`) run on the CPU.
//!
//! `build.rs` compiles the kernel sources unchanged as C++ against
//! `cuda/cuda_emulation.h`, an emulation of the CUDA thread model: a grid's
//! blocks run one after another, each block's threads as OS threads with
//! real barriers for `__syncthreads` and the warp shuffles. So a kernel's
//! indexing, reductions and synchronisation are tested on every machine,
//! against host references, before a GPU ever runs it; the tests under
//! `tests/` do that. Timing, and memory ordering finer than a barrier's,
//! are not modelled: the model crate's cuda tests on a device stay the
//! final word.
//!
//! [`launch`] runs a grid; [`kernels`] declares the kernels by the names
//! their `extern "C"` definitions give them.

use std::ffi::c_void;

pub use half::bf16;

/// One launch's shape: `grid` blocks of `block` threads (x, y, z).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

impl Grid {
    /// `blocks` blocks of `threads` threads, both along x.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Self {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
        }
    }
}

/// A launch the emulator refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchError {
    #[error("a block of {0} threads (1 to 1024 allowed)")]
    BlockSize(u64),
}

extern "C" {
    fn agentrl_emulated_launch(
        grid: *const u32,
        block: *const u32,
        body: unsafe extern "C" fn(*const c_void),
        data: *const c_void,
    ) -> i32;
}

unsafe extern "C" fn call<F: Fn()>(data: *const c_void) {
    // SAFETY: `data` is the `&F` that `launch` passed, alive for the launch.
    unsafe { (*(data as *const F))() }
}

/// Runs `kernel_call` once as each thread of `grid` (it calls one kernel
/// of [`kernels`] with its arguments), returning when every block is done.
///
/// # Safety
/// The call's pointers must cover everything the kernel reads and writes
/// for this grid, as on a device.
pub unsafe fn launch<F: Fn() + Sync>(grid: Grid, kernel_call: F) -> Result<(), LaunchError> {
    let threads: u64 = grid.block.iter().map(|&d| u64::from(d)).product();
    if threads == 0 || threads > 1024 {
        return Err(LaunchError::BlockSize(threads));
    }
    // SAFETY: the dimensions are three u32s each; `call::<F>` reads back
    // the closure, which outlives the launch (it returns after the grid).
    let rc = unsafe {
        agentrl_emulated_launch(
            grid.grid.as_ptr(),
            grid.block.as_ptr(),
            call::<F>,
            &kernel_call as *const F as *const c_void,
        )
    };
    debug_assert_eq!(rc, 0, "the block size was checked above");
    Ok(())
}

/// A buffer's address that every emulated thread may use (the kernels'
/// own contract says who writes where).
#[derive(Clone, Copy, Debug)]
pub struct Shared<T>(pub *mut T);

// SAFETY: a plain address; what is done through it is the kernel's contract.
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// The address of `v`'s elements, for a kernel's input or output.
    pub fn of(v: &mut [T]) -> Self {
        Self(v.as_mut_ptr())
    }

    /// The address.
    pub fn ptr(self) -> *mut T {
        self.0
    }
}

/// Element strides (batch, head, row) of a `[batch, head, row, dim]` view
/// with a contiguous last dim: `Strides` of `flash_attention.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    pub b: i64,
    pub h: i64,
    pub i: i64,
}

/// An attention's sizes: `Sizes` of `flash_attention.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sizes {
    pub heads: i32,
    pub kv_heads: i32,
    pub t: i32,
    pub s: i32,
    pub n_pads: i32,
    pub scale: f32,
}

/// The kernels, by their `extern "C"` names in `crates/model/kernels`
/// (bf16 as [`bf16`]; the `_f16` instantiations are not declared).
pub mod kernels {
    use super::{bf16, Sizes, Strides};

    macro_rules! flash {
        ($t:ty, $fwd:ident, $dkdv:ident, $dkdv_heads:ident, $dq:ident) => {
            extern "C" {
                pub fn $fwd(
                    q: *const $t,
                    k: *const $t,
                    v: *const $t,
                    o: *mut $t,
                    lse: *mut f32,
                    pads: *const u32,
                    z: Sizes,
                    qs: Strides,
                    ks: Strides,
                    vs: Strides,
                    os: Strides,
                );
                pub fn $dkdv(
                    q: *const $t,
                    k: *const $t,
                    v: *const $t,
                    dout: *const $t,
                    lse: *const f32,
                    delta: *const f32,
                    dk: *mut $t,
                    dv: *mut $t,
                    pads: *const u32,
                    z: Sizes,
                    qs: Strides,
                    ks: Strides,
                    vs: Strides,
                    ds: Strides,
                    dks: Strides,
                    dvs: Strides,
                );
                pub fn $dkdv_heads(
                    q: *const $t,
                    k: *const $t,
                    v: *const $t,
                    dout: *const $t,
                    lse: *const f32,
                    delta: *const f32,
                    dk: *mut f32,
                    dv: *mut f32,
                    pads: *const u32,
                    z: Sizes,
                    qs: Strides,
                    ks: Strides,
                    vs: Strides,
                    ds: Strides,
                    dks: Strides,
                    dvs: Strides,
                );
                pub fn $dq(
                    q: *const $t,
                    k: *const $t,
                    v: *const $t,
                    dout: *const $t,
                    lse: *const f32,
                    delta: *const f32,
                    dq: *mut $t,
                    pads: *const u32,
                    z: Sizes,
                    qs: Strides,
                    ks: Strides,
                    vs: Strides,
                    ds: Strides,
                    dqs: Strides,
                );
            }
        };
    }

    macro_rules! decode_attention {
        ($t:ty, $name:ident) => {
            extern "C" {
                pub fn $name(
                    q: *const $t,
                    k: *const $t,
                    v: *const $t,
                    out: *mut $t,
                    pads: *const u32,
                    n_pads: i32,
                    last: *const u32,
                    heads: i32,
                    kv_heads: i32,
                    cap: i32,
                    hd: i32,
                    scale: f32,
                    q_bias: *const $t,
                    cs: *const $t,
                    flags: i32,
                );
            }
        };
    }

    macro_rules! bias {
        ($t:ty, $add:ident, $partial:ident, $finish:ident) => {
            extern "C" {
                pub fn $add(y: *const $t, b: *const $t, out: *mut $t, n: u64, cols: u32);
                pub fn $partial(g: *const $t, partial: *mut f32, rows: i32, cols: i32, per: i32);
                pub fn $finish(partial: *const f32, out: *mut $t, chunks: i32, cols: i32);
            }
        };
    }

    bias!(
        f32,
        bias_add_f32,
        column_sums_partial_f32,
        column_sums_finish_f32
    );
    bias!(
        bf16,
        bias_add_bf16,
        column_sums_partial_bf16,
        column_sums_finish_bf16
    );

    decode_attention!(f32, decode_attention_f32);
    decode_attention!(bf16, decode_attention_bf16);

    flash!(
        bf16,
        flash_fwd_bf16_hd64,
        flash_dkdv_bf16_hd64,
        flash_dkdv_heads_bf16_hd64,
        flash_dq_bf16_hd64
    );
    flash!(
        bf16,
        flash_fwd_bf16_hd128,
        flash_dkdv_bf16_hd128,
        flash_dkdv_heads_bf16_hd128,
        flash_dq_bf16_hd128
    );

    extern "C" {
        pub fn flash_delta_bf16(
            o: *const bf16,
            dout: *const bf16,
            delta: *mut f32,
            heads: i32,
            t: i32,
            hd: i32,
            os: Strides,
            ds: Strides,
        );
        pub fn flash_sum_heads_bf16(
            dk_part: *const f32,
            dv_part: *const f32,
            dk: *mut bf16,
            dv: *mut bf16,
            b: i32,
            z: Sizes,
            hd: i32,
            dks: Strides,
            dvs: Strides,
        );
    }

    macro_rules! typed {
        ($t:ty, $rms_fwd:ident, $rms_bwd_x:ident, $rms_w_partial:ident,
         $rms_w_sum:ident, $softmax:ident, $softmax_bwd:ident, $swiglu_fwd:ident,
         $swiglu_bwd:ident, $loss_fwd:ident, $loss_bwd:ident) => {
            extern "C" {
                pub fn $rms_fwd(x: *const $t, w: *const $t, y: *mut $t, d: i32, eps: f32);
                pub fn $rms_bwd_x(
                    x: *const $t,
                    w: *const $t,
                    g: *const $t,
                    dx: *mut $t,
                    d: i32,
                    eps: f32,
                );
                pub fn $rms_w_partial(
                    x: *const $t,
                    g: *const $t,
                    partial: *mut f32,
                    rows: i32,
                    d: i32,
                    eps: f32,
                    per: i32,
                );
                pub fn $rms_w_sum(partial: *const f32, dw: *mut $t, chunks: i32, d: i32);
                pub fn $softmax(
                    x: *const $t,
                    y: *mut $t,
                    pads: *const u32,
                    n_pads: i32,
                    t: i32,
                    s: i32,
                    rows_per_batch: i32,
                );
                pub fn $softmax_bwd(p: *const $t, g: *const $t, dx: *mut $t, s: i32);
                pub fn $swiglu_fwd(a: *const $t, b: *const $t, y: *mut $t, n: u64);
                pub fn $swiglu_bwd(a: *const $t, b: *const $t, g: *const $t, out: *mut $t, n: u64);
                pub fn $loss_fwd(logits: *const $t, targets: *const u32, out: *mut f32, v: i32);
                pub fn $loss_bwd(
                    logits: *const $t,
                    targets: *const u32,
                    aux: *const f32,
                    dx: *mut $t,
                    v: i32,
                );
            }
        };
    }

    macro_rules! multi_tensor {
        ($sum_squares:ident, $scale:ident, $adamw:ident) => {
            extern "C" {
                pub fn $sum_squares(
                    tensors: *const u64,
                    chunks: *const u64,
                    chunk: u64,
                    partial: *mut f32,
                );
                pub fn $scale(tensors: *const u64, chunks: *const u64, chunk: u64, coef: f32);
                pub fn $adamw(
                    tensors: *const u64,
                    chunks: *const u64,
                    chunk: u64,
                    lr: f32,
                    beta1: f32,
                    beta2: f32,
                    eps: f32,
                    keep: f32,
                    bc1: f32,
                    bc2: f32,
                );
            }
        };
    }

    macro_rules! sample {
        ($t:ty, $name:ident) => {
            extern "C" {
                pub fn $name(
                    logits: *const $t,
                    v: i32,
                    u: *const f64,
                    inv_t: f32,
                    token: *mut u32,
                    logprob: *mut f32,
                    bad: *mut i32,
                    bad_value: *mut f32,
                );
            }
        };
    }

    macro_rules! decode {
        ($t:ty, $softmax:ident, $kv_write:ident, $kv_copy:ident) => {
            extern "C" {
                pub fn $softmax(
                    x: *const $t,
                    y: *mut $t,
                    pads: *const u32,
                    n_pads: i32,
                    last: *const u32,
                    s: i32,
                    rows_per_batch: i32,
                );
                pub fn $kv_write(
                    cache: *mut $t,
                    fresh: *const $t,
                    slot: *const u32,
                    rows: u64,
                    cap: u32,
                    hd: u32,
                );
                pub fn $kv_copy(
                    dst: *mut $t,
                    src: *const $t,
                    copies: *const u32,
                    kv: u32,
                    dst_cap: u32,
                    src_cap: u32,
                    hd: u32,
                );
            }
        };
    }

    macro_rules! rope {
        ($t:ty, $name:ident, $step:ident) => {
            extern "C" {
                pub fn $step(
                    x: *const $t,
                    bias: *const $t,
                    cs: *const $t,
                    out: *mut $t,
                    b: u32,
                    heads: u32,
                    d: u32,
                    flags: i32,
                );
                pub fn $name(
                    x: *const $t,
                    cos: *const $t,
                    sin: *const $t,
                    out: *mut $t,
                    b: u32,
                    t: u32,
                    h: u32,
                    d: u32,
                    scale: f32,
                    adjoint: i32,
                );
            }
        };
    }

    macro_rules! embedding {
        ($t:ty, $fwd:ident, $bwd:ident) => {
            extern "C" {
                pub fn $fwd(w: *const $t, ids: *const u32, out: *mut $t, n: u64, d: u32, v: u32);
                pub fn $bwd(ids: *const u32, g: *const $t, dw: *mut $t, n: u32, d: u32, v: u32);
            }
        };
    }

    embedding!(f32, embedding_fwd_f32, embedding_bwd_f32);
    embedding!(bf16, embedding_fwd_bf16, embedding_bwd_bf16);

    rope!(f32, rope_heads_f32, rope_step_f32);
    rope!(bf16, rope_heads_bf16, rope_step_bf16);

    decode!(f32, decode_softmax_f32, kv_write_f32, kv_copy_rows_f32);
    decode!(bf16, decode_softmax_bf16, kv_write_bf16, kv_copy_rows_bf16);

    sample!(f32, sample_rows_f32);
    sample!(bf16, sample_rows_bf16);

    multi_tensor!(multi_sum_squares_f32, multi_scale_f32, multi_adamw_f32);
    multi_tensor!(multi_sum_squares_bf16, multi_scale_bf16, multi_adamw_bf16);

    typed!(
        f32,
        rms_norm_fwd_f32,
        rms_norm_bwd_x_f32,
        rms_norm_bwd_w_partial_f32,
        rms_norm_bwd_w_sum_f32,
        causal_softmax_f32,
        softmax_bwd_f32,
        swiglu_fwd_f32,
        swiglu_bwd_f32,
        token_loss_fwd_f32,
        token_loss_bwd_f32
    );
    typed!(
        bf16,
        rms_norm_fwd_bf16,
        rms_norm_bwd_x_bf16,
        rms_norm_bwd_w_partial_bf16,
        rms_norm_bwd_w_sum_bf16,
        causal_softmax_bf16,
        softmax_bwd_bf16,
        swiglu_fwd_bf16,
        swiglu_bwd_bf16,
        token_loss_fwd_bf16,
        token_loss_bwd_bf16
    );
}
