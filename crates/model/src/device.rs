//! Opening a CUDA device the way training wants it.
//!
//! `Device::new_cuda` gives candle's defaults, which cost a training step
//! dearly on a GPU: every buffer carries two CUDA events that each kernel
//! launch waits on and records (for multi-stream safety we do not need: all
//! our work goes to one stream), and the stream-ordered memory pool hands
//! freed memory back to the driver at each synchronisation, so every step
//! maps its working set anew. [`open_cuda`] opens one explicit stream,
//! switches the event tracking off and tells the pool to keep its memory,
//! which is what PyTorch's caching allocator does.

use candle_core::{Device, Result};

/// CUDA device `ordinal` with one explicit stream shared by every thread, no
/// per-buffer event tracking, and a memory pool that keeps what it has
/// allocated. Fails (naming the cause) where there is no such device or the
/// build has no `cuda` feature.
pub fn open_cuda(ordinal: usize) -> Result<Device> {
    let device = Device::new_cuda_with_stream(ordinal)?;
    #[cfg(feature = "cuda")]
    tune_cuda(&device)?;
    Ok(device)
}

#[cfg(feature = "cuda")]
fn tune_cuda(device: &Device) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::cuda_backend::WrapErr;

    let cuda = device.as_cuda_device()?;
    // SAFETY: nothing has been allocated on this device yet, and every tensor
    // made on it is used through its single stream (the one stream orders all
    // reads, writes and frees, which is what the events would otherwise do).
    unsafe { cuda.disable_event_tracking() };
    let stream = cuda.cuda_stream();
    let context = stream.context();
    if !context.has_async_alloc() {
        return Ok(());
    }
    context.bind_to_thread().w()?;
    // SAFETY: `cu_device` comes from a live context, and the release
    // threshold attribute takes a u64 (the bytes the pool may keep).
    unsafe {
        let pool = result::device::get_mem_pool(context.cu_device()).w()?;
        let mut keep = u64::MAX;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
        .w()?;
    }
    Ok(())
}

/// A span of GPU work that a profiler attached to the process measures on
/// its own: `cuProfilerStart` at [`ProfiledRange::start`], `cuProfilerStop`
/// at [`ProfiledRange::end`] (or on drop), each after synchronising so the
/// span holds exactly the work between them. `bench/kernel-profile` turns
/// each span into a numbered range of its report; `ncu --profile-from-start
/// off` and `nsys --capture-range=cudaProfilerApi` read the same calls.
/// Without a profiler the calls do nothing; on the CPU this is a no-op.
#[derive(Debug)]
pub struct ProfiledRange {
    device: Option<Device>,
}

impl ProfiledRange {
    /// Waits for `device`'s queued work, then opens the span.
    pub fn start(device: &Device) -> Result<Self> {
        if !device.is_cuda() {
            return Ok(Self { device: None });
        }
        device.synchronize()?;
        profiler_call(device, true)?;
        Ok(Self {
            device: Some(device.clone()),
        })
    }

    /// Waits for the span's work, then closes it.
    pub fn end(mut self) -> Result<()> {
        self.close()
    }

    /// Synchronises and stops the profiler once (later calls do nothing).
    fn close(&mut self) -> Result<()> {
        match self.device.take() {
            Some(device) => {
                device.synchronize()?;
                profiler_call(&device, false)
            }
            None => Ok(()),
        }
    }
}

impl Drop for ProfiledRange {
    fn drop(&mut self) {
        // An early return (an error inside the span) still closes it.
        let _ = self.close();
    }
}

#[cfg(feature = "cuda")]
fn profiler_call(device: &Device, start: bool) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::{profiler_start, profiler_stop};
    use candle_core::cuda_backend::WrapErr;

    // The driver's profiler calls act on the thread's current context.
    device
        .as_cuda_device()?
        .cuda_stream()
        .context()
        .bind_to_thread()
        .w()?;
    if start {
        profiler_start().w()
    } else {
        profiler_stop().w()
    }
}

#[cfg(not(feature = "cuda"))]
fn profiler_call(_device: &Device, _start: bool) -> Result<()> {
    Ok(())
}
