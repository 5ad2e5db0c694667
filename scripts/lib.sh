# Shared by scripts/demo, scripts/test, scripts/artifacts: install what is missing, configure, build.
# Sourced, not run.
set -euo pipefail
KVQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KVQ_BUILD=${KVQ_BUILD:-$KVQ_ROOT/build}
KVQ_SHARED=${KVQ_SHARED:-$(cd "$KVQ_ROOT/.." && pwd)/shared}

# Debian packages kvq builds and runs with. libopenblas0-pthread keeps LibTorch off reference BLAS
# (16x slower); bible-kjv is the default calibration corpus (the demo model was trained on it).
# clang + libclang-rt-dev build the fuzz targets (scripts/fuzz): libFuzzer and the clang sanitizer
# runtimes are only a Recommends of clang, which --no-install-recommends leaves out.
KVQ_PACKAGES=(cmake ninja-build ccache g++ pkg-config libtorch-dev libopenblas0-pthread
  libeigen3-dev libhdf5-dev libcli11-dev libspdlog-dev nlohmann-json3-dev libsentencepiece-dev
  libgtest-dev libgmock-dev libbenchmark-dev python3-jsonschema python3-numpy bible-kjv libcairo2-dev
  clang libclang-rt-dev
  libopenmpi-dev openmpi-bin
  libpcre2-dev libutf8proc-dev)

kvq_log() { printf '\033[1m[kvq]\033[0m %s\n' "$*" >&2; }

kvq_install() {
  local missing=()
  for p in "${KVQ_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  kvq_log "installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

kvq_build() {
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kvq-ccache}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
  # Clones at different paths share the cache: paths are hashed relative to the source root.
  export CCACHE_BASEDIR=$KVQ_ROOT CCACHE_NOHASHDIR=1
  if [ ! -f "$KVQ_BUILD/build.ninja" ]; then
    kvq_log "configuring in $KVQ_BUILD"
    cmake -S "$KVQ_ROOT" -B "$KVQ_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DKVQ_SHARED_DIR="$KVQ_SHARED" "$@" >/dev/null
  fi
  kvq_log "building ${KVQ_TARGETS:-everything} ($(nproc) cores; ccache in $CCACHE_DIR)"
  local targets=()
  for t in ${KVQ_TARGETS:-}; do targets+=(--target "$t"); done
  cmake --build "$KVQ_BUILD" -j "$(nproc)" "${targets[@]}"
}

# The default corpus: the King James Bible from Debian's bible-kjv, as plain text.
kvq_default_corpus() {
  local out="$KVQ_BUILD/corpus/kjv.txt"
  if [ ! -s "$out" ]; then
    mkdir -p "$(dirname "$out")"
    bible -p /usr/lib gen1:1-rev22:21 >"$out.tmp" && mv "$out.tmp" "$out"
  fi
  echo "$out"
}
