//! EAGLE-3 draft heads as they are published: the EAGLE authors' release (`config.json`, a
//! Llama config with `draft_vocab_size`; `pytorch_model.bin` or safetensors with `fc`,
//! `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`) and the vLLM `speculators` format
//! (`speculators_model_type = "eagle3"`, the layer's config in `transformer_layer_config`,
//! tensors under `layers.0.`), loaded into [`Eagle3Head`].
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::config::HfConfig;
use crate::error::{Error, Result};
use crate::nn::{
    Activation, Attention, AttentionParts, Eagle3Head, Eagle3Parts, GatedMlp, Linear, RmsNorm,
    Rope, INDEX_FILE, SINGLE_FILE,
};

/// The PyTorch file of the authors' release.
const PTH_FILE: &str = "pytorch_model.bin";

/// Loads the head at `dir` for a target with `target_layers` decoder layers and embedding
/// `target_embed` (`[vocab, hidden]`, used unless the checkpoint carries its own), in the
/// embedding's dtype and on its device. Errors name the file and the key or tensor at fault.
pub fn load_eagle3(dir: &Path, target_layers: usize, target_embed: &Tensor) -> Result<Eagle3Head> {
    let cfg = HfConfig::read(&dir.join("config.json"))?;
    let speculators = cfg.str("speculators_model_type")?.is_some();
    if speculators && cfg.str("speculators_model_type")? != Some("eagle3") {
        return Err(cfg.error("speculators_model_type", "only \"eagle3\" heads load here"));
    }
    let layer_cfg = if speculators {
        cfg.nested("transformer_layer_config")?
            .ok_or_else(|| cfg.error("transformer_layer_config", "missing"))?
    } else {
        HfConfig::read(&dir.join("config.json"))?
    };
    for key in ["norm_before_fc", "fc_norm"] {
        if cfg.bool(key)? == Some(true) {
            return Err(cfg.error(
                key,
                "true is not supported (only the EAGLE-3 layer without input norms)",
            ));
        }
    }
    if layer_cfg.positive_or("num_hidden_layers", 1)? != 1 {
        return Err(layer_cfg.error("num_hidden_layers", "only one-layer heads are supported"));
    }
    let spec = match layer_cfg.str("model_type")? {
        Some("llama") | None => super::llama::spec(&layer_cfg)?,
        Some("qwen3") => super::qwen3::spec(&layer_cfg)?,
        Some(other) => {
            return Err(layer_cfg.error(
                "model_type",
                format!("{other}: EAGLE-3 heads load with a llama or qwen3 layer"),
            ))
        }
    };
    let (dtype, device) = (target_embed.dtype(), target_embed.device().clone());
    let (vocab, target_hidden) = target_embed.dims2()?;
    if spec.vocab_size != vocab {
        return Err(layer_cfg.error(
            "vocab_size",
            format!(
                "{} but the target's vocabulary has {vocab} ids",
                spec.vocab_size
            ),
        ));
    }
    let hidden = spec.hidden_size;
    let fused_from = cfg.positive_or("target_hidden_size", hidden)?;
    if fused_from != target_hidden {
        return Err(cfg.error(
            "target_hidden_size",
            format!("{fused_from} but the target's hidden states are {target_hidden} wide"),
        ));
    }
    let layers = match cfg.usize_list("eagle_aux_hidden_state_layer_ids")? {
        Some(ids) if !ids.is_empty() => ids,
        _ => default_layers(target_layers)?,
    };
    if let Some(bad) = layers.iter().find(|&&l| l > target_layers) {
        return Err(cfg.error(
            "eagle_aux_hidden_state_layer_ids",
            format!(
                "layer {bad} of a target with {target_layers} layers (ids 0..={target_layers})"
            ),
        ));
    }
    let draft_vocab = cfg.positive_or("draft_vocab_size", vocab)?;
    let t = HeadTensors::open(dir, dtype, device.clone())?;
    let layer = if speculators {
        "layers.0."
    } else {
        "midlayer."
    };
    let name = |n: &str| format!("{layer}{n}");
    let eps = spec.rms_norm_eps;
    let norm = |n: &str, width: usize| -> Result<RmsNorm> {
        Ok(RmsNorm::new(t.get(n, &[width], 1.0)?, eps))
    };
    let h = spec.heads;
    let q_scale = if spec.qk_norm { 1.0 } else { spec.attn_scale };
    let proj = |p: &str| name(&format!("self_attn.{p}_proj.weight"));
    let qkv = Tensor::cat(
        &[
            t.get(&proj("q"), &[h.num_heads * h.head_dim, 2 * hidden], q_scale)?,
            t.get(&proj("k"), &[h.num_kv_heads * h.head_dim, 2 * hidden], 1.0)?,
            t.get(&proj("v"), &[h.num_kv_heads * h.head_dim, 2 * hidden], 1.0)?,
        ],
        0,
    )?;
    if spec.qkv_bias || spec.o_bias || spec.mlp_bias {
        return Err(layer_cfg.error("attention_bias", "heads with biases are not supported"));
    }
    let qk_norm = if spec.qk_norm {
        Some((
            RmsNorm::new(
                t.get(
                    &name("self_attn.q_norm.weight"),
                    &[h.head_dim],
                    spec.attn_scale,
                )?,
                eps,
            ),
            RmsNorm::new(
                t.get(&name("self_attn.k_norm.weight"), &[h.head_dim], 1.0)?,
                eps,
            ),
        ))
    } else {
        None
    };
    let rope = Arc::new(Rope::new(spec.rope_full, h.head_dim, dtype, &device)?);
    let attn = Attention::new(AttentionParts {
        qkv: Linear::new(qkv, None)?,
        o: Linear::new(
            t.get(&proj("o"), &[hidden, h.num_heads * h.head_dim], 1.0)?,
            None,
        )?,
        qk_norm,
        rope,
        shape: h,
        softcap: None,
    })?;
    let inter = spec.intermediate_size;
    let mlp = |p: &str, shape: &[usize]| t.get(&name(&format!("mlp.{p}_proj.weight")), shape, 1.0);
    let gate_up = Tensor::cat(
        &[mlp("gate", &[inter, hidden])?, mlp("up", &[inter, hidden])?],
        0,
    )?;
    if spec.activation != Activation::Silu {
        return Err(layer_cfg.error("hidden_act", "only silu heads are supported"));
    }
    let mlp = GatedMlp::new(
        Linear::new(gate_up, None)?,
        Linear::new(mlp("down", &[hidden, inter])?, None)?,
        Activation::Silu,
    )?;
    let embed = match t.get_optional("embed_tokens.weight", &[vocab, hidden])? {
        Some(own) => own,
        None if target_hidden == hidden => target_embed.clone(),
        None => {
            return Err(Error::invalid(format!(
                "{}: no embed_tokens.weight, and the target's embedding is {target_hidden} wide, not the head's {hidden}",
                dir.display()
            )))
        }
    };
    let draft_to_target = match t.ids("d2t", draft_vocab)? {
        Some(offsets) => offsets
            .iter()
            .enumerate()
            .map(|(i, &o)| u32::try_from(i as i64 + o).map_err(|_| t.bad("d2t", "maps below id 0")))
            .collect::<Result<Vec<u32>>>()?,
        None if draft_vocab == vocab => (0..vocab as u32).collect(),
        None => {
            return Err(t.bad(
                "d2t",
                "missing, and the draft vocabulary is smaller than the target's",
            ))
        }
    };
    Eagle3Head::new(Eagle3Parts {
        embed,
        fc: Linear::new(
            t.get("fc.weight", &[hidden, layers.len() * target_hidden], 1.0)?,
            None,
        )?,
        input_norm: norm(&name("input_layernorm.weight"), hidden)?,
        hidden_norm: norm(&name("hidden_norm.weight"), hidden)?,
        attn,
        post_attention_norm: norm(&name("post_attention_layernorm.weight"), hidden)?,
        mlp,
        norm: norm("norm.weight", hidden)?,
        lm_head: Linear::new(t.get("lm_head.weight", &[draft_vocab, hidden], 1.0)?, None)?,
        draft_to_target,
        norm_before_residual: cfg.bool("norm_before_residual")?.unwrap_or(false),
        norm_output: cfg.bool("norm_output")?.unwrap_or(false),
        kind: spec.layers[0],
        target_layers: layers,
    })
}

