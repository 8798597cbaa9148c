//! One line of `results.jsonl` ([`ResultRecord`]), and the observer told about each.
use serde::{Deserialize, Serialize};

use super::session::EncodedPrompt;
use crate::error::Result;
use crate::experiment::sweep::SweepPoint;
use crate::speculative::GenerationRecord;

/// One line of `results.jsonl`: a sweep point, a prompt, and what its generation measured.
/// The point's settings and the generation's record are flattened into the line, so each
/// field is a top-level JSON key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    /// Index of the sweep point (summary row).
    pub point: usize,
    /// The point's label.
    pub label: String,
    /// The point's settings (method, drafter, γ, sampling, cache).
    #[serde(flatten)]
    pub settings: SweepPoint,
    /// The dataset's prompt id.
    pub prompt_id: String,
    /// The user turn generated for (1 = the first; later turns continue the conversation).
    #[serde(default = "first_turn")]
    pub turn: usize,
    /// The dataset's category.
    pub category: Option<String>,
    /// Seed of this generation's RNG.
    pub seed: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens, acceptance and timings of the generation.
    #[serde(flatten)]
    pub generation: GenerationRecord,
    /// `output_ids` decoded (special tokens kept).
    pub output_text: String,
    /// `output_ids.len()`.
    pub new_tokens: usize,
    /// `new_tokens / wall_s`.
    pub tokens_per_s: f64,
    /// Repeat of this generation, from 0 (see `repeats`).
    #[serde(default)]
    pub repeat: usize,
    /// Position of this generation in the run's order, from 0 (see `order`).
    #[serde(default)]
    pub sequence: usize,
}

fn first_turn() -> usize {
    1
}

impl ResultRecord {
    pub(super) fn new(
        point_index: usize,
        point: &SweepPoint,
        prompt: &EncodedPrompt,
        seed: u64,
    ) -> Self {
        Self {
            point: point_index,
            label: point.label(),
            settings: point.clone(),
            prompt_id: prompt.id.clone(),
            turn: 1,
            category: prompt.category.clone(),
            seed,
            prompt_tokens: prompt.tokens.len(),
            generation: GenerationRecord::default(),
            output_text: String::new(),
            new_tokens: 0,
            tokens_per_s: 0.0,
            repeat: 0,
            sequence: 0,
        }
    }

    pub(super) fn fill(&mut self, g: GenerationRecord, text: String) {
        self.new_tokens = g.new_tokens();
        self.tokens_per_s = g.tokens_per_s();
        self.output_text = text;
        self.generation = g;
    }
}

/// Told about the sweep's progress; the default methods do nothing.
pub trait SweepObserver {
    /// Point `index` of `total` is about to run.
    fn point_started(&mut self, _index: usize, _total: usize, _point: &SweepPoint) {}
    /// A generation finished; an error aborts the sweep (e.g. the results file is unwritable).
    fn record(&mut self, _record: &ResultRecord) -> Result<()> {
        Ok(())
    }
}
