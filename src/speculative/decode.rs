//! Autoregressive and chain-speculative decode loops.
use std::time::Instant;

use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::drafter::{Drafter, QueuedDraft, VerifyBlock};
use super::metrics::{GenerationRecord, StopReason};
use super::prefill::CachedSequence;
use super::sampling::{sample, SamplingParams};
use super::verify::{greedy_verdict, Lossless, Verifier};
use super::LanguageModel;
use crate::cache::ModelCache;
use crate::error::{Error, Result};
use crate::nn::{DeviceTokens, QueueMark, StepIds};

/// How many tokens to draft per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GammaPolicy {
    /// Always `γ`.
    Fixed(usize),
    /// Start at `start`; after a fully accepted step raise γ by 2, otherwise lower it by 1,
    /// within `[min, max]` (the schedule of transformers' "heuristic" assistant).
    Adaptive {
        /// Lower bound.
        min: usize,
        /// Upper bound.
        max: usize,
        /// First γ.
        start: usize,
    },
}

impl GammaPolicy {
    pub(super) fn first(&self) -> usize {
        match *self {
            GammaPolicy::Fixed(g) => g,
            GammaPolicy::Adaptive { start, min, max } => start.clamp(min, max),
        }
    }

    pub(super) fn next(&self, gamma: usize, proposed: usize, accepted: usize) -> usize {
        match *self {
            GammaPolicy::Fixed(g) => g,
            GammaPolicy::Adaptive { min, max, .. } if proposed > 0 && accepted == proposed => {
                (gamma + 2).clamp(min, max)
            }
            GammaPolicy::Adaptive { min, max, .. } => gamma.saturating_sub(1).clamp(min, max),
        }
    }
}

/// Settings of one generation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenParams {
    /// Most new tokens to produce.
    pub max_new_tokens: usize,
    /// Temperature, top-k, top-p, shared by target and draft.
    pub sampling: SamplingParams,
    /// Draft length per step (speculative decoding only).
    pub gamma: GammaPolicy,
    /// Stop at the model's end-of-sequence tokens.
    pub stop_at_eos: bool,
}

/// Samples the token after the last row of `logits` (`[n, vocab]`).
pub(super) fn next_token(
    logits: &Tensor,
    sampling: &SamplingParams,
    rng: &mut StdRng,
) -> Result<u32> {
    let last = logits.get(logits.dim(0)? - 1)?;
    if sampling.is_greedy() {
        return Ok(crate::nn::argmax_rows(&last.unsqueeze(0)?)?[0]);
    }
    let probs = sampling.probs(&last.to_dtype(DType::F32)?.to_vec1::<f32>()?);
    Ok(sample(&probs, rng) as u32)
}

/// Appends generated tokens one by one, stopping exactly at EOS or `max_new_tokens`.
pub(super) struct Output<'a> {
    pub(super) record: GenerationRecord,
    params: &'a GenParams,
    eos: &'a [u32],
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

/// Checks the input, brings the sequence's cache to the state after `prompt` (reusing what
/// it holds or its store has) and samples the first new token (not yet pushed to the output).
pub(super) fn prefill<'a, M: LanguageModel>(
    target: &'a M,
    seq: &mut CachedSequence,
    prompt: &[u32],
    params: &'a GenParams,
    rng: &mut StdRng,
) -> Result<(Output<'a>, u32)> {
    if prompt.is_empty() {
        return Err(Error::invalid("empty prompt: at least one token is needed"));
    }
    if params.max_new_tokens == 0 {
        return Err(Error::invalid("max_new_tokens must be at least 1"));
    }
    let start = Instant::now();
    let mut out = Output {
        record: GenerationRecord::default(),
        params,
        eos: target.eos_token_ids(),
    };
    let (logits, stats) = seq.prefill(target, prompt)?;
    let first = next_token(&logits, &params.sampling, rng)?;
    // One prefill forward however many checkpoints split it (τ counts decode forwards).
    out.record.target_forwards = stats.forwards.min(1);
    out.record.prefill_tokens_computed = stats.computed;
    out.record.prefill_tokens_reused = stats.reused;
    out.record.prefill_s = start.elapsed().as_secs_f64();
    out.record.ttft_s = out.record.prefill_s;
    Ok((out, first))
}

