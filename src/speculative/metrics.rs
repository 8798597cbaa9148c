//! What one generation records.
use serde::{Deserialize, Serialize};

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-sequence token was produced (it is the last output token).
    Eos,
    /// `max_new_tokens` were produced.
    MaxTokens,
}

/// Tokens and measurements of one generation (one prompt, one method).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationRecord {
    /// New tokens, the end-of-sequence token included when it stopped the generation.
    pub output_ids: Vec<u32>,
    /// Why it stopped (`None` only for an empty record).
    pub stop_reason: Option<StopReason>,
    /// Drafts accepted, per verification step.
    pub accepted: Vec<usize>,
    /// Drafts proposed, per verification step.
    pub proposed: Vec<usize>,
    /// `[i]`: steps in which draft position `i` was accepted.
    pub accepted_at: Vec<usize>,
    /// `[i]`: steps in which draft position `i` was proposed.
    pub proposed_at: Vec<usize>,
    /// Target forwards, prefill included.
    pub target_forwards: usize,
    /// Draft-model forwards (0 for model-free drafters), prefill included.
    pub draft_forwards: usize,
    /// Seconds in prefill (time to first token): the target's, and the draft model's pass
    /// over the prompt.
    pub prefill_s: f64,
    /// Seconds spent drafting (proposals and drafter commits).
    pub draft_s: f64,
    /// Seconds in target forwards after prefill, verification and target commits.
    pub verify_s: f64,
    /// Seconds for the whole generation.
    pub wall_s: f64,
    /// Seconds from the start of the generation to its first new token (the target's
    /// prefill and one sampling).
    #[serde(default)]
    pub ttft_s: f64,
    /// Prompt tokens the target's prefill ran through the model.
    #[serde(default)]
    pub prefill_tokens_computed: usize,
    /// Prompt tokens whose target state was kept from the previous turn or restored from a
    /// prefix store instead.
    #[serde(default)]
    pub prefill_tokens_reused: usize,
    /// CUDA graph steps recorded during the generation (see
    /// [`crate::nn::recordings_made`]): their recording time is inside its timings.
    /// 0 off CUDA, without graphs, and once every step it takes is recorded and kept.
    #[serde(default)]
    pub graph_recordings: usize,
}

impl GenerationRecord {
    /// New tokens produced.
    pub fn new_tokens(&self) -> usize {
        self.output_ids.len()
    }

    /// New tokens per second of wall time.
    pub fn tokens_per_s(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.new_tokens() as f64 / self.wall_s
        } else {
            0.0
        }
    }

    /// Seconds outside prefill, drafting and verification (sampling, bookkeeping).
    pub fn other_s(&self) -> f64 {
        (self.wall_s - self.prefill_s - self.draft_s - self.verify_s).max(0.0)
    }

    /// Records one verification step with `proposed` drafts of which `accepted` were kept.
    pub(crate) fn record_step(&mut self, proposed: usize, accepted: usize) {
        self.proposed.push(proposed);
        self.accepted.push(accepted);
        if self.proposed_at.len() < proposed {
            self.proposed_at.resize(proposed, 0);
            self.accepted_at.resize(proposed, 0);
        }
        for i in 0..proposed {
            self.proposed_at[i] += 1;
            if i < accepted {
                self.accepted_at[i] += 1;
            }
        }
    }
}
