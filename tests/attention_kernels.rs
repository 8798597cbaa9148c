//! Attention of the newest `t` queries over a causal run of keys — the block a decode step, a
//! verification and a prefill each attend with — against the softmax formula computed in f64
//! on the host from the same (rounded) inputs, for every path `specdec::nn::causal_attention`
//! takes on the test device: on CUDA the split kernel (up to `SPLIT_MAX_ROWS` queries) and
//! flash attention (longer blocks, bf16 / f16), elsewhere and in f32 the chunked and masked
//! candle paths. Cases cover grouped-query heads (groups of 1 to 8), keys in a larger cache buffer (strided
//! heads), a history before the block, sliding windows that cut key tiles, softcaps, block
//! lengths that are not multiples of any tile, a block past `PREFILL_CHUNK`, and caches of
//! more splits than the split kernel has blocks per head; and each row of a block against the
//! same row attended alone (bitwise on CUDA). The same over sliding-window rings read in
//! place (`specdec::nn::ring_attention`: wrapped or not, windows shorter than a block, stale
//! positions), against the formula over the slots each row sees.
mod common;

use candle_core::{DType, Tensor};
use common::device;
use common::host::{host, values};
use specdec::nn::{causal_attention, ring_attention, PREFILL_CHUNK, SPLIT_MAX_ROWS};

/// One shape: heads, kv heads, head width, queries, keys before them, window, softcap.
#[derive(Debug, Clone, Copy)]
struct Case {
    heads: usize,
    kv: usize,
    d: usize,
    t: usize,
    history: usize,
    window: Option<usize>,
    softcap: Option<f64>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for d in [32, 64, 128] {
        for (t, history) in [(1, 40), (5, 0), (5, 130), (33, 0), (100, 7), (200, 70)] {
            for window in [None, Some(50)] {
                out.push(Case {
                    heads: 4,
                    kv: 2,
                    d,
                    t,
                    history,
                    window,
                    softcap: None,
                });
            }
        }
    }
    let big = PREFILL_CHUNK + 77;
    out.push(Case {
        heads: 4,
        kv: 1,
        d: 64,
        t: big,
        history: 3,
        window: None,
        softcap: None,
    });
    out.push(Case {
        heads: 2,
        kv: 2,
        d: 128,
        t: big,
        history: 0,
        window: Some(300),
        softcap: None,
    });
    // More splits of the cache than blocks per query head (`SPLIT_BLOCKS`): blocks take
    // several splits in turn; with a window, the first visible split is not the first.
    for window in [None, Some(8_500)] {
        out.push(Case {
            heads: 2,
            kv: 1,
            d: 32,
            t: 3,
            history: 9_000,
            window,
            softcap: None,
        });
    }
    // A block whose rows straddle a split boundary (256 keys) under short windows: each row
    // sees keys of one split (window 1), or some rows two and others one (window 4).
    for window in [1, 4] {
        out.push(Case {
            heads: 4,
            kv: 2,
            d: 64,
            t: 12,
            history: 250,
            window: Some(window),
            softcap: None,
        });
    }
    // Blocks of several rows over caches where the split kernel groups query heads for
    // blocks but not for single rows (from 768 keys; from 1,024 with eight warps a block):
    // each row must still equal the row attended alone.
    for (heads, kv, d, t, history) in [(8, 2, 128, 5, 800), (14, 2, 64, 7, 1_100)] {
        out.push(Case {
            heads,
            kv,
            d,
            t,
            history,
            window: None,
            softcap: None,
        });
    }
    // Query groups of more heads than one block of the split kernel takes (4): Qwen2.5's 7
    // query heads per kv head (blocks of 4 and 3), and 8.
    for (heads, kv) in [(14, 2), (8, 1)] {
        out.push(Case {
            heads,
            kv,
            d: 64,
            t: 5,
            history: 300,
            window: None,
            softcap: None,
        });
    }
    // A cache long enough for the split kernel to group query heads (blocks of 4 and 3).
    out.push(Case {
        heads: 14,
        kv: 2,
        d: 64,
        t: 2,
        history: 4_200,
        window: None,
        softcap: None,
    });
    for t in [5, 150] {
        out.push(Case {
            heads: 4,
            kv: 2,
            d: 64,
            t,
            history: 20,
            window: None,
            softcap: Some(1.0),
        });
    }
    out
}

