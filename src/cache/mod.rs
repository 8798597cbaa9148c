//! Transactional speculative KV caches.
//!
//! Vocabulary: an `offset` is an absolute token count (the position of the next token); an
//! index into a ring buffer is a `slot`. K/V tensors are `[batch, kv_heads, seq, head_dim]`
//! everywhere; the sequence axis is dim 2.
//!
//! * [`KvCache`] — unbounded, grown in chunks; speculation writes through and rewinds.
//! * [`RotatingKvCache`] — sliding window ring; speculation is either *staged* (pending K/V
//!   kept beside the ring) or a *slack ring* (spare capacity, rollback moves the cursor).
//! * [`ModelCache`] — the caches of all layers of one model; opens [`Speculation`]
//!   transactions and takes [`CacheSnapshot`]s.
//! * [`PrefixStore`] — snapshots keyed by token prefixes, shared by a run's generations.

mod buffer;
mod kv;
mod mask;
mod model;
mod prefix;
mod rotating;
mod tree;

use candle_core::Tensor;

use crate::error::Result;

pub use kv::{KvCache, KvSnapshot, DEFAULT_STEP};
pub use mask::{KeyOrder, Mask};
pub use model::{merge, split, CacheSnapshot, LayerCache, LayerSnapshot, ModelCache, Speculation};
pub use prefix::PrefixStore;
pub use rotating::{RotatingKvCache, RotatingSnapshot, RotatingStrategy};
pub use tree::TokenTree;

pub(crate) use tree::path_moves;

/// What attention needs after a cache update.
///
/// `k`, `v`: `[batch, kv_heads, kv_len, head_dim]`, possibly non-contiguous views of the
/// cache's buffers (valid until the cache is next written); `tail`: more keys and values
/// after them, kept apart (a staged speculation's K/V beside the ring, which would otherwise
/// be copied together with the whole window on every append). `mask`: which of all those keys
/// each new query sees, described by positions; attention materialises it
/// (`[q_len, kv_len + tail_len]` f32, additive) only when something is hidden.
#[derive(Debug, Clone)]
pub struct Attend {
    /// Keys to attend over.
    pub k: Tensor,
    /// Values to attend over.
    pub v: Tensor,
    /// Keys and values that follow `k` and `v`.
    pub tail: Option<(Tensor, Tensor)>,
    /// Visibility of `k` then `tail` (in that order) to the new queries.
    pub mask: Mask,
}

impl Attend {
    /// `k` and `v` with the tail appended (a copy when there is a tail): for consumers that
    /// want one tensor each.
    pub fn joined(&self) -> Result<(Tensor, Tensor)> {
        match &self.tail {
            None => Ok((self.k.clone(), self.v.clone())),
            Some((tk, tv)) => Ok((
                Tensor::cat(&[&self.k, tk], 2)?,
                Tensor::cat(&[&self.v, tv], 2)?,
            )),
        }
    }

    /// The additive mask `[q_len, kv_len]` on `k`'s device, or `None` when nothing is hidden.
    pub fn mask_tensor(&self) -> Result<Option<Tensor>> {
        self.mask.tensor(self.k.device())
    }
}

/// A refused cache operation. Refusals leave the cache unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// `restore` asked for a position the cache (or snapshot) cannot reproduce.
    #[error("cache cannot reach offset {target}: {reason}")]
    Unreachable {
        /// The requested offset.
        target: usize,
        /// Why it cannot be reached.
        reason: String,
    },
    /// `split` of a snapshot kind that cannot be split (rotating snapshots hold a whole window).
    #[error("split refused: {0}")]
    SplitRefused(String),
    /// `merge` of snapshots that are not adjacent or not of the same layout.
    #[error("merge refused: {0}")]
    MergeRefused(String),
    /// A snapshot of one cache kind or layer count was given to another.
    #[error("snapshot kind mismatch: {0}")]
    KindMismatch(String),
    /// `commit(n)` with more tokens than the speculation appended.
    #[error("commit of {n} tokens, but the speculation appended only {appended}")]
    CommitTooLong {
        /// Tokens asked to keep.
        n: usize,
        /// Tokens appended inside the speculation.
        appended: usize,
    },
    /// A slack ring was asked to hold more speculative tokens than its slack allows.
    #[error("speculation of {len} tokens exceeds the slack ring's limit of {max}")]
    SpeculationTooLong {
        /// Tokens the speculation would hold.
        len: usize,
        /// The most the ring can roll back.
        max: usize,
    },
    /// An operation that needs no open speculation was called inside one (or a nested one).
    #[error("a speculation is open on this cache")]
    SpeculationOpen,
    /// A commit, restore or forward failed half-way; the cache can no longer be trusted.
    #[error("cache poisoned by an earlier failed commit, restore or forward; reset it")]
    Poisoned,
    /// Input tensors of the wrong rank or shape.
    #[error("bad cache input: {0}")]
    BadInput(String),
    /// A token tree whose parents are not topological, an append past its nodes, or a
    /// committed path that is not root-to-node.
    #[error("bad token tree: {0}")]
    BadTree(String),
}
