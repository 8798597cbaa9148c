//! The device-generic face of recorded CUDA graph steps (`cuda/graph.rs` records and replays
//! them): whether they are on, and the census of their nodes and edges.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Whether short steps on CUDA replay recorded graphs: the engine option `cuda_graphs` (off
/// by default in the library, on in `exp` and the GPU benchmark).
///
/// The contract that makes it opt-in: recording captures everything queued on the device's
/// one stream, so while a step records (the first step of a block length on a cache's
/// buffers, again after they grow or the engine options change) no other thread may queue
/// work on that device. `exp` decodes one sequence at a time on one thread; a test harness
/// running tests in parallel does not.
pub fn graphs_enabled() -> bool {
    crate::engine::get().cuda_graphs
}

/// CUDA graph steps recorded in this process so far (never any without CUDA). A recording
/// runs its step eagerly, captures it and instantiates the graph — milliseconds for a model's
/// step — so a generation during which this grew paid for recordings inside its timings.
pub fn recordings_made() -> usize {
    RECORDINGS.load(Ordering::Relaxed)
}

static RECORDINGS: AtomicUsize = AtomicUsize::new(0);

/// Counts one recording made (see [`recordings_made`]).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn count_recording() {
    RECORDINGS.fetch_add(1, Ordering::Relaxed);
}

/// A recorded CUDA graph step's nodes and edges (see [`count_graph_censuses`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphCensus {
    /// Every node.
    pub nodes: usize,
    /// Kernel nodes.
    pub kernels: usize,
    /// Memory allocation and free nodes.
    pub memory: usize,
    /// Every edge.
    pub edges: usize,
    /// Programmatic (PDL) edges: one into each kernel that may start during the tail of the
    /// kernel before it.
    pub programmatic: usize,
}

/// Set by [`count_graph_censuses`].
static COUNT_CENSUSES: AtomicBool = AtomicBool::new(false);

/// Counts the nodes and edges of every CUDA graph recorded from now on, for
/// `Decoder::graph_censuses` (about a thousand driver queries a recording, so off unless
/// asked; the engine option `graph_census` also prints each). A no-op without CUDA.
pub fn count_graph_censuses(on: bool) {
    COUNT_CENSUSES.store(on, Ordering::Relaxed);
}

/// Whether [`count_graph_censuses`] asked for censuses.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn censuses_counted() -> bool {
    COUNT_CENSUSES.load(Ordering::Relaxed)
}

/// Whether steps recorded on `device` ask for programmatic edges between their kernels:
/// CUDA with compute capability 9.0 or newer, with the engine options `pdl` and `graph_pdl`
/// on.
pub fn graph_pdl(device: &candle_core::Device) -> bool {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = device {
        return crate::engine::get().graph_pdl && super::cuda::pdl(dev);
    }
    let _ = device;
    false
}
