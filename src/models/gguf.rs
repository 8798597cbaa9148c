//! A GGUF model file read as the Hugging Face config transformers would build from it, so
//! each architecture's spec is derived by the same code as for a checkpoint directory.
//!
//! What the metadata leaves out follows llama.cpp and transformers alike: Gemma 3's files
//! carry neither the local/global pattern (every 6th layer global) nor the local RoPE base
//! (10,000) nor the attention scale (`1/sqrt(head_dim)` below 27B), and a tensor table
//! without `output.weight` means tied embeddings.
use serde_json::{json, Map, Value};

use super::config::HfConfig;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// GGUF `general.architecture` values read, and the Hugging Face `model_type` each becomes.
pub const GGUF_ARCHITECTURES: &[(&str, &str)] = &[
    ("llama", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("gemma3", "gemma3_text"),
];

/// Gemma 3's local:global layer pattern and local RoPE base, fixed by its reference code.
const GEMMA3_PATTERN: usize = 6;
const GEMMA3_LOCAL_BASE: f64 = 10_000.0;

/// The Hugging Face config equivalent to `file`'s metadata (4.x spelling).
pub fn hf_config(file: &GgufFile) -> Result<HfConfig> {
    let arch_key = "general.architecture";
    let arch = file.require(arch_key, file.str(arch_key))?;
    let model_type = GGUF_ARCHITECTURES
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            file.key_error(
                arch_key,
                format!(
                    "architecture `{arch}` is not supported (supported: {})",
                    GGUF_ARCHITECTURES
                        .iter()
                        .map(|(a, _)| *a)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(Error::invalid(format!(
            "{}: tensor `rope_freqs.weight` (per-frequency RoPE factors, as Llama 3.1 files carry) is not supported",
            file.path().display()
        )));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| -> Result<u64> { file.require(&key(k), file.u64(&key(k))) };
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = file.u64(&key("attention.head_count_kv"))?.unwrap_or(heads);
    let embed = file.tensor("token_embd.weight").ok_or_else(|| {
        Error::invalid(format!(
            "{}: tensor `token_embd.weight` (the token embedding) not found",
            file.path().display()
        ))
    })?;
    // Sizes are checked against what the file can hold before any spec allocates by them:
    // every block has tensors, and no width of a supported model nears 2^24.
    let blocks = need("block_count")?;
    if blocks == 0 || blocks as usize > file.tensors().count() {
        return Err(file.key_error(
            &key("block_count"),
            format!("{blocks} blocks for {} tensors", file.tensors().count()),
        ));
    }
    for (k, v) in [
        ("embedding_length", hidden),
        ("attention.head_count", heads),
    ] {
        if v == 0 || v > 1 << 24 {
            return Err(file.key_error(&key(k), format!("{v} is out of range")));
        }
    }
    let mut obj = Map::new();
    let mut set = |k: &str, v: Value| {
        obj.insert(k.to_string(), v);
    };
    set("model_type", json!(model_type));
    set("vocab_size", json!(embed.shape[0]));
    set("hidden_size", json!(hidden));
    set("intermediate_size", json!(need("feed_forward_length")?));
    set("num_hidden_layers", json!(blocks));
    set("num_attention_heads", json!(heads));
    set("num_key_value_heads", json!(kv_heads));
    let head_dim = file.u64(&key("attention.key_length"))?;
    if let Some(head_dim) = head_dim {
        set("head_dim", json!(head_dim));
    }
    if let Some(ctx) = file.u64(&key("context_length"))? {
        set("max_position_embeddings", json!(ctx));
    }
    if let Some(eps) = file.f64(&key("attention.layer_norm_rms_epsilon"))? {
        set("rms_norm_eps", json!(eps));
    }
    if let Some(theta) = file.f64(&key("rope.freq_base"))? {
        set("rope_theta", json!(theta));
    }
    set("rope_scaling", rope_scaling(file, &key)?);
    set(
        "tie_word_embeddings",
        json!(file.tensor("output.weight").is_none()),
    );
    if arch == "gemma3" {
        set(
            "query_pre_attn_scalar",
            json!(head_dim.unwrap_or(hidden / heads)),
        );
        set("sliding_window_pattern", json!(GEMMA3_PATTERN));
        set("rope_local_base_freq", json!(GEMMA3_LOCAL_BASE));
        if let Some(window) = file.u64(&key("attention.sliding_window"))? {
            set("sliding_window", json!(window));
        }
        if let Some(cap) = file.f64(&key("final_logit_softcapping"))? {
            set("final_logit_softcapping", json!(cap));
        }
    }
    Ok(HfConfig::from_object(file.path(), obj))
}

/// `rope_scaling` from `{arch}.rope.scaling.*`: linear and YaRN-free scalings only.
fn rope_scaling(file: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<Value> {
    let kind_key = key("rope.scaling.type");
    match file.str(&kind_key)? {
        None | Some("none") => Ok(Value::Null),
        Some("linear") => {
            let factor_key = key("rope.scaling.factor");
            let factor = file.require(&factor_key, file.f64(&factor_key))?;
            Ok(json!({"rope_type": "linear", "factor": factor}))
        }
        Some(other) => Err(file.key_error(
            &kind_key,
            format!("RoPE scaling `{other}` is not supported (none and linear are)"),
        )),
    }
}
