"""What a grammar constraint costs per token: llguidance's mask (gate.constraints.llguidance)
against one decode forward of the target, measured side by side in one run.

For each response format of the constrained example (examples/constrained/extraction.jsonl,
its JSON schemas) plus a regex and a choice, the target (SmolLM2-135M-Instruct, float32, CPU)
decodes greedily under the constraint; every mask it needed is timed with the consuming of
the token before it (Matcher.mask_ms), and
the same number of one-token decode forwards with a KV cache are timed in between. Printed:
median and p90 mask ms, median forward ms, and their ratio; the machine's load before and
after (a benchmark that times things says how quiet the machine was).

    OMP_NUM_THREADS=1 python benchmarks/grammar_mask.py [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from gate.constraints import bind, grammar_engine
from gate.constraints.interface import ResponseFormat
from gate.core.law import Law, law_probs
from gate.models.cache import forward, new_cache
from gate.models.loading import load_model, load_tokenizer, resolve_source

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "constrained" / "extraction.jsonl"


def formats() -> list[tuple[str, ResponseFormat, str]]:
    """(label, format, prompt) for every distinct schema of the example, a regex and a choice."""
    out: list[tuple[str, ResponseFormat, str]] = []
    seen: set[str] = set()
    if EXAMPLE.is_file():
        for line in EXAMPLE.read_text().splitlines():
            row = json.loads(line) if line.strip() else None
            fmt = (row or {}).get("response_format")
            if not fmt or fmt.get("type") != "json_schema":
                continue
            schema = fmt.get("schema") or fmt.get("json_schema", {}).get("schema")
            key = json.dumps(schema)
            if key in seen:
                continue
            seen.add(key)
            prompt = row.get("prompt") or row["messages"][-1]["content"]
            out.append((f"json_schema {len(out) + 1}", ResponseFormat.of_schema(schema), prompt))
    out.append(("regex date", ResponseFormat("regex", r"\d{4}-\d{2}-\d{2}"), "Today's date in ISO format is"))
    out.append(("choice", ResponseFormat.of_choices(["positive", "negative", "neutral"]), "Sentiment of 'great stuff':"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=48, help="max tokens decoded per format")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    load_before = os.getloadavg()
    source = resolve_source("smollm2-135m-instruct", None, Path("."), "target.model")
    tok, model = load_tokenizer(source), load_model(source, "float32", torch.device("cpu"))
    vocab = int(model.get_output_embeddings().weight.shape[0])
    t0 = time.perf_counter()
    engine = grammar_engine(tok, vocab)
    engine.check(ResponseFormat("regex", "a"))  # converts the tokenizer once
    convert_ms = (time.perf_counter() - t0) * 1e3
    print(f"llguidance tokenizer conversion: {convert_ms:.0f} ms (once per run); vocab {vocab}")
    print(f"{'format':<16} {'tokens':>6} {'compile ms':>10} {'mask p50':>9} {'mask p90':>9} {'fwd p50':>8} {'mask/fwd':>8}")
    all_masks: list[float] = []
    all_fwd: list[float] = []
    for label, fmt, text in formats():
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        t0 = time.perf_counter()
        law = bind(Law("greedy", 0.0), len(ids), fmt, engine)
        compile_ms = (time.perf_counter() - t0) * 1e3
        cache = new_cache(model.config)
        fwd_ms: list[float] = []
        with torch.inference_mode():
            logits = forward(model, torch.tensor([ids]), cache, 1)[0, -1]
            out = list(ids)
            for _ in range(args.tokens):
                x = int(law_probs(logits, law, out).argmax())
                out.append(x)
                if x == tok.eos_token_id:
                    break
                t1 = time.perf_counter()
                logits = forward(model, torch.tensor([[x]]), cache, 1)[0, -1]
                fwd_ms.append((time.perf_counter() - t1) * 1e3)
        masks = law.grammar.mask_ms
        all_masks += masks
        all_fwd += fwd_ms
        p90 = statistics.quantiles(masks, n=10)[-1] if len(masks) >= 2 else masks[0]
        ratio = statistics.median(masks) / statistics.median(fwd_ms) if fwd_ms else float("nan")
        print(f"{label:<16} {len(out) - len(ids):>6} {compile_ms:>10.1f} {statistics.median(masks):>9.3f} {p90:>9.3f} "
              f"{statistics.median(fwd_ms) if fwd_ms else float('nan'):>8.2f} {ratio:>8.3f}")
        print(f"{'':<16} output: {tok.decode(out[len(ids):], skip_special_tokens=True)[:100]!r}")
    print(f"all: {len(all_masks)} masks, median {statistics.median(all_masks):.3f} ms; forward median "
          f"{statistics.median(all_fwd):.2f} ms; mask/forward {statistics.median(all_masks) / statistics.median(all_fwd):.3f}")
    print(f"load average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
