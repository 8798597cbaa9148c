#!/usr/bin/env bash
# On the GPU machine: unpack what scripts/build-cuda.sh packed into .cuda/dist/.
#   exp, tests and benches -> .cuda/run/{bin,tests,benches}/, exp also to <target>/release/exp
# The test binaries look for the repository at the path it had where they were built (their
# CARGO_MANIFEST_DIR) and for `exp` in that build's target folder; when that path does not
# exist here, it is made a symbolic link to this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dist=.cuda/dist
run=.cuda/run
[ -f "$dist/specdec-cuda.tar.xz" ] || { echo "error: $dist/specdec-cuda.tar.xz missing: run scripts/build-cuda.sh and carry .cuda/dist" >&2; exit 1; }
rm -rf "$run"; mkdir -p "$run"
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
  "$dist/specdec-cuda.tar.xz" "$run"
built=$(cat "$run/manifest-dir")
if [ "$built" != "$root" ] && [ ! -e "$built" ]; then
  mkdir -p "$(dirname "$built")"
  ln -s "$root" "$built"
fi
target=$(cat "$run/target-dir")
mkdir -p "$target/release"
cp "$run/bin/exp" "$target/release/exp"
echo "unpacked (commit $(cat "$run/commit")): $(ls "$run"/bin "$run"/tests "$run"/benches | tr '\n' ' ')"
