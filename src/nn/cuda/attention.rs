//! Split attention of decode and verification steps over a KV cache read in place (RoPE's
//! own kernel: `rope_store.rs`; prefill blocks: `prefill.rs`).
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Storage, Tensor};

use super::launch::Launch;
use super::op::view;
use crate::engine::EngineOptions;

/// Warps per block of the split kernel (`W` in attn_split.cu) over caches shorter than the
/// option `attn_wide_min_len` (default 0: never).
const WARPS: u32 = 4;
/// Warps per block over caches of at least `attn_wide_min_len` keys: one 32-key tile per warp
/// and split instead of two after each other, and twice the K/V loads in flight.
const WIDE_WARPS: u32 = 8;

/// Keys per split of [`SplitAttention`]: two 32-key tiles per warp of four, one per warp of
/// eight. A query that sees at most
/// this many keys has one split and writes its output directly, without the partial row,
/// count and combine (a chain of dependent global loads that dominates at short contexts);
/// an 8k cache still spreads over 32 splits per head. The boundaries depend on the cache's
/// capacity only, never on the row count, so verification rows stay bitwise decode rows.
pub const SPLIT_LEN: usize = 256;
/// Most splits (`MAX_SPLITS` in attn_combine.cuh); longer caches take longer splits.
const MAX_SPLITS: usize = 512;

/// Keys per split of a cache of `capacity` keys: [`SPLIT_LEN`], longer where that would
/// make more than [`MAX_SPLITS`] splits.
fn split_len(capacity: usize) -> usize {
    SPLIT_LEN * capacity.div_ceil(SPLIT_LEN * MAX_SPLITS).max(1)
}

/// The keys a step that leaves `len` keys in a cache of `capacity` reaches, rounded up to
/// whole splits (at most `capacity`): the reach of a replayed graph's split attention
/// ([`SplitAttention::len`]). Steps of one reach share a recording; a step past it needs
/// another (the reach is part of a recording's key).
pub fn split_reach(capacity: usize, len: usize) -> usize {
    let s = split_len(capacity);
    (len.max(1).div_ceil(s) * s).min(capacity)
}
/// Most blocks per query head: past `SPLIT_BLOCKS` splits a block takes several, one after
/// another. A replayed graph's splits span the cache's capacity (a 128k-token cache: 512),
/// and one block per split would launch blocks that nearly all have no key to read.
const SPLIT_BLOCKS: usize = 64;
/// Query heads of one kv head's group per block of the split kernel over caches of at least
/// [`GROUPED_MIN_LEN`] keys (`HB` in attn_split.cu): they share each K/V row the block loads.
/// Shorter caches take one block per query head, the shortest chain of dependent loads,
/// except for blocks of several rows (`attn_grouped_rows_min_len`). Each head's arithmetic
/// is the same either way.
const GROUPED_HEADS: usize = 4;
/// Keys from which the split kernel groups query heads: below it, grouped heads decoded
/// slower (docs/kernel-notes.md, "Split attention: grouped heads").
const GROUPED_MIN_LEN: usize = 4096;

/// Most query rows times heads of one split attention (`ATTN_COUNTERS` in attn_split.cu: the
/// kernel's per-(row, head) count of finished splits).
const ATTN_COUNTERS: usize = 8192;

/// Attention of the `t` newest positions over a KV cache in one kernel (per-split partial
/// softmax, up to four query heads of a kv head's group per block over long caches; the last
/// split of each query head combines), reading K/V once in place: no copy of the cache, no mask
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
    /// (a replayed graph), with the cache's capacity (the splits' boundaries follow it) and
    /// the reach ([`split_reach`]): every step the launch serves leaves at most that many
    /// keys, so blocks are launched for the splits below it only, and the kernel (head
    /// grouping, cluster combine) is chosen for those keys.
    pub len: Option<(Tensor, usize, usize)>,
    /// RoPE and the K/V store fused in (with `len` only): `q` is then the projection's output
    /// before RoPE, and the kernel writes the step's keys (rotated) and values into the cache
    /// buffers `k`, `v` at slots `len - t ..= len - 1` (a ring's: modulo its slots) before it
    /// reads them.
    pub rope: Option<AttnRope>,
    /// `k`, `v` are a ring (a sliding-window cache read in place, wrapped or not): slot `s`
    /// of their `capacity` holds the newest position `≡ s (mod capacity)`; `len` then counts
    /// positions, not slots.
    pub ring: Option<RingKeys>,
}

