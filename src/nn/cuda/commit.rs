//! The commit of a speculation over a model's staged rings in one launch (`staged_commit` in
//! elementwise.cu): each ring's copy of the accepted K/V from its side buffer would otherwise
//! be four or more candle copies a layer, enqueued by the host after every verification. And
//! the commit of a token tree's accepted path in every layer in one launch (`path_commit`):
//! a few candle copies a layer and run of the path otherwise, 0.3–0.9 decode steps of an
//! 8B-shaped or Gemma-3-4B-shaped target on an H200 (docs/gpu.md).
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, LaunchConfig};
use candle_core::{DType, Device, Storage, Tensor};

use super::launch::Launch;
use super::op::view;

/// One staged ring's part of a commit: its side buffer and ring, `[1, heads, slots, d]`
/// contiguous buffers of one dtype, and the ring slot that takes the side buffer's first row.
pub struct RingCommit<'a> {
    /// The side buffer's keys and values.
    pub side: (&'a Tensor, &'a Tensor),
    /// The ring's keys and values.
    pub ring: (&'a Tensor, &'a Tensor),
    /// Ring slot of the first kept row (the next ones follow modulo the ring's slots).
    pub first_slot: usize,
}

/// Copies the first `keep` rows of every side buffer in `commits` into its ring, all layers
/// in one kernel. `Ok(false)` (nothing done) unless every buffer is a contiguous CUDA tensor
/// of one dtype and head shape, with rows of whole 16-byte vectors and `keep` at most a
/// ring's and a side buffer's slots: the caller then copies layer by layer.
pub fn commit_rings(commits: &[RingCommit<'_>], keep: usize) -> candle_core::Result<bool> {
    let Some(first) = commits.first() else {
        return Ok(true);
    };
    let bufs = commits
        .iter()
        .flat_map(|c| [c.side.0, c.side.1, c.ring.0, c.ring.1])
        .map(|t| (t, keep));
    let Some(shape) = TableShape::of(first.side.0, bufs).filter(|_| keep > 0) else {
        return Ok(false);
    };
    let mut table = Vec::with_capacity(commits.len() * 8);
    for c in commits {
        let ring_slots = c.ring.0.dim(2)?;
        table.extend(shape.pair(c.side, c.ring)?);
        table.extend([(c.first_slot % ring_slots) as i64, ring_slots as i64]);
    }
    // SAFETY: matches `staged_commit`; every buffer is a live contiguous [1, heads, slots, d]
    // tensor of `row`-byte rows (checked by `TableShape::of`), rows `0..keep` of each side
    // buffer exist and each ring slot is taken modulo its slots.
    unsafe { shape.launch("staged_commit", table, &[], (commits.len(), keep)) }?;
    Ok(true)
}

/// One layer's part of a token tree's path commit: where its tree nodes lie and where the
/// kept path goes, `[1, heads, slots, d]` contiguous buffers of one dtype (the source and the
/// destination may be the same buffers: a KV cache, a slack ring).
pub struct PathCopy<'a> {
    /// The nodes' keys and values.
    pub src: (&'a Tensor, &'a Tensor),
    /// The slot of node 0 (node `j` in slot `(src_first + j) % slots`).
    pub src_first: usize,
    /// The kept rows' keys and values.
    pub dst: (&'a Tensor, &'a Tensor),
    /// The slot of the first kept row (row `i` in slot `(dst_first + i) % slots`).
    pub dst_first: usize,
}

