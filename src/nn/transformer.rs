//! The decoder-only transformer every supported architecture instantiates: embeddings,
//! blocks of attention + gated MLP with pre-norms (and Gemma's post-norms), final norm, LM head.
use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::attention::AttnInput;
use super::tokens::{DeviceTokens, StepIds};
use super::{
    fused, profile, Activation, Attention, AttentionParts, GatedMlp, HeadShape, Linear, RmsNorm,
    Rope, RopeSpec, Weights,
};
use crate::cache::{
    KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy, DEFAULT_STEP,
};
use crate::error::{Error, Result};

/// The attention span of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Attends to every earlier token; cached in a [`KvCache`].
    Full,
    /// Attends to the last `window` tokens (itself included); cached in a [`RotatingKvCache`].
    Sliding {
        /// Tokens each query sees, itself included.
        window: usize,
    },
}

/// Where the norms of a block sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormLayout {
    /// Llama: `input_layernorm` before attention, `post_attention_layernorm` before the MLP.
    PreNorm,
    /// Gemma 2/3: `input_layernorm` and `post_attention_layernorm` around attention,
    /// `pre_feedforward_layernorm` and `post_feedforward_layernorm` around the MLP.
    Sandwich,
}

/// Everything a thin model file decides about an architecture; [`Decoder::load`] does the rest.
/// Weight names follow the Hugging Face Llama layout under `prefix`
/// (`{prefix}layers.{i}.self_attn.q_proj.weight`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderSpec {
    /// Rows of the embedding (and of the logits).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Attention head geometry (the same in every layer).
    pub heads: HeadShape,
    /// One entry per layer.
    pub layers: Vec<LayerKind>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Gemma's `(1 + w)` RMSNorm scale.
    pub norm_plus_one: bool,
    /// Norm placement.
    pub norm_layout: NormLayout,
    /// Bias on the q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Bias on the MLP projections.
    pub mlp_bias: bool,
    /// Per-head RMSNorm of queries and keys (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// MLP gate activation.
    pub activation: Activation,
    /// Multiply embeddings by `sqrt(hidden_size)` rounded to the compute dtype (Gemma).
    pub scale_embeddings: bool,
    /// Softmax scale of attention logits.
    pub attn_scale: f64,
    /// `tanh` softcap of attention logits.
    pub attn_softcap: Option<f64>,
    /// `tanh` softcap of the final logits.
    pub final_softcap: Option<f64>,
    /// RoPE of full-attention layers.
    pub rope_full: RopeSpec,
    /// RoPE of sliding-window layers.
    pub rope_sliding: RopeSpec,
    /// The LM head is the embedding matrix.
    pub tie_embeddings: bool,
    /// Prefix of the decoder's tensors (`model.`).
    pub prefix: String,
    /// Name of the untied LM head tensor.
    pub lm_head: String,
}

/// Longest block a recorded CUDA graph step takes (decode steps and verification blocks up
/// to γ = 15); longer blocks are prefills and take the ordinary path.
pub const GRAPH_MAX_ROWS: usize = 16;

/// One transformer block.
#[derive(Debug)]
struct Block {
    attn_norm: RmsNorm,
    attn: Attention,
    attn_post_norm: Option<RmsNorm>,
    mlp_norm: RmsNorm,
    mlp: GatedMlp,
    mlp_post_norm: Option<RmsNorm>,
}

/// A block's output as the residual stream `x` and the MLP's output `h` not yet added to it:
/// the next norm adds them in the same kernel where the device has one.
type Residual = (Tensor, Tensor);

impl Block {
    fn forward(&self, input: Input, offset: usize, cache: &mut LayerCache) -> Result<Input> {
        self.forward_with(input, |attn, input| attn.forward(input, offset, cache))
    }