/// Runs `f` on `cache` wrapped in a fresh [`CachedSequence`] (so the cache is reset first).
pub(super) fn fresh_sequence<T>(
    cache: &mut ModelCache,
    f: impl FnOnce(&mut CachedSequence) -> Result<T>,
) -> Result<T> {
    let taken = std::mem::replace(cache, ModelCache::new(Vec::new()));
    let mut seq = CachedSequence::new(taken);
    let result = f(&mut seq);
    *cache = seq.into_cache();
    result
}

/// Plain decoding: one target forward per new token. The baseline every speedup is
/// measured against; `cache` is reset first.
pub fn autoregressive<M: LanguageModel>(
    target: &M,
    cache: &mut ModelCache,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    fresh_sequence(cache, |seq| {
        autoregressive_continue(target, seq, prompt, params, rng)
    })
}

/// The drafter's own pass over the prompt, booked as prefill (time to first token), not as
/// drafting: chain and tree loops alike.
pub(super) fn prefill_drafter(
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    record: &mut GenerationRecord,
) -> Result<()> {
    let start = Instant::now();
    drafter.prefill(prompt)?;
    let seconds = start.elapsed().as_secs_f64();
    record.prefill_s += seconds;
    record.ttft_s += seconds;
    Ok(())
}

/// [`autoregressive`] continuing from what `seq` holds: only the part of `prompt` (the whole
/// conversation so far) that the cache or the prefix store lacks is prefilled. Afterwards
/// `seq` holds every committed token but the last.
pub fn autoregressive_continue<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    let start = Instant::now();
    let (mut out, mut token) = prefill(target, seq, prompt, params, rng)?;
    while !out.push(token) {
        let t = Instant::now();
        token = if params.sampling.is_greedy() {
            // The argmax on the device (inside a replayed graph), the id read back.
            target
                .forward_argmax(StepIds::Host(&[token]), seq.cache_mut(), true)?
                .to_vec()?[0]
        } else {
            let logits = target.forward_last(&[token], seq.cache_mut())?;
            next_token(&logits, &params.sampling, rng)?
        };
        out.record.target_forwards += 1;
        out.record.verify_s += t.elapsed().as_secs_f64();
    }
    seq.finish(&[prompt, &out.record.output_ids].concat())?;
    out.record.wall_s = start.elapsed().as_secs_f64();
    Ok(out.record)
}

/// Chain speculative decoding: per step the drafter proposes up to γ tokens, the target
/// verifies `[last, d1..dγ]` in one forward inside a speculation, and the accepted prefix
/// plus one target token are committed. Greedy output equals [`autoregressive`]'s token for
/// token; sampled output follows the target's distribution. `cache` and the drafter are
/// reset first.
pub fn speculative<M: LanguageModel>(
    target: &M,
    cache: &mut ModelCache,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    speculative_with(target, cache, drafter, &Lossless, prompt, params, rng)
}

/// [`speculative`] with the verification step supplied by the caller (tests plug in
/// deliberately wrong verifiers to show the distribution tests catch them).
pub fn speculative_with<M: LanguageModel>(
    target: &M,
    cache: &mut ModelCache,
    drafter: &mut dyn Drafter,
    verifier: &dyn Verifier,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    drafter.reset()?;
    fresh_sequence(cache, |seq| {
        speculative_continue_with(target, seq, drafter, verifier, prompt, params, rng)
    })
}

/// [`speculative`] continuing from what `seq` and the drafter hold (neither is reset): only
/// the new part of `prompt` is prefilled, by the target and by a draft model. Afterwards
/// `seq` holds every committed token but the last.
pub fn speculative_continue<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    speculative_continue_with(target, seq, drafter, &Lossless, prompt, params, rng)
}

/// [`speculative_continue`] with the caller's verification step.
fn speculative_continue_with<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    drafter: &mut dyn Drafter,
    verifier: &dyn Verifier,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    speculative_loop(target, seq, drafter, prompt, params, rng, |step| {
        let t_draft = Instant::now();
        if params.sampling.is_greedy() && verifier.greedy_is_argmax() && queued_verification() {
            if let Some(draft) =
                step.drafter
                    .propose_queued(step.context, step.max_drafts, step.rng)?
            {
                return verify_queued(target, step.seq, step.out, draft, t_draft);
            }
        }
        let draft =
            step.drafter
                .propose(step.context, step.max_drafts, &params.sampling, step.rng)?;
        let drafts = draft.tokens().to_vec();
        step.out.record.draft_s += t_draft.elapsed().as_secs_f64();

        let t_verify = Instant::now();
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.extend(step.context.last().copied());
        input.extend_from_slice(&drafts);
        let mut spec = step.seq.cache_mut().speculate()?;
        let logits = target.forward(&input, spec.cache())?;
        step.out.record.target_forwards += 1;
        let verdict =
            verifier.verify(&logits, &drafts, draft.probs(), &params.sampling, step.rng)?;
        let mut tokens = drafts[..verdict.accepted].to_vec();
        tokens.push(verdict.next);
        spec.commit(step.out.takes(&tokens))?;
        step.out.record.verify_s += t_verify.elapsed().as_secs_f64();

        let t_finish = Instant::now();
        draft.finish(verdict.accepted)?;
        step.out.record.draft_s += t_finish.elapsed().as_secs_f64();
        Ok(StepOutcome {
            tokens,
            proposed: drafts.len(),
            accepted: verdict.accepted,
        })
    })
}

