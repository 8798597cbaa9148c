//! Sampled EAGLE-3 speculation follows the target's distribution exactly: a random head over
//! a toy target's hidden states (its embeddings and its layer's output), drafting from a
//! reduced draft vocabulary (one of the target's three ids has no draft id, so `q` is zero
//! there), on a sliding-window target with both rotating strategies; the joint distribution
//! of six-token generations against the exact one by the chi-square harness of
//! `engine_distribution.rs`; sampled trees likewise. And the harness rejects a broken EAGLE-3 drafter: one that hands
//! verification its draft-vocabulary `q` without mapping it to target ids.
mod common;

use std::sync::Arc;

use common::distribution::{exact_sequences, judge, observe, settings, Judgement, Setup};
use common::eagle3::random_head;
use common::Toy;
use rand::rngs::StdRng;
use specdec::cache::RotatingStrategy;
use specdec::models::load_eagle3;
use specdec::speculative::{
    Draft, DraftBlock, DraftRequest, Drafter, Eagle3Drafter, GammaPolicy, GenParams, Lossless,
    SamplingParams,
};

const VOCAB: usize = 3;
const DIM: usize = 8;
const NEW: usize = 6;
const RUNS: usize = 10_000;
const GAMMA: usize = 3;
const PROMPT: [u32; 2] = [1, 2];

fn setup(sampling: SamplingParams, strategy: RotatingStrategy) -> Setup {
    Setup {
        target: Toy::new(VOCAB, DIM, 21, 1.5, Some(4)),
        prompt: PROMPT.to_vec(),
        params: GenParams {
            max_new_tokens: NEW,
            sampling,
            gamma: GammaPolicy::Fixed(GAMMA),
            stop_at_eos: false,
        },
        strategy,
        runs: RUNS,
    }
}

/// A head fusing the toy's two hidden states, with draft ids {0, 1} (+ their offsets).
fn drafter(target: &Toy) -> Eagle3Drafter {
    drafter_with(target, None)
}

/// [`drafter`] stopping below `confidence`.
fn drafter_with(target: &Toy, confidence: Option<f32>) -> Eagle3Drafter {
    let tmp = tempfile::tempdir().unwrap();
    random_head(tmp.path(), (VOCAB, DIM), &[0, 1], 2, 5);
    let head = load_eagle3(tmp.path(), 1, target.embedding()).unwrap();
    assert_eq!(head.draft_to_target(), [0, 1]);
    Eagle3Drafter::with_confidence("eagle3", Arc::new(head), confidence).unwrap()
}

/// Runs `setup` with the head stopping below `confidence`; asserts the output distribution
/// is the target's.
fn consistent(setup: &Setup, confidence: Option<f32>) -> common::distribution::Observed {
    let mut drafter = drafter_with(&setup.target, confidence);
    let obs = observe(setup, &mut drafter, &Lossless, GAMMA);
    let sampling = setup.params.sampling;
    let expected = exact_sequences(&setup.target, &setup.prompt, NEW, &sampling);
    let verdict = judge(&obs.counts, &expected);
    assert!(
        matches!(verdict, Judgement::Consistent { .. }),
        "{sampling:?} {:?} confidence {confidence:?}: {verdict:?}",
        setup.strategy
    );
    obs
}

#[test]
fn sampled_eagle3_speculation_follows_the_target_distribution() {
    for strategy in [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: GAMMA },
    ] {
        for sampling in settings() {
            let setup = setup(sampling, strategy);
            let obs = consistent(&setup, None);
            assert!(
                obs.all_accepted > 0 && obs.accept_then_reject > 0 && obs.first_rejected > 0,
                "{sampling:?} {strategy:?}: paths not reached: {obs:?}"
            );
        }
    }
}

/// With a confidence threshold, chains stop before a position whose largest `q` is below it
/// (decided before the draft there is drawn), and the output still follows the target.
#[test]
fn sampled_eagle3_speculation_with_a_confidence_threshold_follows_the_target_distribution() {
    let obs = consistent(&setup(settings()[0], RotatingStrategy::Staged), Some(0.75));
    assert!(
        obs.short_steps > 0 && obs.max_proposed == GAMMA,
        "the threshold should stop some chains and not others: {obs:?}"
    );
}

/// Hands over the inner drafter's chains with `q` rows that give the id the draft
/// vocabulary lacks (2) the probability of id 0, as a `q` indexed by draft ids and read as
/// target ids would: the drafts themselves are unchanged, only the `q` verification divides
/// by and subtracts from `p`.
struct Unmapped(Eagle3Drafter);

