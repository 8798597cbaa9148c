//! A distribution-test harness for the speculative engine that shares no code with
//! `SamplingParams::probs` or `verify`: an independent reference for the sampling filters
//! ([`oracle_probs`]), the exact distribution of whole generations under the target
//! ([`exact_sequences`]), and Pearson's chi-square at a fixed significance ([`judge`]).
use std::collections::HashMap;

use super::run::fresh;
use rand::{rngs::StdRng, SeedableRng};
use specdec::cache::RotatingStrategy;
use specdec::speculative::{
    Drafter, Drafting, GenParams, LanguageModel, SamplingParams, TreeParams, Verifier,
};

use super::Toy;

/// Upper-tail quantile of the standard normal for significance 0.001.
const Z_001: f64 = 3.090_232;

/// Chi-square critical value for `df` degrees of freedom at significance 0.001
/// (Wilson–Hilferty approximation, accurate to well under 1% for df ≥ 3).
pub fn critical(df: usize) -> f64 {
    let d = df as f64;
    let t = 1.0 - 2.0 / (9.0 * d) + Z_001 * (2.0 / (9.0 * d)).sqrt();
    d * t * t * t
}

/// Reference next-token distribution, written independently of the production code:
/// softmax(logits / T) in f64; a token's rank counts the tokens strictly before it (larger
/// weight, or equal weight and smaller id); top-k keeps ranks `< k`; top-p then keeps a token
/// when the mass (within the top-k set) of the tokens ranked before it is still `< top_p`,
/// i.e. the smallest prefix whose mass reaches `top_p`. `T == 0` is one-hot at the first
/// largest logit.
pub fn oracle_probs(logits: &[f32], s: &SamplingParams) -> Vec<f64> {
    let n = logits.len();
    if s.temperature <= 0.0 {
        let best = (0..n).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        return (0..n).map(|i| if i == best { 1.0 } else { 0.0 }).collect();
    }
    let hi = logits.iter().map(|&l| l as f64).fold(f64::MIN, f64::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - hi) / s.temperature).exp())
        .collect();
    let before = |i: usize, j: usize| w[j] > w[i] || (w[j] == w[i] && j < i);
    let rank: Vec<usize> = (0..n)
        .map(|i| (0..n).filter(|&j| before(i, j)).count())
        .collect();
    let k = if s.top_k == 0 { n } else { s.top_k };
    let in_k: Vec<bool> = rank.iter().map(|&r| r < k).collect();
    let k_mass: f64 = (0..n).filter(|&i| in_k[i]).map(|i| w[i]).sum();
    let keep: Vec<bool> = (0..n)
        .map(|i| {
            let ahead: f64 = (0..n)
                .filter(|&j| in_k[j] && before(i, j))
                .map(|j| w[j])
                .sum();
            in_k[i] && (s.top_p >= 1.0 || ahead / k_mass < s.top_p)
        })
        .collect();
    let total: f64 = (0..n).filter(|&i| keep[i]).map(|i| w[i]).sum();
    (0..n)
        .map(|i| if keep[i] { w[i] / total } else { 0.0 })
        .collect()
}

/// Exact probability of every `new`-token continuation of `prompt` under `model` and `s`,
/// from fresh full forwards (no cache reuse) and [`oracle_probs`].
pub fn exact_sequences(
    model: &Toy,
    prompt: &[u32],
    new: usize,
    s: &SamplingParams,
) -> HashMap<Vec<u32>, f64> {
    let mut dist = HashMap::from([(Vec::new(), 1.0)]);
    for _ in 0..new {
        let mut next = HashMap::new();
        for (seq, p) in dist {
            let ctx: Vec<u32> = prompt.iter().chain(&seq).copied().collect();
            for (t, q) in oracle_probs(&model.last_logits(&ctx), s)
                .into_iter()
                .enumerate()
            {
                if q > 0.0 {
                    let mut longer = seq.clone();
                    longer.push(t as u32);
                    next.insert(longer, p * q);
                }
            }
        }
        dist = next;
    }
    dist
}

