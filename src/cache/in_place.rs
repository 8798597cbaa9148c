//! What a layer's cache hands a step that writes its K/V itself (a replayed CUDA graph; see
//! [`crate::cache::ModelCache::reserve_in_place`]).
use candle_core::Tensor;

/// A layer's cache buffers for a step whose attention writes its K/V itself (a replayed
/// CUDA graph; see [`crate::cache::ModelCache::reserve_in_place`]).
#[derive(Debug, Clone)]
pub struct InPlace {
    /// The layer's whole buffers `[b, h, capacity, d]`: an unbounded cache's slots, or a
    /// ring (position `p` in slot `p % capacity`).
    pub k: Tensor,
    /// Values, shaped like `k`.
    pub v: Tensor,
    /// Allocation id of `k` and `v`: a recording against them is valid while it is unchanged.
    pub id: u64,
    /// A staged ring inside a speculation: the step's K/V go to the side buffer instead.
    pub tail: Option<StagedTail>,
}

/// The side buffer of a staged ring inside a speculation, for a step written in place: the
/// positions from `base` on live in its slots `0, 1, ...`, the ring holds those below.
#[derive(Debug, Clone)]
pub struct StagedTail {
    /// The side buffer `[b, h, slots, d]`.
    pub k: Tensor,
    /// Values, shaped like `k`.
    pub v: Tensor,
    /// Allocation id of the side buffer.
    pub id: u64,
    /// Positions it holds after the step (the speculation's so far plus the step's).
    pub len: usize,
}
