//! Gemma 3 text (`model_type: "gemma3_text"`, or the `text_config` of a multimodal
//! `"gemma3"` checkpoint): interleaved sliding and global layers with separate RoPE bases,
//! `(1 + w)` RMSNorms around attention and MLP, q/k norms, gelu-tanh MLP, embeddings scaled
//! by `sqrt(hidden_size)`, `query_pre_attn_scalar^-0.5` scaling, an optional final logit
//! softcap, and always-tied embeddings.
//!
//! `attn_logit_softcapping` is read but not applied: transformers' Gemma 3 attention never
//! passes it on (unlike Gemma 2), and transformers' outputs are the ground truth. Released
//! Gemma 3 checkpoints set it to null anyway.
use super::base::{full_rope, llama_like, Defaults};
use super::config::{HfConfig, RopeKeys};
use crate::error::Result;
use crate::nn::{DecoderSpec, LayerKind, NormLayout};

/// `Gemma3TextConfig` defaults (the 4B checkpoint's `text_config` relies on most of them):
/// vocab, hidden, intermediate, layers, heads, kv heads, head_dim.
const DEFAULTS: Defaults = Defaults {
    dims: Some([262_208, 2304, 9216, 26, 8, 4, 256]),
    rope_theta: 1_000_000.0,
    tie: true,
    activation: ("hidden_activation", "gelu_pytorch_tanh"),
};

/// The decoder of a Gemma 3 text config.
pub(super) fn spec(cfg: &HfConfig) -> Result<DecoderSpec> {
    if cfg.bool("use_bidirectional_attention")? == Some(true) {
        return Err(cfg.error(
            "use_bidirectional_attention",
            "bidirectional Gemma 3 (an embedding model) is not a causal language model",
        ));
    }
    let mut spec = llama_like(cfg, &DEFAULTS)?;
    let num_layers = spec.layers.len();
    spec.norm_plus_one = true;
    spec.norm_layout = NormLayout::Sandwich;
    spec.qk_norm = true;
    spec.mlp_bias = false;
    spec.scale_embeddings = true;
    spec.tie_embeddings = true;
    spec.attn_scale = cfg
        .f64("query_pre_attn_scalar")?
        .unwrap_or(256.0)
        .powf(-0.5);
    cfg.positive_f64("attn_logit_softcapping")?; // validated, ignored as in transformers (see above)
    spec.attn_softcap = None;
    spec.final_softcap = cfg.positive_f64("final_logit_softcapping")?;
    let window = cfg.positive_or("sliding_window", 4096)?;
    spec.layers = match cfg.layer_types(num_layers, Some(window))? {
        Some(kinds) => kinds,
        None => {
            // 4.x: every `sliding_window_pattern`-th layer is global, the others slide.
            let pattern = cfg.positive_or("sliding_window_pattern", 6)?;
            (0..num_layers)
                .map(|i| match (i + 1) % pattern {
                    0 => LayerKind::Full,
                    _ => LayerKind::Sliding { window },
                })
                .collect()
        }
    };
    spec.rope_full = full_rope(cfg, DEFAULTS.rope_theta)?;
    spec.rope_sliding = cfg.rope(RopeKeys {
        layer_type: "sliding_attention",
        theta_key: "rope_local_base_freq",
        default_theta: 10_000.0,
        scaling_key: None,
    })?;
    Ok(spec)
}
