//! Rotary position embeddings (the "rotate half" layout of Hugging Face Llama) with cos/sin
//! tables computed once and grown geometrically, never per step.
use std::sync::RwLock;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// How the rotary frequencies are rescaled for long contexts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain frequencies `theta^(-2i/d)`.
    None,
    /// Positions divided by `factor` (transformers `rope_type: "linear"`).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1 frequency-dependent rescaling (transformers `rope_type: "llama3"`).
    Llama3 {
        /// Scale of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Context length of pre-training.
        original_max_position_embeddings: usize,
    },
}

/// The rotary embedding of one kind of layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// Base of the frequencies (`rope_theta`).
    pub theta: f64,
    /// Long-context rescaling.
    pub scaling: RopeScaling,
}

/// Positions of the first table; it doubles whenever a forward reaches past its end.
const INITIAL_POSITIONS: usize = 2048;

/// Rotary embedding for `head_dim`-wide heads. The cos/sin tables `[positions, head_dim / 2]`
/// are computed in f32 exactly as transformers does, then cast to the compute dtype.
#[derive(Debug)]
pub struct Rope {
    /// `[head_dim / 2]` inverse frequencies.
    inv_freq: Vec<f32>,
    dtype: DType,
    device: Device,
    /// `(cos, sin)`, both `[positions, head_dim / 2]`.
    table: RwLock<(Tensor, Tensor)>,
}

impl Rope {
    /// Tables for `head_dim` (even) with `spec`, in `dtype` on `device`.
    pub fn new(spec: RopeSpec, head_dim: usize, dtype: DType, device: &Device) -> Result<Self> {
        if !head_dim.is_multiple_of(2) {
            return Err(Error::invalid(format!(
                "head_dim {head_dim} must be even for RoPE"
            )));
        }
        let inv_freq = inv_freq(spec, head_dim);
        let table = build_table(&inv_freq, INITIAL_POSITIONS, dtype, device)?;
        Ok(Self {
            inv_freq,
            dtype,
            device: device.clone(),
            table: RwLock::new(table),
        })
    }

    /// `(cos, sin)` rows for positions `[offset, offset + len)`, `[len, head_dim / 2]`.
    fn rows(&self, offset: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.table(offset + len)?;
        Ok((cos.narrow(0, offset, len)?, sin.narrow(0, offset, len)?))
    }

    /// The whole `(cos, sin)` tables `[P, head_dim / 2]`, `P >= positions` (grown, to a power
    /// of two, when shorter). The same tensors until a later call grows them.
    pub fn table(&self, positions: usize) -> Result<(Tensor, Tensor)> {
        let poisoned = || Error::invalid("rope table lock poisoned by a panic");
        {
            let table = self.table.read().map_err(|_| poisoned())?;
            if table.0.dim(0)? >= positions {
                return Ok(table.clone());
            }
        }
        let mut table = self.table.write().map_err(|_| poisoned())?;
        let have = table.0.dim(0)?;
        if have < positions {
            let grown = positions.next_power_of_two().max(2 * have);
            *table = build_table(&self.inv_freq, grown, self.dtype, &self.device)?;
        }
        Ok(table.clone())
    }

    /// Rotates `q: [1, heads, t, d]` and `k: [1, kv_heads, t, d]` for positions
    /// `[offset, offset + t)`. Both must be contiguous.
    pub fn apply(&self, q: &Tensor, k: &Tensor, offset: usize) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.rows(offset, q.dim(2)?)?;
        Ok((rope(q, &cos, &sin)?, rope(k, &cos, &sin)?))
    }
}

impl Rope {
    /// Rotates `q: [1, heads, t, d]` and `k: [1, kv_heads, t, d]` (contiguous) for the
    /// positions `positions` (`t` of them, any order: a token tree's `base + depth`).
    pub fn apply_at(
        &self,
        q: &Tensor,
        k: &Tensor,
        positions: &[usize],
    ) -> Result<(Tensor, Tensor)> {
        let end = positions.iter().max().map_or(0, |&p| p + 1);
        let (cos, sin) = self.rows(0, end)?;
        let ids: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let (cos, sin) = (cos.index_select(&ids, 0)?, sin.index_select(&ids, 0)?);
        Ok((rope(q, &cos, &sin)?, rope(k, &cos, &sin)?))
    }
}

/// candle's `rope` of `x: [1, h, t, d]` by `cos`, `sin: [t, d / 2]`; an f32 block on the CPU
/// takes [`super::fused::rope`] (the same arithmetic, bitwise).
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    match super::fused::rope(x, cos, sin)? {
        Some(out) => Ok(out),
        None => Ok(candle_nn::rotary_emb::rope(x, cos, sin)?),
    }
}

/// Inverse frequencies as transformers computes them (f32 arithmetic throughout).
fn inv_freq(spec: RopeSpec, head_dim: usize) -> Vec<f32> {
    let base = spec.theta as f32;
    let plain = (0..head_dim)
        .step_by(2)
        .map(|i| 1.0 / base.powf(i as f32 / head_dim as f32));
    match spec.scaling {
        RopeScaling::None => plain.collect(),
        RopeScaling::Linear { factor } => plain.map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, low, high) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
            );
            let old_context = original_max_position_embeddings as f32;
            let low_freq_wavelen = old_context / low;
            let high_freq_wavelen = old_context / high;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen > low_freq_wavelen {
                        f / factor
                    } else if wavelen < high_freq_wavelen {
                        f
                    } else {
                        let smooth = (old_context / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// `cos`/`sin` of `position * inv_freq` for `positions` rows, cast to `dtype`.
fn build_table(
    inv_freq: &[f32],
    positions: usize,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for &f in inv_freq {
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    let cos = Tensor::from_vec(cos, (positions, half), device)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (positions, half), device)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU kernel is candle's rope, bitwise, for one row, a verification block and a
    /// prefill (the threaded path), at two head widths.
    #[test]
    fn cpu_rope_is_candles_bitwise() {
        let dev = Device::Cpu;
        for (h, t, d) in [(9, 1, 64), (3, 3, 64), (9, 5, 128), (9, 300, 64)] {
            let x = Tensor::randn(0f32, 1.0, (1, h, t, d), &dev).unwrap();
            let cos = Tensor::randn(0f32, 1.0, (t, d / 2), &dev).unwrap();
            let sin = Tensor::randn(0f32, 1.0, (t, d / 2), &dev).unwrap();
            let ours = rope(&x, &cos, &sin).unwrap();
            let theirs = candle_nn::rotary_emb::rope(&x, &cos, &sin).unwrap();
            let diff = (ours - theirs).unwrap().abs().unwrap().max_all().unwrap();
            assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "h {h} t {t} d {d}");
        }
    }
}
