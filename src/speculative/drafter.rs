//! The drafter interface and the draft-model drafter.
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;

use super::model::LanguageModel;
use super::prefill::CachedSequence;
use super::sampling::{argmax, sample, SamplingParams};
use super::tree::{DraftTree, TreeShape};
use crate::cache::{PrefixStore, RotatingStrategy, Speculation};
use crate::error::Result;
use crate::nn::{DeviceTokens, StepIds};

/// What the target verifies of a proposal: the tree below the last committed token (a chain
/// is the tree of width 1), on the host or still on the device.
#[derive(Clone, Copy, Debug)]
pub enum DraftBlock<'a> {
    /// Drafts `d1..dn` in order, each drawn from `probs[i]` (vocabulary-sized; `None`: the
    /// drafts are deterministic, their `q` one-hot).
    Chain {
        /// The drafts.
        tokens: &'a [u32],
        /// The distribution each draft was drawn from.
        probs: Option<&'a [Vec<f32>]>,
    },
    /// A token tree of width above 1 (its nodes' children's distributions inside).
    Tree(&'a DraftTree),
    /// A greedy chain whose drafter's device work is queued, not waited for: the engine
    /// queues the verification behind it and reads the target's argmaxes (with the drafts,
    /// where the host has not seen them) back once, one device → host round trip a step.
    Queued(VerifyBlock<'a>),
}

/// A proposal. It may hold tentative drafter state (a draft model's cache transaction), so
/// it borrows the drafter until [`Draft::finish`] consumes it.
pub trait Draft {
    /// What the target verifies.
    fn block(&self) -> DraftBlock<'_>;
    /// Told the drafts as verified (the tree's nodes in order; a queued chain's as read back)
    /// and the accepted root-to-node path (node indices; a chain's is `0..accepted`); keeps
    /// the matching state.
    fn finish(self: Box<Self>, drafts: &[u32], path: &[usize]) -> Result<()>;
}

/// Where a [`DraftBlock::Queued`] verification block `[last, d1..dn]` lies.
#[derive(Clone, Copy, Debug)]
pub enum VerifyBlock<'a> {
    /// On the target's device, unread: a draft model's argmaxes.
    Device(&'a DeviceTokens),
    /// On the host: drafts the drafter knows without reading anything back (the oracle,
    /// whose draft model runs only for its cost), with the device its work was queued on.
    Host {
        /// `[last, d1..dn]`.
        ids: &'a [u32],
        /// Where the drafter's forwards run (the target's device).
        device: &'a Device,
    },
}

/// What the engine asks of a drafter in one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftRequest {
    /// The tree's shape; width 1 asks for a chain of [`DraftRequest::chain_len`] drafts.
    pub shape: TreeShape,
    /// Temperature, top-k, top-p: the drafts' `q` must be built as the target's `p` is.
    pub sampling: SamplingParams,
    /// The engine takes a [`DraftBlock::Queued`] chain (greedy sampling, verified by the
    /// target's argmax on the device; see [`crate::engine::EngineOptions::queued_verify`]).
    pub queued: bool,
}

impl DraftRequest {
    /// Whether a chain is asked for (width 1).
    pub fn is_chain(&self) -> bool {
        self.shape.width == 1
    }

    /// Most drafts of a chain: `min(depth, budget)`.
    pub fn chain_len(&self) -> usize {
        self.shape.depth.min(self.shape.budget)
    }
}

