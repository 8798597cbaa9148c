//! The EAGLE-3 drafter: an [`Eagle3Head`] drafting from the target's hidden states.
//!
//! The head's position `j` reads the target's fused hidden state at position `j` with the
//! committed token `j + 1`, so its cache holds one entry per target position whose token
//! after it is committed (the target's offset, between steps). The engine hands over the
//! target's states of committed positions after every forward ([`Drafter::read_target`]);
//! at a proposal the head first reads the pairs committed since the last one (their K/V
//! kept), then drafts inside a speculation of its cache that is always rolled back: later
//! draft positions read the head's own outputs, and once accepted, their pairs are read
//! again with the target's states (as the EAGLE-3 reference does).
use std::sync::Arc;

use candle_core::Tensor;
use rand::rngs::StdRng;

use super::drafter::{
    draw, greedy_choice, row_dist, Draft, DraftBlock, DraftRequest, Drafter, FixedDraft, NextDist,
};
use super::sampling::SamplingParams;
use super::tree::DraftTree;
use super::tree_draft::{grow_tree, grows};
use crate::cache::{ModelCache, Speculation};
use crate::error::{Error, Result};
use crate::nn::Eagle3Head;

/// Drafts with an EAGLE-3 head over the target's hidden states.
///
/// With a `confidence` threshold, drafting stops before a position where the head's largest
/// probability is below it (trees: such nodes get no children), as a draft model's does
/// ([`super::ModelDrafter`]): decided before the draft there is drawn, so lossless.
pub struct Eagle3Drafter {
    name: String,
    head: Arc<Eagle3Head>,
    cache: ModelCache,
    /// The committed tokens behind the cache: `cache.offset() + 1` of them (empty when the
    /// cache is).
    held: Vec<u32>,
    /// Target states not read yet: the position of the first and the rows.
    pending: Option<(usize, Tensor)>,
    /// The last read pair's output and logits (`[1, hidden]`, `[1, draft_vocab]`), for a
    /// proposal with no new committed pair.
    last: Option<(Tensor, Tensor)>,
    /// The last read pair's token id `[1]` and target states `[1, fused_width]`, to read it
    /// again where `last` was not kept.
    last_pair: Option<(Tensor, Tensor)>,
    /// Stop drafting before a position whose largest probability is below this (the first
    /// draft is always proposed).
    confidence: Option<f32>,
    forwards: usize,
}

impl Eagle3Drafter {
    /// A drafter named `name` over `head`, without a confidence threshold.
    pub fn new(name: impl Into<String>, head: Arc<Eagle3Head>) -> Result<Self> {
        Self::with_confidence(name, head, None)
    }

    /// A drafter named `name` over `head` that stops drafting below `confidence`.
    pub fn with_confidence(
        name: impl Into<String>,
        head: Arc<Eagle3Head>,
        confidence: Option<f32>,
    ) -> Result<Self> {
        let cache = head.new_cache()?;
        Ok(Self {
            name: name.into(),
            head,
            cache,
            held: Vec::new(),
            pending: None,
            last: None,
            last_pair: None,
            confidence,
            forwards: 0,
        })
    }

    /// Reads the pairs `context` committed that the cache lacks (rewinding past a
    /// divergence first); returns the last pair's output and logits. Errors when the target
    /// did not hand over the states they need.
    fn sync(&mut self, context: &[u32]) -> Result<(Tensor, Tensor)> {
        match self.unread(context)? {
            Some(pairs) => self.read(context, pairs),
            None => self.last_again(),
        }
    }

    /// Rewinds the cache past a divergence from `context`; returns the committed pairs it
    /// lacks (`None` when it holds them all).
    fn unread(&mut self, context: &[u32]) -> Result<Option<Pairs>> {
        let shared = self
            .held
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = self.cache.offset().min(shared.saturating_sub(1));
        if keep < self.cache.offset() {
            self.cache.restore(None, keep)?;
            self.held.truncate(keep + 1);
            self.last = None;
            self.last_pair = None;
        }
        let (from, to) = (self.cache.offset(), context.len().saturating_sub(1));
        if from == to {
            return Ok(None);
        }
        let states = self.states(from, to)?;
        let ids = Tensor::new(&context[from + 1..=to], &states.device().clone())?;
        Ok(Some(Pairs { to, ids, states }))
    }

