//! The stochastic path preserves the target's distribution: the joint distribution of the
//! first three tokens of speculative sampling (drafts accepted, rejected and corrected, bonus
//! tokens) is compared with the target's exact distribution by a chi-square test at a fixed
//! significance level, at T = 1 and with top-k and top-p. The same statistic against the
//! draft's distribution must reject, which shows the test has power.
mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::Toy;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::speculative::{
    speculative, Drafter, GammaPolicy, GenParams, LanguageModel, ModelDrafter, NgramDrafter,
    SamplingParams,
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

/// Exact probability of every sequence of `NEW` tokens after `prompt` under `model`.
fn exact(model: &Toy, prompt: &[u32], sampling: &SamplingParams) -> HashMap<Vec<u32>, f64> {
    let mut dist = HashMap::from([(Vec::new(), 1.0)]);
    for _ in 0..NEW {
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

fn check(
    target_scale: f32,
    drafter: &mut dyn Drafter,
    draft_model: Option<&Toy>,
    sampling: SamplingParams,
    prompt: &[u32],
) {
    let target = Toy::new(VOCAB, 8, 21, target_scale, Some(4));
    let params = GenParams {
        max_new_tokens: NEW,
        sampling,
        gamma: GammaPolicy::Fixed(2),
        stop_at_eos: false,
    };
    let mut cache = target.new_cache(RotatingStrategy::Staged).unwrap();
    let mut observed: HashMap<Vec<u32>, usize> = HashMap::new();
    let (mut proposed, mut accepted) = (0, 0);
    for seed in 0..RUNS as u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let r = speculative(&target, &mut cache, drafter, prompt, &params, &mut rng).unwrap();
        proposed += r.proposed.iter().sum::<usize>();
        accepted += r.accepted.iter().sum::<usize>();
        *observed.entry(r.output_ids).or_default() += 1;
    }
    assert!(
        accepted > 0 && accepted < proposed,
        "both acceptances and rejections occur: {accepted}/{proposed}"
    );
    let (stat, df) = chi_square(&observed, &exact(&target, prompt, &sampling));
    assert!(
        stat < critical(df),
        "{sampling:?}: chi-square {stat:.1} ≥ {:.1} (df {df})",
        critical(df)
    );
    if let Some(draft) = draft_model {
        let (stat, df) = chi_square(&observed, &exact(draft, prompt, &sampling));
        assert!(
            stat > critical(df),
            "the test cannot tell target from draft: {stat:.1} (df {df})"
        );
    }
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

#[test]
fn draft_model_speculation_samples_the_target_distribution() {
    let draft = Toy::new(VOCAB, 8, 99, 1.5, None);
    for sampling in settings() {
        let mut drafter = ModelDrafter::new(
            "draft",
            Arc::new(Toy::new(VOCAB, 8, 99, 1.5, None)),
            RotatingStrategy::Staged,
            None,
        )
        .unwrap();
        check(1.5, &mut drafter, Some(&draft), sampling, &[1, 3]);
    }
}

#[test]
fn ngram_speculation_samples_the_target_distribution() {
    for sampling in settings() {
        let mut drafter = NgramDrafter::new("ngram", 1, 2).unwrap();
        // Repeats in the prompt give the lookup something to propose.
        // A flatter target, so that lookups are accepted often enough.
        check(
            0.4,
            &mut drafter,
            None,
            sampling,
            &[1, 2, 3, 1, 2, 4, 1, 2, 3, 0, 1],
        );
    }
}
