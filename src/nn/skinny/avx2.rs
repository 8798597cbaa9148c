//! AVX2/FMA kernel of [`super::rows`] for CPUs without AVX-512: one weight row of `W` as
//! stored (row-major) at a time against up to [`BLOCK`] token rows, about one load per
//! multiply-add.
use std::arch::x86_64::*;

/// Tokens handled per pass over a row of `w`: eight accumulators plus the `w` vector
/// and an `x` load fit the sixteen ymm registers.
const BLOCK: usize = 8;

/// `y[i] = dot(x[i], w_row)` for `i < t`, in blocks of up to [`BLOCK`] tokens.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn single(x: &[f32], w_row: &[f32], t: usize, y: &mut [f32]) {
    let mut i0 = 0;
    while i0 < t {
        let n = (t - i0).min(BLOCK);
        // A block size known at compile time keeps the accumulators in registers. Blocks
        // of one or two tokens split each dot product over several accumulators: one
        // chain of dependent FMAs would wait on the FMA latency every step (a one-token
        // decode ran ~20% slower than candle's gemv that way).
        match n {
            1 => block::<1, 4>(x, w_row, i0, y),
            2 => block::<2, 2>(x, w_row, i0, y),
            3 => block::<3, 1>(x, w_row, i0, y),
            4 => block::<4, 1>(x, w_row, i0, y),
            5 => block::<5, 1>(x, w_row, i0, y),
            6 => block::<6, 1>(x, w_row, i0, y),
            7 => block::<7, 1>(x, w_row, i0, y),
            _ => block::<BLOCK, 1>(x, w_row, i0, y),
        }
        i0 += n;
    }
}

/// `y[i0 + b] = dot(x[i0 + b], w_row)` for `b < N`, each dot product over `U`
/// independent accumulators (`N · U` ≤ [`BLOCK`] keeps them in registers).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const N: usize, const U: usize>(
    x: &[f32],
    w_row: &[f32],
    i0: usize,
    y: &mut [f32],
) {
    let inp = w_row.len();
    let body = inp - inp % 8;
    let wide = inp - inp % (8 * U);
    let mut acc = [[_mm256_setzero_ps(); U]; N];
    let (xp, wp) = (x.as_ptr().add(i0 * inp), w_row.as_ptr());
    let mut k = 0;
    while k < wide {
        for u in 0..U {
            let wv = _mm256_loadu_ps(wp.add(k + 8 * u));
            for (b, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(xp.add(b * inp + k + 8 * u));
                a[u] = _mm256_fmadd_ps(xv, wv, a[u]);
            }
        }
        k += 8 * U;
    }
    while k < body {
        let wv = _mm256_loadu_ps(wp.add(k));
        for (b, a) in acc.iter_mut().enumerate() {
            a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(b * inp + k)), wv, a[0]);
        }
        k += 8;
    }
    for (b, a) in acc.iter().enumerate() {
        let row = &x[(i0 + b) * inp..(i0 + b + 1) * inp];
        let tail: f32 = (body..inp).map(|k| row[k] * w_row[k]).sum();
        let mut sum = a[0];
        for part in &a[1..] {
            sum = _mm256_add_ps(sum, *part);
        }
        y[i0 + b] = hsum(sum) + tail;
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}
