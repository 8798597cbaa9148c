//! The one attention implementation: fused q/k/v projection, optional per-head q/k RMSNorm,
//! RoPE, grouped-query attention over what the layer's cache returns, optional logit
//! softcapping, output projection.
use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::linear::{Linear, RmsNorm};
use super::rope::Rope;
use super::{fused, profile};
use crate::cache::{Attend, LayerCache};
use crate::error::{Error, Result};

/// Head geometry of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// Weights of one attention layer. The softmax scale is folded into the query projection
/// (or into the q norm's weight when there is one) at load, so a forward does not rescale.
#[derive(Debug)]
pub struct Attention {
    /// `[(heads + 2 kv_heads) * head_dim, hidden]`: q, k and v projections stacked.
    qkv: Linear,
    /// `[hidden, heads * head_dim]`.
    o: Linear,
    /// Per-head RMSNorm of queries and keys (Qwen3, Gemma 3), applied before RoPE.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    rope: Arc<Rope>,
    shape: HeadShape,
    /// `tanh` softcap of attention logits (Gemma 2 style), when set.
    softcap: Option<f64>,
}

/// The parts an [`Attention`] is built from.
#[derive(Debug)]
pub struct AttentionParts {
    /// q, k and v projections stacked in that order (`[(heads + 2 kv_heads) * head_dim,
    /// hidden]`); q already multiplied by the softmax scale unless `qk_norm` carries it.
    pub qkv: Linear,
    /// Output projection.
    pub o: Linear,
    /// q and k norms (q's weight already multiplied by the softmax scale).
    pub qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// The rotary embedding of this layer's kind.
    pub rope: Arc<Rope>,
    /// Head geometry.
    pub shape: HeadShape,
    /// Attention logit softcap.
    pub softcap: Option<f64>,
}

/// A layer's input as its attention takes it.
#[derive(Clone, Copy)]
pub(crate) enum AttnInput<'a> {
    /// Rows already normalised: the output is the attention's alone.
    Normed(&'a Tensor),
    /// The residual stream `x` before `norm`: the q/k/v product applies the norm and the
    /// output is `x + attention`, both folded into the products where the device can
    /// ([`Linear::forward_prenorm`], [`Linear::forward_add`]).
    Residual(&'a Tensor, &'a RmsNorm),
    /// The residual stream `x` before `norm`, folded into the q/k/v product as with
    /// `Residual`, but the output is the attention's alone (a sandwich block's post-norm
    /// comes between it and the add).
    PreNormed(&'a Tensor, &'a RmsNorm),
}

impl AttnInput<'_> {
    fn rows(&self) -> Result<usize> {
        let (AttnInput::Normed(x) | AttnInput::Residual(x, _) | AttnInput::PreNormed(x, _)) = self;
        Ok(x.dim(0)?)
    }
}

impl Attention {
    /// True when a projection is quantized ([`Linear::quantized`]).
    pub fn is_quantized(&self) -> bool {
        self.qkv.is_quantized() || self.o.is_quantized()
    }

