//! One speculative step: draft, verify in ONE target forward, commit the accepted path. A
//! chain is the tree of width 1; a greedy chain left on the device is verified there.
//!
//! Protocol: the drafter proposes drafts after the committed sequence; the target runs one
//! forward over `[last, drafts…]` inside a [`crate::cache::Speculation`] (a tree's block with
//! its tree mask); verification accepts a root-to-node path and yields one more token (the
//! correction, or the bonus token); the target commits the path's K/V and the drafter keeps
//! its matching state.
use std::time::Instant;

use candle_core::Tensor;
use rand::rngs::StdRng;

use super::drafter::{DraftBlock, DraftRequest, Drafter, VerifyBlock};
use super::metrics::{GenerationRecord, StopReason};
use super::model::LanguageModel;
use super::params::GenParams;
use super::prefill::CachedSequence;
use super::tree::{verify_tree, DraftTree, TreeParams, TreeShape};
use super::verify::{greedy_verdict, Verifier};
use crate::cache::Speculation;
use crate::error::{Error, Result};
use crate::nn::{DeviceTokens, QueueMark, StepIds};

/// Appends generated tokens one by one, stopping exactly at EOS or `max_new_tokens`.
pub(super) struct Output<'a> {
    pub(super) record: GenerationRecord,
    pub(super) params: &'a GenParams,
    pub(super) eos: &'a [u32],
}

impl Output<'_> {
    /// Pushes `token`; returns true when the generation must stop.
    pub(super) fn push(&mut self, token: u32) -> bool {
        self.record.output_ids.push(token);
        if self.params.stop_at_eos && self.eos.contains(&token) {
            self.record.stop_reason = Some(StopReason::Eos);
        } else if self.record.output_ids.len() >= self.params.max_new_tokens {
            self.record.stop_reason = Some(StopReason::MaxTokens);
        }
        self.record.stop_reason.is_some()
    }

    /// How many of `tokens` [`Output::push`] would take before the generation stops (all of
    /// them when it does not stop).
    pub(super) fn takes(&self, tokens: &[u32]) -> usize {
        let room = self.params.max_new_tokens - self.record.output_ids.len();
        let eos = tokens
            .iter()
            .position(|t| self.params.stop_at_eos && self.eos.contains(t));
        tokens
            .len()
            .min(room)
            .min(eos.map_or(usize::MAX, |e| e + 1))
    }
}

/// What a speculative step hands its loop (besides the drafter).
pub(super) struct Step<'s, 'o> {
    /// The target's cache and committed tokens (every committed token but the last).
    pub(super) seq: &'s mut CachedSequence,
    /// Every committed token (prompt included).
    pub(super) context: &'s [u32],
    /// Most drafts (tree depth) the step may propose: γ, less near `max_new_tokens` (a step
    /// yields at most that many + 1 tokens).
    pub(super) max_drafts: usize,
    /// The output, for timings and [`Output::takes`].
    pub(super) out: &'s mut Output<'o>,
    pub(super) rng: &'s mut StdRng,
}

/// What a speculative step did.
pub(super) struct StepOutcome {
    /// The tokens it outputs: the accepted drafts, then the target's token. The target's
    /// cache must have kept the K/V of the first [`Output::takes`] of them but the last
    /// (whose K/V the next step computes): fewer than all when an EOS among the accepted
    /// drafts ends the generation, as the tokens after it are never output.
    pub(super) tokens: Vec<u32>,
    /// Drafts proposed (a tree's depth) and accepted (the accepted path's length).
    pub(super) proposed: usize,
    pub(super) accepted: usize,
}

/// The fixed rules of every step of one generation.
pub(super) struct StepRule<'a> {
    /// The drafts' shape (width 1: a chain).
    pub(super) tree: TreeParams,
    /// Decides a chain's accepted prefix.
    pub(super) verifier: &'a dyn Verifier,
    pub(super) params: &'a GenParams,
}

/// What the target decided of a proposal.
struct Decided {
    /// The drafts as verified (a tree's nodes in order).
    drafts: Vec<u32>,
    /// The accepted root-to-node path (node indices).
    path: Vec<usize>,
    /// The token after the path.
    next: u32,
    /// Drafts proposed: a chain's length, a tree's depth.
    proposed: usize,
}

