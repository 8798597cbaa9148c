//! Sampled tree speculation preserves the target's distribution: the joint distribution of
//! the first three tokens of tree speculative sampling (i.i.d. sampled siblings tried in turn
//! with multi-candidate rejection sampling, corrections and bonus tokens) is compared with
//! the target's exact distribution by a chi-square test at significance 0.001, on rotating
//! caches of both strategies, at T = 1 and with top-k and top-p, and with the draft model's
//! confidence threshold pruning the tree. The same test must reject
//! the naive rule that keeps `p` unchanged after a sibling is rejected, and the draft's own
//! distribution, which shows it has power.
mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::Toy;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::speculative::{
    speculative_tree, Drafter, GammaPolicy, GenParams, LanguageModel, ModelDrafter, NgramDrafter,
    ResidualRule, SamplingParams, TreeParams,
};

const VOCAB: usize = 5;
const RUNS: usize = 6000;
const NEW: usize = 3;
/// Upper-tail quantile of the standard normal for significance 0.001.
const Z_001: f64 = 3.090_232;

/// Chi-square critical value for `df` degrees of freedom at significance 0.001
/// (Wilson–Hilferty approximation, accurate to well under 1% for df ≥ 3).
fn critical(df: usize) -> f64 {
    let d = df as f64;
    let t = 1.0 - 2.0 / (9.0 * d) + Z_001 * (2.0 / (9.0 * d)).sqrt();
    d * t * t * t
}

/// Exact probability of every sequence of `new` tokens after `prompt` under `model`.
fn exact(
    model: &Toy,
    prompt: &[u32],
    sampling: &SamplingParams,
    new: usize,
) -> HashMap<Vec<u32>, f64> {
    let mut dist = HashMap::from([(Vec::new(), 1.0)]);
    for _ in 0..new {
        let mut next = HashMap::new();
        for (seq, p) in dist {
            let mut ctx = prompt.to_vec();
            ctx.extend(&seq);
            let probs = sampling.probs(&model.last_logits(&ctx));
            for (t, &q) in probs.iter().enumerate() {
                if q > 0.0 {
                    let mut s = seq.clone();
                    s.push(t as u32);
                    next.insert(s, p * q as f64);
                }
            }
        }
        dist = next;
    }
    dist
}

/// Pearson's statistic over cells with expected count ≥ 5 (the rest pooled); returns
/// (statistic, degrees of freedom).
fn chi_square(
    observed: &HashMap<Vec<u32>, usize>,
    expected: &HashMap<Vec<u32>, f64>,
) -> (f64, usize) {
    let n = observed.values().sum::<usize>() as f64;
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    let mut keys: Vec<&Vec<u32>> = expected.keys().chain(observed.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let e = expected.get(key).copied().unwrap_or(0.0) * n;
        let o = observed.get(key).copied().unwrap_or(0) as f64;
        if e >= 5.0 {
            stat += (o - e) * (o - e) / e;
            cells += 1;
        } else {
            pooled_o += o;
            pooled_e += e;
        }
    }
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        cells += 1;
    } else if pooled_o > 0.0 {
        stat = f64::INFINITY; // sequences the target cannot produce
    }
    (stat, cells - 1)
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
        let r = speculative_tree(
            &target,
            &mut cache,
            case.drafter,
            case.prompt,
            &params,
            &tree,
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
            let (stat, df) = chi_square(&observed, &exact(&target, &PROMPT, &sampling, NEW));
            assert!(
                stat < critical(df),
                "{strategy:?} {sampling:?}: chi-square {stat:.1} ≥ {:.1} (df {df})",
                critical(df)
            );
            let (stat, df) = chi_square(&observed, &exact(&draft, &PROMPT, &sampling, NEW));
            assert!(
                stat > critical(df),
                "the test cannot tell target from draft: {stat:.1} (df {df})"
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
        let (stat, df) = chi_square(&observed, &exact(&target, &prompt, &sampling, NEW));
        assert!(
            stat < critical(df),
            "{sampling:?}: chi-square {stat:.1} ≥ {:.1} (df {df})",
            critical(df)
        );
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
    let (stat, df) = chi_square(&observed, &exact(&target, &PROMPT, &sampling, NEW));
    assert!(
        stat > critical(df),
        "the naive residual went unnoticed: chi-square {stat:.1} < {:.1} (df {df})",
        critical(df)
    );
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
            let r = speculative_tree(
                &target,
                &mut cache,
                &mut drafter,
                &PROMPT,
                &params,
                &tree(ResidualRule::Exact),
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
        let (stat, df) = chi_square(&observed, &exact(&target, &PROMPT, &sampling, DEEP));
        assert!(
            stat < critical(df),
            "{sampling:?}: chi-square {stat:.1} ≥ {:.1} (df {df})",
            critical(df)
        );
    }
}
