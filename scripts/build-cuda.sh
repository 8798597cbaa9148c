#!/usr/bin/env bash
# Build specdec with `--features cuda` on a Linux machine that has no GPU and no CUDA toolkit,
# and pack the binaries to travel to a machine that has both.
#
# Idempotent: every step is skipped when its output already exists.
#   1. CUDA 13.0.x compiler, headers and libraries from PyPI wheels into .cuda/wheels
#      (pinned to 13.0.x: newer wheels emit PTX that the 580 driver rejects).
#   2. A link-time stub of libcuda (candle links the driver library, which no wheel ships):
#      one empty function per `cu*` symbol cudarc declares. At run time the real driver is used.
#   3. A link folder with unversioned library names pointing at the wheels' versioned ones.
#   4. `cargo build --release --features cuda` of `exp`, the tests and the benches into
#      target-cuda/ (its own target folder, so CPU builds are not invalidated).
#   5. Stripped copies packed into one archive, .cuda/dist/specdec-cuda.tar.xz
#      (small enough to travel: the whole tree must stay under 64 MiB).
#
# Usage: scripts/build-cuda.sh [--check]   (--check: only `cargo clippy --features cuda
#        --all-targets -- -D warnings`, as CI runs it; no binaries)
# Env:   CUDA_COMPUTE_CAP (default 90: H100/H200), SPECDEC_CUDA_DIR (default .cuda),
#        SPECDEC_NCCL=1 (also the `nccl` feature: tensor parallelism over several GPUs; the
#        binaries then link libnccl.so.2, which must be on LD_LIBRARY_PATH where they run:
#        on the GPU machine, the lib folder of the nvidia-nccl-cu13 wheel, see gpu-unpack.sh),
#        CARGO_TARGET_DIR (default target-cuda), CUDA_TARGETS (cargo's target selection,
#        default "--bins --tests --benches"; e.g. "--bin exp --test gguf_models" for a small
#        archive that travels beside large carried files).
#
# On the GPU machine: `scripts/gpu-unpack.sh` then run with LD_LIBRARY_PATH=/usr/local/cuda/lib64.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cuda_dir=${SPECDEC_CUDA_DIR:-$root/.cuda}
wheels=$cuda_dir/wheels
linkdir=$cuda_dir/link
dist=$cuda_dir/dist
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target-cuda}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
mode=${1:-build}
features=cuda
[ "${SPECDEC_NCCL:-0}" = 1 ] && features=cuda,nccl
# One run at a time per CUDA folder: two would install into, and pack from, the same folders.
mkdir -p "$cuda_dir"
exec 9>"$cuda_dir/.build.lock"
flock 9

# 1. Toolkit wheels. A `--check` needs only the compiler and headers (candle's kernels are
#    compiled by its build script; nothing is linked); a build also needs the libraries. Each
#    goes to its own folder in one pip call (pip --target does not merge into an existing
#    namespace folder).
install() {  # install <dir> <wheel>...
  local dir=$1; shift
  [ -f "$dir/.complete" ] && return 0
  echo "== CUDA 13.0 wheels -> $dir"
  rm -rf "$dir"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "$@"
  touch "$dir/.complete"
}
compiler=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)
if [ "$mode" = "--check" ]; then
  wheels=$cuda_dir/wheels-compiler
  install "$wheels" "${compiler[@]}"
else
  install "$wheels" "${compiler[@]}" nvidia-cuda-nvrtc==13.0.88 nvidia-cublas==13.0.2.14 \
    nvidia-curand==10.4.0.35
fi
cu13=$wheels/nvidia/cu13
[ -x "$cu13/bin/nvcc" ] || { echo "error: $cu13/bin/nvcc missing after the wheel install" >&2; exit 1; }
export PATH=$cu13/bin:$PATH CUDA_HOME=$cu13 CUDA_ROOT=$cu13 CUDA_PATH=$cu13

if [ "$mode" = "--check" ]; then
  # clippy checks what `cargo check` does (our kernels compiled by nvcc included) and lints the
  # code behind `cfg(feature = "cuda")`, which the plain clippy run never sees.
  # With NCCL too: its code compiles only there (nothing is linked by a check).
  echo "== cargo clippy --features cuda(,nccl) --all-targets -- -D warnings (into $CARGO_TARGET_DIR)"
  cargo clippy --features cuda --all-targets -- -D warnings
  cargo clippy --features cuda,nccl --all-targets -- -D warnings
  exit 0
fi

# 2. libcuda stub from cudarc's declarations (the version in Cargo.lock).
mkdir -p "$linkdir"
if [ ! -f "$linkdir/libcuda.so" ]; then
  cargo fetch -q
  cudarc_ver=$(awk '/^name = "cudarc"/{getline; gsub(/[^0-9.]/,""); print; exit}' Cargo.lock)
  sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$cudarc_ver"/src/driver/sys/mod.rs | head -1)
  [ -f "$sys" ] || { echo "error: cudarc $cudarc_ver sources not found (cargo fetch failed?)" >&2; exit 1; }
  echo "== libcuda stub from $sys"
  grep -ohE "pub (unsafe )?fn (cu[A-Za-z0-9_]+)" "$sys" | awk '{print $NF}' | sort -u \
    | sed 's/.*/int &(void){return 0;}/' > "$linkdir/cuda_stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$linkdir/libcuda.so" "$linkdir/cuda_stub.c"
