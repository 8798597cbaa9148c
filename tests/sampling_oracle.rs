//! Sampling without trusting the code under test: `SamplingParams::probs` (and the harness's
//! independent `oracle_probs`) against distributions written out by hand, and `verify`'s
//! exact output distribution enumerated with a scripted random number generator, no
//! sampling noise.
mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::distribution::oracle_probs;
use rand::{Rng, RngCore};
use specdec::speculative::{verify, SamplingParams, Verdict};

fn params(temperature: f64, top_k: usize, top_p: f64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
    }
}

/// ln(1), ln(2), ln(3), ln(4): softmax at T = 1 is [0.1, 0.2, 0.3, 0.4].
const LN_1234: [f32; 4] = [0.0, std::f32::consts::LN_2, 1.098_612_3, 1.386_294_4];

/// (logits, settings, expected distribution), each expected vector worked out by hand.
fn cases() -> Vec<(Vec<f32>, SamplingParams, Vec<f64>)> {
    let l = LN_1234.to_vec();
    vec![
        (l.clone(), params(1.0, 0, 1.0), vec![0.1, 0.2, 0.3, 0.4]),
        // Weights squared: [1, 4, 9, 16] / 30.
        (
            l.clone(),
            params(0.5, 0, 1.0),
            vec![1. / 30., 4. / 30., 0.3, 16. / 30.],
        ),
        // Weights square-rooted: [1, √2, √3, 2] / (3 + √2 + √3).
        (
            l.clone(),
            params(2.0, 0, 1.0),
            vec![0.162_700_453, 0.230_093_188, 0.281_805_452, 0.325_400_907],
        ),
        (
            l.clone(),
            params(1.0, 2, 1.0),
            vec![0.0, 0.0, 3. / 7., 4. / 7.],
        ),
        (l.clone(), params(1.0, 4, 1.0), vec![0.1, 0.2, 0.3, 0.4]),
        // Top-p at its boundary: the two largest hold 0.7 of the mass.
        (
            l.clone(),
            params(1.0, 0, 0.69),
            vec![0.0, 0.0, 3. / 7., 4. / 7.],
        ),
        (
            l.clone(),
            params(1.0, 0, 0.71),
            vec![0.0, 2. / 9., 3. / 9., 4. / 9.],
        ),
        (l.clone(), params(1.0, 0, 0.39), vec![0.0, 0.0, 0.0, 1.0]),
        (
            l.clone(),
            params(1.0, 0, 0.41),
            vec![0.0, 0.0, 3. / 7., 4. / 7.],
        ),
        // Top-k first, then top-p within it: over {1, 2, 3} the two largest hold 7/9 ≥ 0.75
        // (over all four they would hold only 0.7).
        (
            l.clone(),
            params(1.0, 3, 0.75),
            vec![0.0, 0.0, 3. / 7., 4. / 7.],
        ),
        // Ties are broken by token id, for top-k and at the top-p boundary.
        (
            vec![1.0, 1.0, 1.0, 0.0],
            params(1.0, 2, 1.0),
            vec![0.5, 0.5, 0.0, 0.0],
        ),
        (
            vec![std::f32::consts::LN_2, 0.0, 0.0, 0.0],
            params(1.0, 0, 0.5),
            vec![2. / 3., 1. / 3., 0.0, 0.0],
        ),
        // Greedy: one-hot at the first largest logit.
        (
            vec![3.0, 5.0, 5.0, 1.0],
            params(0.0, 0, 1.0),
            vec![0.0, 1.0, 0.0, 0.0],
        ),
    ]
}

#[test]
fn probs_match_hand_computed_distributions() {
    for (logits, s, expected) in cases() {
        let got = s.probs(&logits);
        let oracle = oracle_probs(&logits, &s);
        for i in 0..expected.len() {
            assert!((got[i] as f64 - expected[i]).abs() < 1e-6, "{s:?}: {got:?}");
            assert!(
                (oracle[i] - expected[i]).abs() < 1e-6,
                "oracle {s:?}: {oracle:?}"
            );
        }
    }
}

/// A random number generator that replays a script of uniforms in `[0, 1)`; past the end of
/// the script it returns 0.5 and records that the outcome depended on an unscripted draw.
struct Script {
    uniforms: Vec<f64>,
    next: usize,
    overran: bool,
}

impl Script {
    fn new(uniforms: Vec<f64>) -> Self {
        Self {
            uniforms,
            next: 0,
            overran: false,
        }
    }
    fn take(&mut self) -> f64 {
        let u = self.uniforms.get(self.next).copied().unwrap_or_else(|| {
            self.overran = true;
            0.5
        });
        self.next += 1;
        u
    }
}

