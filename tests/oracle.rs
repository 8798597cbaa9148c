//! The synthetic-acceptance (oracle) drafter: its measured per-token acceptance matches
//! `alpha` within sampling error, its greedy output equals autoregressive output (with and
//! without a draft model run for its cost), and it refuses sampled decoding.
mod common;

use std::sync::Arc;

use common::run::fresh;
use common::Toy;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::speculative::{
    Drafter, Drafting, GammaPolicy, GenParams, GenerationRecord, LanguageModel, OracleDrafter,
    ReferenceStore, SamplingParams,
};

const VOCAB: usize = 24;
const STRATEGY: RotatingStrategy = RotatingStrategy::Slack { max_draft: 8 };

fn params(max_new_tokens: usize, gamma: usize) -> GenParams {
    GenParams {
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        gamma: GammaPolicy::Fixed(gamma),
        stop_at_eos: false,
    }
}

fn prompt(seed: u64) -> Vec<u32> {
    (0..6)
        .map(|i| ((seed * 7 + i * 5) % VOCAB as u64) as u32)
        .collect()
}

/// Runs the oracle's generation the way the runner does: prepare (untimed), then decode.
/// `seed` must differ between generations: the keep/replace draws come from its RNG.
fn run_oracle(
    target: &Arc<Toy>,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    p: &GenParams,
    seed: u64,
) -> GenerationRecord {
    drafter.prepare(prompt, p.max_new_tokens).unwrap();
    let mut cache = target.new_cache(STRATEGY).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    fresh(
        target.as_ref(),
        &mut cache,
        prompt,
        p,
        Drafting::chain(drafter),
        &mut rng,
    )
    .unwrap()
}

fn run_ar(target: &Toy, prompt: &[u32], p: &GenParams) -> Vec<u32> {
    let mut cache = target.new_cache(STRATEGY).unwrap();
    fresh(
        target,
        &mut cache,
        prompt,
        p,
        Drafting::None,
        &mut StdRng::seed_from_u64(0),
    )
    .unwrap()
    .output_ids
}

/// Per-token acceptance estimated from chain verification: every accepted draft is a success
/// and the first rejected draft of a step (if any) a failure; drafts after it were never
/// judged. Returns (successes, trials).
fn trials(records: &[GenerationRecord]) -> (usize, usize) {
    let (mut ok, mut n) = (0, 0);
    for r in records {
        for (&a, &p) in r.accepted.iter().zip(&r.proposed) {
            ok += a;
            n += a + usize::from(a < p);
        }
    }
    (ok, n)
}

#[test]
fn measured_acceptance_matches_alpha_within_sampling_error() {
    let target = Arc::new(Toy::new(VOCAB, 16, 3, 3.0, Some(7)));
    let store = ReferenceStore::default();
    for alpha in [0.0, 0.3, 0.6, 0.8, 0.9, 1.0] {
        let mut oracle =
            OracleDrafter::new("oracle", Arc::clone(&target), alpha, None, store.clone()).unwrap();
        let p = params(60, 4);
        let records: Vec<GenerationRecord> = (0..25)
            .map(|s| run_oracle(&target, &mut oracle, &prompt(s), &p, 1000 + s))
            .collect();
        let (ok, n) = trials(&records);
        let estimate = ok as f64 / n as f64;
        // 4.5 standard errors: a false alarm about once in 150,000 runs per alpha.
        let bound = 4.5 * (alpha * (1.0 - alpha) / n as f64).sqrt();
        assert!(
            (estimate - alpha).abs() <= bound,
            "alpha {alpha}: measured {estimate:.4} over {n} judged drafts (bound ±{bound:.4})"
        );
        assert!(n > 300, "alpha {alpha}: only {n} judged drafts");
        assert_eq!(oracle.reference_mismatches(), 0, "alpha {alpha}");
    }
}

