//! Prompt-lookup drafting: copy what followed the last occurrence of the current n-gram.
use rand::rngs::StdRng;

use super::drafter::{Draft, DraftRequest, Drafter, FixedDraft};
use crate::error::{Error, Result};

/// Model-free drafter (Saxena 2023, "prompt lookup decoding"): finds the most recent earlier
/// occurrence of the last `n` tokens of the context, for `n` from `max_ngram` down to
/// `min_ngram`, and proposes the tokens that followed it.
#[derive(Debug, Clone)]
pub struct NgramDrafter {
    name: String,
    min_ngram: usize,
    max_ngram: usize,
}

impl NgramDrafter {
    /// A drafter matching n-grams of `min_ngram..=max_ngram` tokens (`1 <= min <= max`).
    pub fn new(name: impl Into<String>, min_ngram: usize, max_ngram: usize) -> Result<Self> {
        if min_ngram == 0 || min_ngram > max_ngram {
            return Err(Error::invalid(format!(
                "n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}"
            )));
        }
        Ok(Self {
            name: name.into(),
            min_ngram,
            max_ngram,
        })
    }

    /// Smallest n-gram matched.
    pub fn min_ngram(&self) -> usize {
        self.min_ngram
    }

    /// Largest n-gram matched.
    pub fn max_ngram(&self) -> usize {
        self.max_ngram
    }

    /// Up to `max` tokens that followed the latest earlier match of the context's suffix.
    pub fn lookup(&self, context: &[u32], max: usize) -> Vec<u32> {
        if max == 0 {
            return Vec::new();
        }
        for n in (self.min_ngram..=self.max_ngram).rev() {
            if context.len() <= n {
                continue;
            }
            let suffix = &context[context.len() - n..];
            // Latest start strictly before the suffix itself.
            for start in (0..context.len() - n).rev() {
                if &context[start..start + n] == suffix {
                    let from = start + n;
                    let to = (from + max).min(context.len());
                    return context[from..to].to_vec();
                }
            }
        }
        Vec::new()
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &str {
        &self.name
    }

    fn reset(&mut self) -> Result<()> {
        Ok(())
    }

    /// A chain: what followed the last match of the context's suffix; a tree: several
    /// continuations as a trie (see [`NgramDrafter::lookup_tree`]).
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        _rng: &mut StdRng,
    ) -> Result<Box<dyn Draft + 'a>> {
        Ok(Box::new(if request.is_chain() {
            FixedDraft::Chain(self.lookup(context, request.chain_len()))
        } else {
            FixedDraft::Tree(self.lookup_tree(context, request.shape))
        }))
    }

    fn forwards(&self) -> usize {
        0
    }
}