impl RngCore for Script {
    /// rand's `f32` uniform is the top 24 bits of `next_u32` times 2^-24.
    fn next_u32(&mut self) -> u32 {
        ((self.take() * (1u64 << 24) as f64) as u32) << 8
    }
    /// rand's `f64` uniform is the top 53 bits of `next_u64` times 2^-53.
    fn next_u64(&mut self) -> u64 {
        ((self.take() * (1u64 << 53) as f64) as u64) << 11
    }
    fn fill_bytes(&mut self, _dst: &mut [u8]) {
        unimplemented!("verify draws only floats")
    }
}

#[test]
fn the_script_drives_rands_float_conversions() {
    let mut rng = Script::new(vec![0.375, 0.625]);
    assert_eq!(rng.random::<f32>(), 0.375);
    assert_eq!(rng.random::<f64>(), 0.625);
    assert!(!rng.overran);
}

/// Strata per draw. Every probability below is a multiple of 1/4, so every threshold verify
/// compares a uniform with (p/q, cumulative residual mass / total) is a multiple of 1/1, 1/2,
/// 1/3 or 1/4; the midpoints of 12 strata never straddle one, so enumerating them is exact.
const STRATA: usize = 12;

/// The exact distribution of `run`'s result over independent uniform draws: depth-first over
/// scripts, each unscripted draw split into the midpoints of `STRATA` equal strata.
fn enumerate<K: std::hash::Hash + Eq>(mut run: impl FnMut(&mut Script) -> K) -> HashMap<K, f64> {
    let mut out = HashMap::new();
    let mut stack = vec![(Vec::new(), 1.0)];
    while let Some((script, weight)) = stack.pop() {
        let mut rng = Script::new(script.clone());
        let result = run(&mut rng);
        if !rng.overran {
            *out.entry(result).or_insert(0.0) += weight;
            continue;
        }
        for s in 0..STRATA {
            let mut longer = script.clone();
            longer.push((s as f64 + 0.5) / STRATA as f64);
            stack.push((longer, weight / STRATA as f64));
        }
    }
    out
}

const V: usize = 3;
/// Target rows (quarters); the row after a context is picked by the context's hash.
const P: [[u32; V]; 5] = [[2, 1, 1], [1, 2, 1], [0, 1, 3], [1, 1, 2], [4, 0, 0]];
/// Draft rows (quarters).
const Q: [[u32; V]; 4] = [[1, 3, 0], [2, 1, 1], [1, 1, 2], [0, 2, 2]];

fn pick(ctx: &[u32], n: usize) -> usize {
    ctx.iter().fold(ctx.len(), |h, &t| h * 7 + t as usize + 1) % n
}
fn p(ctx: &[u32]) -> Vec<f64> {
    P[pick(ctx, P.len())]
        .iter()
        .map(|&x| x as f64 / 4.0)
        .collect()
}
fn q(ctx: &[u32]) -> Vec<f64> {
    Q[pick(ctx, Q.len())]
        .iter()
        .map(|&x| x as f64 / 4.0)
        .collect()
}

/// The target's logits rows for `[ctx, ctx+d1, …, ctx+d1..dγ]`: ln p (−∞ for zeros).
fn logits(ctx: &[u32], drafts: &[u32]) -> Tensor {
    let mut rows = Vec::new();
    for i in 0..=drafts.len() {
        let c: Vec<u32> = ctx.iter().chain(&drafts[..i]).copied().collect();
        rows.extend(p(&c).iter().map(|&x| (x as f32).ln()));
    }
    Tensor::from_vec(rows, (drafts.len() + 1, V), &Device::Cpu).unwrap()
}

/// Every draft chain of length `gamma` after `ctx`, with its probability under `q`.
fn chains(ctx: &[u32], gamma: usize) -> Vec<(Vec<u32>, f64)> {
    let mut all = vec![(Vec::new(), 1.0)];
    for _ in 0..gamma {
        let mut next = Vec::new();
        for (chain, w) in all {
            let c: Vec<u32> = ctx.iter().chain(&chain).copied().collect();
            for (t, qt) in q(&c).into_iter().enumerate() {
                if qt > 0.0 {
                    let mut longer = chain.clone();
                    longer.push(t as u32);
                    next.push((longer, w * qt));
                }
            }
        }
        all = next;
    }
    all
}

