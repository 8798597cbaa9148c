//! specdec's own CUDA kernels (`kernels.cu` and the files it includes, compiled by `build.rs`
//! into one fat binary: machine code for the build's GPU architecture and PTX for newer ones)
//! behind candle's custom-op interface. Only built with the `cuda` feature; callers keep
//! candle's ops as the path on every other device.
//!
//! * [`attention`] — attention over a KV cache in place, flash attention of prefills, the
//!   prefill chunks' causal softmax (f32); [`rope_store`] — RoPE with the K/V store at
//!   device-side positions;
//! * [`dense`] — the row-wise products and elementwise steps: GEMV, SiLU·up, residual add +
//!   RMSNorm;
//! * [`argmax`] — the row argmax that ends a greedy step;
//! * [`graph`] — steps recorded as CUDA graphs and replayed, with [`graph_edges`] keeping
//!   the programmatic edges between their kernels.
#[macro_use]
mod op;

mod argmax;
mod attention;
mod commit;
mod dense;
pub(crate) mod graph;
pub(crate) mod graph_edges;
mod launch;
#[cfg(feature = "nccl")]
pub(crate) mod nccl;
mod prefill;
mod rope_store;

pub use argmax::argmax_on_device;
pub use attention::{
    fused_rope, split_attention_applies, split_reach, AttnRope, QkNorm, RingKeys, RingTail,
    SplitAttention,
};
pub(crate) use commit::{commit_path_rows, commit_rings, PathCopy, RingCommit};
pub use dense::{
    add_rmsnorm_applies, bias_fits, fold_applies, folds, gemv_applies, silu_gate_applies,
    AddRmsNorm, Fold, FoldedGemv, GateMul, Gemv,
};
pub(crate) use launch::pdl;
pub use launch::{kernel_trace, TraceRecord};
pub use prefill::{flash_attention_applies, CausalSoftmax, FlashAttention};
pub use rope_store::RopeStore;