    /// The block around an attention call `attend(attention, its input)`, from the
    /// embeddings or from the previous block's output.
    ///
    /// Decode and verification steps on CUDA in half precision ([`fused::folds`]) hand the
    /// residual stream itself to the products, which fold in the norms before them and the
    /// residual adds after them (no norm or add kernel between them); a pre-norm block then
    /// returns the stream. Everything else normalises first and returns the stream and the
    /// MLP's output un-added, for the next norm to add in the same kernel.
    fn forward_with(
        &self,
        input: Input,
        attend: impl FnOnce(&Attention, AttnInput) -> Result<Tensor>,
    ) -> Result<Input> {
        let pre_norm = self.attn_post_norm.is_none() && self.mlp_post_norm.is_none();
        if pre_norm && fused::folds(input.stream()) {
            let x = match input {
                Input::Embedded(x) | Input::Stream(x) => x,
                Input::Residual((x, h)) => (x + h)?,
            };
            let x = attend(&self.attn, AttnInput::Residual(&x, &self.attn_norm))?;
            let x = self.mlp.forward_residual(&x, &self.mlp_norm)?;
            return Ok(Input::Stream(x));
        }
        let (x, normed) = match input {
            Input::Embedded(x) | Input::Stream(x) => {
                let normed = self.attn_norm.forward(&x)?;
                (x, normed)
            }
            Input::Residual((x, h)) => self.attn_norm.add_forward(&x, &h)?,
        };
        profile::mark("norms, residual adds", &normed)?;
        let h = attend(&self.attn, AttnInput::Normed(&normed))?;
        let h = post_norm(&self.attn_post_norm, h)?;
        let (x, normed) = self.mlp_norm.add_forward(&x, &h)?;
        profile::mark("norms, residual adds", &normed)?;
        let h = self.mlp.forward(&normed)?;
        let h = post_norm(&self.mlp_post_norm, h)?;
        Ok(Input::Residual((x, h)))
    }

    fn param_count(&self) -> usize {
        let opt = |n: &Option<RmsNorm>| n.as_ref().map_or(0, RmsNorm::param_count);
        self.attn_norm.param_count()
            + self.attn.param_count()
            + opt(&self.attn_post_norm)
            + self.mlp_norm.param_count()
            + self.mlp.param_count()
            + opt(&self.mlp_post_norm)
    }
}

/// What a block reads: the embeddings (the first block) or the previous block's output.
enum Input {
    Embedded(Tensor),
    /// The stream and the last output not yet added to it.
    Residual(Residual),
    /// The stream with everything added (a folded block's output).
    Stream(Tensor),
}

impl Input {
    /// The residual stream's tensor (before any pending add).
    fn stream(&self) -> &Tensor {
        match self {
            Input::Embedded(x) | Input::Stream(x) | Input::Residual((x, _)) => x,
        }
    }
}

fn post_norm(norm: &Option<RmsNorm>, h: Tensor) -> Result<Tensor> {
    match norm {
        Some(n) => n.forward(&h),
        None => Ok(h),
    }
}

/// A loaded decoder: weights only; per-sequence state lives in a [`ModelCache`].
#[derive(Debug)]
pub struct Decoder {
    /// `[vocab, hidden]`.
    embed: Tensor,
    /// `sqrt(hidden)` in the compute dtype, for Gemma.
    embed_scale: Option<f64>,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    final_softcap: Option<f64>,
    kinds: Vec<LayerKind>,
    vocab_size: usize,
    param_count: usize,
    /// Recorded decode steps (CUDA only).
    #[cfg(feature = "cuda")]
    graphs: super::cuda_graph::Graphs,
}

