//! CUDA graphs of a decode step: the step's few hundred kernel launches recorded once and
//! replayed with one launch, so the host's per-op cost (candle's bookkeeping, the driver's
//! launch calls) leaves the step's critical path.
//!
//! A recorded step may only differ from the next in the contents of device memory: the
//! token ids and the cache length live in one fixed `[t + 1]` u32 buffer written before
//! each replay, and the kernels that depend on the position (RoPE, the K/V write, attention)
//! read the length from it. Everything else the step touches — weights, the KV buffers, the
//! RoPE tables, the output buffer — must stay at the addresses it had when recorded; the
//! caller keys the recording on their identities and a changed key records anew.
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaStream, DevicePtr};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{DType, Storage, Tensor};

use super::graph_edges::{self, Census};
use crate::error::{Error, Result};
use crate::nn::tokens::StepIds;

/// An instantiated graph and the captured graph it came from.
struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
    /// Its nodes and edges, counted only when asked for (see [`census_wanted`]).
    census: Option<Census>,
}

/// Whether each recording's census is printed: the engine option `graph_census`.
fn census_printed() -> bool {
    crate::engine::get().graph_census
}

/// Whether each recording's census is counted: printed ([`census_printed`]) or asked for by
/// `nn::count_graph_censuses` (about a thousand driver queries a recording, so not by
/// default).
fn census_wanted() -> bool {
    census_printed() || crate::nn::graphs::censuses_counted()
}

impl Graph {
    fn launch(&self) -> Result<()> {
        bind(&self.stream)?;
        // SAFETY: `exec` is a live executable graph of the stream's context, current here.
        unsafe { sys::cuGraphLaunch(self.exec, self.stream.cu_stream()) }
            .result()
            .map_err(|e| Error::invalid(format!("CUDA graph launch failed: {e}")))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles are owned by this value and destroyed once; errors at
        // teardown have nowhere to go.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// One recorded step.
struct Recording {
    /// What the recording's fixed addresses were taken from (see the module doc).
    key: Vec<u64>,
    /// `[t + 1]` u32: the token ids, then the cache length after the step.
    io: Tensor,
    /// The step's logits, written by every replay.
    out: Tensor,
    /// The step's second output, if it has one (the hidden states a cache records).
    aux: Option<Tensor>,
    /// The step's input rows beside the ids, if it takes any (an EAGLE-3 head's features),
    /// written before each replay.
    input: Option<Tensor>,
    graph: Graph,
    /// Tokens a step takes.
    rows: usize,
    /// The engine options' [`crate::engine::generation`] it was recorded under: the options
    /// choose its kernels, so after a change it is stale and recorded anew.
    generation: u64,
}

// SAFETY: a `Graph` holds handles to driver objects of one context; the driver API is
// thread-safe, and `Graphs` only touches a recording under its mutex.
unsafe impl Send for Recording {}

/// The recorded steps of one model, per slot (kind of step) and key (the buffers recorded
/// against).
#[derive(Default)]
pub struct Graphs {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Set when recording failed once: the model stays on the ordinary path.
    disabled: bool,
    recordings: Vec<(usize, Recording)>,
    /// Each kind of recording made, kept or since dropped: its rows and the words it reads
    /// (once a kind, so the list stays as short as the kinds of step).
    made: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Graphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock();
        let n = inner.as_ref().map_or(0, |i| i.recordings.len());
        write!(f, "Graphs({n} recorded)")
    }
}

/// Makes `stream`'s context the calling thread's current one, as the driver calls below
/// (which take no context) need: a thread that last worked on another GPU (a tensor-parallel
/// group's thread after copying ids to a peer) would otherwise issue them in that GPU's.
fn bind(stream: &CudaStream) -> Result<()> {
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::invalid(format!("binding GPU {}: {e}", stream.context().ordinal())))
}

fn poisoned() -> Error {
    Error::invalid("CUDA graph lock poisoned by a panic")
}

/// Writes `data` into the u32 tensor `dst` (contiguous, on `dev`) on the device's stream.
fn write_u32(dev: &CudaDevice, dst: &Tensor, data: &[u32]) -> Result<()> {
    let (storage, layout) = dst.storage_and_layout();
    let Storage::Cuda(s) = &*storage else {
        return Err(Error::invalid("graph input buffer is not on the GPU"));
    };
    let slice = s.as_cuda_slice::<u32>()?.slice(layout.start_offset()..);
    let stream = dev.cuda_stream();
    bind(&stream)?;
    let (ptr, _sync) = slice.device_ptr(&stream);
    // SAFETY: `dst` holds at least `data.len()` u32 (the caller made it so); from pageable
    // memory the copy is staged before the call returns, so `data` may go right after.
    unsafe { result::memcpy_htod_async(ptr, data, stream.cu_stream()) }
        .map_err(|e| Error::invalid(format!("graph input upload failed: {e}")))?;
    Ok(())
}