/// What a batch of seeded generations produced, and which verification paths it reached.
#[derive(Debug, Default)]
pub struct Observed {
    /// Count of each generated sequence.
    pub counts: HashMap<Vec<u32>, usize>,
    /// Largest number of drafts proposed in one step.
    pub max_proposed: usize,
    /// Steps that accepted every draft (bonus token drawn from p).
    pub all_accepted: usize,
    /// Steps that rejected the first draft.
    pub first_rejected: usize,
    /// Steps that accepted some drafts, then rejected one (correction after acceptances).
    pub accept_then_reject: usize,
    /// Steps that proposed fewer drafts than γ allowed (n-gram misses, confidence stops).
    pub short_steps: usize,
}

/// One distribution experiment: target, prompt, generation settings and cache strategy.
pub struct Setup {
    pub target: Toy,
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub strategy: RotatingStrategy,
    pub runs: usize,
}

/// Runs `setup.runs` generations (seeds `0..runs`) through the engine with `verifier`.
/// `max_gamma` is the γ each step may use (for counting short steps). Runs on rayon's pool as
/// `exp` does: from outside it every tiny candle op is a cross-thread handoff (many times
/// slower for these toy models).
pub fn observe(
    setup: &Setup,
    drafter: &mut (dyn Drafter + Send),
    verifier: &(dyn Verifier + Sync),
    max_gamma: usize,
) -> Observed {
    specdec::nn::on_cpu_pool(|| observe_here(setup, drafter, verifier, max_gamma))
}

fn observe_here(
    setup: &Setup,
    drafter: &mut (dyn Drafter + Send),
    verifier: &(dyn Verifier + Sync),
    max_gamma: usize,
) -> Observed {
    let mut cache = setup.target.new_cache(setup.strategy).unwrap();
    let mut obs = Observed::default();
    for seed in 0..setup.runs as u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let r = fresh(
            &setup.target,
            &mut cache,
            &setup.prompt,
            &setup.params,
            Drafting::Speculative {
                drafter,
                tree: TreeParams::chain(),
                verifier,
            },
            &mut rng,
        )
        .unwrap();
        // Tokens already emitted before each step: the prefill's one plus earlier steps'.
        let mut emitted = 1;
        for (&p, &a) in r.proposed.iter().zip(&r.accepted) {
            obs.max_proposed = obs.max_proposed.max(p);
            obs.all_accepted += usize::from(a == p);
            obs.first_rejected += usize::from(p > 0 && a == 0);
            obs.accept_then_reject += usize::from(a > 0 && a < p);
            let allowed = max_gamma.min(setup.params.max_new_tokens - emitted - 1);
            obs.short_steps += usize::from(p < allowed);
            emitted += a + 1;
        }
        *obs.counts.entry(r.output_ids).or_default() += 1;
    }
    obs
}

/// The harness's decision about a sample against an exact distribution.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    /// Pearson's statistic below the critical value.
    Consistent { stat: f64, critical: f64 },
    /// Pearson's statistic at or above the critical value.
    Rejected { stat: f64, critical: f64 },
    /// A sequence the target gives probability zero was produced.
    Impossible(Vec<u32>),
}

/// Pearson's chi-square of `observed` against `expected` over cells with expected count ≥ 5
/// (the others pooled into one cell), at significance 0.001. Any observed sequence with
/// expected probability zero is [`Judgement::Impossible`] outright.
pub fn judge(observed: &HashMap<Vec<u32>, usize>, expected: &HashMap<Vec<u32>, f64>) -> Judgement {
    let mut impossible: Vec<&Vec<u32>> = observed
        .keys()
        .filter(|k| expected.get(*k).copied().unwrap_or(0.0) <= 0.0)
        .collect();
    impossible.sort();
    if let Some(seq) = impossible.first() {
        return Judgement::Impossible(seq.to_vec());
    }
    let n = observed.values().sum::<usize>() as f64;
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (key, &p) in expected {
        let e = p * n;
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
    }
    let critical = critical(cells.max(2) - 1);
    if stat < critical {
        Judgement::Consistent { stat, critical }
    } else {
        Judgement::Rejected { stat, critical }
    }
}

/// The sampling settings every distribution test covers.
pub fn settings() -> [SamplingParams; 3] {
    [
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 2,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 1.3,
            top_k: 0,
            top_p: 0.8,
        },
    ]
}
