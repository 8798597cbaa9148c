//! Runs every sweep point on every prompt and produces one [`ResultRecord`] per generation.
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::conversation::{prefix_store, Conversations, PointRun};
use super::record::{ResultRecord, SweepObserver};
use super::session::{DraftSource, Session};
use crate::error::{Error, Result};
use crate::experiment::config::{CacheChoice, ExperimentConfig, Method};
use crate::experiment::schedule::{schedule, turn_ends};
use crate::experiment::sweep::{max_block, rotating_strategy, SweepPoint};
use crate::speculative::{
    generate, CachedSequence, Drafter, Drafting, Eagle3Drafter, GenParams, LanguageModel,
    ModelDrafter, NgramDrafter, OracleDrafter, SamplingParams,
};

impl<M: LanguageModel + 'static> Session<'_, M> {
    /// One short untimed generation per model, so first-call costs (allocation, kernel
    /// setup) stay out of the measurements; under the first combination of `config.engine`.
    pub fn warm_up(&self, config: &ExperimentConfig) -> Result<()> {
        let Some(prompt) = self.prompts.first() else {
            return Ok(());
        };
        if let Some(&options) = config.engine.combinations().first() {
            crate::engine::set(options)?;
        }
        let params = GenParams {
            max_new_tokens: config.max_new_tokens.min(4),
            sampling: SamplingParams::greedy(),
            gamma: crate::speculative::GammaPolicy::Fixed(1),
            stop_at_eos: false,
        };
        let strategy = rotating_strategy(CacheChoice::Staged, 1);
        let mut rng = StdRng::seed_from_u64(0);
        let drafts = self.drafters.values().filter_map(|source| match source {
            DraftSource::Model { model, .. } => Some(model),
            _ => None,
        });
        for model in std::iter::once(&self.target).chain(drafts) {
            let mut seq = CachedSequence::new(model.new_cache(strategy)?);
            let plain = Drafting::None;
            generate(
                model.as_ref(),
                &mut seq,
                &prompt.tokens,
                &params,
                plain,
                &mut rng,
            )?;
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
    /// so only one pairing group's caches are held at a time. Each generation runs under its
    /// point's engine options ([`crate::engine::set`]), which stay in effect afterwards.
    pub fn run_with(
        &self,
        config: &ExperimentConfig,
        points: &[SweepPoint],
        observer: &mut dyn SweepObserver,
        conversations: Option<&Conversations<'_>>,
    ) -> Result<Vec<ResultRecord>> {
        // Slack rings must roll back the largest block: a chain's drafts or a tree's nodes.
        let max_gamma = max_block(config);
        // Every cache sized for the longest first turn's whole sequence when a point's run is
        // made, so that no timed generation grows (reallocates) one.
        let longest = self.prompts.iter().map(|p| p.tokens.len()).max();
        let expected = longest.unwrap_or(0) + config.max_new_tokens + max_gamma + 1;
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
                let mut seq = self.sequence(config, point, strategy)?;
                seq.cache_mut().expect_tokens(expected)?;
                let mut drafter = self.drafter(config, point, strategy)?;
                if let Some(d) = drafter.as_deref_mut() {
                    d.expect_tokens(expected)?;
                }
                runs[slot.point] = Some(PointRun {
                    index: slot.point,
                    point,
                    seq,
                    drafter,
                    params: GenParams {
                        max_new_tokens: config.max_new_tokens,
                        sampling: point.sampling(),
                        gamma: point.gamma_policy(config.sweep.adaptive),
                        stop_at_eos: config.stop_at_eos,
                    },
                });
            }
            let run = runs[slot.point].as_mut().expect("created above");
            // The point's engine options, in effect for its generation only: with
            // `order = "interleaved"` the next slot may be another point's.
            crate::engine::set(point.engine)?;
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
                let drafter = ModelDrafter::new(name, Arc::clone(model), strategy, *confidence)?
                    .verified_on(self.target_device.clone());
                match prefix_store(config, point) {
                    Some((store, every)) => Box::new(drafter.with_prefix_store(store, every)),
                    None => Box::new(drafter),
                }
            }
            DraftSource::Ngram {
                min_ngram,
                max_ngram,
            } => Box::new(NgramDrafter::new(name, *min_ngram, *max_ngram)?),
            DraftSource::Eagle3 { head, confidence } => Box::new(Eagle3Drafter::with_confidence(
                name,
                Arc::clone(head),
                *confidence,
            )?),
            DraftSource::Oracle {
                alpha,
                cost,
                cost_head,
                references,
            } => {
                let oracle = OracleDrafter::new(
                    name,
                    Arc::clone(&self.target),
                    *alpha,
                    cost.as_ref().map(|m| (Arc::clone(m), strategy)),
                    Arc::clone(references),
                )?
                .verified_on(self.target_device.clone());
                match cost_head {
                    Some(head) => Box::new(oracle.with_eagle3_cost(Arc::clone(head))?),
                    None => Box::new(oracle),
                }
            }
        }))
    }
}
