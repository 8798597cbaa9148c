//! CPU thread-count pinning.
use std::sync::Once;

/// Makes candle's CPU thread count a constant. candle 0.11.1 recomputes it on every CPU matmul,
/// and unless `RAYON_NUM_THREADS` is set that means `num_cpus::get_physical()`, which parses
/// `/proc/cpuinfo` on Linux: for a small model it took ~80% of a decode step. This computes
/// candle's own choice once and stores it in `RAYON_NUM_THREADS` (left alone when already set),
/// so the thread count is unchanged and the per-matmul cost disappears. Call it before other
/// threads start; [`crate::models::Model::load`] calls it for CPU models.
pub fn pin_cpu_thread_count() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            let threads = candle_core::utils::get_num_threads();
            std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        }
    });
}

/// Runs `f` on a thread of rayon's global pool (directly when already on one).
///
/// candle's CPU kernels (softmax, norms, unary maps, gemm) hand parallel work to that pool.
/// Called from a thread outside it, every such op is a cross-thread handoff: the caller
/// sleeps until a pool thread has run the op, two context switches per op. A decode forward
/// has dozens of them; on the draft model they took about half of a forward (profiled: kernel
/// scheduler time ~45% of samples). From a pool thread the op's first part runs in place. Run
/// whole decode loops through this; [`super::Decoder::forward`] also does, per forward,
/// for callers that do not.
pub fn on_cpu_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pin_cpu_thread_count();
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}
