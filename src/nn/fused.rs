//! The device-generic way into specdec's fused kernels: each call returns `None` where no
//! kernel applies (another device, an unsupported shape, an engine option switching it off),
//! and the caller takes its candle-op path. The kernels themselves live in `cuda/`; the
//! state of recorded CUDA graphs in `cuda/graph.rs` and `graphs.rs`.
use candle_core::Tensor;

use crate::error::Result;

/// Attention of the newest `t` queries `q: [1, h, t, d]` over the cache views `k`, `v:
/// [1, kv, len, d]` (causal, optionally within a sliding `window`), as `[t, h * d]`, read
/// in place by the CUDA split kernel, or on the CPU in f32 by [`super::cpu_attention`].
/// `None` elsewhere or for shapes they do not cover.
pub fn split_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    softcap: Option<f64>,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if super::cuda::split_attention_applies(q, k) {
        let op = super::cuda::SplitAttention {
            window,
            softcap,
            len: None,
            rope: None,
            ring: None,
        };
        return Ok(Some(made(q.apply_op3_no_bwd(k, v, &op)?)));
    }
    let keys = super::cpu_attention::Keys::Suffix { window };
    super::cpu_attention::attention(q, k, v, keys, softcap)
}

/// Attention of the newest `t` queries `q: [1, h, t, d]` (positions `end - t ..= end - 1`)
/// over a sliding-window ring `k`, `v: [1, kv, capacity, d]` read in place (position `p` in
/// slot `p % capacity`; positions below `lo` stale), each query seeing the `window`
/// positions up to its own, as `[t, h * d]`: the split kernel with the visibility computed
/// from positions (no mask, no copy of the ring); on the CPU in f32 by
/// [`super::cpu_attention`]. `None` elsewhere or for shapes they do not cover.
pub fn ring_attention(
    q: &Tensor,
    (k, v): (&Tensor, &Tensor),
    (end, lo, window): (usize, usize, usize),
    softcap: Option<f64>,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if crate::engine::get().ring_in_place && super::cuda::split_attention_applies(q, k) {
        let op = super::cuda::SplitAttention {
            window: Some(window),
            softcap,
            len: None,
            rope: None,
            ring: Some(super::cuda::RingKeys {
                end,
                lo,
                tail: None,
            }),
        };
        return Ok(Some(made(q.apply_op3_no_bwd(k, v, &op)?)));
    }
    let keys = super::cpu_attention::Keys::Ring { end, lo, window };
    super::cpu_attention::attention(q, k, v, keys, softcap)
}

/// Attention of the queries `q: [1, h, t, d]` that are nodes `first ..` of a token tree
/// whose block ends the keys `k`, `v: [1, kv, base + nodes, d]` (each node sees positions
/// `0 .. base` and its ancestors), as `[t, h * d]`: on the CPU in f32 by
/// [`super::cpu_attention`], each row bitwise the one-token step after its path is
/// committed. `None` elsewhere (CUDA records trees in place: `cuda/graph.rs`).
pub fn tree_attention(
    q: &Tensor,
    (k, v): (&Tensor, &Tensor),
    (base, first, tree): (usize, usize, &crate::cache::TokenTree),
    softcap: Option<f64>,
) -> Result<Option<Tensor>> {
    let keys = super::cpu_attention::Keys::Tree { base, first, tree };
    super::cpu_attention::attention(q, k, v, keys, softcap)
}

/// `t`, a tensor one of our CUDA ops just made, kept alive while a graph records (its free
/// then lands after every kernel of the step: see `cuda/graph_edges.rs`).
#[cfg(feature = "cuda")]
pub(crate) fn made(t: Tensor) -> Tensor {
    super::cuda::graph_edges::keep(&t);
    t
}

/// Attention of a long block of queries `q: [1, h, t, d]` that are the newest positions of
/// the keys `k`, `v: [1, kv, len, d]` (causal, optionally within a sliding `window`), as
/// `[t, h * d]`, by the CUDA flash kernel (bf16 / f16), or on the CPU in f32 by
/// [`super::cpu_attention`]: no scores in memory. `None` elsewhere or for shapes they do not
/// cover.
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    softcap: Option<f64>,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if super::cuda::flash_attention_applies(q, k) {
        let op = super::cuda::FlashAttention { window, softcap };
        return Ok(Some(q.apply_op3_no_bwd(k, v, &op)?));
    }
    let keys = super::cpu_attention::Keys::Suffix { window };
    super::cpu_attention::attention(q, k, v, keys, softcap)
}

