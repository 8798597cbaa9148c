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
[ -d "$dist" ] || { echo "error: $dist missing: run scripts/build-cuda.sh and carry .cuda/dist" >&2; exit 1; }
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; chmod +x "$2"; }
for folder in bin tests benches; do
  mkdir -p ".cuda/run/$folder"
  for f in "$dist/$folder"/*.xz; do
    [ -e "$f" ] || continue
    unxz "$f" ".cuda/run/$folder/$(basename "$f" .xz)"
  done
done
built=$(cat "$dist/manifest-dir")
if [ "$built" != "$root" ] && [ ! -e "$built" ]; then
  mkdir -p "$(dirname "$built")"
  ln -s "$root" "$built"
fi
target=$(cat "$dist/target-dir")
mkdir -p "$target/release"
cp .cuda/run/bin/exp "$target/release/exp"
echo "unpacked: $(ls .cuda/run/bin .cuda/run/tests .cuda/run/benches | tr '\n' ' ')"
