//! Settings of one generation.
use super::sampling::SamplingParams;

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
    pub(crate) fn first(&self) -> usize {
        match *self {
            GammaPolicy::Fixed(g) => g,
            GammaPolicy::Adaptive { start, min, max } => start.clamp(min, max),
        }
    }

    pub(crate) fn next(&self, gamma: usize, proposed: usize, accepted: usize) -> usize {
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