/// True when `device` has specdec's own kernels (CUDA in a `cuda` build).
pub fn has_kernels(device: &candle_core::Device) -> bool {
    cfg!(feature = "cuda") && device.is_cuda()
}

/// Softmax in place of a prefill chunk's `scores: [1, kv, group * rows, keys]` (contiguous,
/// the `rows` queries of a head consecutive) under the causal rule of the attention's
/// chunks: row `r` is the query at key index `first + r`. Only where [`has_kernels`]; the
/// caller masks and softmaxes with candle elsewhere.
pub fn causal_softmax_in_place(
    scores: &Tensor,
    rows: usize,
    first: usize,
    window: Option<usize>,
    softcap: Option<f64>,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        let op = super::cuda::CausalSoftmax {
            rows,
            first,
            window,
            softcap,
        };
        if !scores.is_contiguous() {
            return Err(crate::error::Error::invalid(
                "causal softmax: the scores must be contiguous (it writes them in place)",
            ));
        }
        Ok(scores.inplace_op1(&op)?)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (scores, rows, first, window, softcap);
        Err(crate::error::Error::invalid(
            "causal softmax kernel needs a CUDA build",
        ))
    }
}

/// `x wᵀ` for a few rows `x: [rows, in]` and a weight `w: [out, in]`, reading the weight
/// once (CUDA's GEMV kernel); `None` off CUDA or for shapes it does not take.
pub fn gemv(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if super::cuda::gemv_applies(x, w) {
        return Ok(Some(made(
            x.contiguous()?
                .apply_op2_no_bwd(w, &super::cuda::Gemv { gate: None })?,
        )));
    }
    let _ = (x, w);
    Ok(None)
}

/// Whether a step over the residual stream `x: [t, hidden]` folds its norms and residual
/// adds into its products ([`folded_gemv`]): CUDA's tensor-core GEMV rows (bf16 / f16, at
/// most 16 rows, `hidden` a multiple of 32), unless the engine option `gemv_fold` (or
/// `tc_gemv`) is off. A product the
/// kernel does not take still gets the right result from [`folded_gemv`]'s callers.
pub fn folds(x: &Tensor) -> bool {
    #[cfg(feature = "cuda")]
    {
        super::cuda::folds(x)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = x;
        false
    }
}

/// The activation of a gated MLP's gate inside its gate/up product (see [`folded_gemv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `silu(g) * u`.
    Silu,
    /// `gelu(g) * u`, GELU with the tanh approximation (Gemma's MLP).
    Gelu,
}

