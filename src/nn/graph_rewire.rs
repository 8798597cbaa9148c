//! Programmatic edges back into a captured step (CUDA graphs).
//!
//! A step's tensors come from candle's stream-ordered allocator and are freed when they drop.
//! Captured, every allocation and every free becomes a memory node in the stream's chain,
//! between two kernels, and the capture joins the kernel after it with an ordinary edge: the
//! programmatic (PDL) edges our launches ask for are lost, and each kernel waits for the full
//! completion of the one before it. Measured on the H200 (`scripts/gemv_lab.cu`, rows
//! "memory nodes"; docs/gpu-decode-2026-11-25.md): 115 µs of an 8B-shaped decode step, 12 µs
//! of a 1B-shaped one. [`rewire`] rebuilds the chain's edges after the capture:
//!
//! * consecutive compute nodes (kernels, copies, memsets) are joined directly —
//!   programmatically where the later one is a kernel launched with PDL
//!   ([`note_pdl_launch`]) after another kernel, by an ordinary edge otherwise;
//! * an allocation precedes the first compute node after it, and follows every earlier free
//!   of a range it overlaps (a capture hands a freed address out again);
//! * a free follows its allocation and the last compute node before it: every use of its
//!   memory precedes it in stream order, and a PDL kernel's completion implies the completion
//!   of the kernel before it, since each of its blocks waits (`griddepcontrol.wait`,
//!   kernels.cu's `pdl_begin`) before it exits.
//!
//! An allocation reusing the address freed just before it would still order its kernel after
//! the full completion of the previous one; so while a step records, its tensors are kept
//! ([`keep`]) until the capture ends, and their frees land at the graph's end, after every
//! kernel. The step's intermediate buffers then all live at once (a few MB for a decode step;
//! for a 16-row verification block of an 8B-shaped model at 8,000 tokens of context, the
//! split attention's partial sums dominate: ~0.3 GB per recording).
//!
//! Anything but a single chain, or a free of memory the graph did not allocate, leaves the
//! graph as captured. `SPECDEC_GRAPH_REWIRE=0` records as before (for comparisons in one
//! build).
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::Tensor;

use crate::error::{Error, Result};

/// Whether recordings keep their tensors and get rewired (`SPECDEC_GRAPH_REWIRE`, default on).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SPECDEC_GRAPH_REWIRE").map_or(true, |v| v != "0"))
}

/// What the capture on this thread collects.
#[derive(Default)]
struct Capture {
    kept: Vec<Tensor>,
    /// Kernel nodes launched with the PDL attribute.
    pdl: HashSet<usize>,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// Starts collecting for a capture on this thread (when [`enabled`]).
pub(crate) fn begin() {
    if enabled() {
        CAPTURE.set(Some(Capture::default()));
    }
}

/// Ends the collection: drops the kept tensors — call it before the capture ends, so that
/// their frees are captured after every kernel — and returns the PDL kernel nodes (`None`
/// when not [`enabled`]).
pub(crate) fn finish() -> Option<HashSet<usize>> {
    CAPTURE.take().map(|c| {
        drop(c.kept);
        c.pdl
    })
}

/// Keeps `t`'s storage alive until the capture on this thread ends (nothing outside one).
pub(crate) fn keep(t: &Tensor) {
    CAPTURE.with_borrow_mut(|c| {
        if let Some(c) = c {
            c.kept.push(t.clone());
        }
    });
}

/// Notes the kernel just launched with the PDL attribute on `stream` (no-op outside a
/// capture): the capture's current dependency is its node.
pub(crate) fn note_pdl_launch(stream: sys::CUstream) {
    CAPTURE.with_borrow_mut(|c| {
        let Some(c) = c else { return };
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut data: *const sys::CUgraphEdgeData = std::ptr::null();
        let mut n = 0usize;
        // SAFETY: out-pointers to locals; the arrays returned stay valid until the next
        // operation on the stream, and are read right away.
        let ok = unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut deps,
                &mut data,
                &mut n,
            )
        }
        .result()
        .is_ok();
        if ok && status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE && n == 1 {
            // SAFETY: one dependency was returned.
            c.pdl.insert(unsafe { *deps } as usize);
        }
    });
}

/// A captured graph's nodes and edges, before and after [`rewire`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    pub nodes: usize,
    pub kernels: usize,
    /// Memory allocation and free nodes.
    pub memory: usize,
    /// Programmatic edges as captured.
    pub programmatic_captured: usize,
    /// Programmatic edges after the rewiring (equal when it left the graph alone).
    pub programmatic: usize,
    pub rewired: bool,
}

fn check(r: sys::CUresult, what: &str) -> Result<()> {
    r.result()
        .map_err(|e| Error::invalid(format!("graph rewiring: {what}: {e}")))
}

enum Kind {
    Compute { kernel: bool },
    Alloc { start: u64, end: u64 },
    Free { ptr: u64 },
}

const DEFAULT_EDGE: sys::CUgraphEdgeData = sys::CUgraphEdgeData {
    from_port: 0,
    to_port: 0,
    type_: 0,
    reserved: [0; 5],
};

/// The edge a capture makes for a PDL launch after a kernel.
const PROGRAMMATIC_EDGE: sys::CUgraphEdgeData = sys::CUgraphEdgeData {
    from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
    to_port: 0,
    type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
    reserved: [0; 5],
};

fn is_programmatic(d: &sys::CUgraphEdgeData) -> bool {
    d.type_ == PROGRAMMATIC_EDGE.type_
}

