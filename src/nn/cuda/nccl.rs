//! The all-reduce of a tensor-parallel group on CUDA: NCCL, linked by builds with the `nccl`
//! feature (`libnccl.so.2` must then be found at run time). One communicator per rank, made
//! together for every GPU of the group (`ncclCommInitAll`), each on its device's one stream,
//! so a reduction is ordered after the kernels that wrote its input with no synchronisation
//! on the host.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::nccl::safe::{Comm, Id, ReduceOp};
use candle_core::cuda_backend::CudaStorage;
use candle_core::{CustomOp1, DType, Device, Layout, Shape, Tensor};

use crate::error::{Error, Result};
use crate::nn::shard::AllReduce;

/// Rank `comm.rank()`'s end of an NCCL group.
#[derive(Debug)]
struct NcclReduce {
    comm: Comm,
    /// Shared by the group's ranks: set by a rank that failed part-way through a forward.
    aborted: Arc<AtomicBool>,
}

// SAFETY: a communicator is used by one thread at a time: its rank's forward (ranks run one
// thread each, and a forward runs to its end before the next begins); NCCL allows calls on
// one communicator from different threads when they do not overlap.
unsafe impl Send for NcclReduce {}
unsafe impl Sync for NcclReduce {}

/// One all-reduce handle per rank, rank `i` on `devices[i]` (each a separate GPU).
pub(crate) fn group(devices: &[Device]) -> Result<Vec<Arc<dyn AllReduce>>> {
    let mut streams = Vec::with_capacity(devices.len());
    let mut ordinals = Vec::with_capacity(devices.len());
    for d in devices {
        let Device::Cuda(dev) = d else {
            return Err(Error::invalid(
                "tensor_parallel mixes CUDA and other devices",
            ));
        };
        let stream = dev.cuda_stream();
        let ordinal = stream.context().ordinal();
        if ordinals.contains(&ordinal) {
            return Err(Error::invalid(format!(
                "tensor_parallel: GPU {ordinal} given to two ranks; each rank needs its own GPU"
            )));
        }
        ordinals.push(ordinal);
        streams.push(stream);
    }
    let comms = Comm::from_devices(streams)
        .map_err(|e| Error::invalid(format!("NCCL could not start on GPUs {ordinals:?}: {e:?}")))?;
    let aborted = Arc::new(AtomicBool::new(false));
    Ok(comms
        .into_iter()
        .map(|comm| {
            Arc::new(NcclReduce {
                comm,
                aborted: aborted.clone(),
            }) as Arc<dyn AllReduce>
        })
        .collect())
}

/// This process's end of an NCCL group whose ranks are processes, on one host or several
/// (NCCL's network transports join hosts): rank 0 makes the group's id and writes it to
/// `rendezvous` (a path every process can read: a shared file system; a fresh one per launch,
/// so that no rank reads an earlier launch's id), the others wait up to `wait` for it; then
/// every rank joins on `device`'s GPU (`ncclCommInitRank`, which waits for all of them).
pub(crate) fn process_group(
    device: &Device,
    rank: usize,
    world: usize,
    rendezvous: &std::path::Path,
    wait: std::time::Duration,
) -> Result<Arc<dyn AllReduce>> {
    let Device::Cuda(dev) = device else {
        return Err(Error::invalid(format!(
            "ranks in separate processes join by NCCL on CUDA GPUs, not on {:?}",
            device.location()
        )));
    };
    let nccl = |e| Error::invalid(format!("NCCL: {e:?}"));
    let id = if rank == 0 {
        if rendezvous.exists() {
            return Err(Error::invalid(format!(
                "{}: exists (an earlier launch's?): rank 0 writes the group's id to a fresh path",
                rendezvous.display()
            )));
        }
        let id = Id::new().map_err(nccl)?;
        let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
        let partial = rendezvous.with_extension("partial");
        std::fs::write(&partial, bytes).map_err(|e| Error::io(&partial, e))?;
        std::fs::rename(&partial, rendezvous).map_err(|e| Error::io(rendezvous, e))?;
        id
    } else {
        let start = std::time::Instant::now();
        let bytes = loop {
            match std::fs::read(rendezvous) {
                Ok(bytes) => break bytes,
                Err(_) if start.elapsed() < wait => {
                    std::thread::sleep(std::time::Duration::from_millis(100))
                }
                Err(e) => {
                    return Err(Error::invalid(format!(
                        "{}: rank 0 wrote no NCCL id within {} s ({e})",
                        rendezvous.display(),
                        wait.as_secs()
                    )))
                }
            }
        };
        let mut internal = [0 as std::ffi::c_char; 128];
        if bytes.len() != internal.len() {
            return Err(Error::invalid(format!(
                "{}: {} bytes, not an NCCL id ({})",
                rendezvous.display(),
                bytes.len(),
                internal.len()
            )));
        }
        for (d, b) in internal.iter_mut().zip(bytes) {
            *d = b as std::ffi::c_char;
        }
        Id::uninit(internal)
    };
    let comm = Comm::from_rank(dev.cuda_stream(), rank, world, id).map_err(|e| {
        Error::invalid(format!(
            "NCCL could not start rank {rank} of {world} on GPU {}: {e:?}",
            dev.cuda_stream().context().ordinal()
        ))
    })?;
    Ok(Arc::new(NcclReduce {
        comm,
        aborted: Arc::new(AtomicBool::new(false)),
    }))
}

impl AllReduce for NcclReduce {
    fn sum(&self, x: &Tensor) -> Result<Tensor> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::invalid(
                "tensor-parallel group broken: a rank failed part-way through a forward",
            ));
        }
        Ok(x.contiguous()?.apply_op1_no_bwd(self)?)
    }

    /// Every rank's later reductions fail at once. Collectives already queued stay queued:
    /// NCCL kernels waiting for the failed rank's part keep their GPUs until the process
    /// ends (ncclCommAbort is not called).
    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
    }
}

impl CustomOp1 for NcclReduce {
    fn name(&self) -> &'static str {
        "nccl-all-reduce"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("the NCCL all-reduce runs on CUDA tensors only")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (start, end) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("all-reduce of a strided tensor".into()))?;
        let dev = s.device().clone();
        let fail = |e| candle_core::Error::Msg(format!("NCCL all-reduce: {e:?}"));
        macro_rules! reduce {
            ($t:ty) => {{
                let src = s.as_cuda_slice::<$t>()?.slice(start..end);
                // SAFETY: every element is written by the all-reduce before any read.
                let mut dst = unsafe { dev.alloc::<$t>(end - start)? };
                self.comm
                    .all_reduce(&src, &mut dst, &ReduceOp::Sum)
                    .map_err(fail)?;
                CudaStorage::wrap_cuda_slice(dst, dev)
            }};
        }
        let out = match s.dtype() {
            DType::BF16 => reduce!(half::bf16),
            DType::F16 => reduce!(half::f16),
            DType::F32 => reduce!(f32),
            other => candle_core::bail!("NCCL all-reduce of {other:?}"),
        };
        Ok((out, l.shape().clone()))
    }
}
