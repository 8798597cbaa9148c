//! The Llama-style reading of a config that every architecture starts from.
use crate::error::Result;
use crate::nn::{Activation, DecoderSpec, HeadShape, LayerKind, NormLayout, RopeSpec};

use super::config::{HfConfig, RopeKeys};

/// Values transformers assumes for keys a config leaves out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Defaults {
    /// `(vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    /// num_key_value_heads, head_dim)` when the architecture has defaults for them (Gemma 3's
    /// nested `text_config` relies on them); `None` makes them required.
    pub dims: Option<[usize; 7]>,
    /// `rope_theta` when absent.
    pub rope_theta: f64,
    /// `tie_word_embeddings` when absent.
    pub tie: bool,
    /// The key naming the MLP activation and its default.
    pub activation: (&'static str, &'static str),
}

impl Defaults {
    /// Core dimensions required; silu MLP; untied.
    pub const REQUIRED: Defaults = Defaults {
        dims: None,
        rope_theta: 10_000.0,
        tie: false,
        activation: ("hidden_act", "silu"),
    };
}

/// The RoPE of full-attention layers in the Llama spelling.
pub(super) fn full_rope(cfg: &HfConfig, default_theta: f64) -> Result<RopeSpec> {
    cfg.rope(RopeKeys {
        layer_type: "full_attention",
        theta_key: "rope_theta",
        default_theta,
        scaling_key: Some("rope_scaling"),
    })
}

/// A pre-norm, bias-free (unless `attention_bias`/`mlp_bias`), full-attention decoder with
/// `head_dim^-0.5` scaling, read from the common keys.
pub(super) fn llama_like(cfg: &HfConfig, d: &Defaults) -> Result<DecoderSpec> {
    let dim = |key: &str, i: usize| match d.dims {
        Some(dims) => cfg.positive_or(key, dims[i]),
        None => cfg.positive(key),
    };
    let vocab_size = dim("vocab_size", 0)?;
    let hidden_size = dim("hidden_size", 1)?;
    let intermediate_size = dim("intermediate_size", 2)?;
    let num_layers = dim("num_hidden_layers", 3)?;
    let num_heads = dim("num_attention_heads", 4)?;
    let num_kv_heads =
        cfg.positive_or("num_key_value_heads", d.dims.map_or(num_heads, |x| x[5]))?;
    let head_dim = match (cfg.usize("head_dim")?, d.dims) {
        (Some(0), _) => return Err(cfg.error("head_dim", "must be positive")),
        (Some(n), _) => n,
        (None, Some(dims)) => dims[6],
        (None, None) if hidden_size % num_heads == 0 => hidden_size / num_heads,
        (None, None) => {
            return Err(cfg.error(
                "head_dim",
                format!("missing, and hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}"),
            ))
        }
    };
    if num_heads % num_kv_heads != 0 {
        return Err(cfg.error(
            "num_key_value_heads",
            format!("{num_kv_heads} does not divide num_attention_heads {num_heads}"),
        ));
    }
    let (act_key, act_default) = d.activation;
    let act_name = match cfg.str(act_key)? {
        Some(name) => name,
        None => cfg.str("hidden_act")?.unwrap_or(act_default),
    };
    let activation = Activation::from_hf(act_name).map_err(|e| cfg.error(act_key, e))?;
    let attention_bias = cfg.bool("attention_bias")?.unwrap_or(false);
    let rope = full_rope(cfg, d.rope_theta)?;
    Ok(DecoderSpec {
        vocab_size,
        hidden_size,
        intermediate_size,
        heads: HeadShape {
            num_heads,
            num_kv_heads,
            head_dim,
        },
        layers: vec![LayerKind::Full; num_layers],
        rms_norm_eps: cfg.positive_f64("rms_norm_eps")?.unwrap_or(1e-6),
        norm_plus_one: false,
        norm_layout: NormLayout::PreNorm,
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        mlp_bias: cfg.bool("mlp_bias")?.unwrap_or(false),
        qk_norm: false,
        activation,
        scale_embeddings: false,
        attn_scale: (head_dim as f64).powf(-0.5),
        attn_softcap: None,
        final_softcap: None,
        rope_full: rope,
        rope_sliding: rope,
        tie_embeddings: cfg.bool("tie_word_embeddings")?.unwrap_or(d.tie),
        prefix: "model.".into(),
        lm_head: "lm_head.weight".into(),
    })
}

/// Qwen-style optional sliding window: none unless `use_sliding_window` is true (Qwen2.5
/// configs carry a `sliding_window` with `use_sliding_window: false`, meaning full attention).
/// Then `layer_types` (5.x) decides, else layers from `max_window_layers` on slide.
pub(super) fn qwen_layers(cfg: &HfConfig, num_layers: usize) -> Result<Vec<LayerKind>> {
    if cfg.bool("use_sliding_window")? != Some(true) {
        return Ok(vec![LayerKind::Full; num_layers]);
    }
    let window = match cfg.usize("sliding_window")? {
        Some(0) => return Err(cfg.error("sliding_window", "must be positive or null")),
        window => window,
    };
    if let Some(kinds) = cfg.layer_types(num_layers, window)? {
        return Ok(kinds);
    }
    let Some(window) = window else {
        return Ok(vec![LayerKind::Full; num_layers]);
    };
    let first = cfg.usize("max_window_layers")?.unwrap_or(num_layers);
    Ok((0..num_layers)
        .map(|i| {
            if i >= first {
                LayerKind::Sliding { window }
            } else {
                LayerKind::Full
            }
        })
        .collect())
}
