//! The decode entry point [`generate`] and its two loops: plain and speculative.
use std::time::Instant;

use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::drafter::Drafter;
use super::metrics::GenerationRecord;
use super::model::LanguageModel;
use super::params::GenParams;
use super::prefill::CachedSequence;
use super::sampling::{sample, SamplingParams};
use super::step::{speculative_step, Output, Step, StepRule};
use super::tree::TreeParams;
use super::verify::{Lossless, Verifier};
use crate::error::{Error, Result};
use crate::nn::StepIds;

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

/// How a generation finds its tokens.
pub enum Drafting<'a> {
    /// Plain decoding: one target forward per new token. The baseline every speedup is
    /// measured against.
    None,
    /// Speculation: per step `drafter` proposes a tree of depth ≤ γ shaped by `tree` (width
    /// 1: a chain), the target verifies `[last, drafts…]` in ONE forward inside a
    /// speculation, and the accepted path plus one target token are committed.
    Speculative {
        /// Proposes the drafts.
        drafter: &'a mut dyn Drafter,
        /// The drafts' shape.
        tree: TreeParams,
        /// Decides the accepted chain ([`Lossless`]; tests plug in deliberately wrong ones
        /// to show the distribution tests catch them). Trees are verified by
        /// [`super::verify_tree`].
        verifier: &'a dyn Verifier,
    },
}

impl<'a> Drafting<'a> {
    /// Lossless chain speculation with `drafter`.
    pub fn chain(drafter: &'a mut dyn Drafter) -> Self {
        Self::tree(drafter, TreeParams::chain())
    }

    /// Lossless speculation with `drafter` drafting trees shaped by `tree`.
    pub fn tree(drafter: &'a mut dyn Drafter, tree: TreeParams) -> Self {
        Drafting::Speculative {
            drafter,
            tree,
            verifier: &Lossless,
        }
    }
}

/// Generates up to `params.max_new_tokens` tokens after `prompt` (the whole conversation
/// so far): the one decode entry point. Continues from what `seq` and the drafter hold:
/// only the part of `prompt` that the cache or the prefix store lacks is prefilled (by the
/// target and by a draft model); call [`CachedSequence::reset`] and [`Drafter::reset`]
/// first for a fresh start. Afterwards `seq` holds every committed token but the last.
///
/// Greedy speculative output equals greedy plain output token for token; sampled
/// speculative output follows the target's distribution.
pub fn generate<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    prompt: &[u32],
    params: &GenParams,
    drafting: Drafting<'_>,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    match drafting {
        Drafting::None => autoregressive(target, seq, prompt, params, rng),
        Drafting::Speculative {
            drafter,
            tree,
            verifier,
        } => {
            tree.check()?;
            let step = StepRule {
                tree,
                verifier,
                params,
            };
            speculative(target, seq, drafter, prompt, &step, rng)
        }
    }
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

/// Plain decoding: one target forward per new token (see [`Drafting::None`]).
fn autoregressive<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    prompt: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    let start = Instant::now();
    let recorded = crate::nn::recordings_made();
    seq.cache_mut().tap_hidden(None);
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
    out.record.graph_recordings = crate::nn::recordings_made() - recorded;
    out.record.wall_s = start.elapsed().as_secs_f64();
    Ok(out.record)
}

/// Speculative decoding: prefills the target and the drafter, then runs
/// [`speculative_step`] (draft, verify in one target forward, commit) until EOS or
/// `max_new_tokens`, recording each step and adapting γ; afterwards `seq` holds every
/// committed token but the last, and the record counts the drafter's forwards.
fn speculative<M: LanguageModel>(
    target: &M,
    seq: &mut CachedSequence,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    rule: &StepRule<'_>,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    let params = rule.params;
    let start = Instant::now();
    let recorded = crate::nn::recordings_made();
    let draft_forwards = drafter.forwards();
    seq.cache_mut().tap_hidden(drafter.target_layers());
    let (mut out, first) = prefill(target, seq, prompt, params, rng)?;
    super::step::hand_over_hidden(seq, drafter)?;
    prefill_drafter(drafter, prompt, &mut out.record)?;
    let mut context = prompt.to_vec();
    context.push(first);
    let mut gamma = params.gamma.first();
    let mut done = out.push(first);
    while !done {
        let remaining = params.max_new_tokens - out.record.output_ids.len();
        let outcome = speculative_step(
            target,
            rule,
            &mut *drafter,
            Step {
                seq: &mut *seq,
                context: &context,
                max_drafts: gamma.min(remaining - 1),
                out: &mut out,
                rng: &mut *rng,
            },
        )?;
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
    out.record.graph_recordings = crate::nn::recordings_made() - recorded;
    out.record.wall_s = start.elapsed().as_secs_f64();
    Ok(out.record)
}