/// What a decode or verification product takes in with it (see [`folded_gemv`]).
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub enum Folded<'a> {
    /// `x` is the residual stream before this RMSNorm (weight, epsilon): the product is
    /// taken of `norm(x)`.
    Norm(&'a Tensor, f32),
    /// The residual stream `[rows, out]` the product is added to.
    Resid(&'a Tensor),
}

/// `norm(x) wᵀ` ([`Folded::Norm`]) or `resid + x wᵀ` ([`Folded::Resid`]) for a few rows `x:
/// [rows, in]` in one CUDA tensor-core GEMV (bf16 / f16), with a `gate` the gated MLP's
/// fused gate/up product `act(x gᵀ) * (x uᵀ)` of [`silu_gate_gemv`] (norm only; GELU under
/// the engine option `gelu_gate`): no norm or add kernel runs
/// between a step's products. The norm's row scale `rsqrt(mean(x²) + eps)` multiplies the
/// sums instead of the inputs, so the result is the unfused path's up to one rounding (not
/// bitwise), the same for a row at any row count. A `bias` `[out]` is added to the rounded
/// product as a separate add would add it (in the GEMV's epilogue where it fits: no gate).
/// `None` off CUDA, for shapes the kernel does not take, or with the engine option
/// `gemv_fold` off.
pub fn folded_gemv(
    x: &Tensor,
    w: &Tensor,
    fold: Folded,
    gate: Option<Gate>,
    bias: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    {
        use super::cuda::{bias_fits, fold_applies, Fold, FoldedGemv};
        let (aux, norm, fold) = match fold {
            Folded::Norm(g, eps) => (g, true, Fold::Norm { eps }),
            Folded::Resid(r) => (r, false, Fold::Resid),
        };
        let x = x.contiguous()?;
        if fold_applies(&x, w, aux, gate, norm) {
            let inside = bias.filter(|b| bias_fits(b, w, gate));
            let op = FoldedGemv {
                gate,
                fold,
                bias: inside.cloned(),
            };
            let y = made(x.apply_op3_no_bwd(w, aux, &op)?);
            return Ok(Some(match (bias, inside) {
                (Some(b), None) => y.broadcast_add(b)?,
                _ => y,
            }));
        }
        Ok(None)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (x, w, fold, gate, bias);
        Ok(None)
    }
}

/// `silu(x gᵀ) * (x uᵀ)` for a few rows `x: [rows, in]` and a gated MLP's fused gate/up
/// weight `w: [2 inter, in]` (gate rows first), in one GEMV whose blocks pair each gate row
/// with its up row (CUDA, bf16 / f16), in the arithmetic of [`gemv`] then [`silu_mul`]. `None`
/// off CUDA, for shapes it does not take, or with the engine option `silu_gate` off.
pub fn silu_gate_gemv(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if super::cuda::silu_gate_applies(x, w) {
        return Ok(Some(made(x.contiguous()?.apply_op2_no_bwd(
            w,
            &super::cuda::Gemv {
                gate: Some(Gate::Silu),
            },
        )?)));
    }
    let _ = (x, w);
    Ok(None)
}

/// `silu(gate) * up` of a fused `[t, 2 * inter]` gate/up product in one pass: on CUDA, and in
/// f32 on the CPU (where candle's ops on the two strided halves cost ~5 ns an element, 5% of
/// the shipped target's decode step); `None` elsewhere.
pub fn silu_mul(gate_up: &Tensor) -> Result<Option<Tensor>> {
    if gate_up.rank() != 2 || gate_up.dim(1)? % 2 != 0 {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    if gate_up.device().is_cuda() {
        return Ok(Some(
            gate_up
                .contiguous()?
                .apply_op1_no_bwd(&super::cuda::GateMul { gelu: false })?,
        ));
    }
    if gate_up.device().is_cpu() && gate_up.dtype() == candle_core::DType::F32 {
        return Ok(Some(gate_up.contiguous()?.apply_op1_no_bwd(&CpuSiluMul)?));
    }
    Ok(None)
}

/// `gelu(gate) * up` (GELU with the tanh approximation) of a fused `[t, 2 * inter]` gate/up
/// product in one pass on CUDA, computed in f32 and rounded once (candle's ops round the
/// activation first); `None` elsewhere.
pub fn gelu_mul(gate_up: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if gate_up.device().is_cuda() && gate_up.rank() == 2 && gate_up.dim(1)? % 2 == 0 {
        return Ok(Some(made(
            gate_up
                .contiguous()?
                .apply_op1_no_bwd(&super::cuda::GateMul { gelu: true })?,
        )));
    }
    let _ = gate_up;
    Ok(None)
}

/// [`silu_mul`] on the CPU in f32: `out[r, i] = silu(g) * u` for `g = x[r, i]`,
/// `u = x[r, inter + i]` of a contiguous `[t, 2 * inter]` input, in candle's arithmetic
/// (`g / (1 + exp(-g))`, then the product, each rounded to f32), so bitwise its ops' result.
struct CpuSiluMul;

/// Elements from which [`CpuSiluMul`] and [`CpuRope`] spread their work across threads (a
/// decode or verification block stays on one).
const PARALLEL_MIN_ELEMENTS: usize = 1 << 15;

impl candle_core::CustomOp1 for CpuSiluMul {
    fn name(&self) -> &'static str {
        "silu-mul-cpu"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let x = f32_slice(s, l)?;
        let (t, width) = l.shape().dims2()?;
        let inter = width / 2;
        let mut out = vec![0f32; t * inter];
        let row = |(x, out): (&[f32], &mut [f32])| {
            let (gate, up) = x.split_at(inter);
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        };
        // A prefill's rows across the pool's threads (each row is the same arithmetic).
        if t * inter >= PARALLEL_MIN_ELEMENTS {
            use rayon::prelude::*;
            x.par_chunks_exact(width)
                .zip(out.par_chunks_exact_mut(inter))
                .for_each(row);
        } else {
            x.chunks_exact(width)
                .zip(out.chunks_exact_mut(inter))
                .for_each(row);
        }
        Ok((candle_core::CpuStorage::F32(out), (t, inter).into()))
    }
}

/// candle's `rope` of `x: [1, h, t, d]` by `cos`, `sin: [t, d / 2]` (contiguous) on the CPU in
/// f32 ([`CpuRope`]); `None` elsewhere.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Option<Tensor>> {
    let cpu_f32 = x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && x.rank() == 4
        && x.dim(0)? == 1
        && [x, cos, sin].iter().all(|t| t.is_contiguous());
    if !cpu_f32 {
        return Ok(None);
    }
    Ok(Some(x.apply_op3_no_bwd(cos, sin, &CpuRope)?))
}

