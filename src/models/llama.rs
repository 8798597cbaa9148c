//! Llama 1/2/3.x (`model_type: "llama"`): the reference layout; Llama 3.1's RoPE scaling
//! (`rope_type: "llama3"`) comes from the config.
use super::base::{llama_like, Defaults};
use super::config::HfConfig;
use crate::error::Result;
use crate::nn::DecoderSpec;

/// The decoder of a Llama config.
pub(super) fn spec(cfg: &HfConfig) -> Result<DecoderSpec> {
    llama_like(cfg, &Defaults::REQUIRED)
}
