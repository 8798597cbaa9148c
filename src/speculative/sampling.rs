//! Turning logits into a next-token distribution, identically for target and draft.
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Sampling settings. `temperature == 0` means greedy (argmax); `top_k == 0` and
/// `top_p >= 1` disable those filters. Target and draft distributions are always built with
/// the same settings, which lossless verification requires.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 = greedy.
    pub temperature: f64,
    /// Keep only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p` (1 = all).
    pub top_p: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }

    /// True for argmax decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// The distribution to sample from: softmax(logits / T), restricted to the top-k tokens and
    /// then to the top-p nucleus, renormalised. Ties at the top-k / top-p boundary are broken by
    /// token id so p and q are filtered identically. Greedy: one-hot at the argmax.
    pub fn probs(&self, logits: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; logits.len()];
        if logits.is_empty() {
            return out;
        }
        if self.is_greedy() {
            out[argmax(logits)] = 1.0;
            return out;
        }
        let t = self.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| ((l as f64 - max) / t).exp())
            .collect();
        let filtering = (self.top_k > 0 && self.top_k < logits.len()) || self.top_p < 1.0;
        let keep: Vec<usize> = if filtering {
            let mut order: Vec<usize> = (0..logits.len()).collect();
            // Descending by weight, ties by id: a total order, so p and q agree.
            order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
            if self.top_k > 0 {
                order.truncate(self.top_k);
            }
            if self.top_p < 1.0 {
                let total: f64 = order.iter().map(|&i| weights[i]).sum();
                let mut mass = 0.0;
                let mut n = 0;
                for &i in &order {
                    n += 1;
                    mass += weights[i] / total;
                    if mass >= self.top_p {
                        break;
                    }
                }
                order.truncate(n.max(1));
            }
            order
        } else {
            (0..logits.len()).collect()
        };
        let total: f64 = keep.iter().map(|&i| weights[i]).sum();
        for &i in &keep {
            out[i] = (weights[i] / total) as f32;
        }
        out
    }
}

/// Index of the largest value (the first one on ties, as torch's argmax).
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// Draws an index from an (unnormalised, non-negative) weight vector. Falls back to the
/// argmax if the weights sum to zero (possible only through rounding).
pub fn sample<R: Rng + ?Sized>(weights: &[f32], rng: &mut R) -> usize {
    let total: f64 = weights.iter().map(|&w| w.max(0.0) as f64).sum();
    if total <= 0.0 || !total.is_finite() {
        return argmax(weights);
    }
    let mut r = rng.random::<f64>() * total;
    let mut last_positive = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            last_positive = i;
            r -= w as f64;
            if r < 0.0 {
                return i;
            }
        }
    }
    last_positive
}
