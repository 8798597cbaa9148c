//! A synthetic-acceptance drafter for speed studies without a trained pair.
//!
//! The oracle knows the target's own greedy continuation of the prompt (computed untimed by
//! [`Drafter::prepare`]) and proposes it, each token kept with probability `alpha` and
//! replaced by a different token otherwise. Under greedy verification the target accepts a
//! kept token (it *is* the target's argmax at that position) and rejects a replaced one, so
//! the per-token acceptance probability is exactly `alpha`. With a draft model attached, the
//! oracle also runs that model's forwards over the tokens it proposes (inside the model's
//! own transactional cache), so a step costs what a real draft of that size would.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::Device;
use rand::rngs::StdRng;
use rand::Rng;

use super::decode::{generate, Drafting};
use super::drafter::{Draft, DraftBlock, DraftRequest, Drafter, FixedDraft, VerifyBlock};
use super::model::LanguageModel;
use super::params::{GammaPolicy, GenParams};
use super::prefill::CachedSequence;
use super::sampling::SamplingParams;
use crate::cache::{ModelCache, RotatingStrategy, Speculation};
use crate::error::{Error, Result};
use crate::nn::{DeviceTokens, StepIds};

/// Greedy continuations by prompt, shared by every oracle over the same target so each
/// prompt's reference pass runs once per run.
pub type ReferenceStore = Arc<Mutex<HashMap<Vec<u32>, Vec<u32>>>>;

/// Proposes the target's greedy continuation with per-token acceptance `alpha`.
pub struct OracleDrafter<M> {
    name: String,
    target: Arc<M>,
    alpha: f64,
    /// The draft model whose forwards are run for their cost, with its cache.
    cost: Option<(Arc<M>, ModelCache)>,
    /// An EAGLE-3 drafter whose greedy proposals are made (and discarded) for their cost.
    cost_head: Option<super::eagle3::Eagle3Drafter>,
    references: ReferenceStore,
    /// `(prompt length, greedy continuation)` of the prompt being generated.
    current: Option<(usize, Arc<[u32]>)>,
    forwards: usize,
    /// Steps whose verification contradicted the reference (see [`Self::reference_mismatches`]).
    mismatches: Mismatches,
    /// Where the target verifies, when the cost model runs on another device.
    verify_on: Option<Device>,
}

/// Steps where the target did not accept exactly the proposal's leading kept tokens, and
/// whether the prompt being generated has been warned about.
#[derive(Default)]
struct Mismatches {
    steps: usize,
    warned: bool,
}

impl Mismatches {
    /// Greedy verification must accept exactly the `kept` leading tokens of the `proposed`
    /// (all of them when every token was kept); `at` is the output position of the first,
    /// `name` the drafter's (for the warning).
    fn check(&mut self, name: &str, at: usize, proposed: usize, kept: usize, accepted: usize) {
        if accepted == kept {
            return;
        }
        self.steps += 1;
        if !self.warned {
            self.warned = true;
            eprintln!(
                "warning: oracle drafter {name:?}: at output position {at} the target accepted {accepted} of {proposed} proposals, whose first {kept} were its greedy reference's: the reference pass computed other logits than this run (another code path, in half precision?), and the measured acceptance falls below alpha"
            );
        }
    }
}

impl<M: LanguageModel> OracleDrafter<M> {
    /// An oracle over `target` keeping each proposed token with probability `alpha`
    /// (in `[0, 1]`); `cost_model` (with its rotating `strategy`) is run for its cost.
    pub fn new(
        name: impl Into<String>,
        target: Arc<M>,
        alpha: f64,
        cost_model: Option<(Arc<M>, RotatingStrategy)>,
        references: ReferenceStore,
    ) -> Result<Self> {
        if !(0.0..=1.0).contains(&alpha) {
            return Err(Error::invalid(format!(
                "oracle alpha = {alpha}: must be in [0, 1]"
            )));
        }
        let cost = match cost_model {
            Some((model, strategy)) => {
                let cache = model.new_cache(strategy)?;
                Some((model, cache))
            }
            None => None,
        };
        Ok(Self {
            name: name.into(),
            target,
            alpha,
            cost,
            cost_head: None,
            references,
            current: None,
            forwards: 0,
            mismatches: Mismatches::default(),
            verify_on: None,
        })
    }

    /// The target verifies on `device` (its rank 0's) where the cost model runs elsewhere:
    /// the cost forwards' last token is copied there, so that the verification queued behind
    /// it waits for them as it waits for a draft model's chain.
    pub fn verified_on(mut self, device: Device) -> Self {
        self.verify_on = Some(device);
        self
    }

    /// Runs `head`'s greedy proposals (over the target's hidden states, which the target then
    /// hands out) for their cost instead of a draft model's forwards.
    pub fn with_eagle3_cost(mut self, head: Arc<crate::nn::Eagle3Head>) -> Result<Self> {
        self.cost = None;
        self.cost_head = Some(super::eagle3::Eagle3Drafter::new(self.name.clone(), head)?);
        Ok(self)
    }

