//! Runs every sweep point on every prompt and produces one [`ResultRecord`] per pair.
use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::config::{CacheChoice, ExperimentConfig, GammaChoice, Method};
use super::sweep::{rotating_strategy, SweepPoint};
use crate::error::{Error, Result};
use crate::spec::{
    autoregressive, speculative, Drafter, GenParams, GenerationRecord, LanguageModel, ModelDrafter,
    NgramDrafter, SamplingParams, StopReason,
};

/// How one named drafter is built for each sweep point.
pub enum DraftSource<M> {
    /// A draft model (shared weights; each point gets fresh caches).
    Model {
        /// The draft model.
        model: Arc<M>,
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
    /// Drafters by name (those the sweep uses).
    pub drafters: BTreeMap<String, DraftSource<M>>,
    /// The prompts, in dataset order.
    pub prompts: Vec<EncodedPrompt>,
    /// Token ids to text.
    pub decode: &'a dyn Fn(&[u32]) -> Result<String>,
}

/// One line of `results.jsonl`: a sweep point, a prompt, and what its generation measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    /// Index of the sweep point (summary row).
    pub point: usize,
    /// The point's label.
    pub label: String,
    /// Decoding method.
    pub method: Method,
    /// Drafter name (speculative only).
    pub drafter: Option<String>,
    /// Draft length (speculative only): a number or "adaptive".
    pub gamma: Option<GammaChoice>,
    /// Temperature.
    pub temperature: f64,
    /// Top-k filter.
    pub top_k: usize,
    /// Nucleus filter.
    pub top_p: f64,
    /// Rotating-cache strategy.
    pub cache: CacheChoice,
    /// The dataset's prompt id.
    pub prompt_id: String,
    /// The dataset's category.
    pub category: Option<String>,
    /// Seed of this generation's RNG.
    pub seed: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (EOS included when it stopped the generation).
    pub output_ids: Vec<u32>,
    /// `output_ids` decoded (special tokens kept).
    pub output_text: String,
    /// `output_ids.len()`.
    pub new_tokens: usize,
    /// Drafts accepted per verification step.
    pub accepted: Vec<usize>,
    /// Drafts proposed per verification step.
    pub proposed: Vec<usize>,
    /// `[i]`: steps in which draft position `i` was accepted.
    pub accepted_at: Vec<usize>,
    /// `[i]`: steps in which draft position `i` was proposed.
    pub proposed_at: Vec<usize>,
    /// Target forwards, prefill included.
    pub target_forwards: usize,
    /// Draft-model forwards.
    pub draft_forwards: usize,
    /// Whole generation, seconds.
    pub wall_s: f64,
    /// Target prefill, seconds.
    pub prefill_s: f64,
    /// Drafting, seconds.
    pub draft_s: f64,
    /// Target forwards after prefill (verification), seconds.
    pub verify_s: f64,
    /// `new_tokens / wall_s`.
    pub tokens_per_s: f64,
    /// Why the generation stopped.
    pub stop_reason: Option<StopReason>,
}

impl ResultRecord {
    fn new(point_index: usize, point: &SweepPoint, prompt: &EncodedPrompt, seed: u64) -> Self {
        Self {
            point: point_index,
            label: point.label(),
            method: point.method,
            drafter: point.drafter.clone(),
            gamma: point.gamma,
            temperature: point.temperature,
            top_k: point.top_k,
            top_p: point.top_p,
            cache: point.cache,
            prompt_id: prompt.id.clone(),
            category: prompt.category.clone(),
            seed,
            prompt_tokens: prompt.tokens.len(),
            output_ids: Vec::new(),
            output_text: String::new(),
            new_tokens: 0,
            accepted: Vec::new(),
            proposed: Vec::new(),
            accepted_at: Vec::new(),
            proposed_at: Vec::new(),
            target_forwards: 0,
            draft_forwards: 0,
            wall_s: 0.0,
            prefill_s: 0.0,
            draft_s: 0.0,
            verify_s: 0.0,
            tokens_per_s: 0.0,
            stop_reason: None,
        }
    }

