//! The distribution harness of `engine_distribution.rs` has power: run through the same engine
//! (`speculative_with`) and judged by the same chi-square, each deliberately broken verifier
//! is rejected, and so is a drafter that stops on the probability of the token it drew (the
//! confidence bug this project once shipped). Controls: the test's own correct reference
//! verifier and the correctly thresholded drafter pass, so a rejection is the defect's doing.
mod common;

use std::sync::Arc;

use candle_core::Tensor;
use common::distribution::{exact_sequences, judge, observe, oracle_probs, Judgement, Setup};
use common::Toy;
use rand::{rngs::StdRng, Rng};
use specdec::cache::RotatingStrategy;
use specdec::speculative::{
    Draft, DraftBlock, DraftRequest, Drafter, GammaPolicy, GenParams, Lossless, ModelDrafter,
    SamplingParams, Verdict, Verifier,
};

const VOCAB: usize = 3;
const NEW: usize = 6;
const RUNS: usize = 10_000;
const GAMMA: usize = 3;
const PROMPT: [u32; 2] = [1, 2];

/// What a broken verifier gets wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Defect {
    /// None: a correct, independent reference implementation (the control).
    Nothing,
    /// On rejection, sample from p instead of norm(max(0, p - q)).
    ResidualIsP,
    /// Accept with probability min(1, q(d) / p(d)).
    RatioInverted,
    /// Use the q row of the next draft (cyclically) for draft i.
    WrongQRow,
    /// Draw the bonus token from the last draft's q row instead of p.
    BonusFromQ,
    /// Build p without top-p (the drafts' q keeps it).
    TopPOnDraftOnly,
}

/// Rejection-sampling verifier written from the papers, on [`oracle_probs`], with a `Defect`.
struct Reference(Defect);

/// Draws an index from non-negative weights (not necessarily normalised).
fn draw(weights: &[f64], rng: &mut StdRng) -> u32 {
    let total: f64 = weights.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (i, &w) in weights.iter().enumerate() {
        if u < w {
            return i as u32;
        }
        u -= w;
    }
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}

impl Verifier for Reference {
    fn verify(
        &self,
        logits: &Tensor,
        drafts: &[u32],
        draft_probs: Option<&[Vec<f32>]>,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> specdec::Result<Verdict> {
        let defect = self.0;
        let mut target = *sampling;
        if defect == Defect::TopPOnDraftOnly {
            target.top_p = 1.0;
        }
        let rows: Vec<Vec<f32>> = logits.to_vec2()?;
        let p: Vec<Vec<f64>> = rows.iter().map(|r| oracle_probs(r, &target)).collect();
        let q = |i: usize| -> Vec<f64> {
            let q = draft_probs.expect("the power tests use a sampling draft model");
            let row = if defect == Defect::WrongQRow {
                (i + 1) % q.len()
            } else {
                i
            };
            q[row].iter().map(|&x| x as f64).collect()
        };
        for (i, &d) in drafts.iter().enumerate() {
            let (p, q) = (&p[i], q(i));
            let d = d as usize;
            let ratio = match defect {
                Defect::RatioInverted => q[d] / p[d],
                _ => p[d] / q[d],
            };
            if rng.random::<f64>() < ratio {
                continue;
            }
            let residual: Vec<f64> = match defect {
                Defect::ResidualIsP => p.clone(),
                _ => p.iter().zip(&q).map(|(p, q)| (p - q).max(0.0)).collect(),
            };
            let next = if residual.iter().any(|&r| r > 0.0) {
                draw(&residual, rng)
            } else {
                draw(p, rng)
            };
            return Ok(Verdict { accepted: i, next });
        }
        let n = drafts.len();
        let bonus = match defect {
            Defect::BonusFromQ if n > 0 => draw(&q(n - 1), rng),
            _ => draw(&p[n], rng),
        };
        Ok(Verdict {
            accepted: n,
            next: bonus,
        })
    }
}

fn setup(sampling: SamplingParams) -> Setup {
    Setup {
        target: Toy::new(VOCAB, 8, 21, 1.5, Some(4)),
        prompt: PROMPT.to_vec(),
        params: GenParams {
            max_new_tokens: NEW,
            sampling,
            gamma: GammaPolicy::Fixed(GAMMA),
            stop_at_eos: false,
        },
        strategy: RotatingStrategy::Staged,
        runs: RUNS,
    }
}

fn draft_toy() -> Toy {
    Toy::new(VOCAB, 8, 99, 1.5, Some(3))
}

fn t1() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    }
}

fn top_p() -> SamplingParams {
    SamplingParams {
        temperature: 1.3,
        top_k: 0,
        top_p: 0.8,
    }
}

/// The harness's verdict on the engine run with `drafter` and `verifier`.
fn verdict(
    sampling: SamplingParams,
    drafter: &mut (dyn Drafter + Send),
    verifier: &(dyn Verifier + Sync),
) -> Judgement {
    let setup = setup(sampling);
    let obs = observe(&setup, drafter, verifier, GAMMA);
    assert!(
        obs.max_proposed >= GAMMA && obs.accept_then_reject > 0,
        "{obs:?}"
    );
    judge(
        &obs.counts,
        &exact_sequences(&setup.target, &PROMPT, NEW, &sampling),
    )
}

fn verdict_of(defect: Defect, sampling: SamplingParams) -> Judgement {
    let model = Arc::new(draft_toy());
    let mut drafter = ModelDrafter::new("draft", model, RotatingStrategy::Staged, None).unwrap();
    verdict(sampling, &mut drafter, &Reference(defect))
}