    /// Steps so far in which greedy verification did not accept exactly the leading tokens
    /// the oracle kept from its reference. The oracle's premise is that the reference is the
    /// target's own greedy continuation in this run, so a kept token is always accepted and a
    /// replaced one never: a mismatch means the reference pass computed other logits than the
    /// run (another code path, in half precision), and the measured acceptance then falls
    /// below `alpha`. The first of each prompt is also printed as a warning.
    pub fn reference_mismatches(&self) -> usize {
        self.mismatches.steps
    }

    /// The reference continuation of `prompt` (`max_new_tokens` greedy target tokens),
    /// computed once and kept in the shared store.
    fn reference(&self, prompt: &[u32], max_new_tokens: usize) -> Result<Arc<[u32]>> {
        let store = |e: std::sync::PoisonError<_>| Error::invalid(format!("oracle store: {e}"));
        if let Some(r) = self.references.lock().map_err(store)?.get(prompt) {
            if r.len() >= max_new_tokens {
                return Ok(r[..max_new_tokens].into());
            }
        }
        let params = GenParams {
            max_new_tokens,
            sampling: SamplingParams::greedy(),
            gamma: GammaPolicy::Fixed(1),
            stop_at_eos: false,
        };
        let mut seq = CachedSequence::new(self.target.new_cache(RotatingStrategy::Staged)?);
        let mut rng = rand::SeedableRng::seed_from_u64(0);
        let record = generate(
            self.target.as_ref(),
            &mut seq,
            prompt,
            &params,
            Drafting::None,
            &mut rng,
        )?;
        let tokens = record.output_ids;
        self.references
            .lock()
            .map_err(store)?
            .insert(prompt.to_vec(), tokens.clone());
        Ok(tokens.into())
    }

    /// Up to `max` proposals after `context`: the reference, each token replaced with
    /// probability `1 - alpha` by a uniformly drawn different token; with the output position
    /// of the first and the number of leading tokens kept.
    fn proposals(
        &self,
        context: &[u32],
        max: usize,
        rng: &mut StdRng,
    ) -> Result<(Vec<u32>, usize, usize)> {
        let Some((prompt_len, reference)) = &self.current else {
            return Err(Error::invalid(
                "oracle drafter: prepare() was not called for this prompt",
            ));
        };
        let vocab = self.target.vocab_size() as u32;
        // `context` = prompt + the committed output tokens; the next is reference[k].
        let at = context.len().saturating_sub(*prompt_len);
        let mut tokens = Vec::with_capacity(max);
        let mut kept = 0;
        for &truth in reference.iter().skip(at).take(max) {
            let keep = vocab < 2 || rng.random::<f64>() < self.alpha;
            if keep && kept == tokens.len() {
                kept += 1;
            }
            tokens.push(if keep {
                truth
            } else {
                // Uniform over the vocabulary without `truth`.
                let r = rng.random_range(0..vocab - 1);
                if r >= truth {
                    r + 1
                } else {
                    r
                }
            });
        }
        Ok((tokens, at, kept))
    }
}

/// A proposal with its check: greedy verification must accept exactly the `kept` leading
/// tokens (all of them when every token was kept).
struct Checked<'a> {
    inner: Box<dyn Draft + 'a>,
    kept: usize,
    /// Output position of the first proposal, and the drafter's name (for the warning).
    at: usize,
    name: &'a str,
    log: &'a mut Mismatches,
}

impl Draft for Checked<'_> {
    fn block(&self) -> DraftBlock<'_> {
        self.inner.block()
    }
    fn finish(self: Box<Self>, drafts: &[u32], path: &[usize]) -> Result<()> {
        self.log
            .check(self.name, self.at, drafts.len(), self.kept, path.len());
        self.inner.finish(drafts, path)
    }
}

/// The cost model's tentative forwards over the proposed tokens.
struct CostDraft<'a> {
    spec: Speculation<'a>,
    /// `[last, proposals..]`: the proposals are `block[1..]`.
    block: Vec<u32>,
    /// The cost model's device when its forwards are queued, not waited for (then the
    /// engine verifies the block as it verifies a draft model's queued chain).
    queued: Option<Device>,
}

impl Draft for CostDraft<'_> {
    fn block(&self) -> DraftBlock<'_> {
        match &self.queued {
            Some(device) => DraftBlock::Queued(VerifyBlock::Host {
                ids: &self.block,
                device,
            }),
            None => DraftBlock::Chain {
                tokens: &self.block[1..],
                probs: None,
            },
        }
    }
    /// As for a draft model: the speculation holds all but the last proposal.
    fn finish(self: Box<Self>, _drafts: &[u32], path: &[usize]) -> Result<()> {
        let keep = path.len().min(self.spec.appended());
        self.spec.commit(keep)
    }
}

