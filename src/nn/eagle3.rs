//! The EAGLE-3 draft head (Li et al. 2025): one decoder layer that drafts from the target's
//! own hidden states.
//!
//! Head position `j` reads the pair (fused target hidden state `h_j`, token `t_{j+1}`):
//! `g = fc(h_j)` (`[aux × target_hidden] → [hidden]`; a later draft position feeds the head's
//! own output instead, already `hidden` wide, without `fc`),
//! `x = [input_norm(embed(t_{j+1})); hidden_norm(g)]` (`2 × hidden` wide) into the one
//! attention (q/k/v project from `2 × hidden`), `y = r + o(attn)` with `r = g` (or
//! `hidden_norm(g)` with `norm_before_residual`), `out = y + mlp(post_norm(y))`, logits
//! `lm_head(norm(out))` over the draft vocabulary (`norm_output`: `out` itself is normed,
//! and fed back normed). Draft id `i` is target id `i + d2t[i]`.
use candle_core::{DType, Tensor};

use super::attention::{Attention, AttnInput};
use super::linear::{Linear, RmsNorm};
use super::mlp::GatedMlp;
use crate::cache::ModelCache;
use crate::error::{Error, Result};

/// Most drafts a proposal records as one graph ([`Eagle3Head::propose_graphed`]).
#[cfg(feature = "cuda")]
pub const MAX_CHAINED_STEPS: usize = 16;

/// Graph slots of chained proposals (`CHAIN_SLOT + pairs read`), apart from the single
/// steps' (`2 × rows + last`).
#[cfg(feature = "cuda")]
const CHAIN_SLOT: usize = 1 << 16;

/// The parts an [`Eagle3Head`] is built from (see the module doc for what each does).
#[derive(Debug)]
pub struct Eagle3Parts {
    /// The token embedding `[vocab, hidden]` (the target's, unless the head has its own).
    pub embed: Tensor,
    /// `[hidden, aux × target_hidden]`.
    pub fc: Linear,
    /// Norm of the embedding half of the attention input.
    pub input_norm: RmsNorm,
    /// Norm of the hidden half.
    pub hidden_norm: RmsNorm,
    /// q/k/v from `2 × hidden`.
    pub attn: Attention,
    /// Norm before the MLP.
    pub post_attention_norm: RmsNorm,
    /// The MLP.
    pub mlp: GatedMlp,
    /// The final norm.
    pub norm: RmsNorm,
    /// `[draft_vocab, hidden]`.
    pub lm_head: Linear,
    /// Draft id → target id.
    pub draft_to_target: Vec<u32>,
    /// The residual is the normed hidden half.
    pub norm_before_residual: bool,
    /// The output is normed before the LM head and fed back normed.
    pub norm_output: bool,
    /// The layer's attention span (speculators' trainer gives heads a sliding window).
    pub kind: super::spec::LayerKind,
    /// The target layers whose hidden states are fused (ids as
    /// [`crate::cache::ModelCache::tap_hidden`] takes them).
    pub target_layers: Vec<usize>,
}

/// A loaded EAGLE-3 head: weights only; per-sequence state is a one-layer [`ModelCache`].
#[derive(Debug)]
pub struct Eagle3Head {
    parts: Eagle3Parts,
    /// `draft_to_target` on the device, for mapping argmaxes there.
    d2t: Tensor,
    hidden: usize,
    fc_in: usize,
    /// Recorded steps (CUDA only), as a decoder's.
    #[cfg(feature = "cuda")]
    graphs: super::cuda::graph::Graphs,
    /// Proposals made as one replayed graph ([`Self::propose_graphed`]).
    chained: std::sync::atomic::AtomicUsize,
}

