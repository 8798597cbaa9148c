//! Hidden states a model's forwards hand out (for drafters that read the target's hidden
//! states, EAGLE-3): per position, chosen layers' residual streams, kept transactionally with
//! the caches.
use candle_core::Tensor;

use super::ModelCache;
use crate::error::Result;

/// Which layers' hidden states a [`ModelCache`]'s forwards record, and the rows recorded
/// and not yet taken.
///
/// Layer id `k` is the residual stream INPUT to decoder layer `k` (the output of layer
/// `k − 1`; `k = 0` the embeddings, `k = layers` the last layer's output before the final
/// norm), as vLLM and the EAGLE-3 reference capture them. A forward's rows are the chosen
/// layers' states concatenated in the order given (`[t, ids.len() × hidden]`).
///
/// Rows of a forward inside a [`Speculation`] are tentative: `commit(n)` keeps the first
/// `n`, `commit_path` the path's, a rollback none; outside a speculation they are committed
/// at once. Committed rows wait until [`ModelCache::take_hidden`] hands them out.
#[derive(Debug, Clone)]
pub(crate) struct HiddenTap {
    layers: Vec<usize>,
    /// Position of the first committed row not yet taken.
    start: usize,
    committed: Vec<Tensor>,
    /// The open speculation's rows, in block order.
    tentative: Vec<Tensor>,
}

impl HiddenTap {
    fn clear_at(&mut self, start: usize) {
        self.start = start;
        self.committed.clear();
        self.tentative.clear();
    }

    /// Keeps the tentative rows `rows` (block indices, in order) as committed.
    fn keep(&mut self, rows: &[usize]) -> Result<()> {
        let tentative = std::mem::take(&mut self.tentative);
        if rows.is_empty() || tentative.is_empty() {
            return Ok(());
        }
        let all = Tensor::cat(&tentative, 0)?;
        let consecutive = rows.iter().enumerate().all(|(i, &r)| r == i);
        let kept = if consecutive {
            all.narrow(0, 0, rows.len())?
        } else {
            let ids: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
            let ids = Tensor::new(ids.as_slice(), all.device())?;
            all.index_select(&ids, 0)?
        };
        self.committed.push(kept);
        Ok(())
    }
}

impl ModelCache {
    /// Makes this cache's forwards record the hidden states of `layers` (see [`HiddenTap`]
    /// for the ids), or none (`None`). Setting the layers it already records keeps the
    /// rows waiting; anything else starts afresh at the current offset.
    pub fn tap_hidden(&mut self, layers: Option<&[usize]>) {
        match (layers, &self.hidden) {
            (Some(l), Some(tap)) if tap.layers == l => {}
            (Some(l), _) => {
                self.hidden = Some(HiddenTap {
                    layers: l.to_vec(),
                    start: self.offset(),
                    committed: Vec::new(),
                    tentative: Vec::new(),
                })
            }
            (None, _) => self.hidden = None,
        }
    }

    /// The layers whose hidden states forwards record, if any.
    pub fn hidden_layers(&self) -> Option<&[usize]> {
        self.hidden.as_ref().map(|t| t.layers.as_slice())
    }

    /// Records a forward's hidden-state rows (`[t, ids × hidden]`, positions
    /// `[offset − t, offset)` after the forward appended them): tentative inside a
    /// speculation, else committed. Called by the model after every layer appended.
    pub fn record_hidden(&mut self, rows: Tensor) {
        let open = self.spec_base.is_some();
        if let Some(tap) = self.hidden.as_mut() {
            if open {
                tap.tentative.push(rows);
            } else {
                tap.committed.push(rows);
            }
        }
    }

    /// The committed rows not taken yet, as `(position of the first, [n, ids × hidden])`;
    /// `None` when there are none (or nothing is recorded).
    pub fn take_hidden(&mut self) -> Result<Option<(usize, Tensor)>> {
        let Some(tap) = self.hidden.as_mut() else {
            return Ok(None);
        };
        if tap.committed.is_empty() {
            return Ok(None);
        }
        let rows = Tensor::cat(&std::mem::take(&mut tap.committed), 0)?;
        let start = tap.start;
        tap.start += rows.dim(0)?;
        Ok(Some((start, rows)))
    }

    /// After the cache moved to `offset` by other means than forwards (a restore, a
    /// reset): the rows waiting no longer describe it.
    pub(super) fn hidden_moved(&mut self, offset: usize) {
        if let Some(tap) = self.hidden.as_mut() {
            tap.clear_at(offset);
        }
    }

    /// The open speculation ended: keep the tentative rows of `rows` (`None`: none).
    pub(super) fn hidden_settled(&mut self, rows: Option<&[usize]>) -> Result<()> {
        match (self.hidden.as_mut(), rows) {
            (Some(tap), Some(rows)) => tap.keep(rows),
            (Some(tap), None) => {
                tap.tentative.clear();
                Ok(())
            }
            (None, _) => Ok(()),
        }
    }
}