impl<M: LanguageModel> Drafter for OracleDrafter<M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn prepare(&mut self, prompt: &[u32], max_new_tokens: usize) -> Result<()> {
        let reference = self.reference(prompt, max_new_tokens)?;
        self.current = Some((prompt.len(), reference));
        self.mismatches.warned = false;
        Ok(())
    }

    /// Runs the cost model over the prompt, as a draft model's prefill (booked as prefill).
    fn prefill(&mut self, prompt: &[u32]) -> Result<()> {
        if let Some(head) = self.cost_head.as_mut() {
            head.prefill(prompt)?;
        }
        if let (Some((model, cache)), false) = (self.cost.as_mut(), prompt.is_empty()) {
            cache.reset();
            // In pieces, as a draft model's prefill (activations bounded by the piece).
            for piece in prompt.chunks(crate::nn::PREFILL_CHUNK) {
                crate::nn::argmax_rows(&model.forward_last(piece, cache)?)?;
                self.forwards += 1;
            }
        }
        Ok(())
    }

    fn target_layers(&self) -> Option<&[usize]> {
        self.cost_head.as_ref().and_then(|h| h.target_layers())
    }

    fn read_target(&mut self, start: usize, states: candle_core::Tensor) -> Result<()> {
        match self.cost_head.as_mut() {
            Some(head) => head.read_target(start, states),
            None => Ok(()),
        }
    }

    fn reset(&mut self) -> Result<()> {
        if let Some((_, cache)) = self.cost.as_mut() {
            cache.reset();
        }
        if let Some(head) = self.cost_head.as_mut() {
            head.reset()?;
        }
        self.forwards = 0;
        Ok(())
    }

    fn expect_tokens(&mut self, tokens: usize) -> Result<()> {
        if let Some((_, cache)) = self.cost.as_mut() {
            cache.expect_tokens(tokens)?;
        }
        match self.cost_head.as_mut() {
            Some(head) => head.expect_tokens(tokens),
            None => Ok(()),
        }
    }

    /// With a cost model, its forwards run as a greedy draft model's would: queued where
    /// the engine takes a queued chain (the engine's one read-back after the verification
    /// waits for them, as for a draft model's drafts), else waited for, so that their time
    /// is booked as drafting rather than left queued ahead of the verification.
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        if !request.sampling.is_greedy() {
            return Err(Error::invalid(format!(
                "oracle drafter {:?} needs greedy sampling (temperature = 0): its acceptance is defined against the target's argmax",
                self.name
            )));
        }
        let (tokens, at, kept) = self.proposals(context, request.chain_len(), rng)?;
        if let (Some(head), false) = (self.cost_head.as_mut(), tokens.is_empty()) {
            // The head's greedy chain, read back and discarded (its speculation rolls back).
            let chain = DraftRequest {
                queued: false,
                shape: super::tree::TreeShape {
                    width: 1,
                    ..request.shape
                },
                ..*request
            };
            let before = head.forwards();
            head.propose(context, &chain, rng)?.finish(&[], &[])?;
            self.forwards += head.forwards() - before;
        }
        let Self {
            name,
            cost,
            forwards,
            mismatches,
            verify_on,
            ..
        } = self;
        let inner: Box<dyn Draft + 'a> = match cost.as_mut() {
            Some((model, cache)) if !tokens.is_empty() && !context.is_empty() => {
                let (spec, last) =
                    cost_forwards(model.as_ref(), cache, context, &tokens, forwards)?;
                let queued = if request.queued {
                    let last = match verify_on {
                        Some(device) => last.to_device(device)?,
                        None => last,
                    };
                    Some(last.ids().device().clone())
                } else {
                    last.to_vec()?;
                    None
                };
                let mut block = Vec::with_capacity(tokens.len() + 1);
                block.extend(context.last().copied());
                block.extend_from_slice(&tokens);
                Box::new(CostDraft {
                    spec,
                    block,
                    queued,
                })
            }
            _ => Box::new(FixedDraft::Chain(tokens)),
        };
        Ok(Box::new(Checked {
            inner,
            kept,
            at,
            name: name.as_str(),
            log: mismatches,
        }))
    }

    fn forwards(&self) -> usize {
        self.forwards
    }
}

/// The cost model's forwards for a proposal of `tokens` after `context`, the same as a greedy
/// draft model's: the committed tokens it has not seen, then every proposal but the last
/// inside a speculation, each forward's argmax taken on the device (as
/// [`super::ModelDrafter`] feeds it to the next step there). Returns the speculation and the
/// last argmax, unread.
fn cost_forwards<'c, M: LanguageModel>(
    model: &M,
    cache: &'c mut ModelCache,
    context: &[u32],
    tokens: &[u32],
    forwards: &mut usize,
) -> Result<(Speculation<'c>, DeviceTokens)> {
    if cache.offset() >= context.len() {
        cache.reset();
    }
    let unseen = &context[cache.offset()..];
    let mut last = model.forward_argmax(StepIds::Host(unseen), cache, true)?;
    *forwards += 1;
    let mut spec = cache.speculate()?;
    for &t in &tokens[..tokens.len() - 1] {
        last = model.forward_argmax(StepIds::Host(&[t]), spec.cache(), true)?;
        *forwards += 1;
    }
    Ok((spec, last))
}