/// True when `dir` holds an EAGLE-3 head (its `config.json` names the `speculators` type
/// `eagle3` or an `Eagle3` architecture), not a model.
pub fn is_eagle3(dir: &Path) -> bool {
    let Ok(cfg) = HfConfig::read(&dir.join("config.json")) else {
        return false;
    };
    if cfg.str("speculators_model_type").ok().flatten() == Some("eagle3") {
        return true;
    }
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("architectures").cloned())
        .and_then(|a| a.as_array().cloned())
        .is_some_and(|a| {
            a.iter()
                .any(|x| x.as_str().is_some_and(|s| s.contains("Eagle3")))
        })
}

/// The layers vLLM and the EAGLE-3 reference fuse when a checkpoint names none: the inputs
/// of layers 2, `n / 2` and `n − 3`.
fn default_layers(n: usize) -> Result<Vec<usize>> {
    if n < 4 {
        return Err(Error::invalid(format!(
            "eagle3: a target of {n} layers has no default hidden-state layers (2, n/2, n-3); set eagle_aux_hidden_state_layer_ids in the head's config.json"
        )));
    }
    Ok(vec![2, n / 2, n - 3])
}

/// A head's tensors, read on demand from `model.safetensors`, its shards or
/// `pytorch_model.bin` (tensors the head does not read, such as `t2d`'s booleans, are never
/// converted).
struct HeadTensors {
    path: PathBuf,
    source: Source,
    dtype: DType,
    device: Device,
}

