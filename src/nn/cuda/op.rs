//! What every op of this folder shares: the custom-op boilerplate (`float_op3!`), views of
//! a tensor's CUDA storage, and output buffers allocated off a recording graph's chain.
use candle_core::{Layout, Storage};

/// `impl CustomOp3` for an op whose `launch::<T>(&self, dev, dtype_name, a, b, c)` runs its
/// kernel for one float dtype: the CPU refuses (callers take candle's ops there), CUDA
/// dispatches on the dtype the three inputs share.
macro_rules! float_op3 {
    ($op:ty, $name:literal) => {
        impl CustomOp3 for $op {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                _: &CpuStorage,
                _: &Layout,
                _: &CpuStorage,
                _: &Layout,
                _: &CpuStorage,
                _: &Layout,
            ) -> candle_core::Result<(CpuStorage, Shape)> {
                candle_core::bail!(
                    "{} runs on CUDA only; other devices take candle's ops",
                    $name
                )
            }

            fn cuda_fwd(
                &self,
                a: &CudaStorage,
                al: &Layout,
                b: &CudaStorage,
                bl: &Layout,
                c: &CudaStorage,
                cl: &Layout,
            ) -> candle_core::Result<(CudaStorage, Shape)> {
                use CudaStorageSlice::{BF16, F16, F32};
                let dev = a.device();
                let (slice, shape) = match (&a.slice, &b.slice, &c.slice) {
                    (BF16(a), BF16(b), BF16(c)) => {
                        let (o, s) = self.launch(dev, "bf16", (a, al), (b, bl), (c, cl))?;
                        (BF16(o), s)
                    }
                    (F16(a), F16(b), F16(c)) => {
                        let (o, s) = self.launch(dev, "f16", (a, al), (b, bl), (c, cl))?;
                        (F16(o), s)
                    }
                    (F32(a), F32(b), F32(c)) => {
                        let (o, s) = self.launch(dev, "f32", (a, al), (b, bl), (c, cl))?;
                        (F32(o), s)
                    }
                    _ => candle_core::bail!(
                        "{}: inputs must share a float dtype (f32, f16, bf16)",
                        $name
                    ),
                };
                Ok((
                    CudaStorage {
                        slice,
                        device: dev.clone(),
                    },
                    shape,
                ))
            }
        }
    };
}

/// A view of `t`'s CUDA storage from its layout's start, as element type `T`.
pub(super) fn view<'a, T: candle_core::cuda_backend::CudaDType>(
    guard: &'a (candle_core::StorageRef<'a>, &'a Layout),
    what: &str,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    match &*guard.0 {
        Storage::Cuda(s) => Ok(s.as_cuda_slice::<T>()?.slice(guard.1.start_offset()..)),
        _ => candle_core::bail!("{what} is not on the GPU"),
    }
}

/// An uninitialised output buffer of `n` elements for one of our kernels, allocated off a
/// recording graph's chain of kernels (see `graph_edges::before_alloc`).
///
/// # Safety
/// The kernel launched next must write every element it is read at.
pub(super) unsafe fn out_alloc<T: candle_core::cuda_backend::cudarc::driver::DeviceRepr>(
    dev: &candle_core::cuda_backend::CudaDevice,
    n: usize,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaSlice<T>> {
    super::graph_edges::before_alloc(dev.cuda_stream().cu_stream())
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    // SAFETY: the caller's contract.
    unsafe { dev.alloc::<T>(n) }
}
