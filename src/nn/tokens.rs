//! Greedy token choices left on the model's device, so that a drafting step can take the
//! previous step's token without a device → host round trip: a greedy draft of γ tokens
//! then reads back once, not once per token, and the device runs its γ forwards back to
//! back instead of idling while the host reads each token and queues the next step.
use candle_core::{DType, Tensor};

use crate::error::{Error, Result};

/// Token ids on a device (`[n]` u32), each below `bound`: only [`DeviceTokens::argmax`],
/// [`DeviceTokens::from_host`] (which checks them) and [`DeviceTokens::cat`] make them, so a
/// model that takes them knows their range without reading them (an id past the embedding
/// table would read outside it on the GPU).
#[derive(Clone, Debug)]
pub struct DeviceTokens {
    ids: Tensor,
    bound: usize,
}

impl DeviceTokens {
    /// The argmax of each row of `logits: [rows, vocab]` (the first index of the largest
    /// value on ties, as [`super::argmax_rows`]), left on logits' device.
    pub fn argmax(logits: &Tensor) -> Result<Self> {
        let (_, vocab) = logits.dims2()?;
        Ok(Self {
            ids: super::fused::argmax_on_device(logits)?,
            bound: vocab,
        })
    }

    /// Ids `ids: [n]` u32 known to lie below `bound` without reading them: argmaxes of
    /// logits `bound` wide (the argmax kernel inside a recorded graph), or draft ids mapped to
    /// a vocabulary of `bound` (an EAGLE-3 head's `d2t`, checked at load).
    pub(crate) fn from_argmax(ids: Tensor, bound: usize) -> Self {
        Self { ids, bound }
    }

    /// Host ids copied to `device`, each checked below `bound` (the vocabulary they index).
    pub fn from_host(ids: &[u32], bound: usize, device: &candle_core::Device) -> Result<Self> {
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= bound) {
            return Err(Error::invalid(format!(
                "token id {bad} is outside the vocabulary of {bound} ids"
            )));
        }
        Ok(Self {
            ids: Tensor::new(ids, device)?,
            bound,
        })
    }

    /// The parts' ids one after another (all on one device).
    pub fn cat(parts: &[DeviceTokens]) -> Result<Self> {
        let Some(bound) = parts.iter().map(|p| p.bound).max() else {
            return Err(Error::invalid("DeviceTokens::cat of no parts"));
        };
        let ids: Vec<&Tensor> = parts.iter().map(|p| &p.ids).collect();
        Ok(Self {
            ids: Tensor::cat(&ids, 0)?,
            bound,
        })
    }

    /// The same ids on `device` (themselves where they lie there already). Between GPUs a
    /// device-to-device copy that `device`'s stream queues after the work producing them:
    /// nothing waits on the host.
    pub fn to_device(&self, device: &candle_core::Device) -> Result<Self> {
        // Two opened devices of one GPU are two streams: a copy between them is ordered
        // after nothing (no event tracking), so it could read the ids before they are written.
        let ordinal = super::fused::cuda_ordinal;
        if let (Some(a), Some(b)) = (ordinal(self.ids.device()), ordinal(device)) {
            if a == b && !self.ids.device().same_device(device) {
                return Err(Error::invalid(format!(
                    "ids moved between two streams of GPU {a}: open each GPU once"
                )));
            }
        }
        Ok(Self {
            ids: self.ids.to_device(device)?,
            bound: self.bound,
        })
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        self.ids.elem_count()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every id is below this.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// The ids as a contiguous `[n]` u32 tensor on their device.
    pub fn ids(&self) -> &Tensor {
        &self.ids
    }

    /// The ids, read back to the host (waits for the device work that produces them).
    pub fn to_vec(&self) -> Result<Vec<u32>> {
        debug_assert_eq!(self.ids.dtype(), DType::U32);
        Ok(self.ids.to_vec1::<u32>()?)
    }
}

/// A step's input ids: from the host, or left on the device by the step before.
#[derive(Clone, Copy, Debug)]
pub enum StepIds<'a> {
    Host(&'a [u32]),
    Device(&'a DeviceTokens),
}

impl StepIds<'_> {
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        match self {
            StepIds::Host(t) => t.len(),
            StepIds::Device(d) => d.len(),
        }
    }

    /// The ids as a `[t]` u32 tensor on `device` (device ids as they are).
    pub(crate) fn tensor(&self, device: &candle_core::Device) -> Result<Tensor> {
        match self {
            StepIds::Host(t) => Ok(Tensor::new(*t, device)?),
            StepIds::Device(d) => Ok(d.ids().clone()),
        }
    }
}
