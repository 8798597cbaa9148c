//! Token-tree speculation on a [`super::RotatingKvCache`]: the block's tree, its RoPE
//! positions and the commit of an accepted path, for both strategies.
use std::sync::Arc;

use candle_core::Tensor;

use super::{RotatingKvCache, RotatingStrategy};
use crate::cache::kv::tree_positions;
use crate::cache::tree::path_moves;
use crate::cache::tree::TokenTree;
use crate::error::Result;

impl RotatingKvCache {
    /// Declares the tree the speculation's block follows (nodes appended so far included).
    pub(crate) fn set_tree(&mut self, tree: Arc<TokenTree>) {
        if let Some(spec) = &mut self.spec {
            spec.tree = Some(tree);
        }
    }

    /// The tree the open speculation's block follows, and how many of its nodes are appended.
    pub(crate) fn open_tree(&self) -> Option<(&TokenTree, usize)> {
        let spec = self.spec.as_ref()?;
        Some((spec.tree.as_deref()?, self.offset - spec.base))
    }

    /// RoPE positions of the next `t` appended tokens when the block is a tree.
    pub(crate) fn tree_positions(&self, t: usize) -> Option<Vec<usize>> {
        let spec = self.spec.as_ref()?;
        let tree = spec.tree.as_ref()?;
        Some(tree_positions(tree, spec.base, self.offset - spec.base, t))
    }

    /// For a path commit the caller makes for several layers at once: the nodes' buffers and
    /// the slot of node 0, the path's buffers and the slot of its first row (staged: the side
    /// buffer from slot 0 into the ring at the base; slack: within the ring), when the ring
    /// exists. The caller then calls [`Self::path_copied`].
    #[cfg(feature = "cuda")]
    pub(crate) fn path_rows(&self) -> Option<([&Tensor; 4], usize, usize)> {
        let (spec, ring) = (self.spec.as_ref()?, self.ring.as_ref()?);
        let at = spec.base % self.capacity;
        match self.strategy {
            RotatingStrategy::Staged => {
                let side = self.side.as_ref()?;
                ring.fits(&side.k)
                    .then_some(([&side.k, &side.v, &ring.k, &ring.v], 0, at))
            }
            RotatingStrategy::Slack { .. } => Some(([&ring.k, &ring.v, &ring.k, &ring.v], at, at)),
        }
    }

    /// A path of `n` nodes whose rows the caller copied ([`Self::path_rows`]): the
    /// bookkeeping of [`Self::commit_path`].
    #[cfg(feature = "cuda")]
    pub(crate) fn path_copied(&mut self, n: usize) -> Result<()> {
        match self.strategy {
            RotatingStrategy::Staged => {
                self.commit_copied(n);
                Ok(())
            }
            RotatingStrategy::Slack { .. } => self.commit(n),
        }
    }

    /// Keeps the block nodes of `path` (checked root-to-node by the caller), O(path length).
    /// Staged: the path's rows of the side buffer are appended to the ring. Slack: the
    /// path's K/V move to consecutive positions from the base inside the ring (they lie in
    /// its slack, so no history the window needs is touched), then the cursor moves.
    pub(crate) fn commit_path(&mut self, path: &[usize]) -> Result<()> {
        let Some(spec) = &self.spec else {
            return Ok(());
        };
        let base = spec.base;
        match self.strategy {
            RotatingStrategy::Staged => {
                let staged = self.staged_kv()?;
                self.spec = None;
                self.offset = base;
                if let (Some((k, v)), false) = (staged, path.is_empty()) {
                    let ids: Vec<u32> = path.iter().map(|&i| i as u32).collect();
                    let ids = Tensor::new(ids.as_slice(), k.device())?;
                    // index_select needs contiguous input; the staged K/V may be views.
                    let (k, v) = (
                        k.contiguous()?.index_select(&ids, 2)?,
                        v.contiguous()?.index_select(&ids, 2)?,
                    );
                    self.ensure_ring(&k)?;
                    self.store(&k, &v, base)?;
                    self.offset = base + path.len();
                }
                Ok(())
            }
            RotatingStrategy::Slack { .. } => {
                for (dest, src, len) in path_moves(path) {
                    // Owned copies: a write from a view of the ring would alias it.
                    let moved = self.logical(base + src, base + src + len)?;
                    if let Some((k, v)) = moved {
                        let (k, v) = (k.force_contiguous()?, v.force_contiguous()?);
                        self.store(&k, &v, base + dest)?;
                    }
                }
                self.commit(path.len())
            }
        }
    }
}
