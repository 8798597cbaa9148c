//! The drafter interface and the draft-model drafter.
use std::sync::Arc;

use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::sampling::{argmax, sample, SamplingParams};
use super::LanguageModel;
use crate::cache::{ModelCache, RotatingStrategy, Speculation};
use crate::error::Result;

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

/// Proposes continuations of a committed token sequence.
pub trait Drafter {
    /// A short name for reports.
    fn name(&self) -> &str;
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
    /// Model forwards run since the last reset.
    fn forwards(&self) -> usize;
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
pub struct ModelDrafter<M> {
    name: String,
    model: Arc<M>,
    cache: ModelCache,
    /// Stop drafting when the draft's probability of its own token falls below this.
    confidence: Option<f32>,
    forwards: usize,
}

impl<M: LanguageModel> ModelDrafter<M> {
    /// A drafter named `name` over `model`; rotating layers use `strategy`.
    pub fn new(
        name: impl Into<String>,
        model: Arc<M>,
        strategy: RotatingStrategy,
        confidence: Option<f32>,
    ) -> Result<Self> {
        let cache = model.new_cache(strategy)?;
        Ok(Self {
            name: name.into(),
            model,
            cache,
            confidence,
            forwards: 0,
        })
    }
}

/// Picks the draft token from the last row of `logits`; returns it with its distribution
/// (only when sampling) and the draft's probability of it.
fn pick(
    logits: &Tensor,
    sampling: &SamplingParams,
    rng: &mut StdRng,
    need_confidence: bool,
) -> Result<(u32, Option<Vec<f32>>, f32)> {
    let last = logits.get(logits.dim(0)? - 1)?;
    if sampling.is_greedy() && !need_confidence {
        let token = last.argmax(0)?.to_scalar::<u32>()?;
        return Ok((token, None, 1.0));
    }
    let row = last.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    if sampling.is_greedy() {
        let token = argmax(&row);
        let softmax = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::greedy()
        };
        let conf = softmax.probs(&row)[token];
        return Ok((token as u32, None, conf));
    }
    let q = sampling.probs(&row);
    let token = sample(&q, rng);
    let conf = q[token];
    Ok((token as u32, Some(q), conf))
}

struct ModelDraft<'a> {
    spec: Speculation<'a>,
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
    /// The speculation holds `d1..d(k-1)` (the last draft was never fed); keep the accepted
    /// ones. A fully accepted chain leaves `dk` to be fed with the next context.
    fn finish(self: Box<Self>, accepted: usize) -> Result<()> {
        let keep = accepted.min(self.spec.appended());
        self.spec.commit(keep)
    }
}

impl<M: LanguageModel> Drafter for ModelDrafter<M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn reset(&mut self) -> Result<()> {
        self.cache.reset();
        self.forwards = 0;
        Ok(())
    }

    /// Runs the draft model over the prompt; the first proposal then feeds only the tokens
    /// committed after it.
    fn prefill(&mut self, prompt: &[u32]) -> Result<()> {
        self.cache.reset();
        if !prompt.is_empty() {
            super::decode::prefill_last(self.model.as_ref(), prompt, &mut self.cache)?;
            self.forwards += 1;
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
        // Committed tokens the draft has not seen yet (at least the last one).
        if self.cache.offset() >= context.len() {
            self.cache.reset();
        }
        let fresh = &context[self.cache.offset()..];
        let logits = self.model.forward_last(fresh, &mut self.cache)?;
        self.forwards += 1;
        let mut tokens = Vec::with_capacity(max);
        let mut probs = (!sampling.is_greedy()).then(|| Vec::with_capacity(max));
        let need_conf = self.confidence.is_some();
        let threshold = self.confidence.unwrap_or(0.0);
        let (mut token, mut q, mut conf) = pick(&logits, sampling, rng, need_conf)?;
        let mut spec = self.cache.speculate()?;
        loop {
            if need_conf && conf < threshold && !tokens.is_empty() {
                break;
            }
            tokens.push(token);
            if let (Some(all), Some(q)) = (probs.as_mut(), q.take()) {
                all.push(q);
            }
            if tokens.len() == max {
                break;
            }
            let logits = self.model.forward_last(&[token], spec.cache())?;
            self.forwards += 1;
            (token, q, conf) = pick(&logits, sampling, rng, need_conf)?;
        }
        Ok(Box::new(ModelDraft {
            spec,
            tokens,
            probs,
        }))
    }

    fn forwards(&self) -> usize {
        self.forwards
    }
}
