//! Attention on the CPU for blocks of queries that are the newest positions of a cache (decode
//! steps, verification chains, prefills), over a contiguous run of keys or a sliding-window
//! ring read in place: each query's scores, softmax and value sum in one pass over exactly the
//! keys it sees, in position order. No mask and no `[t, keys]` score matrix is built, and a
//! query's result does not depend on the queries beside it: a verification row is bitwise what
//! a one-token step at that position computes, at any block length.
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// Which cache rows a block's queries read.
#[derive(Debug, Clone, Copy)]
pub enum Keys<'a> {
    /// Keys `0 .. len` of the buffers are positions `0 .. len`; the `t` queries are the last
    /// `t` of them; each sees the positions up to its own (the last `window` only, with one).
    Suffix { window: Option<usize> },
    /// A ring: position `p` sits in row `p % capacity`; the queries are positions
    /// `end - t .. end`; each sees the `window` positions up to its own, none below `lo`.
    Ring {
        end: usize,
        lo: usize,
        window: usize,
    },
    /// A token tree's block at the end of the keys: rows `0 .. base` are positions
    /// `0 .. base`, row `base + j` holds `tree`'s node `j`; query `i` is node `first + i` at
    /// position `base + depth`, and sees positions `0 .. base` then its ancestors, root first,
    /// and itself (the keys a one-token step at that position sees once the path is
    /// committed, in that order).
    Tree {
        base: usize,
        first: usize,
        tree: &'a crate::cache::TokenTree,
    },
}

/// Attention of `q: [1, h, t, d]` over `k`, `v: [1, kv, rows, d]` (`h` a multiple of `kv`,
/// logits optionally `tanh`-capped; the softmax scale already in `q`) as `[t, h * d]`; `None`
/// unless every operand is f32 on the CPU with a unit stride along `d`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    keys: Keys<'_>,
    softcap: Option<f64>,
) -> Result<Option<Tensor>> {
    let fits = |x: &Tensor| {
        x.device().is_cpu()
            && x.dtype() == candle_core::DType::F32
            && x.rank() == 4
            && x.stride()[3] == 1
    };
    if ![q, k, v].into_iter().all(fits) {
        return Ok(None);
    }
    let (h, kv) = (q.dim(1)?, k.dim(1)?);
    if kv == 0 || h % kv != 0 || k.dim(3)? != q.dim(3)? || v.dims() != k.dims() {
        return Ok(None);
    }
    let op = CpuAttention {
        keys,
        softcap: softcap.map(|c| c as f32),
    };
    Ok(Some(q.apply_op3_no_bwd(k, v, &op)?))
}

struct CpuAttention<'a> {
    keys: Keys<'a>,
    softcap: Option<f32>,
}

/// Work (query rows × keys × head width, summed over heads) below which a block stays on
/// one thread. A decode step's attention is split too: left on one thread between two
/// parallel products, it let the pool's other thread fall asleep, and waking it cost SmolLM2's
/// decode step 14 → 17–18 ms (docs/kernel-notes.md).
const PARALLEL_MIN_WORK: usize = 1 << 12;

/// An operand's elements and its `[1, heads, rows, d]` strides of heads and rows.
struct Operand<'a> {
    data: &'a [f32],
    head: usize,
    row: usize,
}

impl<'a> Operand<'a> {
    fn new(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<Self> {
        let CpuStorage::F32(all) = s else {
            candle_core::bail!("cpu attention: f32 operands only");
        };
        let stride = l.stride();
        Ok(Self {
            data: &all[l.start_offset()..],
            head: stride[1],
            row: stride[2],
        })
    }

    fn row(&self, head: usize, row: usize, d: usize) -> &'a [f32] {
        let at = head * self.head + row * self.row;
        &self.data[at..at + d]
    }
}