enum Source {
    Safetensors(MmapedSafetensors),
    Pth(candle_core::pickle::PthTensors),
}

impl HeadTensors {
    fn open(dir: &Path, dtype: DType, device: Device) -> Result<Self> {
        let bad =
            |path: &Path, e: candle_core::Error| Error::invalid(format!("{}: {e}", path.display()));
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        let pth = dir.join(PTH_FILE);
        let (path, source) = if single.is_file() || index.is_file() {
            let (path, files) = if single.is_file() {
                (single.clone(), vec![single])
            } else {
                (index.clone(), crate::nn::shard_paths(&index)?)
            };
            // SAFETY: read-only mappings of files not modified while loading (as every
            // checkpoint loader here assumes).
            let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| bad(&path, e))?;
            (path, Source::Safetensors(st))
        } else if pth.is_file() {
            let t = candle_core::pickle::PthTensors::new(&pth, None).map_err(|e| bad(&pth, e))?;
            (pth, Source::Pth(t))
        } else {
            return Err(Error::invalid(format!(
                "{}: no {SINGLE_FILE}, {INDEX_FILE} or {PTH_FILE}",
                dir.display()
            )));
        };
        Ok(Self {
            path,
            source,
            dtype,
            device,
        })
    }

    /// Tensor `name` as stored, on the CPU; `None` when absent.
    fn raw(&self, name: &str) -> Result<Option<Tensor>> {
        let err = |e: candle_core::Error| self.bad(name, &e.to_string());
        match &self.source {
            Source::Safetensors(st) => match st.get(name) {
                Ok(_) => st.load(name, &Device::Cpu).map(Some).map_err(err),
                Err(_) => Ok(None),
            },
            Source::Pth(t) => t.get(name).map_err(err),
        }
    }

    fn bad(&self, name: &str, what: &str) -> Error {
        Error::invalid(format!("{}: tensor `{name}`: {what}", self.path.display()))
    }

    fn get_optional(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        match self.raw(name)? {
            None => Ok(None),
            Some(_) => self.get(name, shape, 1.0).map(Some),
        }
    }

    /// Tensor `name` checked to be `shape`, times `scale` (in f32), in the compute dtype on
    /// the device.
    fn get(&self, name: &str, shape: &[usize], scale: f64) -> Result<Tensor> {
        let t = self.raw(name)?.ok_or_else(|| self.bad(name, "missing"))?;
        if t.dims() != shape {
            return Err(self.bad(name, &format!("shape {:?}, expected {shape:?}", t.dims())));
        }
        let t = t.to_dtype(DType::F32)?;
        let t = if scale == 1.0 { t } else { (t * scale)? };
        Ok(t.to_dtype(self.dtype)?.to_device(&self.device)?)
    }

    /// Integer tensor `name` of `len` entries, if present.
    fn ids(&self, name: &str, len: usize) -> Result<Option<Vec<i64>>> {
        let Some(t) = self.raw(name)? else {
            return Ok(None);
        };
        if t.dims() != [len] {
            return Err(self.bad(name, &format!("shape {:?}, expected [{len}]", t.dims())));
        }
        Ok(Some(t.to_dtype(DType::I64)?.to_vec1::<i64>()?))
    }
}