impl Eagle3Head {
    /// Checks the widths and the vocabulary map.
    pub fn new(parts: Eagle3Parts) -> Result<Self> {
        let (vocab, hidden) = parts.embed.dims2()?;
        let fc = parts
            .fc
            .weight()
            .ok_or_else(|| Error::invalid("eagle3: fc must be dense"))?;
        let (fc_out, fc_in) = fc.dims2()?;
        if fc_out != hidden {
            return Err(Error::invalid(format!(
                "eagle3: fc maps to {fc_out} features but the embedding is {hidden} wide"
            )));
        }
        if parts.target_layers.is_empty() || fc_in % parts.target_layers.len() != 0 {
            return Err(Error::invalid(format!(
                "eagle3: fc reads {fc_in} features, not a multiple of the {} target layers {:?}",
                parts.target_layers.len(),
                parts.target_layers
            )));
        }
        let draft_vocab = parts.lm_head.out_features()?;
        if parts.draft_to_target.len() != draft_vocab {
            return Err(Error::invalid(format!(
                "eagle3: d2t maps {} draft ids but lm_head has {draft_vocab} rows",
                parts.draft_to_target.len()
            )));
        }
        if let Some(bad) = parts.draft_to_target.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::invalid(format!(
                "eagle3: d2t maps a draft id to {bad}, outside the target vocabulary of {vocab}"
            )));
        }
        let d2t = Tensor::new(parts.draft_to_target.as_slice(), parts.embed.device())?;
        Ok(Self {
            d2t,
            hidden,
            fc_in,
            parts,
            #[cfg(feature = "cuda")]
            graphs: Default::default(),
            chained: Default::default(),
        })
    }

    /// The target layers whose hidden states the head fuses.
    pub fn target_layers(&self) -> &[usize] {
        &self.parts.target_layers
    }

    /// Width of the fused target hidden states it reads (`aux × target_hidden`).
    pub fn fused_width(&self) -> usize {
        self.fc_in
    }

    /// Residual width.
    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// The device the weights live on.
    pub fn device(&self) -> &candle_core::Device {
        self.parts.embed.device()
    }

    /// Target vocabulary size.
    pub fn vocab_size(&self) -> Result<usize> {
        Ok(self.parts.embed.dim(0)?)
    }

    /// Draft vocabulary size.
    pub fn draft_vocab_size(&self) -> usize {
        self.parts.draft_to_target.len()
    }

    /// Draft id → target id.
    pub fn draft_to_target(&self) -> &[u32] {
        &self.parts.draft_to_target
    }

    /// Draft ids (`[n]` u32 on the device) as target ids, on the device.
    pub fn map_to_target(&self, draft_ids: &Tensor) -> Result<Tensor> {
        Ok(self.d2t.index_select(draft_ids, 0)?)
    }

    /// CUDA-graph steps recorded and kept for replay (0 off CUDA, with graphs off, or after a
    /// recording failed and the head went back to the ordinary path).
    pub fn graph_recordings(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.graphs.recorded()
        }
        #[cfg(not(feature = "cuda"))]
        0
    }

    /// Greedy proposals made as one replayed CUDA graph each (see
    /// [`Self::propose_graphed`]); 0 off CUDA.
    pub fn chained_proposals(&self) -> usize {
        self.chained.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Parameters held (the embedding, usually the target's, not counted).
    pub fn param_count(&self) -> usize {
        let p = &self.parts;
        p.fc.param_count()
            + p.input_norm.param_count()
            + p.hidden_norm.param_count()
            + p.attn.param_count()
            + p.post_attention_norm.param_count()
            + p.mlp.param_count()
            + p.norm.param_count()
            + p.lm_head.param_count()
    }

    /// Empty per-sequence state: the layer's K/V (a staged ring for a sliding window: a
    /// proposal's block of any size rolls back).
    pub fn new_cache(&self) -> Result<ModelCache> {
        use crate::cache::{KvCache, LayerCache, RotatingKvCache, RotatingStrategy, DEFAULT_STEP};
        let layer = match self.parts.kind {
            super::spec::LayerKind::Full => LayerCache::Kv(KvCache::new(DEFAULT_STEP)),
            super::spec::LayerKind::Sliding { window } => {
                LayerCache::Rotating(RotatingKvCache::new(window, RotatingStrategy::Staged)?)
            }
        };
        Ok(ModelCache::new(vec![layer]))
    }

    /// One forward over `t` pairs at positions `[cache.offset(), + t)` (tree positions inside
    /// a speculation with a tree): `ids` `[t]` u32 target ids, `features` `[t, fused_width]`
    /// (target hidden states, through `fc`) or `[t, hidden]` (the head's own outputs).
    /// Returns the outputs (what a later position is fed) and the draft-vocabulary logits
    /// (f32), `[t, hidden]` and `[t, draft_vocab]`, or of the last row alone when `last`
    /// (`[1, …]`: the earlier rows' K/V are appended, but only the last row queries and runs
    /// the rest of the layer where the step is not a replayed graph). On the CPU it
    /// runs on rayon's pool, as the decoder's forwards do ([`super::threads::on_cpu_pool`]);
    /// on CUDA with graphs on, a step of at most [`super::transformer::GRAPH_MAX_ROWS`] pairs over a
    /// full-attention cache replays a recorded graph, as a decoder's step does.
    pub fn forward(
        &self,
        ids: &Tensor,
        features: &Tensor,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<(Tensor, Tensor)> {
        if self.device().is_cpu() {
            super::threads::on_cpu_pool(|| self.forward_here(ids, features, cache, last))
        } else {
            self.forward_here(ids, features, cache, last)
        }
    }

    fn forward_here(
        &self,
        ids: &Tensor,
        features: &Tensor,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<(Tensor, Tensor)> {
        #[cfg(feature = "cuda")]
        if let Some(outputs) = self.forward_graphed(ids, features, cache, last)? {
            return Ok(outputs);
        }
        let offset = cache.offset();
        let layer = cache.layer_mut(0)?;
        self.step(ids, features, last, |attn, x| {
            if last {
                attn.forward_last(AttnInput::Normed(x), offset, layer)
            } else {
                attn.forward(AttnInput::Normed(x), offset, layer)
            }
        })
    }

    /// [`Self::forward`] as a replayed CUDA graph (recorded on first use per row count,
    /// feature width and cache buffer): `None` sends the caller down the ordinary path
    /// (graphs off, a first forward, a tree open, a sliding-window head, quantized parts,
    /// more than [`super::transformer::GRAPH_MAX_ROWS`] rows). The cache advances on success.
    #[cfg(feature = "cuda")]
    fn forward_graphed(
        &self,
        ids: &Tensor,
        features: &Tensor,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let candle_core::Device::Cuda(dev) = self.device() else {
            return Ok(None);
        };
        let p = &self.parts;
        let t = ids.dim(0)?;
        if !self.graphable(t, cache) {
            return Ok(None);
        }
        let Some(bufs) = cache.reserve_in_place(t)? else {
            return Ok(None);
        };
        let crate::cache::InPlace { k, v, id, .. } = &bufs[0];
        let len = (cache.offset() + t) as u32;
        let capacity = k.dim(2)?;
        let reach = super::cuda::split_reach(capacity, len as usize);
        let (cos, _) = p.attn.rope_table(capacity)?;
        // The buffers and tables recorded against, the keys reached, and the features' width
        // (the target's fused states or the head's own outputs).
        let key = vec![
            *id,
            cos.dim(0)? as u64,
            reach as u64,
            features.dim(1)? as u64,
        ];
        let slot = 2 * t + usize::from(last && t > 1);
        let tokens = super::tokens::DeviceTokens::from_argmax(ids.clone(), self.vocab_size()?);
        let step = |ids: &Tensor, len: &Tensor, features: Option<&Tensor>| {
            let features =
                features.ok_or_else(|| Error::invalid("eagle3: graph step without features"))?;
            let (out, logits) = self.step(ids, features, last, |attn, x| {
                attn.forward_in_place(AttnInput::Normed(x), (k, v), (len, reach), None, None, None)
            })?;
            Ok((logits, Some(out)))
        };
        let ids = super::tokens::StepIds::Device(&tokens);
        let Some((logits, out)) =
            self.graphs
                .run(dev, (slot, false), key, ids, &[len], Some(features), step)?
        else {
            return Ok(None);
        };
        cache.advance(t)?;
        let out = out.ok_or_else(|| Error::invalid("eagle3: graph step lost its outputs"))?;
        let out = if last { out.narrow(0, t - 1, 1)? } else { out };
        Ok(Some((out, logits)))
    }

    /// A greedy proposal as one replayed CUDA graph: the `t` committed pairs (`ids: [t]`,
    /// `features: [t, fused_width]`) read into the cache as [`Self::forward`] reads them,
    /// then `steps − 1` more head steps inside the same graph, each fed the output and the
    /// argmax (mapped to a target id) of the step before. Returns `[ids[t − 1], d1..d_steps]`
    /// (the last committed token, then the drafts: the block a verification takes) on the
    /// device. The cache advances by the `t`
    /// pairs only: the drafts' K/V, written past its end, are never committed (as a rolled
    /// back speculation's). The same kernels as the step-by-step proposal
    /// ([`Self::forward`] per step, the argmax and `d2t` mapping between them), one launch
    /// instead of several a step. `None` where [`Self::forward`] would not replay a graph,
    /// with more than [`MAX_CHAINED_STEPS`] steps, or with the engine option
    /// `chain_graphs` off: the caller then proposes step by step.
    #[cfg(feature = "cuda")]
    pub fn propose_graphed(
        &self,
        ids: &Tensor,
        features: &Tensor,
        cache: &mut ModelCache,
        steps: usize,
    ) -> Result<Option<Tensor>> {
        let candle_core::Device::Cuda(dev) = self.device() else {
            return Ok(None);
        };
        let t = ids.dim(0)?;
        if steps == 0
            || steps > MAX_CHAINED_STEPS
            || !crate::engine::get().chain_graphs
            || features.dim(1)? != self.fc_in
            || !self.graphable(t, cache)
        {
            return Ok(None);
        }
        // Room for the pairs and the drafts' K/V (the drafts' past the cache's end).
        let Some(bufs) = cache.reserve_in_place(t + steps - 1)? else {
            return Ok(None);
        };
        let crate::cache::InPlace { k, v, id, .. } = &bufs[0];
        let first = cache.offset() + t;
        // Each step's cache length: the pairs', then one more per draft.
        let lens: Vec<u32> = (0..steps).map(|i| (first + i) as u32).collect();
        let capacity = k.dim(2)?;
        let reach = super::cuda::split_reach(capacity, first + steps - 1);
        let (cos, _) = self.parts.attn.rope_table(capacity)?;
        let key = vec![*id, cos.dim(0)? as u64, reach as u64, steps as u64];
        let tokens = super::tokens::DeviceTokens::from_argmax(ids.clone(), self.vocab_size()?);
        let chain = |ids: &Tensor, lens: &Tensor, features: Option<&Tensor>| {
            let features =
                features.ok_or_else(|| Error::invalid("eagle3: graph step without features"))?;
            let attend = |i: usize| {
                let len = lens.narrow(0, i, 1);
                move |attn: &Attention, x: &Tensor| {
                    let len = len?;
                    attn.forward_in_place(
                        AttnInput::Normed(x),
                        (k, v),
                        (&len, reach),
                        None,
                        None,
                        None,
                    )
                }
            };
            let (out, logits) = self.step(ids, features, true, attend(0))?;
            let mut out = out.narrow(0, t - 1, 1)?;
            let mut draft = self.map_to_target(&super::fused::argmax_on_device(&logits)?)?;
            let mut block = vec![ids.narrow(0, t - 1, 1)?, draft.clone()];
            for i in 1..steps {
                let (next, logits) = self.step(&draft, &out, true, attend(i))?;
                out = next;
                draft = self.map_to_target(&super::fused::argmax_on_device(&logits)?)?;
                block.push(draft.clone());
            }
            Ok((Tensor::cat(&block, 0)?, None))
        };
        let slot = CHAIN_SLOT + t;
        let ids = super::tokens::StepIds::Device(&tokens);
        let Some((block, _)) =
            self.graphs
                .run(dev, (slot, false), key, ids, &lens, Some(features), chain)?
        else {
            return Ok(None);
        };
        cache.advance(t)?;
        self.chained
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(block))
    }

    /// Whether a step of `t` pairs over `cache` can replay a graph: graphs on, a cache that
    /// has a buffer (not the first forward), at most [`super::transformer::GRAPH_MAX_ROWS`]
    /// pairs, dense weights, a full-attention layer.
    #[cfg(feature = "cuda")]
    fn graphable(&self, t: usize, cache: &ModelCache) -> bool {
        let p = &self.parts;
        let quantized = [&p.fc, &p.lm_head].iter().any(|l| l.is_quantized())
            || p.attn.is_quantized()
            || p.mlp.is_quantized();
        t <= super::transformer::GRAPH_MAX_ROWS
            && cache.offset() > 0
            && super::graphs::graphs_enabled()
            && !quantized
            && p.kind == super::spec::LayerKind::Full
    }

    /// The head's computation over `t` pairs with the attention `attend(attention, x)` of
    /// its input rows `x: [t, 2 × hidden]` (the ordinary cache append or a graph step's
    /// in-place write), which answers for every row or for the last alone: `(outputs,
    /// logits)`, the outputs of the rows it answered for, the logits of the last row only
    /// when `last`.
    fn step(
        &self,
        ids: &Tensor,
        features: &Tensor,
        last: bool,
        attend: impl FnOnce(&Attention, &Tensor) -> Result<Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let p = &self.parts;
        let width = features.dim(1)?;
        let g = if width == self.fc_in {
            p.fc.forward(features)?
        } else if width == self.hidden {
            features.clone()
        } else {
            return Err(Error::invalid(format!(
                "eagle3: features {width} wide; the head reads {} (fused target states) or {} (its own)",
                self.fc_in, self.hidden
            )));
        };
        let embedded = p.embed.index_select(ids, 0)?;
        let normed_hidden = p.hidden_norm.forward(&g)?;
        let x = Tensor::cat(
            &[p.input_norm.forward(&embedded)?, normed_hidden.clone()],
            1,
        )?;
        let residual = if p.norm_before_residual {
            normed_hidden
        } else {
            g
        };
        let h = attend(&p.attn, &x)?;
        // An attention that answered for the last row alone: the rest of the step for it only.
        let (t, r) = (x.dim(0)?, h.dim(0)?);
        let residual = if r < t {
            residual.narrow(0, t - r, r)?
        } else {
            residual
        };
        let (y, normed) = p.post_attention_norm.add_forward(&residual, &h)?;
        // The MLP's residual add and the final norm in one kernel where the device has one.
        let (sum, out_normed) = p.norm.add_forward(&y, &p.mlp.forward(&normed)?)?;
        let r = out_normed.dim(0)?;
        let rows = if last {
            out_normed.narrow(0, r - 1, 1)?
        } else {
            out_normed.clone()
        };
        let logits = p.lm_head.forward(&rows)?;
        let out = if p.norm_output { out_normed } else { sum };
        Ok((out, logits.to_dtype(DType::F32)?))
    }
}
