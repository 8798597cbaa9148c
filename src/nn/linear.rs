//! Dense and quantized layers and RMS normalisation over row-major activations
//! `[tokens, features]`.
use candle_core::quantized::QMatMul;
use candle_core::{DType, Module, Tensor};

use crate::error::Result;

/// `y = x Wᵀ + b` with `W: [out, in]` as stored by PyTorch. Decode and verification inputs
/// (at most [`super::skinny::MAX_ROWS`] rows, f32 on the CPU; up to 16 rows on CUDA) go
/// through kernels that read `W` once; prefills and other devices through candle's matmul.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]` (for a quantized layer, an empty placeholder never multiplied).
    weight: Tensor,
    /// `weight` as the CPU's few-row kernel reads it (f32 on the CPU only).
    skinny: Option<super::skinny::SkinnyWeight>,
    /// `[out]`.
    bias: Option<Tensor>,
    /// Quantized row blocks `(matrix [rows, in], output scale)` stacked by rows, multiplied
    /// by candle's quantized matmul instead of `weight`.
    quantized: Option<std::sync::Arc<[QuantizedPart]>>,
}

/// One row block of a quantized layer: its matrix and the scale its outputs take (a scale
/// folded into a dense weight at load cannot be folded into quantized blocks).
#[derive(Debug)]
pub struct QuantizedPart {
    /// `[rows, in]`, in a GGML block type.
    pub matrix: QMatMul,
    /// Rows.
    pub rows: usize,
    /// Multiplies this block's outputs.
    pub scale: f64,
}

impl Linear {
    /// A layer from a `[out, in]` weight and an optional `[out]` bias.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let mut layer = Self::shared(weight)?;
        // Where the few-row kernel keeps a copy of its own, `weight` serves only blocks of
        // more rows (prefills), through candle's matmul, which runs 1.1–2.5× faster against
        // an `[in, out]` weight than against the transposed view of an `[out, in]` one
        // (docs/kernel-notes.md): the same values, stored transposed, handed out as an
        // `[out, in]` view.
        if layer.skinny.as_ref().is_some_and(|s| s.keeps_a_copy()) {
            layer.weight = layer.weight.t()?.contiguous()?.t()?;
        }
        layer.bias = bias;
        Ok(layer)
    }

    /// As [`Self::new`] without a bias, for a weight another part of the model holds too
    /// (tied embeddings): stored as given, so both keep sharing it.
    pub fn shared(weight: Tensor) -> Result<Self> {
        Ok(Self {
            skinny: super::skinny::SkinnyWeight::new(&weight)?,
            weight,
            bias: None,
            quantized: None,
        })
    }

    /// A quantized layer: row blocks `parts` stacked (their outputs concatenated), then the
    /// optional `[out]` bias. Its inputs go through candle's quantized matmul in f32 on
    /// every device; the fused kernels and CUDA graphs, which read dense weights, are not
    /// used.
    pub fn quantized(
        parts: Vec<QuantizedPart>,
        bias: Option<Tensor>,
        device: &candle_core::Device,
    ) -> Result<Self> {
        Ok(Self {
            weight: Tensor::zeros(0, DType::F32, device)?,
            skinny: None,
            bias,
            quantized: Some(parts.into()),
        })
    }

    /// True for a layer made by [`Linear::quantized`].
    pub fn is_quantized(&self) -> bool {
        self.quantized.is_some()
    }

    /// Output features.
    pub fn out_features(&self) -> Result<usize> {
        match &self.quantized {
            Some(parts) => Ok(parts.iter().map(|p| p.rows).sum()),
            None => Ok(self.weight.dim(0)?),
        }
    }

    /// The `[out, in]` weight of a dense layer; `None` for a quantized one.
    pub fn weight(&self) -> Option<&Tensor> {
        self.quantized.is_none().then_some(&self.weight)
    }

    /// `x Wᵀ` through the quantized blocks, in f32, back in `x`'s dtype. A row's result must
    /// not depend on the rows beside it (a verification row must get what the same row gets
    /// in a one-token decode step, or greedy speculation would part from autoregressive
    /// decoding), and candle's quantized kernels take other paths for several rows than for
    /// one, on the CPU (its repacked gemm) and on CUDA alike: the rows of a decode or
    /// verification block (up to 16) run one at a time; only prefills run as one block.
    fn forward_quantized(parts: &[QuantizedPart], x: &Tensor) -> Result<Tensor> {
        let rows = x.dim(0)?;
        if (2..=super::skinny::MAX_ROWS).contains(&rows) {
            let each = (0..rows)
                .map(|i| Self::forward_quantized(parts, &x.narrow(0, i, 1)?))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Tensor::cat(&each, 0)?);
        }
        let x32 = x.to_dtype(DType::F32)?;
        let outs = parts
            .iter()
            .map(|p| {
                let y = p.matrix.forward(&x32)?;
                if p.scale == 1.0 {
                    Ok(y)
                } else {
                    y * p.scale
                }
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let y = match outs.len() {
            1 => outs.into_iter().next().expect("one part"),
            _ => Tensor::cat(&outs, 1)?,
        };
        Ok(y.to_dtype(x.dtype())?)
    }

    /// The `[out]` bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// `x: [t, in]` -> `[t, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(parts) = &self.quantized {
            return self.add_bias(Self::forward_quantized(parts, x)?);
        }
        let y = if let Some(w) = self.skinny.as_ref().filter(|w| w.applies(x)) {
            super::skinny::skinny_matmul(x, w)?
        } else if let Some(y) = super::fused::gemv(x, &self.weight)? {
            y
        } else {
            x.matmul(&self.weight.t()?)?
        };
        self.add_bias(y)
    }

    /// `norm(x) Wᵀ + b` for the residual stream `x: [t, in]` before `norm`: on CUDA the norm
    /// rides in the GEMV ([`super::fused::folded_gemv`]), elsewhere it runs first.
    pub fn forward_prenorm(&self, x: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        if self.is_quantized() {
            return self.forward(&norm.forward(x)?);
        }
        let fold = super::fused::Folded::Norm(norm.weight(), norm.eps());
        match super::fused::folded_gemv(x, &self.weight, fold, None, self.bias.as_ref())? {
            Some(y) => Ok(y),
            None => self.forward(&norm.forward(x)?),
        }
    }

    /// `resid + x Wᵀ` (no bias) with the add in the GEMV's epilogue on CUDA
    /// ([`super::fused::folded_gemv`]); `resid: [t, out]`.
    pub fn forward_add(&self, x: &Tensor, resid: &Tensor) -> Result<Tensor> {
        if self.bias.is_none() && !self.is_quantized() {
            let fold = super::fused::Folded::Resid(resid);
            if let Some(y) = super::fused::folded_gemv(x, &self.weight, fold, None, None)? {
                return Ok(y);
            }
        }
        Ok((resid + self.forward(x)?)?)
    }

    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Parameters held.
    pub fn param_count(&self) -> usize {
        let weights = match &self.quantized {
            Some(parts) => parts.iter().map(|p| p.matrix_elems()).sum(),
            None => self.weight.elem_count(),
        };
        weights + self.bias.as_ref().map_or(0, Tensor::elem_count)
    }
}

