//! Qwen2 / Qwen2.5 (`model_type: "qwen2"`): Llama with biases on q/k/v (never on o).
use super::base::{llama_like, qwen_layers, Defaults};
use super::config::HfConfig;
use crate::error::Result;
use crate::nn::DecoderSpec;

/// The decoder of a Qwen2 config.
pub(super) fn spec(cfg: &HfConfig) -> Result<DecoderSpec> {
    let mut spec = llama_like(cfg, &Defaults::REQUIRED)?;
    spec.qkv_bias = true;
    spec.o_bias = false;
    spec.mlp_bias = false;
    spec.layers = qwen_layers(cfg, spec.layers.len())?;
    Ok(spec)
}
