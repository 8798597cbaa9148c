//! Attention kernels: split attention over a KV cache read in place, the causal softmax of
//! a prefill chunk's scores, RoPE with the K/V store at positions read from the device.
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{CpuStorage, CustomOp3, InplaceOp1, Layout, Shape, Storage, Tensor};

use super::{view, MODULE, PTX};

/// Warps per block of the split kernel (`WARPS` in kernels.cu).
const WARPS: u32 = 4;

/// Keys per split of [`SplitAttention`]: one 32-key tile per warp, so a short cache still
/// spreads over blocks and an 8k cache's partial results stay a few MB.
pub const SPLIT_LEN: usize = 128;
/// Most splits (`MAX_SPLITS` in kernels.cu); longer caches take longer splits.
const MAX_SPLITS: usize = 1024;

/// Attention of the `t` newest positions over a KV cache, in two kernels (per-split partial
/// softmax, then the combine), reading K/V once in place: no copy of the cache, no mask
/// tensor, no `[t, len]` scores in memory.
///
/// Inputs of [`CustomOp3`]: `q: [1, heads, t, d]` (rows and heads may be strided, elements
/// contiguous), `k`, `v: [1, kv_heads, len, d]` views of a cache buffer (positions
/// consecutive from 0 at the same head stride). The queries are the last `t` of the `len`
/// positions; query `i` sees keys `j <= len - t + i` (and `j > len - t + i - window`).
/// Output `[t, heads * d]`.
pub struct SplitAttention {
    /// Sliding window (tokens each query sees, itself included).
    pub window: Option<usize>,
    /// `tanh` softcap of the logits.
    pub softcap: Option<f64>,
    /// A `[1]` u32 device tensor holding `len`, read by the kernel instead of `k`'s length
    /// (a replayed graph); `splits` then covers `max_len` keys.
    pub len: Option<(Tensor, usize)>,
}

fn dims4(l: &Layout, op: &str, what: &str) -> candle_core::Result<([usize; 4], [usize; 4])> {
    let (d, s) = (l.dims(), l.stride());
    if d.len() != 4 || d[0] != 1 || s[3] != 1 {
        candle_core::bail!("{op}: {what} must be [1, heads, rows, d] with contiguous rows, got dims {d:?} strides {s:?}");
    }
    Ok(([d[0], d[1], d[2], d[3]], [s[0], s[1], s[2], s[3]]))
}

/// The geometry of `q: [1, heads, t, d]` over the cache views `k`, `v: [1, kv_heads, len, d]`
/// (equal views, key rows `d` apart, `kv_heads` dividing `heads`, `0 < t <= len`), checked
/// for `op`.
struct QkvShape {
    heads: usize,
    kv_heads: usize,
    t: usize,
    len: usize,
    d: usize,
    /// Strides of q's heads and rows, of the cache's heads.
    q_head: usize,
    q_row: usize,
    kv_head: usize,
}

fn qkv_shape(op: &str, ql: &Layout, kl: &Layout, vl: &Layout) -> candle_core::Result<QkvShape> {
    let (qd, qs) = dims4(ql, op, "q")?;
    let (kd, ks) = dims4(kl, op, "k")?;
    let (vd, vs) = dims4(vl, op, "v")?;
    let [_, heads, t, d] = qd;
    let [_, kv_heads, len, kdim] = kd;
    // Dim 0 has size 1: its stride is whatever the buffer's was and is never used.
    if vd != kd || vs[1..] != ks[1..] || kdim != d || ks[2] != d || kv_heads == 0 {
        candle_core::bail!(
            "{op}: k {kd:?}/{ks:?} and v {vd:?}/{vs:?} must be equal cache views of head_dim {d}"
        );
    }
    if heads % kv_heads != 0 || t == 0 || t > len {
        candle_core::bail!(
            "{op}: {heads} heads over {kv_heads} kv heads, {t} queries over {len} keys"
        );
    }
    Ok(QkvShape {
        heads,
        kv_heads,
        t,
        len,
        d,
        q_head: qs[1],
        q_row: qs[2],
        kv_head: ks[1],
    })
}

