//! The drafter interface and the draft-model drafter.
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;

use super::prefill::CachedSequence;
use super::sampling::{argmax, sample, SamplingParams};
use super::tree::{ChainTree, TreeDraft, TreeShape};
use super::LanguageModel;
use crate::cache::{PrefixStore, RotatingStrategy, Speculation};
use crate::error::Result;
use crate::nn::{DeviceTokens, StepIds};

/// A proposal of draft tokens. It may hold tentative drafter state (a draft model's cache
/// transaction), so it borrows the drafter until [`Draft::finish`] consumes it.
pub trait Draft {
    /// The proposed tokens, in order.
    fn tokens(&self) -> &[u32];
    /// The distribution each token was sampled from (vocabulary-sized), or `None` when the
    /// drafts are deterministic (their `q` is one-hot).
    fn probs(&self) -> Option<&[Vec<f32>]>;
    /// Told that the target accepted the first `accepted` tokens; keeps the matching state.
    fn finish(self: Box<Self>, accepted: usize) -> Result<()>;
}

/// A greedy proposal whose device work is queued, not waited for: the engine queues the
/// verification behind it and reads the target's argmaxes (with the drafts, where the host
/// has not seen them) back once — one device → host round trip a step (see
/// [`Drafter::propose_queued`]). Borrows the drafter until [`QueuedDraft::finish`] consumes
/// it, like a [`Draft`].
pub trait QueuedDraft {
    /// The verification block: the last committed token, then the n ≥ 1 drafts.
    fn block(&self) -> VerifyBlock<'_>;
    /// Told the drafts (as read back, or the host's) and that the target accepted the first
    /// `accepted`; keeps the matching state.
    fn finish(self: Box<Self>, drafts: &[u32], accepted: usize) -> Result<()>;
}

/// Where a [`QueuedDraft`]'s verification block `[last, d1..dn]` lies.
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
    /// Reads the prompt before the first proposal (after [`Drafter::reset`]), so that its
    /// cost is booked as prefill (time to first token), not drafting. Default: nothing to read.
    fn prefill(&mut self, _prompt: &[u32]) -> Result<()> {
        Ok(())
    }
    /// Proposes up to `max` tokens after `context` (every committed token, prompt included).
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        max: usize,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>>;
    /// Greedy drafting without waiting for the drafter's device work: up to `max` tokens
    /// after `context`, what [`Drafter::propose`] would propose under greedy sampling with
    /// the same `rng`, or `None` where this drafter has no such path (the default: the engine
    /// then calls `propose`, and nothing has been drawn from `rng`). Called under greedy
    /// sampling only.
    fn propose_queued<'a>(
        &'a mut self,
        _context: &[u32],
        _max: usize,
        _rng: &mut StdRng,
    ) -> Result<Option<Box<dyn QueuedDraft + 'a>>> {
        Ok(None)
    }
    /// Model forwards run since the last reset.
    fn forwards(&self) -> usize;
    /// Proposes a token tree of `shape` after `context`. The default drafts a chain of
    /// `min(depth, budget)` tokens with [`Drafter::propose`]: the tree of width 1.
    fn propose_tree<'a>(
        &'a mut self,
        context: &[u32],
        shape: TreeShape,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn TreeDraft + 'a>> {
        let max = shape.depth.min(shape.budget);
        Ok(Box::new(ChainTree::new(
            self.propose(context, max, sampling, rng)?,
        )))
    }
}

/// A fixed list of drafts with nothing tentative to keep.
pub(crate) struct FixedDraft(pub Vec<u32>);

impl Draft for FixedDraft {
    fn tokens(&self) -> &[u32] {
        &self.0
    }
    fn probs(&self) -> Option<&[Vec<f32>]> {
        None
    }
    fn finish(self: Box<Self>, _accepted: usize) -> Result<()> {
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
        Ok(GreedyDraft {
            spec,
            held,
            block: DeviceTokens::cat(&parts)?,
        })
    }
}

/// The draft's next-token distribution at one position, before a token is drawn from it.
enum NextDist {
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
    let row = last.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    if sampling.is_greedy() {
        let token = argmax(&row);
        return Ok((
            NextDist::Argmax(token as u32),
            greedy_confidence(&row, token),
        ));
    }
    let q = sampling.probs(&row);
    let conf = largest(&q);
    Ok((NextDist::Probs(q), conf))
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
fn draw(next: NextDist, rng: &mut StdRng) -> (u32, Option<Vec<f32>>) {
    match next {
        NextDist::Argmax(token) => (token, None),
        NextDist::Probs(q) => (sample(&q, rng) as u32, Some(q)),
    }
}

/// A draft model's greedy chain on the device, with its cache transaction: a
/// [`QueuedDraft`].
struct GreedyDraft<'a> {
    spec: Speculation<'a>,
    held: &'a mut Vec<u32>,
    /// `[last, d1..dn]` (`[d1..dn]` for the read-back path of `propose_greedy`).
    block: DeviceTokens,
}

impl QueuedDraft for GreedyDraft<'_> {
    fn block(&self) -> VerifyBlock<'_> {
        VerifyBlock::Device(&self.block)
    }
    fn finish(self: Box<Self>, drafts: &[u32], accepted: usize) -> Result<()> {
        keep_accepted(self.spec, self.held, drafts, accepted)
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
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    fn probs(&self) -> Option<&[Vec<f32>]> {
        self.probs.as_deref()
    }
    /// See [`keep_accepted`].
    fn finish(self: Box<Self>, accepted: usize) -> Result<()> {
        keep_accepted(self.spec, self.held, &self.tokens, accepted)
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

    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        max: usize,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        if max == 0 || context.is_empty() {
            return Ok(Box::new(FixedDraft(Vec::new())));
        }
        if sampling.is_greedy() && self.confidence.is_none() {
            return self.propose_greedy(context, max);
        }
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

    fn forwards(&self) -> usize {
        self.forwards
    }

    /// EAGLE-2-style dynamic tree (see [`ModelDrafter::draft_tree`]), with the chain's
    /// confidence threshold.
    fn propose_tree<'a>(
        &'a mut self,
        context: &[u32],
        shape: TreeShape,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn TreeDraft + 'a>> {
        self.draft_tree(context, shape, sampling, rng)
    }

    /// The greedy chain without a confidence threshold (with one, each stop decision needs
    /// the draft's distribution on the host: `None`).
    fn propose_queued<'a>(
        &'a mut self,
        context: &[u32],
        max: usize,
        _rng: &mut StdRng,
    ) -> Result<Option<Box<dyn QueuedDraft + 'a>>> {
        if self.confidence.is_some() || max == 0 || context.is_empty() {
            return Ok(None);
        }
        Ok(Some(Box::new(self.draft_greedy(context, max, true)?)))
    }
}