/// `[t, heads * d]` by the formula, in f64, from the host copies of q `[heads, t, d]` and of
/// k, v `[kv, len, d]`.
fn reference(c: Case, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let len = c.history + c.t;
    let shape = (c.heads, c.kv, c.d, c.t, len);
    formula(shape, c.softcap, (q, k, v), |i| {
        let pos = c.history + i;
        (c.window.map_or(0, |w| (pos + 1).saturating_sub(w))..=pos).collect()
    })
}

/// `[t, heads * d]` by the formula, in f64, for `shape = (heads, kv, d, t, len)` from the
/// host copies of q `[heads, t, d]` and of k, v `[kv, len, d]`, query row `i` seeing the
/// key rows `seen(i)`.
fn formula(
    (heads, kv, d, t, len): (usize, usize, usize, usize, usize),
    softcap: Option<f64>,
    (q, k, v): (&[f32], &[f32], &[f32]),
    seen: impl Fn(usize) -> Vec<usize>,
) -> Vec<f32> {
    let g = heads / kv;
    let mut out = vec![0f32; t * heads * d];
    for i in 0..t {
        let keys = seen(i);
        for h in 0..heads {
            let kh = h / g;
            let qr = &q[(h * t + i) * d..][..d];
            let scores: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    let kr = &k[(kh * len + j) * d..][..d];
                    let s: f64 = qr.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    softcap.map_or(s, |cap| (s / cap).tanh() * cap)
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            for e in 0..d {
                let acc: f64 = keys
                    .iter()
                    .zip(&w)
                    .map(|(&j, p)| p * v[(kh * len + j) * d + e] as f64)
                    .sum();
                out[i * heads * d + h * d + e] = (acc / sum) as f32;
            }
        }
    }
    out
}

/// The case's queries `[1, heads, t, d]` and its key and value buffers `[1, kv, len + 24, d]`
/// (keys and values live in a cache buffer with room to spare, as the KV cache hands them
/// out), in `dtype` on the test device. The queries carry the softmax scale, as the model's
/// do: logits of about unit size.
fn inputs(c: Case, dtype: DType) -> (Tensor, Tensor, Tensor) {
    let dev = device::device();
    let capacity = c.history + c.t + 24;
    let q_scale = 2.0 / (c.d as f32).sqrt();
    let q = Tensor::from_vec(
        values(c.heads * c.t * c.d, 1, q_scale),
        (1, c.heads, c.t, c.d),
        &dev,
    )
    .unwrap()
    .to_dtype(dtype)
    .unwrap();
    let buffer = |seed| {
        Tensor::from_vec(
            values(c.kv * capacity * c.d, seed, 1.0),
            (1, c.kv, capacity, c.d),
            &dev,
        )
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
    };
    (q, buffer(2), buffer(3))
}

/// The engine options with the environment's `SPECDEC_*` overrides applied
/// (`scripts/gpu-tests.sh` runs this binary again under other kernel choices).
fn engine_from_env() {
    let options =
        specdec::engine::env::overrides(specdec::engine::get()).expect("SPECDEC_* overrides");
    specdec::engine::set(options).expect("engine options");
}

