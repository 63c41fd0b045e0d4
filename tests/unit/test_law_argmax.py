"""gate.core.law.argmax gives torch.argmax's ids exactly (ties, infinities, NaN, widths that are
not a multiple of its block), on [V] and [T, V]; the greedy law and the overlap's top-1
agreement rest on it."""

from __future__ import annotations

import pytest
import torch

from gate.core.law import _BLOCK, argmax


def _cases(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for width in (1, 7, _BLOCK - 1, _BLOCK, _BLOCK + 1, 3 * _BLOCK, 3 * _BLOCK + 17, 49152):
        x = torch.randn(5, width, generator=g)
        out.append(x)
        tied = torch.randint(0, 3, (5, width), generator=g).float()  # many exact ties
        out.append(tied)
        spiky = x.clone()
        spiky[:, torch.randint(0, width, (3,), generator=g)] = float("inf")  # several +inf
        out.append(spiky)
        masked = x.masked_fill(torch.rand(5, width, generator=g) < 0.9, float("-inf"))
        masked[0] = float("-inf")  # an empty row (every token forbidden)
        out.append(masked)
        nan = x.clone()
        nan[1, torch.randint(0, width, (2,), generator=g)] = float("nan")
        out.append(nan)
        out.append(x[2])  # 1-D
        out.append(x.to(torch.bfloat16))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_argmax_gives_torch_argmax_ids(seed: int) -> None:
    for x in _cases(seed):
        assert torch.equal(argmax(x), x.argmax(dim=-1)), f"shape {tuple(x.shape)} dtype {x.dtype}"


def test_argmax_keeps_the_leading_shape() -> None:
    x = torch.randn(2, 3, 4 * _BLOCK + 5)
    assert argmax(x).shape == (2, 3) and torch.equal(argmax(x), x.argmax(dim=-1))