impl CustomOp3 for CpuAttention<'_> {
    fn name(&self) -> &'static str {
        "attention-cpu"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, h, t, d) = ql.shape().dims4()?;
        let (_, kv, rows, _) = kl.shape().dims4()?;
        let (q, k, v) = (
            Operand::new(qs, ql)?,
            Operand::new(ks, kl)?,
            Operand::new(vs, vl)?,
        );
        // A tree's base (none: `usize::MAX`) and each query's block rows, root first (its path
        // of nodes).
        let (tree_base, paths): (usize, Vec<Vec<usize>>) = match self.keys {
            Keys::Tree { base, first, tree } => {
                if first + t != tree.len() || base + tree.len() != rows {
                    candle_core::bail!(
                        "cpu attention: nodes {first}.. of a {}-node tree at {base} over {rows} keys",
                        tree.len()
                    );
                }
                let paths = (first..tree.len()).map(|node| {
                    let mut path: Vec<usize> =
                        std::iter::successors(Some(node), |&a| tree.parent(a)).collect();
                    path.reverse();
                    path
                });
                (base, paths.collect())
            }
            _ => (usize::MAX, Vec::new()),
        };
        // Key rows of query `i` in position order: `first(i) ..= last(i)`, row `p % wrap`
        // (a tree's: positions from its base at its path's rows).
        let (wrap, last_of, lo) = match self.keys {
            Keys::Tree { base, .. } => (usize::MAX, base, None),
            Keys::Suffix { window } => {
                if t > rows {
                    candle_core::bail!("cpu attention: {t} queries over {rows} keys");
                }
                (usize::MAX, rows - t, window.map(|w| (w, 0)))
            }
            Keys::Ring { end, lo, window } => {
                if t > end || window == 0 || window + t - 1 > rows {
                    candle_core::bail!(
                        "cpu attention: {t} queries ending at {end}, window {window}, ring of {rows}"
                    );
                }
                (rows, end - t, Some((window, lo)))
            }
        };
        let span = |i: usize| {
            let last = match paths.get(i) {
                Some(path) => last_of + path.len() - 1,
                None => last_of + i,
            };
            let first = lo.map_or(0, |(w, lo)| (last + 1).saturating_sub(w).max(lo));
            (first, last)
        };
        let group = h / kv;
        let mut out = vec![0f32; t * h * d];
        let work: usize = (0..t).map(|i| span(i).1 + 1 - span(i).0).sum::<usize>() * h * d;
        #[cfg(target_arch = "x86_64")]
        let wide = d % 16 == 0 && std::arch::is_x86_feature_detected!("avx512f");
        let one = |scores: &mut Vec<f32>, (at, out): (usize, &mut [f32])| {
            let (i, head) = (at / h, at % h);
            let (first, last) = span(i);
            let kvh = head / group;
            let query = q.row(head, i, d);
            // Row of position `p ≥ first`: the span is at most a ring's length, so it wraps at
            // most once past `base` (no division per position).
            let base = if wrap == usize::MAX {
                0
            } else {
                first / wrap * wrap
            };
            let path = paths.get(i).map_or(&[][..], Vec::as_slice);
            let slot = move |p: usize| {
                if p >= tree_base {
                    return tree_base + path[p - tree_base];
                }
                let s = p - base;
                if s >= wrap {
                    s - wrap
                } else {
                    s
                }
            };
            let key = |p: usize| k.row(kvh, slot(p), d);
            let value = |p: usize| v.row(kvh, slot(p), d);
            let positions = first..=last;
            #[cfg(target_arch = "x86_64")]
            if wide {
                // SAFETY: the CPU has AVX-512F (checked above).
                return unsafe {
                    avx512::query_row(query, positions, key, value, self.softcap, scores, out)
                };
            }
            query_row(query, positions, key, value, dot, self.softcap, scores, out);
        };
        if work >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1 {
            out.par_chunks_exact_mut(d)
                .enumerate()
                .for_each_init(Vec::new, one);
        } else {
            let mut scores = Vec::new();
            out.chunks_exact_mut(d)
                .enumerate()
                .for_each(|item| one(&mut scores, item));
        }
        Ok((CpuStorage::F32(out), (t, h * d).into()))
    }
}

