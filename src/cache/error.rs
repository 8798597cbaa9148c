//! [`CacheError`]: the refusals of cache operations.

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