    /// Checks the head geometry.
    pub fn new(parts: AttentionParts) -> Result<Self> {
        let HeadShape {
            num_heads,
            num_kv_heads,
            ..
        } = parts.shape;
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            )));
        }
        Ok(Self {
            qkv: parts.qkv,
            o: parts.o,
            qk_norm: parts.qk_norm,
            rope: parts.rope,
            shape: parts.shape,
            softcap: parts.softcap,
        })
    }

    /// This layer's whole RoPE tables, covering at least `positions` (see [`Rope::table`]).
    #[cfg(feature = "cuda")]
    pub(crate) fn rope_table(&self, positions: usize) -> Result<(Tensor, Tensor)> {
        self.rope.table(positions)
    }

    /// Parameters held.
    pub fn param_count(&self) -> usize {
        let norms = self
            .qk_norm
            .as_ref()
            .map_or(0, |(q, k)| q.param_count() + k.param_count());
        self.qkv.param_count() + self.o.param_count() + norms
    }

    /// `input` (`[t, hidden]`) at positions `[offset, offset + t)`; appends this layer's K/V
    /// to `cache` and returns `[t, hidden]`.
    pub(crate) fn forward(
        &self,
        input: AttnInput,
        offset: usize,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        self.forward_rows(input, offset, cache, false)
    }

    /// [`Self::forward`] whose earlier rows' outputs nobody reads (an EAGLE-3 head reading
    /// committed pairs): every row's K/V is appended, but only the last row queries, and the
    /// result is its output alone, `[1, hidden]` — what `forward` gives for that row (the same
    /// keys and mask row; bitwise on the CPU's kernels, whose rows never depend on the block).
    pub(crate) fn forward_last(
        &self,
        input: AttnInput,
        offset: usize,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        self.forward_rows(input, offset, cache, true)
    }

    fn forward_rows(
        &self,
        input: AttnInput,
        offset: usize,
        cache: &mut LayerCache,
        last: bool,
    ) -> Result<Tensor> {
        let t = input.rows()?;
        let (q, k, v) = self.project(input, true)?;
        // [t, heads, d] -> [1, heads, t, d]
        let heads_first =
            |x: Tensor| -> Result<Tensor> { Ok(x.transpose(0, 1)?.contiguous()?.unsqueeze(0)?) };
        let (q, k) = (heads_first(q)?, heads_first(k)?);
        // A token tree's nodes sit at `base + depth`, not at consecutive positions.
        let (q, k) = match cache.tree_positions(t) {
            Some(positions) => self.rope.apply_at(&q, &k, &positions)?,
            None => self.rope.apply(&q, &k, offset)?,
        };
        // Contiguous like q and k: a cache may hand the new block back as it came (a prefill
        // into an empty rotating cache), and CUDA's matmul refuses a head-strided operand.
        let v = heads_first(v)?;
        profile::mark("q/k norm, rope, layout", &k)?;
        let attend = cache.append(&k, &v)?;
        profile::mark("cache write", &attend.k)?;
        let (q, attend) = if last && t > 1 {
            (q.narrow(2, t - 1, 1)?.contiguous()?, attend.last_query())
        } else {
            (q, attend)
        };
        let out = self.attention(&q, &attend)?; // [t or 1, heads * d]
        profile::mark("attention", &out)?;
        self.output(&out, input)
    }

    /// The output projection of `out: [r, heads * d]` (`r`: the input's rows, or its last
    /// row alone), added to the residual stream's last `r` rows when the input was one.
    fn output(&self, out: &Tensor, input: AttnInput) -> Result<Tensor> {
        let out = match input {
            AttnInput::Normed(_) | AttnInput::PreNormed(..) => self.o.forward(out)?,
            AttnInput::Residual(x, _) => {
                let (r, t) = (out.dim(0)?, x.dim(0)?);
                self.o.forward_add(out, &x.narrow(0, t - r, r)?)?
            }
        };
        profile::mark("output projection", &out)?;
        Ok(out)
    }

    /// `input: [t, hidden]` -> `q: [t, heads, d]`, `k`, `v: [t, kv_heads, d]` (views of one
    /// fused product; q/k norms applied when the model has them and `qk_norm`, else left to
    /// the caller).
    fn project(&self, input: AttnInput, qk_norm: bool) -> Result<(Tensor, Tensor, Tensor)> {
        let HeadShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
        } = self.shape;
        let t = input.rows()?;
        let qkv = match input {
            AttnInput::Normed(x) => self.qkv.forward(x)?,
            AttnInput::Residual(x, norm) | AttnInput::PreNormed(x, norm) => {
                self.qkv.forward_prenorm(x, norm)?
            }
        };
        profile::mark("qkv projection", &qkv)?;
        // Views with rows `(h + 2 kv) d` apart, never copies: a reshape of a narrowed block
        // of several rows would copy each part (three kernels a layer in a verification
        // step on CUDA, ordinary launches between the step's PDL launches).
        let qkv = qkv.reshape((t, h + 2 * kv, d))?;
        let q = qkv.narrow(1, 0, h)?;
        let k = qkv.narrow(1, h, kv)?;
        let v = qkv.narrow(1, h + kv, kv)?;
        Ok(match &self.qk_norm {
            Some((qn, kn)) if qk_norm => (qn.forward(&q)?, kn.forward(&k)?, v),
            _ => (q, k, v),
        })
    }

    /// The forward of a replayable CUDA graph step: like [`Self::forward`] for the `t`
    /// newest positions, but the position comes from the device (`len: [1]` u32, the
    /// sequence length after the step) and the K/V are written straight into the cache
    /// buffers `k_buf`, `v_buf: [1, kv, capacity, d]` (the caller made room and does the
    /// cache's bookkeeping). `reach`: the most keys any step replaying this one leaves in
    /// the cache (`cuda::split_reach`). `ring`: the buffers are a sliding-window ring
    /// (position `p` in slot `p % capacity`), attended in place ([`RingStep`]: a staged
    /// speculation's K/V go to its side buffer); it needs the fused RoPE (an error
    /// otherwise). The kernel is not told the ring's stale positions: the caller reserved the
    /// step only where every position its queries see is intact. `prefetch`: the gate/up
    /// weight of the MLP
    /// after this attention, whose first rows RoPE's kernel prefetches into the L2 (the
    /// engine option `l2_prefetch_mb`). With the engine option `fused_rope` the split
    /// attention kernel rotates q and stores the step's K/V itself (and with `qk_norm_fold`
    /// applies the q/k norms first); off, RoPE's own kernel does it first. `tree`: the step's
    /// rows are nodes of the open speculation's token tree, described by a u32 device tensor
    /// of `TokenTree::step_words` (the kernel masks them and rotates them at their depths;
    /// needs the fused RoPE).
    #[cfg(feature = "cuda")]
    pub(crate) fn forward_in_place(
        &self,
        input: AttnInput,
        (k_buf, v_buf): (&Tensor, &Tensor),
        (len, reach): (&Tensor, usize),
        ring: Option<RingStep<'_>>,
        prefetch: Option<&Tensor>,
        tree: Option<&Tensor>,
    ) -> Result<Tensor> {
        // The split kernel takes the q/k norms where it fuses RoPE.
        let fused = super::cuda::fused_rope();
        let fold_norms = fused && crate::engine::get().qk_norm_fold;
        let (q, k, v) = self.project(input, !fold_norms)?;
        let capacity = k_buf.dim(2)?;
        let (cos, sin) = self.rope.table(ring.map_or(capacity, |r| r.positions))?;
        if (ring.is_some() || tree.is_some()) && !fused {
            return Err(crate::error::Error::invalid(
                "a ring's or a tree's in-place step needs the fused RoPE (engine option fused_rope)",
            ));
        }
        let (q, rope) = if fused {
            // The attention kernel rotates q and stores the step's K/V itself.
            let qk_norm = match &self.qk_norm {
                Some((qn, kn)) if fold_norms => Some(super::cuda::QkNorm {
                    q: qn.weight().clone(),
                    k: kn.weight().clone(),
                    q_eps: qn.eps(),
                    k_eps: kn.eps(),
                }),
                _ => None,
            };
            let rope = super::cuda::AttnRope {
                cos,
                sin,
                k,
                v,
                prefetch: prefetch.cloned(),
                qk_norm,
                tree: tree.cloned(),
            };
            (q.transpose(0, 1)?.unsqueeze(0)?, Some(rope)) // [1, heads, t, d], strided
        } else {
            let op = super::cuda::RopeStore {
                cos,
                sin,
                k_cache: k_buf.clone(),
                v_cache: v_buf.clone(),
                len: len.clone(),
                prefetch: prefetch.cloned(),
            };
            let q = super::fused::made(q.apply_op3_no_bwd(&k, &v, &op)?); // [1, heads, t, d]
            (q, None)
        };
        let op = super::cuda::SplitAttention {
            window: ring.map(|r| r.window),
            softcap: self.softcap,
            len: Some((len.clone(), capacity, reach)),
            rope,
            ring: ring.map(|r| super::cuda::RingKeys {
                end: 0,
                lo: 0,
                tail: r.tail.map(|tail| super::cuda::RingTail {
                    k: tail.k.clone(),
                    v: tail.v.clone(),
                    n: tail.len,
                }),
            }),
        };
        let out = super::fused::made(q.apply_op3_no_bwd(k_buf, v_buf, &op)?); // [t, heads * d]
        self.output(&out, input)
    }

    /// Attention of `q: [1, h, t, d]` over what the cache returned, as `[t, h * d]`.
    ///
    /// The path depends on the rows and the mask: queries that are the newest positions of a
    /// plain causal (or sliding) run of keys take [`causal_attention`]'s kernels where the
    /// device has them (CUDA: the split kernel for up to [`SPLIT_MAX_ROWS`] queries, flash
    /// attention for longer blocks in bf16 / f16), else, past [`PREFILL_CHUNK`] queries,
    /// chunks; everything else (short blocks elsewhere, trees, rings, staged tails) takes
    /// [`attend`] with the mask the cache describes.
    fn attention(&self, q: &Tensor, attend: &Attend) -> Result<Tensor> {
        let t = q.dim(2)?;
        let suffix = match attend.tail {
            None => attend.mask.causal_suffix(),
            Some(_) => None,
        };
        if let Some(ring) = attend.mask.ring_suffix().filter(|_| t <= SPLIT_MAX_ROWS) {
            let kv = (&attend.k, &attend.v);
            if let Some(out) = fused::ring_attention(q, kv, ring, self.softcap)? {
                return Ok(out);
            }
        }
        if let Some(window) = suffix {
            if let Some(out) = suffix_kernel(q, &attend.k, &attend.v, window, self.softcap)? {
                return Ok(out);
            }
            // Quantized layers round their inputs to 8 bits, which turns the ~1e-5 by which
            // one masked product over a block differs from one-token steps into different
            // tokens: on the CPU outside the f32 kernel above (another dtype), their rows run
            // one at a time; dense layers keep the one product.
            if window.is_none()
                && self.is_quantized()
                && q.device().is_cpu()
                && (2..=ROW_BY_ROW_MAX).contains(&t)
            {
                return heads_to_rows(attend_row_by_row(q, &attend.k, &attend.v, self.softcap)?);
            }
            if t > PREFILL_CHUNK {
                return heads_to_rows(attend_chunked(
                    q,
                    &attend.k,
                    &attend.v,
                    window,
                    self.softcap,
                )?);
            }
        }
        if let Some((base, first, tree)) = attend.mask.tree_block() {
            let kv = (&attend.k, &attend.v);
            if let Some(out) = fused::tree_attention(q, kv, (base, first, &tree), self.softcap)? {
                return Ok(out);
            }
        }
        heads_to_rows(attend_masked(
            q,
            &attend.k,
            &attend.v,
            attend.tail.as_ref(),
            attend.mask_tensor()?.as_ref(),
            self.softcap,
        )?)
    }
}