/// Proposes continuations of a committed token sequence.
pub trait Drafter {
    /// A short name for reports.
    fn name(&self) -> &str;
    /// Untimed per-prompt setup, called by the runner before a generation from `prompt` of
    /// at most `max_new_tokens` tokens (the oracle computes its reference here). No-op by
    /// default.
    fn prepare(&mut self, _prompt: &[u32], _max_new_tokens: usize) -> Result<()> {
        Ok(())
    }
    /// Forgets per-sequence state before a new prompt.
    fn reset(&mut self) -> Result<()>;
    /// Untimed: sizes the drafter's caches for sequences of up to `tokens` tokens (see
    /// [`crate::cache::KvCache::expect_tokens`]). No-op by default.
    fn expect_tokens(&mut self, _tokens: usize) -> Result<()> {
        Ok(())
    }
    /// Reads the prompt before the first proposal (after [`Drafter::reset`]), so that its
    /// cost is booked as prefill (time to first token), not drafting. Default: nothing to read.
    fn prefill(&mut self, _prompt: &[u32]) -> Result<()> {
        Ok(())
    }
    /// Proposes drafts after `context` (every committed token, prompt included, non-empty)
    /// as `request` asks: a chain for width 1 (at most [`DraftRequest::chain_len`] tokens;
    /// [`DraftBlock::Queued`] only where `request.queued` allows it), else a tree of
    /// `request.shape` (a drafter without trees may answer with a chain). Under greedy
    /// sampling a queued chain holds the tokens the host chain would.
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>>;
    /// Model forwards run since the last reset.
    fn forwards(&self) -> usize;
    /// The target layers whose hidden states this drafter reads (ids as
    /// [`crate::cache::ModelCache::tap_hidden`] takes them); `None` (the default): none.
    fn target_layers(&self) -> Option<&[usize]> {
        None
    }
    /// The target's hidden states of committed positions `[start, start + n)` (`states:
    /// [n, layers × hidden]`), handed over after the target's prefill and after every step's
    /// commit, for a drafter with [`Drafter::target_layers`]. Ignored by default.
    fn read_target(&mut self, _start: usize, _states: Tensor) -> Result<()> {
        Ok(())
    }
}

/// Drafts with nothing tentative to keep (model-free drafters).
pub(crate) enum FixedDraft {
    /// A deterministic chain.
    Chain(Vec<u32>),
    /// A tree.
    Tree(DraftTree),
}

impl Draft for FixedDraft {
    fn block(&self) -> DraftBlock<'_> {
        match self {
            FixedDraft::Chain(tokens) => DraftBlock::Chain {
                tokens,
                probs: None,
            },
            FixedDraft::Tree(tree) => DraftBlock::Tree(tree),
        }
    }
    fn finish(self: Box<Self>, _drafts: &[u32], _path: &[usize]) -> Result<()> {
        Ok(())
    }
}

/// Drafts with a smaller model that has its own (transactional) caches.
///
/// With a `confidence` threshold, drafting stops before a position where the draft's largest
/// probability is below the threshold. Lossless under sampling: whether draft `i` is proposed
/// depends only on the drafts before it, so every proposed draft is still drawn from the full
/// `q` row that verification divides by, and a stop just hands that position to the target
/// (its correction or bonus token is drawn from `p`).
pub struct ModelDrafter<M> {
    name: String,
    pub(super) model: Arc<M>,
    /// The draft's cache and the committed tokens it holds (kept across generations, so a
    /// conversation's next turn prefills only its new tokens).
    pub(super) seq: CachedSequence,
    /// Stop drafting before a position whose largest draft probability is below this (the
    /// first draft is always proposed).
    pub(super) confidence: Option<f32>,
    pub(super) forwards: usize,
    /// Where the target verifies a queued greedy chain, when not on the draft's device.
    verify_on: Option<Device>,
}

impl<M: LanguageModel> ModelDrafter<M> {
    /// A drafter named `name` over `model`; rotating layers use `strategy`.
    pub fn new(
        name: impl Into<String>,
        model: Arc<M>,
        strategy: RotatingStrategy,
        confidence: Option<f32>,
    ) -> Result<Self> {
        let seq = CachedSequence::new(model.new_cache(strategy)?);
        Ok(Self {
            name: name.into(),
            model,
            seq,
            confidence,
            forwards: 0,
            verify_on: None,
        })
    }

