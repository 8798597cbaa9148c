//! Kernel launches with programmatic dependent launch (PDL, compute capability 9.0+): a
//! kernel may begin launching while the one ahead of it on the stream still runs, so its
//! launch and what it reads before `pdl_begin` (weights only) overlap the previous kernel's
//! tail. Every kernel in kernels.cu calls `pdl_begin` before it touches anything an earlier
//! kernel wrote, which keeps stream order for the data. The engine option `pdl` off launches
//! them one after another. In a captured graph the attribute becomes a programmatic edge only
//! between adjacent kernels, which is why `graph_edges` keeps memory nodes off the chain of
//! kernels (docs/kernel-notes.md, "PDL").
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaFunction, CudaModule, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};

/// The kernels' fat binary (`build.rs`: `kernels.cu` and the files it includes, one module).
const FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/specdec_kernels.fatbin"));

/// specdec's kernel module on `dev`, loaded from the fat binary at its first use there (the
/// driver picks the machine code built for this GPU, else compiles the PTX). candle's
/// `get_or_load_custom_func` takes PTX text only, hence our own cache, one module a device.
fn module(dev: &CudaDevice) -> candle_core::Result<Arc<CudaModule>> {
    static MODULES: OnceLock<Mutex<HashMap<DeviceId, Arc<CudaModule>>>> = OnceLock::new();
    let mut modules = MODULES
        .get_or_init(Default::default)
        .lock()
        .map_err(|e| candle_core::Error::Msg(format!("kernel module cache: {e}")))?;
    if let Some(m) = modules.get(&dev.id()) {
        return Ok(m.clone());
    }
    let m = dev
        .cuda_stream()
        .context()
        .load_module(Ptx::from_binary(FATBIN.to_vec()))
        .map_err(|e| {
            candle_core::Error::Msg(format!(
                "loading specdec's CUDA kernels (machine code for sm_{}, and PTX the driver compiles for newer GPUs): {e}; on an older GPU rebuild with CUDA_COMPUTE_CAP set to its capability (scripts/build-cuda.sh)",
                env!("BUILT_CUDA_COMPUTE_CAP")
            ))
        })?;
    modules.insert(dev.id(), m.clone());
    Ok(m)
}

/// The compute capability's major version of the first device asked (0 when the driver
/// cannot tell; a device property, so read once: specdec runs one GPU kind).
pub(super) fn compute_major(dev: &CudaDevice) -> i32 {
    static MAJOR: OnceLock<i32> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        dev.cuda_stream()
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .unwrap_or(0)
    })
}

/// Whether launches carry the PDL attribute: the engine option `pdl` (read at each launch:
/// an experiment may switch it) on a GPU of compute capability 9.0 or newer.
pub(crate) fn pdl(dev: &CudaDevice) -> bool {
    crate::engine::get().pdl && compute_major(dev) >= 9
}

/// The GPU's multiprocessors (of the first device asked: it only steers kernel choices).
pub(super) fn multiprocessors(dev: &CudaDevice) -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        dev.cuda_stream()
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_or(0, |n| n.max(0) as usize)
    })
}

/// One launch of a kernel of kernels.cu: its arguments in the order of the kernel's
/// parameters, each in an 8-byte slot (device pointers; scalars in the low bytes, which is
/// what the driver copies for a 4-byte parameter on a little-endian host).
pub(super) struct Launch {
    func: CudaFunction,
    stream: Arc<CudaStream>,
    slots: Vec<u64>,
    pdl: bool,
    /// Blocks a cluster along z (thread block clusters, compute capability 9.0+), if any.
    cluster_z: Option<u32>,
}

impl Launch {
    /// The kernel `name` of specdec's module on `dev`'s stream.
    pub(super) fn new(dev: &CudaDevice, name: &str) -> candle_core::Result<Self> {
        Ok(Self {
            func: module(dev)?.load_function(name).w()?,
            stream: dev.cuda_stream(),
            slots: Vec::with_capacity(16),
            pdl: pdl(dev),
            cluster_z: None,
        })
    }

    /// Launches as clusters of `z` blocks along the grid's z (which `z` must divide; at most
    /// 8, the portable cluster size).
    pub(super) fn cluster_z(&mut self, z: u32) -> &mut Self {
        self.cluster_z = Some(z);
        self
    }