    /// Counts `pairs` read into the cache (up to position `to` of `context`).
    fn mark_read(&mut self, context: &[u32], pairs: &Pairs) -> Result<()> {
        self.held.clear();
        self.held.extend_from_slice(&context[..=pairs.to]);
        let t = pairs.ids.dim(0)?;
        self.last_pair = Some((
            pairs.ids.narrow(0, t - 1, 1)?,
            pairs.states.narrow(0, t - 1, 1)?,
        ));
        Ok(())
    }

    /// Reads `pairs` in one forward; returns the last one's output and logits.
    fn read(&mut self, context: &[u32], pairs: Pairs) -> Result<(Tensor, Tensor)> {
        let (out, logits) = self
            .head
            .forward(&pairs.ids, &pairs.states, &mut self.cache, true)?;
        self.forwards += 1;
        self.mark_read(context, &pairs)?;
        let last = (out, logits);
        self.last = Some(last.clone());
        Ok(last)
    }

    /// The last read pair's output and logits for a proposal with no new pair: kept from
    /// its read, or (after a chained proposal, which keeps no logits) that pair read again.
    fn last_again(&mut self) -> Result<(Tensor, Tensor)> {
        if let Some(last) = &self.last {
            return Ok(last.clone());
        }
        let (Some((ids, states)), Some(offset)) =
            (self.last_pair.clone(), self.cache.offset().checked_sub(1))
        else {
            return Err(Error::invalid(
                "eagle3: a proposal before any committed pair (a one-token prompt?)",
            ));
        };
        self.cache.restore(None, offset)?;
        let (out, logits) = self.head.forward(&ids, &states, &mut self.cache, true)?;
        self.forwards += 1;
        self.last = Some((out.clone(), logits.clone()));
        Ok((out, logits))
    }

    /// The target's states of positions `[from, to)`, taken out of the pending rows.
    fn states(&mut self, from: usize, to: usize) -> Result<Tensor> {
        let missing = || {
            Error::invalid(format!(
                "eagle3: the target's hidden states of positions [{from}, {to}) were not handed over (a target cache reused without them?)"
            ))
        };
        let (start, rows) = self.pending.take().ok_or_else(missing)?;
        let n = rows.dim(0)?;
        if from < start || to > start + n {
            self.pending = Some((start, rows));
            return Err(missing());
        }
        let wanted = rows.narrow(0, from - start, to - from)?;
        if start + n > to {
            self.pending = Some((to, rows.narrow(0, to - start, start + n - to)?));
        }
        Ok(wanted)
    }

    /// A chain of at most `max` drafts; a greedy one without a confidence threshold stays on
    /// the device (handed to the engine unread when `queued`).
    fn chain<'a>(
        &'a mut self,
        context: &[u32],
        (max, queued): (usize, bool),
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        if sampling.is_greedy() && self.confidence.is_none() {
            return self.greedy(context, max, queued);
        }
        let (mut out, mut logits) = self.sync(context)?;
        let device = out.device().clone();
        let mut tokens = Vec::with_capacity(max);
        let mut probs = (!sampling.is_greedy()).then(|| Vec::with_capacity(max));
        let mut spec = self.cache.speculate()?;
        loop {
            let row = logits.squeeze(0)?.to_vec1::<f32>()?;
            let (next, conf) = if sampling.is_greedy() {
                // The argmax and its probability over the draft vocabulary (the target's ids
                // it lacks have probability 0), mapped to a target id.
                let (d, conf) = greedy_choice(&row);
                let token = self.head.draft_to_target()[d as usize];
                (NextDist::Argmax(token), conf)
            } else {
                row_dist(&target_row(&self.head, &row)?, sampling)
            };
            // Decided on the distribution, never on the token drawn from it (see
            // `ModelDrafter::propose_chain`).
            if self.confidence.is_some_and(|t| conf < t) && !tokens.is_empty() {
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
            let ids = Tensor::new(&[token], &device)?;
            (out, logits) = self.head.forward(&ids, &out, spec.cache(), true)?;
            self.forwards += 1;
        }
        Ok(Box::new(Eagle3Chain {
            _spec: spec,
            tokens,
            probs,
        }))
    }