    /// Feeds the committed tokens of `context` the draft has not seen (at least the last one)
    /// and returns the last position's logits. When the draft holds a prefix of `context`
    /// this is one forward over the rest; otherwise (a new prompt, a new turn) a prefill
    /// that keeps what the draft's cache and store share with `context`.
    pub(super) fn sync(&mut self, context: &[u32]) -> Result<Tensor> {
        let held = self.seq.tokens().len();
        let cache = self.seq.cache();
        if !cache.is_poisoned()
            && held == cache.offset()
            && held < context.len()
            && context.starts_with(self.seq.tokens())
        {
            let (cache, tokens) = self.seq.parts();
            let logits = self.model.forward_last(&context[held..], cache)?;
            tokens.extend_from_slice(&context[held..]);
            self.forwards += 1;
            return Ok(logits);
        }
        let (logits, stats) = self.seq.prefill(self.model.as_ref(), context)?;
        self.forwards += stats.forwards;
        Ok(logits)
    }

    /// Hands queued greedy chains to the target on `device` (its rank 0's), where the draft
    /// model runs elsewhere: the chain is copied there after the draft's forwards, device to
    /// device.
    pub fn verified_on(mut self, device: Device) -> Self {
        self.verify_on = Some(device);
        self
    }

    /// Backs the draft's prefills with a prefix store (see [`CachedSequence::with_store`]).
    pub fn with_prefix_store(mut self, store: PrefixStore, checkpoint_every: usize) -> Self {
        self.seq.set_store(store, checkpoint_every);
        self
    }

    /// Greedy drafting without a confidence threshold: each draft is the argmax of the step
    /// before, which the next step takes where it lies on the device, and the `max` drafts
    /// are read back together at the end: one device → host round trip per proposal, not one
    /// per token, so a GPU runs the draft's forwards back to back. The same tokens as
    /// reading each argmax back (the same argmax, see [`crate::nn::argmax_rows`]).
    fn propose_greedy<'a>(
        &'a mut self,
        context: &[u32],
        max: usize,
    ) -> Result<Box<dyn Draft + 'a>> {
        let GreedyDraft { spec, held, block } = self.draft_greedy(context, max, false)?;
        let tokens = block.to_vec()?;
        Ok(Box::new(ModelDraft {
            spec,
            held,
            tokens,
            probs: None,
        }))
    }

    /// The greedy chain of `max` (≥ 1) drafts after `context` (non-empty), left on the
    /// device: `[d1..dmax]`, or with `with_last` the verification block `[last, d1..dmax]`.
    fn draft_greedy(
        &mut self,
        context: &[u32],
        max: usize,
        with_last: bool,
    ) -> Result<GreedyDraft<'_>> {
        let logits = self.sync(context)?;
        let first = DeviceTokens::argmax(&logits)?;
        let mut parts = Vec::with_capacity(max + 1);
        if with_last {
            // Uploaded while the draft runs; checked below the draft's bound.
            let last = context[context.len() - 1];
            parts.push(DeviceTokens::from_host(
                &[last],
                first.bound(),
                first.ids().device(),
            )?);
        }
        let head = parts.len();
        parts.push(first);
        let (cache, held) = self.seq.parts();
        let mut spec = cache.speculate()?;
        // Every draft but the last is fed (the last one's K/V come with the next context).
        while parts.len() < head + max {
            let next = self.model.forward_argmax(
                StepIds::Device(&parts[parts.len() - 1]),
                spec.cache(),
                true,
            )?;
            self.forwards += 1;
            parts.push(next);
        }
        let mut block = DeviceTokens::cat(&parts)?;
        if let (true, Some(device)) = (with_last, &self.verify_on) {
            block = block.to_device(device)?;
        }
        Ok(GreedyDraft { spec, held, block })
    }
}

/// The draft's next-token distribution at one position, before a token is drawn from it.
pub(super) enum NextDist {
    /// Greedy drafting: the argmax (its `q` is one-hot).
    Argmax(u32),
    /// Sampled drafting: `q`, built with the same settings as the target's `p`.
    Probs(Vec<f32>),
}

