//! One transformer block (attention + gated MLP with their norms) and what flows between
//! blocks: the residual stream, with the last output not yet added where the next norm can
//! add it in the same kernel.
use candle_core::Tensor;

use super::attention::{Attention, AttnInput};
use super::linear::RmsNorm;
use super::mlp::GatedMlp;
use super::shard::AllReduce;
use super::{fused, profile};
use crate::cache::LayerCache;
use crate::error::Result;

/// One transformer block.
#[derive(Debug)]
pub(super) struct Block {
    pub(super) attn_norm: RmsNorm,
    pub(super) attn: Attention,
    pub(super) attn_post_norm: Option<RmsNorm>,
    pub(super) mlp_norm: RmsNorm,
    pub(super) mlp: GatedMlp,
    pub(super) mlp_post_norm: Option<RmsNorm>,
}

/// A block's output as the residual stream `x` and the MLP's output `h` not yet added to it:
/// the next norm adds them in the same kernel where the device has one.
pub(super) type Residual = (Tensor, Tensor);

impl Block {
    pub(super) fn forward(
        &self,
        input: Input,
        offset: usize,
        cache: &mut LayerCache,
    ) -> Result<Input> {
        self.forward_with(input, |attn, input| attn.forward(input, offset, cache))
    }

    /// The block around an attention call `attend(attention, its input)`, from the
    /// embeddings or from the previous block's output.
    ///
    /// Decode and verification steps on CUDA in half precision ([`fused::folds`]) hand the
    /// residual stream itself to the products, which fold in the norms before them and the
    /// residual adds after them (no norm or add kernel between them); a pre-norm block then
    /// returns the stream. A sandwich block (Gemma 3) folds its pre-norms (and its gate's
    /// activation) into the products the same way, and runs each post-norm with the add after
    /// it as one kernel. Everything else normalises first and returns the stream and the
    /// MLP's output un-added, for the next norm to add in the same kernel.
    pub(super) fn forward_with(
        &self,
        input: Input,
        attend: impl FnOnce(&Attention, AttnInput) -> Result<Tensor>,
    ) -> Result<Input> {
        let pre_norm = self.attn_post_norm.is_none() && self.mlp_post_norm.is_none();
        let sandwich = self
            .attn_post_norm
            .as_ref()
            .zip(self.mlp_post_norm.as_ref());
        if (pre_norm || sandwich.is_some()) && fused::folds(input.stream()) {
            let x = match input {
                Input::Embedded(x) | Input::Stream(x) => x,
                Input::Residual((x, h)) => (x + h)?,
            };
            if let Some((attn_post, mlp_post)) = sandwich {
                let h = attend(&self.attn, AttnInput::PreNormed(&x, &self.attn_norm))?;
                let x = attn_post.add_normed(&x, &h)?;
                profile::mark("norms, residual adds", &x)?;
                let h = self.mlp.forward_prenorm(&x, &self.mlp_norm)?;
                let x = mlp_post.add_normed(&x, &h)?;
                profile::mark("norms, residual adds", &x)?;
                return Ok(Input::Stream(x));
            }
            let x = attend(&self.attn, AttnInput::Residual(&x, &self.attn_norm))?;
            let x = self.mlp.forward_residual(&x, &self.mlp_norm)?;
            return Ok(Input::Stream(x));
        }
        let (x, normed) = match input {
            Input::Embedded(x) | Input::Stream(x) => {
                let normed = self.attn_norm.forward(&x)?;
                (x, normed)
            }
            Input::Residual((x, h)) => self.attn_norm.add_forward(&x, &h)?,
        };
        profile::mark("norms, residual adds", &normed)?;
        let h = attend(&self.attn, AttnInput::Normed(&normed))?;
        let h = post_norm(&self.attn_post_norm, h)?;
        let (x, normed) = self.mlp_norm.add_forward(&x, &h)?;
        profile::mark("norms, residual adds", &normed)?;
        let h = self.mlp.forward(&normed)?;
        let h = post_norm(&self.mlp_post_norm, h)?;
        Ok(Input::Residual((x, h)))
    }

    /// A tensor-parallel rank's block ([`super::shard`]): its attention and MLP outputs are
    /// this rank's partial sums, added over the ranks by `reduce` before each residual add.
    /// No residual add rides in a product here (every rank would add the stream); the
    /// pre-norms still fold into the q/k/v and gate/up products where the device can, and
    /// a sandwich block's post-norm runs with its add as one kernel.
    pub(super) fn forward_sharded(
        &self,
        input: Input,
        offset: usize,
        cache: &mut LayerCache,
        reduce: &dyn AllReduce,
    ) -> Result<Input> {
        self.forward_sharded_with(input, reduce, |attn, x| attn.forward(x, offset, cache))
    }

    /// [`Self::forward_sharded`] around an attention call `attend(attention, its input)`
    /// (a recorded step's attention over its buffers in place).
    pub(super) fn forward_sharded_with(
        &self,
        input: Input,
        reduce: &dyn AllReduce,
        attend: impl FnOnce(&Attention, AttnInput) -> Result<Tensor>,
    ) -> Result<Input> {
        let x = input.into_stream()?;
        let h = attend(&self.attn, AttnInput::PreNormed(&x, &self.attn_norm))?;
        let x = add_output(&x, &reduce.sum(&h)?, &self.attn_post_norm)?;
        let h = self.mlp.forward_prenorm(&x, &self.mlp_norm)?;
        let x = add_output(&x, &reduce.sum(&h)?, &self.mlp_post_norm)?;
        profile::mark("norms, residual adds", &x)?;
        Ok(Input::Stream(x))
    }

    pub(super) fn param_count(&self) -> usize {
        let opt = |n: &Option<RmsNorm>| n.as_ref().map_or(0, RmsNorm::param_count);
        self.attn_norm.param_count()
            + self.attn.param_count()
            + opt(&self.attn_post_norm)
            + self.mlp_norm.param_count()
            + self.mlp.param_count()
            + opt(&self.mlp_post_norm)
    }
}

/// What a block reads: the embeddings (the first block) or the previous block's output.
pub(super) enum Input {
    Embedded(Tensor),
    /// The stream and the last output not yet added to it.
    Residual(Residual),
    /// The stream with everything added (a folded block's output).
    Stream(Tensor),
}

impl Input {
    /// The residual stream's tensor (before any pending add).
    pub(super) fn stream(&self) -> &Tensor {
        match self {
            Input::Embedded(x) | Input::Stream(x) | Input::Residual((x, _)) => x,
        }
    }

    /// The residual stream with any pending add made.
    pub(super) fn into_stream(self) -> Result<Tensor> {
        match self {
            Input::Embedded(x) | Input::Stream(x) => Ok(x),
            Input::Residual((x, h)) => Ok((x + h)?),
        }
    }
}

/// `x + post(h)` (`x + h` without a post-norm), the norm and add one kernel where the device
/// has it.
fn add_output(x: &Tensor, h: &Tensor, post: &Option<RmsNorm>) -> Result<Tensor> {
    match post {
        Some(norm) => norm.add_normed(x, h),
        None => Ok((x + h)?),
    }
}

fn post_norm(norm: &Option<RmsNorm>, h: Tensor) -> Result<Tensor> {
    match norm {
        Some(n) => n.forward(&h),
        None => Ok(h),
    }
}
