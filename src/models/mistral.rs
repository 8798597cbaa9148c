//! Mistral (`model_type: "mistral"`): Llama without biases; when `sliding_window` is set,
//! every layer attends over that window (rotating caches throughout).
use super::base::{llama_like, Defaults};
use super::config::HfConfig;
use crate::error::Result;
use crate::nn::{DecoderSpec, LayerKind};

/// The decoder of a Mistral config.
pub(super) fn spec(cfg: &HfConfig) -> Result<DecoderSpec> {
    let mut spec = llama_like(cfg, &Defaults::REQUIRED)?;
    spec.qkv_bias = false;
    spec.o_bias = false;
    spec.mlp_bias = false;
    if let Some(window) = cfg.usize("sliding_window")? {
        if window == 0 {
            return Err(cfg.error("sliding_window", "must be positive or null"));
        }
        spec.layers = vec![LayerKind::Sliding { window }; spec.layers.len()];
    }
    Ok(spec)
}
