//! With the `cuda` feature, compiles specdec's own kernels (`src/nn/cuda/kernels.cu`) to PTX
//! with `nvcc` (on `PATH`, as `scripts/build-cuda.sh` sets up), for the compute capability in
//! `CUDA_COMPUTE_CAP` (default 80; the driver JIT-compiles PTX for newer GPUs). Other builds
//! do nothing.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let src = "src/nn/cuda/kernels.cu";
    println!("cargo:rerun-if-changed={src}");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("specdec_kernels.ptx");
    let status = Command::new("nvcc")
        .args(["--ptx", "-O3", &format!("-arch=compute_{cap}"), src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("nvcc failed ({s}) compiling {src}"),
        Err(e) => panic!("nvcc not found on PATH ({e}); build with scripts/build-cuda.sh"),
    }
}
