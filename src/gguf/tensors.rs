//! A GGUF file's tensors under the Hugging Face names the model loader asks for, with the
//! row order transformers' checkpoints have, dequantized by candle's GGML kernels.
use std::borrow::Cow;
use std::path::Path;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::file::{GgufFile, TensorInfo};
use crate::error::{Error, Result};

/// The tensors of a GGUF model file, looked up by Hugging Face name.
#[derive(Debug)]
pub struct GgufTensors {
    file: GgufFile,
    /// `(q heads, kv heads)` when q and k rows were permuted at conversion (llama.cpp does it
    /// for `llama`-architecture files, whose RoPE rotates interleaved pairs; ours rotates
    /// halves as transformers does, so the permutation is undone on load).
    unpermute: Option<(usize, usize)>,
    /// The Hugging Face prefix of the decoder's tensors (`"model."`).
    prefix: String,
}

impl GgufTensors {
    /// Wraps an opened file. `unpermute` as on the field; `prefix` is what the model loader
    /// puts before `layers.N...`, `embed_tokens.weight` and `norm.weight`.
    pub fn new(file: GgufFile, unpermute: Option<(usize, usize)>, prefix: &str) -> Self {
        Self {
            file,
            unpermute,
            prefix: prefix.to_string(),
        }
    }

    /// The file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The GGUF name of Hugging Face tensor `hf`, when it is one a GGUF model file has.
    pub fn gguf_name(&self, hf: &str) -> Option<String> {
        if hf == "lm_head.weight" {
            return Some("output.weight".into());
        }
        let rest = hf.strip_prefix(self.prefix.as_str())?;
        match rest {
            "embed_tokens.weight" => return Some("token_embd.weight".into()),
            "norm.weight" => return Some("output_norm.weight".into()),
            _ => {}
        }
        let rest = rest.strip_prefix("layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        layer.parse::<usize>().ok()?;
        let (module, param) = rest.rsplit_once('.')?;
        let gemma = self.file.str("general.architecture").ok().flatten() == Some("gemma3");
        let name = match module {
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            "input_layernorm" => "attn_norm",
            // Gemma's sandwich norms; a pre-norm model's second norm is the MLP's input norm.
            "post_attention_layernorm" if gemma => "post_attention_norm",
            "post_attention_layernorm" => "ffn_norm",
            "pre_feedforward_layernorm" => "ffn_norm",
            "post_feedforward_layernorm" => "post_ffw_norm",
            _ => return None,
        };
        Some(format!("blk.{layer}.{name}.{param}"))
    }

    /// True when the file holds Hugging Face tensor `hf`.
    pub fn contains(&self, hf: &str) -> bool {
        self.gguf_name(hf)
            .is_some_and(|g| self.file.tensor(&g).is_some())
    }

    /// The table entry of `hf`, its shape checked to be `shape`.
    fn info(&self, hf: &str, shape: &[usize]) -> Result<(String, &TensorInfo)> {
        let gguf = self.gguf_name(hf).ok_or_else(|| {
            Error::invalid(format!(
                "{}: tensor `{hf}` has no GGUF counterpart",
                self.path().display()
            ))
        })?;
        let info = self.file.tensor(&gguf).ok_or_else(|| {
            Error::invalid(format!(
                "{}: tensor `{gguf}` (for `{hf}`) not found",
                self.path().display()
            ))
        })?;
        if info.shape != shape {
            return Err(Error::invalid(format!(
                "{}: tensor `{gguf}` has shape {:?}, expected {shape:?}",
                self.path().display(),
                info.shape
            )));
        }
        Ok((gguf, info))
    }

    /// Tensor `hf` (shape checked) as a quantized tensor on `device`, rows in transformers'
    /// order.
    pub fn qtensor(&self, hf: &str, shape: &[usize], device: &Device) -> Result<QTensor> {
        let (gguf, info) = self.info(hf, shape)?;
        let bytes = self.rows_in_hf_order(hf, info);
        with_aligned(&bytes, |b| {
            qtensor_from_ggml(info.dtype, b, info.shape.clone(), device)
        })
        .map_err(|e| {
            Error::invalid(format!(
                "{}: tensor `{gguf}` ({:?}): {e}",
                self.path().display(),
                info.dtype
            ))
        })
    }

    /// Tensor `hf` (shape checked) dequantized to f32 on the CPU.
    pub fn dequantize(&self, hf: &str, shape: &[usize]) -> Result<Tensor> {
        let q = self.qtensor(hf, shape, &Device::Cpu)?;
        q.dequantize(&Device::Cpu).map_err(|e| {
            Error::invalid(format!(
                "{}: tensor `{hf}` ({:?}): {e}",
                self.path().display(),
                q.dtype()
            ))
        })
    }

    /// The stored type of `hf`, when present.
    pub fn stored_type(&self, hf: &str) -> Option<GgmlDType> {
        Some(self.file.tensor(&self.gguf_name(hf)?)?.dtype)
    }

    /// The tensor's bytes, with q/k rows put back in transformers' order where the converter
    /// permuted them. Quantization blocks run along rows, so whole rows move.
    fn rows_in_hf_order<'a>(&'a self, hf: &str, info: &TensorInfo) -> Cow<'a, [u8]> {
        let bytes = self.file.tensor_bytes(info);
        let heads = match self.unpermute {
            Some((q, _)) if hf.ends_with("self_attn.q_proj.weight") => q,
            Some((_, kv)) if hf.ends_with("self_attn.k_proj.weight") => kv,
            _ => return Cow::Borrowed(bytes),
        };
        let rows = info.shape[0];
        if heads == 0 || !rows.is_multiple_of(2 * heads) {
            return Cow::Borrowed(bytes);
        }
        let row_bytes = bytes.len() / rows;
        let half = rows / heads / 2;
        let mut out = vec![0u8; bytes.len()];
        // Stored row (h, i, s) — head h, pair index i < half, member s of the pair — is
        // transformers' row (h, s, i).
        for h in 0..heads {
            for i in 0..half {
                for s in 0..2 {
                    let from = (h * half + i) * 2 + s;
                    let to = h * 2 * half + s * half + i;
                    out[to * row_bytes..(to + 1) * row_bytes]
                        .copy_from_slice(&bytes[from * row_bytes..(from + 1) * row_bytes]);
                }
            }
        }
        Cow::Owned(out)
    }
}

/// Calls `f` with `bytes` at an address every GGML block type may be read from (8-byte
/// aligned; candle reinterprets the bytes as blocks in place), copying them only when the
/// file's alignment left them elsewhere.
fn with_aligned<R>(bytes: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    if (bytes.as_ptr() as usize).is_multiple_of(8) {
        return f(bytes);
    }
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: `words` owns at least `bytes.len()` initialised bytes, and u8 has no alignment
    // requirement; the view lives no longer than `words`.
    let view =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), bytes.len()) };
    view.copy_from_slice(bytes);
    f(view)
}
