//! The one attention implementation: fused q/k/v projection, optional per-head q/k RMSNorm,
//! RoPE, grouped-query attention over what the layer's cache returns, optional logit
//! softcapping, output projection.
use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::{Linear, RmsNorm, Rope};
use crate::cache::{Attend, LayerCache};
use crate::error::{Error, Result};

/// Head geometry of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// Weights of one attention layer. The softmax scale is folded into the query projection
/// (or into the q norm's weight when there is one) at load, so a forward does not rescale.
#[derive(Debug)]
pub struct Attention {
    /// `[(heads + 2 kv_heads) * head_dim, hidden]`: q, k and v projections stacked.
    qkv: Linear,
    /// `[hidden, heads * head_dim]`.
    o: Linear,
    /// Per-head RMSNorm of queries and keys (Qwen3, Gemma 3), applied before RoPE.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    rope: Arc<Rope>,
    shape: HeadShape,
    /// `tanh` softcap of attention logits (Gemma 2 style), when set.
    softcap: Option<f64>,
}

/// The parts an [`Attention`] is built from.
#[derive(Debug)]
pub struct AttentionParts {
    /// q, k and v projections stacked in that order (`[(heads + 2 kv_heads) * head_dim,
    /// hidden]`); q already multiplied by the softmax scale unless `qk_norm` carries it.
    pub qkv: Linear,
    /// Output projection.
    pub o: Linear,
    /// q and k norms (q's weight already multiplied by the softmax scale).
    pub qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// The rotary embedding of this layer's kind.
    pub rope: Arc<Rope>,
    /// Head geometry.
    pub shape: HeadShape,
    /// Attention logit softcap.
    pub softcap: Option<f64>,
}

impl Attention {
    /// Checks the head geometry.
    pub fn new(parts: AttentionParts) -> Result<Self> {
        let HeadShape {
            num_heads,
            num_kv_heads,
            ..
        } = parts.shape;
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            )));
        }
        Ok(Self {
            qkv: parts.qkv,
            o: parts.o,
            qk_norm: parts.qk_norm,
            rope: parts.rope,
            shape: parts.shape,
            softcap: parts.softcap,
        })
    }

    /// Parameters held.
    pub fn param_count(&self) -> usize {
        let norms = self
            .qk_norm
            .as_ref()
            .map_or(0, |(q, k)| q.param_count() + k.param_count());
        self.qkv.param_count() + self.o.param_count() + norms
    }

    /// `x: [t, hidden]` at positions `[offset, offset + t)`; appends this layer's K/V to
    /// `cache` and returns `[t, hidden]`.
    pub fn forward(&self, x: &Tensor, offset: usize, cache: &mut LayerCache) -> Result<Tensor> {
        let HeadShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        } = self.shape;
        let t = x.dim(0)?;
        let qkv = self.qkv.forward(x)?;
        let q = qkv.narrow(1, 0, h * d)?.reshape((t, h, d))?;
        let k = qkv.narrow(1, h * d, kv * d)?.reshape((t, kv, d))?;
        let v = qkv.narrow(1, (h + kv) * d, kv * d)?.reshape((t, kv, d))?;
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (qn.forward(&q)?, kn.forward(&k)?),
            None => (q, k),
        };
        // [t, heads, d] -> [1, heads, t, d]
        let heads_first =
            |x: Tensor| -> Result<Tensor> { Ok(x.transpose(0, 1)?.contiguous()?.unsqueeze(0)?) };
        let (q, k) = self
            .rope
            .apply(&heads_first(q)?, &heads_first(k)?, offset)?;
        // Contiguous like q and k: a cache may hand the new block back as it came (a prefill
        // into an empty rotating cache), and CUDA's matmul refuses a head-strided operand.
        let v = heads_first(v)?;
        let attend = cache.append(&k, &v)?;
        let mask = attend.mask_tensor()?;
        let out = self.attend(&q, &attend, mask.as_ref())?;
        // [1, heads, t, d] -> [t, heads * d]
        let out = out.squeeze(0)?.transpose(0, 1)?.reshape((t, h * d))?;
        self.o.forward(&out)
    }

    /// Softmax attention of `q: [1, h, t, d]` over `attend`'s `k`, `v: [1, kv, L, d]` (possibly
    /// strided views) and its tail `[1, kv, L', d]`, with an additive `mask: [t, L + L']`.
    /// Grouped heads share K/V without copying them: the `h / kv` query heads of a group are
    /// stacked as rows of one `[g * t, d]` matrix. A tail gets its own score and value
    /// products (joined along the key axis only for the softmax), so it is never copied
    /// together with `k`/`v`.
    fn attend(&self, q: &Tensor, attend: &Attend, mask: Option<&Tensor>) -> Result<Tensor> {
        let HeadShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        } = self.shape;
        let t = q.dim(2)?;
        let g = h / kv;
        let q = q.reshape((1, kv, g * t, d))?;
        let head_len = attend.k.dim(2)?;
        let mut scores = q.matmul(&attend.k.t()?)?; // [1, kv, g t, L]
        if let Some((tk, _)) = &attend.tail {
            scores = Tensor::cat(&[&scores, &q.matmul(&tk.t()?)?], 3)?;
        }
        let len = scores.dim(3)?;
        if let Some(cap) = self.softcap {
            scores = ((scores / cap)?.tanh()? * cap)?;
        }
        if let Some(mask) = mask {
            let mask = mask.to_dtype(scores.dtype())?;
            scores = scores.reshape((kv, g, t, len))?.broadcast_add(&mask)?;
        }
        let dtype = scores.dtype();
        let probs = match dtype {
            DType::F32 | DType::F64 => candle_nn::ops::softmax_last_dim(&scores)?,
            _ => {
                candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?.to_dtype(dtype)?
            }
        };
        let probs = probs.reshape((1, kv, g * t, len))?;
        let out = match &attend.tail {
            None => probs.matmul(&attend.v)?, // [1, kv, g t, d]
            Some((_, tv)) => {
                let head = probs.narrow(3, 0, head_len)?.contiguous()?;
                let tail = probs.narrow(3, head_len, len - head_len)?.contiguous()?;
                (head.matmul(&attend.v)? + tail.matmul(tv)?)?
            }
        };
        Ok(out.reshape((1, h, t, d))?)
    }
}
