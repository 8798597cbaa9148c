//! [`PointSummary`]: what one sweep point measured, over all its generations.
use serde::Serialize;

use super::cost::{CostModel, TimeSplit};
use crate::experiment::sweep::SweepPoint;

/// The measurements of one sweep point over all prompts (sums, then ratios of sums).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointSummary {
    /// Index of the point.
    pub point: usize,
    /// The point's label.
    pub label: String,
    /// The point's settings.
    pub settings: SweepPoint,
    /// Generations run (prompts × repeats).
    pub prompts: usize,
    /// Repeats of every prompt.
    pub repeats: usize,
    /// New tokens, all prompts.
    pub new_tokens: usize,
    /// Target forwards, prefills included.
    pub target_forwards: usize,
    /// Draft-model forwards.
    pub draft_forwards: usize,
    /// Drafts proposed.
    pub proposed: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Verification steps.
    pub steps: usize,
    /// Wall seconds of all generations.
    pub wall_s: f64,
    /// Drafting seconds.
    pub draft_s: f64,
    /// Target seconds after prefill.
    pub verify_s: f64,
    /// Prefill seconds (target, and draft model where there is one): time to first token.
    pub prefill_s: f64,
    /// Seconds outside prefill, drafting and verification.
    pub other_s: f64,
    /// α = accepted / proposed (None when nothing was proposed).
    pub alpha: Option<f64>,
    /// τ = (new tokens − prompts) / (target forwards − prompts): tokens per decode-phase
    /// target forward, the prefill forward and the token it yields left out (1 for
    /// autoregressive decoding).
    pub tau: Option<f64>,
    /// `[i]`: accepted_at[i] / proposed_at[i], P(draft i+1 accepted | it was proposed).
    pub acceptance_at: Vec<f64>,
    /// Mean drafts proposed per step.
    pub mean_proposed: Option<f64>,
    /// Median over repeats of (new tokens / wall seconds) of each repeat's prompts.
    pub tokens_per_s: f64,
    /// Median over (repeat, prompt) pairs of tokens/s / tokens/s of the same prompt and
    /// repeat at the autoregressive point with the same sampling, cache and engine
    /// options.
    pub speedup: Option<f64>,
    /// 95% bootstrap interval of `speedup`: (low, high).
    pub speedup_interval: Option<(f64, f64)>,
    /// Paired (repeat, prompt) ratios behind `speedup`.
    pub pairs: usize,
    /// Like `speedup`, for the decode phase only (tokens after the first / (wall − prefill)).
    pub decode_speedup: Option<f64>,
    /// The time-accounting cost model (speculative points with a baseline).
    pub cost: Option<CostModel>,
    /// c = seconds per draft forward / seconds per autoregressive target forward.
    pub cost_ratio: Option<f64>,
    /// Leviathan et al.: (1 − α^(γ+1)) / ((1 − α)(γc + 1)); assumes v = 1.
    pub predicted_speedup: Option<f64>,
}

impl PointSummary {
    /// A summary of `point` with nothing measured yet.
    pub fn empty(index: usize, point: &SweepPoint) -> Self {
        Self {
            point: index,
            label: point.label(),
            settings: point.clone(),
            prompts: 0,
            repeats: 0,
            new_tokens: 0,
            target_forwards: 0,
            draft_forwards: 0,
            proposed: 0,
            accepted: 0,
            steps: 0,
            wall_s: 0.0,
            draft_s: 0.0,
            verify_s: 0.0,
            prefill_s: 0.0,
            other_s: 0.0,
            alpha: None,
            tau: None,
            acceptance_at: Vec::new(),
            mean_proposed: None,
            tokens_per_s: 0.0,
            speedup: None,
            speedup_interval: None,
            pairs: 0,
            decode_speedup: None,
            cost: None,
            cost_ratio: None,
            predicted_speedup: None,
        }
    }
}

impl PointSummary {
    /// Where the point's wall seconds went.
    pub fn time(&self) -> TimeSplit {
        TimeSplit {
            wall_s: self.wall_s,
            prefill_s: self.prefill_s,
            other_s: self.other_s,
        }
    }
}

/// `num / den`, `None` unless `den > 0`.
pub(crate) fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then(|| num / den)
}