fn check(c: Case, dtype: DType, tol: f32) {
    let len = c.history + c.t;
    let (q, kb, vb) = inputs(c, dtype);
    let (k, v) = (kb.narrow(2, 0, len).unwrap(), vb.narrow(2, 0, len).unwrap());
    let got = causal_attention(&q, &k, &v, c.window, c.softcap).unwrap();
    assert_eq!(got.dims(), &[c.t, c.heads * c.d], "{c:?}");
    let want = reference(
        c,
        &host(&q),
        &host(&k.contiguous().unwrap()),
        &host(&v.contiguous().unwrap()),
    );
    assert_close(&host(&got), &want, tol, &format!("{dtype:?} {c:?}"));
}

/// `got` within `tol` times the largest `|want|` of `want`, element by element.
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max error {err} against max |ref| {scale} (tolerance {tol})"
    );
}

/// A row of a block against the same row attended alone: bit for bit on CUDA (the split
/// kernel's sums for a row never depend on the rows beside it), elsewhere within f32 rounding.
fn assert_row_alone(cuda: bool, row: &[f32], alone: &[f32], what: &str) {
    if cuda {
        assert!(row == alone, "{what} differs from the row attended alone");
    } else {
        let err = row
            .iter()
            .zip(alone)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 1e-5, "{what} is {err} from the row alone");
    }
}

#[test]
fn causal_attention_matches_the_formula_in_f32() {
    engine_from_env();
    for c in cases() {
        check(c, DType::F32, 1e-4);
    }
}

/// Half precision: the inputs are the rounded values on both sides; the kernels round the
/// probabilities (flash attention) or the scores (the candle path) and the output to 8 or 11
/// bits of mantissa.
#[test]
fn causal_attention_matches_the_formula_in_half_precision() {
    engine_from_env();
    for c in cases() {
        check(c, DType::BF16, 2e-2);
        check(c, DType::F16, 4e-3);
    }
}

/// Each row of a block attended in one call equals that row attended alone over the keys it
/// sees (the first `history + i + 1`): on CUDA bit for bit — the split kernel's split
/// boundaries, tiles and sums for a row do not depend on the other rows of its block, which
/// keeps a verification row's logits those of the decode step of the same token — elsewhere
/// within f32 rounding.
#[test]
fn block_rows_equal_each_row_alone() {
    engine_from_env();
    let dev = device::device();
    for c in cases().into_iter().filter(|c| c.t <= SPLIT_MAX_ROWS) {
        // Elsewhere in f32 only: the candle paths promise no half-precision bits.
        let dtypes: &[DType] = if dev.is_cuda() {
            &[DType::F32, DType::BF16]
        } else {
            &[DType::F32]
        };
        for &dtype in dtypes {
            let len = c.history + c.t;
            let (q, kb, vb) = inputs(c, dtype);
            let block = host(
                &causal_attention(
                    &q,
                    &kb.narrow(2, 0, len).unwrap(),
                    &vb.narrow(2, 0, len).unwrap(),
                    c.window,
                    c.softcap,
                )
                .unwrap(),
            );
            let width = c.heads * c.d;
            for i in 0..c.t {
                let seen = c.history + i + 1;
                let alone = host(
                    &causal_attention(
                        &q.narrow(2, i, 1).unwrap(),
                        &kb.narrow(2, 0, seen).unwrap(),
                        &vb.narrow(2, 0, seen).unwrap(),
                        c.window,
                        c.softcap,
                    )
                    .unwrap(),
                );
                let row = &block[i * width..(i + 1) * width];
                assert_row_alone(
                    dev.is_cuda(),
                    row,
                    &alone,
                    &format!("{dtype:?} {c:?}: row {i}"),
                );
            }
        }
    }
}

/// A sliding-window ring: heads, kv heads, head width, queries, slots, window, one past the
/// newest position, the oldest intact position.
#[derive(Debug, Clone, Copy)]
struct Ring {
    heads: usize,
    kv: usize,
    d: usize,
    t: usize,
    capacity: usize,
    window: usize,
    end: usize,
    lo: usize,
}

