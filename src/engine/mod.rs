//! Engine options: the switches that choose how the engine runs a step — which kernels a
//! CUDA step launches, whether short steps replay recorded CUDA graphs, whether a greedy
//! step verifies drafts it has not read back. None changes the tokens a generation yields
//! (greedy output stays the autoregressive output; sampled output keeps the target's
//! distribution); they change speed and what is measured, so they are typed, validated,
//! recorded with every result and can be swept like any other experiment key.
//!
//! The options in effect are process-wide ([`set`], [`get`]): the kernels read them at each
//! launch. [`generation`] counts changes, so that state built under older options (recorded
//! CUDA graphs) can tell it is stale. Environment variables are one override layer on top of
//! a configuration, parsed in [`env`] only.
pub mod env;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Every engine option, with the library's defaults ([`EngineOptions::default`]).
///
/// Kernel options take effect on CUDA devices only; elsewhere they are recorded but change
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineOptions {
    /// Greedy steps queue the target's verification behind the drafter's device work and read
    /// drafts and verdict back in one round trip (default on); off, the drafts are read back
    /// before the verification is queued: two round trips a step.
    pub queued_verify: bool,
    /// Short CUDA steps replay recorded graphs. Off by default in the library: recording
    /// captures everything queued on the device's one stream, so no other thread may queue
    /// work on that device while a step records. `exp` decodes one sequence at a time on one
    /// thread and turns it on.
    pub cuda_graphs: bool,
    /// Print each graph recording's census of nodes and edges (diagnostics; default off).
    pub graph_census: bool,
    /// Recorded graph steps a model keeps, least recently used dropped first (default 64).
    /// Every point of an interleaved sweep has caches of its own, and a recording serves one
    /// cache's buffers, one block length and one attention reach: a sweep whose live steps
    /// outnumber this records steps again inside its timed generations (each generation's
    /// `graph_recordings` counts them).
    pub graphs_kept: usize,
    /// Kernels carry the programmatic-dependent-launch attribute on compute capability 9.0
    /// or newer (default on).
    pub pdl: bool,
    /// Recordings keep their tensors and capture PDL edges (default on).
    pub graph_pdl: bool,
    /// Graph steps fuse RoPE and the K/V store into the split attention (default on).
    pub fused_rope: bool,
    /// Megabytes of the MLP's gate/up weight that the attention's prologue prefetches into
    /// the L2 (default 8; 0 turns it off).
    pub l2_prefetch_mb: f64,
    /// bf16 / f16 GEMVs run on tensor cores (default on; off: the CUDA-core kernel).
    pub tc_gemv: bool,
    /// Pre-norms and residual adds of decode and verification steps are folded into the
    /// GEMVs (default on).
    pub gemv_fold: bool,
    /// 16-byte loads per lane and weight row per chunk of the tensor-core GEMV: 0 chooses
    /// (2 where the input width is a multiple of 64), or 1 or 2.
    pub gemv_loads: usize,
    /// The gated MLP's SiLU is fused into the gate/up GEMV (default on).
    pub silu_gate: bool,
    /// A folded product's bias (Qwen2's q/k/v) is added in the GEMV's epilogue (default on;
    /// off: candle's add after it). The same values either way.
    pub bias_fold: bool,
    /// Most warps per block of the tensor-core GEMV: 8, 16 (default) or 32.
    pub gemv_max_warps: usize,
    /// The split attention combines a row's 2–8 splits in one thread block cluster on
    /// compute capability 9.0 or newer (default on).
    pub attn_cluster: bool,
    /// The split attention may load a tile's first value rows with its keys (default on).
    pub attn_early_values: bool,
    /// Rows from which a block of a verification groups query heads (default 2; 0 never).
    pub attn_grouped_min_rows: usize,
    /// Keys a step may reach from which verification rows group query heads (default 512).
    pub attn_grouped_rows_min_len: usize,
    /// Query heads a verification block groups: 2 (default) or 4.
    pub attn_rows_heads: usize,
    /// Keys from which the split attention runs eight warps a block (default 0: always).
    pub attn_wide_min_len: usize,
    /// Sliding-window layers attend over their ring where it lies (the split kernel, the
    /// window applied from positions) and slack-strategy rings take part in recorded graph
    /// steps (default on; off: a masked product over the ring, and no graph steps for models
    /// with sliding-window layers).
    pub ring_in_place: bool,
    /// A GELU-tanh gated MLP (Gemma) applies its activation and the product with the up half
    /// in one CUDA kernel after the gate/up product (default on; off: candle's two ops).
    pub gelu_gate: bool,
    /// A recorded step's split attention with RoPE fused also applies the per-head q/k
    /// RMSNorms (Qwen3, Gemma 3) before RoPE (default on; off: two norm kernels and copies
    /// before it).
    pub qk_norm_fold: bool,
    /// Row argmaxes of long rows (a vocabulary of 16k ids or more) spread each row over
    /// several blocks (default on; off: one block a row). The same ids either way.
    pub argmax_split: bool,
    /// Token trees' blocks (and a drafter's tree steps) of up to 32 nodes are recorded steps
    /// like chains, the split kernel masking each node's non-ancestors and rotating it at its
    /// depth over the cache in place (default on, with `fused_rope`; off: the masked product
    /// over the cache the ordinary path returns, not recorded).
    pub tree_in_place: bool,
    /// A greedy EAGLE-3 proposal (the committed pairs read, then the drafts, each the argmax
    /// of the step before mapped to a target id) replays as one recorded graph (default on,
    /// with `cuda_graphs`; off: one recorded step per head forward, the argmax and mapping
    /// launched between them).
    pub chain_graphs: bool,
}