/// One query over the keys at `positions`: `out = Σ softmax(s)_p v_p` with `s_p = q · k_p`
/// (`dot`; capped when `softcap`), the sums in position order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn query_row<'a>(
    query: &[f32],
    positions: std::ops::RangeInclusive<usize>,
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    dot: impl Fn(&[f32], &[f32]) -> f32,
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for p in positions.clone() {
        let mut s = dot(query, key(p));
        if let Some(cap) = softcap {
            s = (s / cap).tanh() * cap;
        }
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0f32;
    out.fill(0.0);
    for (p, s) in positions.zip(scores.iter()) {
        let e = (s - max).exp();
        sum += e;
        axpy(e, value(p), out);
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// `a · b` summed in 16 lanes (lane `l` takes elements `l`, `l + 16`, …), then the lanes
/// pairwise.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        lanes[i % 16] += x * y;
    }
    let l8: [f32; 8] = std::array::from_fn(|l| lanes[l] + lanes[l + 8]);
    let l4: [f32; 4] = std::array::from_fn(|l| l8[l] + l8[l + 4]);
    (l4[0] + l4[2]) + (l4[1] + l4[3])
}

/// The kernel for AVX-512F CPUs and a head width that is a multiple of 16, up to 256.
///
/// Per query, the contract that keeps a row independent of its block: the visible positions
/// `first ..= last` are taken in blocks of 16 from `first`; each score is `Σ_c q_c · k_c`
/// over the head width's 16-lane chunks in order (fused multiply-adds), its lanes summed by
/// one butterfly ([`hsum16`]); the softmax's exponentials are [`exp`]'s, summed lane-wise
/// over the blocks and then across lanes; the values are summed with fused multiply-adds in
/// two interleaved sets (positions `first + 2i` and `first + 2i + 1`), added at the end.
/// Every step depends only on the query, its keys and `first`, never on the rows beside it.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// One query over the keys at `positions` (see the module contract); `N = d / 16`, up to
    /// 16. Falls back to [`super::query_row`] with an AVX-512 dot product for other widths.
    #[target_feature(enable = "avx512f")]
    pub(super) fn query_row<'a>(
        query: &[f32],
        positions: std::ops::RangeInclusive<usize>,
        key: impl Fn(usize) -> &'a [f32],
        value: impl Fn(usize) -> &'a [f32],
        softcap: Option<f32>,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        macro_rules! width {
            ($($n:literal)*) => {
                match query.len() / 16 {
                    $($n => return chunks::<$n>(query, positions, &key, &value, softcap, scores, out),)*
                    _ => {}
                }
            };
        }
        width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
        let dot = |a: &[f32], b: &[f32]| dot(a, b);
        super::query_row(query, positions, key, value, dot, softcap, scores, out)
    }

    /// [`query_row`] for a head width of `N` 16-lane chunks.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    fn chunks<'a, const N: usize>(
        query: &[f32],
        positions: std::ops::RangeInclusive<usize>,
        key: &impl Fn(usize) -> &'a [f32],
        value: &impl Fn(usize) -> &'a [f32],
        softcap: Option<f32>,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let (first, last) = (*positions.start(), *positions.end());
        let len = last + 1 - first;
        let blocks = len.div_ceil(16);
        scores.clear();
        scores.resize(blocks * 16, 0.0);
        let q: [__m512; N] = std::array::from_fn(|c| load(&query[c * 16..]));
        // Positions of block `b` in use, and their lanes as a mask.
        let valid = |b: usize| (len - 16 * b).min(16);
        let mask = |b: usize| -> __mmask16 { (((1u32 << valid(b)) - 1) & 0xffff) as u16 };
        // Scores, 16 positions a block; padding lanes -inf.
        let mut top = _mm512_set1_ps(f32::NEG_INFINITY);
        for b in 0..blocks {
            let (p0, valid) = (first + 16 * b, valid(b));
            let mut acc = [_mm512_setzero_ps(); 16];
            for (slot, acc) in acc.iter_mut().enumerate() {
                // Slot `4k + j` lands in lane `4j + k` of `hsum16`'s result.
                let lane = 4 * (slot % 4) + slot / 4;
                if lane < valid {
                    let k = key(p0 + lane);
                    let mut sum = _mm512_mul_ps(q[0], load(k));
                    for (c, q) in q.iter().enumerate().skip(1) {
                        sum = _mm512_fmadd_ps(*q, load(&k[c * 16..]), sum);
                    }
                    *acc = sum;
                }
            }
            let mut s = hsum16(acc);
            if let Some(cap) = softcap {
                let mut lanes = [0f32; 16];
                store(&mut lanes, s);
                lanes.iter_mut().for_each(|x| *x = (*x / cap).tanh() * cap);
                s = load(&lanes);
            }
            s = _mm512_mask_blend_ps(mask(b), _mm512_set1_ps(f32::NEG_INFINITY), s);
            top = _mm512_max_ps(top, s);
            store(&mut scores[16 * b..], s);
        }
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(top));
        // Weights exp(s - max) in place, padding 0; their sum lane-wise, then across lanes.
        let mut total = _mm512_setzero_ps();
        for b in 0..blocks {
            let e = _mm512_maskz_mov_ps(mask(b), exp(_mm512_sub_ps(load(&scores[16 * b..]), max)));
            total = _mm512_add_ps(total, e);
            store(&mut scores[16 * b..], e);
        }
        let inv = _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(total));
        // Values: positions first + 2i into `even`, first + 2i + 1 into `odd`.
        let mut even = [_mm512_setzero_ps(); N];
        let mut odd = [_mm512_setzero_ps(); N];
        let weights = &scores[..len];
        let mut pairs = weights.chunks_exact(2);
        for (i, w) in pairs.by_ref().enumerate() {
            let (v0, v1) = (value(first + 2 * i), value(first + 2 * i + 1));
            let (e0, e1) = (_mm512_set1_ps(w[0]), _mm512_set1_ps(w[1]));
            for c in 0..N {
                even[c] = _mm512_fmadd_ps(e0, load(&v0[c * 16..]), even[c]);
                odd[c] = _mm512_fmadd_ps(e1, load(&v1[c * 16..]), odd[c]);
            }
        }
        if let [w] = pairs.remainder() {
            let v0 = value(last);
            let e0 = _mm512_set1_ps(*w);
            for c in 0..N {
                even[c] = _mm512_fmadd_ps(e0, load(&v0[c * 16..]), even[c]);
            }
        }
        for c in 0..N {
            store(
                &mut out[16 * c..],
                _mm512_mul_ps(_mm512_add_ps(even[c], odd[c]), inv),
            );
        }
    }

    /// The first 16 floats of `x`.
    #[inline(always)]
    fn load(x: &[f32]) -> __m512 {
        assert!(x.len() >= 16);
        // SAFETY: 16 floats are in bounds (asserted); AVX-512F in every caller.
        unsafe { _mm512_loadu_ps(x.as_ptr()) }
    }

    /// `v` into the first 16 floats of `x`.
    #[inline(always)]
    fn store(x: &mut [f32], v: __m512) {
        assert!(x.len() >= 16);
        // SAFETY: 16 floats are in bounds (asserted); AVX-512F in every caller.
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) }
    }

    /// Lane `l` of the result is the sum of the lanes of `v[4 (l % 4) + l / 4]`, each summed by
    /// the same tree: lanes `i` and `i + 8`, then 4, 2 and 1 apart.
    #[inline(always)]
    fn hsum16(v: [__m512; 16]) -> __m512 {
        // SAFETY (all): AVX-512F in every caller.
        unsafe {
            let u: [__m512; 8] = std::array::from_fn(|i| {
                let (a, b) = (v[2 * i], v[2 * i + 1]);
                _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x44>(a, b),
                    _mm512_shuffle_f32x4::<0xEE>(a, b),
                )
            });
            let w: [__m512; 4] = std::array::from_fn(|i| {
                let (a, b) = (u[2 * i], u[2 * i + 1]);
                _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0x88>(a, b),
                    _mm512_shuffle_f32x4::<0xDD>(a, b),
                )
            });
            let z: [__m512; 2] = std::array::from_fn(|i| {
                let (a, b) = (w[2 * i], w[2 * i + 1]);
                _mm512_add_ps(
                    _mm512_shuffle_ps::<0x44>(a, b),
                    _mm512_shuffle_ps::<0xEE>(a, b),
                )
            });
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x88>(z[0], z[1]),
                _mm512_shuffle_ps::<0xDD>(z[0], z[1]),
            )
        }
    }

    /// `e^x` for `x ≤ 0` (a softmax's shifted scores): Cephes' `expf` (the exponent split off
    /// as `n ln 2`, a degree-7 polynomial of the rest), `2^n` applied by `scalef`; within 2
    /// ulp of the exact value, 0 below -104.
    #[inline(always)]
    fn exp(x: __m512) -> __m512 {
        // SAFETY (all): AVX-512F in every caller.
        unsafe {
            let x = _mm512_max_ps(x, _mm512_set1_ps(-104.0));
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm512_set1_ps(1.987_569_1e-4);
            for c in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                0.166_666_65,
                0.5,
            ] {
                p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
            }
            let p = _mm512_fmadd_ps(
                p,
                _mm512_mul_ps(r, r),
                _mm512_add_ps(r, _mm512_set1_ps(1.0)),
            );
            _mm512_scalef_ps(p, n)
        }
    }

    /// `a · b` for equal lengths that are multiples of 16 (widths past [`query_row`]'s).
    #[target_feature(enable = "avx512f")]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = _mm512_setzero_ps();
        for (a, b) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
            acc = _mm512_add_ps(acc, _mm512_mul_ps(load(a), load(b)));
        }
        _mm512_reduce_add_ps(acc)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn hsum16_sums_each_vector_into_its_lane() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                return;
            }
            let v: [[f32; 16]; 16] =
                std::array::from_fn(|s| std::array::from_fn(|l| (s * 100 + l * l) as f32));
            let mut got = [0f32; 16];
            // SAFETY: AVX-512F checked above; 16 floats each.
            unsafe {
                let vs = std::array::from_fn(|s| load(&v[s]));
                _mm512_storeu_ps(got.as_mut_ptr(), hsum16(vs));
            }
            for (lane, g) in got.iter().enumerate() {
                let slot = 4 * (lane % 4) + lane / 4;
                assert_eq!(*g, v[slot].iter().sum::<f32>(), "lane {lane}");
            }
        }

        #[test]
        fn exp_is_within_two_ulp_of_libm() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                return;
            }
            let xs: Vec<f32> = (0..16 * 4096).map(|i| -(i as f32) * 0.0016).collect();
            for chunk in xs.chunks_exact(16) {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F checked above; 16 floats each.
                unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp(load(chunk))) };
                for (x, g) in chunk.iter().zip(got) {
                    let want = x.exp();
                    let ulp = (want.to_bits() as i64 - g.to_bits() as i64).abs();
                    assert!(ulp <= 2 || want < 1e-37, "exp({x}) = {g}, libm {want}");
                }
            }
        }
    }
}

/// `out += e · v`.
#[inline(always)]
fn axpy(e: f32, v: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(v) {
        *o += e * x;
    }
}

#[cfg(test)]
mod tests;
