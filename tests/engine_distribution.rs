//! Sampled speculative decoding follows the target's distribution exactly, on every path the
//! engine has: six-token generations whose steps propose three or four drafts (drafts
//! accepted then rejected, corrections, bonus tokens, the draft model's own caches inside
//! their speculation), sliding windows that slide in the target and the draft, both rotating
//! strategies, every drafter (draft model with and without a confidence threshold, n-gram,
//! adaptive γ) and every sampling filter. The joint distribution of the whole generation is
//! compared with the target's exact one (computed by the independent oracle in
//! `distribution/`) by a chi-square test at significance 0.001. `distribution_power.rs` runs
//! the same harness against broken verifiers and drafters to show that it rejects them.
mod common;

use std::sync::Arc;

use common::distribution::{exact_sequences, judge, observe, settings, Judgement, Observed, Setup};
use common::Toy;
use specdec::cache::RotatingStrategy;
use specdec::speculative::{
    Drafter, GammaPolicy, GenParams, Lossless, ModelDrafter, NgramDrafter, SamplingParams,
};

const VOCAB: usize = 3;
/// Six new tokens: the prefill yields one, so the first step may propose up to four drafts.
const NEW: usize = 6;
const RUNS: usize = 10_000;
/// The target's sliding window: prompt + generation (2 + 6 tokens) slides it by four.
const TARGET_WINDOW: usize = 4;
/// The draft's window is smaller still, so its rotating cache wraps inside speculations.
const DRAFT_WINDOW: usize = 3;
const PROMPT: [u32; 2] = [1, 2];

fn setup(sampling: SamplingParams, gamma: GammaPolicy, strategy: RotatingStrategy) -> Setup {
    Setup {
        target: Toy::new(VOCAB, 8, 21, 1.5, Some(TARGET_WINDOW)),
        prompt: PROMPT.to_vec(),
        params: GenParams {
            max_new_tokens: NEW,
            sampling,
            gamma,
            stop_at_eos: false,
        },
        strategy,
        runs: RUNS,
    }
}

/// A draft model over `VOCAB` tokens; `scale` sets how peaked its distributions are.
fn draft_model(
    strategy: RotatingStrategy,
    scale: f32,
    confidence: Option<f32>,
) -> ModelDrafter<Toy> {
    let model = Arc::new(Toy::new(VOCAB, 8, 99, scale, Some(DRAFT_WINDOW)));
    ModelDrafter::new("draft", model, strategy, confidence).unwrap()
}

/// Runs the engine for every sampling setting and asserts the output matches the target's
/// distribution; returns what each run reached so callers can assert path coverage.
fn check_all(
    drafter: &mut (dyn Drafter + Send),
    gamma: GammaPolicy,
    max_gamma: usize,
    strategy: RotatingStrategy,
) -> Vec<Observed> {
    settings()
        .into_iter()
        .map(|sampling| {
            let setup = setup(sampling, gamma, strategy);
            let obs = observe(&setup, drafter, &Lossless, max_gamma);
            let expected = exact_sequences(&setup.target, &setup.prompt, NEW, &sampling);
            let verdict = judge(&obs.counts, &expected);
            assert!(
                matches!(verdict, Judgement::Consistent { .. }),
                "{} {sampling:?} {strategy:?}: {verdict:?}",
                drafter.name()
            );
            obs
        })
        .collect()
}

/// Every step kind occurred under every sampling setting.
fn assert_paths(all: &[Observed], min_drafts: usize) {
    for obs in all {
        assert!(obs.max_proposed >= min_drafts, "{obs:?}");
        assert!(obs.all_accepted > 0, "no bonus token: {obs:?}");
        assert!(obs.first_rejected > 0, "no first-draft rejection: {obs:?}");
        assert!(obs.accept_then_reject > 0, "no accept-then-reject: {obs:?}");
    }
}

#[test]
fn draft_model_with_staged_caches_samples_the_target_distribution() {
    let strategy = RotatingStrategy::Staged;
    let mut drafter = draft_model(strategy, 1.5, None);
    let all = check_all(&mut drafter, GammaPolicy::Fixed(3), 3, strategy);
    assert_paths(&all, 3);
}

#[test]
fn draft_model_with_slack_caches_samples_the_target_distribution() {
    let strategy = RotatingStrategy::Slack { max_draft: 4 };
    let mut drafter = draft_model(strategy, 1.5, None);
    let all = check_all(&mut drafter, GammaPolicy::Fixed(4), 4, strategy);
    assert_paths(&all, 4);
}

#[test]
fn confidence_threshold_samples_the_target_distribution() {
    let strategy = RotatingStrategy::Staged;
    // A peaked draft: the old rule (stop when q(drawn token) < 0.6) is rejected by this test
    // at T = 1 (`distribution_power.rs` shows that rule rejected with a wider margin).
    let mut drafter = draft_model(strategy, 5.0, Some(0.6));
    let all = check_all(&mut drafter, GammaPolicy::Fixed(3), 3, strategy);
    assert_paths(&all, 3);
    for obs in &all {
        assert!(obs.short_steps > 0, "the threshold never stopped: {obs:?}");
    }
}

#[test]
fn adaptive_gamma_samples_the_target_distribution() {
    let strategy = RotatingStrategy::Slack { max_draft: 4 };
    let mut drafter = draft_model(strategy, 1.5, None);
    let gamma = GammaPolicy::Adaptive {
        min: 1,
        max: 4,
        start: 3,
    };
    let all = check_all(&mut drafter, gamma, 4, strategy);
    assert_paths(&all, 3);
}

#[test]
fn ngram_samples_the_target_distribution() {
    // The prompt's repeats give the lookup something to propose; its drafts are one-hot.
    let mut drafter = NgramDrafter::new("ngram", 1, 2).unwrap();
    let all = check_all(
        &mut drafter,
        GammaPolicy::Fixed(3),
        3,
        RotatingStrategy::Staged,
    );
    assert_paths(&all, 3);
}
