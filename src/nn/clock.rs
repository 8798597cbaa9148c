//! Points in a device's queue of work, timed when the device reaches them, so that a step
//! whose stages the host queues back to back (greedy drafts verified where they lie, one
//! device → host round trip a step) can still book each stage's time.
use std::time::Instant;

use candle_core::Device;

use crate::error::Result;

/// A point in `device`'s queue, after everything queued on it so far.
///
/// * CUDA: an event recorded on the device's stream; its time is the moment the GPU got
///   there, known once a later wait covers it.
/// * CPU: the host clock at the mark (the CPU backend has finished everything queued).
/// * Metal (and anything else): the host clock after waiting for the device, so the
///   stages still split exactly, at the cost of that wait.
pub struct QueueMark(Mark);

enum Mark {
    Host(Instant),
    #[cfg(feature = "cuda")]
    Cuda(candle_core::cuda_backend::cudarc::driver::CudaEvent),
}

impl QueueMark {
    /// Marks `device`'s queue as it is now.
    pub fn record(device: &Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Self(Mark::Host(Instant::now()))),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => {
                use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
                let event = dev
                    .cuda_stream()
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| candle_core::Error::Msg(format!("recording a CUDA event: {e}")))?;
                Ok(Self(Mark::Cuda(event)))
            }
            other => {
                other.synchronize()?;
                Ok(Self(Mark::Host(Instant::now())))
            }
        }
    }

    /// Seconds from this mark to `later` (a mark of the same device, recorded after it). On
    /// CUDA this waits until the device has passed `later`.
    pub fn seconds_to(&self, later: &QueueMark) -> Result<f64> {
        match (&self.0, &later.0) {
            (Mark::Host(a), Mark::Host(b)) => Ok(b.saturating_duration_since(*a).as_secs_f64()),
            #[cfg(feature = "cuda")]
            (Mark::Cuda(a), Mark::Cuda(b)) => a
                .elapsed_ms(b)
                .map(|ms| f64::from(ms.max(0.0)) / 1e3)
                .map_err(|e| candle_core::Error::Msg(format!("timing CUDA events: {e}")).into()),
            #[cfg(feature = "cuda")]
            _ => Err(crate::error::Error::invalid(
                "QueueMark::seconds_to: marks of different devices",
            )),
        }
    }
}
