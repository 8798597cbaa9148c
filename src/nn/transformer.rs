//! The decoder-only transformer every supported architecture instantiates: embeddings,
//! blocks of attention + gated MLP with pre-norms (and Gemma's post-norms), final norm, LM head
//! (loaded by `loader.rs`; a block in `block.rs`).
use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::block::{Block, Input};
use super::linear::{Linear, RmsNorm};
use super::profile;
use super::shard::{AllReduce, Shard};
use super::spec::LayerKind;
use super::tokens::{DeviceTokens, StepIds};
#[cfg(feature = "cuda")]
use crate::cache::InPlace;
use crate::cache::{
    KvCache, LayerCache, ModelCache, RotatingKvCache, RotatingStrategy, DEFAULT_STEP,
};
use crate::error::{Error, Result};

/// Longest block a recorded CUDA graph step takes (decode steps and verification blocks up
/// to γ = 15); longer blocks are prefills and take the ordinary path.
pub const GRAPH_MAX_ROWS: usize = 16;

/// A loaded decoder: weights only; per-sequence state lives in a [`ModelCache`].
#[derive(Debug)]
pub struct Decoder {
    /// `[vocab, hidden]`.
    pub(super) embed: Tensor,
    /// `sqrt(hidden)` in the compute dtype, for Gemma.
    pub(super) embed_scale: Option<f64>,
    pub(super) blocks: Vec<Block>,
    pub(super) norm: RmsNorm,
    pub(super) lm_head: Linear,
    pub(super) final_softcap: Option<f64>,
    pub(super) kinds: Vec<LayerKind>,
    pub(super) vocab_size: usize,
    pub(super) param_count: usize,
    /// Recorded decode steps (CUDA only; of a split model, this rank's). Declared before
    /// `parallel` so that it is dropped first: NCCL does not destroy a communicator while
    /// graphs that captured its collectives live (it waits for them).
    #[cfg(feature = "cuda")]
    pub(super) graphs: super::cuda::graph::Graphs,
    /// This rank's part in a tensor-parallel group, and rank 0's peers (`None`: the whole
    /// model on one device; see [`super::parallel`]).
    pub(super) parallel: Option<Box<Parallel>>,
}

impl Decoder {
    /// True when any layer multiplies quantized blocks ([`super::linear::Linear::quantized`]).
    pub fn is_quantized(&self) -> bool {
        self.lm_head.is_quantized()
            || self
                .blocks
                .iter()
                .any(|b| b.attn.is_quantized() || b.mlp.is_quantized())
    }

    /// True when the LM head is the embedding table (tied embeddings).
    pub fn lm_head_is_embedding(&self) -> bool {
        self.lm_head
            .weight()
            .is_some_and(|w| w.id() == self.embed.id())
    }

    /// The token embedding `[vocab, hidden]` (what an EAGLE-3 head embeds its tokens with).
    pub fn embedding(&self) -> &Tensor {
        &self.embed
    }