fn is_rejected(j: &Judgement) -> bool {
    !matches!(j, Judgement::Consistent { .. })
}

#[test]
fn the_reference_verifier_passes() {
    for sampling in [t1(), top_p()] {
        let j = verdict_of(Defect::Nothing, sampling);
        assert!(!is_rejected(&j), "{sampling:?}: {j:?}");
    }
}

#[test]
fn residual_p_is_rejected() {
    let j = verdict_of(Defect::ResidualIsP, t1());
    assert!(is_rejected(&j), "{j:?}");
}

#[test]
fn inverted_ratio_is_rejected() {
    let j = verdict_of(Defect::RatioInverted, t1());
    assert!(is_rejected(&j), "{j:?}");
}

#[test]
fn wrong_q_row_is_rejected() {
    let j = verdict_of(Defect::WrongQRow, t1());
    assert!(is_rejected(&j), "{j:?}");
}

#[test]
fn bonus_from_q_is_rejected() {
    let j = verdict_of(Defect::BonusFromQ, t1());
    assert!(is_rejected(&j), "{j:?}");
}

#[test]
fn top_p_on_one_side_only_produces_impossible_outputs() {
    let j = verdict_of(Defect::TopPOnDraftOnly, top_p());
    assert!(matches!(j, Judgement::Impossible(_)), "{j:?}");
}

#[test]
fn an_output_the_target_cannot_produce_fails_outright() {
    let sampling = top_p();
    let target = setup(sampling).target;
    let expected = exact_sequences(&target, &PROMPT, NEW, &sampling);
    let mut observed: std::collections::HashMap<Vec<u32>, usize> = expected
        .iter()
        .map(|(k, &p)| (k.clone(), (p * 1e6) as usize))
        .collect();
    assert!(matches!(
        judge(&observed, &expected),
        Judgement::Consistent { .. }
    ));
    let outside = (0..VOCAB as u32)
        .map(|t| vec![t; NEW])
        .find(|s| !expected.contains_key(s))
        .expect("top-p 0.8 over three tokens excludes some sequence");
    observed.insert(outside.clone(), 1);
    assert_eq!(judge(&observed, &expected), Judgement::Impossible(outside));
}

/// Drafts from a model with a confidence threshold, recomputing from scratch each time (no
/// caches). `on_drawn`: stop when q(drawn token) < threshold — the biased rule; otherwise
/// stop when max q < threshold before drawing — the lossless rule the engine uses.
struct Thresholded {
    model: Toy,
    threshold: f64,
    on_drawn: bool,
}

struct Proposal {
    tokens: Vec<u32>,
    probs: Vec<Vec<f32>>,
}

impl Draft for Proposal {
    fn block(&self) -> DraftBlock<'_> {
        DraftBlock::Chain {
            tokens: &self.tokens,
            probs: Some(&self.probs),
        }
    }
    fn finish(self: Box<Self>, _drafts: &[u32], _path: &[usize]) -> specdec::Result<()> {
        Ok(())
    }
}

impl Drafter for Thresholded {
    fn name(&self) -> &str {
        "thresholded"
    }
    fn reset(&mut self) -> specdec::Result<()> {
        Ok(())
    }
    fn propose<'a>(
        &'a mut self,
        context: &[u32],
        request: &DraftRequest,
        rng: &mut StdRng,
    ) -> specdec::Result<Box<dyn Draft + 'a>> {
        let (max, sampling) = (request.chain_len(), &request.sampling);
        let mut ctx = context.to_vec();
        let mut out = Proposal {
            tokens: Vec::new(),
            probs: Vec::new(),
        };
        while out.tokens.len() < max {
            let q = oracle_probs(&self.model.last_logits(&ctx), sampling);
            let top = q.iter().copied().fold(0.0, f64::max);
            let stop_before = !self.on_drawn && top < self.threshold;
            if stop_before && !out.tokens.is_empty() {
                break;
            }
            let token = draw(&q, rng);
            if self.on_drawn && q[token as usize] < self.threshold && !out.tokens.is_empty() {
                break;
            }
            out.tokens.push(token);
            out.probs.push(q.iter().map(|&x| x as f32).collect());
            ctx.push(token);
        }
        Ok(Box::new(out))
    }
    fn forwards(&self) -> usize {
        0
    }
}

/// The harness's verdict on a thresholded drafter. A flat target and a peaked draft make
/// the old rule's bias (the confident token overweighted from the second draft on) large;
/// more runs than the verifier tests, as the bias is second-order in the generation.
fn threshold_verdict(on_drawn: bool) -> Judgement {
    let mut drafter = Thresholded {
        model: Toy::new(VOCAB, 8, 99, 5.0, Some(3)),
        threshold: 0.6,
        on_drawn,
    };
    let mut setup = setup(t1());
    setup.target = Toy::new(VOCAB, 8, 21, 0.5, Some(4));
    setup.runs = 3 * RUNS;
    let obs = observe(&setup, &mut drafter, &Lossless, GAMMA);
    assert!(obs.max_proposed >= GAMMA && obs.short_steps > 0, "{obs:?}");
    judge(
        &obs.counts,
        &exact_sequences(&setup.target, &PROMPT, NEW, &t1()),
    )
}

#[test]
fn stopping_on_the_largest_draft_probability_passes() {
    let j = threshold_verdict(false);
    assert!(!is_rejected(&j), "{j:?}");
}

#[test]
fn stopping_on_the_drawn_tokens_probability_is_rejected() {
    let j = threshold_verdict(true);
    assert!(is_rejected(&j), "{j:?}");
}