/// [`rope`] on the CPU: element for element candle's (`x1 c - x2 s`, `x1 s + x2 c`), so
/// bitwise its result, but a block spreads its heads across threads only from
/// [`PARALLEL_MIN_ELEMENTS`] (candle's sends any block of several positions to rayon, a
/// task per head, which costs a verification block more than the rotation:
/// docs/kernel-notes.md, "RoPE of a block on the calling thread").
struct CpuRope;

impl candle_core::CustomOp3 for CpuRope {
    fn name(&self) -> &'static str {
        "rope-cpu"
    }

    fn cpu_fwd(
        &self,
        x: &candle_core::CpuStorage,
        lx: &candle_core::Layout,
        cos: &candle_core::CpuStorage,
        lc: &candle_core::Layout,
        sin: &candle_core::CpuStorage,
        ls: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (x, cos, sin) = (f32_slice(x, lx)?, f32_slice(cos, lc)?, f32_slice(sin, ls)?);
        let (_, h, t, d) = lx.shape().dims4()?;
        let half = d / 2;
        if cos.len() < t * half || sin.len() < t * half {
            candle_core::bail!(
                "rope: cos/sin of {} positions for {t}",
                cos.len() / half.max(1)
            );
        }
        let mut out = vec![0f32; h * t * d];
        // One head's `[t, d]` rows.
        let head = |(x, out): (&[f32], &mut [f32])| {
            for ((xr, or), (c, s)) in x
                .chunks_exact(d)
                .zip(out.chunks_exact_mut(d))
                .zip(cos.chunks_exact(half).zip(sin.chunks_exact(half)))
            {
                let (x1, x2) = xr.split_at(half);
                let (o1, o2) = or.split_at_mut(half);
                for i in 0..half {
                    o1[i] = x1[i] * c[i] - x2[i] * s[i];
                    o2[i] = x1[i] * s[i] + x2[i] * c[i];
                }
            }
        };
        if h * t * d >= PARALLEL_MIN_ELEMENTS {
            use rayon::prelude::*;
            x.par_chunks_exact(t * d)
                .zip(out.par_chunks_exact_mut(t * d))
                .for_each(head);
        } else {
            x.chunks_exact(t * d)
                .zip(out.chunks_exact_mut(t * d))
                .for_each(head);
        }
        Ok((candle_core::CpuStorage::F32(out), lx.shape().clone()))
    }
}

/// The elements of a contiguous f32 CPU tensor (the CPU ops above take no other).
fn f32_slice<'a>(
    s: &'a candle_core::CpuStorage,
    l: &candle_core::Layout,
) -> candle_core::Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (candle_core::CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("a contiguous f32 CPU tensor only"),
    }
}

