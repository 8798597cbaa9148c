//! Gated feed-forward block: `down(act(gate(x)) * up(x))`.
use candle_core::Tensor;

use super::linear::{Linear, RmsNorm};
use super::profile;
use crate::error::{Error, Result};

/// The gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (transformers `silu`).
    Silu,
    /// GELU, tanh approximation (transformers `gelu_pytorch_tanh`).
    GeluTanh,
    /// GELU, exact erf form (transformers `gelu`).
    Gelu,
}

impl Activation {
    /// Parses a transformers activation name; the error lists the supported ones.
    pub fn from_hf(name: &str) -> Result<Self> {
        match name {
            "silu" | "swish" => Ok(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok(Activation::GeluTanh),
            "gelu" => Ok(Activation::Gelu),
            other => Err(Error::invalid(format!(
                "unsupported activation `{other}` (supported: silu, gelu_pytorch_tanh, gelu)"
            ))),
        }
    }

    /// The gate a folded gate/up product applies for this activation (none for the exact
    /// GELU).
    fn gate(self) -> Option<super::fused::Gate> {
        match self {
            Activation::Silu => Some(super::fused::Gate::Silu),
            Activation::GeluTanh => Some(super::fused::Gate::Gelu),
            Activation::Gelu => None,
        }
    }

    fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Silu => x.silu()?,
            Activation::GeluTanh => x.gelu()?,
            Activation::Gelu => x.gelu_erf()?,
        })
    }
}

/// Gated MLP with gate and up projections fused into one matmul.
#[derive(Debug)]
pub struct GatedMlp {
    /// `[2 * intermediate, hidden]`: gate rows, then up rows.
    gate_up: Linear,
    /// `[hidden, intermediate]`.
    down: Linear,
    intermediate: usize,
    act: Activation,
}

impl GatedMlp {
    /// The fused gate/up weight `[2 * intermediate, hidden]` (gate rows, then up rows).
    #[cfg(feature = "cuda")]
    pub(crate) fn gate_up_weight(&self) -> Option<&Tensor> {
        self.gate_up.weight()
    }

    /// True when its projections are quantized ([`super::linear::Linear::quantized`]).
    pub fn is_quantized(&self) -> bool {
        self.gate_up.is_quantized() || self.down.is_quantized()
    }

    /// From `gate_up` (`[2 * intermediate, hidden]`: the gate rows, then the up rows) and
    /// `down`.
    pub fn new(gate_up: Linear, down: Linear, act: Activation) -> Result<Self> {
        let rows = gate_up.out_features()?;
        if rows % 2 != 0 {
            return Err(crate::error::Error::invalid(format!(
                "gate_up has {rows} rows; expected gate and up of equal size"
            )));
        }
        Ok(Self {
            gate_up,
            down,
            intermediate: rows / 2,
            act,
        })
    }

    /// `x: [t, hidden]` -> `[t, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Decode and verification rows on CUDA: the SiLU rides in the gate/up product.
        if let (Activation::Silu, None, Some(w)) =
            (self.act, self.gate_up.bias(), self.gate_up.weight())
        {
            if let Some(h) = super::fused::silu_gate_gemv(x, w)? {
                profile::mark("gate/up projection", &h)?;
                let out = self.down.forward(&h)?;
                profile::mark("down projection", &out)?;
                return Ok(out);
            }
        }
        let gate_up = self.gate_up.forward(x)?;
        profile::mark("gate/up projection", &gate_up)?;
        let fused = match self.act {
            Activation::Silu => super::fused::silu_mul(&gate_up)?,
            Activation::GeluTanh if crate::engine::get().gelu_gate => {
                super::fused::gelu_mul(&gate_up)?
            }
            _ => None,
        };
        let h = match fused {
            Some(h) => h,
            None => {
                let gate = gate_up.narrow(1, 0, self.intermediate)?;
                let up = gate_up.narrow(1, self.intermediate, self.intermediate)?;
                (self.act.apply(&gate)? * up)?
            }
        };
        profile::mark("activation", &h)?;
        let out = self.down.forward(&h)?;
        profile::mark("down projection", &out)?;
        Ok(out)
    }

    /// `x + mlp(norm(x))` for the residual stream `x: [t, hidden]`: on CUDA the norm rides
    /// in the gate/up GEMV and the add in the down GEMV ([`super::fused::folded_gemv`]), so
    /// a decode step runs no norm or add kernel here; elsewhere the norm and the add run on
    /// their own.
    pub fn forward_residual(&self, x: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        if let (Activation::Silu, None, Some(w)) =
            (self.act, self.gate_up.bias(), self.gate_up.weight())
        {
            let fold = super::fused::Folded::Norm(norm.weight(), norm.eps());
            let gate = Some(super::fused::Gate::Silu);
            if let Some(h) = super::fused::folded_gemv(x, w, fold, gate, None)? {
                profile::mark("gate/up projection", &h)?;
                let out = self.down.forward_add(&h, x)?;
                profile::mark("down projection", &out)?;
                return Ok(out);
            }
        }
        let normed = norm.forward(x)?;
        profile::mark("norms, residual adds", &normed)?;
        Ok((x + self.forward(&normed)?)?)
    }

    /// `mlp(norm(x))` for the residual stream `x: [t, hidden]` (a sandwich block, whose
    /// post-norm comes before the add): on CUDA the norm and the gate's activation (SiLU or
    /// GELU-tanh) ride in the gate/up GEMV ([`super::fused::folded_gemv`]); elsewhere the norm
    /// runs first.
    pub fn forward_prenorm(&self, x: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        if let (Some(gate), None, Some(w)) =
            (self.act.gate(), self.gate_up.bias(), self.gate_up.weight())
        {
            let fold = super::fused::Folded::Norm(norm.weight(), norm.eps());
            if let Some(h) = super::fused::folded_gemv(x, w, fold, Some(gate), None)? {
                profile::mark("gate/up projection", &h)?;
                let out = self.down.forward(&h)?;
                profile::mark("down projection", &out)?;
                return Ok(out);
            }
        }
        let normed = norm.forward(x)?;
        profile::mark("norms, residual adds", &normed)?;
        self.forward(&normed)
    }

    /// Parameters held.
    pub fn param_count(&self) -> usize {
        self.gate_up.param_count() + self.down.param_count()
    }
}