impl SplitAttention {
    #[allow(clippy::too_many_arguments)]
    fn launch<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
        &self,
        dev: &CudaDevice,
        name: &str,
        (q, ql): (&CudaSlice<T>, &Layout),
        (k, kl): (&CudaSlice<T>, &Layout),
        (v, vl): (&CudaSlice<T>, &Layout),
    ) -> candle_core::Result<(CudaSlice<T>, Shape)> {
        let QkvShape {
            heads,
            kv_heads,
            t,
            len,
            d,
            q_head,
            q_row,
            kv_head,
        } = qkv_shape("split attention", ql, kl, vl)?;
        let group = heads / kv_heads;
        let max_len = self.len.as_ref().map_or(len, |(_, m)| *m);
        // Whole 128-key splits, at most MAX_SPLITS of them (kernels.cu's combine stages one
        // weight per split in shared memory).
        let split_len = SPLIT_LEN * max_len.div_ceil(SPLIT_LEN * MAX_SPLITS).max(1);
        let splits = max_len.div_ceil(split_len);
        // SAFETY: every block writes its whole partial row (empty splits included).
        let part = unsafe { dev.alloc::<f32>(t * heads * splits * (d + 2))? };
        let out = unsafe { dev.alloc::<T>(t * heads * d)? };

        let func = dev.get_or_load_custom_func(&format!("attn_split_{name}_d{d}"), MODULE, PTX)?;
        let q = q.slice(ql.start_offset()..);
        let k = k.slice(kl.start_offset()..);
        let v = v.slice(vl.start_offset()..);
        let len_storage = self.len.as_ref().map(|(t, _)| t.storage_and_layout());
        let len_slice = match &len_storage {
            Some((storage, layout)) => match &**storage {
                Storage::Cuda(s) => Some(s.as_cuda_slice::<u32>()?.slice(layout.start_offset()..)),
                _ => candle_core::bail!("split attention: the length tensor is not on the GPU"),
            },
            None => None,
        };
        let null = 0u64;
        let mut b = func.builder();
        b.arg(&q).arg(&k).arg(&v).arg(&part);
        match &len_slice {
            Some(s) => b.arg(s),
            None => b.arg(&null),
        };
        let (len_arg, t_arg, heads_arg, group_arg) =
            (len as u32, t as i32, heads as i32, group as i32);
        let (q_head, q_row, kv_head) = (q_head as i64, q_row as i64, kv_head as i64);
        let (split_len, window) = (split_len as i32, self.window.unwrap_or(0) as i32);
        let softcap = self.softcap.unwrap_or(0.0) as f32;
        b.arg(&len_arg).arg(&t_arg).arg(&heads_arg).arg(&group_arg);
        b.arg(&q_head).arg(&q_row).arg(&kv_head);
        b.arg(&split_len).arg(&window).arg(&softcap);
        let cfg = LaunchConfig {
            grid_dim: ((t * group) as u32, kv_heads as u32, splits as u32),
            block_dim: (WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the argument list matches `attn_split` in kernels.cu; every index the
        // kernel forms stays inside q, k, v (shapes checked above) and `part`.
        unsafe { b.launch(cfg) }.w()?;

        let combine = dev.get_or_load_custom_func(&format!("attn_combine_{name}"), MODULE, PTX)?;
        let mut b = combine.builder();
        let (splits_arg, d_arg) = (splits as i32, d as i32);
        b.arg(&part).arg(&out).arg(&splits_arg).arg(&d_arg);
        let cfg = LaunchConfig {
            grid_dim: ((t * heads) as u32, 1, 1),
            block_dim: (d as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `attn_combine`; `part` holds t * heads * splits rows of d + 2.
        unsafe { b.launch(cfg) }.w()?;
        Ok((out, Shape::from((t, heads * d))))
    }
}

float_op3!(SplitAttention, "split-attention");

/// True when [`SplitAttention`] can take `q`, `k`: on CUDA, a head width the kernels are
/// built for, and key rows aligned for the kernel's 16-byte loads.
pub fn split_attention_applies(q: &Tensor, k: &Tensor) -> bool {
    let d = q.dims().last().copied().unwrap_or(0);
    // Elements per 16-byte load, and per lane's share of a row.
    let align = (16 / k.dtype().size_in_bytes()).max(d / 32).max(1);
    let l = k.layout();
    let aligned =
        l.start_offset() % align == 0 && l.stride().iter().all(|&s| s == 1 || s % align == 0);
    q.device().is_cuda() && matches!(d, 32 | 64 | 128 | 256) && aligned
}

/// Flash attention of a long block of queries (a prefill) that are the newest positions of
/// the keys: `flash_attn` in kernels.cu, tensor cores, the scores never in memory. bf16 and
/// f16 only.
///
/// Inputs of [`CustomOp3`]: `q: [1, heads, t, d]` (rows may be strided, elements
/// contiguous), `k`, `v: [1, kv_heads, len, d]` views of a cache buffer (as
/// [`SplitAttention`]); query `i` sits at key index `len - t + i`. Output `[t, heads * d]`.
pub struct FlashAttention {
    /// Sliding window (tokens each query sees, itself included).
    pub window: Option<usize>,
    /// `tanh` softcap of the logits.
    pub softcap: Option<f64>,
}

/// Queries per block of `flash_attn` (`FA_Q` in kernels.cu).
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
        let out = unsafe { dev.alloc::<T>(t * heads * d)? };
        let func = dev.get_or_load_custom_func(&format!("flash_attn_{name}_d{d}"), MODULE, PTX)?;
        let q = q.slice(ql.start_offset()..);
        let k = k.slice(kl.start_offset()..);
        let v = v.slice(vl.start_offset()..);
        let (t_arg, len_arg, heads_arg, group_arg) = (
            t as i32,
            len as i32,
            heads as i32,
            (heads / kv_heads) as i32,
        );
        let (q_head, q_row, kv_head) = (q_head as i64, q_row as i64, kv_head as i64);
        let window = self.window.unwrap_or(0) as i32;
        let softcap = self.softcap.unwrap_or(0.0) as f32;
        let mut b = func.builder();
        b.arg(&q).arg(&k).arg(&v).arg(&out);
        b.arg(&t_arg).arg(&len_arg).arg(&heads_arg).arg(&group_arg);
        b.arg(&q_head).arg(&q_row).arg(&kv_head);
        b.arg(&window).arg(&softcap);
        let cfg = LaunchConfig {
            grid_dim: (heads as u32, t.div_ceil(FA_Q) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `flash_attn` in kernels.cu; rows past t and keys past len are
        // never read (clamped) nor written; alignment checked by `flash_attention_applies`.
        unsafe { b.launch(cfg) }.w()?;
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
        l.start_offset() % align == 0 && l.stride().iter().all(|&s| s == 1 || s % align == 0)
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
        if keys == 0 || self.rows == 0 || total_rows % self.rows != 0 {
            candle_core::bail!(
                "causal softmax: {total_rows} rows of {keys} keys are not heads of {} queries",
                self.rows
            );
        }
        let func = dev.get_or_load_custom_func(&format!("causal_softmax_{name}"), MODULE, PTX)?;
        let mut x = x.slice_mut(start..end);
        let mut b = func.builder();
        let (rows, keys_arg, first) = (self.rows as i32, keys as i32, self.first as i32);
        let window = self.window.unwrap_or(0) as i32;
        let softcap = self.softcap.unwrap_or(0.0) as f32;
        b.arg(&mut x)
            .arg(&rows)
            .arg(&keys_arg)
            .arg(&first)
            .arg(&window)
            .arg(&softcap);
        let cfg = LaunchConfig {
            grid_dim: (total_rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `causal_softmax` in kernels.cu; block i touches row i only.
        unsafe { b.launch(cfg) }.w()?;
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

/// RoPE of a block's queries and keys at the positions of the step, with the rotated keys
/// and the values written into the cache buffers, the positions read from the device
/// (`rope_store` in kernels.cu): a replayed graph's step writes where its `len` says.
///
/// Inputs of [`CustomOp3`]: `q: [t, heads, d]`, `k`, `v: [t, kv_heads, d]` (rows may be
/// strided, heads `d` apart). Output: `q` rotated, `[1, heads, t, d]`.
pub struct RopeStore {
    /// `[P, d / 2]` cosines (P covers every position of the cache).
    pub cos: Tensor,
    /// `[P, d / 2]` sines.
    pub sin: Tensor,
    /// `[1, kv_heads, capacity, d]` key buffer, written at slots `len - t ..= len - 1`.
    pub k_cache: Tensor,
    /// `[1, kv_heads, capacity, d]` value buffer.
    pub v_cache: Tensor,
    /// `[1]` u32: the cache length after the step.
    pub len: Tensor,
}

impl RopeStore {
    fn launch<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
        &self,
        dev: &CudaDevice,
        name: &str,
        (q, ql): (&CudaSlice<T>, &Layout),
        (k, kl): (&CudaSlice<T>, &Layout),
        (v, vl): (&CudaSlice<T>, &Layout),
    ) -> candle_core::Result<(CudaSlice<T>, Shape)> {
        let rows = |l: &Layout, what: &str| -> candle_core::Result<(usize, usize, usize, usize)> {
            let (d, s) = (l.dims(), l.stride());
            if d.len() != 3 || s[2] != 1 || s[1] != d[2] {
                candle_core::bail!(
                    "rope store: {what} must be [t, heads, d] with heads d apart, got {d:?} {s:?}"
                );
            }
            Ok((d[0], d[1], d[2], s[0]))
        };
        let (t, heads, d, q_row) = rows(ql, "q")?;
        let (tk, kv_heads, dk, k_row) = rows(kl, "k")?;
        let (tv, kv_v, dv, v_row) = rows(vl, "v")?;
        let cache_dims = self.k_cache.dims().to_vec();
        if tk != t
            || tv != t
            || kv_v != kv_heads
            || dk != d
            || dv != d
            || d % 2 != 0
            || cache_dims.len() != 4
            || cache_dims[1] != kv_heads
            || cache_dims[3] != d
            || self.v_cache.dims() != cache_dims.as_slice()
            || !self.k_cache.is_contiguous()
            || !self.v_cache.is_contiguous()
            || self.cos.dim(1)? != d / 2
            || !self.cos.is_contiguous()
            || !self.sin.is_contiguous()
        {
            candle_core::bail!(
                "rope store: q {:?}, k {:?}, v {:?}, cache {cache_dims:?}, tables {:?} do not fit",
                ql.dims(),
                kl.dims(),
                vl.dims(),
                self.cos.dims()
            );
        }
        let guards = [
            self.cos.storage_and_layout(),
            self.sin.storage_and_layout(),
            self.k_cache.storage_and_layout(),
            self.v_cache.storage_and_layout(),
        ];
        let len_guard = self.len.storage_and_layout();
        let (cos, sin) = (view::<T>(&guards[0], "cos")?, view::<T>(&guards[1], "sin")?);
        let (kc, vc) = (
            view::<T>(&guards[2], "k cache")?,
            view::<T>(&guards[3], "v cache")?,
        );
        let len = view::<u32>(&len_guard, "len")?;
        // SAFETY: written in full by the kernel.
        let out = unsafe { dev.alloc::<T>(t * heads * d)? };
        let func = dev.get_or_load_custom_func(&format!("rope_store_{name}"), MODULE, PTX)?;
        let (q, k, v) = (
            q.slice(ql.start_offset()..),
            k.slice(kl.start_offset()..),
            v.slice(vl.start_offset()..),
        );
        let (q_row, k_row, v_row) = (q_row as i64, k_row as i64, v_row as i64);
        let head_stride = (cache_dims[2] * d) as i64;
        let (t_arg, heads_arg, d_arg) = (t as i32, heads as i32, d as i32);
        let mut b = func.builder();
        b.arg(&q)
            .arg(&q_row)
            .arg(&k)
            .arg(&k_row)
            .arg(&v)
            .arg(&v_row);
        b.arg(&cos)
            .arg(&sin)
            .arg(&out)
            .arg(&kc)
            .arg(&vc)
            .arg(&head_stride);
        b.arg(&len).arg(&t_arg).arg(&heads_arg).arg(&d_arg);
        let cfg = LaunchConfig {
            grid_dim: (t as u32, (heads + kv_heads) as u32, 1),
            block_dim: ((d / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `rope_store` in kernels.cu; the caller keeps `len` within the
        // cache's capacity and the tables (the cache reserved the room first).
        unsafe { b.launch(cfg) }.w()?;
        Ok((out, Shape::from((1, heads, t, d))))
    }
}

float_op3!(RopeStore, "rope-store");
