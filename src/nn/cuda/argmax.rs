//! The row argmax that ends a greedy step (`argmax_rows`, `argmax_rows_split` in
//! elementwise.cu): the ids of a step's logits, on the device.
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig};
use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
use candle_core::{CpuStorage, Layout, Shape, Tensor};

use super::launch::Launch;

/// The argmax of each row of a contiguous f32, bf16 or f16 `[rows, n]` as u32 `[rows]`, the
/// first index on ties (`argmax_rows` in elementwise.cu): one block per row instead of candle's
/// reduction, which took 0.1 ms over a 128k vocabulary, a tenth of a 1B draft's step.
pub struct ArgmaxRows;

/// Launches `argmax_rows_<dtype>` over the contiguous `[rows, n]` logits `(s, l)` into `out`
/// (`rows` u32 values).
/// Columns a block of the split argmax reads (`argmax_rows_split` in elementwise.cu), and the
/// row length from which rows are split: one block per row read a 262k-entry row at ~10 GB/s.
const ARGMAX_CHUNK: usize = 4096;
const ARGMAX_SPLIT_MIN: usize = 4 * ARGMAX_CHUNK;
/// Most rows of a split argmax (`ARGMAX_COUNTERS` in elementwise.cu: a count per row).
const ARGMAX_COUNTERS: usize = 64;

fn argmax_launch(
    s: &CudaStorage,
    l: &Layout,
    out: &CudaView<'_, u32>,
) -> candle_core::Result<usize> {
    let (Some((a, b)), [rows, n]) = (l.contiguous_offsets(), l.dims()) else {
        candle_core::bail!("argmax-rows: contiguous [rows, n] logits expected, got {l:?}");
    };
    let (rows, n) = (*rows, *n);
    if out.len() < rows {
        candle_core::bail!("argmax-rows: {rows} rows into {} ids", out.len());
    }
    let dev = s.device();
    // Long rows over several blocks each (the engine option `argmax_split`): the same result.
    let split =
        crate::engine::get().argmax_split && n >= ARGMAX_SPLIT_MIN && rows <= ARGMAX_COUNTERS;
    let kernel = if split {
        "argmax_rows_split"
    } else {
        "argmax_rows"
    };
    let (name, mut l) = match &s.slice {
        CudaStorageSlice::F32(_) => ("f32", Launch::new(dev, &format!("{kernel}_f32"))?),
        CudaStorageSlice::BF16(_) => ("bf16", Launch::new(dev, &format!("{kernel}_bf16"))?),
        CudaStorageSlice::F16(_) => ("f16", Launch::new(dev, &format!("{kernel}_f16"))?),
        _ => candle_core::bail!("argmax-rows: float logits (f32, bf16, f16) expected"),
    };
    match &s.slice {
        CudaStorageSlice::F32(x) => l.ptr(&x.slice(a..b)),
        CudaStorageSlice::BF16(x) => l.ptr(&x.slice(a..b)),
        CudaStorageSlice::F16(x) => l.ptr(&x.slice(a..b)),
        _ => candle_core::bail!("argmax-rows: {name} logits"),
    };
    l.ptr(out).val(n as i32);
    if split {
        let blocks = n.div_ceil(ARGMAX_CHUNK);
        // SAFETY: each block writes its (value, index) pair before the row's last block
        // reads them all.
        let part = unsafe { super::op::out_alloc::<f32>(dev, rows * blocks * 2)? };
        l.val(ARGMAX_CHUNK as i32).ptr(&part);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `argmax_rows_split`; block (b, i) reads columns
        // [b * chunk, (b + 1) * chunk) of row i, writes pair (i, b) of `part` (rows × blocks
        // pairs) and, last of its row, out[i]; rows ≤ ARGMAX_COUNTERS.
        unsafe { l.run(cfg) }?;
        // Scratch: freed after the launch, or kept to the end of a recording.
        super::graph_edges::keep_scratch(part);
        return Ok(rows);
    }
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: matches `argmax_rows`; block i reads row i of the logits only and writes
    // out[i] (out holds at least `rows` values).
    unsafe { l.run(cfg) }?;
    Ok(rows)
}

impl candle_core::CustomOp1 for ArgmaxRows {
    fn name(&self) -> &'static str {
        "argmax-rows"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("argmax-rows runs on CUDA only; the CPU takes candle's argmax")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev = s.device();
        // SAFETY: written in full by the kernel (one value per row).
        let out =
            unsafe { super::op::out_alloc::<u32>(dev, l.dims().first().copied().unwrap_or(0))? };
        let rows = argmax_launch(s, l, &out.slice(..))?;
        Ok((
            CudaStorage {
                slice: CudaStorageSlice::U32(out),
                device: dev.clone(),
            },
            Shape::from(rows),
        ))
    }
}

/// The argmax of each row of the CUDA `logits: [rows, n]` (any float dtype), the first index
/// of the largest value on ties, as `[rows]` u32 on the device ([`ArgmaxRows`]).
pub fn argmax_on_device(logits: &Tensor) -> candle_core::Result<Tensor> {
    logits.contiguous()?.apply_op1_no_bwd(&ArgmaxRows)
}

/// [`argmax_on_device`] of `logits` written into the u32 `ids: [rows]` in place
/// ([`ArgmaxInto`]: a recorded graph's output buffer).
pub fn argmax_into(logits: &Tensor, ids: &Tensor) -> candle_core::Result<()> {
    ids.inplace_op2(&logits.contiguous()?, &ArgmaxInto)
}

/// [`ArgmaxRows`] written into an existing `[rows]` u32 tensor (the first operand, in place):
/// a recorded CUDA graph's output buffer.
pub struct ArgmaxInto;

impl candle_core::InplaceOp2 for ArgmaxInto {
    fn name(&self) -> &'static str {
        "argmax-into"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        candle_core::bail!("argmax-into runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        ids: &mut CudaStorage,
        il: &Layout,
        s: &CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<()> {
        let (Some((a, b)), CudaStorageSlice::U32(ids)) = (il.contiguous_offsets(), &ids.slice)
        else {
            candle_core::bail!("argmax-into: a contiguous u32 destination expected");
        };
        argmax_launch(s, l, &ids.slice(a..b))?;
        Ok(())
    }
}
