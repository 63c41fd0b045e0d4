"""The declared sampling law, applied to logits exactly as the verifier applies it.

The same function processes the target's logits (p) and the draft's logits (q): overlap
and exactness are only meaningful under the law the verifier actually applies to both
(PRIMER, "Formulas"). A law is temperature, top-k, top-p and min-p, the repetition,
presence and frequency penalties, a logit bias, and (per request) a grammar mask.

Order. Engines differ, so the law names its convention:

- "vllm" (the default; vllm/v1/sample/sampler.py, Sampler.forward, and
  vllm/model_executor/layers/utils.py, apply_penalties): logit bias, grammar mask,
  penalties, then greedy argmax, or temperature, min-p, top-k, top-p.
- "transformers" (transformers/generation/utils.py, _get_logits_processor; 5.x):
  logit bias (SequenceBiasLogitsProcessor), repetition penalty, grammar mask (a user
  logits processor comes after the built-in ones), then greedy argmax, or temperature,
  top-k, top-p, min-p. transformers has no presence or frequency penalty; a law naming
  them under this convention raises ValueError.

Definitions (both conventions, as both engines define them):

- repetition penalty r over every token of the prompt and the output so far: a logit
  x > 0 becomes x / r, else x * r (Keskar et al. 2019, CTRL, Sec. 4.1, as implemented);
- presence penalty a and frequency penalty f over the output tokens only (OpenAI's
  definition, vLLM's): x - f * count - a * (count > 0);
- min-p m: keep the tokens whose probability is at least m times the largest
  probability (Nguyen et al. 2024, "Min P Sampling"), computed after temperature;
- top-k keeps ties at the k-th value; top-p keeps the smallest set of most likely tokens
  whose probability reaches top_p (at least one token).

History. Penalties and grammars depend on the committed prefix at each position, the
accepted proposals of the current block included (as vLLM's rejection sampler appends
the draft tokens to the output before applying penalties to the target's logits), so
teacher-forced rows are each processed with their own history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:  # gate.constraints imports nothing from here; only the type is needed
    from gate.constraints.interface import Matcher

Convention = Literal["vllm", "transformers"]
CONVENTIONS: tuple[str, ...] = ("vllm", "transformers")


@dataclass(frozen=True)
class Law:
    """A target sampling law. temperature 0 means greedy (argmax, ties to the lowest id,
    after the logit bias, the grammar mask and the penalties).

    `min_p` [0, 1], `repetition_penalty` (> 0), `presence_penalty` and `frequency_penalty`
    (OpenAI's [-2, 2]): None (or min-p 0, repetition 1, presence and frequency 0) means off.
    `logit_bias`: (token id, bias) pairs added to the raw logits. `convention`: whose order
    and definitions apply (module docstring)."""

    name: str
    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    convention: Convention = "vllm"

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise ValueError(f"unknown law convention {self.convention!r} (known: {', '.join(CONVENTIONS)})")
        if self.convention == "transformers" and (self.presence_penalty or self.frequency_penalty):
            raise ValueError("convention 'transformers' has no presence or frequency penalty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_history(self) -> bool:
        """True when a position's law depends on the tokens before it (a penalty is set)."""
        return bool((self.repetition_penalty not in (None, 1.0)) or self.presence_penalty or self.frequency_penalty)

    def bind(self, prompt_len: int, grammar: Matcher | None = None) -> RequestLaw:
        """This law for one request: its prompt is the first `prompt_len` ids of every id
        sequence given to law_probs, and `grammar` (None: unconstrained) masks its output."""
        return RequestLaw(self, prompt_len, grammar)


@dataclass(frozen=True)
class RequestLaw:
    """A Law bound to one request: where its output starts in the id sequences it is given
    (`prompt_len`, tokens) and the grammar matcher of its constraint (None: none).
    Reads every Law attribute through (name, greedy, temperature, ...)."""

    law: Law
    prompt_len: int
    grammar: Matcher | None = field(default=None, compare=False)

    def __getattr__(self, name: str) -> Any:  # only called for names not found on RequestLaw itself
        if name.startswith("__") or name == "law":  # copy and pickle probe before __init__ ran
            raise AttributeError(name)
        return getattr(self.law, name)


AnyLaw = Law | RequestLaw


def _unbound(law: AnyLaw) -> tuple[Law, int | None, Matcher | None]:
    if isinstance(law, RequestLaw):
        return law.law, law.prompt_len, law.grammar
    return law, None, None


def history_counts(
    ids: Sequence[int], start: int, rows: int, prompt_len: int, vocab_size: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row t (0..rows-1), the history ids[:start + t] summarised for the penalties:
    `seen` bool [rows, V] (the token occurs in the prompt or the output so far) and
    `output_counts` float32 [rows, V] (occurrences among ids[prompt_len:start + t]).
    Ids at or beyond `vocab_size` are ignored. Raises ValueError when ids is shorter than
    start + rows - 1."""
    if len(ids) < start + rows - 1:
        raise ValueError(f"{rows} rows from position {start} need {start + rows - 1} ids of history, got {len(ids)}")
    hist = torch.tensor(list(ids[: start + max(rows - 1, 0)]), dtype=torch.long, device=device)
    hist = hist.masked_fill(hist >= vocab_size, -1)

    def cumulative(tokens: torch.Tensor, first: int) -> torch.Tensor:
        """[rows, V]: counts of tokens[:first] in every row, plus tokens[first + t - 1] for t >= 1, cumulated."""
        base = tokens[:first]
        out = torch.zeros(rows, vocab_size, device=device)
        base = base[base >= 0]
        if base.numel():
            out[0] = torch.bincount(base, minlength=vocab_size).float()[:vocab_size]
        step = tokens[first : first + rows - 1]
        if step.numel():
            t = torch.arange(1, step.numel() + 1, device=device)
            keep = step >= 0
            out.index_put_((t[keep], step[keep]), torch.ones(int(keep.sum()), device=device), accumulate=True)
        return out.cumsum(dim=0)

    seen = cumulative(hist, start) > 0
    out_start = min(max(prompt_len, 0), start)
    output = hist[out_start:] if out_start else hist
    counts = cumulative(output, start - out_start)
    return seen, counts


def grammar_mask(
    grammar: Matcher,
    ids: Sequence[int],
    start: int,
    rows: int,
    prompt_len: int,
    vocab_size: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """bool [rows, V]: the tokens `grammar` allows at positions start..start+rows-1 of `ids`,
    given the output ids[prompt_len:position] before each. A row whose output prefix the
    grammar already forbids is all True: such a position follows a rejected proposal and
    verification never reaches it (its law is the unconstrained one)."""
    mask = torch.ones(rows, vocab_size, dtype=torch.bool, device=device)
    for t in range(rows):
        allowed = grammar.allowed(list(ids[prompt_len : start + t]))
        if allowed is None:
            break  # every later prefix extends this forbidden one
        width = min(vocab_size, int(allowed.shape[0]))
        mask[t, :width] = allowed[:width].to(device)
        mask[t, width:] = False
    return mask


def adjust(
    logits: torch.Tensor,
    law: Law,
    seen: torch.Tensor | None = None,
    output_counts: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits greedy decoding takes the argmax of: float32 [..., V], the logit bias, the
    penalties and the grammar mask (-inf where forbidden) applied to `logits` [..., V] in the
    law's order; arguments as for process. Raises ValueError when a penalty is set and its
    history is not given."""
    x = logits.float()
    vllm = law.convention == "vllm"
    if law.logit_bias:
        ids = torch.tensor([i for i, _ in law.logit_bias], dtype=torch.long, device=x.device)
        keep = (ids >= 0) & (ids < x.shape[-1])  # ids beyond the logits are no token (validate refuses them)
        bias = torch.zeros(x.shape[-1], device=x.device)
        bias[ids[keep]] = torch.tensor([b for _, b in law.logit_bias], device=x.device)[keep]
        x = x + bias
    if law.repetition_penalty not in (None, 1.0):
        if seen is None:
            raise ValueError(f"law {law.name!r} has a repetition penalty: its history (seen tokens) is needed")
        r = float(law.repetition_penalty)
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if vllm and (law.frequency_penalty or law.presence_penalty):
        if output_counts is None:
            raise ValueError(f"law {law.name!r} has a presence or frequency penalty: its output counts are needed")
        x = (
            x
            - float(law.frequency_penalty or 0.0) * output_counts
            - float(law.presence_penalty or 0.0) * (output_counts > 0)
        )
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    return x


def process(
    logits: torch.Tensor,
    law: Law,
    seen: torch.Tensor | None = None,
    output_counts: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Probabilities under `law` for logits [..., V]: float32 [..., V], computed in float32
    whatever the logits' dtype, as samplers do (the wider dtype counted in the bill).

    The batched core of law_probs: the caller summarises each row's history, `seen` bool
    [..., V] (in the prompt or output: the repetition penalty) and `output_counts` [..., V]
    (in the output: presence and frequency), and gives the grammar's `allowed` bool [..., V]
    (None: unconstrained). Greedy gives a one-hot vector at the argmax. A row the grammar
    leaves empty gives all zeros. Raises ValueError when a penalty is set and its history
    is not given."""
    x = adjust(logits, law, seen, output_counts, allowed)
    vllm = law.convention == "vllm"
    empty = torch.isneginf(x.amax(dim=-1, keepdim=True))  # every logit -inf (a NaN is no -inf)
    if law.greedy:
        return torch.zeros_like(x).scatter_(-1, argmax(x).unsqueeze(-1), (~empty).to(x.dtype))
    x = x / law.temperature
    if vllm:
        x = _min_p(x, law.min_p)
    if law.top_k is not None and law.top_k < x.shape[-1]:
        kth = torch.topk(x, law.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if law.top_p is not None and law.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cumulative = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1.0 - law.top_p)
        drop_sorted[..., -1] = False  # keep at least the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    if not vllm:
        x = _min_p(x, law.min_p)
    # rows the law leaves empty are zeros: a multiply, as masked_fill with a [..., 1] mask is ~10x slower on CPU
    return x.softmax(dim=-1).nan_to_num_(0.0).mul_(~empty)


_BLOCK = 256  # argmax: width of the blocks the last axis is cut into


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1), the same ids: x [..., V] -> long [...], the first index of the
    largest value (a NaN counts as the largest, as torch.argmax counts it; an all -inf row
    gives 0). torch's CPU argmax is a scalar scan (about 2.5 ms on float32 [32, 49152] on one
    thread, slower than a softmax); this takes the vectorised maximum of each block of
    _BLOCK ids, the first block holding the largest, and the argmax inside that block only
    (about 0.2 ms)."""
    v = x.shape[-1]
    n = v // _BLOCK
    if n < 2:
        return x.argmax(dim=-1)
    head = x[..., : n * _BLOCK].unflatten(-1, (n, _BLOCK))  # type: ignore[no-untyped-call]  # torch's stub lacks it  # [..., n, _BLOCK], a view
    tail = x[..., n * _BLOCK :]  # [..., v mod _BLOCK]
    maxima = head.amax(dim=-1)
    if tail.shape[-1]:
        maxima = torch.cat([maxima, tail.amax(dim=-1, keepdim=True)], dim=-1)
    block = maxima.argmax(dim=-1, keepdim=True)  # [..., 1]; n: the tail
    rows = head.gather(-2, block.clamp(max=n - 1).unsqueeze(-1).expand(*block.shape, _BLOCK)).squeeze(-2)
    block = block.squeeze(-1)
    out: torch.Tensor = block * _BLOCK + rows.argmax(dim=-1)
    if tail.shape[-1]:
        out = torch.where(block < n, out, n * _BLOCK + tail.argmax(dim=-1))
    return out


def _min_p(x: torch.Tensor, min_p: float | None) -> torch.Tensor:
    """Keep the tokens with probability >= min_p * the largest (the largest always kept)."""
    if not min_p:
        return x
    probs = x.softmax(dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    return x.masked_fill((probs < min_p * top) & (probs < top), float("-inf"))


def law_logits(
    logits: torch.Tensor, law: AnyLaw, ids: Sequence[int] | None = None, start: int | None = None
) -> torch.Tensor:
    """The adjusted logits (adjust: bias, penalties, grammar mask) of logits [V] or [T, V],
    with the history as law_probs takes it: what a greedy check compares the committed
    token against. Raises ValueError as law_probs."""
    return _rows(logits, law, ids, start, adjust)


def law_probs(
    logits: torch.Tensor, law: AnyLaw, ids: Sequence[int] | None = None, start: int | None = None
) -> torch.Tensor:
    """Probabilities under `law` for logits [V] or [T, V] (or [..., V] for a law without
    history or grammar): float32, same shape.

    `ids`: the request's ids (prompt, then output; proposals may follow). A 1-D row is the
    law of the token after `ids` (start defaults to len(ids)); row t of a 2-D tensor is
    the law at position start + t, given ids[:start + t]. Needed when the law has a
    penalty or a grammar: then `law` must be a RequestLaw (Law.bind), which says where the
    output starts. Raises ValueError when what the law needs is not given."""
    return _rows(logits, law, ids, start, process)


def _rows(
    logits: torch.Tensor, law: AnyLaw, ids: Sequence[int] | None, start: int | None, apply: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """`apply` (process or adjust) on logits [V] or [T, V] with each row's history."""
    base, prompt_len, grammar = _unbound(law)
    if not (base.needs_history or grammar is not None):
        return apply(logits, base)
    if ids is None:
        raise ValueError(f"law {base.name!r} depends on the history: law_probs needs the request's ids")
    if prompt_len is None:
        if base.presence_penalty or base.frequency_penalty:
            raise ValueError(
                f"law {base.name!r} has output-only penalties: bind it to the request (Law.bind(prompt_len))"
            )
        prompt_len = 0
    one = logits.dim() == 1
    rows = logits.unsqueeze(0) if one else logits
    if rows.dim() != 2:
        raise ValueError(f"a law with history processes [V] or [T, V] logits, got shape {tuple(logits.shape)}")
    at = len(ids) if start is None else start
    V = int(rows.shape[-1])
    seen = counts = allowed = None
    if base.needs_history:
        seen, counts = history_counts(ids, at, rows.shape[0], prompt_len, V, rows.device)
    if grammar is not None:
        allowed = grammar_mask(grammar, ids, at, rows.shape[0], prompt_len, V, rows.device)
    out = apply(rows, base, seen, counts, allowed)
    return out[0] if one else out
