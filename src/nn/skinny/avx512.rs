//! AVX-512 micro-kernel of [`super::rows`] over the blocked layout (`Stored::Blocked`): each
//! block of [`ROWS`] weight rows is one contiguous run of 64-byte lines, and a pass over it
//! takes up to [`MAX_T`] token rows, so each loaded `x` vector serves the block's weight rows
//! and each `w` vector several tokens. Weights are f32 ([`F32`]) or f16 ([`F16`], widened to
//! f32 as they are loaded).
//!
//! Why a layout of its own: with `W` row-major, a block of weight rows is several streams
//! (one per row) that the hardware prefetchers follow poorly once a block spends longer on
//! each line than a one-row product does; products of 2–5 token rows read the weights from
//! memory at 70–85% of a one-row product's rate on the 2-core Zen 5 VM of
//! docs/cpu-zen5-2026-12-05.md. The blocked matrix is one sequential stream, and each step
//! prefetches the lines [`AHEAD`] floats further on, so a few-row product streams at the
//! one-row rate.
//!
//! Summation order, the contract the tests check: every dot product `dot(x[i], w[j])` is
//! summed in one 16-lane accumulator over `in` in steps of 16 (the last step's missing lanes
//! adding `0 · 0`: `x` loaded masked, `w` padded with zeros), then its lanes by one fixed tree
//! (lanes `l` and `l + 8`, then `l` and `l + 4`, `l + 2`, `l + 1`; [`hsum8`], add for add
//! the same for each accumulator). Neither depends on the token rows beside it or the thread
//! split, so a row of a verification gets bitwise the result of the same row in a one-token
//! decode step.
use std::arch::x86_64::*;

use super::blocked::{Line, ROWS};

/// Most token rows per pass over a block: `ROWS · T` accumulators, `T` `x` vectors and a `w`
/// vector in the 32 zmm registers. Longer inputs pass over a block in several token blocks,
/// the later ones reading it from L1.
const MAX_T: usize = 4;

/// How far ahead of its current step a pass prefetches, in bytes (with 1–16 KiB, 2–4-row
/// products from memory took 1.0–1.1× a one-row product, against 1.2–1.3× without).
const AHEAD: usize = 4096;

/// A weight element of the blocked layout.
pub trait Elem {
    /// Bytes per weight.
    const BYTES: usize;
    /// The 16 weights at `p` as f32.
    ///
    /// # Safety
    /// AVX-512F; `p` points at 16 elements aligned to their size.
    unsafe fn load(p: *const u8) -> __m512;
}

/// f32 weights.
pub struct F32;

/// f16 weights, widened exactly to f32.
pub struct F16;

impl Elem for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract (64-byte aligned lines).
        unsafe { _mm512_load_ps(p.cast()) }
    }
}

impl Elem for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract (32-byte aligned halves of lines).
        unsafe { _mm512_cvtph_ps(_mm256_load_si256(p.cast())) }
    }
}

/// `y[i * stride + j] = dot(x[i], w[j])` for every token row `i < t` and weight row `j < rows`
/// of the blocked `w` (whole blocks of [`ROWS`] rows of `E`; rows past `rows` are padding);
/// `x: [t, inp]`, `y: [t, stride]` with `rows ≤ stride`.
///
/// # Safety
/// The CPU must have AVX-512F. The lengths are checked by an assertion.
#[target_feature(enable = "avx512f")]
pub unsafe fn rows<E: Elem>(
    x: &[f32],
    w: &[Line],
    inp: usize,
    rows: usize,
    t: usize,
    y: &mut [f32],
    stride: usize,
) {
    let steps = inp.div_ceil(16);
    let blocks = rows.div_ceil(ROWS);
    assert!(
        inp > 0
            && t > 0
            && x.len() == t * inp
            && w.len() * 64 == blocks * steps * ROWS * 16 * E::BYTES
            && rows <= stride
            && y.len() >= (t - 1) * stride + rows
    );
    let at = Pass {
        w: w.as_ptr().cast::<u8>(),
        end: w.as_ptr_range().end.cast::<u8>(),
        x: x.as_ptr(),
        inp,
    };
    // Token blocks as even as possible (5 rows: 3 + 2), each a pass over the weight block;
    // the first pass reads the block from memory, the others from L1.
    let passes = t.div_ceil(MAX_T);
    for b in 0..blocks {
        let mut i0 = 0;
        for p in 0..passes {
            let n = (t - i0) / (passes - p);
            // SAFETY (every arm): AVX-512F is enabled here; block `b` and token rows
            // `i0..i0 + n` are in bounds (asserted above).
            unsafe {
                match n {
                    1 => block::<E, 1>(at, b, i0, y, rows, stride),
                    2 => block::<E, 2>(at, b, i0, y, rows, stride),
                    3 => block::<E, 3>(at, b, i0, y, rows, stride),
                    _ => block::<E, 4>(at, b, i0, y, rows, stride),
                }
            }
            i0 += n;
        }
    }
}

