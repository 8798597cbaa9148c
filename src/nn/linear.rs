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
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// `(x + h, norm(x + h) Wᵀ + b)` of a block's input before its pre-norm: one kernel
    /// where the device has one ([`super::fused::norm_gemv`]), else the norm, then
    /// [`Self::forward`].
    pub fn forward_pre(&self, input: &PreNorm) -> Result<(Tensor, Tensor)> {
        let (sum, y) = match input.fused(&self.weight, false)? {
            Some(pair) => pair,
            None => {
                let (sum, normed) = input.apply()?;
                return Ok((sum, self.forward(&normed)?));
            }
        };
        Ok(match &self.bias {
            Some(b) => (sum, y.broadcast_add(b)?),
            None => (sum, y),
        })
    }

    /// Parameters held.
    pub fn param_count(&self) -> usize {
        self.weight.elem_count() + self.bias.as_ref().map_or(0, Tensor::elem_count)
    }
}

/// A block's input before its pre-norm: the residual stream `x: [t, hidden]`, the previous
/// sublayer's output `h` not yet added to it (none: the embeddings), and the norm. The first
/// product that reads it ([`Linear::forward_pre`], the gated MLP's) folds the residual add
/// and the norm into its own kernel where the device has one, else applies them first.
pub struct PreNorm<'a> {
    /// The residual stream.
    pub x: Tensor,
    /// The sublayer output to add to it first.
    pub h: Option<Tensor>,
    /// The norm of the sum.
    pub norm: &'a RmsNorm,
}

impl PreNorm<'_> {
    /// `(x + h, norm(x + h))` by the norm's own ops (an add + norm kernel where there is one).
    pub fn apply(&self) -> Result<(Tensor, Tensor)> {
        let (sum, normed) = match &self.h {
            Some(h) => self.norm.add_forward(&self.x, h)?,
            None => (self.x.clone(), self.norm.forward(&self.x)?),
        };
        super::profile::mark("norms, residual adds", &normed)?;
        Ok((sum, normed))
    }

    /// `(x + h, norm(x + h) wᵀ)` (with `silu_gate`, the gated activation of the product) in
    /// one kernel, or `None` where none applies.
    pub(crate) fn fused(&self, w: &Tensor, silu_gate: bool) -> Result<Option<(Tensor, Tensor)>> {
        super::fused::norm_gemv(
            &self.x,
            self.h.as_ref(),
            &self.norm.weight,
            self.norm.eps,
            w,
            silu_gate,
        )
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

    /// Parameters held.
    pub fn param_count(&self) -> usize {
        self.weight.elem_count()
    }
}
