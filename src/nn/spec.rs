//! What a thin model file decides about an architecture: the [`DecoderSpec`] the shared
//! decoder is loaded from.
use super::attention::HeadShape;
use super::mlp::Activation;
use super::rope::RopeSpec;

/// The attention span of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Attends to every earlier token; cached in a `KvCache`.
    Full,
    /// Attends to the last `window` tokens (itself included); cached in a `RotatingKvCache`.
    Sliding {
        /// Tokens each query sees, itself included.
        window: usize,
    },
}

/// Where the norms of a block sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormLayout {
    /// Llama: `input_layernorm` before attention, `post_attention_layernorm` before the MLP.
    PreNorm,
    /// Gemma 2/3: `input_layernorm` and `post_attention_layernorm` around attention,
    /// `pre_feedforward_layernorm` and `post_feedforward_layernorm` around the MLP.
    Sandwich,
}

/// Everything a thin model file decides about an architecture; [`super::Decoder::load`] does the rest.
/// Weight names follow the Hugging Face Llama layout under `prefix`
/// (`{prefix}layers.{i}.self_attn.q_proj.weight`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderSpec {
    /// Rows of the embedding (and of the logits).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Attention head geometry (the same in every layer).
    pub heads: HeadShape,
    /// One entry per layer.
    pub layers: Vec<LayerKind>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Gemma's `(1 + w)` RMSNorm scale.
    pub norm_plus_one: bool,
    /// Norm placement.
    pub norm_layout: NormLayout,
    /// Bias on the q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Bias on the MLP projections.
    pub mlp_bias: bool,
    /// Per-head RMSNorm of queries and keys (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// MLP gate activation.
    pub activation: Activation,
    /// Multiply embeddings by `sqrt(hidden_size)` rounded to the compute dtype (Gemma).
    pub scale_embeddings: bool,
    /// Softmax scale of attention logits.
    pub attn_scale: f64,
    /// `tanh` softcap of attention logits.
    pub attn_softcap: Option<f64>,
    /// `tanh` softcap of the final logits.
    pub final_softcap: Option<f64>,
    /// RoPE of full-attention layers.
    pub rope_full: RopeSpec,
    /// RoPE of sliding-window layers.
    pub rope_sliding: RopeSpec,
    /// The LM head is the embedding matrix.
    pub tie_embeddings: bool,
    /// Prefix of the decoder's tensors (`model.`).
    pub prefix: String,
    /// Name of the untied LM head tensor.
    pub lm_head: String,
}

impl DecoderSpec {
    /// Parameters of the whole model this spec describes (tied embeddings counted once): what
    /// a tensor-parallel model reports, whose ranks each hold a part (and copies of the
    /// embedding and norms).
    pub fn param_count(&self) -> usize {
        let (hidden, inter) = (self.hidden_size, self.intermediate_size);
        let HeadShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        } = self.heads;
        let qkv = (h + 2 * kv) * d;
        let attention = qkv * hidden
            + usize::from(self.qkv_bias) * qkv
            + hidden * h * d
            + usize::from(self.o_bias) * hidden
            + usize::from(self.qk_norm) * 2 * d;
        let mlp = 3 * inter * hidden + usize::from(self.mlp_bias) * (2 * inter + hidden);
        let norms = match self.norm_layout {
            NormLayout::PreNorm => 2,
            NormLayout::Sandwich => 4,
        } * hidden;
        let embed = self.vocab_size * hidden;
        embed
            + self.layers.len() * (attention + mlp + norms)
            + hidden
            + usize::from(!self.tie_embeddings) * embed
    }
}