/// `(x + y, rmsnorm(x + y) * weight)` in one pass on CUDA for `x`, `y: [t, h]`; `None`
/// elsewhere.
pub fn add_rmsnorm(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<Option<(Tensor, Tensor)>> {
    match add_norm_kernel(x, y, weight, eps, false)? {
        Some(out) => Ok(Some((out.get(0)?, out.get(1)?))),
        None => Ok(None),
    }
}

/// `x + rmsnorm(y) * weight` in one pass on CUDA for `x`, `y: [t, h]` (a sandwich block's
/// post-norm and the residual add after it): the norm rounded to the dtype, then the sum,
/// as the separate norm and add round them. `None` elsewhere.
pub fn add_normed(x: &Tensor, y: &Tensor, weight: &Tensor, eps: f32) -> Result<Option<Tensor>> {
    add_norm_kernel(x, y, weight, eps, true)
}

/// The kernel of [`add_rmsnorm`] (`[2, t, h]`: the sum, then its norm) or, with `post`, of
/// [`add_normed`] (`[t, h]`), where the device and the shapes take it.
fn add_norm_kernel(
    x: &Tensor,
    y: &Tensor,
    weight: &Tensor,
    eps: f32,
    post: bool,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        // A copy made by `contiguous` starts aligned; a contiguous view must already be.
        let (x, y) = (x.contiguous()?, y.contiguous()?);
        if !super::cuda::add_rmsnorm_applies(&x, &y) {
            return Ok(None);
        }
        let op = super::cuda::AddRmsNorm { eps, post };
        let out = x.apply_op3_no_bwd(&y, &weight.contiguous()?, &op)?;
        return Ok(Some(made(out)));
    }
    let _ = (x, y, weight, eps, post);
    Ok(None)
}

/// The argmax of each row of `logits: [rows, vocab]`, read back to the host: the first index
/// of the largest value on ties. On CUDA (f32) a one-block-per-row kernel, elsewhere candle's
/// argmax.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(argmax_on_device(logits)?.to_vec1::<u32>()?)
}

/// [`argmax_rows`] left on logits' device: `[rows]` u32.
pub(crate) fn argmax_on_device(logits: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() && logits.rank() == 2 && logits.dtype().is_float() {
        return Ok(super::cuda::argmax_on_device(logits)?);
    }
    Ok(logits.argmax(candle_core::D::Minus1)?)
}

/// CUDA device `ordinal` on its own stream, which every thread's work then shares, with
/// cudarc's per-tensor event tracking off: with one stream, stream order already orders
/// every use of a tensor, and the events cost a record and a wait per operand of every
/// launch. (candle's default CUDA device uses the calling thread's default stream instead,
/// which needs those events as soon as two threads share a tensor.)
pub fn open_cuda(ordinal: usize) -> candle_core::Result<candle_core::Device> {
    let device = candle_core::Device::new_cuda_with_stream(ordinal)?;
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = &device {
        // SAFETY: this device has a single stream (above), so no tensor created on it is
        // ever used on another stream before, during or after its writes.
        unsafe { d.disable_event_tracking() };
    }
    Ok(device)
}

/// The CUDA ordinal of `device` (`None` off CUDA).
pub fn cuda_ordinal(device: &candle_core::Device) -> Option<usize> {
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(d) => Some(d.cuda_stream().context().ordinal()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    /// The CPU's fused `silu(gate) * up` is bitwise candle's ops on the two halves, over
    /// values from -20 to 20 (both tails of the sigmoid) and rows of several widths.
    #[test]
    fn cpu_silu_mul_is_bitwise_candles_ops() {
        for (t, inter) in [(1, 1), (1, 7), (3, 64), (5, 1536)] {
            let n = t * 2 * inter;
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 4001) as f32 / 100.0) - 20.0)
                .collect();
            let x = Tensor::from_vec(x, (t, 2 * inter), &Device::Cpu).unwrap();
            let fused = super::silu_mul(&x).unwrap().expect("the CPU takes f32");
            let gate = x.narrow(1, 0, inter).unwrap();
            let up = x.narrow(1, inter, inter).unwrap();
            let reference = (gate.silu().unwrap() * up).unwrap();
            let (a, b) = (
                fused.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                reference.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert_eq!(fused.dims(), [t, inter]);
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "t {t}, inter {inter}: fused {a:?} vs ops {b:?}");
        }
    }
}
