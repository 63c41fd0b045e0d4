"""Write a perturbed copy of the packaged SmolLM2-135M-Instruct: a stand-in for an updated target
(a jointly fine-tuned backbone, merged adapters) that updated-perturbed.yaml gates against the
packaged release.

Every weight matrix W (2 or more dimensions; norms and biases are kept) gets seeded Gaussian
noise of standard deviation `sigma` x std(W), so the size of the change is relative to each
matrix's own scale. The copy is a Hugging Face folder (config, float32 safetensors, tokenizer),
about 540 MB. Run from the repository root:

    .venv/bin/python examples/target-release/perturb.py --sigma 0.01 --seed 0 --out out/target-release/perturbed
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from gate.models.loading import load_model, load_tokenizer, resolve_source


def perturb(model: torch.nn.Module, sigma: float, seed: int) -> int:
    """Add N(0, (sigma * std(W))^2) noise to every parameter W with 2+ dimensions, in place,
    from a generator seeded with `seed` (parameters in named_parameters order; a tied matrix
    once). Returns the number of parameters changed."""
    g = torch.Generator().manual_seed(seed)
    changed = 0
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * (sigma * p.float().std()))
                changed += p.numel()
    return changed


def plain_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights in a model without the GGUF quantization marker (transformers refuses to
    save a model loaded from a GGUF file): built from its config, float32, weights copied."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    return plain.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigma", type=float, default=0.01, help="noise std relative to each matrix's std (default 0.01)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/target-release/perturbed"))
    args = ap.parse_args()
    source = resolve_source("smollm2-135m-instruct", None, Path.cwd(), "model")
    model = plain_copy(load_model(source, "float32", torch.device("cpu")))
    n = perturb(model, args.sigma, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    load_tokenizer(source).save_pretrained(args.out)
    print(f"wrote {args.out}: {n:,} parameters perturbed (sigma {args.sigma:g} x each matrix's std, seed {args.seed})")


if __name__ == "__main__":
    main()
