//! The speculative decoding engine: drafters, lossless verification, decode loops, metrics.
//!
//! One entry point, [`generate`], and one step body (`step.rs`) for chains and trees alike (a
//! chain is the tree of width 1). Protocol of one speculative step:
//! 1. the drafter proposes drafts after the committed sequence: a chain `d1..dγ` or a tree
//!    of depth ≤ γ ([`Drafter::propose`], one [`Draft`] handle);
//! 2. the target runs ONE forward over `[last, drafts…]` inside a
//!    [`crate::cache::Speculation`] (greedy chains left on the device are verified there);
//! 3. verification accepts a root-to-node path and yields one more token (the correction,
//!    or the bonus token when all were accepted);
//! 4. the target commits the path and the drafter keeps its matching state.
//!
//! Invariant between steps: the target cache holds every committed token but the last one.

mod decode;
mod drafter;
mod eagle3;
mod metrics;
mod model;
mod ngram;
mod ngram_tree;
mod oracle;
mod params;
mod prefill;
mod sampling;
mod step;
mod tree;
mod tree_bound;
mod tree_draft;
mod verify;

pub use decode::{generate, Drafting};
pub use drafter::{Draft, DraftBlock, DraftRequest, Drafter, ModelDrafter, VerifyBlock};
pub use eagle3::Eagle3Drafter;
pub use metrics::{GenerationRecord, StopReason};
pub use model::{argmax_of_logits, LanguageModel};
pub use ngram::NgramDrafter;
pub use oracle::{OracleDrafter, ReferenceStore};
pub use params::{GammaPolicy, GenParams};
pub use prefill::{CachedSequence, PrefillStats, DEFAULT_CHECKPOINT_EVERY};
pub use sampling::{argmax, sample, SamplingParams};
pub use tree::{verify_tree, DraftTree, ResidualRule, TreeParams, TreeShape, TreeVerdict};
pub use tree_bound::{draft_ranks, full_tree_steps};
pub use verify::{verify, Lossless, Verdict, Verifier};
