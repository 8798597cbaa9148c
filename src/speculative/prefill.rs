//! Prefill that reuses what is already computed: the committed state a cache kept from the
//! previous generation (a conversation's earlier turns) and, optionally, a [`PrefixStore`].
use candle_core::Tensor;

use super::model::LanguageModel;
use crate::cache::{ModelCache, PrefixStore};
use crate::error::{Error, Result};

/// Longest run of prompt tokens fed to a model in one forward. A forward over `n` tokens
/// materialises `n × keys` attention scores per head, so a whole 4,000-token prompt took
/// ~256 MiB per layer and ~15 s on the default target (quadratic); pieces keep prefill linear
/// in memory and far faster, and the cache makes the result the same.
pub(crate) const PREFILL_CHUNK: usize = 512;

/// Default distance between sliding-window checkpoints in a prefix store, in tokens.
pub const DEFAULT_CHECKPOINT_EVERY: usize = 256;

/// Tokens of one prefill: run through the model, or taken from a cache or the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefillStats {
    /// Prompt tokens run through the model.
    pub computed: usize,
    /// Prompt tokens whose state was kept or restored instead.
    pub reused: usize,
    /// Model forwards run (more than one when the prefill stops at checkpoints).
    pub forwards: usize,
}

/// One model's cache kept between generations, with the tokens it holds, so that a later
/// prompt starting with them prefills only the rest; optionally backed by a prefix store
/// shared by every prompt this sequence runs.
///
/// Invariant: `tokens` is a prefix of what the cache holds (`cache.offset() >= tokens.len()`;
/// a decode loop leaves the cache ahead until [`CachedSequence::finish`]).
#[derive(Debug)]
pub struct CachedSequence {
    cache: ModelCache,
    tokens: Vec<u32>,
    store: Option<PrefixStore>,
    checkpoint_every: usize,
}

impl CachedSequence {
    /// A sequence over `cache`, which is treated as empty.
    pub fn new(mut cache: ModelCache) -> Self {
        cache.reset();
        Self {
            cache,
            tokens: Vec::new(),
            store: None,
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
        }
    }

    /// Adds a prefix store; models with rotating layers checkpoint every `checkpoint_every`
    /// tokens of a prefill (at least 1).
    pub fn with_store(mut self, store: PrefixStore, checkpoint_every: usize) -> Self {
        self.set_store(store, checkpoint_every);
        self
    }

    /// Like [`CachedSequence::with_store`], in place.
    pub fn set_store(&mut self, store: PrefixStore, checkpoint_every: usize) {
        self.store = Some(store);
        self.checkpoint_every = checkpoint_every.max(1);
    }

    /// The cache.
    pub fn cache(&self) -> &ModelCache {
        &self.cache
    }

    /// The cache, for a decode loop's forwards; the held tokens are settled by
    /// [`CachedSequence::finish`].
    pub(crate) fn cache_mut(&mut self) -> &mut ModelCache {
        &mut self.cache
    }

    /// Gives the cache back.
    pub fn into_cache(self) -> ModelCache {
        self.cache
    }

    /// Tokens known to be held by the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The prefix store, if any.
    pub fn store(&self) -> Option<&PrefixStore> {
        self.store.as_ref()
    }

    /// The prefix store, if any, for eviction or inspection.
    pub fn store_mut(&mut self) -> Option<&mut PrefixStore> {
        self.store.as_mut()
    }