/// Where [`SplitAttention`]'s queries sit over a ring of `capacity` slots (`k`'s length): the
/// query of row `i` of `t` is position `end - t + i` and sees the positions in
/// `(end - t + i - window, end - t + i]` from `lo` on. The window must leave a slot between
/// the oldest position a row sees and the newest written (`window + t - 1 ≤ capacity`).
pub struct RingKeys {
    /// One past the newest position, when [`SplitAttention::len`] does not give it.
    pub end: usize,
    /// The oldest position held intact.
    pub lo: usize,
    /// A staged ring inside a speculation (with [`SplitAttention::len`] and the fused RoPE):
    /// its newest positions live in a side buffer, where the step writes its K/V.
    pub tail: Option<RingTail>,
}

/// The side buffer of [`RingKeys::tail`]: positions `len - n .. len` in its slots `0..n`,
/// the ring holding those below.
pub struct RingTail {
    /// `[1, kv_heads, slots, d]`, slots ≥ `n`.
    pub k: Tensor,
    /// Values, shaped like `k`.
    pub v: Tensor,
    /// Positions it holds after the step (at least the step's rows).
    pub n: usize,
}

/// What [`SplitAttention`] needs to do [`super::RopeStore`]'s work itself: one kernel a layer
/// fewer in a decode or verification step.
pub struct AttnRope {
    /// `[P, d / 2]` cosines (P covers every position of the cache).
    pub cos: Tensor,
    /// `[P, d / 2]` sines.
    pub sin: Tensor,
    /// The step's keys before RoPE, `[t, kv_heads, d]` (rows may be strided, heads `d`
    /// apart).
    pub k: Tensor,
    /// The step's values, `[t, kv_heads, d]` likewise.
    pub v: Tensor,
    /// As [`super::RopeStore::prefetch`], from the attention kernel's prologue.
    pub prefetch: Option<Tensor>,
    /// The per-head q/k RMSNorms to apply before RoPE (Qwen3, Gemma 3): `q` and the step's
    /// keys are then the projection's output before the norms.
    pub qk_norm: Option<QkNorm>,
    /// The step's rows are the newest nodes of a token tree appended inside a speculation:
    /// a `[1 + 2t]` u32 device tensor (a replayed graph's input), the words of
    /// `TokenTree::step_words` — the tree's nodes up to the step, each row's depth, each
    /// row's ancestors (bit `n`: the tree's node `n`, itself included).
    pub tree: Option<Tensor>,
}

/// The per-head RMSNorms of queries and keys that [`AttnRope`] applies.
pub struct QkNorm {
    /// `[d]` weight of the q norm.
    pub q: Tensor,
    /// `[d]` weight of the k norm.
    pub k: Tensor,
    /// Epsilon of the q norm.
    pub q_eps: f32,
    /// Epsilon of the k norm.
    pub k_eps: f32,
}

/// Most splits a cluster combines (`CL_MAX` in attn_combine.cuh: the portable cluster size).
const CLUSTER_SPLITS: usize = 8;

/// Query heads a block of the split kernel groups, under the engine options `o`, for `rows`
/// query rows of `group` heads a kv head over `reach` keys with `warps` warps a block.
///
/// * over [`GROUPED_MIN_LEN`] keys, [`GROUPED_HEADS`];
/// * a block of several rows (a verification block) groups heads from a reach of
///   `o.attn_grouped_rows_min_len` keys and `o.attn_grouped_min_rows` rows (0: never by
///   rows): it then reads each K/V row once per block instead of once per head. Every head
///   sums as it would alone, so a verification row stays bitwise the decode step of its
///   position. Eight-warp kernels group `o.attn_rows_heads` heads (2 or 4: two-head
///   kernels exist for eight warps only, attn_split.cu `_h2_w8`), four-warp kernels four;
/// * else one head a block.
fn heads_per_block(
    o: &EngineOptions,
    group: usize,
    rows: usize,
    reach: usize,
    warps: u32,
) -> usize {
    let min_rows = match o.attn_grouped_min_rows {
        0 => usize::MAX,
        r => r,
    };
    let by_rows = reach >= o.attn_grouped_rows_min_len && rows >= min_rows;
    if group > 1 && reach >= GROUPED_MIN_LEN {
        GROUPED_HEADS
    } else if group > 1 && by_rows && warps == WIDE_WARPS {
        o.attn_rows_heads
    } else if group > 1 && by_rows {
        GROUPED_HEADS
    } else {
        1
    }
}

