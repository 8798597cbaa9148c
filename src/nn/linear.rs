//! Dense layers and RMS normalisation over row-major activations `[tokens, features]`.
use candle_core::Tensor;

use crate::error::Result;

/// `y = x Wᵀ + b` with `W: [out, in]` as stored by PyTorch. Decode and verification inputs
/// (at most [`super::skinny::MAX_ROWS`] rows, f32 on the CPU; up to 16 rows on CUDA) go
/// through kernels that read `W` once; prefills and other devices through candle's matmul.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    weight: Tensor,
    /// `[out]`.
    bias: Option<Tensor>,
}

impl Linear {
    /// A layer from a `[out, in]` weight and an optional `[out]` bias.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// Output features.
    pub fn out_features(&self) -> Result<usize> {
        Ok(self.weight.dim(0)?)
    }

    /// The `[out, in]` weight.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The `[out]` bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// `x: [t, in]` -> `[t, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if super::skinny::applies(x, &self.weight) {
            super::skinny::skinny_matmul(x, &self.weight)?
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
        let fold = super::fused::Folded::Norm(norm.weight(), norm.eps());
        match super::fused::folded_gemv(x, &self.weight, fold, false)? {
            Some(y) => self.add_bias(y),
            None => self.forward(&norm.forward(x)?),
        }
    }

    /// `resid + x Wᵀ` (no bias) with the add in the GEMV's epilogue on CUDA
    /// ([`super::fused::folded_gemv`]); `resid: [t, out]`.
    pub fn forward_add(&self, x: &Tensor, resid: &Tensor) -> Result<Tensor> {
        if self.bias.is_none() {
            let fold = super::fused::Folded::Resid(resid);
            if let Some(y) = super::fused::folded_gemv(x, &self.weight, fold, false)? {
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
        self.weight.elem_count() + self.bias.as_ref().map_or(0, Tensor::elem_count)
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