    /// A greedy chain of `max` drafts (queued for the engine when `queued`): read and
    /// drafted in one replayed graph where the head takes one
    /// ([`Eagle3Head::propose_graphed`]), else step by step ([`Self::greedy_chain`]).
    fn greedy<'a>(
        &'a mut self,
        context: &[u32],
        max: usize,
        queued: bool,
    ) -> Result<Box<dyn Draft + 'a>> {
        let last = queued.then(|| context[context.len() - 1]);
        let Some(pairs) = self.unread(context)? else {
            let (out, logits) = self.last_again()?;
            return self.greedy_chain(out, logits, max, last);
        };
        #[cfg(feature = "cuda")]
        if let Some(block) =
            self.head
                .propose_graphed(&pairs.ids, &pairs.states, &mut self.cache, max)?
        {
            self.forwards += max;
            self.mark_read(context, &pairs)?;
            self.last = None;
            let spec = self.cache.speculate()?;
            if queued {
                let bound = self.head.vocab_size()?;
                return Ok(Box::new(QueuedDraft {
                    _spec: spec,
                    block: crate::nn::DeviceTokens::from_argmax(block, bound),
                }));
            }
            let mut tokens = block.to_vec1::<u32>()?;
            tokens.remove(0);
            return Ok(Box::new(Eagle3Chain {
                _spec: spec,
                tokens,
                probs: None,
            }));
        }
        let (out, logits) = self.read(context, pairs)?;
        self.greedy_chain(out, logits, max, last)
    }

    /// Greedy drafts chained on the device: each draft's id is the argmax of the step
    /// before, mapped to a target id where it lies. With `last` (the last committed token)
    /// the block `[last, d1..dmax]` goes to the engine unread, a [`DraftBlock::Queued`]
    /// chain; otherwise the drafts are read back together (one device → host round trip
    /// per proposal, as a draft model's).
    fn greedy_chain<'a>(
        &'a mut self,
        mut out: Tensor,
        logits: Tensor,
        max: usize,
        last: Option<u32>,
    ) -> Result<Box<dyn Draft + 'a>> {
        let head = &self.head;
        let mut ids = head.map_to_target(&crate::nn::argmax_on_device(&logits)?)?;
        let mut all = Vec::with_capacity(max + 1);
        if let Some(last) = last {
            all.push(Tensor::new(&[last], ids.device())?);
        }
        all.push(ids.clone());
        let want = max + usize::from(last.is_some());
        let mut spec = self.cache.speculate()?;
        while all.len() < want {
            let (next_out, logits) = head.forward(&ids, &out, spec.cache(), true)?;
            self.forwards += 1;
            out = next_out;
            ids = head.map_to_target(&crate::nn::argmax_on_device(&logits)?)?;
            all.push(ids.clone());
        }
        let block = Tensor::cat(&all, 0)?;
        if last.is_some() {
            let bound = head.vocab_size()?;
            return Ok(Box::new(QueuedDraft {
                _spec: spec,
                block: crate::nn::DeviceTokens::from_argmax(block, bound),
            }));
        }
        Ok(Box::new(Eagle3Chain {
            _spec: spec,
            tokens: block.to_vec1::<u32>()?,
            probs: None,
        }))
    }

    fn tree<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        let shape = request.shape;
        let sampling = &request.sampling;
        let root = if grows(shape) {
            Some(self.sync(context)?)
        } else {
            None
        };
        let device = self.head.device().clone();
        let head = Arc::clone(&self.head);
        let root_out = root.as_ref().map(|(out, _)| out.clone());
        let root_row = match &root {
            Some((_, logits)) => Some(target_row(&head, &logits.squeeze(0)?.to_vec1::<f32>()?)?),
            None => None,
        };
        let forwards = &mut self.forwards;
        let mut spec = self.cache.speculate()?;
        // Each fed node's output, by its index in the speculation's block.
        let mut outs: Vec<Tensor> = Vec::new();
        let (tree, _) = grow_tree(
            &mut spec,
            root_row,
            (shape, sampling, self.confidence),
            rng,
            |spec, parents, tokens| {
                let features = parents
                    .iter()
                    .map(|p| match p {
                        Some(b) => Ok(outs[*b].clone()),
                        None => root_out
                            .clone()
                            .ok_or_else(|| Error::invalid("eagle3: a node below a missing root")),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let ids = Tensor::new(tokens, &device)?;
                let (out, logits) =
                    head.forward(&ids, &Tensor::cat(&features, 0)?, spec.cache(), false)?;
                *forwards += 1;
                for r in 0..tokens.len() {
                    outs.push(out.narrow(0, r, 1)?);
                }
                logits
                    .to_vec2::<f32>()?
                    .iter()
                    .map(|row| target_row(&head, row))
                    .collect()
            },
        )?;
        Ok(Box::new(Eagle3Tree { _spec: spec, tree }))
    }
}

