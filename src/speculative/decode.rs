//! Autoregressive and chain-speculative decode loops.
use std::time::Instant;

use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::drafter::Drafter;
use super::metrics::{GenerationRecord, StopReason};
use super::sampling::{sample, SamplingParams};
use super::verify::verify;
use super::LanguageModel;
use crate::cache::ModelCache;
use crate::error::{Error, Result};

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
    fn first(&self) -> usize {
        match *self {
            GammaPolicy::Fixed(g) => g,
            GammaPolicy::Adaptive { start, min, max } => start.clamp(min, max),
        }
    }

    fn next(&self, gamma: usize, proposed: usize, accepted: usize) -> usize {
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
fn next_token(logits: &Tensor, sampling: &SamplingParams, rng: &mut StdRng) -> Result<u32> {
    let last = logits.get(logits.dim(0)? - 1)?;
    if sampling.is_greedy() {
        return Ok(last.argmax(0)?.to_scalar::<u32>()?);
    }
    let probs = sampling.probs(&last.to_dtype(DType::F32)?.to_vec1::<f32>()?);
    Ok(sample(&probs, rng) as u32)
}

/// Appends generated tokens one by one, stopping exactly at EOS or `max_new_tokens`.
struct Output<'a> {
    record: GenerationRecord,
    params: &'a GenParams,
    eos: &'a [u32],
}

impl Output<'_> {
    /// Pushes `token`; returns true when the generation must stop.
    fn push(&mut self, token: u32) -> bool {
        self.record.output_ids.push(token);
        if self.params.stop_at_eos && self.eos.contains(&token) {
            self.record.stop_reason = Some(StopReason::Eos);
        } else if self.record.output_ids.len() >= self.params.max_new_tokens {
            self.record.stop_reason = Some(StopReason::MaxTokens);
        }
        self.record.stop_reason.is_some()
    }
}

/// Longest run of prompt tokens fed to a model in one forward. A forward over `n` tokens
/// materialises `n × keys` attention scores per head, so a whole 4,000-token prompt took
/// ~256 MiB per layer and ~15 s on the default target (quadratic); chunks keep prefill
/// linear in memory and far faster, and the cache makes the result the same.
pub(crate) const PREFILL_CHUNK: usize = 512;

/// Feeds `tokens` (non-empty) to `model` in chunks of at most [`PREFILL_CHUNK`] and returns
/// the logits of the last position (`[1, vocab]`).
pub(crate) fn prefill_last<M: LanguageModel>(
    model: &M,
    tokens: &[u32],
    cache: &mut ModelCache,
) -> Result<Tensor> {
    let (head, last) = tokens.split_at(tokens.len() - (tokens.len() - 1) % PREFILL_CHUNK - 1);
    for chunk in head.chunks(PREFILL_CHUNK) {
        model.forward_last(chunk, cache)?;
    }
    model.forward_last(last, cache)
}

