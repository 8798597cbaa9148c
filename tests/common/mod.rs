//! Helpers shared by the integration tests: every test that uses one declares `mod common;`
//! and reaches it as `common::…`. Each test binary compiles its own copy of this tree, so a
//! helper one binary does not use is dead code there (allowed below).
//!
//! * [`device`] — the test device and dtype (`SPECDEC_TEST_DEVICE`, `SPECDEC_TEST_DTYPE`).
//! * [`checkpoint`] — loading the shipped models and the transformers fixtures.
//! * [`host`] — deterministic inputs, read-back to the host, relative error of two tensors.
//! * [`decode`] — the decode-path equivalence tests' caches and token streams.
//! * [`toy`] — a tiny one-layer attention language model over the real cache layer.
//! * [`probe`] — the cache kinds, K/V that encode token and position and the fresh-prefill
//!   invariant of the cache property tests.
//! * [`real`] — the real GGUF checkpoints in `models/real/`, skipped with a notice when absent.
//! * [`ring_model`] — an independent model of a rotating cache's ring.
//! * [`distribution`] — the distribution-test harness (exact distributions, chi-square).
//! * [`eagle3`] — random EAGLE-3 heads in the authors' layout.
#![allow(dead_code)]

pub mod checkpoint;
pub mod decode;
pub mod device;
pub mod distribution;
pub mod eagle3;
pub mod exp;
pub mod host;
pub mod probe;
pub mod real;
pub mod ring_model;
pub mod run;
pub mod toy;

pub use device::device;
pub use toy::Toy;