    /// Decoder layers.
    pub fn num_layers(&self) -> usize {
        self.blocks.len()
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

    /// Each kind of CUDA-graph step recorded, kept or since dropped, in the order first made:
    /// its rows and the words it reads after its ids (1, the length; more for a token tree's
    /// step). Empty off CUDA.
    pub fn graph_steps_made(&self) -> Vec<(usize, usize)> {
        #[cfg(feature = "cuda")]
        {
            self.graphs.made()
        }
        #[cfg(not(feature = "cuda"))]
        Vec::new()
    }

    /// The nodes and edges of each CUDA-graph step kept, with its rows, where counted (see
    /// [`super::graphs::count_graph_censuses`]); empty off CUDA.
    pub fn graph_censuses(&self) -> Vec<(usize, super::graphs::GraphCensus)> {
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

    /// Empty caches: a [`KvCache`] per full layer, a [`RotatingKvCache`] per sliding one;
    /// of a tensor-parallel model, one such set per rank it runs, rank after rank (each rank
    /// caches its own KV heads), so every transaction of the [`ModelCache`] spans them all.
    pub fn new_cache(&self, strategy: RotatingStrategy) -> Result<ModelCache> {
        let layers = std::iter::repeat_n(&self.kinds, self.local_ranks())
            .flatten()
            .map(|kind| match *kind {
                LayerKind::Full => Ok(LayerCache::Kv(KvCache::new(DEFAULT_STEP))),
                LayerKind::Sliding { window } => Ok(LayerCache::Rotating(RotatingKvCache::new(
                    window, strategy,
                )?)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelCache::new(layers))
    }

    /// Logits `[tokens.len(), vocab]` (f32) for EVERY position, on the model's device.
    /// Positions start at `cache.offset()` and every layer's cache grows by `tokens.len()`
    /// (inside a `Speculation`, pass `spec.cache()`).
    pub fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.logits(StepIds::Host(tokens), cache, false)
    }

    /// Like [`Self::forward`], but only the last position's logits: `[1, vocab_size]` (what
    /// a prefill or a drafting step needs). The final norm and LM head run on one row (a
    /// prefill of `n` tokens skips `n − 1` rows of `hidden × vocab` products).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        self.logits(StepIds::Host(tokens), cache, true)
    }

    /// [`Self::forward_last`] over ids a previous step left on the device (a greedy draft's
    /// last token): nothing is read back, so the device can run such steps back to back.
    pub fn forward_last_device(
        &self,
        ids: &DeviceTokens,
        cache: &mut ModelCache,
    ) -> Result<Tensor> {
        self.logits(StepIds::Device(ids), cache, true)
    }

    /// [`Self::forward`] over ids on the device (a verification block of greedy drafts no
    /// host has read): every position's logits, nothing read back.
    pub fn forward_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.logits(StepIds::Device(ids), cache, false)
    }

    /// The greedy tokens of a forward over `ids`: the argmax of each position's logits (of
    /// the last position only when `last`), on the model's device; the cache grows as for
    /// [`Self::forward`]. Equal to [`DeviceTokens::argmax`] of that forward's logits; a
    /// replayed CUDA graph takes the argmax inside the graph, so no logits are cast, copied
    /// or reduced outside it. On the CPU it runs on rayon's pool (see
    /// [`super::threads::on_cpu_pool`]).
    pub fn forward_argmax(
        &self,
        ids: StepIds,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<DeviceTokens> {
        self.on_pool_if_cpu(|| {
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
        })
    }

    /// The logits every `forward*` returns: of every position of `ids`, or of the last only
    /// when `last`. On the CPU it runs on rayon's pool (see [`super::threads::on_cpu_pool`]).
    fn logits(&self, ids: StepIds, cache: &mut ModelCache, last: bool) -> Result<Tensor> {
        self.on_pool_if_cpu(|| self.forward_rows(ids, cache, last))
    }

    /// The embeddings of `ids` (`[t]` u32 on the model's device), scaled where the
    /// architecture does (Gemma): `[t, hidden]`. `recorded`: inside a CUDA-graph recording,
    /// where the rows are kept alive to the end of the capture ([`super::fused::made`]).
    pub(super) fn embed_rows(&self, ids: &Tensor, recorded: bool) -> Result<Tensor> {
        let mut x = self.embed.index_select(ids, 0)?;
        #[cfg(feature = "cuda")]
        if recorded {
            x = super::fused::made(x);
        }
        #[cfg(not(feature = "cuda"))]
        let _ = recorded;
        if let Some(scale) = self.embed_scale {
            x = (x * scale)?;
        }
        Ok(x)
    }

    /// Ranks the model is split over (1: not split).
    pub fn ranks(&self) -> usize {
        self.parallel.as_ref().map_or(1, |p| p.world())
    }

    /// This decoder's rank in its group (0 when not split).
    pub fn rank(&self) -> usize {
        self.parallel.as_ref().map_or(0, |p| p.rank())
    }

    /// Ranks this decoder runs: itself and the peers it leads (a rank loaded by
    /// `Decoder::load_rank` runs only itself).
    fn local_ranks(&self) -> usize {
        1 + self.parallel.as_ref().map_or(0, |p| p.peers().len())
    }

    /// Where each rank this decoder runs is, itself first (one entry when not split).
    pub fn rank_locations(&self) -> Vec<candle_core::DeviceLocation> {
        let peers = self.parallel.iter().flat_map(|p| p.peers());
        std::iter::once(self)
            .chain(peers)
            .map(|d| d.embed.device().location())
            .collect()
    }

    /// `f` on rayon's pool where the model runs on the CPU, else directly (a split model's
    /// ranks run on pools of their own: see [`super::parallel`]).
    fn on_pool_if_cpu<R: Send>(&self, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        if self.embed.device().is_cpu() && self.parallel.is_none() {
            super::threads::on_cpu_pool(f)
        } else {
            f()
        }
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
        if let Some(parallel) = &self.parallel {
            return self.forward_parallel(parallel, tokens, cache, last);
        }
        #[cfg(feature = "cuda")]
        if let Some(logits) = self.forward_graphed(tokens, cache, last, false)? {
            return Ok(logits);
        }
        let offset = cache.offset();
        profile::start(&self.embed)?;
        let ids = tokens.tensor(self.embed.device())?;
        let x = self.embed_rows(&ids, false)?;
        profile::mark("embedding", &x)?;
        let mut input = Input::Embedded(x);
        let taps = cache.hidden_layers().map(<[usize]>::to_vec);
        let mut tapped = Vec::new();
        for (i, block) in self.blocks.iter().enumerate() {
            tap(&taps, i, &input, &mut tapped)?;
            input = block.forward(input, offset, cache.layer_mut(i)?)?;
        }
        tap(&taps, self.blocks.len(), &input, &mut tapped)?;
        if let Some(hidden) = self.tapped_rows(&taps, tapped)? {
            cache.record_hidden(hidden);
        }
        self.head(input, last, true)
    }

    /// The hidden states `taps` asks for, from the streams `tapped` kept, concatenated in
    /// the order asked (a layer asked twice given twice): `[t, taps × hidden]`.
    pub(super) fn tapped_rows(
        &self,
        taps: &Option<Vec<usize>>,
        tapped: Vec<(usize, Tensor)>,
    ) -> Result<Option<Tensor>> {
        let Some(taps) = taps else {
            return Ok(None);
        };
        let rows = taps
            .iter()
            .map(|id| tapped.iter().find(|(i, _)| i == id).map(|(_, x)| x.clone()))
            .collect::<Option<Vec<Tensor>>>()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "hidden states of layers {taps:?} asked of a model of {} layers (ids 0..={})",
                    self.blocks.len(),
                    self.blocks.len()
                ))
            })?;
        Ok(Some(Tensor::cat(&rows, 1)?))
    }

    /// Last residual add, final norm, LM head (of the last row only when `last`), softcap:
    /// `[t, hidden]` -> logits `[t or 1, vocab]`, f32 unless `!f32` (then in the model's
    /// dtype: an argmax needs no cast, which is exact).
    pub(super) fn head(&self, input: Input, last: bool, f32: bool) -> Result<Tensor> {
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
    /// buffers), when graphs are on, the model runs on CUDA and every layer's cache takes
    /// the step in place (`ModelCache::reserve_in_place`: full-attention KV caches, and the
    /// rings of sliding-window layers, attended where they lie: the slack strategy's, and
    /// the staged strategy's with its side buffer inside a speculation);
    /// `None` sends the caller down the ordinary path. The cache advances by the step on
    /// success.
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
        // prompt other (half-precision) logits than on a fresh cache (docs/kernel-notes.md,
        // "Short prefills").
        // A split model's ranks record steps of their own (`parallel.rs`).
        if t > GRAPH_MAX_ROWS
            || cache.offset() == 0
            || !super::graphs::graphs_enabled()
            || self.parallel.is_some()
        {
            return Ok(None);
        }
        let Some(gate_ups) = self.graph_weights() else {
            return Ok(None);
        };
        // A token tree's nodes in place too, where the kernel masks them (with the fused
        // RoPE); `reserve_in_place` refuses an open tree.
        let trees = super::cuda::fused_rope() && crate::engine::get().tree_in_place;
        let tree_step = match trees {
            true => cache.reserve_tree_in_place(t)?,
            false => None,
        };
        let (bufs, tree) = match tree_step {
            Some((bufs, words)) => (bufs, Some(words)),
            None => match cache.reserve_in_place(t)? {
                Some(bufs) => (bufs, None),
                None => return Ok(None),
            },
        };
        let len = (cache.offset() + tokens.len()) as u32;
        let mut key = in_place_key(&bufs);
        // A tree step reads its words after the length (another recording than a chain's).
        let tree_words = tree.as_ref().map(|tree| {
            key.push(u64::MAX - 2);
            [&[len][..], tree].concat()
        });
        let len_word = [len];
        let words = tree_words.as_deref().unwrap_or(&len_word);
        // A step that hands out hidden states is another recording per set of layers.
        let taps = cache.hidden_layers().map(<[usize]>::to_vec);
        if let Some(taps) = &taps {
            key.push(u64::MAX);
            key.extend(taps.iter().map(|&l| l as u64));
        }
        let layers = self.graph_layers(&bufs, len, &mut key)?;
        // One recording per block length and output kind.
        let slot = 4 * t + 2 * usize::from(greedy) + usize::from(last && t > 1);
        let logits = self.graphs.run(
            dev,
            (slot, greedy),
            key,
            tokens,
            words,
            None,
            |ids, words, _| {
                let len = &words.narrow(0, 0, 1)?;
                let tree = match tree {
                    Some(_) => Some(words.narrow(0, 1, words.dim(0)? - 1)?),
                    None => None,
                };
                let mut input = Input::Embedded(self.embed_rows(ids, true)?);
                let mut tapped = Vec::new();
                let per_layer = self.blocks.iter().zip(&bufs).zip(&gate_ups).zip(&layers);
                for (i, (((block, buf), gate_up), (reach, ring))) in per_layer.enumerate() {
                    tap(&taps, i, &input, &mut tapped)?;
                    let (gate_up, ring) = (*gate_up, ring_step(*ring, buf));
                    input = block.forward_with(input, |attn, input| {
                        let kv = (&buf.k, &buf.v);
                        let gate_up = Some(gate_up);
                        attn.forward_in_place(
                            input,
                            kv,
                            (len, *reach),
                            ring,
                            gate_up,
                            tree.as_ref(),
                        )
                    })?;
                }
                tap(&taps, self.blocks.len(), &input, &mut tapped)?;
                let hidden = self.tapped_rows(&taps, tapped)?;
                Ok((self.head(input, last && t > 1, !greedy)?, hidden))
            },
        )?;
        let Some((logits, hidden)) = logits else {
            return Ok(None);
        };
        cache.advance(tokens.len())?;
        if let Some(hidden) = hidden {
            cache.record_hidden(hidden);
        }
        Ok(Some(logits))
    }

    /// What a recorded step reads of each block, its gate/up weight, when every layer can be
    /// recorded: dense weights (quantized layers run candle's quantized matmul), and rings
    /// only where their K/V are written by the attention kernel (fused RoPE) in place.
    #[cfg(feature = "cuda")]
    pub(super) fn graph_weights(&self) -> Option<Vec<&Tensor>> {
        let gate_ups = self
            .blocks
            .iter()
            .map(|b| b.mlp.gate_up_weight())
            .collect::<Option<Vec<_>>>()?;
        if self.lm_head.is_quantized() || self.blocks.iter().any(|b| b.attn.is_quantized()) {
            return None;
        }
        let rings = self
            .kinds
            .iter()
            .any(|k| matches!(k, LayerKind::Sliding { .. }));
        let options = crate::engine::get();
        if rings && !(options.fused_rope && options.ring_in_place) {
            return None;
        }
        Some(gate_ups)
    }

    /// Per layer of a recorded step ending at `len` over the cache buffers `bufs`: the
    /// attention's reach (a recording serves the steps of one reach: its kernels launch
    /// blocks for the keys below it only; a ring's is all its slots) and a ring's window and
    /// the positions its RoPE table must cover; each layer's part of the recording's `key`.
    #[cfg(feature = "cuda")]
    pub(super) fn graph_layers(
        &self,
        bufs: &[InPlace],
        len: u32,
        key: &mut Vec<u64>,
    ) -> Result<Vec<GraphLayer>> {
        let mut layers = Vec::with_capacity(self.blocks.len());
        for ((block, kind), buf) in self.blocks.iter().zip(&self.kinds).zip(bufs) {
            let capacity = buf.k.dim(2)?;
            let (reach, ring, positions) = match *kind {
                LayerKind::Full => (
                    super::cuda::split_reach(capacity, len as usize),
                    None,
                    capacity,
                ),
                LayerKind::Sliding { window } => (capacity, Some(window), len as usize),
            };
            let (cos, _) = block.attn.rope_table(positions)?;
            key.push(cos.dim(0)? as u64);
            key.push(reach as u64);
            layers.push((reach, ring.map(|w| (w, positions))));
        }
        Ok(layers)
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
        let layers = self.kinds.len() * self.local_ranks();
        if cache.num_layers() != layers {
            return Err(Error::invalid(format!(
                "cache has {} layers but the model has {layers}; build it with new_cache",
                cache.num_layers(),
            )));
        }
        let kinds = self.kinds.iter().cycle();
        for (i, (layer, kind)) in cache.layers().iter().zip(kinds).enumerate() {
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

/// A recorded layer's attention reach and, for a ring, its window and RoPE positions (see
/// [`Decoder::graph_layers`]).
#[cfg(feature = "cuda")]
pub(super) type GraphLayer = (usize, Option<(usize, usize)>);

/// The part of a recording's key that names the cache buffers `bufs` it writes: each layer's
/// allocation, and a staged side buffer's with the positions it holds after the step (the
/// kernel finds the ring's end from them and the device's length).
#[cfg(feature = "cuda")]
pub(super) fn in_place_key(bufs: &[InPlace]) -> Vec<u64> {
    let mut key = Vec::with_capacity(bufs.len());
    for buf in bufs {
        key.push(buf.id);
        if let Some(tail) = &buf.tail {
            key.extend([u64::MAX - 1, tail.id, tail.len as u64]);
        }
    }
    key
}

/// A recorded layer's ring (window, RoPE positions) over the buffers `buf` it writes.
#[cfg(feature = "cuda")]
pub(super) fn ring_step(
    ring: Option<(usize, usize)>,
    buf: &InPlace,
) -> Option<super::attention::RingStep<'_>> {
    ring.map(|(window, positions)| super::attention::RingStep {
        window,
        positions,
        tail: buf.tail.as_ref(),
    })
}

/// Keeps the residual stream entering layer `i` (`input`, its pending add made) when `taps`
/// asks for it.
pub(super) fn tap(
    taps: &Option<Vec<usize>>,
    i: usize,
    input: &Input,
    tapped: &mut Vec<(usize, Tensor)>,
) -> Result<()> {
    if taps.as_ref().is_some_and(|t| t.contains(&i)) {
        let x = match input {
            Input::Embedded(x) | Input::Stream(x) => x.clone(),
            Input::Residual((x, h)) => (x + h)?,
        };
        tapped.push((i, x));
    }
    Ok(())
}

/// One rank's place in a tensor-parallel group (the forwards are in `parallel.rs`).
pub(super) struct Parallel {
    shard: Shard,
    /// Rank 0 only: ranks `1..world`, in order (dropped before this rank's communicator).
    peers: Vec<Decoder>,
    reduce: Arc<dyn AllReduce>,
    /// CPU ranks (rank 0 only): one rayon pool per rank, rank order.
    pools: Vec<rayon::ThreadPool>,
}

impl std::fmt::Debug for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parallel")
            .field("shard", &self.shard)
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl Parallel {
    /// Rank `shard.rank`'s place, summing with `reduce`.
    pub(super) fn new(shard: Shard, reduce: Arc<dyn AllReduce>) -> Self {
        Self {
            shard,
            reduce,
            peers: Vec::new(),
            pools: Vec::new(),
        }
    }

    /// Makes this (rank 0) lead `peers` (ranks `1..`), CPU ranks on `pools` (rank order).
    pub(super) fn lead(&mut self, peers: Vec<Decoder>, pools: Vec<rayon::ThreadPool>) {
        self.peers = peers;
        self.pools = pools;
    }

    /// Ranks in the group.
    pub(super) fn world(&self) -> usize {
        self.shard.world
    }

    /// This rank's index.
    pub(super) fn rank(&self) -> usize {
        self.shard.rank
    }

    /// This rank's all-reduce.
    pub(super) fn reduce(&self) -> &dyn AllReduce {
        self.reduce.as_ref()
    }

    /// Ranks `1..world` (rank 0's; empty on the others).
    pub(super) fn peers(&self) -> &[Decoder] {
        &self.peers
    }

    /// The rayon pool of CPU rank `rank`, if the ranks run on the CPU.
    pub(super) fn pool(&self, rank: usize) -> Option<&rayon::ThreadPool> {
        self.pools.get(rank)
    }
}
