//! Qwen3 (`model_type: "qwen3"`): Llama with per-head RMSNorm of queries and keys before RoPE
//! and an explicit `head_dim`.
use super::base::{llama_like, qwen_layers, Defaults};
use super::config::HfConfig;
use crate::error::Result;
use crate::nn::DecoderSpec;

/// The decoder of a Qwen3 config.
pub(super) fn spec(cfg: &HfConfig) -> Result<DecoderSpec> {
    let mut spec = llama_like(cfg, &Defaults::REQUIRED)?;
    spec.qk_norm = true;
    spec.mlp_bias = false;
    spec.layers = qwen_layers(cfg, spec.layers.len())?;
    Ok(spec)
}