/// Extends each emitted sequence to `len` tokens with the target's own continuation, giving
/// a distribution over fixed-length sequences that must equal the target's.
fn extend(emitted: HashMap<Vec<u32>, f64>, ctx: &[u32], len: usize) -> HashMap<Vec<u32>, f64> {
    let mut out: HashMap<Vec<u32>, f64> = HashMap::new();
    let mut todo: Vec<(Vec<u32>, f64)> = emitted.into_iter().collect();
    while let Some((seq, w)) = todo.pop() {
        if seq.len() == len {
            *out.entry(seq).or_insert(0.0) += w;
            continue;
        }
        let c: Vec<u32> = ctx.iter().chain(&seq).copied().collect();
        for (t, pt) in p(&c).into_iter().enumerate() {
            if pt > 0.0 {
                let mut longer = seq.clone();
                longer.push(t as u32);
                todo.push((longer, w * pt));
            }
        }
    }
    out
}

/// The target's exact distribution of `len` tokens after `ctx`.
fn target(ctx: &[u32], len: usize) -> HashMap<Vec<u32>, f64> {
    extend(HashMap::from([(Vec::new(), 1.0)]), ctx, len)
}

fn emitted(drafts: &[u32], v: Verdict) -> Vec<u32> {
    let mut e = drafts[..v.accepted].to_vec();
    e.push(v.next);
    e
}

fn assert_same(got: &HashMap<Vec<u32>, f64>, want: &HashMap<Vec<u32>, f64>) {
    let keys: std::collections::BTreeSet<&Vec<u32>> = got.keys().chain(want.keys()).collect();
    for k in keys {
        let (g, w) = (got.get(k).unwrap_or(&0.0), want.get(k).unwrap_or(&0.0));
        assert!(
            (g - w).abs() < 1e-9,
            "{k:?}: verify gives {g}, the target {w}"
        );
    }
}

#[test]
fn verify_is_exactly_lossless_for_sampled_drafts() {
    let s = params(1.0, 0, 1.0);
    for ctx in [vec![0], vec![2, 1], vec![1, 1, 0]] {
        for gamma in 1..=2 {
            let mut emitted_dist: HashMap<Vec<u32>, f64> = HashMap::new();
            for (drafts, w) in chains(&ctx, gamma) {
                let logits = logits(&ctx, &drafts);
                let q_rows: Vec<Vec<f32>> = (0..gamma)
                    .map(|i| {
                        let c: Vec<u32> = ctx.iter().chain(&drafts[..i]).copied().collect();
                        q(&c).iter().map(|&x| x as f32).collect()
                    })
                    .collect();
                let dist = enumerate(|rng| {
                    let v = verify(&logits, &drafts, Some(&q_rows), &s, rng).unwrap();
                    emitted(&drafts, v)
                });
                for (e, pe) in dist {
                    *emitted_dist.entry(e).or_insert(0.0) += w * pe;
                }
            }
            assert_same(
                &extend(emitted_dist, &ctx, gamma + 1),
                &target(&ctx, gamma + 1),
            );
        }
    }
}

#[test]
fn verify_is_exactly_lossless_for_deterministic_drafts() {
    let s = params(1.0, 0, 1.0);
    let ctx = [2, 0];
    for drafts in [vec![0], vec![1, 2], vec![2, 2], vec![0, 1]] {
        let logits = logits(&ctx, &drafts);
        let dist =
            enumerate(|rng| emitted(&drafts, verify(&logits, &drafts, None, &s, rng).unwrap()));
        let len = drafts.len() + 1;
        assert_same(&extend(dist, &ctx, len), &target(&ctx, len));
    }
}

#[test]
fn verify_accepts_with_probability_min_one_p_over_q() {
    // One draft d with p(d) = 1/4 and q(d) = 3/4: accepted with probability exactly 1/3;
    // rejections go to norm(max(0, p - q)) = norm([1/2 - 0, …]).
    let s = params(1.0, 0, 1.0);
    let p_row = [0.5f32, 0.25, 0.25];
    let next_row = [0.25f32, 0.25, 0.5];
    let rows: Vec<f32> = p_row.iter().chain(&next_row).map(|x| x.ln()).collect();
    let logits = Tensor::from_vec(rows, (2, V), &Device::Cpu).unwrap();
    let q_rows = vec![vec![0.0f32, 0.75, 0.25]];
    let dist = enumerate(|rng| {
        let v = verify(&logits, &[1], Some(&q_rows), &s, rng).unwrap();
        (v.accepted, v.next)
    });
    // Residual max(0, p - q) = [1/2, 0, 0]: every rejection yields token 0.
    let want = HashMap::from([
        ((0, 0), 2.0 / 3.0),
        ((1, 0), 1.0 / 3.0 * 0.25),
        ((1, 1), 1.0 / 3.0 * 0.25),
        ((1, 2), 1.0 / 3.0 * 0.5),
    ]);
    assert_eq!(dist.len(), want.len(), "{dist:?}");
    for (k, w) in want {
        assert!((dist[&k] - w).abs() < 1e-9, "{k:?}: {} vs {w}", dist[&k]);
    }
}