/// Whether greedy steps may verify a [`QueuedDraft`] ([`verify_queued`]): yes unless
/// `SPECDEC_QUEUED_VERIFY=0` (read once; for comparisons in one build — the drafts are then
/// read back before the verification is queued, two round trips a step).
fn queued_verification() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SPECDEC_QUEUED_VERIFY").map_or(true, |v| v != "0"))
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
    seq: &mut CachedSequence,
    out: &mut Output<'_>,
    draft: Box<dyn QueuedDraft + '_>,
    t_step: Instant,
) -> Result<StepOutcome> {
    let check = |rows: usize| {
        if rows < 2 {
            return Err(Error::invalid(format!(
                "a verification block holds the last token and at least one draft, got {rows} ids"
            )));
        }
        Ok(())
    };
    let mut spec = seq.cache_mut().speculate()?;
    let (marks, drafts, best) = match draft.block() {
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
    out.record.target_forwards += 1;
    let read_s = t_step.elapsed().as_secs_f64();
    let verify_device_s = marks.0.seconds_to(&marks.1)?.min(read_s);
    out.record.draft_s += read_s - verify_device_s;

    let t_verdict = Instant::now();
    let verdict = greedy_verdict(&drafts, &best)?;
    let mut tokens = drafts[..verdict.accepted].to_vec();
    tokens.push(verdict.next);
    spec.commit(out.takes(&tokens))?;
    out.record.verify_s += verify_device_s + t_verdict.elapsed().as_secs_f64();

    let t_finish = Instant::now();
    draft.finish(&drafts, verdict.accepted)?;
    out.record.draft_s += t_finish.elapsed().as_secs_f64();
    Ok(StepOutcome {
        tokens,
        proposed: drafts.len(),
        accepted: verdict.accepted,
    })
}

/// What a speculative step hands its loop.
pub(super) struct Step<'s, 'o> {
    /// The target's cache and committed tokens (every committed token but the last).
    pub(super) seq: &'s mut CachedSequence,
    pub(super) drafter: &'s mut dyn Drafter,
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

/// The loop shared by chain and tree speculation: prefills the target and the drafter,
/// then runs `step` (draft, verify in one target forward, commit) until EOS or
/// `max_new_tokens`, recording each step and adapting γ; afterwards `seq` holds every
/// committed token but the last, and the record counts the drafter's forwards.
pub(super) fn speculative_loop<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
    mut step: impl FnMut(Step<'_, '_>) -> Result<StepOutcome>,
) -> Result<GenerationRecord> {
    let start = Instant::now();
    let draft_forwards = drafter.forwards();
    let (mut out, first) = prefill(target, seq, prompt, params, rng)?;
    prefill_drafter(drafter, prompt, &mut out.record)?;
    let mut context = prompt.to_vec();
    context.push(first);
    let mut gamma = params.gamma.first();
    let mut done = out.push(first);
    while !done {
        let remaining = params.max_new_tokens - out.record.output_ids.len();
        let outcome = step(Step {
            seq: &mut *seq,
            drafter: &mut *drafter,
            context: &context,
            max_drafts: gamma.min(remaining - 1),
            out: &mut out,
            rng: &mut *rng,
        })?;
        out.record.record_step(outcome.proposed, outcome.accepted);
        gamma = params.gamma.next(gamma, outcome.proposed, outcome.accepted);
        for token in outcome.tokens {
            context.push(token);
            if out.push(token) {
                done = true;
                break;
            }
        }
    }
    seq.finish(&context)?;
    out.record.draft_forwards = drafter.forwards() - draft_forwards;
    out.record.wall_s = start.elapsed().as_secs_f64();
    Ok(out.record)
}
