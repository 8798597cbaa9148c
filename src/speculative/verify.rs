//! Verification of a chain of drafts against the target's logits.
use candle_core::{DType, Tensor};
use rand::rngs::StdRng;
use rand::Rng;

use super::sampling::{sample, SamplingParams};
use crate::error::{Error, Result};

/// Outcome of verifying one chain of drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Drafts accepted (a prefix).
    pub accepted: usize,
    /// The token after the accepted prefix: the target's correction, or the bonus token when
    /// every draft was accepted.
    pub next: u32,
}

/// Verifies `drafts` against `logits` (`[drafts.len() + 1, vocab]`, row `i` = the target's
/// logits for the position of draft `i`; the last row gives the bonus token).
///
/// Greedy: accept while the target's argmax equals the draft; next = the argmax at the first
/// mismatch. Stochastic (Leviathan et al. 2023; Chen et al. 2023): accept draft `d` with
/// probability `min(1, p(d) / q(d))`; on rejection sample from `norm(max(0, p - q))`; after
/// all accepted sample the bonus from `p`. `draft_probs[i]` is the distribution `d_i` was
/// drawn from (same sampling settings as `p`); `None` = deterministic drafts (`q` one-hot).
/// The output then follows the target's distribution exactly.
pub fn verify<R: Rng + ?Sized>(
    logits: &Tensor,
    drafts: &[u32],
    draft_probs: Option<&[Vec<f32>]>,
    sampling: &SamplingParams,
    rng: &mut R,
) -> Result<Verdict> {
    let rows = logits.dim(0)?;
    if rows != drafts.len() + 1 {
        return Err(Error::invalid(format!(
            "verification needs {} logit rows, got {rows}",
            drafts.len() + 1
        )));
    }
    if sampling.is_greedy() {
        // Only the argmax of each row crosses to the host, not the vocabulary.
        return greedy_verdict(drafts, &crate::nn::argmax_rows(logits)?);
    }
    let logits = logits.to_dtype(DType::F32)?;
    for (i, &d) in drafts.iter().enumerate() {
        let p = sampling.probs(&logits.get(i)?.to_vec1::<f32>()?);
        let d = d as usize;
        let q_d = match draft_probs {
            Some(q) => q.get(i).and_then(|row| row.get(d)).copied().unwrap_or(0.0),
            None => 1.0,
        };
        let p_d = p.get(d).copied().unwrap_or(0.0);
        // min(1, p/q) without dividing by a zero q.
        if q_d > 0.0 && rng.random::<f32>() * q_d < p_d {
            continue;
        }
        let residual: Vec<f32> = match draft_probs.and_then(|q| q.get(i)) {
            Some(q) => p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect(),
            None => {
                let mut r = p.clone();
                if let Some(x) = r.get_mut(d) {
                    *x = 0.0;
                }
                r
            }
        };
        // A residual that is all zero means p == q: the rejection had probability 0, but
        // rounding can get here; sampling from p is then the exact answer.
        let next = if residual.iter().any(|&x| x > 0.0) {
            sample(&residual, rng)
        } else {
            sample(&p, rng)
        };
        return Ok(Verdict {
            accepted: i,
            next: next as u32,
        });
    }
    let p = sampling.probs(&logits.get(drafts.len())?.to_vec1::<f32>()?);
    Ok(Verdict {
        accepted: drafts.len(),
        next: sample(&p, rng) as u32,
    })
}

/// Greedy verification from the target's argmax of each row (`best`, `drafts.len() + 1` of
/// them): accept while the argmax equals the draft; next = the argmax after the accepted
/// prefix.
pub fn greedy_verdict(drafts: &[u32], best: &[u32]) -> Result<Verdict> {
    if best.len() != drafts.len() + 1 {
        return Err(Error::invalid(format!(
            "greedy verification needs {} argmaxes, got {}",
            drafts.len() + 1,
            best.len()
        )));
    }
    let accepted = drafts.iter().zip(best).take_while(|(d, b)| d == b).count();
    Ok(Verdict {
        accepted,
        next: best[accepted],
    })
}

/// The chain verification step of [`super::generate`] ([`super::Drafting::Speculative`]): given the target's logits over
/// `[last, d1..dγ]` (`[γ + 1, vocab]`), the drafts and the distributions they were drawn from,
/// decides the accepted prefix and the next token. [`Lossless`] is the engine's verifier;
/// the trait exists so tests can run the same engine with deliberately wrong verifiers.
pub trait Verifier {
    /// Same contract as [`verify`].
    fn verify(
        &self,
        logits: &Tensor,
        drafts: &[u32],
        draft_probs: Option<&[Vec<f32>]>,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Verdict>;

    /// Whether greedy verification is [`greedy_verdict`] of the target's argmaxes, so that
    /// the engine may take them on the device and read them back with drafts that never
    /// left it (one round trip a step). False by default: the engine then hands
    /// [`Verifier::verify`] the logits.
    fn greedy_is_argmax(&self) -> bool {
        false
    }
}

/// Greedy matching or lossless rejection sampling: [`verify`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Lossless;

impl Verifier for Lossless {
    fn verify(
        &self,
        logits: &Tensor,
        drafts: &[u32],
        draft_probs: Option<&[Vec<f32>]>,
        sampling: &SamplingParams,
        rng: &mut StdRng,
    ) -> Result<Verdict> {
        verify(logits, drafts, draft_probs, sampling, rng)
    }

    fn greedy_is_argmax(&self) -> bool {
        true
    }
}