struct UnmappedDraft<'a> {
    inner: Box<dyn Draft + 'a>,
    probs: Option<Vec<Vec<f32>>>,
    tokens: Vec<u32>,
}

impl Draft for UnmappedDraft<'_> {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Chain {
            tokens: &self.tokens,
            probs: self.probs.as_deref(),
        }
    }
    fn finish(self: Box<Self>, drafts: &[u32], path: &[usize]) -> specdec::Result<()> {
        self.inner.finish(drafts, path)
    }
}

impl Drafter for Unmapped {
    fn name(&self) -> &str {
        "unmapped"
    }
    fn reset(&mut self) -> specdec::Result<()> {
        self.0.reset()
    }
    fn prefill(&mut self, prompt: &[u32]) -> specdec::Result<()> {
        self.0.prefill(prompt)
    }
    fn target_layers(&self) -> Option<&[usize]> {
        self.0.target_layers()
    }
    fn read_target(&mut self, start: usize, states: candle_core::Tensor) -> specdec::Result<()> {
        self.0.read_target(start, states)
    }
    fn forwards(&self) -> usize {
        self.0.forwards()
    }
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        rng: &mut StdRng,
    ) -> specdec::Result<Box<dyn Draft + 'a>> {
        let inner = self.0.propose(context, request, rng)?;
        let (tokens, probs) = match inner.block() {
            DraftBlock::Chain { tokens, probs } => (
                tokens.to_vec(),
                probs.map(|rows| {
                    rows.iter()
                        .map(|q| {
                            let mut wrong = q.clone();
                            wrong[2] = q[0];
                            wrong
                        })
                        .collect()
                }),
            ),
            _ => panic!("chains only"),
        };
        Ok(Box::new(UnmappedDraft {
            inner,
            probs,
            tokens,
        }))
    }
}

#[test]
fn the_harness_rejects_an_eagle3_drafter_with_an_unmapped_q() {
    let sampling = settings()[0];
    let setup = setup(sampling, RotatingStrategy::Staged);
    let mut broken = Unmapped(drafter(&setup.target));
    let obs = observe(&setup, &mut broken, &Lossless, GAMMA);
    let expected = exact_sequences(&setup.target, &setup.prompt, NEW, &sampling);
    let verdict = judge(&obs.counts, &expected);
    assert!(
        !matches!(verdict, Judgement::Consistent { .. }),
        "a broken q passed: {verdict:?}"
    );
}

/// Sampled EAGLE-3 trees (two i.i.d. children per expanded node, multi-candidate
/// verification, each node fed its parent's output) follow the target's distribution too.
#[test]
fn sampled_eagle3_trees_follow_the_target_distribution() {
    use common::run::fresh;
    use rand::SeedableRng;
    use specdec::speculative::{Drafting, LanguageModel, TreeParams};
    const TREE_RUNS: usize = 6000;
    const TREE_NEW: usize = 4;
    let sampling = settings()[0];
    let strategy = RotatingStrategy::Staged;
    let setup = setup(sampling, strategy);
    let mut drafter = drafter(&setup.target);
    let tree = TreeParams {
        width: 2,
        budget: 4,
        ..TreeParams::chain()
    };
    let params = GenParams {
        max_new_tokens: TREE_NEW,
        gamma: GammaPolicy::Fixed(2),
        ..setup.params
    };
    let mut cache = setup.target.new_cache(strategy).unwrap();
    let mut counts = std::collections::HashMap::new();
    let mut accepted = 0;
    specdec::nn::on_cpu_pool(|| {
        for seed in 0..TREE_RUNS as u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let r = fresh(
                &setup.target,
                &mut cache,
                &setup.prompt,
                &params,
                Drafting::tree(&mut drafter, tree),
                &mut rng,
            )
            .unwrap();
            accepted += r.accepted.iter().sum::<usize>();
            *counts.entry(r.output_ids).or_insert(0usize) += 1;
        }
    });
    assert!(
        accepted > TREE_RUNS / 2,
        "{accepted} drafts accepted in {TREE_RUNS} runs"
    );
    let expected = exact_sequences(&setup.target, &setup.prompt, TREE_NEW, &sampling);
    let verdict = judge(&counts, &expected);
    assert!(
        matches!(verdict, Judgement::Consistent { .. }),
        "{verdict:?}"
    );
}