/// The distribution at the last row of `logits` (`[n, vocab]`) and the draft's confidence
/// there: its LARGEST probability (greedy: of the softmax at T = 1, i.e. the argmax's
/// probability). The confidence is known before any token is drawn, which is what keeps the
/// threshold lossless (see [`ModelDrafter`]). Computed only when `need_confidence`, else 1.
fn next_dist(
    logits: &Tensor,
    sampling: &SamplingParams,
    need_confidence: bool,
) -> Result<(NextDist, f32)> {
    let last = logits.get(logits.dim(0)? - 1)?;
    if sampling.is_greedy() && !need_confidence {
        let token = crate::nn::argmax_rows(&last.unsqueeze(0)?)?[0];
        return Ok((NextDist::Argmax(token), 1.0));
    }
    Ok(row_dist(
        &last.to_dtype(DType::F32)?.to_vec1::<f32>()?,
        sampling,
    ))
}

/// [`next_dist`] of one host row of logits, the confidence always computed.
pub(super) fn row_dist(row: &[f32], sampling: &SamplingParams) -> (NextDist, f32) {
    if sampling.is_greedy() {
        let (token, conf) = greedy_choice(row);
        return (NextDist::Argmax(token), conf);
    }
    let q = sampling.probs(row);
    let conf = largest(&q);
    (NextDist::Probs(q), conf)
}

/// The argmax of logits `row` and its softmax (T = 1) probability.
pub(super) fn greedy_choice(row: &[f32]) -> (u32, f32) {
    let token = argmax(row);
    (token as u32, greedy_confidence(row, token))
}

/// The softmax (T = 1) probability of the argmax `token` of logits `row`.
fn greedy_confidence(row: &[f32], token: usize) -> f32 {
    let max = row[token] as f64;
    let total: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    (1.0 / total) as f32
}

fn largest(q: &[f32]) -> f32 {
    q.iter().copied().fold(0.0, f32::max)
}

/// The draft's confidence at a position whose next-token logits are `row`, as
/// [`next_dist`] computes it: its largest probability (greedy: of the softmax at T = 1;
/// sampled: of `q`). Tree drafting prunes with it.
pub(super) fn confidence(row: &[f32], sampling: &SamplingParams) -> f32 {
    if sampling.is_greedy() {
        greedy_confidence(row, argmax(row))
    } else {
        largest(&sampling.probs(row))
    }
}

/// Draws the draft token; returns it with the distribution it came from (sampling only).
pub(super) fn draw(next: NextDist, rng: &mut StdRng) -> (u32, Option<Vec<f32>>) {
    match next {
        NextDist::Argmax(token) => (token, None),
        NextDist::Probs(q) => (sample(&q, rng) as u32, Some(q)),
    }
}

/// A draft model's greedy chain on the device, with its cache transaction: a
/// [`DraftBlock::Queued`] proposal.
struct GreedyDraft<'a> {
    spec: Speculation<'a>,
    held: &'a mut Vec<u32>,
    /// `[last, d1..dn]` (`[d1..dn]` for the read-back path of `propose_greedy`).
    block: DeviceTokens,
}

impl Draft for GreedyDraft<'_> {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Queued(VerifyBlock::Device(&self.block))
    }
    fn finish(self: Box<Self>, drafts: &[u32], path: &[usize]) -> Result<()> {
        keep_accepted(self.spec, self.held, drafts, path.len())
    }
}

/// The draft's side of a verdict: its speculation holds `d1..d(k-1)` (the last draft was
/// never fed); keep the accepted ones and extend the held tokens by them. A fully accepted
/// chain leaves `dk` to be fed with the next context.
fn keep_accepted(
    spec: Speculation<'_>,
    held: &mut Vec<u32>,
    drafts: &[u32],
    accepted: usize,
) -> Result<()> {
    let keep = accepted.min(spec.appended());
    spec.commit(keep)?;
    held.extend_from_slice(&drafts[..keep]);
    Ok(())
}

