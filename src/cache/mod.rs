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

mod attend;
mod buffer;
mod error;
mod hidden;
mod in_place;
mod kv;
mod mask;
mod model;
mod prefix;
mod rotating;
mod tree;

pub use attend::Attend;
pub use error::CacheError;
pub use in_place::{InPlace, StagedTail};
pub use kv::{KvCache, KvSnapshot, DEFAULT_STEP};
pub use mask::{KeyOrder, Mask};
pub use model::{
    advance_layers, merge, reserve_layers, split, CacheSnapshot, LayerCache, LayerSnapshot,
    ModelCache, Speculation,
};
pub use prefix::PrefixStore;
pub use rotating::{RotatingKvCache, RotatingSnapshot, RotatingStrategy};
pub use tree::{TokenTree, STEP_WORDS_MAX_NODES};

pub(crate) use tree::path_moves;
