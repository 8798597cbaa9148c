//! Sampled tree speculation preserves the target's distribution: the joint distribution of
//! the first three tokens of tree speculative sampling (i.i.d. sampled siblings tried in turn
//! with multi-candidate rejection sampling, corrections and bonus tokens) is compared with
//! the target's exact distribution by a chi-square test at significance 0.001, on rotating
//! caches of both strategies, at T = 1 and with top-k and top-p, and with the draft model's
//! confidence threshold pruning the tree. The same test must reject
//! the naive rule that keeps `p` unchanged after a sibling is rejected, and the draft's own
//! distribution, which shows it has power. The exact distribution and the test are the chain
//! tests' harness (`tests/distribution`), independent of `SamplingParams::probs`.
mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::distribution::{exact_sequences, judge, Judgement};
use common::run::fresh;
use common::Toy;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::speculative::{
    Drafter, Drafting, GammaPolicy, GenParams, LanguageModel, ModelDrafter, NgramDrafter,
    ResidualRule, SamplingParams, TreeParams,
};

const VOCAB: usize = 5;
const RUNS: usize = 6000;
const NEW: usize = 3;

/// The harness's chi-square verdict (significance 0.001) on `observed` against the exact
/// distribution of `new` tokens after `prompt` under `model`.
fn verdict(
    observed: &HashMap<Vec<u32>, usize>,
    model: &Toy,
    prompt: &[u32],
    sampling: &SamplingParams,
    new: usize,
) -> Judgement {
    judge(observed, &exact_sequences(model, prompt, new, sampling))
}

fn consistent(j: &Judgement) -> bool {
    matches!(j, Judgement::Consistent { .. })
}

const PROMPT: [u32; 2] = [1, 3];

/// One sampled setting: the target's scale, the drafter, the prompt, the new tokens.
struct Case<'a> {
    target_scale: f32,
    drafter: &'a mut dyn Drafter,
    prompt: &'a [u32],
    new: usize,
}

/// Samples `RUNS` generations of tree speculation; returns the observed sequences.
fn sample_runs(
    case: &mut Case,
    strategy: RotatingStrategy,
    sampling: SamplingParams,
    tree: TreeParams,
) -> HashMap<Vec<u32>, usize> {
    let target = Toy::new(VOCAB, 8, 21, case.target_scale, Some(4));
    let params = GenParams {
        max_new_tokens: case.new,
        sampling,
        gamma: GammaPolicy::Fixed(2),
        stop_at_eos: false,
    };
    let mut cache = target.new_cache(strategy).unwrap();
    let mut observed: HashMap<Vec<u32>, usize> = HashMap::new();
    let (mut accepted, mut proposed) = (0, 0);
    for seed in 0..RUNS as u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let r = fresh(
            &target,
            &mut cache,
            case.prompt,
            &params,
            Drafting::tree(case.drafter, tree),
            &mut rng,
        )
        .unwrap();
        accepted += r.accepted.iter().sum::<usize>();
        proposed += r.proposed.iter().sum::<usize>();
        *observed.entry(r.output_ids).or_default() += 1;
    }
    assert!(
        accepted > 0 && accepted < proposed,
        "both acceptances and rejections occur: {accepted}/{proposed}"
    );
    observed
}

fn draft_drafter(strategy: RotatingStrategy) -> ModelDrafter<Toy> {
    confident_drafter(strategy, None)
}

fn confident_drafter(strategy: RotatingStrategy, confidence: Option<f32>) -> ModelDrafter<Toy> {
    let draft = Arc::new(Toy::new(VOCAB, 8, 99, 1.5, None));
    ModelDrafter::new("draft", draft, strategy, confidence).unwrap()
}

fn settings() -> [SamplingParams; 3] {
    [
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 3,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 1.3,
            top_k: 0,
            top_p: 0.8,
        },
    ]
}

fn tree(residual: ResidualRule) -> TreeParams {
    TreeParams {
        width: 3,
        budget: 8,
        residual,
    }
}

