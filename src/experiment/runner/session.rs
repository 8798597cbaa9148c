//! What a sweep runs on: the target, the drafters by name and the encoded prompts.
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::Result;
use crate::speculative::ReferenceStore;

/// How one named drafter is built for each sweep point.
pub enum DraftSource<M> {
    /// A draft model (shared weights; each point gets fresh caches).
    Model {
        /// The draft model.
        model: Arc<M>,
        /// Stop drafting below this probability.
        confidence: Option<f32>,
    },
    /// The oracle: the target's greedy continuation kept with probability `alpha`.
    Oracle {
        /// Per-token acceptance.
        alpha: f64,
        /// A model whose forwards are run for their cost.
        cost: Option<Arc<M>>,
        /// Or an EAGLE-3 head whose greedy proposals are run for their cost.
        cost_head: Option<Arc<crate::nn::Eagle3Head>>,
        /// Greedy references by prompt, shared by the run's oracles.
        references: ReferenceStore,
    },
    /// An EAGLE-3 head over the target's hidden states (each point gets fresh caches).
    Eagle3 {
        /// The head.
        head: Arc<crate::nn::Eagle3Head>,
        /// Stop drafting below this probability.
        confidence: Option<f32>,
    },
    /// Prompt lookup.
    Ngram {
        /// Shortest suffix matched.
        min_ngram: usize,
        /// Longest suffix matched.
        max_ngram: usize,
    },
}

/// A prompt ready to generate from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPrompt {
    /// The dataset's id.
    pub id: String,
    /// The dataset's category, if any.
    pub category: Option<String>,
    /// Prompt tokens.
    pub tokens: Vec<u32>,
}

/// What the sweep runs on: the target, the drafters by name, the prompts, and a decoder
/// for `output_text`.
pub struct Session<'a, M> {
    /// The target model.
    pub target: Arc<M>,
    /// Where the target verifies (its rank 0's device): draft models placed elsewhere hand
    /// their chains there.
    pub target_device: candle_core::Device,
    /// Drafters by name (those the sweep uses).
    pub drafters: BTreeMap<String, DraftSource<M>>,
    /// The prompts, in dataset order.
    pub prompts: Vec<EncodedPrompt>,
    /// Token ids to text.
    pub decode: &'a dyn Fn(&[u32]) -> Result<String>,
}
