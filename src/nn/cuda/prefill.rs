//! Attention kernels of long blocks (prefills): flash attention on tensor cores, and the
//! in-place causal softmax of a prefill chunk's scores.
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{CpuStorage, CustomOp3, InplaceOp1, Layout, Shape, Tensor};

use super::attention::{qkv_shape, QkvShape};
use super::launch::Launch;

/// Flash attention of a long block of queries (a prefill) that are the newest positions of
/// the keys: `flash_attn` in prefill.cu, tensor cores, the scores never in memory. bf16 and
/// f16 only.
///
/// Inputs of [`CustomOp3`]: `q: [1, heads, t, d]` (rows may be strided, elements
/// contiguous), `k`, `v: [1, kv_heads, len, d]` views of a cache buffer (as
/// [`super::SplitAttention`]); query `i` sits at key index `len - t + i`. Output `[t, heads * d]`.
pub struct FlashAttention {
    /// Sliding window (tokens each query sees, itself included).
    pub window: Option<usize>,
    /// `tanh` softcap of the logits.
    pub softcap: Option<f64>,
}

/// Queries per block of `flash_attn` (`FA_Q` in prefill.cu).
const FA_Q: usize = 64;

impl FlashAttention {
    #[allow(clippy::too_many_arguments)]
    fn launch<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
        &self,
        dev: &CudaDevice,
        name: &str,
        (q, ql): (&CudaSlice<T>, &Layout),
        (k, kl): (&CudaSlice<T>, &Layout),
        (v, vl): (&CudaSlice<T>, &Layout),
    ) -> candle_core::Result<(CudaSlice<T>, Shape)> {
        if name == "f32" {
            candle_core::bail!(
                "flash attention: f32 has no tensor-core path; take the chunked one"
            );
        }
        let QkvShape {
            heads,
            kv_heads,
            t,
            len,
            d,
            q_head,
            q_row,
            kv_head,
        } = qkv_shape("flash attention", ql, kl, vl)?;
        // SAFETY: the kernel writes every element of the t rows.
        let out = unsafe { super::op::out_alloc::<T>(dev, t * heads * d)? };
        let mut l = Launch::new(dev, &format!("flash_attn_{name}_d{d}"))?;
        let q = q.slice(ql.start_offset()..);
        let k = k.slice(kl.start_offset()..);
        let v = v.slice(vl.start_offset()..);
        l.ptr(&q).ptr(&k).ptr(&v).ptr(&out);
        l.val(t as i32).val(len as i32).val(heads as i32);
        l.val((heads / kv_heads) as i32);
        l.val(q_head as i64).val(q_row as i64).val(kv_head as i64);
        l.val(self.window.unwrap_or(0) as i32);
        l.val(self.softcap.unwrap_or(0.0) as f32);
        let cfg = LaunchConfig {
            grid_dim: (heads as u32, t.div_ceil(FA_Q) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `flash_attn` in prefill.cu; rows past t and keys past len are
        // never read (clamped) nor written; alignment checked by `flash_attention_applies`.
        unsafe { l.run(cfg) }?;
        Ok((out, Shape::from((t, heads * d))))
    }
}

float_op3!(FlashAttention, "flash-attention");

/// True when [`FlashAttention`] can take `q`, `k`: on CUDA, bf16 or f16, a head width the
/// kernel is built for, q's rows 4-byte aligned and key rows 16-byte aligned.
pub fn flash_attention_applies(q: &Tensor, k: &Tensor) -> bool {
    use candle_core::DType;
    let d = q.dims().last().copied().unwrap_or(0);
    let aligned = |t: &Tensor, align: usize| {
        let l = t.layout();
        l.start_offset().is_multiple_of(align)
            && l.stride().iter().all(|&s| s == 1 || s % align == 0)
    };
    q.device().is_cuda()
        && matches!(q.dtype(), DType::BF16 | DType::F16)
        && q.dtype() == k.dtype()
        && matches!(d, 32 | 64 | 128)
        && aligned(q, 2)
        && aligned(k, 8)
}

/// In-place causal softmax of a prefill chunk's scores `[1, kv_heads, group * rows, keys]`
/// (contiguous; the `rows` queries of each head consecutive): row `r` of a head is the query
/// at key index `first + r` and sees key `j` iff `j <= first + r` (and `j > first + r -
/// window`); hidden keys get probability 0. With `softcap`, `tanh` capping first. One kernel
/// instead of softcap, mask, dtype casts and softmax over the whole score tensor.
pub struct CausalSoftmax {
    /// Queries per head.
    pub rows: usize,
    /// Key index of each head's first query.
    pub first: usize,
    /// Sliding window.
    pub window: Option<usize>,
    /// `tanh` softcap.
    pub softcap: Option<f64>,
}

impl CausalSoftmax {
    fn launch<T: DeviceRepr>(
        &self,
        dev: &CudaDevice,
        name: &str,
        x: &mut CudaSlice<T>,
        l: &Layout,
    ) -> candle_core::Result<()> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("causal softmax: the scores must be contiguous");
        };
        let keys = *l.dims().last().unwrap_or(&0);
        let total_rows = (end - start) / keys.max(1);
        if keys == 0 || self.rows == 0 || !total_rows.is_multiple_of(self.rows) {
            candle_core::bail!(
                "causal softmax: {total_rows} rows of {keys} keys are not heads of {} queries",
                self.rows
            );
        }
        let mut l = Launch::new(dev, &format!("causal_softmax_{name}"))?;
        let x = x.slice_mut(start..end);
        l.ptr(&x);
        l.val(self.rows as i32)
            .val(keys as i32)
            .val(self.first as i32);
        l.val(self.window.unwrap_or(0) as i32);
        l.val(self.softcap.unwrap_or(0.0) as f32);
        let cfg = LaunchConfig {
            grid_dim: (total_rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `causal_softmax` in prefill.cu; block i touches row i only.
        unsafe { l.run(cfg) }?;
        Ok(())
    }
}

impl InplaceOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("causal softmax runs on CUDA only; the CPU takes candle's ops")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        let dev = s.device().clone();
        match &mut s.slice {
            CudaStorageSlice::BF16(x) => self.launch(&dev, "bf16", x, l),
            CudaStorageSlice::F16(x) => self.launch(&dev, "f16", x, l),
            CudaStorageSlice::F32(x) => self.launch(&dev, "f32", x, l),
            _ => candle_core::bail!("causal softmax: scores must be f32, f16 or bf16"),
        }
    }
}