impl Decided {
    /// The step's output tokens: the path's drafts, then the next token.
    fn tokens(&self) -> Vec<u32> {
        let mut tokens: Vec<u32> = self.path.iter().map(|&n| self.drafts[n]).collect();
        tokens.push(self.next);
        tokens
    }
}

/// One speculative step; its timings go to the output's record (drafting: proposing and the
/// drafter's finish; verification: the target's forward, the verdict and the commit).
pub(super) fn speculative_step<M: LanguageModel>(
    target: &M,
    rule: &StepRule<'_>,
    drafter: &mut dyn Drafter,
    mut step: Step<'_, '_>,
) -> Result<StepOutcome> {
    let sampling = rule.params.sampling;
    let request = DraftRequest {
        shape: TreeShape {
            depth: step.max_drafts,
            width: rule.tree.width,
            budget: rule.tree.budget,
        },
        sampling,
        queued: sampling.is_greedy()
            && rule.verifier.greedy_is_argmax()
            && crate::engine::get().queued_verify,
    };
    let t_draft = Instant::now();
    let draft = drafter.propose(step.context, &request, step.rng)?;
    let decided = match draft.block() {
        DraftBlock::Queued(block) => verify_queued(target, &mut step, block, t_draft)?,
        DraftBlock::Chain { tokens, probs } => on_host(&mut step, t_draft, |step| {
            verify_chain(target, rule, step, tokens, probs)
        })?,
        DraftBlock::Tree(tree) => on_host(&mut step, t_draft, |step| {
            verify_tree_block(target, rule, step, tree)
        })?,
    };
    let t_finish = Instant::now();
    draft.finish(&decided.drafts, &decided.path)?;
    hand_over_hidden(step.seq, drafter)?;
    step.out.record.draft_s += t_finish.elapsed().as_secs_f64();
    Ok(StepOutcome {
        tokens: decided.tokens(),
        proposed: decided.proposed,
        accepted: decided.path.len(),
    })
}

/// Books the time since `t_draft` as drafting, then runs `verify` (drafts the host holds)
/// and books it as verification.
fn on_host<'s, 'o>(
    step: &mut Step<'s, 'o>,
    t_draft: Instant,
    verify: impl FnOnce(&mut Step<'s, 'o>) -> Result<Decided>,
) -> Result<Decided> {
    step.out.record.draft_s += t_draft.elapsed().as_secs_f64();
    let t_verify = Instant::now();
    let decided = verify(step)?;
    step.out.record.verify_s += t_verify.elapsed().as_secs_f64();
    Ok(decided)
}

/// The target's forward over `[last, drafts…]` inside a speculation of `seq`'s cache (with
/// `tree`'s mask for a tree), returning the speculation and the logits of every row.
fn forward_block<'c, M: LanguageModel>(
    target: &M,
    seq: &'c mut CachedSequence,
    context: &[u32],
    drafts: &[u32],
    tree: Option<&DraftTree>,
) -> Result<(Speculation<'c>, Tensor)> {
    let mut input = Vec::with_capacity(drafts.len() + 1);
    input.extend(context.last().copied());
    input.extend_from_slice(drafts);
    let mut spec = seq.cache_mut().speculate()?;
    if let Some(tree) = tree {
        spec.extend_tree(&tree.block_parents())?;
    }
    let logits = target.forward(&input, spec.cache())?;
    Ok((spec, logits))
}

/// A chain the host holds, verified by the rule's verifier; commits the accepted prefix and
/// the next token (cut where an EOS ends the generation).
fn verify_chain<M: LanguageModel>(
    target: &M,
    rule: &StepRule<'_>,
    step: &mut Step<'_, '_>,
    drafts: &[u32],
    probs: Option<&[Vec<f32>]>,
) -> Result<Decided> {
    let (spec, logits) = forward_block(target, step.seq, step.context, drafts, None)?;
    step.out.record.target_forwards += 1;
    let sampling = &rule.params.sampling;
    let verdict = rule
        .verifier
        .verify(&logits, drafts, probs, sampling, step.rng)?;
    let decided = Decided {
        drafts: drafts.to_vec(),
        path: (0..verdict.accepted).collect(),
        next: verdict.next,
        proposed: drafts.len(),
    };
    spec.commit(step.out.takes(&decided.tokens()))?;
    Ok(decided)
}