/// Writes the step's input into a recording's `io` buffer (`[t + words]` u32), on the
/// device's stream: the ids (uploaded, or copied on the device from where the step before
/// left them), then the words (the cache length first).
fn write_io(dev: &CudaDevice, io: &Tensor, ids: StepIds, words: &[u32]) -> Result<()> {
    let t = ids.len();
    if io.dim(0)? != t + words.len() {
        return Err(Error::invalid(format!(
            "graph step: {t} ids and {} words for a recording of {} inputs",
            words.len(),
            io.dim(0)?
        )));
    }
    match ids {
        StepIds::Host(tokens) => {
            let mut data = tokens.to_vec();
            data.extend_from_slice(words);
            write_u32(dev, io, &data)
        }
        StepIds::Device(d) => {
            io.slice_set(d.ids(), 0, 0)?;
            write_u32(dev, &io.narrow(0, t, words.len())?, words)
        }
    }
}

impl Graphs {
    /// False once a recording failed here (every later step takes the ordinary path).
    pub fn enabled(&self) -> bool {
        self.inner.lock().is_ok_and(|i| !i.disabled)
    }

    /// Steps recorded and kept (0 once a recording failed and the model went back to the
    /// ordinary path).
    pub fn recorded(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.recordings.len())
    }

    /// The rows and words (see [`Self::run`]) of each kind of recording made here, those
    /// since dropped included, in the order first made.
    pub fn made(&self) -> Vec<(usize, usize)> {
        self.inner.lock().map_or(Vec::new(), |i| i.made.clone())
    }

    /// The counted censuses of the recordings kept (see [`count_censuses`]), with each
    /// recording's rows.
    pub fn censuses(&self) -> Vec<(usize, Census)> {
        self.inner.lock().map_or(Vec::new(), |i| {
            i.recordings
                .iter()
                .filter_map(|(_, r)| Some((r.rows, r.graph.census?)))
                .collect()
        })
    }

    /// Runs one step of `ids.len()` tokens that leaves the cache `words[0]` long, replaying
    /// the recording in `slot` (one per kind of step; `greedy` as below) made for `key`, or
    /// recording it anew:
    /// `step(ids, words)` is the step as device work only (no host reads or uploads) given
    /// `ids: [t]` and `words` (the length, then any further words the step reads, such as a
    /// token tree's: the key must tell their counts apart) as u32 tensors, and returns the
    /// logits. A step not recorded yet
    /// runs `step` eagerly (that is this step's result) and is recorded at once, so every
    /// step of a block length takes the same kernels, eager or replayed: a greedy speculative
    /// run and the autoregressive run it is compared with see the same logits (the ordinary
    /// path's bf16 arithmetic is not the recorded step's bit for bit: docs/kernel-notes.md,
    /// "Recording at first sighting"). Recordings made under other engine options (see
    /// [`crate::engine::generation`]) are dropped first. With `greedy`, the recording ends in
    /// each row's argmax of the logits `step` returns, written into the recording's `[t]` u32 output buffer, and the
    /// result is those ids: no logits are cast, copied or read outside the graph. `None` when
    /// graphs are off for this model (a recording failed once; the error is printed); the
    /// caller then takes its ordinary path. `step`'s second output (hidden states handed
    /// out with the logits) is copied out of the replay the same way. `input`: rows the step
    /// reads beside the ids (an EAGLE-3 head's features), copied into the recording's own
    /// buffer before each replay and handed to `step` as its third argument; the key must
    /// tell its shapes apart.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        dev: &CudaDevice,
        (slot, greedy): (usize, bool),
        key: Vec<u64>,
        ids: StepIds,
        words: &[u32],
        input: Option<&Tensor>,
        step: impl Fn(&Tensor, &Tensor, Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)>,
    ) -> Result<Option<(Tensor, Option<Tensor>)>> {
        let mut inner = self.inner.lock().map_err(|_| poisoned())?;
        if inner.disabled {
            return Ok(None);
        }
        let t = ids.len();
        // Recordings made under other engine options would replay their kernels.
        let generation = crate::engine::generation();
        inner.recordings.retain(|(_, r)| r.generation == generation);
        if let Some(i) = inner
            .recordings
            .iter()
            .position(|(n, r)| *n == slot && r.key == key)
        {
            // Most recently used last.
            let hit = inner.recordings.remove(i);
            inner.recordings.push(hit);
            let rec = &inner.recordings[inner.recordings.len() - 1].1;
            write_io(dev, &rec.io, ids, words)?;
            if let (Some(buf), Some(rows)) = (&rec.input, input) {
                buf.slice_set(&rows.contiguous()?, 0, 0)?;
            }
            rec.graph.launch()?;
            // Copies: the next replay overwrites `out` and `aux`.
            let aux = rec.aux.as_ref().map(Tensor::copy).transpose()?;
            return Ok(Some((rec.out.copy()?, aux)));
        }
        // Several caches may alternate on one model (the points of an interleaved sweep, a
        // reference decode): keep the most recent recordings rather than one per slot.
        // (The engine option `graphs_kept`: how many, least recently used dropped first.)
        let kept = crate::engine::get().graphs_kept.max(1);
        while inner.recordings.len() >= kept {
            inner.recordings.remove(0);
        }
        let device = candle_core::Device::Cuda(dev.clone());
        let io = Tensor::zeros(t + words.len(), DType::U32, &device)?;
        write_io(dev, &io, ids, words)?;
        let (ids, words_t) = (io.narrow(0, 0, t)?, io.narrow(0, t, words.len())?);
        // The recording's own copy of the input rows (contiguous, at a fixed address).
        let input = match input {
            Some(rows) => {
                let buf = rows.zeros_like()?;
                buf.slice_set(&rows.contiguous()?, 0, 0)?;
                Some(buf)
            }
            None => None,
        };
        // Kernel parameters that candle uploads per launch (shapes and strides of strided
        // operands) come from a cache filled by the eager run, so the recording reads them
        // from device memory that outlives it.
        let _params = dev.enable_cuda_graph_htod_cache();
        let (eager, eager_aux) = step(&ids, &words_t, input.as_ref())?;
        let aux = eager_aux.as_ref().map(Tensor::zeros_like).transpose()?;
        let (eager, out) = if greedy {
            let best = super::argmax::argmax_on_device(&eager)?;
            let out = best.zeros_like()?;
            (best, out)
        } else {
            let out = eager.zeros_like()?;
            (eager, out)
        };
        match record(dev, || {
            let (logits, hidden) = step(&ids, &words_t, input.as_ref())?;
            if let (Some(aux), Some(hidden)) = (&aux, &hidden) {
                aux.slice_set(hidden, 0, 0)?;
            }
            if greedy {
                Ok(super::argmax::argmax_into(&logits, &out)?)
            } else {
                out.slice_set(&logits, 0, 0)?;
                Ok(())
            }
        }) {
            Ok(graph) => {
                crate::nn::graphs::count_recording();
                if let Some(census) = graph.census.filter(|_| census_printed()) {
                    eprintln!("graph of {t} rows: {census:?}");
                }
                if !inner.made.contains(&(t, words.len())) {
                    inner.made.push((t, words.len()));
                }
                inner.recordings.push((
                    slot,
                    Recording {
                        key,
                        io,
                        out,
                        aux,
                        input,
                        graph,
                        rows: t,
                        generation,
                    },
                ))
            }
            Err(e) => {
                eprintln!("warning: CUDA graph recording failed, decoding without graphs: {e}");
                inner.disabled = true;
            }
        }
        Ok(Some((eager, eager_aux)))
    }
}