/// Attention of the newest `t` queries `q: [1, h, t, d]` over the keys `k`, `v: [1, kv,
/// len, d]` (query `i` at key index `len - t + i`, causal, optionally within a sliding
/// `window`; logits optionally `tanh`-capped), as `[t, h * d]`: the path an [`Attention`]
/// layer takes for such a block (the device's kernels where they apply, else chunks past
/// [`PREFILL_CHUNK`] queries, else one masked product).
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    softcap: Option<f64>,
) -> Result<Tensor> {
    if let Some(out) = suffix_kernel(q, k, v, window, softcap)? {
        return Ok(out);
    }
    let (t, len) = (q.dim(2)?, k.dim(2)?);
    if t > len {
        return Err(Error::invalid(format!(
            "causal attention: {t} queries over {len} keys"
        )));
    }
    heads_to_rows(if t > PREFILL_CHUNK {
        attend_chunked(q, k, v, window, softcap)?
    } else {
        let mask = causal_mask(len - t, t, len, window, q.device())?;
        attend_masked(q, k, v, None, mask.as_ref(), softcap)?
    })
}

/// Attention of the newest `t` queries `q: [1, h, t, d]` (positions `end - t ..= end - 1`)
/// over a sliding-window ring `k`, `v: [1, kv, capacity, d]` (position `p` in slot
/// `p % capacity`; slots of positions below `lo` stale), each query seeing the `window`
/// positions up to its own from `lo` on, as `[t, h * d]`: the path an [`Attention`] layer
/// takes for a rotating cache read in place (the device's kernel where it applies, else one
/// masked product over the slots). The window must leave the newest position's slot to it
/// alone: `window + t - 1 <= capacity`.
pub fn ring_attention(
    q: &Tensor,
    (k, v): (&Tensor, &Tensor),
    (end, lo, window): (usize, usize, usize),
    softcap: Option<f64>,
) -> Result<Tensor> {
    let (t, capacity) = (q.dim(2)?, k.dim(2)?);
    if t == 0 || t > end || window == 0 || window + t - 1 > capacity {
        return Err(Error::invalid(format!(
            "ring attention: {t} queries ending at position {end} with window {window} over a ring of {capacity} slots"
        )));
    }
    if t <= SPLIT_MAX_ROWS {
        if let Some(out) = fused::ring_attention(q, (k, v), (end, lo, window), softcap)? {
            return Ok(out);
        }
    }
    // Slot s holds the newest position below `end` that is congruent to s.
    let mut mask = vec![-1e30f32; t * capacity];
    for (i, row) in mask.chunks_mut(capacity).enumerate() {
        let qpos = end - t + i;
        for (slot, m) in row.iter_mut().enumerate() {
            let Some(p) = (end - 1).checked_sub((end - 1 + capacity - slot) % capacity) else {
                continue;
            };
            if p >= lo && p <= qpos && p + window > qpos {
                *m = 0.0;
            }
        }
    }
    let mask = Tensor::from_vec(mask, (t, capacity), q.device())?;
    heads_to_rows(attend_masked(q, k, v, None, Some(&mask), softcap)?)
}