/// Loads the tensors of one model according to a spec.
struct Loader<'a> {
    spec: &'a DecoderSpec,
    weights: &'a Weights,
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

    /// `{base}.weight` `[out, inp]` (times `scale`) and, when `bias`, `{base}.bias` `[out]`.
    fn linear(
        &self,
        base: &str,
        (out, inp): (usize, usize),
        bias: bool,
        scale: f64,
    ) -> Result<Linear> {
        let weight = self.tensor(&format!("{base}.weight"), &[out, inp], scale)?;
        let bias = if bias {
            Some(self.tensor(&format!("{base}.bias"), &[out], scale)?)
        } else {
            None
        };
        Ok(Linear::new(weight, bias))
    }

    /// Projections `(base, out, scale)` over the same `inp` fused into one layer: their
    /// `{base}.weight` stacked by rows (and `{base}.bias` likewise when `bias`), loaded
    /// without a concatenation copy (see [`Weights::get_stacked`]).
    fn stacked_linear(
        &self,
        parts: &[(String, usize, f64)],
        inp: usize,
        bias: bool,
    ) -> Result<Linear> {
        let names = |suffix: &str| -> Vec<String> {
            parts
                .iter()
                .map(|(base, _, _)| format!("{base}.{suffix}"))
                .collect()
        };
        let (weight_names, bias_names) = (names("weight"), names("bias"));
        let shapes: Vec<([usize; 2], [usize; 1])> = parts
            .iter()
            .map(|&(_, out, _)| ([out, inp], [out]))
            .collect();
        let weight = self.weights.get_stacked(
            &parts
                .iter()
                .zip(&weight_names)
                .zip(&shapes)
                .map(|(((_, _, scale), name), (w, _))| (name.as_str(), &w[..], *scale))
                .collect::<Vec<_>>(),
        )?;
        let bias = if bias {
            Some(
                self.weights.get_stacked(
                    &parts
                        .iter()
                        .zip(&bias_names)
                        .zip(&shapes)
                        .map(|(((_, _, scale), name), (_, b))| (name.as_str(), &b[..], *scale))
                        .collect::<Vec<_>>(),
                )?,
            )
        } else {
            None
        };
        Ok(Linear::new(weight, bias))
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
        let qkv = self.stacked_linear(
            &[
                (proj("q"), h * d, q_scale),
                (proj("k"), kv * d, 1.0),
                (proj("v"), kv * d, 1.0),
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
            shape: s.heads,
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
                &[(mlp("gate"), inter, 1.0), (mlp("up"), inter, 1.0)],
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
        let (dtype, device) = (weights.dtype(), weights.device());
        let loader = Loader { spec, weights };
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
        let lm_head = if spec.tie_embeddings {
            Linear::new(embed.clone(), None)
        } else {
            Linear::new(weights.get(&spec.lm_head, &[vocab, hidden])?, None)
        };
        let param_count = embed.elem_count()
            + blocks.iter().map(Block::param_count).sum::<usize>()
            + norm.param_count()
            + if spec.tie_embeddings {
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
            #[cfg(feature = "cuda")]
            graphs: Default::default(),
        })
    }

    /// Parameters held (tied embeddings counted once).
    pub fn param_count(&self) -> usize {
        self.param_count
    }

    /// CUDA-graph steps recorded and kept for replay (0 off CUDA, with graphs off, or after
    /// a recording failed and the model went back to the ordinary path).
    pub fn graph_recordings(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.graphs.recorded()
        }
        #[cfg(not(feature = "cuda"))]
        0
    }

    /// The nodes and edges of each CUDA-graph step kept, with its rows, where counted (see
    /// [`super::count_graph_censuses`]); empty off CUDA.
    pub fn graph_censuses(&self) -> Vec<(usize, super::GraphCensus)> {
        #[cfg(feature = "cuda")]
        {
            self.graphs.censuses()
        }
        #[cfg(not(feature = "cuda"))]
        Vec::new()
    }

    /// The span of each layer.
    pub fn layer_kinds(&self) -> &[LayerKind] {
        &self.kinds
    }

    /// Empty caches: a [`KvCache`] per full layer, a [`RotatingKvCache`] per sliding one.
    pub fn new_cache(&self, strategy: RotatingStrategy) -> Result<ModelCache> {
        let layers = self
            .kinds
            .iter()
            .map(|kind| match *kind {
                LayerKind::Full => Ok(LayerCache::Kv(KvCache::new(DEFAULT_STEP))),
                LayerKind::Sliding { window } => Ok(LayerCache::Rotating(RotatingKvCache::new(
                    window, strategy,
                )?)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelCache::new(layers))
    }

    /// Logits `[tokens.len(), vocab]` (f32) for every position; positions start at
    /// `cache.offset()` and every layer's cache grows by `tokens.len()`.
    pub fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.forward_rows(StepIds::Host(tokens), cache, false)
    }

    /// Like [`Self::forward`], but only the last position's logits: `[1, vocab_size]`. The
    /// final norm and LM head run on one row (a prefill of `n` tokens skips `n − 1` rows of
    /// `hidden × vocab` products).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.forward_rows(StepIds::Host(tokens), cache, true)
    }

    /// [`Self::forward_last`] over ids a previous step left on the device (a greedy draft's
    /// last token): nothing is read back, so the device can run such steps back to back.
    pub fn forward_last_device(
        &self,
        ids: &DeviceTokens,
        cache: &mut ModelCache,
    ) -> Result<Tensor> {
        self.forward_rows(StepIds::Device(ids), cache, true)
    }

    /// [`Self::forward`] over ids on the device (a verification block of greedy drafts no
    /// host has read): every position's logits, nothing read back.
    pub fn forward_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.forward_rows(StepIds::Device(ids), cache, false)
    }

    /// The greedy tokens of a forward over `ids`: the argmax of each position's logits (of
    /// the last position only when `last`), on the model's device; the cache grows as for
    /// [`Self::forward`]. Equal to [`DeviceTokens::argmax`] of that forward's logits; a
    /// replayed CUDA graph takes the argmax inside the graph, so no logits are cast, copied
    /// or reduced outside it.
    pub fn forward_argmax(
        &self,
        ids: StepIds,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<DeviceTokens> {
        #[cfg(feature = "cuda")]
        {
            self.check_input(ids, cache)?;
            let offset = cache.offset();
            let best = self
                .forward_graphed(ids, cache, last, true)
                .inspect_err(|_| cache.recover_failed_forward(offset))?;
            if let Some(best) = best {
                return Ok(DeviceTokens::from_argmax(best, self.vocab_size));
            }
        }
        DeviceTokens::argmax(&self.forward_rows(ids, cache, last)?)
    }

    fn forward_rows(&self, ids: StepIds, cache: &mut ModelCache, last: bool) -> Result<Tensor> {
        self.check_input(ids, cache)?;
        let offset = cache.offset();
        // A failure part-way leaves some layers appended: the cache rewinds them all to
        // `offset` or poisons itself, never keeping layers at different offsets.
        self.forward_unguarded(ids, cache, last)
            .inspect_err(|_| cache.recover_failed_forward(offset))
    }

    fn forward_unguarded(
        &self,
        tokens: StepIds,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Some(logits) = self.forward_graphed(tokens, cache, last, false)? {
            return Ok(logits);
        }
        let offset = cache.offset();
        profile::start(&self.embed)?;
        let ids = tokens.tensor(self.embed.device())?;
        let mut x = self.embed.index_select(&ids, 0)?; // [t, hidden]
        if let Some(scale) = self.embed_scale {
            x = (x * scale)?;
        }
        profile::mark("embedding", &x)?;
        let mut input = Input::Embedded(x);
        for (i, block) in self.blocks.iter().enumerate() {
            input = block.forward(input, offset, cache.layer_mut(i)?)?;
        }
        self.head(input, last, true)
    }

    /// Last residual add, final norm, LM head (of the last row only when `last`), softcap:
    /// `[t, hidden]` -> logits `[t or 1, vocab]`, f32 unless `!f32` (then in the model's
    /// dtype: an argmax needs no cast, which is exact).
    fn head(&self, input: Input, last: bool, f32: bool) -> Result<Tensor> {
        let rows = |x: &Tensor| -> Result<Tensor> {
            let t = x.dim(0)?;
            Ok(if last {
                x.narrow(0, t - 1, 1)?
            } else {
                x.clone()
            })
        };
        let mut logits = match input {
            Input::Embedded(x) => self.lm_head.forward(&self.norm.forward(&rows(&x)?)?)?,
            Input::Residual((x, h)) => {
                let normed = self.norm.add_forward(&rows(&x)?, &rows(&h)?)?.1;
                self.lm_head.forward(&normed)?
            }
            // A folded step's stream: the final norm rides in the LM head's GEMV too.
            Input::Stream(x) => self.lm_head.forward_prenorm(&rows(&x)?, &self.norm)?,
        };
        if let Some(cap) = self.final_softcap {
            logits = ((logits / cap)?.tanh()? * cap)?;
        }
        let logits = if f32 {
            logits.to_dtype(DType::F32)?
        } else {
            logits
        };
        profile::mark("final norm, LM head", &logits)?;
        Ok(logits)
    }

    /// A step of at most [`GRAPH_MAX_ROWS`] tokens (a decode step, a verification block) as
    /// a replayed CUDA graph (recorded on first use per block length for the cache's
    /// buffers), when graphs are on, the model runs on CUDA and every layer is a full-
    /// attention KV cache with room reserved in place; `None` sends the caller down the
    /// ordinary path. The cache advances by the step on success.
    #[cfg(feature = "cuda")]
    fn forward_graphed(
        &self,
        tokens: StepIds,
        cache: &mut ModelCache,
        last: bool,
        greedy: bool,
    ) -> Result<Option<Tensor>> {
        let candle_core::Device::Cuda(dev) = self.embed.device() else {
            return Ok(None);
        };
        let t = tokens.len();
        // A sequence's first forward (a prefill from position 0) takes the ordinary path
        // however short: a fresh cache has no buffers to record against, and a cache reset
        // after earlier use still has its buffers, so graphing it there would give a short
        // prompt other (half-precision) logits than on a fresh cache. Measured: the oracle
        // benchmark's references (a fresh cache) then left a reused cache's outputs from the
        // start of the generation for its 13-token prompt (2026-11-25, H100).
        if t > GRAPH_MAX_ROWS || cache.offset() == 0 || !super::fused::graphs_enabled() {
            return Ok(None);
        }
        let Some(bufs) = cache.reserve_in_place(tokens.len())? else {
            return Ok(None);
        };
        let mut key: Vec<u64> = bufs.iter().map(|(_, _, id)| *id).collect();
        let Some(capacity) = bufs.first().map(|b| b.0.dim(2)).transpose()? else {
            return Ok(None);
        };
        for block in &self.blocks {
            let (cos, _) = block.attn.rope_table(capacity)?;
            key.push(cos.dim(0)? as u64);
        }
        let len = (cache.offset() + tokens.len()) as u32;
        // The attention's reach: a recording serves the steps of one reach (its kernels
        // launch blocks for the keys below it only).
        let reach = super::cuda::split_reach(capacity, len as usize);
        key.push(reach as u64);
        // One recording per block length and output kind.
        let slot = 4 * t + 2 * usize::from(greedy) + usize::from(last && t > 1);
        let logits = self
            .graphs
            .run(dev, (slot, greedy), key, tokens, len, |ids, len| {
                let mut x = super::fused::made(self.embed.index_select(ids, 0)?);
                if let Some(scale) = self.embed_scale {
                    x = (x * scale)?;
                }
                let mut input = Input::Embedded(x);
                for (block, (k, v, _)) in self.blocks.iter().zip(&bufs) {
                    let gate_up = block.mlp.gate_up_weight();
                    input = block.forward_with(input, |attn, input| {
                        attn.forward_in_place(input, k, v, (len, reach), Some(gate_up))
                    })?;
                }
                self.head(input, last && t > 1, !greedy)
            })?;
        if logits.is_some() {
            cache.advance(tokens.len());
        }
        Ok(logits)
    }

    /// Refuses empty input, out-of-vocabulary ids (device ids by their bound, unread) and
    /// caches built for another layout.
    fn check_input(&self, ids: StepIds, cache: &ModelCache) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::invalid("forward of an empty token sequence"));
        }
        match ids {
            StepIds::Host(tokens) => {
                if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.vocab_size) {
                    return Err(Error::invalid(format!(
                        "token id {bad} is outside the vocabulary of {} ids",
                        self.vocab_size
                    )));
                }
            }
            StepIds::Device(d) => {
                if d.bound() > self.vocab_size {
                    return Err(Error::invalid(format!(
                        "device token ids below {} may lie outside the vocabulary of {} ids",
                        d.bound(),
                        self.vocab_size
                    )));
                }
            }
        }
        if cache.num_layers() != self.kinds.len() {
            return Err(Error::invalid(format!(
                "cache has {} layers but the model has {}; build it with new_cache",
                cache.num_layers(),
                self.kinds.len()
            )));
        }
        for (i, (layer, kind)) in cache.layers().iter().zip(&self.kinds).enumerate() {
            let fits = match (layer, kind) {
                (LayerCache::Kv(_), LayerKind::Full) => true,
                (LayerCache::Rotating(c), LayerKind::Sliding { window }) => c.window() == *window,
                _ => false,
            };
            if !fits {
                return Err(Error::invalid(format!(
                    "cache layer {i} does not match the model's layer kind {kind:?}; build it with new_cache"
                )));
            }
        }
        Ok(())
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