/// Records the device work `f` queues on `dev`'s stream as a graph (nothing runs), its
/// tensors kept to the end of the capture and its kernels joined by programmatic edges
/// ([`graph_edges`]).
fn record(dev: &CudaDevice, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
    let stream = dev.cuda_stream();
    bind(&stream)?;
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| Error::invalid(format!("begin capture: {e}")))?;
    graph_edges::begin();
    let body = f();
    // The kept tensors are freed here, inside the capture: after every kernel.
    graph_edges::finish();
    // End the capture whatever happened, or the stream stays unusable.
    // SAFETY: the stream is capturing (begun above).
    let graph = unsafe { result::stream::end_capture(stream.cu_stream()) };
    let graph = match (body, graph) {
        (Ok(()), Ok(g)) if !g.is_null() => g,
        (body, graph) => {
            if let Ok(g) = graph {
                if !g.is_null() {
                    // SAFETY: a graph returned by the capture, owned here.
                    unsafe { sys::cuGraphDestroy(g) };
                }
            }
            body?;
            return Err(match graph {
                Ok(_) => Error::invalid("capture recorded nothing"),
                Err(e) => Error::invalid(format!("end capture: {e}")),
            });
        }
    };
    // SAFETY: `graph` is owned here and not yet instantiated.
    let census = census_wanted().then(|| unsafe { graph_edges::census(graph) }.unwrap_or_default());
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    let flags =
        u64::from(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0);
    // SAFETY: out-pointer to a local; `graph` is valid.
    if let Err(e) = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags) }.result() {
        // SAFETY: as above.
        unsafe { sys::cuGraphDestroy(graph) };
        return Err(Error::invalid(format!("graph instantiation: {e}")));
    }
    let graph = Graph {
        graph,
        exec,
        stream: stream.clone(),
        census,
    };
    // SAFETY: `exec` is live; uploading it ahead spares the first replay the setup.
    unsafe { sys::cuGraphUpload(graph.exec, stream.cu_stream()) }
        .result()
        .map_err(|e| Error::invalid(format!("graph upload: {e}")))?;
    Ok(graph)
}