/// A reference that is not the target's greedy continuation (here planted in the store; on a
/// GPU, a reference pass that computed other half-precision logits than the run) breaks the
/// oracle's premise: kept tokens get rejected, and the oracle counts every such step.
#[test]
fn a_reference_the_target_does_not_follow_is_counted() {
    let target = Arc::new(Toy::new(VOCAB, 16, 3, 3.0, Some(7)));
    let p = params(30, 4);
    let store = ReferenceStore::default();
    let mut oracle =
        OracleDrafter::new("oracle", Arc::clone(&target), 1.0, None, store.clone()).unwrap();
    let record = run_oracle(&target, &mut oracle, &prompt(1), &p, 1);
    assert_eq!(oracle.reference_mismatches(), 0);
    assert!(record
        .accepted
        .iter()
        .zip(&record.proposed)
        .all(|(a, p)| a == p));
    // The same prompt's reference, each token moved to the next id: never the target's.
    let wrong: Vec<u32> = run_ar(&target, &prompt(1), &p)
        .iter()
        .map(|&t| (t + 1) % VOCAB as u32)
        .collect();
    store.lock().unwrap().insert(prompt(1), wrong);
    let record = run_oracle(&target, &mut oracle, &prompt(1), &p, 1);
    // Greedy output is still the target's own; every step rejected its first proposal.
    assert_eq!(record.output_ids, run_ar(&target, &prompt(1), &p));
    assert!(record.accepted.iter().all(|&a| a == 0));
    let judged = record.proposed.iter().filter(|&&n| n > 0).count();
    assert!(judged > 20, "{judged} steps with proposals");
    assert_eq!(oracle.reference_mismatches(), judged);
}

#[test]
fn greedy_output_equals_autoregressive_with_and_without_a_cost_model() {
    let target = Arc::new(Toy::new(VOCAB, 16, 5, 3.0, Some(5)));
    let draft = Arc::new(Toy::new(VOCAB, 8, 6, 3.0, None));
    let store = ReferenceStore::default();
    for gamma in [1, 3, 8] {
        for cost in [None, Some((Arc::clone(&draft), STRATEGY))] {
            let with_cost = cost.is_some();
            let mut oracle =
                OracleDrafter::new("o", Arc::clone(&target), 0.7, cost, store.clone()).unwrap();
            for s in 0..4 {
                let p = params(40, gamma);
                let record = run_oracle(&target, &mut oracle, &prompt(s), &p, s);
                assert_eq!(
                    record.output_ids,
                    run_ar(&target, &prompt(s), &p),
                    "γ {gamma}, cost model {with_cost}, prompt {s}"
                );
                // One draft-model forward over the prompt (booked as prefill, as a draft
                // model's) and one per proposal, none without a cost model.
                let proposed: usize = record.proposed.iter().sum();
                let expected = if with_cost { 1 + proposed } else { 0 };
                assert_eq!(record.draft_forwards, expected, "γ {gamma}, prompt {s}");
            }
        }
    }
}

#[test]
fn oracle_refuses_sampling_and_bad_alpha() {
    let target = Arc::new(Toy::new(VOCAB, 16, 3, 3.0, None));
    for alpha in [-0.1, 1.5, f64::NAN] {
        assert!(
            OracleDrafter::new(
                "o",
                Arc::clone(&target),
                alpha,
                None,
                ReferenceStore::default()
            )
            .is_err(),
            "alpha {alpha} accepted"
        );
    }
    let mut oracle = OracleDrafter::new(
        "o",
        Arc::clone(&target),
        0.5,
        None,
        ReferenceStore::default(),
    )
    .unwrap();
    let mut p = params(10, 2);
    p.sampling = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::greedy()
    };
    oracle.prepare(&prompt(1), 10).unwrap();
    let mut cache = target.new_cache(STRATEGY).unwrap();
    let err = fresh(
        target.as_ref(),
        &mut cache,
        &prompt(1),
        &p,
        Drafting::chain(&mut oracle),
        &mut StdRng::seed_from_u64(1),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("greedy"), "{err}");
}