#[test]
fn sampled_tree_speculation_samples_the_target_distribution() {
    let target = Toy::new(VOCAB, 8, 21, 1.5, Some(4));
    let draft = Toy::new(VOCAB, 8, 99, 1.5, None);
    for strategy in [
        RotatingStrategy::Staged,
        RotatingStrategy::Slack { max_draft: 8 },
    ] {
        for sampling in settings() {
            let mut drafter = draft_drafter(strategy);
            let mut case = Case {
                target_scale: 1.5,
                drafter: &mut drafter,
                prompt: &PROMPT,
                new: NEW,
            };
            let observed = sample_runs(&mut case, strategy, sampling, tree(ResidualRule::Exact));
            let v = verdict(&observed, &target, &PROMPT, &sampling, NEW);
            assert!(consistent(&v), "{strategy:?} {sampling:?}: {v:?}");
            let v = verdict(&observed, &draft, &PROMPT, &sampling, NEW);
            assert!(
                !consistent(&v),
                "the test cannot tell target from draft: {v:?}"
            );
        }
    }
}

/// Deterministic siblings (n-gram continuations merged into a trie) under sampled
/// verification: `q` is one-hot, the residual drops each rejected sibling.
#[test]
fn ngram_tree_speculation_samples_the_target_distribution() {
    // Repeats in the prompt give the lookup several continuations; a flatter target, so
    // that they are accepted often enough.
    let prompt = [1, 2, 3, 1, 2, 4, 1, 2, 0, 3, 1, 2];
    let target = Toy::new(VOCAB, 8, 21, 0.4, Some(4));
    for sampling in settings() {
        let mut drafter = NgramDrafter::new("ngram", 1, 2).unwrap();
        let mut case = Case {
            target_scale: 0.4,
            drafter: &mut drafter,
            prompt: &prompt,
            new: NEW,
        };
        let strategy = RotatingStrategy::Staged;
        let observed = sample_runs(&mut case, strategy, sampling, tree(ResidualRule::Exact));
        let v = verdict(&observed, &target, &prompt, &sampling, NEW);
        assert!(consistent(&v), "{sampling:?}: {v:?}");
    }
}

#[test]
fn an_unchanged_residual_is_rejected() {
    let target = Toy::new(VOCAB, 8, 21, 1.5, Some(4));
    let sampling = settings()[0];
    let strategy = RotatingStrategy::Staged;
    let mut drafter = draft_drafter(strategy);
    let mut case = Case {
        target_scale: 1.5,
        drafter: &mut drafter,
        prompt: &PROMPT,
        new: NEW,
    };
    let observed = sample_runs(&mut case, strategy, sampling, tree(ResidualRule::Unchanged));
    let v = verdict(&observed, &target, &PROMPT, &sampling, NEW);
    assert!(!consistent(&v), "the naive residual went unnoticed: {v:?}");
}

/// The draft model's confidence threshold prunes trees (no children below a node whose
/// largest draft probability is under it) without changing the output distribution. Four
/// new tokens, so that the first step drafts two levels and the threshold can cut the second.
#[test]
fn a_confidence_threshold_keeps_the_target_distribution() {
    const DEEP: usize = 4;
    let target = Toy::new(VOCAB, 8, 21, 1.5, Some(4));
    let strategy = RotatingStrategy::Slack { max_draft: 8 };
    for sampling in settings() {
        // The threshold cuts some first trees to one level, not all.
        let mut drafter = confident_drafter(strategy, Some(0.7));
        let params = GenParams {
            max_new_tokens: DEEP,
            sampling,
            gamma: GammaPolicy::Fixed(2),
            stop_at_eos: false,
        };
        let mut cache = target.new_cache(strategy).unwrap();
        let mut depths = [0usize; 3];
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let r = fresh(
                &target,
                &mut cache,
                &PROMPT,
                &params,
                Drafting::tree(&mut drafter, tree(ResidualRule::Exact)),
                &mut rng,
            )
            .unwrap();
            depths[r.proposed[0]] += 1;
        }
        assert!(
            depths[1] > 0 && depths[2] > 0,
            "{sampling:?}: first-tree depths {depths:?}"
        );
        let mut case = Case {
            target_scale: 1.5,
            drafter: &mut drafter,
            prompt: &PROMPT,
            new: DEEP,
        };
        let observed = sample_runs(&mut case, strategy, sampling, tree(ResidualRule::Exact));
        let v = verdict(&observed, &target, &PROMPT, &sampling, DEEP);
        assert!(consistent(&v), "{sampling:?}: {v:?}");
    }
}
