//! A fresh generation through the engine's one entry point, as the tests' runs start: the
//! cache emptied and the drafter reset, so no run reuses what an earlier one left.
use rand::rngs::StdRng;
use specdec::cache::ModelCache;
use specdec::speculative::{
    generate, CachedSequence, Drafting, GammaPolicy, GenParams, GenerationRecord, LanguageModel,
    SamplingParams,
};
use specdec::Result;

/// [`generate`] from an empty `cache` (given back afterwards) and a reset drafter.
pub fn fresh<M: LanguageModel>(
    target: &M,
    cache: &mut ModelCache,
    prompt: &[u32],
    params: &GenParams,
    mut drafting: Drafting<'_>,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    if let Drafting::Speculative { drafter, .. } = &mut drafting {
        drafter.reset()?;
    }
    let taken = std::mem::replace(cache, ModelCache::new(Vec::new()));
    let mut seq = CachedSequence::new(taken);
    let record = generate(target, &mut seq, prompt, params, drafting, rng);
    *cache = seq.into_cache();
    record
}

/// Greedy generation of `max_new_tokens` tokens, `gamma` drafts a step, past any EOS.
pub fn greedy(max_new_tokens: usize, gamma: usize) -> GenParams {
    GenParams {
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(gamma),
        stop_at_eos: false,
    }
}
