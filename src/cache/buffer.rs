//! A pair of preallocated K/V buffers `[batch, kv_heads, capacity, head_dim]` written in place.
use candle_core::Tensor;

use super::error::CacheError;
use crate::error::Result;

/// K and V buffers of equal shape; the sequence axis is dim 2.
#[derive(Debug)]
pub(crate) struct KvBuf {
    pub k: Tensor,
    pub v: Tensor,
    /// Unique per allocation: work recorded against these buffers' addresses (a captured
    /// CUDA graph) is valid while the id is unchanged.
    pub id: u64,
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Checks that `k` and `v` are rank-4 tensors of one shape and returns their sequence length.
pub(crate) fn seq_len(k: &Tensor, v: &Tensor) -> Result<usize> {
    if k.rank() != 4 || k.dims() != v.dims() {
        return Err(CacheError::BadInput(format!(
            "k {:?} and v {:?} must both be [batch, kv_heads, seq, head_dim]",
            k.dims(),
            v.dims()
        ))
        .into());
    }
    Ok(k.dim(2)?)
}

impl KvBuf {
    /// Zeroed buffers shaped like `like` with `capacity` slots.
    pub fn zeros_like(like: &Tensor, capacity: usize) -> Result<Self> {
        let (b, h, _, d) = like.dims4()?;
        let k = Tensor::zeros((b, h, capacity, d), like.dtype(), like.device())?;
        let v = k.zeros_like()?;
        Ok(Self {
            k,
            v,
            id: next_id(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.k.dims()[2]
    }

    /// True when `k` can be written into these buffers (same batch, heads, head_dim, dtype).
    pub fn fits(&self, k: &Tensor) -> bool {
        let (a, b) = (self.k.dims(), k.dims());
        a[0] == b[0] && a[1] == b[1] && a[3] == b[3] && self.k.dtype() == k.dtype()
    }

    /// Writes `k`/`v` (`[b, h, n, d]`) at slots `[slot, slot + n)`; the caller keeps it in range.
    pub fn write(&self, slot: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.k.slice_set(&k.contiguous()?, 2, slot)?;
        self.v.slice_set(&v.contiguous()?, 2, slot)?;
        Ok(())
    }

    /// Views of slots `[slot, slot + len)` (sharing storage with the buffers).
    pub fn view(&self, slot: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.k.narrow(2, slot, len)?, self.v.narrow(2, slot, len)?))
    }

    /// Owned copies of slots `[slot, slot + len)`.
    pub fn copy(&self, slot: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let (k, v) = self.view(slot, len)?;
        Ok((k.force_contiguous()?, v.force_contiguous()?))
    }

    /// A copy of these buffers grown to `capacity` slots, keeping the first `keep` slots.
    pub fn grown(&self, capacity: usize, keep: usize) -> Result<Self> {
        let new = Self::zeros_like(&self.k, capacity)?;
        if keep > 0 {
            let (k, v) = self.view(0, keep)?;
            new.write(0, &k, &v)?;
        }
        Ok(new)
    }

    /// An independent copy (no shared storage).
    pub fn deep_clone(&self) -> Result<Self> {
        Ok(Self {
            k: self.k.force_contiguous()?,
            v: self.v.force_contiguous()?,
            id: next_id(),
        })
    }
}

/// Concatenates along the sequence axis, skipping `None` parts; `None` when all are empty.
pub(crate) fn cat_seq(parts: &[Option<&(Tensor, Tensor)>]) -> Result<Option<(Tensor, Tensor)>> {
    let present: Vec<&(Tensor, Tensor)> = parts.iter().flatten().copied().collect();
    match present.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((one.0.clone(), one.1.clone()))),
        many => {
            let ks: Vec<&Tensor> = many.iter().map(|p| &p.0).collect();
            let vs: Vec<&Tensor> = many.iter().map(|p| &p.1).collect();
            Ok(Some((Tensor::cat(&ks, 2)?, Tensor::cat(&vs, 2)?)))
        }
    }
}
