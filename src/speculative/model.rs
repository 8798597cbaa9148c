//! What the engine needs of a model: [`LanguageModel`].
use candle_core::Tensor;

use crate::cache::{ModelCache, RotatingStrategy};
use crate::error::Result;
use crate::nn::{DeviceTokens, StepIds};

/// What the engine needs of a model: weights behind `&self`, per-sequence state in the cache.
pub trait LanguageModel {
    /// Logits `[tokens.len(), vocab]` (f32) for every input position; appends to `cache`.
    fn forward(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor>;
    /// Logits `[1, vocab]` of the last position only (prefill, drafting); appends to `cache`
    /// like [`Self::forward`]. The default narrows a full forward; models override it to skip
    /// the LM head on the other rows.
    fn forward_last(&self, tokens: &[u32], cache: &mut ModelCache) -> Result<Tensor> {
        let logits = self.forward(tokens, cache)?;
        Ok(logits.narrow(0, logits.dim(0)? - 1, 1)?)
    }
    /// [`Self::forward_last`] over ids left on the device by a previous step (greedy
    /// drafting feeds each draft to the next step this way, reading back once per proposal).
    /// The default reads them back; models take them where they are.
    fn forward_last_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.forward_last(&ids.to_vec()?, cache)
    }
    /// [`Self::forward`] over ids on the device (a greedy verification block: the last
    /// committed token, then drafts no host has read). The default reads them back; models
    /// take them where they are.
    fn forward_device(&self, ids: &DeviceTokens, cache: &mut ModelCache) -> Result<Tensor> {
        self.forward(&ids.to_vec()?, cache)
    }
    /// The greedy tokens of a forward over `ids` (host or device): the argmax of every
    /// position's logits, or of the last position's only when `last`, left on the device,
    /// the cache growing as for [`Self::forward`]. Always [`DeviceTokens::argmax`] of the
    /// matching forward's logits (which the default computes); a model may skip making the
    /// logits (a replayed CUDA graph ends in the argmax).
    fn forward_argmax(
        &self,
        ids: StepIds<'_>,
        cache: &mut ModelCache,
        last: bool,
    ) -> Result<DeviceTokens> {
        argmax_of_logits(self, ids, cache, last)
    }
    /// Empty caches for one sequence, rotating layers using `strategy`.
    fn new_cache(&self, strategy: RotatingStrategy) -> Result<ModelCache>;
    /// Size of the output distribution.
    fn vocab_size(&self) -> usize;
    /// Tokens that end a sequence.
    fn eos_token_ids(&self) -> &[u32];
}

/// [`LanguageModel::forward_argmax`] the plain way: [`DeviceTokens::argmax`] of the matching
/// logits forward.
pub fn argmax_of_logits<M: LanguageModel + ?Sized>(
    model: &M,
    ids: StepIds<'_>,
    cache: &mut ModelCache,
    last: bool,
) -> Result<DeviceTokens> {
    let logits = match (ids, last) {
        (StepIds::Host(t), true) => model.forward_last(t, cache)?,
        (StepIds::Host(t), false) => model.forward(t, cache)?,
        (StepIds::Device(d), true) => model.forward_last_device(d, cache)?,
        (StepIds::Device(d), false) => model.forward_device(d, cache)?,
    };
    DeviceTokens::argmax(&logits)
}
