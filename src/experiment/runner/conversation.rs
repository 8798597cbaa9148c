//! One prompt's generations at one sweep point: its first turn, or every turn of a
//! conversation with the caches continued between turns; prefills go through the point's
//! prefix store when it has one.
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::record::ResultRecord;
use super::session::Session;
use crate::cache::{PrefixStore, RotatingStrategy};
use crate::error::{Error, Result};
use crate::experiment::config::ExperimentConfig;
use crate::experiment::sweep::SweepPoint;
use crate::speculative::{
    generate, CachedSequence, Drafter, Drafting, GenParams, GenerationRecord, LanguageModel,
    ResidualRule, TreeParams,
};

/// Later turns of conversations (`[dataset] turns = "all"`).
pub struct Conversations<'a> {
    /// Every user turn of each prompt, in [`Session::prompts`] order.
    pub turns: Vec<Vec<String>>,
    /// Encodes a conversation — user, assistant, user, …, ending with a user turn — into
    /// the prompt of its next answer (through the chat template when the run uses one).
    pub encode: &'a dyn Fn(&[String]) -> Result<Vec<u32>>,
}

/// What one sweep point generates with: the target's cache (with the point's prefix store)
/// and the drafter, both kept across the point's prompts.
pub(super) struct PointRun<'p> {
    /// Index of the point.
    pub index: usize,
    /// The point.
    pub point: &'p SweepPoint,
    /// The target's cache.
    pub seq: CachedSequence,
    /// The drafter of a speculative point.
    pub drafter: Option<Box<dyn Drafter>>,
    /// Generation settings.
    pub params: GenParams,
}

/// A fresh prefix store and checkpoint distance when `point` uses one.
pub(super) fn prefix_store(
    config: &ExperimentConfig,
    point: &SweepPoint,
) -> Option<(PrefixStore, usize)> {
    let pc = &config.prefix_cache;
    point
        .prefix_cache
        .then(|| (PrefixStore::new(pc.budget_bytes()), pc.checkpoint_every))
}

impl<M: LanguageModel + 'static> Session<'_, M> {
    /// The target's cache of a point, with a fresh store when the point uses one.
    pub(super) fn sequence(
        &self,
        config: &ExperimentConfig,
        point: &SweepPoint,
        strategy: RotatingStrategy,
    ) -> Result<CachedSequence> {
        let seq = CachedSequence::new(self.target.new_cache(strategy)?);
        Ok(match prefix_store(config, point) {
            Some((store, every)) => seq.with_store(store, every),
            None => seq,
        })
    }

    /// Generates prompt `index` at the point of `run`: its first turn, then with
    /// `conversations` every later turn, each continuing the caches of the previous one.
    /// A new prompt starts a new conversation: the caches are emptied (stores are kept).
    pub(super) fn generate_turns(
        &self,
        config: &ExperimentConfig,
        run: &mut PointRun<'_>,
        index: usize,
        conversations: Option<&Conversations<'_>>,
    ) -> Result<Vec<ResultRecord>> {
        let prompt = &self.prompts[index];
        let user_turns = match conversations {
            Some(c) => c.turns.get(index).map_or(&[][..], Vec::as_slice),
            None => &[],
        };
        run.seq.reset();
        if let Some(d) = run.drafter.as_deref_mut() {
            d.reset()?;
        }
        let mut messages: Vec<String> = user_turns.iter().take(1).cloned().collect();
        let mut tokens = prompt.tokens.clone();
        let mut records = Vec::new();
        for turn in 1..=user_turns.len().max(1) {
            if turn > 1 {
                messages.push(user_turns[turn - 1].clone());
                let encode = conversations.map(|c| c.encode).ok_or_else(|| {
                    Error::invalid("later turns need a conversation encoder".to_string())
                })?;
                tokens = encode(&messages)?;
            }
            // Turn 1 keeps the single-turn seed; later turns get their own.
            let key = format!("{}#turn{turn}", prompt.id);
            let key = if turn == 1 { &prompt.id } else { &key };
            let seed = run.point.generation_seed(config.seed, key);
            let mut rng = StdRng::seed_from_u64(seed);
            let target = self.target.as_ref();
            let generation = match run.drafter.as_deref_mut() {
                None => generate(
                    target,
                    &mut run.seq,
                    &tokens,
                    &run.params,
                    Drafting::None,
                    &mut rng,
                ),
                // `prepare` is the drafter's untimed per-prompt setup (the oracle's reference).
                Some(d) => d
                    .prepare(&tokens, run.params.max_new_tokens)
                    .and_then(|()| {
                        speculate(
                            target,
                            run.point,
                            &mut run.seq,
                            d,
                            &tokens,
                            &run.params,
                            &mut rng,
                        )
                    }),
            }
            .map_err(|e| {
                Error::invalid(format!(
                    "{} on prompt {} turn {turn}: {e}",
                    run.point.label(),
                    prompt.id
                ))
            })?;
            // The answer as the next turn's context sees it: without its end-of-sequence token.
            let eos = self.target.eos_token_ids();
            let answer = match generation.output_ids.split_last() {
                Some((last, rest)) if eos.contains(last) => rest,
                _ => &generation.output_ids[..],
            };
            messages.push((self.decode)(answer)?);
            let mut record = ResultRecord::new(run.index, run.point, prompt, seed);
            record.turn = turn;
            record.prompt_tokens = tokens.len();
            let text = (self.decode)(&generation.output_ids)?;
            record.fill(generation, text);
            records.push(record);
        }
        Ok(records)
    }
}

/// One speculative generation at `point`: chains, or trees for tree points.
fn speculate<M: LanguageModel>(
    target: &M,
    point: &SweepPoint,
    seq: &mut CachedSequence,
    drafter: &mut dyn Drafter,
    tokens: &[u32],
    params: &GenParams,
    rng: &mut StdRng,
) -> Result<GenerationRecord> {
    let tree = if point.is_tree() {
        TreeParams {
            width: point.tree_width,
            budget: point.tree_budget.unwrap_or(1),
            residual: ResidualRule::Exact,
        }
    } else {
        TreeParams::chain()
    };
    generate(
        target,
        seq,
        tokens,
        params,
        Drafting::tree(drafter, tree),
        rng,
    )
}
