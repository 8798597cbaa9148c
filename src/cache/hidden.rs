//! Hidden states a model's forwards hand out (for drafters that read the target's hidden
//! states, EAGLE-3): per position, chosen layers' residual streams, kept transactionally with
//! the caches.
use candle_core::Tensor;

use crate::error::Result;

/// Which layers' hidden states a [`super::ModelCache`]'s forwards record, and the rows recorded
/// and not yet taken.
///
/// Layer id `k` is the residual stream INPUT to decoder layer `k` (the output of layer
/// `k − 1`; `k = 0` the embeddings, `k = layers` the last layer's output before the final
/// norm), as vLLM and the EAGLE-3 reference capture them. A forward's rows are the chosen
/// layers' states concatenated in the order given (`[t, ids.len() × hidden]`).
///
/// Rows of a forward inside a [`super::Speculation`] are tentative: `commit(n)` keeps the first
/// `n`, `commit_path` the path's, a rollback none; outside a speculation they are committed
/// at once. Committed rows wait until [`super::ModelCache::take_hidden`] hands them out.
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
    /// Records the layers `layers` from position `start` on.
    pub(crate) fn new(layers: &[usize], start: usize) -> Self {
        Self {
            layers: layers.to_vec(),
            start,
            committed: Vec::new(),
            tentative: Vec::new(),
        }
    }

    /// The layers recorded.
    pub(crate) fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// Records a forward's rows: tentative (inside a speculation) or committed.
    pub(crate) fn record(&mut self, rows: Tensor, tentative: bool) {
        if tentative {
            self.tentative.push(rows);
        } else {
            self.committed.push(rows);
        }
    }

    /// The committed rows not taken yet, as `(position of the first, rows)`.
    pub(crate) fn take(&mut self) -> Result<Option<(usize, Tensor)>> {
        if self.committed.is_empty() {
            return Ok(None);
        }
        let rows = Tensor::cat(&std::mem::take(&mut self.committed), 0)?;
        let start = self.start;
        self.start += rows.dim(0)?;
        Ok(Some((start, rows)))
    }

    /// Forgets every row; the next committed one is at `start`.
    pub(crate) fn clear_at(&mut self, start: usize) {
        self.start = start;
        self.committed.clear();
        self.tentative.clear();
    }

    /// Keeps the tentative rows `rows` (block indices, in order) as committed; `None`:
    /// none (a rollback).
    pub(crate) fn settle(&mut self, rows: Option<&[usize]>) -> Result<()> {
        match rows {
            Some(rows) => self.keep(rows),
            None => {
                self.tentative.clear();
                Ok(())
            }
        }
    }

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