/// The operands of a product: the blocked weights (bytes `w` to `end`), the token rows `x`
/// and their width.
#[derive(Clone, Copy)]
struct Pass {
    w: *const u8,
    end: *const u8,
    x: *const f32,
    inp: usize,
}

/// The accumulators of block `b`'s [`ROWS`] weight rows × token rows `i0..i0 + T`.
///
/// # Safety
/// AVX-512F (inlined into [`block`], which enables it); block `b` and the token rows are in
/// bounds.
#[inline(always)]
unsafe fn pass<E: Elem, const T: usize>(at: Pass, b: usize, i0: usize) -> [[__m512; T]; ROWS] {
    let Pass { w, end, x, inp } = at;
    let steps = inp.div_ceil(16);
    let mut acc = [[_mm512_setzero_ps(); T]; ROWS];
    // The prefetch target, clamped to the matrix's last step (branch-free: a branch per
    // line split the loop and the accumulators spilled).
    let per_step = ROWS * 16 * E::BYTES;
    let last = end as usize - per_step;
    // SAFETY: the block's lines and the token rows are in bounds (the caller's contract);
    // prefetched addresses are inside the matrix (clamped above).
    unsafe {
        let mut wp = w.add(b * steps * per_step);
        let xp = x.add(i0 * inp);
        let full = inp / 16;
        for s in 0..full {
            let ahead = (wp as usize + AHEAD).min(last) as *const i8;
            for line in 0..per_step / 64 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.add(line * 64));
            }
            step::<E, T>(&mut acc, xp, wp, inp, s * 16, !0);
            wp = wp.add(per_step);
        }
        if full < steps {
            // The last `inp - 16 · full` features; `x`'s missing ones load 0 and meet zero
            // padding in `w`.
            let k = full * 16;
            step::<E, T>(&mut acc, xp, wp, inp, k, (1u16 << (inp - k)) - 1);
        }
    }
    acc
}

/// One 16-feature step: the `T` token rows of `x` at `xp` (rows `inp` apart) from feature
/// `k` (lanes in `mask`), against the [`ROWS`] lines at `wp`.
///
/// # Safety
/// AVX-512F; the lines and the masked lanes are in bounds.
#[inline(always)]
unsafe fn step<E: Elem, const T: usize>(
    acc: &mut [[__m512; T]; ROWS],
    xp: *const f32,
    wp: *const u8,
    inp: usize,
    k: usize,
    mask: __mmask16,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let xv: [__m512; T] =
            std::array::from_fn(|i| _mm512_maskz_loadu_ps(mask, xp.add(i * inp + k)));
        for (r, acc) in acc.iter_mut().enumerate() {
            let wv = E::load(wp.add(r * 16 * E::BYTES));
            for (a, xv) in acc.iter_mut().zip(&xv) {
                *a = _mm512_fmadd_ps(*xv, wv, *a);
            }
        }
    }
}

/// One pass over block `b` for token rows `i0..i0 + T`, its sums written into `y` (the
/// block's rows below `rows`; padding rows are dropped). A function of its own (not inlined):
/// inlined into [`rows`] beside the other passes, the accumulators were kept in 16 of the 32
/// vector registers and spilled.
///
/// # Safety
/// AVX-512F; block `b` and the token rows are in bounds.
#[inline(never)]
#[target_feature(enable = "avx512f")]
unsafe fn block<E: Elem, const T: usize>(
    at: Pass,
    b: usize,
    i0: usize,
    y: &mut [f32],
    rows: usize,
    stride: usize,
) {
    // SAFETY: the caller's contract.
    let acc = unsafe { pass::<E, T>(at, b, i0) };
    let j0 = b * ROWS;
    let n = ROWS.min(rows - j0);
    // Token by token, indexing `acc` (gathering every token's rows into an array first made
    // the summing loop above spill its accumulators).
    #[allow(clippy::needless_range_loop)]
    for i in 0..T {
        // One token's accumulators together, padded with zeros to eight ([`hsum8`] sums each
        // accumulator on its own, so the padding does not touch the first sums).
        let row: [__m512; 8] = std::array::from_fn(|r| {
            if r < ROWS {
                acc[r][i]
            } else {
                _mm512_setzero_ps()
            }
        });
        let sums = hsum8(row);
        let at = (i0 + i) * stride + j0;
        y[at..at + n].copy_from_slice(&sums[..n]);
    }
}

/// The lane sums of eight accumulators, each by the module's tree, with their lanes
/// transposed together: 24 shuffles and adds instead of 64.
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
