//! AVX-512 micro-kernel of [`super::rows`]: blocks of [`R`] weight rows × up to [`MAX_T`]
//! token rows per pass over `in` (products of 4 or more token rows: [`R_WIDE`] × up to
//! [`MAX_T_WIDE`]), so each loaded `x` vector serves several weight rows and each `w` vector
//! several tokens (`R + T` loads per `R · T` multiply-adds, against about one load per
//! multiply-add for one weight row at a time, which bound 5-token products).
//!
//! Weights stream from memory, and a block of several token rows spends longer on each
//! cache line than a one-row block does. The hardware prefetcher alone then kept too few
//! lines in flight (a 5-row product read the weights at about 60% of a one-row product's
//! rate on the 2-core Xeon of docs/cpu.md), so such blocks prefetch the next block of weight
//! rows, line for line, as they sum the current one (one-row blocks do not: there the
//! software prefetches only cost issue slots).
//!
//! Summation order, the contract the tests check: every dot product `dot(x[i], w[j])` is
//! summed in one 16-lane accumulator over `in` in steps of 16 (the last step masked, its
//! missing lanes adding `0 · 0`), then its lanes by one fixed tree (lanes `l` and `l + 8`,
//! then `l` and `l + 4`, `l + 2`, `l + 1`; [`hsum`] for one accumulator, [`hsum8`] for eight
//! at once, add for add the same). Neither depends on the block shape, the number of token
//! rows or the thread split, so a row of a verification gets bitwise the result of the same
//! row in a one-token decode step.
use std::arch::x86_64::*;

/// Weight rows per block: `R · T` accumulators, `T` `x` vectors and one `w` vector fit the
/// 32 zmm registers for `T` ≤ [`MAX_T`], and [`hsum8`] reduces one token's `R` sums at once.
const R: usize = 8;

/// Most token rows per block.
const MAX_T: usize = 3;

/// Weight rows and most token rows per block when a product has more than [`MAX_T`] token
/// rows: all of a 4- or 5-token verification in one pass, so that every pass over a block
/// of `w` reads new weights from memory.
const R_WIDE: usize = 4;
const MAX_T_WIDE: usize = 5;

/// `y[i * stride + j] = dot(x[i], w[j])` for every token row `i < t` and every row `j` of
/// `w`; `x: [t, inp]`, `w: [rows, inp]`, `y: [t, stride]` with `rows ≤ stride`.
///
/// # Safety
/// The CPU must have AVX-512F. The lengths are checked by an assertion.
#[target_feature(enable = "avx512f")]
pub unsafe fn rows(x: &[f32], w: &[f32], t: usize, inp: usize, y: &mut [f32], stride: usize) {
    let out = w.len() / inp.max(1);
    assert!(
        inp > 0
            && t > 0
            && x.len() == t * inp
            && w.len() == out * inp
            && out <= stride
            && y.len() >= (t - 1) * stride + out
    );
    // SAFETY: AVX-512F is enabled here; the lengths were asserted.
    unsafe {
        if t <= MAX_T {
            shaped::<R, MAX_T>(x, w, t, inp, y, stride)
        } else {
            shaped::<R_WIDE, MAX_T_WIDE>(x, w, t, inp, y, stride)
        }
    }
}

/// [`rows`] in blocks of `N` weight rows × up to `M` token rows.
#[target_feature(enable = "avx512f")]
unsafe fn shaped<const N: usize, const M: usize>(
    x: &[f32],
    w: &[f32],
    t: usize,
    inp: usize,
    y: &mut [f32],
    stride: usize,
) {
    let out = w.len() / inp;
    let at = Block {
        i0: 0,
        j0: 0,
        inp,
        stride,
    };
    // Weight blocks outside, token blocks inside: a block's `N` rows of `w` stay in L1 while
    // every token block passes over them.
    let whole = out - out % N;
    for j0 in (0..out).step_by(N) {
        let mut i0 = 0;
        // Token blocks as even as possible (9 rows: 4 + 5).
        let blocks = t.div_ceil(M);
        for b in 0..blocks {
            let n = (t - i0) / (blocks - b);
            let at = Block { i0, j0, ..at };
            // SAFETY (both arms): AVX-512F is enabled here; rows `j0..j0 + N` (or the
            // single rows of a partial block) and tokens `i0..i0 + n` are in bounds
            // (asserted by `rows`).
            unsafe {
                if j0 < whole {
                    match n {
                        1 => block::<N, 1>(x, w, y, at),
                        2 => block::<N, 2>(x, w, y, at),
                        3 => block::<N, 3>(x, w, y, at),
                        4 => block::<N, 4>(x, w, y, at),
                        _ => block::<N, 5>(x, w, y, at),
                    }
                } else {
                    for j0 in j0..out {
                        let at = Block { j0, ..at };
                        match n {
                            1 => single::<1>(x, w, y, at),
                            2 => single::<2>(x, w, y, at),
                            3 => single::<3>(x, w, y, at),
                            4 => single::<4>(x, w, y, at),
                            _ => single::<5>(x, w, y, at),
                        }
                    }
                }
            }
            i0 += n;
        }
    }
}

/// Where a block sits: token rows from `i0`, weight rows from `j0`, of a product over `inp`
/// features into `y` rows `stride` apart.
#[derive(Clone, Copy)]
struct Block {
    i0: usize,
    j0: usize,
    inp: usize,
    stride: usize,
}