/// The device's kernel for the newest `t` queries over a causal run of keys, as
/// `[t, h * d]`: split attention for up to [`SPLIT_MAX_ROWS`] rows, flash attention beyond;
/// `None` where neither applies.
fn suffix_kernel(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    softcap: Option<f64>,
) -> Result<Option<Tensor>> {
    if q.dim(2)? <= SPLIT_MAX_ROWS {
        fused::split_attention(q, k, v, window, softcap)
    } else {
        fused::flash_attention(q, k, v, window, softcap)
    }
}

/// Most queries of a block that [`attend_row_by_row`] takes (decode and verification blocks).
const ROW_BY_ROW_MAX: usize = 16;

/// The newest `t` queries `q: [1, h, t, d]` over full-attention keys `k`, `v: [1, kv, len,
/// d]` one at a time, each over exactly the keys it sees (query `i`: the first
/// `len - t + i + 1`) and unmasked, as `[1, h, t, d]`: bitwise what a one-token step at that
/// position computes. One masked product over the whole block rounds differently (by ~1e-5
/// in a real model's logits on the CPU), which a greedy verification must not do: its rows
/// are compared with what autoregressive decoding would pick, and a quantized model's 8-bit
/// activations turn such a difference into a jump.
fn attend_row_by_row(q: &Tensor, k: &Tensor, v: &Tensor, softcap: Option<f64>) -> Result<Tensor> {
    let (t, len) = (q.dim(2)?, k.dim(2)?);
    let rows = (0..t)
        .map(|i| {
            let seen = len - t + i + 1;
            attend_masked(
                &q.narrow(2, i, 1)?,
                &k.narrow(2, 0, seen)?,
                &v.narrow(2, 0, seen)?,
                None,
                None,
                softcap,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&rows, 2)?)
}

/// `[1, h, t, d]` -> `[t, h * d]`.
fn heads_to_rows(out: Tensor) -> Result<Tensor> {
    let (_, h, t, d) = out.dims4()?;
    Ok(out.squeeze(0)?.transpose(0, 1)?.reshape((t, h * d))?)
}

/// Attention of a long block of queries (a prefill) that are the newest positions of the
/// keys `k`, `v: [1, kv, L, d]` (causal, optionally within a sliding `window`), in chunks of
/// [`PREFILL_CHUNK`] queries: each chunk multiplies only against the keys it can see and
/// builds its `[chunk, keys]` mask on the device, so neither `[t, L]` scores per head nor a
/// host-built mask ever exist. Returns `[1, h, t, d]`.
fn attend_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let t = q.dim(2)?;
    let len = k.dim(2)?;
    // Key index of query 0 (the queries are the last t keys).
    let q0 = len - t;
    let mut outs = Vec::with_capacity(t.div_ceil(PREFILL_CHUNK));
    for start in (0..t).step_by(PREFILL_CHUNK) {
        let rows = PREFILL_CHUNK.min(t - start);
        let first = q0 + start; // key index of the chunk's first query
        let key_lo = window.map_or(0, |w| (first + 1).saturating_sub(w));
        let key_hi = first + rows;
        let keys = key_hi - key_lo;
        let qc = q.narrow(2, start, rows)?.contiguous()?;
        let kc = k.narrow(2, key_lo, keys)?;
        let vc = v.narrow(2, key_lo, keys)?;
        // Query r sits at key index (first - key_lo) + r of the narrowed keys.
        outs.push(attend_causal(
            &qc,
            &kc,
            &vc,
            first - key_lo,
            window,
            softcap,
        )?);
    }
    let outs: Vec<&Tensor> = outs.iter().collect();
    Ok(Tensor::cat(&outs, 2)?)
}