struct ModelDraft<'a> {
    spec: Speculation<'a>,
    /// The drafter's held tokens, to extend by the kept drafts.
    held: &'a mut Vec<u32>,
    tokens: Vec<u32>,
    probs: Option<Vec<Vec<f32>>>,
}

impl Draft for ModelDraft<'_> {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Chain {
            tokens: &self.tokens,
            probs: self.probs.as_deref(),
        }
    }
    /// See [`keep_accepted`].
    fn finish(self: Box<Self>, _drafts: &[u32], path: &[usize]) -> Result<()> {
        keep_accepted(self.spec, self.held, &self.tokens, path.len())
    }
}

impl<M: LanguageModel> Drafter for ModelDrafter<M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn reset(&mut self) -> Result<()> {
        self.seq.reset();
        self.forwards = 0;
        Ok(())
    }

    fn expect_tokens(&mut self, tokens: usize) -> Result<()> {
        self.seq.cache_mut().expect_tokens(tokens)
    }

    /// Runs the draft model over the prompt (reusing what its cache and store hold, in
    /// pieces: see [`CachedSequence::prefill`]); the first proposal then feeds only the
    /// tokens committed after it.
    fn prefill(&mut self, prompt: &[u32]) -> Result<()> {
        if !prompt.is_empty() {
            let (_, stats) = self.seq.prefill(self.model.as_ref(), prompt)?;
            self.forwards += stats.forwards;
        }
        Ok(())
    }

    /// A chain (greedy on the device where it may, queued where asked), or an EAGLE-2-style
    /// dynamic tree (see [`ModelDrafter::draft_tree`]) with the chain's confidence threshold.
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        if !request.is_chain() {
            return self.draft_tree(context, request.shape, &request.sampling, rng);
        }
        let max = request.chain_len();
        if max == 0 || context.is_empty() {
            return Ok(Box::new(FixedDraft::Chain(Vec::new())));
        }
        if request.sampling.is_greedy() && self.confidence.is_none() {
            // Greedy drafts chained on the device: queued, or read back once.
            if request.queued {
                return Ok(Box::new(self.draft_greedy(context, max, true)?));
            }
            return self.propose_greedy(context, max);
        }
        self.propose_chain(context, max, &request.sampling, rng)
    }

    fn forwards(&self) -> usize {
        self.forwards
    }
}

impl<M: LanguageModel> ModelDrafter<M> {
    /// A chain of at most `max` (≥ 1) drafts after `context` (non-empty), each drawn from the
    /// draft's distribution (greedy: its argmax), read back one by one.
    fn propose_chain<'a>(
        &'a mut self,
        context: &[u32],
        max: usize,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        let logits = self.sync(context)?;
        let mut tokens = Vec::with_capacity(max);
        let mut probs = (!sampling.is_greedy()).then(|| Vec::with_capacity(max));
        let need_conf = self.confidence.is_some();
        let threshold = self.confidence.unwrap_or(0.0);
        let (mut next, mut conf) = next_dist(&logits, sampling, need_conf)?;
        let (cache, held) = self.seq.parts();
        let mut spec = cache.speculate()?;
        loop {
            // The stop decision sees the distribution at this position, never the token drawn
            // from it: stopping on q(drawn token) would keep only the confident drafts while
            // verification divides by the unfiltered q, biasing the output.
            if need_conf && conf < threshold && !tokens.is_empty() {
                break;
            }
            let (token, q) = draw(next, rng);
            tokens.push(token);
            if let (Some(all), Some(q)) = (probs.as_mut(), q) {
                all.push(q);
            }
            if tokens.len() == max {
                break;
            }
            let logits = self.model.forward_last(&[token], spec.cache())?;
            self.forwards += 1;
            (next, conf) = next_dist(&logits, sampling, need_conf)?;
        }
        Ok(Box::new(ModelDraft {
            spec,
            held,
            tokens,
            probs,
        }))
    }
}
