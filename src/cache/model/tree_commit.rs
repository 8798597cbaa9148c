//! Token-tree speculation over a [`super::ModelCache`]: declaring a block's tree and committing an
//! accepted root-to-node path, in every layer.
use std::sync::Arc;

use super::{reserve_layers, LayerCache, ModelCache, Speculation};
use crate::cache::error::CacheError;
use crate::cache::in_place::InPlace;
use crate::cache::tree::TokenTree;
use crate::error::Result;

impl LayerCache {
    /// RoPE positions (`base + depth`) of the next `t` appended tokens when the open
    /// speculation's block is a token tree; `None` for consecutive positions from the offset.
    pub fn tree_positions(&self, t: usize) -> Option<Vec<usize>> {
        match self {
            LayerCache::Kv(c) => c.tree_positions(t),
            LayerCache::Rotating(c) => c.tree_positions(t),
        }
    }

    /// The tree the open speculation's block follows, and how many of its nodes are appended.
    fn open_tree(&self) -> Option<(&TokenTree, usize)> {
        match self {
            LayerCache::Kv(c) => c.open_tree(),
            LayerCache::Rotating(c) => c.open_tree(),
        }
    }

    fn set_tree(&mut self, tree: Arc<TokenTree>) {
        match self {
            LayerCache::Kv(c) => c.set_tree(tree),
            LayerCache::Rotating(c) => c.set_tree(tree),
        }
    }

    /// Keeps the path; `copied`: its rows were copied already ([`copy_path_rows`]), only the
    /// bookkeeping remains.
    fn commit_path(&mut self, path: &[usize], copied: bool) -> Result<()> {
        #[cfg(feature = "cuda")]
        if copied {
            return match self {
                LayerCache::Kv(c) => {
                    c.commit(path.len());
                    Ok(())
                }
                LayerCache::Rotating(c) => c.path_copied(path.len()),
            };
        }
        let _ = copied;
        match self {
            LayerCache::Kv(c) => c.commit_path(path),
            LayerCache::Rotating(c) => c.commit_path(path),
        }
    }
}

/// On CUDA, every layer's copies of a tree's kept `path` into consecutive rows in one launch
/// (`nn::cuda::commit_path_rows`) instead of a few candle copies a layer and run; true when
/// made. Elsewhere, or with a layer the kernel does not take, false: each layer moves its own
/// rows.
fn copy_path_rows(layers: &[LayerCache], path: &[usize]) -> Result<bool> {
    #[cfg(feature = "cuda")]
    {
        let copies = layers
            .iter()
            .map(|layer| {
                let ([sk, sv, dk, dv], src_first, dst_first) = match layer {
                    LayerCache::Kv(c) => c.path_rows().map(|(k, v, at)| ([k, v, k, v], at, at))?,
                    LayerCache::Rotating(c) => c.path_rows()?,
                };
                Some(crate::nn::PathCopy {
                    src: (sk, sv),
                    src_first,
                    dst: (dk, dv),
                    dst_first,
                })
            })
            .collect::<Option<Vec<_>>>();
        if let Some(copies) = copies {
            return Ok(crate::nn::commit_path_rows(&copies, path)?);
        }
    }
    let _ = (layers, path);
    Ok(false)
}

impl ModelCache {
    /// For a forward that writes K/V itself and masks a token tree's nodes itself (a replayed
    /// CUDA graph): like [`ModelCache::reserve_in_place`] for a step of `t` nodes of the open
    /// speculation's tree, with the step's [`TokenTree::step_words`]. `None` without an open
    /// tree, past [`crate::cache::STEP_WORDS_MAX_NODES`] nodes, or where a layer cannot take
    /// the step in place.
    pub fn reserve_tree_in_place(&mut self, t: usize) -> Result<Option<(Vec<InPlace>, Vec<u32>)>> {
        if self.poisoned {
            return Err(CacheError::Poisoned.into());
        }
        let words = self.layers.first().and_then(|layer| {
            let (tree, first) = layer.open_tree()?;
            tree.step_words(first, t)
        });
        let Some(words) = words else {
            return Ok(None);
        };
        Ok(reserve_layers(&mut self.layers, t, true)?.map(|bufs| (bufs, words)))
    }
}

impl Speculation<'_> {
    /// Declares that the next appends are token-tree nodes with these parents (indices into
    /// the whole block; `None` = a root after the committed history). Tokens appended before
    /// the first call form a chain. Every appended token must be declared first: the forward
    /// then gives node `i` the RoPE position `base + depth(i)` and lets it see history and
    /// its ancestors only. Refused when `parents` is not topological or earlier declared
    /// nodes are still unappended.
    pub fn extend_tree(&mut self, parents: &[Option<usize>]) -> Result<()> {
        let appended = self.appended();
        let tree = match &self.tree {
            Some(t) if t.len() != appended => {
                return Err(CacheError::BadTree(format!(
                    "{} nodes declared but {appended} appended",
                    t.len()
                ))
                .into())
            }
            Some(t) => t.extended(parents)?,
            None => TokenTree::chain(appended).extended(parents)?,
        };
        let tree = Arc::new(tree);
        for layer in &mut self.cache.layers {
            layer.set_tree(tree.clone());
        }
        self.tree = Some(tree);
        Ok(())
    }

    /// The block's token tree (`None` while it is a plain chain).
    pub fn tree(&self) -> Option<&TokenTree> {
        self.tree.as_deref()
    }

    /// Keeps the appended nodes of `path`, a root-to-node path of block indices, as the
    /// committed tokens `base..base + path.len()`, and closes the transaction. O(path length)
    /// per layer. Without a tree the block is a chain and `path` must be `0..n`. Errors as
    /// [`Speculation::commit`].
    pub fn commit_path(mut self, path: &[usize]) -> Result<()> {
        let appended = self.appended();
        let chain;
        let tree = match &self.tree {
            Some(t) => t.as_ref(),
            None => {
                chain = TokenTree::chain(appended);
                &chain
            }
        };
        tree.check_path(path)?;
        if let Some(&last) = path.iter().max() {
            if last >= appended {
                return Err(CacheError::CommitTooLong {
                    n: last + 1,
                    appended,
                }
                .into());
            }
        }
        self.open = false;
        self.cache.spec_base = None;
        let copied = match copy_path_rows(&self.cache.layers, path) {
            Ok(copied) => copied,
            Err(e) => return self.copy_failed(e),
        };
        for i in 0..self.cache.layers.len() {
            if let Err(e) = self.cache.layers[i].commit_path(path, copied) {
                self.cache.layers[i + 1..]
                    .iter_mut()
                    .for_each(LayerCache::rollback);
                self.cache.poisoned = i > 0 || !path.is_empty();
                self.cache.hidden_settled(None)?;
                return Err(e);
            }
        }
        self.cache.hidden_settled(Some(path))
    }
}