/// Committed pairs the head's cache lacks: the position of the last (`to`), their token ids
/// `[t]` and the target's states `[t, fused_width]`.
struct Pairs {
    to: usize,
    ids: Tensor,
    states: Tensor,
}

/// Draft-vocabulary logits as target-vocabulary logits (`-inf` where the draft vocabulary
/// has no id), so that `q` is built over the target's ids as `p` is.
fn target_row(head: &Eagle3Head, draft_row: &[f32]) -> Result<Vec<f32>> {
    let mut row = vec![f32::NEG_INFINITY; head.vocab_size()?];
    for (&t, &l) in head.draft_to_target().iter().zip(draft_row) {
        row[t as usize] = l;
    }
    Ok(row)
}

/// A chain read back to the host; its speculation of the head's cache is rolled back
/// whatever is accepted (as every proposal's here).
struct Eagle3Chain<'a> {
    _spec: Speculation<'a>,
    tokens: Vec<u32>,
    /// `q` of each draft (sampling only).
    probs: Option<Vec<Vec<f32>>>,
}

/// A tree.
struct Eagle3Tree<'a> {
    _spec: Speculation<'a>,
    tree: DraftTree,
}

/// A greedy chain left on the device: `[last, d1..dn]`, verified there by the engine.
struct QueuedDraft<'a> {
    _spec: Speculation<'a>,
    block: crate::nn::DeviceTokens,
}

impl Draft for QueuedDraft<'_> {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Queued(super::drafter::VerifyBlock::Device(&self.block))
    }
    fn finish(self: Box<Self>, _drafts: &[u32], _path: &[usize]) -> Result<()> {
        Ok(())
    }
}

impl Draft for Eagle3Chain<'_> {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Chain {
            tokens: &self.tokens,
            probs: self.probs.as_deref(),
        }
    }
    fn finish(self: Box<Self>, _drafts: &[u32], _path: &[usize]) -> Result<()> {
        Ok(())
    }
}

impl Draft for Eagle3Tree<'_> {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Tree(&self.tree)
    }
    fn finish(self: Box<Self>, _drafts: &[u32], _path: &[usize]) -> Result<()> {
        Ok(())
    }
}

impl Drafter for Eagle3Drafter {
    fn name(&self) -> &str {
        &self.name
    }

    fn reset(&mut self) -> Result<()> {
        self.cache.reset();
        self.held.clear();
        self.pending = None;
        self.last = None;
        self.last_pair = None;
        self.forwards = 0;
        Ok(())
    }

    fn expect_tokens(&mut self, tokens: usize) -> Result<()> {
        self.cache.expect_tokens(tokens)
    }

    fn target_layers(&self) -> Option<&[usize]> {
        Some(self.head.target_layers())
    }

    /// Keeps `states` as the target's states from position `start` on (replacing any held
    /// for those positions: the target rewound).
    fn read_target(&mut self, start: usize, states: Tensor) -> Result<()> {
        let width = states.dim(1)?;
        if width != self.head.fused_width() {
            return Err(Error::invalid(format!(
                "eagle3: the target hands over {width}-wide hidden states; the head fuses {} ({} layers)",
                self.head.fused_width(),
                self.head.target_layers().len()
            )));
        }
        self.pending = match self.pending.take() {
            Some((p0, rows)) if p0 < start && start <= p0 + rows.dim(0)? => {
                let kept = rows.narrow(0, 0, start - p0)?;
                Some((p0, Tensor::cat(&[kept, states], 0)?))
            }
            _ => Some((start, states)),
        };
        Ok(())
    }

    /// Reads the prompt's pairs (all but the last token's, which pairs with the first new
    /// token).
    fn prefill(&mut self, prompt: &[u32]) -> Result<()> {
        if prompt.len() >= 2 {
            self.sync(prompt)?;
        }
        Ok(())
    }

    /// A chain (greedy or sampled; a greedy one queued on the device where the engine takes
    /// it) or an EAGLE-2-style dynamic tree.
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        if !request.is_chain() {
            return self.tree(context, request, rng);
        }
        let max = request.chain_len();
        if max == 0 || context.is_empty() {
            return Ok(Box::new(FixedDraft::Chain(Vec::new())));
        }
        self.chain(context, (max, request.queued), &request.sampling, rng)
    }

    fn forwards(&self) -> usize {
        self.forwards
    }
}
