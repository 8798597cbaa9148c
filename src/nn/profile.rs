//! Opt-in timing of model stages ("where does a forward's time go"), for the `gpu_decode`
//! benchmark. When on, [`mark`] waits for the device to finish the work queued so far and
//! books the time since the previous mark to a stage; when off (the default) it is one
//! relaxed atomic load. Waiting serialises host and device, so stage times add up to more
//! than an unprofiled forward: they show where device time and per-op host cost go, not the
//! overlapped total.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::Tensor;

use crate::error::Result;

static ON: AtomicBool = AtomicBool::new(false);

/// Per stage: total time and marks.
pub type StageTimes = Vec<(&'static str, Duration, usize)>;

/// The last mark and the record. One for the process: a forward may run on another thread
/// than its caller (the CPU pool); profile one forward at a time.
static STATE: Mutex<(Option<Instant>, StageTimes)> = Mutex::new((None, Vec::new()));

fn with_state<R>(f: impl FnOnce(&mut (Option<Instant>, StageTimes)) -> R) -> R {
    // A panic while holding the lock leaves plain data behind: keep using it.
    f(&mut STATE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Turns stage timing on or off and clears the record.
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
    with_state(|s| *s = (None, Vec::new()));
}

/// Starts the clock for the next stage (after waiting for `t`'s device).
pub fn start(t: &Tensor) -> Result<()> {
    if !ON.load(Ordering::Relaxed) {
        return Ok(());
    }
    t.device().synchronize()?;
    with_state(|s| s.0 = Some(Instant::now()));
    Ok(())
}

/// Books the time since the previous mark (or [`start`]) to `stage`, once `t`'s device has
/// finished everything queued.
pub fn mark(stage: &'static str, t: &Tensor) -> Result<()> {
    if !ON.load(Ordering::Relaxed) {
        return Ok(());
    }
    t.device().synchronize()?;
    let now = Instant::now();
    with_state(|s| {
        if let Some(last) = s.0 {
            let spent = now - last;
            match s.1.iter_mut().find(|(name, _, _)| *name == stage) {
                Some(entry) => {
                    entry.1 += spent;
                    entry.2 += 1;
                }
                None => s.1.push((stage, spent, 1)),
            }
        }
        s.0 = Some(now);
    });
    Ok(())
}

/// Stage times since [`enable`], in first-seen order.
pub fn take() -> StageTimes {
    with_state(|s| std::mem::take(&mut s.1))
}
