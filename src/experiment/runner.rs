//! Runs every sweep point on every prompt and produces one [`ResultRecord`] per pair.
use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::config::{CacheChoice, ExperimentConfig, Method};
use super::conversation::{prefix_store, Conversations, PointRun};
use super::schedule::{schedule, turn_ends};
use super::sweep::{max_block, rotating_strategy, SweepPoint};
use crate::error::{Error, Result};
use crate::speculative::{
    generate, CachedSequence, Drafter, Drafting, GenParams, GenerationRecord, LanguageModel,
    ModelDrafter, NgramDrafter, OracleDrafter, ReferenceStore, SamplingParams,
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
    /// The oracle: the target's greedy continuation kept with probability `alpha`.
    Oracle {
        /// Per-token acceptance.
        alpha: f64,
        /// A model whose forwards are run for their cost.
        cost: Option<Arc<M>>,
        /// Greedy references by prompt, shared by the run's oracles.
        references: ReferenceStore,
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
            gamma: crate::speculative::GammaPolicy::Fixed(1),
            stop_at_eos: false,
        };
        let strategy = rotating_strategy(CacheChoice::Staged, 1);
        let mut rng = StdRng::seed_from_u64(0);
        let mut seq = CachedSequence::new(self.target.new_cache(strategy)?);
        generate(
            self.target.as_ref(),
            &mut seq,
            &prompt.tokens,
            &params,
            Drafting::None,
            &mut rng,
        )?;
        for source in self.drafters.values() {
            if let DraftSource::Model { model, .. } = source {
                let mut seq = CachedSequence::new(model.new_cache(strategy)?);
                generate(
                    model.as_ref(),
                    &mut seq,
                    &prompt.tokens,
                    &params,
                    Drafting::None,
                    &mut rng,
                )?;
            }
        }
        Ok(())
    }

    /// Runs every prompt at every point, and returns the records in the order they ran (see
    /// [`Session::run_with`]).
    pub fn run(
        &self,
        config: &ExperimentConfig,
        points: &[SweepPoint],
        observer: &mut dyn SweepObserver,
    ) -> Result<Vec<ResultRecord>> {
        self.run_with(config, points, observer, None)
    }

    /// [`Session::run`], with every turn of each prompt when `conversations` is given (one
    /// record per turn, in turn order). Every prompt runs at every point `config.repeats`
    /// times, in `config.order` (see [`schedule`]). Within a turn of the schedule (see
    /// [`turn_ends`]) each point keeps one sequence and drafter (reset per prompt, so buffers
    /// grown by one generation are reused by the next); they are dropped at the turn's end,
    /// so only one pairing group's caches are held at a time.
    pub fn run_with(
        &self,
        config: &ExperimentConfig,
        points: &[SweepPoint],
        observer: &mut dyn SweepObserver,
        conversations: Option<&Conversations<'_>>,
    ) -> Result<Vec<ResultRecord>> {
        // Slack rings must roll back the largest block: a chain's drafts or a tree's nodes.
        let max_gamma = max_block(config);
        let slots = schedule(points, self.prompts.len(), config.repeats, config.order);
        let ends = turn_ends(&slots, points, config.order);
        let mut runs: Vec<Option<PointRun<'_>>> = (0..points.len()).map(|_| None).collect();
        let mut records = Vec::with_capacity(slots.len());
        let mut previous = None;
        for (i, slot) in slots.iter().enumerate() {
            let point = &points[slot.point];
            if previous != Some(slot.point) {
                observer.point_started(slot.point, points.len(), point);
                previous = Some(slot.point);
            }
            if runs[slot.point].is_none() {
                let strategy = rotating_strategy(point.cache, max_gamma);
                runs[slot.point] = Some(PointRun {
                    index: slot.point,
                    point,
                    seq: self.sequence(config, point, strategy)?,
                    drafter: self.drafter(config, point, strategy)?,
                    params: GenParams {
                        max_new_tokens: config.max_new_tokens,
                        sampling: point.sampling(),
                        gamma: point.gamma_policy(config.sweep.adaptive),
                        stop_at_eos: config.stop_at_eos,
                    },
                });
            }
            let run = runs[slot.point].as_mut().expect("created above");
            for mut record in self.generate_turns(config, run, slot.prompt, conversations)? {
                record.repeat = slot.repeat;
                record.sequence = records.len();
                observer.record(&record)?;
                records.push(record);
            }
            if ends[i] {
                runs.iter_mut().for_each(|r| *r = None);
            }
        }
        Ok(records)
    }

    /// The drafter of a speculative point (with fresh caches), `None` for autoregressive.
    fn drafter(
        &self,
        config: &ExperimentConfig,
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
            DraftSource::Model { model, confidence } => {
                let drafter = ModelDrafter::new(name, Arc::clone(model), strategy, *confidence)?;
                match prefix_store(config, point) {
                    Some((store, every)) => Box::new(drafter.with_prefix_store(store, every)),
                    None => Box::new(drafter),
                }
            }
            DraftSource::Ngram {
                min_ngram,
                max_ngram,
            } => Box::new(NgramDrafter::new(name, *min_ngram, *max_ngram)?),
            DraftSource::Oracle {
                alpha,
                cost,
                references,
            } => Box::new(OracleDrafter::new(
                name,
                Arc::clone(&self.target),
                *alpha,
                cost.as_ref().map(|m| (Arc::clone(m), strategy)),
                Arc::clone(references),
            )?),
        }))
    }
}
