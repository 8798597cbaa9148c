//! The blocked layout of `Stored::Blocked`, which the AVX-512 kernel ([`super::avx512`])
//! reads: lines of 64 bytes, f32 or (where lossless) f16 elements.
use std::sync::Arc;

/// Weight rows per block of the blocked layout; threads split `W` in whole blocks (of every
/// layout, so that the split does not depend on the kernel).
pub const ROWS: usize = 4;

/// One 64-byte cache line of the blocked layout (16 f32 or 32 f16 weights), aligned to a
/// line so that no vector load straddles two.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub struct Line([u8; 64]);

/// True when `v` is exactly an f16 value (NaN is not: its payload may not survive).
pub fn is_f16(v: f32) -> bool {
    half::f16::from_f32(v).to_f32().to_bits() == v.to_bits()
}

/// Bytes of one weight in the blocked layout.
fn elem_bytes(half: bool) -> usize {
    if half {
        2
    } else {
        4
    }
}

/// Lines of one block of [`ROWS`] rows of `inp` features.
pub fn block_lines(inp: usize, half: bool) -> usize {
    inp.div_ceil(16) * ROWS * 16 * elem_bytes(half) / 64
}

/// `w: [out, in]` (row-major) in the blocked layout of `Stored::Blocked` (f16 elements
/// when `half`: the caller checked they are exact).
pub fn blocked(w: &[f32], out: usize, inp: usize, half: bool) -> Arc<[Line]> {
    let steps = inp.div_ceil(16);
    let bytes = elem_bytes(half);
    let mut lines = vec![Line([0; 64]); out.div_ceil(ROWS) * block_lines(inp, half)];
    for (j, row) in w.chunks_exact(inp).enumerate() {
        let (b, r) = (j / ROWS, j % ROWS);
        for (k, &v) in row.iter().enumerate() {
            let at = (((b * steps + k / 16) * ROWS + r) * 16 + k % 16) * bytes;
            let line = &mut lines[at / 64].0[at % 64..at % 64 + bytes];
            if half {
                line.copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            } else {
                line.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    lines.into()
}
