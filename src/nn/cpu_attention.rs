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
pub enum Keys {
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
}

/// Attention of `q: [1, h, t, d]` over `k`, `v: [1, kv, rows, d]` (`h` a multiple of `kv`,
/// logits optionally `tanh`-capped; the softmax scale already in `q`) as `[t, h * d]`; `None`
/// unless every operand is f32 on the CPU with a unit stride along `d`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    keys: Keys,
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

struct CpuAttention {
    keys: Keys,
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

impl CustomOp3 for CpuAttention {
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
        // Key rows of query `i` in position order: `first(i) ..= last(i)`, row `p % wrap`.
        let (wrap, last_of, lo) = match self.keys {
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
            let last = last_of + i;
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
            let key = |p: usize| k.row(kvh, p % wrap, d);
            let value = |p: usize| v.row(kvh, p % wrap, d);
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

/// The kernel for AVX-512F CPUs and a head width that is a multiple of 16: the dot products
/// in 512-bit registers.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::query_row`] with [`dot`], compiled for AVX-512F.
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
        let dot = |a: &[f32], b: &[f32]| dot(a, b);
        super::query_row(query, positions, key, value, dot, softcap, scores, out)
    }

    /// `a · b` for equal lengths that are multiples of 16.
    #[target_feature(enable = "avx512f")]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = _mm512_setzero_ps();
        for (a, b) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
            // SAFETY: each chunk holds 16 floats.
            let (x, y) = unsafe { (_mm512_loadu_ps(a.as_ptr()), _mm512_loadu_ps(b.as_ptr())) };
            acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
        }
        _mm512_reduce_add_ps(acc)
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
mod tests {
    use super::*;
    use candle_core::{Device, IndexOp};

    /// Reference: candle's ops, one query at a time over its visible keys (gathered).
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, keys: Keys, cap: Option<f64>) -> Tensor {
        let (_, h, t, d) = q.dims4().unwrap();
        let (kv, rows) = (k.dim(1).unwrap(), k.dim(2).unwrap());
        let mut out = Vec::new();
        for i in 0..t {
            let (pos, first, wrap) = match keys {
                Keys::Suffix { window } => {
                    let pos = rows - t + i;
                    (pos, window.map_or(0, |w| (pos + 1).saturating_sub(w)), rows)
                }
                Keys::Ring { end, lo, window } => {
                    let pos = end - t + i;
                    (pos, (pos + 1).saturating_sub(window).max(lo), rows)
                }
            };
            let idx: Vec<u32> = (first..=pos).map(|p| (p % wrap) as u32).collect();
            let idx = Tensor::new(idx.as_slice(), &Device::Cpu).unwrap();
            let mut heads = Vec::new();
            for head in 0..h {
                let kvh = head / (h / kv);
                let kk = k.i((0, kvh)).unwrap().index_select(&idx, 0).unwrap();
                let vv = v.i((0, kvh)).unwrap().index_select(&idx, 0).unwrap();
                let qq = q.i((0, head, i..i + 1)).unwrap();
                let mut s = qq.matmul(&kk.t().unwrap()).unwrap();
                if let Some(c) = cap {
                    s = ((s / c).unwrap().tanh().unwrap() * c).unwrap();
                }
                let p = candle_nn::ops::softmax_last_dim(&s).unwrap();
                heads.push(p.matmul(&vv).unwrap().reshape(d).unwrap());
            }
            out.push(Tensor::cat(&heads, 0).unwrap());
        }
        Tensor::stack(&out, 0).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    /// Suffix and ring blocks of every length, windows, a cap, grouped heads, strided
    /// caches: within float rounding of candle's ops, and each row bitwise the one-query
    /// block's result for the same position (what a decode step computes).
    #[test]
    fn matches_candles_ops_and_rows_do_not_depend_on_the_block() {
        // Head widths 40 (the portable lanes) and 64 (AVX-512 where the CPU has it).
        for d in [40, 64] {
            check_every_block(d);
        }
    }

    fn check_every_block(d: usize) {
        let dev = Device::Cpu;
        let (h, kv, cap) = (6, 2, 24);
        // A buffer wider than the keys in use: strided views like a cache's.
        let kb = Tensor::randn(0f32, 1., (1, kv, cap + 3, d), &dev).unwrap();
        let vb = Tensor::randn(0f32, 1., (1, kv, cap + 3, d), &dev).unwrap();
        let (k, v) = (kb.narrow(2, 0, cap).unwrap(), vb.narrow(2, 0, cap).unwrap());
        let qs = Tensor::randn(0f32, 1., (1, h, 9, d), &dev).unwrap();
        let cases = [
            Keys::Suffix { window: None },
            Keys::Suffix { window: Some(5) },
            Keys::Ring {
                end: 30,
                lo: 0,
                window: 16,
            },
            Keys::Ring {
                end: 37,
                lo: 20,
                window: 12,
            },
        ];
        for keys in cases {
            for t in 1..=9 {
                for softcap in [None, Some(3.0)] {
                    let q = qs.narrow(2, 9 - t, t).unwrap().contiguous().unwrap();
                    let got = attention(&q, &k, &v, keys, softcap).unwrap().unwrap();
                    let want = reference(&q, &k, &v, keys, softcap);
                    let diff = max_diff(&got, &want.reshape((t, h * d)).unwrap());
                    assert!(diff < 1e-5, "d={d} {keys:?} t={t} cap={softcap:?}: {diff}");
                    // Row 0 alone, as a one-token step at its position computes it.
                    let q1 = q.narrow(2, 0, 1).unwrap().contiguous().unwrap();
                    let alone = match keys {
                        Keys::Suffix { .. } => {
                            let seen = cap - t + 1;
                            let (k1, v1) =
                                (k.narrow(2, 0, seen).unwrap(), v.narrow(2, 0, seen).unwrap());
                            attention(&q1, &k1, &v1, keys, softcap)
                        }
                        Keys::Ring { end, lo, window } => {
                            let one = Keys::Ring {
                                end: end - t + 1,
                                lo,
                                window,
                            };
                            attention(&q1, &k, &v, one, softcap)
                        }
                    };
                    let alone = alone.unwrap().unwrap().to_vec2::<f32>().unwrap();
                    let rows = got.to_vec2::<f32>().unwrap();
                    assert_eq!(
                        alone[0], rows[0],
                        "d={d} {keys:?} t={t}: row 0 of the block"
                    );
                }
            }
        }
    }

    #[test]
    fn other_dtypes_and_devices_are_left_to_candle() {
        let q = Tensor::zeros((1, 2, 1, 8), candle_core::DType::F16, &Device::Cpu).unwrap();
        let k = Tensor::zeros((1, 1, 4, 8), candle_core::DType::F16, &Device::Cpu).unwrap();
        let keys = Keys::Suffix { window: None };
        assert!(attention(&q, &k, &k, keys, None).unwrap().is_none());
    }
}
