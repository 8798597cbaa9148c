//! The CPU attention kernel against candle's ops, and each row of a block against the
//! one-token step at its position.
use super::*;
use candle_core::{Device, IndexOp};

/// Reference: candle's ops, one query at a time over its visible keys (gathered).
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, keys: Keys<'_>, cap: Option<f64>) -> Tensor {
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
            Keys::Tree { .. } => unreachable!("trees gather their keys before the reference"),
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
    // Head widths 40 (the portable lanes) and 16, 64, 256 (AVX-512 where the CPU has it).
    for d in [16, 40, 64, 256] {
        check_every_block(d);
    }
}

fn check_every_block(d: usize) {
    let dev = Device::Cpu;
    // Blocks of up to 20 rows (a verification block past 16 rows, as trees make).
    const ROWS: usize = 20;
    let (h, kv, cap) = (6, 2, 40);
    // A buffer wider than the keys in use: strided views like a cache's.
    let kb = Tensor::randn(0f32, 1., (1, kv, cap + 3, d), &dev).unwrap();
    let vb = Tensor::randn(0f32, 1., (1, kv, cap + 3, d), &dev).unwrap();
    let (k, v) = (kb.narrow(2, 0, cap).unwrap(), vb.narrow(2, 0, cap).unwrap());
    let qs = Tensor::randn(0f32, 1., (1, h, ROWS, d), &dev).unwrap();
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
        for t in 1..=ROWS {
            // Queries are never older than a ring's oldest intact position.
            if matches!(keys, Keys::Ring { end, lo, .. } if end - t < lo) {
                continue;
            }
            for softcap in [None, Some(3.0)] {
                let q = qs.narrow(2, ROWS - t, t).unwrap().contiguous().unwrap();
                let got = attention(&q, &k, &v, keys, softcap).unwrap().unwrap();
                let want = reference(&q, &k, &v, keys, softcap);
                let diff = max_diff(&got, &want.reshape((t, h * d)).unwrap());
                assert!(diff < 1e-5, "d={d} {keys:?} t={t} cap={softcap:?}: {diff}");
                // Each row alone, as a one-token step at its position computes it.
                let rows = got.to_vec2::<f32>().unwrap();
                for (i, row) in rows.iter().enumerate() {
                    let q1 = q.narrow(2, i, 1).unwrap().contiguous().unwrap();
                    let alone = match keys {
                        Keys::Suffix { .. } => {
                            let seen = cap - t + i + 1;
                            let (k1, v1) =
                                (k.narrow(2, 0, seen).unwrap(), v.narrow(2, 0, seen).unwrap());
                            attention(&q1, &k1, &v1, keys, softcap)
                        }
                        Keys::Ring { end, lo, window } => {
                            let one = Keys::Ring {
                                end: end - t + i + 1,
                                lo,
                                window,
                            };
                            attention(&q1, &k, &v, one, softcap)
                        }
                        Keys::Tree { .. } => unreachable!("not among the cases"),
                    };
                    let alone = alone.unwrap().unwrap().to_vec2::<f32>().unwrap();
                    assert_eq!(&alone[0], row, "d={d} {keys:?} t={t}: row {i} of the block");
                }
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

/// Token-tree blocks (all nodes, or the newest of an extended tree): each node's row is
/// bitwise the one-token step at its position once its path is committed (the prefix, then
/// its ancestors' K/V, root first), which is within rounding of candle's ops.
#[test]
fn tree_rows_equal_one_token_steps_along_their_paths() {
    let dev = Device::Cpu;
    let parents = [
        None,
        Some(0),
        Some(0),
        Some(1),
        Some(2),
        Some(2),
        Some(3),
        Some(5),
    ];
    let tree = crate::cache::TokenTree::new([&parents[..], &[Some(0)]].concat()).unwrap();
    let (h, kv, base, n) = (6, 2, 23, tree.len());
    for d in [16, 40, 64, 256] {
        let k = Tensor::randn(0f32, 1., (1, kv, base + n, d), &dev).unwrap();
        let v = Tensor::randn(0f32, 1., (1, kv, base + n, d), &dev).unwrap();
        let qs = Tensor::randn(0f32, 1., (1, h, n, d), &dev).unwrap();
        for (first, softcap) in [(0, None), (0, Some(3.0)), (4, None)] {
            let q = qs
                .narrow(2, first, n - first)
                .unwrap()
                .contiguous()
                .unwrap();
            let keys = Keys::Tree {
                base,
                first,
                tree: &tree,
            };
            let got = attention(&q, &k, &v, keys, softcap).unwrap().unwrap();
            for (i, row) in got.to_vec2::<f32>().unwrap().iter().enumerate() {
                let path: Vec<usize> =
                    std::iter::successors(Some(first + i), |&a| tree.parent(a)).collect();
                let rows: Vec<u32> = (0..base)
                    .chain(path.iter().rev().map(|&a| base + a))
                    .map(|r| r as u32)
                    .collect();
                let rows = Tensor::new(rows.as_slice(), &dev).unwrap();
                let (kp, vp) = (
                    k.index_select(&rows, 2).unwrap(),
                    v.index_select(&rows, 2).unwrap(),
                );
                let q1 = q.narrow(2, i, 1).unwrap().contiguous().unwrap();
                let step = Keys::Suffix { window: None };
                let alone = attention(&q1, &kp, &vp, step, softcap).unwrap().unwrap();
                let node = first + i;
                assert_eq!(
                    &alone.to_vec2::<f32>().unwrap()[0],
                    row,
                    "d={d} node {node}"
                );
                let want = reference(&q1, &kp, &vp, step, softcap).reshape((1, h * d));
                assert!(max_diff(&alone, &want.unwrap()) < 1e-5, "d={d} node {node}");
            }
        }
    }
}

/// A tree whose block does not end the keys, or queries that are not its newest nodes, is
/// an error, not a wrong read.
#[test]
fn a_tree_that_does_not_fit_the_keys_is_refused() {
    let dev = Device::Cpu;
    let tree = crate::cache::TokenTree::new(vec![None, Some(0), Some(0)]).unwrap();
    let q = Tensor::zeros((1, 2, 3, 16), candle_core::DType::F32, &dev).unwrap();
    let k = Tensor::zeros((1, 1, 9, 16), candle_core::DType::F32, &dev).unwrap();
    for (base, first) in [(5, 0), (6, 1)] {
        let keys = Keys::Tree {
            base,
            first,
            tree: &tree,
        };
        assert!(
            attention(&q, &k, &k, keys, None).is_err(),
            "base {base} first {first}"
        );
    }
}