/// Rewires the captured (not yet instantiated) graph `g` as the module doc says; `pdl` holds
/// its kernel nodes launched with the PDL attribute.
///
/// # Safety
/// `g` must be a valid graph no other thread touches meanwhile.
pub(crate) unsafe fn rewire(g: sys::CUgraph, pdl: &HashSet<usize>) -> Result<Census> {
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
    let mut data = vec![DEFAULT_EDGE; e];
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
    let mut kinds = Vec::with_capacity(n);
    for &node in &nodes {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check(
            unsafe { sys::cuGraphNodeGetType(node, &mut t) },
            "node type",
        )?;
        kinds.push(match t {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                let mut p: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                check(
                    unsafe { sys::cuGraphMemAllocNodeGetParams(node, &mut p) },
                    "allocation",
                )?;
                Kind::Alloc {
                    start: p.dptr,
                    end: p.dptr + p.bytesize as u64,
                }
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                let mut ptr = 0;
                check(
                    unsafe { sys::cuGraphMemFreeNodeGetParams(node, &mut ptr) },
                    "free",
                )?;
                Kind::Free { ptr }
            }
            t => Kind::Compute {
                kernel: t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL,
            },
        });
    }
    let mut census = Census {
        nodes: n,
        kernels: kinds
            .iter()
            .filter(|k| matches!(k, Kind::Compute { kernel: true }))
            .count(),
        memory: kinds
            .iter()
            .filter(|k| !matches!(k, Kind::Compute { .. }))
            .count(),
        programmatic_captured: data.iter().filter(|d| is_programmatic(d)).count(),
        ..Census::default()
    };
    census.programmatic = census.programmatic_captured;
    let Some(order) = chain(&nodes, &from, &to) else {
        return Ok(census);
    };

    // The new edges, as indices into `nodes`.
    let mut edges: Vec<(usize, usize, sys::CUgraphEdgeData)> = Vec::with_capacity(2 * n);
    let mut last_compute: Option<usize> = None;
    let mut waiting_allocs: Vec<usize> = Vec::new();
    let mut allocs: HashMap<u64, (usize, u64)> = HashMap::new();
    let mut frees: Vec<(usize, u64, u64)> = Vec::new();
    for &i in &order {
        match kinds[i] {
            Kind::Compute { kernel } => {
                if let Some(p) = last_compute {
                    let prog = kernel
                        && matches!(kinds[p], Kind::Compute { kernel: true })
                        && pdl.contains(&(nodes[i] as usize));
                    edges.push((
                        p,
                        i,
                        if prog {
                            PROGRAMMATIC_EDGE
                        } else {
                            DEFAULT_EDGE
                        },
                    ));
                }
                edges.extend(waiting_allocs.drain(..).map(|a| (a, i, DEFAULT_EDGE)));
                last_compute = Some(i);
            }
            Kind::Alloc { start, end } => {
                edges.extend(
                    frees
                        .iter()
                        .filter(|&&(_, s, e)| s < end && start < e)
                        .map(|&(f, _, _)| (f, i, DEFAULT_EDGE)),
                );
                allocs.insert(start, (i, end));
                waiting_allocs.push(i);
            }
            Kind::Free { ptr } => {
                // Memory the graph did not allocate: leave the graph as captured.
                let Some(&(a, end)) = allocs.get(&ptr) else {
                    return Ok(census);
                };
                edges.push((a, i, DEFAULT_EDGE));
                if let Some(p) = last_compute {
                    edges.push((p, i, DEFAULT_EDGE));
                }
                frees.push((i, ptr, end));
            }
        }
    }
    check(
        unsafe {
            sys::cuGraphRemoveDependencies_v2(g, from.as_ptr(), to.as_ptr(), data.as_ptr(), e)
        },
        "removing the captured edges",
    )?;
    let new_from: Vec<_> = edges.iter().map(|&(f, _, _)| nodes[f]).collect();
    let new_to: Vec<_> = edges.iter().map(|&(_, t, _)| nodes[t]).collect();
    let new_data: Vec<_> = edges.iter().map(|&(_, _, d)| d).collect();
    check(
        unsafe {
            sys::cuGraphAddDependencies_v2(
                g,
                new_from.as_ptr(),
                new_to.as_ptr(),
                new_data.as_ptr(),
                edges.len(),
            )
        },
        "adding the new edges",
    )?;
    census.programmatic = new_data.iter().filter(|d| is_programmatic(d)).count();
    census.rewired = true;
    Ok(census)
}

/// The nodes' indices in chain order when the edges make one chain (one root, every node at
/// most one predecessor and one successor), else `None`.
fn chain(
    nodes: &[sys::CUgraphNode],
    from: &[sys::CUgraphNode],
    to: &[sys::CUgraphNode],
) -> Option<Vec<usize>> {
    let n = nodes.len();
    if n == 0 || from.len() + 1 != n {
        return None;
    }
    let index: HashMap<usize, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, &node)| (node as usize, i))
        .collect();
    let mut next = vec![None; n];
    let mut has_pred = vec![false; n];
    for (f, t) in from.iter().zip(to) {
        let (f, t) = (*index.get(&(*f as usize))?, *index.get(&(*t as usize))?);
        if next[f].is_some() || has_pred[t] {
            return None;
        }
        next[f] = Some(t);
        has_pred[t] = true;
    }
    let mut cur = (0..n).find(|&i| !has_pred[i]);
    let mut order = Vec::with_capacity(n);
    while let Some(i) = cur {
        order.push(i);
        cur = next[i];
    }
    (order.len() == n).then_some(order)
}