/// Copies the nodes `path` (a root-to-node path: strictly increasing) of every layer in
/// `copies` to consecutive rows, all layers in one kernel (`path_commit`). `Ok(false)`
/// (nothing done) unless every buffer is a contiguous CUDA tensor of one dtype and head
/// shape with rows of whole 16-byte vectors, the path is not empty and fits each buffer's
/// slots: the caller then moves each layer's rows itself.
pub fn commit_path_rows(copies: &[PathCopy<'_>], path: &[usize]) -> candle_core::Result<bool> {
    let Some(first) = copies.first() else {
        return Ok(true);
    };
    let nodes = path.iter().max().map_or(0, |&m| m + 1);
    let bufs = copies.iter().flat_map(|c| {
        [(c.src.0, nodes), (c.src.1, nodes)]
            .into_iter()
            .chain([(c.dst.0, path.len()), (c.dst.1, path.len())])
    });
    let Some(shape) = TableShape::of(first.src.0, bufs).filter(|_| !path.is_empty()) else {
        return Ok(false);
    };
    let mut table = Vec::with_capacity(copies.len() * 10 + path.len());
    for c in copies {
        let (src_slots, dst_slots) = (c.src.0.dim(2)?, c.dst.0.dim(2)?);
        table.extend(shape.pair(c.src, c.dst)?);
        table.extend([
            (c.src_first % src_slots) as i64,
            src_slots as i64,
            (c.dst_first % dst_slots) as i64,
            dst_slots as i64,
        ]);
    }
    table.extend(path.iter().map(|&p| p as i64));
    let counts = [copies.len() as i32, path.len() as i32];
    // SAFETY: matches `path_commit`; every buffer is a live contiguous [1, heads, slots, d]
    // tensor of `row`-byte rows (checked by `TableShape::of`) and every slot is taken modulo
    // its buffer's slots; the table holds `copies.len()` entries of ten values, then the path.
    unsafe { shape.launch("path_commit", table, &counts, (copies.len(), 1)) }?;
    Ok(true)
}

/// The buffers of a one-launch commit: their device, heads and row bytes.
struct TableShape {
    dev: candle_core::cuda_backend::CudaDevice,
    heads: usize,
    row: usize,
}

impl TableShape {
    /// The shape of `like` when every buffer of `bufs` (each with the slots it must have at
    /// least) is a contiguous CUDA tensor `[1, heads, slots, d]` of `like`'s dtype, head
    /// shape and device, with rows of whole 16-byte vectors; `None` otherwise.
    fn of<'a>(like: &Tensor, mut bufs: impl Iterator<Item = (&'a Tensor, usize)>) -> Option<Self> {
        let Device::Cuda(dev) = like.device() else {
            return None;
        };
        let (_, heads, _, d) = like.dims4().ok()?;
        let row = d * like.dtype().size_in_bytes();
        let fits = |t: &Tensor, slots_min: usize| {
            t.is_contiguous()
                && t.dtype() == like.dtype()
                && t.device().same_device(like.device())
                && t.dims4()
                    .is_ok_and(|(b, h, s, e)| b == 1 && h == heads && e == d && s >= slots_min)
        };
        let usable = row.is_multiple_of(16)
            && matches!(like.dtype(), DType::BF16 | DType::F16 | DType::F32)
            && bufs.all(|(t, slots)| fits(t, slots));
        usable.then(|| Self {
            dev: dev.clone(),
            heads,
            row,
        })
    }

    /// A table entry's first six values, as both kernels read them: the source's and the
    /// destination's K and V addresses, then the source's and the destination's head strides
    /// in bytes (slots times row bytes).
    fn pair(
        &self,
        src: (&Tensor, &Tensor),
        dst: (&Tensor, &Tensor),
    ) -> candle_core::Result<[i64; 6]> {
        Ok([
            self.address(src.0)?,
            self.address(src.1)?,
            self.address(dst.0)?,
            self.address(dst.1)?,
            (src.0.dim(2)? * self.row) as i64,
            (dst.0.dim(2)? * self.row) as i64,
        ])
    }

    /// Byte address of a contiguous buffer's first element.
    fn address(&self, t: &Tensor) -> candle_core::Result<i64> {
        let stream = self.dev.cuda_stream();
        let guard = t.storage_and_layout();
        let addr = match t.dtype() {
            DType::BF16 => view::<half::bf16>(&guard, "commit")?.device_ptr(&stream).0,
            DType::F16 => view::<half::f16>(&guard, "commit")?.device_ptr(&stream).0,
            _ => view::<f32>(&guard, "commit")?.device_ptr(&stream).0,
        };
        Ok(addr as i64)
    }

    /// Launches `kernel(table, ints..., chunks)` over a grid of (layers, heads, z) blocks of
    /// up to 128 threads, `table` uploaded first.
    ///
    /// # Safety
    /// `table` and `ints` must be what `kernel` reads, and every address in the table a live
    /// buffer of this shape with the slots the kernel indexes.
    unsafe fn launch(
        &self,
        kernel: &str,
        table: Vec<i64>,
        ints: &[i32],
        (layers, z): (usize, usize),
    ) -> candle_core::Result<()> {
        let n = table.len();
        let table = Tensor::from_vec(table, n, &Device::Cuda(self.dev.clone()))?;
        let guard = table.storage_and_layout();
        if !matches!(&*guard.0, Storage::Cuda(_)) {
            candle_core::bail!("{kernel}: the table is not on the GPU");
        }
        let table_view = view::<i64>(&guard, "commit table")?;
        let chunks = self.row / 16;
        let mut l = Launch::new(&self.dev, kernel)?;
        l.ptr(&table_view);
        for &v in ints {
            l.val(v);
        }
        l.val(chunks as i32);
        let cfg = LaunchConfig {
            grid_dim: (layers as u32, self.heads as u32, z as u32),
            block_dim: (chunks.min(128) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller's contract.
        unsafe { l.run(cfg) }
    }
}
