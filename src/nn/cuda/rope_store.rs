//! RoPE's own kernel with the K/V store (`rope_store` in elementwise.cu), for recorded steps
//! whose split attention does not fuse them (the engine option `fused_rope` off).
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use super::attention::{head_rows, prefetch_bytes, prefetch_ranges};
use super::launch::Launch;
use super::op::view;

/// RoPE of a block's queries and keys at the positions of the step, with the rotated keys
/// and the values written into the cache buffers, the positions read from the device
/// (`rope_store` in elementwise.cu): a replayed graph's step writes where its `len` says.
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
    /// The gate/up weight `[2 * inter, hidden]` (gate rows, then up rows) of the MLP after
    /// this attention: the kernel's prologue prefetches the first rows of each half into the
    /// L2 (see [`prefetch_bytes`]), which the gate/up GEMV's first blocks read.
    pub prefetch: Option<Tensor>,
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
        let (t, heads, d, q_row) = head_rows(ql, "rope store", "q")?;
        let (tk, kv_heads, dk, k_row) = head_rows(kl, "rope store", "k")?;
        let (tv, kv_v, dv, v_row) = head_rows(vl, "rope store", "v")?;
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
        let pf_guard = self.prefetch.as_ref().map(|w| w.storage_and_layout());
        let pf = prefetch_ranges::<T>(&pf_guard, prefetch_bytes(&crate::engine::get()))?;
        // SAFETY: written in full by the kernel.
        let out = unsafe { super::op::out_alloc::<T>(dev, t * heads * d)? };
        let mut l = Launch::new(dev, &format!("rope_store_{name}"))?;
        let (q, k, v) = (
            q.slice(ql.start_offset()..),
            k.slice(kl.start_offset()..),
            v.slice(vl.start_offset()..),
        );
        l.ptr(&q).val(q_row as i64).ptr(&k).val(k_row as i64);
        l.ptr(&v).val(v_row as i64);
        l.ptr(&cos).ptr(&sin).ptr(&out).ptr(&kc).ptr(&vc);
        l.val((cache_dims[2] * d) as i64);
        l.ptr(&len).val(t as i32).val(heads as i32).val(d as i32);
        match &pf {
            Some((gate, up, n)) => l.ptr(gate).val(*n as i64).ptr(up).val(*n as i64),
            None => l.null().val(0i64).null().val(0i64),
        };
        let cfg = LaunchConfig {
            grid_dim: (t as u32, (heads + kv_heads) as u32, 1),
            block_dim: ((d / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `rope_store` in elementwise.cu; the caller keeps `len` within the
        // cache's capacity and the tables (the cache reserved the room first); the prefetched
        // ranges lie inside the weight's two halves (at most `half` elements each).
        unsafe { l.run(cfg) }?;
        Ok((out, Shape::from((1, heads, t, d))))
    }
}

float_op3!(RopeStore, "rope-store");