fn rings() -> Vec<Ring> {
    let ring = |heads, kv, d, t, capacity, window, end, lo| Ring {
        heads,
        kv,
        d,
        t,
        capacity,
        window,
        end,
        lo,
    };
    vec![
        // Not yet wrapped; wrapped many times, the visible run crossing the last slot.
        ring(4, 2, 64, 5, 300, 290, 200, 0),
        ring(4, 2, 64, 5, 300, 290, 1_000, 0),
        // Blocks of four rows and one (t = 9), the run ending in the ring's short last split
        // (300 slots: splits of 256 and 44).
        ring(4, 2, 64, 9, 300, 292, 2_110, 0),
        // A ring whose window reaches the keys from which the kernel groups query heads
        // (Mistral's 4,096): group 4, the run wrapping mid-split.
        ring(8, 2, 128, 5, 4_104, 4_096, 9_000, 0),
        ring(8, 2, 128, 7, 4_104, 4_096, 12_400, 0),
        // Gemma 3's head width (d = 256) and local window, group 2.
        ring(4, 2, 256, 5, 1_033, 1_024, 5_000, 0),
        // Windows shorter than the block: rows see different splits, some one, some two.
        ring(4, 2, 64, 6, 520, 4, 769, 0),
        ring(4, 2, 64, 6, 520, 1, 1_290, 0),
        // Positions below `lo` stale (a ring refilled from `lo` on).
        ring(4, 1, 32, 5, 300, 290, 1_000, 900),
    ]
}

/// A ring's queries `[1, heads, t, d]` and slot buffers `[1, kv, capacity, d]` in `dtype`.
fn ring_inputs(r: Ring, dtype: DType) -> (Tensor, Tensor, Tensor) {
    let c = Case {
        heads: r.heads,
        kv: r.kv,
        d: r.d,
        t: r.t,
        history: r.capacity - r.t - 24,
        window: None,
        softcap: None,
    };
    inputs(c, dtype)
}

/// The slots row `i` of a ring's block sees: those holding positions `(qpos - window,
/// qpos]` from `lo` on, where slot `s` holds the newest position below `end` congruent to
/// `s`.
fn ring_seen(r: Ring, i: usize) -> Vec<usize> {
    let qpos = r.end - r.t + i;
    let from = (qpos + 1).saturating_sub(r.window).max(r.lo);
    (from..=qpos).map(|p| p % r.capacity).collect()
}

/// Attention over a ring read in place (the rows of a verification over a rotating cache):
/// the block against the formula, and each row against the row attended alone (bitwise on
/// CUDA, where the split kernel takes the ring as it lies and a row's sums depend on its
/// position and the ring only; elsewhere within f32 rounding).
#[test]
fn ring_rows_match_the_formula_and_each_row_alone() {
    engine_from_env();
    let dev = device::device();
    for r in rings() {
        let dtypes: &[(DType, f32)] = if dev.is_cuda() {
            &[(DType::F32, 1e-4), (DType::BF16, 2e-2)]
        } else {
            &[(DType::F32, 1e-4)]
        };
        for &(dtype, tol) in dtypes {
            let (q, k, v) = ring_inputs(r, dtype);
            let at = |q: &Tensor, t: usize| {
                host(&ring_attention(q, (&k, &v), (r.end - r.t + t, r.lo, r.window), None).unwrap())
            };
            let block = at(&q, r.t);
            let shape = (r.heads, r.kv, r.d, r.t, r.capacity);
            let want = formula(shape, None, (&host(&q), &host(&k), &host(&v)), |i| {
                ring_seen(r, i)
            });
            assert_close(&block, &want, tol, &format!("{dtype:?} {r:?}"));
            let width = r.heads * r.d;
            for i in 0..r.t {
                let alone = at(&q.narrow(2, i, 1).unwrap(), i + 1);
                let row = &block[i * width..(i + 1) * width];
                assert_row_alone(
                    dev.is_cuda(),
                    row,
                    &alone,
                    &format!("{dtype:?} {r:?}: row {i}"),
                );
            }
        }
    }
}
