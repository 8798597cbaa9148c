//! Programmatic edges in a captured step (CUDA graphs).
//!
//! A step's tensors come from candle's stream-ordered allocator and are freed when they drop.
//! Captured, every allocation and every free becomes a memory node in the stream's chain,
//! between two kernels, and the capture joins the kernel after it with an ordinary edge: the
//! programmatic (PDL) edges our launches ask for are lost, and each kernel waits for the full
//! completion of the one before it (a cost of tens of µs a step: docs/kernel-notes.md,
//! "Graph memory nodes"). (Edges cannot be moved after the capture: the driver refuses to
//! remove dependencies from a graph with memory nodes.) So while a step records:
//!
//! * an output allocation of one of our kernels is captured off the chain: [`before_alloc`]
//!   sets the capture's dependencies aside and lets the allocation be a root, and
//!   [`before_launch`] makes the kernel depend on what was set aside (programmatically where
//!   that is a kernel: the launch's PDL attribute does it) and on the allocations. A root
//!   allocation is given an address no node before it in the graph frees (the driver's
//!   graph allocator reuses an address only after a free the allocation is ordered after;
//!   `decode_graphs` checks 300 replayed steps against ordinary ones);
//! * the step's tensors ([`keep`]) and our kernels' scratch buffers ([`keep_scratch`]) live
//!   until the capture ends, so that no free sits on the chain between two kernels: their
//!   frees land at the graph's end, after every kernel (a PDL kernel completes only after
//!   the kernel before it: each of its blocks waits, `griddepcontrol.wait` in common.cuh's
//!   `pdl_begin`, before it exits). The step's intermediate buffers then all live at once:
//!   a few MB for a decode step; for a 16-row verification block of an 8B-shaped model at
//!   8,000 tokens, the split attention's partial sums dominate, ~0.3 GB per recording.
//!
//! The engine option `graph_pdl` off records without this bookkeeping (memory nodes on the
//! chain, no programmatic edges).
use std::cell::RefCell;

use candle_core::cuda_backend::cudarc::driver::{sys, CudaSlice};
use candle_core::Tensor;

use crate::error::{Error, Result};

/// Whether recordings keep their tensors and capture PDL edges: the engine option
/// `graph_pdl`, read when a capture begins.
pub(crate) fn enabled() -> bool {
    crate::engine::get().graph_pdl
}

/// What the capture on this thread holds.
#[derive(Default)]
struct Capture {
    kept: Vec<Tensor>,
    /// Scratch buffers of our kernels (split attention's partial sums).
    scratch: Vec<CudaSlice<f32>>,
    /// The capture's dependencies set aside by [`before_alloc`], until [`before_launch`].
    set_aside: Option<Vec<usize>>,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// Starts a capture's bookkeeping on this thread (when [`enabled`]).
pub(crate) fn begin() {
    if enabled() {
        CAPTURE.set(Some(Capture::default()));
    }
}

/// Ends it: drops the kept tensors and scratch buffers — call it before the capture ends, so
/// that their frees are captured after every kernel.
pub(crate) fn finish() {
    drop(CAPTURE.take());
}

/// Keeps `t`'s storage alive until the capture on this thread ends (nothing outside one).
pub(crate) fn keep(t: &Tensor) {
    CAPTURE.with_borrow_mut(|c| {
        if let Some(c) = c {
            c.kept.push(t.clone());
        }
    });
}

/// Frees a scratch buffer one of our kernels used: at once outside a capture, at its end
/// (see [`finish`]) inside one.
pub(crate) fn keep_scratch(b: CudaSlice<f32>) {
    CAPTURE.with_borrow_mut(|c| match c {
        Some(c) => c.scratch.push(b),
        None => drop(b),
    });
}

/// The capture's current dependencies on `stream`, or `None` when it is not capturing.
fn dependencies(stream: sys::CUstream) -> Result<Option<Vec<usize>>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut data: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut n = 0usize;
    // The edge data is asked for, unread, because without it the query fails
    // (`CUDA_ERROR_LOSSY_QUERY`) whenever a dependency carries non-default edge data.
    // SAFETY: out-pointers to locals; the arrays returned stay valid until the next operation
    // on the stream and are copied right away.
    check(
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut deps,
                &mut data,
                &mut n,
            )
        },
        "capture dependencies",
    )?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Ok(None);
    }
    // SAFETY: `n` nodes at `deps` (none when n is 0).
    let nodes = (0..n).map(|i| unsafe { *deps.add(i) } as usize).collect();
    Ok(Some(nodes))
}

