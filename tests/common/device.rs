//! The device the test suite runs on: `SPECDEC_TEST_DEVICE` = `cpu` (default), `cuda` or
//! `metal`, optionally with an ordinal (`cuda:1`). Tests build their tensors and load their
//! models here, so the same equivalence tests prove a GPU backend.
use candle_core::Device;

/// The device named by `SPECDEC_TEST_DEVICE`, opened once per test binary (a GPU device
/// is a context with its own stream and loaded kernels: tensors of two opened devices do
/// not mix, and opening one per call would dominate every test). Panics with the reason
/// when it is not available (a pass that silently fell back to the CPU would prove nothing).
pub fn device() -> Device {
    static DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    DEVICE.get_or_init(open).clone()
}

fn open() -> Device {
    let spec = std::env::var("SPECDEC_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    let (kind, ordinal) = match spec.split_once(':') {
        Some((k, n)) => (
            k.to_string(),
            n.parse::<usize>()
                .unwrap_or_else(|_| panic!("SPECDEC_TEST_DEVICE={spec}: bad ordinal")),
        ),
        None => (spec.clone(), 0),
    };
    match kind.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => specdec::nn::open_cuda(ordinal)
            .unwrap_or_else(|e| panic!("SPECDEC_TEST_DEVICE={spec}: no CUDA device: {e}")),
        "metal" => Device::new_metal(ordinal)
            .unwrap_or_else(|e| panic!("SPECDEC_TEST_DEVICE={spec}: no Metal device: {e}")),
        _ => panic!("SPECDEC_TEST_DEVICE={spec}: expected cpu, cuda or metal"),
    }
}

/// The compute dtype named by `SPECDEC_TEST_DTYPE`: `f32` by default (what the tests'
/// exact tolerances are for; `auto` would take the shipped checkpoints' bf16 on a GPU), or
/// `auto` (the checkpoint's own, widened to f32 on the CPU), `bf16`, `f16`.
pub fn dtype_choice() -> specdec::models::DTypeChoice {
    use specdec::models::DTypeChoice;
    match std::env::var("SPECDEC_TEST_DTYPE").as_deref() {
        Err(_) | Ok("f32") => DTypeChoice::F32,
        Ok("auto") => DTypeChoice::Auto,
        Ok("bf16") => DTypeChoice::BF16,
        Ok("f16") => DTypeChoice::F16,
        Ok(other) => panic!("SPECDEC_TEST_DTYPE={other}: expected auto, f32, bf16 or f16"),
    }
}

/// Load options for the test device and dtype.
pub fn load_options() -> specdec::models::LoadOptions {
    specdec::models::LoadOptions {
        device: device(),
        dtype: dtype_choice(),
        quantized: false,
        ..Default::default()
    }
}

/// Property-test cases: `default`, or `SPECDEC_TEST_CASES` when set. A GPU pass runs each
/// case's many tiny tensor operations as separate kernel launches and uses fewer cases.
pub fn cases(default: u32) -> u32 {
    match std::env::var("SPECDEC_TEST_CASES") {
        Ok(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("SPECDEC_TEST_CASES={n}: expected a count")),
        Err(_) => default,
    }
}
