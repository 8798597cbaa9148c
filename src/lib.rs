//! specdec: a speculative decoding research framework on candle.
//!
//! The heart is [`cache`]: transactional speculative KV caches (unbounded and sliding-window)
//! with snapshot, restore, merge and split.
pub mod bench_cache;
pub mod cache;
pub mod engine;
pub mod error;
pub mod experiment;
pub mod gguf;
pub mod models;
pub mod nn;

pub use error::{Error, Result};
pub mod speculative;
pub mod stats;