/// A tree, verified by [`verify_tree`]; commits the root and the accepted path (moved into
/// consecutive cache slots), cut where an EOS ends the generation.
fn verify_tree_block<M: LanguageModel>(
    target: &M,
    rule: &StepRule<'_>,
    step: &mut Step<'_, '_>,
    tree: &DraftTree,
) -> Result<Decided> {
    let (spec, logits) = forward_block(target, step.seq, step.context, &tree.tokens, Some(tree))?;
    step.out.record.target_forwards += 1;
    let sampling = &rule.params.sampling;
    let verdict = verify_tree(&logits, tree, sampling, rule.tree.residual, step.rng)?;
    let block_path = verdict.block_path();
    let decided = Decided {
        drafts: tree.tokens.clone(),
        path: verdict.path,
        next: verdict.next,
        proposed: tree.depth(),
    };
    spec.commit_path(&block_path[..step.out.takes(&decided.tokens())])?;
    Ok(decided)
}

/// A greedy step whose proposal's device work was queued, not waited for: the target's
/// verification of `[last, d1..dγ]` is queued behind it, each row's argmax is taken on the
/// device, and one read-back brings the argmaxes (with the drafts, where they lie on the
/// device) — the step's one device → host round trip; [`greedy_verdict`] then decides on the
/// host. The same tokens and commits as the host path (the same argmax; see
/// [`crate::nn::argmax_rows`]).
///
/// Booking: the host cannot see where the drafting ends on the device, so a [`QueueMark`]
/// before and after the verification's device work splits the step: the verification is the
/// device's time between them plus the host's acceptance test and commit, drafting the rest.
fn verify_queued<M: LanguageModel>(
    target: &M,
    step: &mut Step<'_, '_>,
    block: VerifyBlock<'_>,
    t_step: Instant,
) -> Result<Decided> {
    let check = |rows: usize| {
        if rows < 2 {
            return Err(Error::invalid(format!(
                "a verification block holds the last token and at least one draft, got {rows} ids"
            )));
        }
        Ok(())
    };
    let mut spec = step.seq.cache_mut().speculate()?;
    let (marks, drafts, best) = match block {
        VerifyBlock::Device(block) => {
            check(block.len())?;
            let device = block.ids().device();
            let drafted = QueueMark::record(device)?;
            let best = target.forward_argmax(StepIds::Device(block), spec.cache(), false)?;
            let both = DeviceTokens::cat(&[block.clone(), best])?;
            let verified = QueueMark::record(device)?;
            let mut both = both.to_vec()?;
            let best = both.split_off(block.len());
            both.remove(0);
            ((drafted, verified), both, best)
        }
        VerifyBlock::Host { ids, device } => {
            check(ids.len())?;
            let drafted = QueueMark::record(device)?;
            let best = target.forward_argmax(StepIds::Host(ids), spec.cache(), false)?;
            let verified = QueueMark::record(device)?;
            ((drafted, verified), ids[1..].to_vec(), best.to_vec()?)
        }
    };
    step.out.record.target_forwards += 1;
    let read_s = t_step.elapsed().as_secs_f64();
    let verify_device_s = marks.0.seconds_to(&marks.1)?.min(read_s);
    step.out.record.draft_s += read_s - verify_device_s;

    let t_verdict = Instant::now();
    let verdict = greedy_verdict(&drafts, &best)?;
    let decided = Decided {
        proposed: drafts.len(),
        path: (0..verdict.accepted).collect(),
        next: verdict.next,
        drafts,
    };
    spec.commit(step.out.takes(&decided.tokens()))?;
    step.out.record.verify_s += verify_device_s + t_verdict.elapsed().as_secs_f64();
    Ok(decided)
}

/// Hands the drafter the target's hidden states its cache recorded since the last call
/// (see [`Drafter::read_target`]).
pub(super) fn hand_over_hidden(seq: &mut CachedSequence, drafter: &mut dyn Drafter) -> Result<()> {
    if let Some((start, states)) = seq.cache_mut().take_hidden()? {
        drafter.read_target(start, states)?;
    }
    Ok(())
}