/// Checks the input, resets `cache`, runs the target over the prompt and samples the first
/// new token (not yet pushed to the output).
fn prefill<'a, M: LanguageModel>(
    target: &'a M,
    cache: &mut ModelCache,
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
    cache.reset();
    let mut out = Output {
        record: GenerationRecord::default(),
        params,
        eos: target.eos_token_ids(),
    };
    let logits = prefill_last(target, prompt, cache)?;
    let first = next_token(&logits, &params.sampling, rng)?;
    out.record.target_forwards = 1;
    out.record.prefill_s = start.elapsed().as_secs_f64();
    Ok((out, first))
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
    let start = Instant::now();
    let (mut out, mut token) = prefill(target, cache, prompt, params, rng)?;
    while !out.push(token) {
        let t = Instant::now();
        let logits = target.forward_last(&[token], cache)?;
        token = next_token(&logits, &params.sampling, rng)?;
        out.record.target_forwards += 1;
        out.record.verify_s += t.elapsed().as_secs_f64();
    }
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
    let start = Instant::now();
    drafter.reset()?;
    let (mut out, first) = prefill(target, cache, prompt, params, rng)?;
    // The drafter's own pass over the prompt is prefill too: time to first token.
    let t_prefill = Instant::now();
    drafter.prefill(prompt)?;
    out.record.prefill_s += t_prefill.elapsed().as_secs_f64();
    let mut context = prompt.to_vec();
    context.push(first);
    let mut gamma = params.gamma.first();
    let mut done = out.push(first);
    while !done {
        // Never draft past max_new_tokens: a step yields at most γ + 1 tokens.
        let remaining = params.max_new_tokens - out.record.output_ids.len();
        let t_draft = Instant::now();
        let draft = drafter.propose(&context, gamma.min(remaining - 1), &params.sampling, rng)?;
        let drafts = draft.tokens().to_vec();
        out.record.draft_s += t_draft.elapsed().as_secs_f64();

        let t_verify = Instant::now();
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.extend(context.last().copied());
        input.extend_from_slice(&drafts);
        let mut spec = cache.speculate()?;
        let logits = target.forward(&input, spec.cache())?;
        out.record.target_forwards += 1;
        let verdict = verify(&logits, &drafts, draft.probs(), &params.sampling, rng)?;
        spec.commit(verdict.accepted + 1)?;
        out.record.verify_s += t_verify.elapsed().as_secs_f64();

        let t_finish = Instant::now();
        draft.finish(verdict.accepted)?;
        out.record.draft_s += t_finish.elapsed().as_secs_f64();

        out.record.record_step(drafts.len(), verdict.accepted);
        gamma = params.gamma.next(gamma, drafts.len(), verdict.accepted);
        for &token in drafts[..verdict.accepted].iter().chain([&verdict.next]) {
            context.push(token);
            if out.push(token) {
                done = true;
                break;
            }
        }
    }
    out.record.draft_forwards = drafter.forwards();
    out.record.wall_s = start.elapsed().as_secs_f64();
    Ok(out.record)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use candle_core::{Device, Tensor};

    use super::{prefill_last, PREFILL_CHUNK};
    use crate::cache::{ModelCache, RotatingStrategy};
    use crate::error::Result;
    use crate::speculative::LanguageModel;

    /// Records the tokens of every forward; its logits are the last token's id.
    struct Tape(RefCell<Vec<Vec<u32>>>);

    impl LanguageModel for Tape {
        fn forward(&self, tokens: &[u32], _: &mut ModelCache) -> Result<Tensor> {
            self.0.borrow_mut().push(tokens.to_vec());
            let ids: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
            Ok(Tensor::from_vec(ids, (tokens.len(), 1), &Device::Cpu)?)
        }
        fn new_cache(&self, _: RotatingStrategy) -> Result<ModelCache> {
            Ok(ModelCache::new(Vec::new()))
        }
        fn vocab_size(&self) -> usize {
            1
        }
        fn eos_token_ids(&self) -> &[u32] {
            &[]
        }
    }

    #[test]
    fn prefill_feeds_every_token_once_in_order_in_bounded_chunks() {
        let c = PREFILL_CHUNK;
        for n in [1, 2, c - 1, c, c + 1, 3 * c, 4000] {
            let tape = Tape(RefCell::new(Vec::new()));
            let prompt: Vec<u32> = (0..n as u32).collect();
            let logits = prefill_last(&tape, &prompt, &mut ModelCache::new(Vec::new())).unwrap();
            assert_eq!(logits.to_vec2::<f32>().unwrap(), [[(n - 1) as f32]], "{n}");
            let calls = tape.0.into_inner();
            assert_eq!(calls.concat(), prompt, "{n}");
            assert!(calls.iter().all(|t| (1..=c).contains(&t.len())), "{n}");
            assert_eq!(calls.len(), n.div_ceil(c), "{n}");
        }
    }
}