    /// Forgets the held tokens and empties the cache (the store is kept).
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.cache.reset();
    }

    /// Brings the cache to the state after `prompt` and returns the last position's logits
    /// (`[1, vocab]`). Reuses the longest of: the held tokens shared with `prompt` (rewound
    /// to), the store's longest stored prefix (restored; not while the cache hands out hidden
    /// states, which a store does not keep); the rest is run through `model`,
    /// in chunks ending at checkpoints when a store holds rotating layers, each checkpoint
    /// then stored. A refused rewind or restore falls back to a full prefill. On error the
    /// sequence is reset.
    pub fn prefill<M: LanguageModel + ?Sized>(
        &mut self,
        model: &M,
        prompt: &[u32],
    ) -> Result<(Tensor, PrefillStats)> {
        if prompt.is_empty() {
            return Err(Error::invalid("empty prompt: at least one token is needed"));
        }
        let result = self.prefill_unguarded(model, prompt);
        if result.is_err() {
            self.reset();
        }
        result
    }

    fn prefill_unguarded<M: LanguageModel + ?Sized>(
        &mut self,
        model: &M,
        prompt: &[u32],
    ) -> Result<(Tensor, PrefillStats)> {
        let base = self.reuse(prompt);
        // The cache now holds `prompt[..base]`, whether kept or restored from the store.
        self.tokens.clear();
        self.tokens.extend_from_slice(&prompt[..base]);
        let mut at = base;
        let mut logits = None;
        let mut forwards = 0;
        for end in self.chunk_ends(prompt, base) {
            // Counted as one forward (τ and c count logical forwards), run in pieces.
            for piece in prompt[at..end].chunks(PREFILL_CHUNK) {
                logits = Some(model.forward_last(piece, &mut self.cache)?);
            }
            forwards += 1;
            at = end;
            self.tokens
                .extend_from_slice(&prompt[..end][self.tokens.len()..]);
            if let Some(store) = self.store.as_mut() {
                store.insert(&self.tokens, &self.cache)?;
            }
        }
        let logits = logits.ok_or_else(|| Error::invalid("prefill ran no forward"))?;
        let stats = PrefillStats {
            computed: prompt.len() - base,
            reused: base,
            forwards,
        };
        Ok((logits, stats))
    }

    /// Brings the cache to the longest reusable prefix of `prompt` (at most all but its last
    /// token) and returns its length; 0 with the cache reset when nothing can be reused.
    fn reuse(&mut self, prompt: &[u32]) -> usize {
        let shared = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        // Rewinding the live state is refused when a ring no longer holds the window.
        let mut base = match shared > 0 && self.cache.restore(None, shared).is_ok() {
            true => shared,
            false => 0,
        };
        // A stored prefix holds no hidden states: a cache that hands them out (to a drafter
        // reading the target's states) computes what it does not hold.
        let store = self
            .store
            .as_mut()
            .filter(|_| self.cache.hidden_layers().is_none());
        if let Some(store) = store {
            // A refusal leaves the cache unchanged or poisoned (then reset below).
            if let Ok(len @ 1..) = store.restore(prompt, base, &mut self.cache) {
                base = len;
            }
        }
        if base == 0 || self.cache.is_poisoned() {
            self.cache.reset();
            base = 0;
        }
        base
    }

    /// Where the forwards of a prefill of `prompt[base..]` end: only at the prompt's end,
    /// unless a store must hold checkpoints it cannot cut later (rotating layers): then also
    /// at every multiple of `checkpoint_every` and where the prompt leaves the stored text.
    fn chunk_ends(&self, prompt: &[u32], base: usize) -> Vec<usize> {
        let n = prompt.len();
        let mut ends = vec![n];
        if let Some(store) = self
            .store
            .as_ref()
            .filter(|_| self.cache.has_rotating_layers())
        {
            let every = self.checkpoint_every;
            ends.extend(
                (base / every + 1..)
                    .map(|k| k * every)
                    .take_while(|&c| c < n),
            );
            let shared = store.shared_len(prompt);
            if shared > base && shared < n {
                ends.push(shared);
            }
        }
        ends.sort_unstable();
        ends.dedup();
        ends
    }

    /// Records that the cache now holds the first `cache.offset()` of `committed` (after a
    /// decode loop: every committed token but the last) and stores that state in the prefix
    /// store, a turn-boundary checkpoint. Refused, with the sequence reset, when the cache
    /// holds more tokens than `committed`.
    pub(crate) fn finish(&mut self, committed: &[u32]) -> Result<()> {
        let held = self.cache.offset();
        if held > committed.len() {
            self.reset();
            return Err(Error::invalid(format!(
                "cache holds {held} tokens but only {} were committed",
                committed.len()
            )));
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(&committed[..held]);
        if let Some(store) = self.store.as_mut() {
            store.insert(&self.tokens, &self.cache)?;
        }
        Ok(())
    }

    /// The cache and the held tokens, for a drafter that appends to both.
    pub(crate) fn parts(&mut self) -> (&mut ModelCache, &mut Vec<u32>) {
        (&mut self.cache, &mut self.tokens)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use candle_core::{Device, Tensor};

    use super::{CachedSequence, PREFILL_CHUNK};
    use crate::cache::{ModelCache, RotatingStrategy};
    use crate::error::Result;
    use crate::speculative::model::LanguageModel;

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
    fn prefill_feeds_every_token_once_in_order_in_bounded_pieces() {
        let c = PREFILL_CHUNK;
        for n in [1, 2, c - 1, c, c + 1, 3 * c, 4000] {
            let tape = Tape(RefCell::new(Vec::new()));
            let prompt: Vec<u32> = (0..n as u32).collect();
            let mut seq = CachedSequence::new(ModelCache::new(Vec::new()));
            let (logits, stats) = seq.prefill(&tape, &prompt).unwrap();
            assert_eq!(logits.to_vec2::<f32>().unwrap(), [[(n - 1) as f32]], "{n}");
            assert_eq!((stats.computed, stats.forwards), (n, 1), "{n}");
            let calls = tape.0.into_inner();
            assert_eq!(calls.concat(), prompt, "{n}");
            assert!(calls.iter().all(|t| (1..=c).contains(&t.len())), "{n}");
            assert_eq!(calls.len(), n.div_ceil(c), "{n}");
        }
    }
}
