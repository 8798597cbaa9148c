//! Loading a [`Decoder`] from checkpoint weights as a [`DecoderSpec`] names them.
use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::attention::{Attention, AttentionParts, HeadShape};
use super::block::Block;
use super::linear::{Linear, RmsNorm};
use super::mlp::GatedMlp;
use super::rope::Rope;
use super::shard::{Cut, Shard};
use super::spec::{DecoderSpec, LayerKind, NormLayout};
use super::transformer::Decoder;
use super::weights::Weights;
use crate::error::Result;

/// Loads the tensors of one model (or of one rank's part of it) according to a spec.
struct Loader<'a> {
    spec: &'a DecoderSpec,
    weights: &'a Weights,
    shard: Shard,
}

impl Loader<'_> {
    fn name(&self, layer: usize, rest: &str) -> String {
        format!("{}layers.{layer}.{rest}", self.spec.prefix)
    }

    /// Tensor `name` of shape `shape`, times `scale` (applied before the dtype cast).
    fn tensor(&self, name: &str, shape: &[usize], scale: f64) -> Result<Tensor> {
        self.weights.get_scaled(name, shape, scale)
    }

    fn norm(&self, name: &str, width: usize, scale: f64) -> Result<RmsNorm> {
        let weight = if self.spec.norm_plus_one {
            self.weights
                .get_mapped(name, &[width], |t| (t + 1.0)? * scale)?
        } else {
            self.tensor(name, &[width], scale)?
        };
        Ok(RmsNorm::new(weight, self.spec.rms_norm_eps))
    }

    /// `{base}.weight` `[out, inp]` (times `scale`) and, when `bias`, `{base}.bias` `[out]`;
    /// of a split model, the rank's input columns (a row-parallel product: its outputs are
    /// partial sums, so the bias is added by rank 0 alone).
    fn linear(
        &self,
        base: &str,
        (out, inp): (usize, usize),
        bias: bool,
        scale: f64,
    ) -> Result<Linear> {
        let bias = if bias && self.shard.rank == 0 {
            Some(self.tensor(&format!("{base}.bias"), &[out], scale)?)
        } else {
            None
        };
        let name = format!("{base}.weight");
        if !self.shard.is_split() {
            if let Some(part) = self.weights.quantized_part(&name, &[out, inp], scale)? {
                return Linear::quantized(vec![part], bias, self.weights.device());
            }
        }
        let cut = self.shard.cut(1, inp);
        let weight = self.weights.get_part(&name, &[out, inp], scale, cut)?;
        Linear::new(weight, bias)
    }

    /// Projections `(base, out, scale, rows)` over the same `inp` fused into one layer: their
    /// `{base}.weight` stacked by rows (and `{base}.bias` likewise when `bias`), loaded
    /// without a concatenation copy (see [`Weights::get_stacked`]); of a split model, each
    /// projection's `rows` (the rank's part of a column-parallel product).
    fn stacked_linear(
        &self,
        parts: &[(String, usize, f64, Option<Cut>)],
        inp: usize,
        bias: bool,
    ) -> Result<Linear> {
        let named = |suffix: &str| -> Vec<(String, usize, f64, Option<Cut>)> {
            parts
                .iter()
                .map(|(base, out, scale, rows)| (format!("{base}.{suffix}"), *out, *scale, *rows))
                .collect()
        };
        let (weights, biases) = (named("weight"), named("bias"));
        let quantized = if self.shard.is_split() {
            None
        } else {
            weights
                .iter()
                .map(|(name, out, scale, _)| {
                    self.weights.quantized_part(name, &[*out, inp], *scale)
                })
                .collect::<Result<Option<Vec<_>>>>()?
        };
        let shapes: Vec<[usize; 2]> = parts.iter().map(|&(_, out, _, _)| [out, inp]).collect();
        let bias = if bias {
            let parts: Vec<_> = biases
                .iter()
                .zip(&shapes)
                .map(|((name, _, scale, rows), shape)| (name.as_str(), &shape[..1], *scale, *rows))
                .collect();
            Some(self.weights.get_stacked(&parts)?)
        } else {
            None
        };
        if let Some(quantized) = quantized {
            return Linear::quantized(quantized, bias, self.weights.device());
        }
        let parts: Vec<_> = weights
            .iter()
            .zip(&shapes)
            .map(|((name, _, scale, rows), shape)| (name.as_str(), &shape[..], *scale, *rows))
            .collect();
        Linear::new(self.weights.get_stacked(&parts)?, bias)
    }

    fn attention(&self, i: usize, rope: Arc<Rope>) -> Result<Attention> {
        let s = self.spec;
        let HeadShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        } = s.heads;
        let hidden = s.hidden_size;
        let proj = |p: &str| self.name(i, &format!("self_attn.{p}_proj"));
        // The softmax scale rides on the q norm when there is one, else on q itself.
        let q_scale = if s.qk_norm { 1.0 } else { s.attn_scale };
        let kv_rows = self.shard.kv_cut(kv, d);
        let qkv = self.stacked_linear(
            &[
                (proj("q"), h * d, q_scale, self.shard.cut(0, h * d)),
                (proj("k"), kv * d, 1.0, kv_rows),
                (proj("v"), kv * d, 1.0, kv_rows),
            ],
            hidden,
            s.qkv_bias,
        )?;
        let qk_norm = if s.qk_norm {
            let q = self.norm(&self.name(i, "self_attn.q_norm.weight"), d, s.attn_scale)?;
            let k = self.norm(&self.name(i, "self_attn.k_norm.weight"), d, 1.0)?;
            Some((q, k))
        } else {
            None
        };
        Attention::new(AttentionParts {
            qkv,
            o: self.linear(&proj("o"), (hidden, h * d), s.o_bias, 1.0)?,
            qk_norm,
            rope,
            shape: self.shard.heads(s.heads),
            softcap: s.attn_softcap,
        })
    }

    fn block(&self, i: usize, rope: Arc<Rope>) -> Result<Block> {
        let s = self.spec;
        let norm = |n: &str| self.norm(&self.name(i, &format!("{n}.weight")), s.hidden_size, 1.0);
        let mlp = |p: &str| self.name(i, &format!("mlp.{p}_proj"));
        let (hid, inter) = (s.hidden_size, s.intermediate_size);
        let mlp = GatedMlp::new(
            self.stacked_linear(
                &[
                    (mlp("gate"), inter, 1.0, self.shard.cut(0, inter)),
                    (mlp("up"), inter, 1.0, self.shard.cut(0, inter)),
                ],
                hid,
                s.mlp_bias,
            )?,
            self.linear(&mlp("down"), (hid, inter), s.mlp_bias, 1.0)?,
            s.activation,
        )?;
        let attn = self.attention(i, rope)?;
        Ok(match s.norm_layout {
            NormLayout::PreNorm => Block {
                attn_norm: norm("input_layernorm")?,
                attn,
                attn_post_norm: None,
                mlp_norm: norm("post_attention_layernorm")?,
                mlp,
                mlp_post_norm: None,
            },
            NormLayout::Sandwich => Block {
                attn_norm: norm("input_layernorm")?,
                attn,
                attn_post_norm: Some(norm("post_attention_layernorm")?),
                mlp_norm: norm("pre_feedforward_layernorm")?,
                mlp,
                mlp_post_norm: Some(norm("post_feedforward_layernorm")?),
            },
        })
    }
}

