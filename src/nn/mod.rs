//! Building blocks shared by every architecture: checkpoint loading, linear layers and norms,
//! RoPE, the one attention implementation, the gated MLP and the decoder that wires them.
//!
//! Activations are row-major `[tokens, features]` (batch size 1); attention works on
//! `[1, heads, tokens, head_dim]` as the cache layer stores K/V.

mod attention;
mod clock;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_graph;
mod fused;
#[cfg(feature = "cuda")]
mod graph_edges;
mod linear;
mod mlp;
pub mod profile;
mod rope;
mod skinny;
mod threads;
mod tokens;
mod transformer;
mod weights;

pub use attention::{
    causal_attention, Attention, AttentionParts, HeadShape, PREFILL_CHUNK, SPLIT_MAX_ROWS,
};
pub use clock::QueueMark;
#[cfg(feature = "cuda")]
pub use cuda::{kernel_trace, TraceRecord};
pub use fused::{
    argmax_rows, count_graph_censuses, folded_gemv, graph_pdl, graphs_enabled, open_cuda,
    set_cuda_graphs, Folded, GraphCensus,
};
pub use linear::{Linear, RmsNorm};
pub use mlp::{Activation, GatedMlp};
pub use rope::{Rope, RopeScaling, RopeSpec};
pub use skinny::skinny_matmul;
pub use threads::{on_cpu_pool, pin_cpu_thread_count};
pub use tokens::{DeviceTokens, StepIds};
pub use transformer::{Decoder, DecoderSpec, LayerKind, NormLayout, GRAPH_MAX_ROWS};
pub use weights::{Weights, INDEX_FILE, SINGLE_FILE};
