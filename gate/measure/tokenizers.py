"""Comparing two tokenizers: what a cross-tokenizer draft has to translate, and what the
verifier would get wrong if ids were compared directly.

The record names the vocabulary sizes, the first id whose token differs (with both
strings), the BOS/EOS/PAD/UNK ids, whether each tokenizer adds a BOS (or other special
tokens) when encoding plain text, and how many tokens the two share by decoded string
(llama.cpp's speculative draft checks compare the same things before it accepts a draft
model: vocabulary type and size, the first differing token, BOS/EOS and add-BOS; see
common/speculative.cpp, common_speculative_are_compatible).

Works on any transformers tokenizer (`len(tok)`, `get_vocab()`, `batch_decode`,
`__call__`); pure apart from calling them.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

from gate.records import TokenizerComparison

SPECIAL_ATTRS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def token_texts(tokenizer: Any) -> list[str]:
    """The decoded text of every id 0..len(tokenizer)-1 on its own (special tokens as their
    text): [V] strings. SentencePiece's '▁' and byte-level BPE's 'Ġ' both decode to a space,
    so equal texts mean the same characters whatever the tokenizer's internal spelling."""
    return list(
        tokenizer.batch_decode(
            [[i] for i in range(len(tokenizer))], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
    )


def added_prefix(tokenizer: Any) -> list[int]:
    """The ids the tokenizer puts before plain text when it adds special tokens (e.g. [BOS]);
    [] for a tokenizer that adds none (SmolLM2's GGUF tokenizer)."""
    probe = "gate"
    with_special = list(tokenizer(probe)["input_ids"])
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    for i in range(len(with_special)):
        if with_special[i : i + len(plain)] == plain:
            return with_special[:i]
    return []


Prefer = Callable[[str, list[int]], int]  # (text, ids decoding to it, ascending) -> the id to use


def lowest(text: str, ids: list[int]) -> int:
    """The default choice among ids with the same text: the lowest."""
    return ids[0]


def canonical(tokenizer: Any) -> Prefer:
    """A choice among ids with the same text: the one `tokenizer` itself produces when it
    encodes the text alone, else the lowest. SentencePiece vocabularies with byte fallback
    (Gemma) hold '<0x30>' beside '0': both decode to '0', and the model predicts the piece."""

    def prefer(text: str, ids: list[int]) -> int:
        enc = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return enc[0] if len(enc) == 1 and enc[0] in ids else ids[0]

    return prefer


def _ids_by_text(texts: list[str], exclude: AbstractSet[int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        if text and i not in exclude:
            out.setdefault(text, []).append(i)
    return out


def shared_token_map(
    target_texts: list[str],
    draft_texts: list[str],
    exclude_target: AbstractSet[int] = frozenset(),
    exclude_draft: AbstractSet[int] = frozenset(),
    prefer_target: Prefer = lowest,
    prefer_draft: Prefer = lowest,
) -> tuple[list[int], list[int]]:
    """Pairs (draft id, target id) of tokens with the same non-empty decoded text, as two
    equally long lists, one pair per shared text. Where several ids of one tokenizer decode
    to the same text, `prefer_target`/`prefer_draft` choose (default: the lowest id; see
    canonical()). Ids in the exclude sets (special tokens) are left out. O(V_draft + V_target)
    plus one call of a prefer function per duplicated text."""
    target_of = _ids_by_text(target_texts, exclude_target)
    draft_of = _ids_by_text(draft_texts, exclude_draft)
    draft_ids: list[int] = []
    target_ids: list[int] = []
    for text, d_ids in draft_of.items():
        t_ids = target_of.get(text)
        if t_ids is None:
            continue
        draft_ids.append(d_ids[0] if len(d_ids) == 1 else prefer_draft(text, d_ids))
        target_ids.append(t_ids[0] if len(t_ids) == 1 else prefer_target(text, t_ids))
    return draft_ids, target_ids


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (BOS, EOS, PAD, UNK, added control tokens)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids |= {i for a in SPECIAL_ATTRS if (i := getattr(tokenizer, a, None)) is not None}
    return ids


def compare_tokenizers(
    draft_name: str,
    target: Any,
    draft: Any,
    target_texts: list[str] | None = None,
    draft_texts: list[str] | None = None,
) -> TokenizerComparison:
    """The comparison of the target's tokenizer with draft `draft_name`'s (see the module
    docstring). `target_texts`/`draft_texts`: token_texts() already computed (else computed
    here: one batch decode per tokenizer, ~2 s for a 262,144-token vocabulary on one core)."""
    tv, dv = target.get_vocab(), draft.get_vocab()
    t_tokens, d_tokens = {i: t for t, i in tv.items()}, {i: t for t, i in dv.items()}
    differing = [i for i in set(t_tokens) | set(d_tokens) if t_tokens.get(i) != d_tokens.get(i)]
    first = min(differing) if differing else None
    target_texts = token_texts(target) if target_texts is None else target_texts
    draft_texts = token_texts(draft) if draft_texts is None else draft_texts
    shared, _ = shared_token_map(target_texts, draft_texts, special_ids(target), special_ids(draft))
    specials = {a: (getattr(target, a, None), getattr(draft, a, None)) for a in SPECIAL_ATTRS}
    t_prefix, d_prefix = added_prefix(target), added_prefix(draft)
    return TokenizerComparison(
        draft=draft_name,
        target_class=type(target).__name__,
        draft_class=type(draft).__name__,
        target_vocab_size=len(target),
        draft_vocab_size=len(draft),
        identical=not differing and all(t == d for t, d in specials.values()),
        first_differing_id=first,
        first_differing_target=t_tokens.get(first) if first is not None else None,
        first_differing_draft=d_tokens.get(first) if first is not None else None,
        target_bos_token_id=specials["bos_token_id"][0],
        draft_bos_token_id=specials["bos_token_id"][1],
        target_eos_token_id=specials["eos_token_id"][0],
        draft_eos_token_id=specials["eos_token_id"][1],
        target_pad_token_id=specials["pad_token_id"][0],
        draft_pad_token_id=specials["pad_token_id"][1],
        target_unk_token_id=specials["unk_token_id"][0],
        draft_unk_token_id=specials["unk_token_id"][1],
        target_adds_prefix=t_prefix,
        draft_adds_prefix=d_prefix,
        shared_tokens=len(shared),
    )


def describe(c: TokenizerComparison) -> list[str]:
    """Human-readable lines of a comparison (console, markdown, html reports)."""
    if c.identical:
        return [f"draft {c.draft}: same tokenizer as the target ({c.target_vocab_size} tokens)"]
    out = [
        f"draft {c.draft}: target {c.target_class} {c.target_vocab_size} tokens, draft {c.draft_class} "
        f"{c.draft_vocab_size} tokens; {c.shared_tokens} tokens shared by decoded text"
    ]
    if c.first_differing_id is not None:
        out.append(
            f"  first differing id {c.first_differing_id}: target {_shown(c.first_differing_target)}, "
            f"draft {_shown(c.first_differing_draft)}"
        )
    out.append(
        f"  BOS {c.target_bos_token_id}/{c.draft_bos_token_id}, EOS {c.target_eos_token_id}/{c.draft_eos_token_id}, "
        f"PAD {c.target_pad_token_id}/{c.draft_pad_token_id} (target/draft)"
    )
    out.append(
        f"  adds before text: target {c.target_adds_prefix or 'nothing'}, draft {c.draft_adds_prefix or 'nothing'}"
        + ("" if c.target_adds_prefix == c.draft_adds_prefix else " (add-BOS differs)")
    )
    return out


def _shown(token: str | None) -> str:
    return "no token" if token is None else repr(token)


def mapping_lines(m: Any) -> list[str]:
    """The report's cross-tokenizer section (console, markdown, html): every tokenizer
    comparison (describe) and, per draft and law whose requests recorded translation work,
    the mapping cost measured apart: mean and p99 mapping time per step with a draft call
    (ms), the mean share of a request's E2E latency spent translating, and the proposals lost
    in translation (1 - target tokens verified / tokens drafted in the draft's vocabulary,
    pooled). `m`: gate.records.Measurements. [] when there is nothing to show."""
    import numpy as np

    out = [line for c in getattr(m, "tokenizers", []) for line in describe(c)]
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in m.requests:
        if r.step_mapping_ms and any(r.step_mapping_ms):
            groups.setdefault((r.draft, r.law), []).append(r)
    for (draft, law), reqs in groups.items():
        steps = [
            ms
            for r in reqs
            for ms, n in zip(r.step_mapping_ms, r.step_draft_tokens or r.step_mapping_ms, strict=False)
            if n
        ]
        shares = [r.mapping_ms / r.e2el_ms for r in reqs if r.e2el_ms > 0]
        drafted = sum(r.draft_tokens or 0 for r in reqs)
        verified = sum(sum(r.step_proposed or []) for r in reqs)
        loss = (
            f"{100 * (1 - verified / drafted):.1f}% ({drafted} drafted, {verified} target tokens verified)"
            if drafted
            else "-"
        )
        out.append(
            f"draft {draft}, law {law}: mapping {np.mean(steps):.2f} ms per step (p99 {np.percentile(steps, 99):.2f} "
            "ms, "
            f"{len(steps)} steps), {100 * float(np.mean(shares)):.1f}% of E2E latency (mean of {len(shares)} "
            "requests); "
            f"lost in translation {loss}"
        )
    return out
