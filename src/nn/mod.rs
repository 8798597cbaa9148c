//! Building blocks shared by every architecture: checkpoint loading, linear layers and norms,
//! RoPE, the one attention implementation, the gated MLP and the decoder that wires them.
//!
//! Activations are row-major `[tokens, features]` (batch size 1); attention works on
//! `[1, heads, tokens, head_dim]` as the cache layer stores K/V.

mod attention;
mod block;
mod clock;
mod cpu_attention;
#[cfg(feature = "cuda")]
mod cuda;
mod eagle3;
mod fused;
mod graphs;
mod linear;
mod loader;
mod mlp;
mod parallel;
pub mod profile;
mod rope;
pub mod shard;
mod skinny;
mod spec;
mod threads;
mod tokens;
mod transformer;
mod weights;

pub use attention::{
    causal_attention, ring_attention, Attention, AttentionParts, HeadShape, PREFILL_CHUNK,
    SPLIT_MAX_ROWS,
};
pub use clock::QueueMark;
#[cfg(feature = "cuda")]
pub(crate) use cuda::{commit_path_rows, commit_rings, PathCopy, RingCommit};
#[cfg(feature = "cuda")]
pub use cuda::{kernel_trace, TraceRecord};
pub use eagle3::{Eagle3Head, Eagle3Parts};
pub(crate) use fused::argmax_on_device;
pub use fused::{argmax_rows, cuda_ordinal, folded_gemv, open_cuda, Folded, Gate};
pub use graphs::{count_graph_censuses, graph_pdl, graphs_enabled, recordings_made, GraphCensus};
pub use linear::{Linear, RmsNorm};
pub use mlp::{Activation, GatedMlp};
pub use parallel::{all_reduce_group, process_group};
pub use rope::{Rope, RopeScaling, RopeSpec};
pub use skinny::{skinny_matmul, SkinnyWeight};
pub use spec::{DecoderSpec, LayerKind, NormLayout};
pub use threads::{on_cpu_pool, pin_cpu_thread_count};
pub use tokens::{DeviceTokens, StepIds};
pub use transformer::{Decoder, GRAPH_MAX_ROWS};
pub(crate) use weights::shard_paths;
pub use weights::{Weights, INDEX_FILE, SINGLE_FILE};