/// Attention of `q: [1, h, t, d]` over `k`, `v: [1, kv, L, d]` where query `r` sits at key
/// index `first + r` (causal, optionally within `window`): the fused causal softmax where
/// the device has one, else [`attend_masked`] with a mask built on the device.
fn attend_causal(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    first: usize,
    window: Option<usize>,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let (_, h, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    if fused::has_kernels(q.device()) {
        let scores = q.reshape((1, kv, (h / kv) * t, d))?.matmul(&k.t()?)?;
        fused::causal_softmax_in_place(&scores, t, first, window, softcap)?;
        return Ok(scores.matmul(v)?.reshape((1, h, t, d))?);
    }
    let mask = causal_mask(first, t, k.dim(2)?, window, q.device())?;
    attend_masked(q, k, v, None, mask.as_ref(), softcap)
}

/// Softmax attention of `q: [1, h, t, d]` over `k`, `v: [1, kv, L, d]` (possibly strided
/// views) and a `tail` `[1, kv, L', d]`, with an additive `mask: [t, L + L']` and an
/// optional `tanh` softcap of the logits. Grouped heads share K/V without copying them: the
/// `h / kv` query heads of a group are stacked as rows of one `[g * t, d]` matrix. A tail
/// gets its own score and value products (joined along the key axis only for the softmax),
/// so it is never copied together with `k`/`v`. Returns `[1, h, t, d]`.
fn attend_masked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    tail: Option<&(Tensor, Tensor)>,
    mask: Option<&Tensor>,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let (_, h, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    let g = h / kv;
    let q = q.reshape((1, kv, g * t, d))?;
    let head_len = k.dim(2)?;
    let mut scores = q.matmul(&k.t()?)?; // [1, kv, g t, L]
    if let Some((tk, _)) = tail {
        scores = Tensor::cat(&[&scores, &q.matmul(&tk.t()?)?], 3)?;
    }
    let len = scores.dim(3)?;
    if let Some(cap) = softcap {
        scores = ((scores / cap)?.tanh()? * cap)?;
    }
    if let Some(mask) = mask {
        let mask = mask.to_dtype(scores.dtype())?;
        scores = scores.reshape((kv, g, t, len))?.broadcast_add(&mask)?;
    }
    let dtype = scores.dtype();
    let probs = match dtype {
        DType::F32 | DType::F64 => candle_nn::ops::softmax_last_dim(&scores)?,
        _ => candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?.to_dtype(dtype)?,
    };
    let probs = probs.reshape((1, kv, g * t, len))?;
    let out = match tail {
        None => probs.matmul(v)?, // [1, kv, g t, d]
        Some((_, tv)) => {
            let head = probs.narrow(3, 0, head_len)?.contiguous()?;
            let tail = probs.narrow(3, head_len, len - head_len)?.contiguous()?;
            (head.matmul(v)? + tail.matmul(tv)?)?
        }
    };
    Ok(out.reshape((1, h, t, d))?)
}

/// Most queries the split attention kernel takes (decode steps, verification blocks, trees
/// take the masked path anyway); longer blocks are prefills.
pub const SPLIT_MAX_ROWS: usize = 32;

/// Queries per chunk of a long block's attention: bounds the scores in memory at
/// `heads * PREFILL_CHUNK * keys` (f32: 1 GiB for 32 heads over 8k keys).
pub const PREFILL_CHUNK: usize = 1024;

/// The additive causal mask `[rows, keys]` built on `device` (no host-side `O(rows × keys)`
/// work): row `r` is the query at key index `first + r` and sees key `j` iff `j <= first + r`
/// and, with a `window`, `j > first + r - window`. `None` when nothing is hidden.
fn causal_mask(
    first: usize,
    rows: usize,
    keys: usize,
    window: Option<usize>,
    device: &candle_core::Device,
) -> Result<Option<Tensor>> {
    // Every row but the last ends before the last key.
    let hides_future = rows > 1;
    let hides_past = window.is_some_and(|w| first + rows > w);
    if !hides_future && !hides_past {
        return Ok(None);
    }
    // Positions are exact in f32 below 2^24.
    let row = Tensor::arange(first as u32, (first + rows) as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((rows, 1))?;
    let col = Tensor::arange(0u32, keys as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((1, keys))?;
    let behind = row.broadcast_sub(&col)?; // query position - key position
    let mut visible = behind.ge(0f64)?.to_dtype(DType::F32)?;
    if let Some(w) = window {
        visible = (visible * behind.lt(w as f64)?.to_dtype(DType::F32)?)?;
    }
    // Hidden keys get -1e30, not -inf: exact zeros after the softmax, and no inf - inf
    // anywhere (a bf16 or f16 mask rounds it to -inf or a large negative value alike).
    Ok(Some(visible.affine(1e30, -1e30)?))
}

/// A sliding-window ring attended in place by [`Attention::forward_in_place`].
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingStep<'a> {
    /// Tokens each query sees, itself included.
    pub window: usize,
    /// The sequence length after the step on the host: the RoPE table covers it (a longer
    /// table is another recording).
    pub positions: usize,
    /// A staged speculation's side buffer, where the step's K/V go.
    pub tail: Option<&'a crate::cache::StagedTail>,
}