/// The 16-feature step of the `T` dot products of `x` rows `xp + b·inp` (`b < T`) with the
/// `N` `w` rows `wp + r·inp`, starting at feature `k`; `mask` selects the features present.
#[inline(always)]
unsafe fn step<const N: usize, const T: usize>(
    acc: &mut [[__m512; T]; N],
    xp: *const f32,
    wp: *const f32,
    inp: usize,
    k: usize,
    mask: __mmask16,
) {
    // SAFETY: the caller passes pointers valid for the masked lanes of these rows.
    unsafe {
        let xv: [__m512; T] =
            std::array::from_fn(|b| _mm512_maskz_loadu_ps(mask, xp.add(b * inp + k)));
        for (r, acc) in acc.iter_mut().enumerate() {
            let wv = _mm512_maskz_loadu_ps(mask, wp.add(r * inp + k));
            for (a, xv) in acc.iter_mut().zip(&xv) {
                *a = _mm512_fmadd_ps(*xv, wv, *a);
            }
        }
    }
}

/// The accumulators of `N` weight rows × `T` token rows at `at` (the module's order).
#[inline(always)]
unsafe fn accumulate<const N: usize, const T: usize>(
    x: &[f32],
    w: &[f32],
    at: Block,
) -> [[__m512; T]; N] {
    let Block { i0, j0, inp, .. } = at;
    debug_assert!((i0 + T) * inp <= x.len() && (j0 + N) * inp <= w.len());
    // SAFETY: rows `i0..i0 + T` of `x` and `j0..j0 + N` of `w` are in bounds (the
    // caller's contract), and every load below stays inside its row.
    unsafe {
        let (xp, wp) = (x.as_ptr().add(i0 * inp), w.as_ptr().add(j0 * inp));
        let mut acc = [[_mm512_setzero_ps(); T]; N];
        let body = inp - inp % 16;
        let mut k = 0;
        // The next block of weight rows, fetched into the cache while this one is summed.
        // Blocks of several token rows fetch the next block of weight rows into L1 while
        // they sum this one (module doc); one-row blocks leave it to the hardware.
        let ahead = T > 1 && (j0 + 2 * N) * inp <= w.len();
        let next = wp.add(N * inp);
        while k < body {
            if ahead {
                for r in 0..N {
                    _mm_prefetch::<_MM_HINT_T0>(next.add(r * inp + k) as *const i8);
                }
            }
            step(&mut acc, xp, wp, inp, k, !0);
            k += 16;
        }
        if k < inp {
            // The last `inp - k` < 16 features; masked-off lanes load 0 and add 0 · 0.
            step(&mut acc, xp, wp, inp, k, (1u16 << (inp - k)) - 1);
        }
        acc
    }
}

/// `y[(i0 + b) * stride + j0 + r] = dot(x[i0 + b], w[j0 + r])` for `r < N`, `b < T`
/// (`N` is 4 or 8).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn block<const N: usize, const T: usize>(x: &[f32], w: &[f32], y: &mut [f32], at: Block) {
    // SAFETY: AVX-512F is enabled; bounds are the caller's contract.
    let acc = unsafe { accumulate::<N, T>(x, w, at) };
    // One token's N accumulators together, padded with zeros to eight ([`hsum8`] sums each
    // accumulator on its own, so the padding does not touch the first N sums).
    let by_token: [[__m512; 8]; T] = std::array::from_fn(|b| {
        std::array::from_fn(|r| {
            if r < N {
                acc[r][b]
            } else {
                _mm512_setzero_ps()
            }
        })
    });
    for (b, acc) in by_token.into_iter().enumerate() {
        let sums = hsum8(acc);
        let at_y = (at.i0 + b) * at.stride + at.j0;
        y[at_y..at_y + N].copy_from_slice(&sums[..N]);
    }
}

/// One weight row (the end of `w` past its last whole block) against `T` token rows.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn single<const T: usize>(x: &[f32], w: &[f32], y: &mut [f32], at: Block) {
    // SAFETY: AVX-512F is enabled; bounds are the caller's contract.
    let acc = unsafe { accumulate::<1, T>(x, w, at) };
    for (b, a) in acc[0].iter().enumerate() {
        y[(at.i0 + b) * at.stride + at.j0] = hsum(*a);
    }
}

/// The sum of `v`'s 16 lanes by the module's tree.
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum(v: __m512) -> f32 {
    let a = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    );
    let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    let d = _mm_add_ss(c, _mm_shuffle_ps::<1>(c, c));
    _mm_cvtss_f32(d)
}

/// The lane sums of eight accumulators, each by the module's tree (bitwise [`hsum`] of
/// each), with their lanes transposed together: 24 shuffles and adds instead of 64.
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum8(v: [__m512; 8]) -> [f32; 8] {
    // Lanes l + l+8: pair (a, b) -> [a's 8 partials | b's 8 partials].
    let half = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    let (p01, p23) = (half(v[0], v[1]), half(v[2], v[3]));
    let (p45, p67) = (half(v[4], v[5]), half(v[6], v[7]));
    // Lanes l + l+4: 128-bit block j holds accumulator j (then j + 4) as 4 partials.
    let quarter = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    let (q03, q47) = (quarter(p01, p23), quarter(p45, p67));
    // Lanes l + l+2, within each 128-bit block: [v_j: 2 partials, v_{j+4}: 2 partials].
    let r = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(q03, q47),
        _mm512_shuffle_ps::<0b11_10_11_10>(q03, q47),
    );
    // Lanes l + l+1: block j = [sum v_j, sum v_{j+4}, (repeated)].
    let s = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(r, r),
        _mm512_shuffle_ps::<0b11_01_11_01>(r, r),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    let s = _mm512_castps512_ps256(_mm512_permutexvar_ps(order, s));
    let mut sums = [0f32; 8];
    // SAFETY: `sums` holds exactly the 8 floats stored.
    unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), s) };
    sums
}