fi

# 2b. libnccl stub the same way, from cudarc's NCCL declarations (for the `nccl` feature).
if [ "$features" = cuda,nccl ] && [ ! -f "$linkdir/libnccl.so" ]; then
  cargo fetch -q
  cudarc_ver=$(awk '/^name = "cudarc"/{getline; gsub(/[^0-9.]/,""); print; exit}' Cargo.lock)
  sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$cudarc_ver"/src/nccl/sys/mod.rs | head -1)
  echo "== libnccl stub from $sys"
  grep -ohE "pub (unsafe )?fn (nccl[A-Za-z0-9_]+)" "$sys" | awk '{print $NF}' | sort -u \
    | sed 's/.*/int &(void){return 0;}/' > "$linkdir/nccl_stub.c"
  gcc -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$linkdir/libnccl.so" "$linkdir/nccl_stub.c"
fi

# 3. Unversioned names for the linker.
for lib in cublas cublasLt curand cudart nvrtc; do
  if [ ! -e "$linkdir/lib$lib.so" ]; then
    real=$(ls "$cu13"/lib/lib$lib.so.* 2>/dev/null | sort | head -1)
    [ -n "$real" ] || { echo "error: lib$lib.so.* not found in $cu13/lib" >&2; exit 1; }
    ln -sf "$real" "$linkdir/lib$lib.so"
  fi
done

export RUSTFLAGS="${RUSTFLAGS:-} -L native=$linkdir -C link-arg=-Wl,-rpath-link,$cu13/lib"

# 4. Build.
echo "== cargo build --release --features $features (exp, tests, benches) into $CARGO_TARGET_DIR"
# One cargo run: its JSON messages (stdout; progress and the compiler's diagnostics rendered
# on stderr) name the binaries to pack. A second run only for the list would rebuild, and pack, any
# source edited meanwhile (it happened: an archive carried a half-finished kernel edit).
# shellcheck disable=SC2086 # CUDA_TARGETS is a list of cargo arguments
msgs=$(cargo build --release --features "$features" ${CUDA_TARGETS:---bins --tests --benches} \
  --message-format=json-render-diagnostics)

# 5. Strip, then pack every binary into one solid xz archive: each carries the same ~33 MB of
#    candle's GPU code, which a 256 MiB dictionary stores once (one binary alone is ~7 MB
#    compressed; all of them together stay small enough to travel).
stage=$cuda_dir/stage
rm -rf "$stage"; mkdir -p "$dist" "$stage/bin" "$stage/tests" "$stage/benches"
# Each binary must have been compiled from this checkout: cargo keys its artifacts by package
# name and version, so a build of another worktree into the same target folder leaves binaries
# that cargo then calls fresh here (it packed another tree's gpu_decode once). The dep-info
# beside each binary names the manifest folder it was compiled in (where it reads
# CARGO_MANIFEST_DIR, as the tests and benches do).
echo "$msgs" | python3 -c '
import json, os, sys
root = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m["package_id"].split("#")[0].rstrip("/").endswith("/specdec") and "specdec" not in m["package_id"]:
        continue
    exe = m["executable"]
    dep = os.path.splitext(exe)[0] + ".d"
    dirs = [l.split("=", 1)[1] for l in (open(dep).read().splitlines() if os.path.exists(dep) else [])
            if l.startswith("# env-dep:CARGO_MANIFEST_DIR=")]
    if any(d != root for d in dirs):
        target = os.environ.get("CARGO_TARGET_DIR", "")
        sys.exit(f"error: {exe} was compiled from {dirs[0]}, not {root} ({dep}); "
                 f"run cargo clean -p specdec --release in {target}")
    t = m["target"]
    kind = t["kind"][0]
    if m["profile"]["test"]:
        # Test harnesses: the integration tests and the library unit tests (the harness of
        # the binary would share its name and holds no tests).
        folder = {"test": "tests", "lib": "tests", "bench": "benches"}.get(kind)
    else:
        folder = {"bin": "bin", "bench": "benches"}.get(kind)
    if folder:
        print(folder, t["name"], m["executable"])
' "$root" | while read -r folder name exe; do
  strip -o "$stage/$folder/$name" "$exe"
done
echo "$root" > "$stage/manifest-dir"
echo "$CARGO_TARGET_DIR" > "$stage/target-dir"
# The commit built, marked "+changes" when the sources differed from it (the binaries are
# then of the working tree, not of that commit).
{ git rev-parse --short HEAD 2>/dev/null || echo unknown; } | tr -d '\n' > "$stage/commit"
[ -z "$(git status --porcelain -- src tests benches build.rs Cargo.toml Cargo.lock 2>/dev/null)" ] \
  || echo -n "+changes" >> "$stage/commit"
echo >> "$stage/commit"
echo "== packing $(du -sh "$stage" | cut -f1) into $dist/specdec-cuda.tar.xz"
# Written beside the old archive and moved over it: other files in dist/ stay, and a failed
# pack leaves the previous archive whole.
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=3,dict=256MiB > "$dist/specdec-cuda.tar.xz.part"
mv -f "$dist/specdec-cuda.tar.xz.part" "$dist/specdec-cuda.tar.xz"
rm -rf "$stage"
ls -la "$dist"
echo "== done: carry $dist; on the GPU machine run scripts/gpu-unpack.sh"