/// The library's defaults (a constant, so that the process-wide options start from it).
const DEFAULTS: EngineOptions = EngineOptions {
    queued_verify: true,
    cuda_graphs: false,
    graph_census: false,
    graphs_kept: 64,
    pdl: true,
    graph_pdl: true,
    fused_rope: true,
    l2_prefetch_mb: 8.0,
    tc_gemv: true,
    gemv_fold: true,
    gemv_loads: 0,
    silu_gate: true,
    bias_fold: true,
    gemv_max_warps: 16,
    attn_cluster: true,
    attn_early_values: true,
    attn_grouped_min_rows: 2,
    attn_grouped_rows_min_len: 512,
    attn_rows_heads: 2,
    attn_wide_min_len: 0,
    ring_in_place: true,
    gelu_gate: true,
    qk_norm_fold: true,
    argmax_split: true,
    tree_in_place: true,
    chain_graphs: true,
};

impl Default for EngineOptions {
    fn default() -> Self {
        DEFAULTS
    }
}

impl EngineOptions {
    /// Checks every value against what the engine accepts; the error names the key.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, value: String, allowed: &str| {
            Err(Error::invalid(format!(
                "engine.{key} = {value}: expected {allowed}"
            )))
        };
        if self.graphs_kept == 0 {
            return bad("graphs_kept", "0".into(), "at least 1");
        }
        if !matches!(self.gemv_loads, 0..=2) {
            return bad(
                "gemv_loads",
                self.gemv_loads.to_string(),
                "0 (auto), 1 or 2",
            );
        }
        if !matches!(self.gemv_max_warps, 8 | 16 | 32) {
            return bad(
                "gemv_max_warps",
                self.gemv_max_warps.to_string(),
                "8, 16 or 32",
            );
        }
        if !matches!(self.attn_rows_heads, 2 | 4) {
            return bad(
                "attn_rows_heads",
                self.attn_rows_heads.to_string(),
                "2 or 4",
            );
        }
        if !(self.l2_prefetch_mb.is_finite() && self.l2_prefetch_mb >= 0.0) {
            return bad(
                "l2_prefetch_mb",
                self.l2_prefetch_mb.to_string(),
                "a number of megabytes >= 0",
            );
        }
        Ok(())
    }

    /// The option keys, sorted (the keys of `[engine]` and of the records).
    pub fn keys() -> Vec<String> {
        match toml::Value::try_from(EngineOptions::default()) {
            Ok(toml::Value::Table(t)) => t.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

static CURRENT: RwLock<EngineOptions> = RwLock::new(DEFAULTS);
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The options in effect for the process (the library's defaults until [`set`]).
pub fn get() -> EngineOptions {
    *CURRENT
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Puts `options` in effect for the process after validating them; bumps [`generation`]
/// when they differ from those in effect.
pub fn set(options: EngineOptions) -> Result<()> {
    options.validate()?;
    let mut current = CURRENT
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if *current != options {
        *current = options;
        GENERATION.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Counts the changes [`set`] made; state derived from the options (a recorded CUDA graph)
/// keeps the generation it was built under and is rebuilt when it differs.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_key() {
        let bad = EngineOptions {
            gemv_max_warps: 12,
            ..EngineOptions::default()
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("engine.gemv_max_warps = 12"), "{msg}");
        let bad = EngineOptions {
            l2_prefetch_mb: -1.0,
            ..EngineOptions::default()
        };
        assert!(bad.validate().is_err());
        let bad = EngineOptions {
            graphs_kept: 0,
            ..EngineOptions::default()
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("engine.graphs_kept = 0"), "{msg}");
        assert!(EngineOptions::default().validate().is_ok());
    }

    #[test]
    fn keys_list_every_field() {
        let keys = EngineOptions::keys();
        assert_eq!(keys.len(), 26);
        assert!(keys.iter().any(|k| k == "queued_verify"));
        assert!(keys.iter().any(|k| k == "bias_fold"));
        assert!(keys.iter().any(|k| k == "qk_norm_fold"));
        assert!(keys.iter().any(|k| k == "attn_wide_min_len"));
        assert!(keys.iter().any(|k| k == "ring_in_place"));
        assert!(keys.iter().any(|k| k == "tree_in_place"));
        assert!(keys.iter().any(|k| k == "graphs_kept"));
    }
}