/// Whether the fused eight-warp split kernel over 2 to [`CLUSTER_SPLITS`] splits runs each
/// row's splits as one thread block cluster that combines them in distributed shared memory
/// (the `_cl` kernels): compute capability 9.0 or newer and the option `attn_cluster`. The
/// global combine it replaces is a fence, a counter and three dependent L2 round trips after
/// the last split; the cluster's is two cluster barriers and one round trip inside the GPC.
fn clusters(o: &EngineOptions, dev: &CudaDevice) -> bool {
    o.attn_cluster && super::launch::compute_major(dev) >= 9
}

/// Whether graph steps fuse RoPE and the K/V store into the split attention (the option
/// `fused_rope`; off, [`super::RopeStore`]'s own kernel runs before it).
pub fn fused_rope() -> bool {
    crate::engine::get().fused_rope
}

/// `[t, heads, d]` with heads `d` apart and contiguous elements: `(t, heads, d, row stride)`.
pub(super) fn head_rows(
    l: &Layout,
    op: &str,
    what: &str,
) -> candle_core::Result<(usize, usize, usize, usize)> {
    let (d, s) = (l.dims(), l.stride());
    if d.len() != 3 || s[2] != 1 || s[1] != d[2] {
        candle_core::bail!(
            "{op}: {what} must be [t, heads, d] with heads d apart, got {d:?} {s:?}"
        );
    }
    Ok((d[0], d[1], d[2], s[0]))
}

/// The gate and up halves of a weight to prefetch from, and the bytes of each.
pub(super) type PrefetchRanges<'a, T> = (CudaView<'a, T>, CudaView<'a, T>, usize);

/// The two halves' first `bytes / 2` bytes each of a gate/up weight `[2 * inter, hidden]` to
/// prefetch into the L2 ([`prefetch_bytes`]), as views of `T` and the byte count: whole 16-byte vectors
/// from 16-byte aligned starts (the bulk prefetch faults otherwise), or `None`.
pub(super) fn prefetch_ranges<'a, T: candle_core::cuda_backend::CudaDType>(
    guard: &'a Option<(candle_core::StorageRef<'a>, &'a Layout)>,
    bytes: usize,
) -> candle_core::Result<Option<PrefetchRanges<'a, T>>> {
    let Some(g) = guard else { return Ok(None) };
    if !g.1.is_contiguous() || g.1.dims().len() != 2 {
        return Ok(None);
    }
    let w = view::<T>(g, "prefetched weight")?;
    let elem = std::mem::size_of::<T>();
    let half_rows = g.1.dims()[0] / 2;
    let half = half_rows * g.1.dims()[1];
    let n = (bytes / 2).min(half * elem) & !15;
    let aligned =
        (half * elem).is_multiple_of(16) && (g.1.start_offset() * elem).is_multiple_of(16);
    Ok((aligned && n > 0).then(|| (w.slice(..half), w.slice(half..), n)))
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
pub(super) struct QkvShape {
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) t: usize,
    pub(super) len: usize,
    pub(super) d: usize,
    /// Strides of q's heads and rows, of the cache's heads.
    pub(super) q_head: usize,
    pub(super) q_row: usize,
    pub(super) kv_head: usize,
}