    /// A device buffer (a slice or a view) as a pointer parameter.
    pub(super) fn ptr<T>(&mut self, p: &impl DevicePtr<T>) -> &mut Self {
        // Event tracking is off on specdec's devices (one stream; `open_cuda`): the guard
        // records nothing, and stream order orders every use.
        let ptr = p.device_ptr(&self.stream).0;
        self.slots.push(ptr);
        self
    }

    /// A null pointer parameter.
    pub(super) fn null(&mut self) -> &mut Self {
        self.slots.push(0);
        self
    }

    /// A scalar parameter of the same type on the device (`int`, `unsigned`, `long`,
    /// `float`).
    pub(super) fn val<V: Scalar>(&mut self, v: V) -> &mut Self {
        self.slots.push(v.slot());
        self
    }

    /// Enqueues the kernel.
    ///
    /// # Safety
    /// The parameters pushed must be the kernel's, in order and type, and every index the
    /// kernel forms from them must stay inside the buffers passed.
    pub(super) unsafe fn run(&mut self, cfg: LaunchConfig) -> candle_core::Result<()> {
        let mut params: Vec<*mut c_void> = self
            .slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect();
        let mut attrs = Vec::with_capacity(2);
        if self.pdl {
            // SAFETY: a plain C union; the attribute's value is its `int` member.
            let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
            value.programmaticStreamSerializationAllowed = 1;
            attrs.push(sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            });
        }
        if let Some(z) = self.cluster_z {
            // SAFETY: as above; the value is its `clusterDim` member.
            let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
            value.clusterDim.x = 1;
            value.clusterDim.y = 1;
            value.clusterDim.z = z;
            attrs.push(sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                pad: [0; 4],
                value,
            });
        }
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        self.stream.context().bind_to_thread().w()?;
        super::graph_edges::before_launch(self.stream.cu_stream())
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        // SAFETY: `params` points at one slot per kernel parameter (the caller's contract),
        // alive for the call; the driver copies them before returning.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .w()
    }
}

/// A kernel scalar parameter and its 8-byte slot.
pub(super) trait Scalar: DeviceRepr {
    fn slot(self) -> u64;
}

impl Scalar for i32 {
    fn slot(self) -> u64 {
        u64::from(self as u32)
    }
}

impl Scalar for u32 {
    fn slot(self) -> u64 {
        u64::from(self)
    }
}

impl Scalar for i64 {
    fn slot(self) -> u64 {
        self as u64
    }
}

impl Scalar for f32 {
    fn slot(self) -> u64 {
        u64::from(self.to_bits())
    }
}

/// One block's record in a diagnostics build (`SPECDEC_KERNEL_TRACE=1` at build time): its
/// launch's grid id (shared by the launch's blocks), the globaltimer ns at which it reached
/// `pdl_begin` and passed its wait, and its SM. kernels.cu's `LabRec`.
#[derive(Debug, Clone, Copy)]
pub struct TraceRecord {
    pub grid: u64,
    pub entry_ns: u64,
    pub release_ns: u64,
    pub sm: u32,
}

/// The blocks recorded since the last reset (at most kernels.cu's `LAB_RECS`), then the
/// records reset; an error for a build without the trace (the symbols are absent). Waits for
/// the device.
pub fn kernel_trace(dev: &CudaDevice) -> candle_core::Result<Vec<TraceRecord>> {
    let m = module(dev)?;
    let stream = dev.cuda_stream();
    let missing = |e| {
        candle_core::Error::Msg(format!(
            "kernel trace: {e}; build with SPECDEC_KERNEL_TRACE=1 (scripts/build-cuda.sh)"
        ))
    };
    let mut count = m.get_global("lab_count", &stream).map_err(missing)?;
    let mut n = [0u8; 4];
    stream.memcpy_dtoh(&count, &mut n).w()?;
    stream.memcpy_htod(&[0u8; 4], &mut count).w()?;
    let recs = m.get_global("lab_recs", &stream).map_err(missing)?;
    const REC: usize = 32;
    let n = (u32::from_le_bytes(n) as usize).min(recs.len() / REC);
    let mut bytes = vec![0u8; n * REC];
    stream.memcpy_dtoh(&recs.slice(..n * REC), &mut bytes).w()?;
    stream.synchronize().w()?;
    let word =
        |r: &[u8], i: usize| u64::from_le_bytes(r[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
    Ok(bytes
        .chunks_exact(REC)
        .map(|r| TraceRecord {
            grid: word(r, 0),
            entry_ns: word(r, 1),
            release_ns: word(r, 2),
            sm: word(r, 3) as u32,
        })
        .collect())
}