/// Replaces the capture's dependencies on `stream` with `nodes`.
fn set_dependencies(stream: sys::CUstream, nodes: &[usize]) -> Result<()> {
    let mut nodes: Vec<sys::CUgraphNode> = nodes.iter().map(|&n| n as sys::CUgraphNode).collect();
    let ptr = if nodes.is_empty() {
        std::ptr::null_mut()
    } else {
        nodes.as_mut_ptr()
    };
    // SAFETY: `nodes` are nodes of the graph being captured; the driver copies the array.
    check(
        unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                stream,
                ptr,
                std::ptr::null(),
                nodes.len(),
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES
                    as u32,
            )
        },
        "setting capture dependencies",
    )
}

/// Call before allocating an output of one of our kernels on `stream`: inside a capture, sets
/// the capture's dependencies aside (once until [`before_launch`]), so the allocation is a
/// root of the graph rather than a link of its chain.
pub(crate) fn before_alloc(stream: sys::CUstream) -> Result<()> {
    CAPTURE.with_borrow_mut(|c| {
        let Some(c) = c else { return Ok(()) };
        if c.set_aside.is_some() {
            return Ok(());
        }
        let Some(deps) = dependencies(stream)? else {
            return Ok(());
        };
        set_dependencies(stream, &[])?;
        c.set_aside = Some(deps);
        Ok(())
    })
}

/// Call right before launching one of our kernels on `stream`: the dependencies
/// [`before_alloc`] set aside join the allocations captured since, and the launch (with its
/// PDL attribute) depends on both.
pub(crate) fn before_launch(stream: sys::CUstream) -> Result<()> {
    CAPTURE.with_borrow_mut(|c| {
        let Some(c) = c else { return Ok(()) };
        let Some(mut deps) = c.set_aside.take() else {
            return Ok(());
        };
        if let Some(allocs) = dependencies(stream)? {
            deps.extend(allocs);
            set_dependencies(stream, &deps)?;
        }
        Ok(())
    })
}

pub(crate) use crate::nn::graphs::GraphCensus as Census;

fn check(r: sys::CUresult, what: &str) -> Result<()> {
    r.result()
        .map_err(|e| Error::invalid(format!("graph capture: {what}: {e}")))
}

/// Counts the nodes and edges of the captured graph `g`.
///
/// # Safety
/// `g` must be a valid graph no other thread touches meanwhile.
pub(crate) unsafe fn census(g: sys::CUgraph) -> Result<Census> {
    let mut n = 0usize;
    check(
        unsafe { sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n) },
        "node count",
    )?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    check(
        unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n) },
        "nodes",
    )?;
    let mut e = 0usize;
    check(
        unsafe {
            sys::cuGraphGetEdges_v2(
                g,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut e,
            )
        },
        "edge count",
    )?;
    let mut from: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); e];
    let mut to: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); e];
    let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; e];
    check(
        unsafe {
            sys::cuGraphGetEdges_v2(
                g,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut e,
            )
        },
        "edges",
    )?;
    let mut census = Census {
        nodes: n,
        edges: e,
        programmatic: data
            .iter()
            .filter(|d| {
                d.type_ == sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8
            })
            .count(),
        ..Census::default()
    };
    for &node in &nodes {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check(
            unsafe { sys::cuGraphNodeGetType(node, &mut t) },
            "node type",
        )?;
        match t {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => census.kernels += 1,
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC
            | sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => census.memory += 1,
            _ => {}
        }
    }
    Ok(census)
}