pub(super) fn qkv_shape(
    op: &str,
    ql: &Layout,
    kl: &Layout,
    vl: &Layout,
) -> candle_core::Result<QkvShape> {
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
        // A ring's positions (the kernel's `len`) run past its slots.
        let (len_arg, ring) = match &self.ring {
            Some(r) => {
                let window = self.window.unwrap_or(usize::MAX);
                // A tail holds the step's rows: the ring needs only the window before it.
                let rows = if r.tail.is_some() { 0 } else { t };
                if window.saturating_add(rows).saturating_sub(1) > len
                    || (self.len.is_none() && r.end < t)
                    || r.tail
                        .as_ref()
                        .is_some_and(|tl| self.len.is_none() || tl.n < t)
                {
                    candle_core::bail!(
                        "split attention: {t} rows of window {window} over a ring of {len} slots ending at {}",
                        r.end
                    );
                }
                (r.end, (len as i32, r.lo as i32))
            }
            None => (len, (0, 0)),
        };
        // The engine options, read once for the launch.
        let o = crate::engine::get();
        // The capacity (split boundaries, buffers) and the keys any step of this launch
        // reaches (blocks, kernel choice).
        let (max_len, reach) = self
            .len
            .as_ref()
            .map_or((len, len), |(_, m, r)| (*m, (*r).clamp(1, *m)));
        // Whole SPLIT_LEN-key splits, at most MAX_SPLITS of them (attn_split.cu's combine
        // stages one weight per split in shared memory).
        let split_len = split_len(max_len);
        let splits = max_len.div_ceil(split_len);
        // The splits holding a key some step of this launch sees.
        let live = reach.div_ceil(split_len).min(splits);
        if t * heads > ATTN_COUNTERS {
            candle_core::bail!(
                "split attention: {t} rows of {heads} heads exceed the kernel's {ATTN_COUNTERS} split counters"
            );
        }
        let fused = if self.rope.is_some() { "_rope" } else { "" };
        // A token tree's step takes the eight-warp `_tree` kernels (no cluster, no early values).
        let tree = self.rope.as_ref().is_some_and(|r| r.tree.is_some());
        // Eight warps a block from `attn_wide_min_len` keys (0: always).
        let (warps, wide) = if reach >= o.attn_wide_min_len || tree {
            (WIDE_WARPS, "_w8")
        } else {
            (WARPS, "")
        };
        // The row's splits as one cluster (no partial sums in global memory).
        let cluster = !fused.is_empty()
            && !tree
            && self.ring.is_none()
            && warps == WIDE_WARPS
            && (2..=CLUSTER_SPLITS).contains(&live)
            && clusters(&o, dev);
        // A ring's partial rows: one more, a staged tail's.
        let prows = splits + usize::from(self.ring.is_some());
        // SAFETY: each live split block writes its partial row before the combine reads it;
        // splits without a visible key are never read.
        let part = if cluster {
            None
        } else {
            Some(unsafe { super::op::out_alloc::<f32>(dev, t * heads * prows * (d + 2))? })
        };
        // SAFETY: the last split block of each (row, head) writes its d outputs.
        let out = unsafe { super::op::out_alloc::<T>(dev, t * heads * d)? };

        let hb = heads_per_block(&o, group, t, reach, warps);
        let tail = self.ring.as_ref().and_then(|r| r.tail.as_ref());
        let grid = (
            (t * group.div_ceil(hb)) as u32,
            kv_heads as u32,
            (live + usize::from(tail.is_some())).min(SPLIT_BLOCKS) as u32,
        );
        // The fused eight-warp kernel over d <= 64 loads each tile's first value rows with its
        // keys (`_hv`, the option `attn_early_values`) where the grid is one wave of blocks
        // (its extra registers would cost blocks an SM otherwise; at d = 128 and over grids of
        // several waves it was slower). The same arithmetic either way.
        let blocks = (grid.0 * grid.1 * grid.2) as usize;
        let hv = if !fused.is_empty()
            && !tree
            && warps == WIDE_WARPS
            && d <= 64
            && o.attn_early_values
            && blocks <= super::launch::multiprocessors(dev)
        {
            "_hv"
        } else {
            ""
        };
        let mut l = Launch::new(
            dev,
            &format!(
                "attn_split_{name}_d{d}_h{hb}{wide}{}{fused}{hv}{}{}",
                if self.ring.is_some() { "_ring" } else { "" },
                if cluster { "_cl" } else { "" },
                if tree { "_tree" } else { "" }
            ),
        )?;
        if cluster {
            // grid.2 = live (≤ CLUSTER_SPLITS < SPLIT_BLOCKS): one cluster a (row, head
            // block), its block z taking split z; no step of the launch sees a split past
            // them (the reach's contract).
            l.cluster_z(grid.2);
        }
        let q = q.slice(ql.start_offset()..);
        let k = k.slice(kl.start_offset()..);
        let v = v.slice(vl.start_offset()..);
        let len_storage = self.len.as_ref().map(|(t, _, _)| t.storage_and_layout());
        let len_slice = match &len_storage {
            Some((storage, layout)) => match &**storage {
                Storage::Cuda(s) => Some(s.as_cuda_slice::<u32>()?.slice(layout.start_offset()..)),
                _ => candle_core::bail!("split attention: the length tensor is not on the GPU"),
            },
            None => None,
        };
        l.ptr(&q).ptr(&k).ptr(&v);
        match &part {
            Some(p) => l.ptr(p),
            None => l.null(),
        };
        l.ptr(&out);
        match &len_slice {
            Some(s) => l.ptr(s),
            None => l.null(),
        };
        l.val(len_arg as u32)
            .val(t as i32)
            .val(heads as i32)
            .val(group as i32);
        l.val(q_head as i64).val(q_row as i64).val(kv_head as i64);
        l.val(split_len as i32).val(splits as i32);
        l.val(self.window.unwrap_or(0) as i32);
        l.val(self.softcap.unwrap_or(0.0) as f32);
        l.val(ring.0).val(ring.1);
        let tail_guards = tail.map(|tl| [tl.k.storage_and_layout(), tl.v.storage_and_layout()]);
        let tail_views = match (tail, &tail_guards) {
            (Some(tl), Some(g)) => {
                let ([_, th, slots, td], ts) = dims4(g[0].1, "split attention", "tail k")?;
                if g[1].1.dims() != g[0].1.dims()
                    || g[1].1.stride() != g[0].1.stride()
                    || (th, td) != (kv_heads, d)
                    || ts[2] != d
                    || slots < tl.n
                    || self.rope.is_none()
                {
                    candle_core::bail!(
                        "split attention: a tail of {} positions in {:?} does not fit {kv_heads} kv heads of {d} (with RoPE fused)",
                        tl.n,
                        g[0].1.dims()
                    );
                }
                let (tk, tv) = (view::<T>(&g[0], "tail k")?, view::<T>(&g[1], "tail v")?);
                l.ptr(&tk).ptr(&tv).val(ts[1] as i64).val(tl.n as i32);
                Some((tk, tv))
            }
            _ => {
                l.null().null().val(0i64).val(0i32);
                None
            }
        };
        let rope_guards = self.rope.as_ref().map(|r| {
            [
                r.k.storage_and_layout(),
                r.v.storage_and_layout(),
                r.cos.storage_and_layout(),
                r.sin.storage_and_layout(),
            ]
        });
        let pf_guard = self
            .rope
            .as_ref()
            .and_then(|r| r.prefetch.as_ref())
            .map(|w| w.storage_and_layout());
        let pf = prefetch_ranges::<T>(&pf_guard, prefetch_bytes(&o))?;
        let norm_guards = self
            .rope
            .as_ref()
            .and_then(|r| r.qk_norm.as_ref())
            .map(|n| [n.q.storage_and_layout(), n.k.storage_and_layout()]);
        // The fused kernel's arguments after the plain kernel's.
        if let (Some(r), Some(g)) = (&self.rope, &rope_guards) {
            const OP: &str = "split attention with RoPE";
            let (tk, kvh, dk, k_row) = head_rows(g[0].1, OP, "k")?;
            let (tv, kvv, dv, v_row) = head_rows(g[1].1, OP, "v")?;
            let fits = self.len.is_some()
                && (tk, kvh, dk) == (t, kv_heads, d)
                && (tv, kvv, dv) == (t, kv_heads, d)
                && r.cos.dims() == r.sin.dims()
                && r.cos.dims().len() == 2
                && (self.ring.is_some() || r.cos.dim(0)? >= max_len)
                && r.cos.dim(1)? * 2 == d
                && r.cos.is_contiguous()
                && r.sin.is_contiguous();
            if !fits {
                candle_core::bail!(
                    "{OP}: k {:?}, v {:?}, tables {:?} do not fit q {:?} over {max_len} keys",
                    g[0].1.dims(),
                    g[1].1.dims(),
                    r.cos.dims(),
                    ql.dims()
                );
            }
            let (kn, vn) = (view::<T>(&g[0], "k")?, view::<T>(&g[1], "v")?);
            let (cos, sin) = (view::<T>(&g[2], "cos")?, view::<T>(&g[3], "sin")?);
            l.ptr(&kn).val(k_row as i64).ptr(&vn).val(v_row as i64);
            l.ptr(&cos).ptr(&sin);
            // The step's K/V go to a staged tail where there is one.
            match &tail_views {
                Some((tk, tv)) => l.ptr(tk).ptr(tv),
                None => l.ptr(&k).ptr(&v),
            };
            match &pf {
                Some((gate, up, n)) => l.ptr(gate).val(*n as i64).ptr(up).val(*n as i64),
                None => l.null().val(0i64).null().val(0i64),
            };
            match (&r.qk_norm, &norm_guards) {
                (Some(n), Some(g)) => {
                    let fits = |l: &Layout| l.dims() == [d] && l.is_contiguous();
                    if !fits(g[0].1) || !fits(g[1].1) {
                        candle_core::bail!(
                            "{OP}: q/k norm weights {:?}, {:?} must be contiguous [{d}]",
                            g[0].1.dims(),
                            g[1].1.dims()
                        );
                    }
                    let (qn, kn) = (view::<T>(&g[0], "q norm")?, view::<T>(&g[1], "k norm")?);
                    l.ptr(&qn).ptr(&kn).val(n.q_eps).val(n.k_eps);
                }
                _ => {
                    l.null().null().val(0f32).val(0f32);
                }
            }
        }
        let tree_guard = self
            .rope
            .as_ref()
            .and_then(|r| r.tree.as_ref())
            .map(|w| w.storage_and_layout());
        let tree_slice = match &tree_guard {
            Some((storage, layout)) => {
                if layout.dims() != [1 + 2 * t] || !layout.is_contiguous() {
                    candle_core::bail!(
                        "split attention: a tree of {:?} words for {t} rows (1 + 2t asked)",
                        layout.dims()
                    );
                }
                match &**storage {
                    Storage::Cuda(s) => {
                        Some(s.as_cuda_slice::<u32>()?.slice(layout.start_offset()..))
                    }
                    _ => candle_core::bail!("split attention: the tree is not on the GPU"),
                }
            }
            None => None,
        };
        if self.rope.is_some() {
            match &tree_slice {
                Some(s) => l.ptr(s),
                None => l.null(),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (warps * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the argument list matches `attn_split` in attn_split.cu; every index the
        // kernel forms stays inside q, k, v (shapes checked above), `part` and `out`, and
        // (row, head) < ATTN_COUNTERS; with RoPE fused, the slots written (through the same
        // pointers `k`, `v`) lie below `len` ≤ `max_len` (a ring's: modulo its slots; a
        // staged tail's: its last `n` ≤ slots), the caller's room in the cache buffers, and
        // the tables cover them (a ring's caller
        // builds them for the step's positions); the prefetched ranges lie inside the weight's
        // two halves; the q/k norm weights hold `d` elements each.
        unsafe { l.run(cfg) }?;
        // The partial sums are scratch: freed here, after the launch (stream order), except
        // while a graph records, where a free would sit between this kernel and the next.
        if let Some(part) = part {
            super::graph_edges::keep_scratch(part);
        }
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
    let aligned = l.start_offset().is_multiple_of(align)
        && l.stride().iter().all(|&s| s == 1 || s % align == 0);
    q.device().is_cuda() && matches!(d, 32 | 64 | 128 | 256) && aligned
}

/// Bytes of the gate/up weight that RoPE's prologue prefetches into the L2 under the options
/// `o`, half from the gate rows, half from the up rows: `l2_prefetch_mb` (0 turns it off;
/// the default 8 MB helps a 1B-shaped step and is neutral for an 8B-shaped one, while 16 MB
/// was too much for the 1B shape: docs/kernel-notes.md, "L2 prefetch").
pub(super) fn prefetch_bytes(o: &EngineOptions) -> usize {
    (o.l2_prefetch_mb.max(0.0) * 1e6) as usize
}
