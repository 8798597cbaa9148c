//! With the `cuda` feature, compiles specdec's own kernels (`src/nn/cuda/kernels.cu`, one
//! translation unit that includes the family files beside it: `common.cuh`, `attn_split.cu`,
//! `attn_combine.cuh`, `prefill.cu`, `gemv.cu`, `elementwise.cu`) with `nvcc` (on `PATH`, as
//! `scripts/build-cuda.sh` sets up) into one fat binary for the compute capability in
//! `CUDA_COMPUTE_CAP` (default 80): machine code (SASS) for that architecture, which also
//! runs on later GPUs of the same major version, and its PTX, which the driver compiles for
//! any newer GPU. Shipping the machine code spares the first run on a machine the driver's
//! compilation of the PTX (about a minute for these kernels on an H100, ~20 MB of PTX). The
//! architecture built for reaches the crate as `BUILT_CUDA_COMPUTE_CAP`. Other builds do
//! nothing.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=SPECDEC_KERNEL_TRACE");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let src = "src/nn/cuda/kernels.cu";
    // The unity file and every file it includes.
    for file in [
        "kernels.cu",
        "common.cuh",
        "attn_split.cu",
        "attn_combine.cuh",
        "prefill.cu",
        "gemv.cu",
        "elementwise.cu",
    ] {
        println!("cargo:rerun-if-changed=src/nn/cuda/{file}");
    }
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    if cap.is_empty() || !cap.chars().all(|c| c.is_ascii_digit()) {
        panic!("CUDA_COMPUTE_CAP = {cap:?}: expected digits such as 80 or 90");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("specdec_kernels.fatbin");
    // SPECDEC_KERNEL_TRACE=1: a diagnostics build whose kernels record when each block
    // passed its PDL wait (`nn::kernel_trace`); slower, never for measurements of speed.
    let trace = std::env::var("SPECDEC_KERNEL_TRACE").is_ok_and(|v| v == "1");
    let status = Command::new("nvcc")
        .args(trace.then_some("-DSPECDEC_KERNEL_TRACE"))
        .args([
            "--fatbin",
            "-O3",
            &format!("-gencode=arch=compute_{cap},code=[sm_{cap},compute_{cap}]"),
            src,
            "-o",
        ])
        .arg(&out)
        .status();
    // The architecture, for the loader's error on a GPU the build does not cover.
    println!("cargo:rustc-env=BUILT_CUDA_COMPUTE_CAP={cap}");
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("nvcc failed ({s}) compiling {src}"),
        Err(e) => panic!("nvcc not found on PATH ({e}); build with scripts/build-cuda.sh"),
    }
}