    fn fill(&mut self, g: GenerationRecord, text: String) {
        self.new_tokens = g.new_tokens();
        self.tokens_per_s = g.tokens_per_s();
        self.output_text = text;
        self.accepted = g.accepted;
        self.proposed = g.proposed;
        self.accepted_at = g.accepted_at;
        self.proposed_at = g.proposed_at;
        self.target_forwards = g.target_forwards;
        self.draft_forwards = g.draft_forwards;
        self.wall_s = g.wall_s;
        self.prefill_s = g.prefill_s;
        self.draft_s = g.draft_s;
        self.verify_s = g.verify_s;
        self.stop_reason = g.stop_reason;
        self.output_ids = g.output_ids;
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

impl<M: LanguageModel + 'static> Session<'_, M> {
    /// One short untimed generation per model, so first-call costs (allocation, kernel
    /// setup) stay out of the measurements.
    pub fn warm_up(&self, config: &ExperimentConfig) -> Result<()> {
        let Some(prompt) = self.prompts.first() else {
            return Ok(());
        };
        let params = GenParams {
            max_new_tokens: config.max_new_tokens.min(4),
            sampling: SamplingParams::greedy(),
            gamma: crate::spec::GammaPolicy::Fixed(1),
            stop_at_eos: false,
        };
        let strategy = rotating_strategy(CacheChoice::Staged, 1);
        let mut rng = StdRng::seed_from_u64(0);
        let mut cache = self.target.new_cache(strategy)?;
        autoregressive(
            self.target.as_ref(),
            &mut cache,
            &prompt.tokens,
            &params,
            &mut rng,
        )?;
        for source in self.drafters.values() {
            if let DraftSource::Model { model, .. } = source {
                let mut cache = model.new_cache(strategy)?;
                autoregressive(
                    model.as_ref(),
                    &mut cache,
                    &prompt.tokens,
                    &params,
                    &mut rng,
                )?;
            }
        }
        Ok(())
    }

    /// Runs `points` in order, every prompt each, and returns the records in that order.
    pub fn run(
        &self,
        config: &ExperimentConfig,
        points: &[SweepPoint],
        observer: &mut dyn SweepObserver,
    ) -> Result<Vec<ResultRecord>> {
        let max_gamma = config.max_gamma();
        let mut records = Vec::with_capacity(points.len() * self.prompts.len());
        for (index, point) in points.iter().enumerate() {
            observer.point_started(index, points.len(), point);
            let strategy = rotating_strategy(point.cache, max_gamma);
            let mut cache = self.target.new_cache(strategy)?;
            let mut drafter = self.drafter(point, strategy)?;
            let params = GenParams {
                max_new_tokens: config.max_new_tokens,
                sampling: point.sampling(),
                gamma: point.gamma_policy(config.sweep.adaptive),
                stop_at_eos: config.stop_at_eos,
            };
            for prompt in &self.prompts {
                let seed = point.generation_seed(config.seed, &prompt.id);
                let mut rng = StdRng::seed_from_u64(seed);
                let target = self.target.as_ref();
                let generation = match drafter.as_deref_mut() {
                    None => autoregressive(target, &mut cache, &prompt.tokens, &params, &mut rng),
                    Some(d) => {
                        speculative(target, &mut cache, d, &prompt.tokens, &params, &mut rng)
                    }
                }
                .map_err(|e| {
                    Error::invalid(format!("{} on prompt {}: {e}", point.label(), prompt.id))
                })?;
                let mut record = ResultRecord::new(index, point, prompt, seed);
                let text = (self.decode)(&generation.output_ids)?;
                record.fill(generation, text);
                observer.record(&record)?;
                records.push(record);
            }
        }
        Ok(records)
    }

    /// The drafter of a speculative point (with fresh caches), `None` for autoregressive.
    fn drafter(
        &self,
        point: &SweepPoint,
        strategy: crate::cache::RotatingStrategy,
    ) -> Result<Option<Box<dyn Drafter>>> {
        let Some(name) = point
            .drafter
            .as_deref()
            .filter(|_| point.method == Method::Speculative)
        else {
            return Ok(None);
        };
        let source = self
            .drafters
            .get(name)
            .ok_or_else(|| Error::invalid(format!("drafter {name:?} was not loaded")))?;
        Ok(Some(match source {
            DraftSource::Model { model, confidence } => Box::new(ModelDrafter::new(
                name,
                Arc::clone(model),
                strategy,
                *confidence,
            )?),
            DraftSource::Ngram {
                min_ngram,
                max_ngram,
            } => Box::new(NgramDrafter::new(name, *min_ngram, *max_ngram)?),
        }))
    }
}