impl QuantizedPart {
    fn matrix_elems(&self) -> usize {
        match &self.matrix {
            QMatMul::QTensor(q) => q.shape().elem_count(),
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.elem_count(),
        }
    }
}

/// RMS normalisation over the last axis: `x / sqrt(mean(x²) + eps) * weight`, computed in f32
/// for half inputs. Gemma's `(1 + w)` form is folded into `weight` at load.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `[features]`.
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// A norm with the effective per-feature scale `weight`.
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self {
            weight,
            eps: eps as f32,
        }
    }

    /// Normalises `x: [..., features]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight,
            self.eps,
        )?)
    }

    /// `(x + y, norm(x + y))`: the residual add before this norm, fused with it where the
    /// device has a kernel.
    pub fn add_forward(&self, x: &Tensor, y: &Tensor) -> Result<(Tensor, Tensor)> {
        if let Some(pair) = super::fused::add_rmsnorm(x, y, &self.weight, self.eps)? {
            return Ok(pair);
        }
        let sum = (x + y)?;
        let normed = self.forward(&sum)?;
        Ok((sum, normed))
    }

    /// `x + norm(y)`: a post-norm (Gemma's sandwich norms) and the residual add after it,
    /// in one kernel where the device has one.
    pub fn add_normed(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        if let Some(sum) = super::fused::add_normed(x, y, &self.weight, self.eps)? {
            return Ok(sum);
        }
        Ok((x + self.forward(y)?)?)
    }

    /// The effective per-feature scale `[features]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon under the square root.
    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// Parameters held.
    pub fn param_count(&self) -> usize {
        self.weight.elem_count()
    }
}