impl Decoder {
    /// Loads every tensor `spec` names from `weights` (shapes checked, converted to the
    /// compute dtype) and precomputes the RoPE tables.
    pub fn load(spec: &DecoderSpec, weights: &Weights) -> Result<Self> {
        Self::load_shard(spec, weights, Shard::WHOLE, true)
    }

    /// Rank `shard.rank`'s part of a model split over `shard.world` ranks (see
    /// [`super::shard`]; the split checked by [`Shard::check`]): its heads, MLP columns and
    /// the replicated embedding and norms, and the LM head where `head` (a rank that computes
    /// no logits loads none). [`Decoder::load`] is the whole model.
    pub(super) fn load_shard(
        spec: &DecoderSpec,
        weights: &Weights,
        shard: Shard,
        head: bool,
    ) -> Result<Self> {
        Shard::check(spec, shard.world)?;
        let (dtype, device) = (weights.dtype(), weights.device());
        let loader = Loader {
            spec,
            weights,
            shard,
        };
        let (vocab, hidden) = (spec.vocab_size, spec.hidden_size);
        let embed = weights.get(
            &format!("{}embed_tokens.weight", spec.prefix),
            &[vocab, hidden],
        )?;
        let head_dim = spec.heads.head_dim;
        let rope_full = Arc::new(Rope::new(spec.rope_full, head_dim, dtype, device)?);
        let rope_sliding = if spec.rope_sliding == spec.rope_full {
            rope_full.clone()
        } else {
            Arc::new(Rope::new(spec.rope_sliding, head_dim, dtype, device)?)
        };
        let blocks = spec
            .layers
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let rope = match kind {
                    LayerKind::Full => rope_full.clone(),
                    LayerKind::Sliding { .. } => rope_sliding.clone(),
                };
                loader.block(i, rope)
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = loader.norm(&format!("{}norm.weight", spec.prefix), hidden, 1.0)?;
        // A rank that never runs the head: the embedding stands in, loading nothing.
        let lm_head = if spec.tie_embeddings || !head {
            Linear::shared(embed.clone())?
        } else {
            Linear::new(weights.get(&spec.lm_head, &[vocab, hidden])?, None)?
        };
        let param_count = embed.elem_count()
            + blocks.iter().map(Block::param_count).sum::<usize>()
            + norm.param_count()
            + if spec.tie_embeddings || !head {
                0
            } else {
                lm_head.param_count()
            };
        Ok(Self {
            embed,
            embed_scale: spec
                .scale_embeddings
                .then(|| round_to(dtype, (hidden as f64).sqrt())),
            blocks,
            norm,
            lm_head,
            final_softcap: spec.final_softcap,
            kinds: spec.layers.clone(),
            vocab_size: vocab,
            param_count,
            parallel: None,
            #[cfg(feature = "cuda")]
            graphs: Default::default(),
        })
    }
}

/// `x` rounded to the precision of `dtype` as transformers casts Gemma's embedding scale:
/// a python float made an f32 tensor, then cast to the embedding dtype.
fn round_to(dtype: DType, x: f64) -> f64 {
    let x = x as f32;
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_f64(),
        DType::F16 => half::f16::from_f32(x).to_f64(),
        _ => f64::from(x),
    }
}
