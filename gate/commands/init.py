"""`gate init` as a function: a commented starting policy for one use case (ci, release,
quantized-audit, served), for a target, optional drafts and a runner kind.

The policy is written as text (comments are half its value), then read back through gate's
own policy loader (gate.policy.reader.load_policy: the schema and every cross-field check)
before the file is created; a policy that would not load is a bug here, raised as such.
Values the team must choose carry a `# set:` comment (thresholds, SLOs, sizes), values gate
cannot know (a draft's files, a server's URL) a `# TODO: set` one. The file is created,
never overwritten.

Metric and rule-kind names come from their declarations (gate.metrics.catalogue,
gate.rules.kinds), never written here as strings.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from gate import __version__
from gate.core.errors import EXIT_MEASUREMENT, GateError, InputError, PolicyValueError
from gate.drafts import registry as draft_kinds
from gate.metrics.catalogue import (
    ACCEPTANCE_RATE,
    GOODPUT,
    ITL_MS,
    MEAN_ACCEPTANCE_LENGTH,
    MEMORY_BILL_BYTES,
    MEMORY_HEADROOM_BYTES,
    MEMORY_LINE_BYTES,
    OVERLAP,
    POOLED,
    SPEEDUP,
    TTFT_MS,
    Metric,
)
from gate.policy.model import NAME
from gate.policy.reader import load_policy
from gate.rules.kinds.exactness import KIND as EXACTNESS
from gate.runners import registry as runner_kinds

USE_CASES: dict[str, str] = {
    "ci": "the draft-change gate in CI: speedup against the fallback, p99 ITL, the draft's overlap (a served "
    "runner: the server's acceptance), greedy exactness, the memory bill",
    "release": "pre-release approval: speedup, no category slower than the fallback, TTFT, p99 ITL, memory "
    "headroom on the device, exactness under every law; where a baseline report and gate compare go",
    "quantized-audit": "a quantized draft against the released one: overlap overall and per category (a served "
    "runner: acceptance), accepted length, the draft's weight bytes, greedy exactness",
    "served": "a served engine at the load points you plan for: speedup per load point, TTFT and ITL ceilings at "
    "the highest load, the server's acceptance, goodput, greedy exactness",
}
DEFAULT_PATH = Path("gate.yaml")
DEFAULT_TARGET = "smollm2-135m-instruct"  # the packaged model (gate.models.loading.PACKAGED)
RESERVED = ("fallback", "target")  # runner and model names a draft may not take (gate.policy.model)
# The guide of each use case (docs/guides/)
GUIDES = {"ci": "ci.md", "release": "release.md", "quantized-audit": "quantized-audit.md", "served": "served.md"}
SET = "set: "  # the marker of a value the team sets
TODO = "TODO: set "  # the marker of a value gate cannot know
_COMMENT_COLUMN = 33  # where trailing comments start, as in the shipped examples


class InitError(GateError):
    """Bad input to gate init (an unknown kind, a file that exists): exit 2, one line."""


class InitBug(GateError):
    """A policy gate init wrote that gate's own loader refuses: a bug in gate init (exit 3)."""

    exit_code = EXIT_MEASUREMENT


@dataclass(frozen=True)
class DraftChoice:
    """One --draft NAME:KIND."""

    name: str
    kind: str


@dataclass(frozen=True)
class Request:
    """What to write: a use case, a target (as policies give it), drafts (none: the use
    case's defaults) and a runner kind (None: the use case's default)."""

    use_case: str
    target: str
    drafts: tuple[DraftChoice, ...] = ()
    runner: str | None = None


@dataclass(frozen=True)
class Written:
    """A policy gate init created: where, its text, how many rules, and the lines that carry
    a `# set:` or `# TODO: set` comment (1-based line numbers)."""

    path: Path
    text: str
    rules: int
    to_set: list[int]
    todo: list[int]
    target_problem: str | None = None  # why `gate validate` will refuse target.model as written (None: it is found)


class Ask(Protocol):
    """Asks one question in a terminal: the question, its default, the choices shown (None:
    free text) and a check that turns the answer into the value or raises InitError (the
    question is then asked again)."""

    def __call__(self, text: str, default: str, choices: Sequence[str] | None, check: Callable[[str], Any]) -> Any: ...


# ---------------------------------------------------------------------------------------------
# Reading what was asked for


def _unknown(what: str, value: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, list(known), n=1)
    return f"unknown {what} {value!r}; known: {', '.join(known)}" + (f" (did you mean {close[0]!r}?)" if close else "")


def use_case(value: str) -> str:
    """The use case called `value`. Raises InitError naming the known ones (and the closest)."""
    if value not in USE_CASES:
        raise InitError(f"--for: {_unknown('use case', value, list(USE_CASES))}")
    return value


def runner_kind(value: str) -> str:
    """The registered runner kind `value`. Raises InitError naming the known ones."""
    kinds = runner_kinds.registered_kinds()
    if value not in kinds:
        raise InitError(f"--runner: {_unknown('runner kind', value, kinds)}")
    return value


def parse_draft(value: str) -> DraftChoice:
    """--draft NAME:KIND (KIND a registered draft kind). Raises InitError."""
    name, sep, kind = value.partition(":")
    name, kind = name.strip(), kind.strip()
    if not sep or not name or not kind:
        raise InitError(
            f"--draft {value!r}: expected NAME:KIND, e.g. lookup:prompt_lookup "
            f"(kinds: {', '.join(draft_kinds.names())})"
        )
    if not re.match(NAME, name):
        raise InitError(
            f"--draft {value!r}: a draft name is letters, digits, '_', '.' and '-', starting with one of the first two"
        )
    if name in RESERVED:
        raise InitError(
            f"--draft {value!r}: the draft name {name!r} is reserved (fallback: the non-speculative run; "
            "target: the target's weights)"
        )
    if kind not in draft_kinds.names():
        raise InitError(f"--draft {value!r}: {_unknown('draft kind', kind, draft_kinds.names())}")
    return DraftChoice(name, kind)


def parse_drafts(values: Sequence[str]) -> tuple[DraftChoice, ...]:
    """Every --draft, each name once. Raises InitError."""
    drafts = tuple(parse_draft(v) for v in values)
    names = [d.name for d in drafts]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InitError(f"--draft: the draft name {name!r} is given twice; each draft needs a name of its own")
    return drafts


def _capabilities(kind: str) -> Any:
    return runner_kinds.runner_class(kind).capabilities


def _served(kind: str) -> bool:
    return bool(_capabilities(kind).load_points)


def _managed(kind: str) -> bool:
    """Whether gate starts the server itself from the policy's files (llama_server, vllm):
    then a model draft is the draft's own files, never the target's weights at another dtype."""
    from gate.runners.managed import ManagedServerRunner

    return issubclass(runner_kinds.runner_class(kind), ManagedServerRunner)


def served_kinds() -> list[str]:
    """The runner kinds that serve requests at load points (what --for served needs)."""
    return [k for k in runner_kinds.registered_kinds() if _served(k)]


def default_runner(case: str) -> str:
    """The runner a use case gets without --runner: gate's in-process loop (the first
    registered kind), or for `served` llama.cpp's llama-server (gate starts it; `make
    llama-server` builds it) when registered, else the first served kind."""
    if case != "served":
        return runner_kinds.registered_kinds()[0]
    kinds = served_kinds()
    return next((k for k in kinds if _managed(k)), kinds[0])


def default_drafts(case: str, runner: str) -> tuple[DraftChoice, ...]:
    """The drafts a use case gets without --draft: prompt lookup (runs everywhere, no files)
    for ci and served; a model draft for release; the released and the quantized model draft
    for quantized-audit."""
    if case == "release":
        return (DraftChoice("candidate", "model"),)
    if case == "quantized-audit":
        return (DraftChoice("released", "model"), DraftChoice("quantized", "model"))
    return (DraftChoice("lookup", "prompt_lookup"),)


def check_request(request: Request) -> Request:
    """The request with its defaults filled in (runner, drafts), checked: a served use case
    needs a served runner, and every draft a kind the runner can run. Raises InitError."""
    use_case(request.use_case)
    if not request.target.strip():
        raise InitError(
            "--target: give the target model (a packaged name, a local directory, a .gguf file or a hub id)"
        )
    runner = runner_kind(request.runner) if request.runner is not None else default_runner(request.use_case)
    if request.use_case == "served" and not _served(runner):
        raise InitError(
            f"--for served needs a runner that serves requests at load points (--runner {' | '.join(served_kinds())}); "
            f"{runner} runs one request at a time in gate's process"
        )
    drafts = request.drafts or default_drafts(request.use_case, runner)
    for d in drafts:
        # a kind that maps itself onto a managed server says so with an attribute named after the runner kind
        # (DraftKind.llama_server, DraftKind.vllm); None: that server cannot run it
        kind = draft_kinds.get(d.kind)
        if hasattr(kind, runner) and getattr(kind, runner) is None:
            runs = [k.name for k in draft_kinds.kinds() if getattr(k, runner, None) is not None]
            raise InitError(
                f"--draft {d.name}:{d.kind}: runner {runner} cannot run a {d.kind} draft "
                f"(kinds it runs: {', '.join(runs)})"
            )
    return Request(request.use_case, request.target.strip(), tuple(drafts), runner)


# ---------------------------------------------------------------------------------------------
# Writing YAML with comments


def _scalar(value: Any, flow: bool = False) -> str:
    """A YAML scalar that reads back as `value`: plain where YAML reads it back as written
    (in a flow collection when `flow`), else JSON's double-quoted form (valid YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if text and text == text.strip() and "#" not in text and "\n" not in text and text[0] not in "<>=!":
        try:
            back = yaml.safe_load(f"[{text}]") if flow else yaml.safe_load(f"k: {text}")
        except yaml.YAMLError:
            back = None
        if back == ([text] if flow else {"k": text}):
            return text
    return json.dumps(text)


def _flow(value: Any, inner: bool = False) -> str:
    """`value` in YAML's flow style: [a, b], {k: v}, or a scalar."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v, True)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v, True) for v in value) + "]"
    return _scalar(value, inner)


class _Doc:
    """Lines of YAML with trailing comments aligned."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def comment(self, text: str, indent: int = 0) -> None:
        self.lines.extend(" " * indent + "# " + line if line else " " * indent + "#" for line in text.split("\n"))

    def blank(self) -> None:
        self.lines.append("")

    def key(self, key: str, value: Any = None, comment: str | None = None, indent: int = 0, item: bool = False) -> None:
        """`key: value  # comment` (value None: a mapping opens); `item`: the first key of a list item."""
        lead = " " * indent + ("- " if item else "")
        line = f"{lead}{key}:" + ("" if value is None else f" {_flow(value)}")
        if comment:
            line = line.ljust(max(_COMMENT_COLUMN - 1, len(line) + 1)) + " # " + comment
        self.lines.append(line)

    def item(self, value: Any, comment: str | None = None, indent: int = 2) -> None:
        line = " " * indent + "- " + _flow(value)
        if comment:
            line = line.ljust(max(_COMMENT_COLUMN - 1, len(line) + 1)) + " # " + comment
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class _Rule:
    """One rule as written: its id, description, level and fields (key, value, comment)."""

    id: str
    fields: list[tuple[str, Any, str | None]]
    description: str | None = None


def _metric_rule(
    rule_id: str,
    metric: Metric,
    aggregation: str,
    comparison: str,
    threshold: str | float,
    set_why: str,
    description: str | None = None,
    **extra: Any,
) -> _Rule:
    fields: list[tuple[str, Any, str | None]] = [("metric", metric.name, None), ("aggregation", aggregation, None)]
    if "relative_to" in extra:
        fields.append(("relative_to", extra.pop("relative_to"), None))
    if "line" in extra:
        fields.append(("line", extra.pop("line"), None))
    fields += [("comparison", comparison, None), ("threshold", threshold, SET + set_why)]
    fields += [(k, v, None) for k, v in extra.items()]
    return _Rule(rule_id, fields, description)


def _exactness_rule(rule_id: str, description: str, **extra: Any) -> _Rule:
    return _Rule(rule_id, [("kind", EXACTNESS.name, None), *[(k, v, None) for k, v in extra.items()]], description)


# ---------------------------------------------------------------------------------------------
# The policy of each use case


@dataclass(frozen=True)
class _Context:
    request: Request
    runner: str
    in_process: bool
    served: bool
    managed: bool

    @property
    def case(self) -> str:
        return self.request.use_case

    @property
    def drafts(self) -> tuple[DraftChoice, ...]:
        return self.request.drafts


# What each draft kind needs beyond its defaults, and the comments gate init writes on it.
# A kind not listed here gets its required fields from nowhere: gate init says so (exit 2).
def _draft_fields(ctx: _Context, d: DraftChoice) -> list[tuple[str, Any, str | None]]:
    fields: list[tuple[str, Any, str | None]] = []
    if d.kind == "model":
        if ctx.managed:
            fields.append(
                (
                    "model",
                    f"./{d.name}-draft",
                    TODO + "the draft model's own files (llama_server: a .gguf file; vllm: a model directory or "
                    "hub id); a server runs them as they are",
                )
            )
        else:
            fields.append(
                (
                    "model",
                    "target",
                    TODO + "the draft model (a local directory, a .gguf file or a hub id); "
                    "target: the target's own weights",
                )
            )
            quantized = ctx.case == "quantized-audit" and d == _last_model_draft(ctx)
            if quantized:
                fields.append(
                    (
                        "quantization",
                        "int8_dynamic",
                        TODO + "the quantized candidate: int8_dynamic quantizes "
                        "model's weights here; or point model at your quantized checkpoint and drop this",
                    )
                )
            else:
                fields.append(
                    (
                        "dtype",
                        "bfloat16",
                        "the released draft's dtype"
                        if ctx.case == "quantized-audit"
                        else "the draft's dtype (default: the target's)",
                    )
                )
    elif d.kind == "prompt_lookup":
        fields.append(("max_ngram_size", 3, "longest n-gram of the context it looks up"))
    elif d.kind == "early_exit":
        fields.append(("num_layers", 4, SET + "target layers the draft runs (fewer than the target has)"))
    elif d.kind == "cross_tokenizer":
        fields.append(
            (
                "model",
                "gemma3-270m",
                TODO + "the draft model, with its own tokenizer (a packaged "
                "name, a local directory, a .gguf file or a hub id)",
            )
        )
        fields.append(("mapping", "retokenize", "or shared_vocab (a full distribution over the shared tokens)"))
    elif d.kind == "heads":
        fields.append(
            (
                "checkpoint",
                f"./{d.name}",
                TODO + "the folder of the trained heads (heads.json, "
                "heads.safetensors; examples/heads/train_heads.py trains one), relative to this file",
            )
        )
    fields.extend(_required_fields(d, {key for key, _, _ in fields}))
    steps = 3 if d.kind == "heads" else 4
    fields.append(
        (
            "num_draft_tokens",
            steps,
            "proposals per verification step (K)" + ("; at most the checkpoint's heads" if d.kind == "heads" else ""),
        )
    )
    return fields


def _required_fields(d: DraftChoice, written: set[str]) -> list[tuple[str, Any, str | None]]:
    """The fields a kind requires that nothing above wrote (a kind gate init has no entry for:
    a new or a plugin kind): a required text field (a checkpoint, a model) gets a `./<draft
    name>` placeholder marked TODO with the field's own description; any other is for the
    user to write (InitError)."""
    spec = draft_kinds.get(d.kind).spec
    out: list[tuple[str, Any, str | None]] = []
    for key, info in spec.model_fields.items():
        if key == "kind" or key in written or not info.is_required():
            continue
        if info.annotation is not str:
            raise InitError(
                f"--draft {d.name}:{d.kind}: gate init cannot choose {key} for a {d.kind} draft; write this draft "
                "into the policy yourself"
            )
        why = (info.description or key).split("; ")[0].rstrip(".")
        out.append((key, f"./{d.name}", TODO + why[:1].lower() + why[1:]))
    return out


def _last_model_draft(ctx: _Context) -> DraftChoice | None:
    models = [d for d in ctx.drafts if d.kind == "model"]
    return models[-1] if models else None


def _header(doc: _Doc, ctx: _Context, path: Path) -> None:
    titles = {
        "ci": "The draft-change gate for CI: run it on every change to a draft, or to what it runs on.",
        "release": "Pre-release approval of a draft: run it on the release candidate before it ships.",
        "quantized-audit": "Auditing a quantized draft swap: the quantized draft must keep the overlap and the\n"
        "accepted length of the draft it replaces, and speculation must stay exact.",
        "served": "Drafts on a served engine at the load you plan for: gate runs the fallback and each draft\n"
        "under the same offered load and compares them load point by load point.",
    }
    shown = path.name if path.is_absolute() else path.as_posix()
    doc.comment(f"Written by `gate init --for {ctx.case}` (gate {__version__}).")
    doc.comment(titles[ctx.case])
    doc.comment(
        f"  gate validate {shown}    # the policy, the models, the prompts; nothing runs\n"
        f"  gate check {shown}       # measure, decide, write gate-junit.xml and gate-report.json\n"
        "Exit codes: 0 every error-level rule passed, 1 a rule failed, 2 invalid policy or input,\n"
        "3 a measurement could not be made or a verdict not decided.\n"
        'Every value marked "# set:" is a starting point for the team to set (from your SLOs and a run\n'
        'of the draft you ship today); a "TODO" comment marks what gate cannot know (your files, your servers).'
    )
    if ctx.in_process:
        doc.comment("Sized like the embedded default: under 10 minutes on 2 CPU cores with a 135M target.")
    doc.comment(f"The guide: docs/guides/{GUIDES[ctx.case]}; every key: docs/reference/policy.md (or `gate schema`).")
    doc.key("version", 1)
    doc.key("name", f"{ctx.case}-gate" if ctx.case != "quantized-audit" else "quantized-draft-audit")


def _target(doc: _Doc, ctx: _Context) -> None:
    doc.key("target")
    doc.key("model", ctx.request.target, "a packaged name, a local directory, a .gguf file or a hub id", indent=2)
    if ctx.in_process:
        doc.key("dtype", "float32", "float32 | bfloat16 | float16", indent=2)
        doc.key("device", "auto", "cpu | cuda | auto", indent=2)
    if ctx.case == "release":
        doc.comment(
            "The released target's identity: with one of these, a target that changed is named in the report\n"
            "(docs/guides/release.md):\n"
            "release: {report: released-report.json}    # a saved gate report of the release\n"
            "release: {model: ./released-model}         # or the released weights: drift along the workload",
            indent=2,
        )


def _drafts(doc: _Doc, ctx: _Context) -> None:
    doc.key("drafts")
    for d in ctx.drafts:
        doc.key(d.name, indent=2)
        doc.key("kind", d.kind, indent=4)
        for key, value, comment in _draft_fields(ctx, d):
            doc.key(key, value, comment, indent=4)


def _laws(doc: _Doc, ctx: _Context) -> None:
    doc.key("law", comment="a list is a matrix: every rule is decided under each law")
    doc.item({"temperature": 0}, "greedy")
    if ctx.case in ("release", "quantized-audit"):
        doc.item({"temperature": 0.7, "top_p": 0.95, "name": "chat"}, SET + "the sampling your deployment serves")
    else:
        doc.comment(
            "- {temperature: 0.7, top_p: 0.95, name: chat}   # the sampling your deployment serves (doubles the run)",
            indent=2,
        )


def _workload(doc: _Doc, ctx: _Context) -> None:
    doc.key("workload")
    doc.key("source", "mt_bench", "or jsonl with path: prompts.jsonl (your own traffic), sharegpt, humaneval", indent=2)
    if ctx.case == "quantized-audit":
        doc.comment(
            "overlap per category needs 10 continuations in each category (an interval needs 5);\n"
            "two categories keep the audit to minutes on 2 CPU cores (drop categories for all 8)"
            if ctx.in_process
            else "10 prompts in each of two categories (drop categories for all 8)",
            indent=2,
        )
        doc.key("categories", ["writing", "coding"], SET + "the domains your traffic has", indent=2)
        doc.key("per_category", 10, indent=2)
        doc.key("max_new_tokens", 24, SET + "your outputs' length", indent=2)
    elif ctx.case == "release":  # its per-category rule needs 10 paired requests a category, served or not
        doc.key("per_category", 5, "40 prompts: 10 paired requests a category at 2 repetitions", indent=2)
        doc.key("max_new_tokens", 24, SET + "your outputs' length (a list is a matrix: [16, 128])", indent=2)
    elif ctx.served:
        doc.key("per_category", 2, "16 prompts; extraction and coding give prompt lookup text to copy", indent=2)
        doc.key("max_new_tokens", 48, SET + "your outputs' length", indent=2)
    else:
        doc.key("per_category", 3, "24 prompts, three per MT-bench category", indent=2)
        doc.key("max_new_tokens", 24, SET + "your outputs' length (a list is a matrix: [16, 128])", indent=2)
    doc.key("seed", 0, indent=2)
    doc.key("chat_template", True, indent=2)


def _runner(doc: _Doc, ctx: _Context) -> None:
    if ctx.in_process:
        doc.comment(
            "runner: gate's in-process loop (kind transformers, the default). A served engine:\n"
            "gate init --for served --runner llama_server | vllm | openai"
        )
        return
    kind = ctx.runner
    doc.key("runner")
    doc.key("kind", kind, indent=2)
    spec = runner_kinds.runner_class(kind).spec
    fields = spec.model_fields
    if "threads" in fields:
        from gate.measure.environment import cpu_count

        cpus = cpu_count() or 2
        doc.key(
            "threads",
            max(1, cpus - 1),
            SET + f"the server's compute threads (-t): here {cpus} CPUs less one for gate's client",
            indent=2,
        )
    if "ctx_size" in fields:
        doc.key("ctx_size", 1024, "context tokens per parallel slot", indent=2)
    if "max_model_len" in fields:
        doc.key("max_model_len", 1024, "tokens per sequence (prompt + output)", indent=2)
    if "kv_cache_space_gib" in fields:
        doc.key(
            "kv_cache_space_gib", 1, "a CPU build's KV cache (GPU: --gpu-memory-utilization in extra_args)", indent=2
        )
    if "binary" in fields:
        doc.comment(f"binary: ./path/to/{kind}    # default: where docs/guides/served.md says gate looks", indent=2)
    if "endpoints" in fields:
        from gate.runners.engines.registry import engine_names

        engines = engine_names()  # the first (generic) reads the counters of whichever engine it finds
        doc.comment("One server per runner: the fallback (no speculation) and each draft.", indent=2)
        doc.key("endpoints", indent=2)
        for i, name in enumerate(["fallback", *(d.name for d in ctx.drafts)]):
            port = 8000 + i
            doc.key(name, indent=4)
            doc.key("base_url", f"http://127.0.0.1:{port}", TODO + "the server's root (no /v1)", indent=6)
            if name != "fallback":
                doc.key(
                    "metrics_url",
                    f"http://127.0.0.1:{port}/metrics",
                    TODO + "its Prometheus counters: the draft's proposals are counted there",
                    indent=6,
                )
                doc.key("engine", engines[0], f"whose counters: {', '.join(engines)}", indent=6)
        doc.comment("api_key_env: MY_API_KEY    # the variable holding the API key, if the servers need one", indent=2)
    doc.key("load")
    doc.key("concurrency", [1, 2, 4], SET + "the loads you plan for (closed loop); request_rate: open loop", indent=2)
    # load.goodput: the SLOs of the metric of that name
    doc.key(GOODPUT.name, {"ttft": "500 ms", "tpot": "50 ms"}, SET + "your SLOs (the goodput metric)", indent=2)


def _resources(doc: _Doc, ctx: _Context) -> None:
    if ctx.case != "release":
        return
    doc.key("resources", comment="the device the memory bill is for")
    doc.key("capacity", "80 GiB", SET + "your device's memory", indent=2)
    doc.key("sequences", 16, SET + "concurrent sequences you serve", indent=2)
    doc.key("workspace", "2 GiB", SET + "activations, kernels' scratch", indent=2)


def _measurement(doc: _Doc, ctx: _Context) -> None:
    doc.key("measurement")
    reps = 2 if ctx.served or ctx.case == "release" else 1
    doc.key(
        "repetitions",
        reps,
        "each prompt's paired requests per draft and law"
        + ("; a verdict per category needs 10 a category" if ctx.case == "release" else ""),
        indent=2,
    )
    doc.key("warmup_requests", 1, indent=2)
    doc.key("confidence", 0.95, indent=2)
    doc.key("inconclusive", "error", "a verdict the interval cannot settle: exit 3 (warn: reported, exit 0)", indent=2)
    if ctx.case == "ci":
        doc.key(
            "budget",
            {"requests": 32},
            SET + "the most timed requests per runner a close verdict may take (the plan: 24)",
            indent=2,
        )
        doc.key("max_wall_s", "20 min", SET + "your CI job's time limit, less its set-up", indent=2)


def _rules(ctx: _Context) -> list[_Rule]:
    greedy = {"laws": ["greedy"]}
    share = OVERLAP if ctx.in_process else ACCEPTANCE_RATE
    share_agg = "mean" if share is OVERLAP else POOLED
    share_what = OVERLAP.name if share is OVERLAP else "the server's acceptance rate"
    exact = _exactness_rule(
        "exact-greedy",
        "greedy speculative output equals the fallback's, token for token (near-ties reported)",
        tie_tolerance=0.01,
        scope=greedy,
    )
    top = {"concurrency": [4]}
    if ctx.case == "ci":
        memory = _metric_rule(
            "memory",
            MEMORY_BILL_BYTES,
            "max",
            "<=",
            "1.25x",
            "what the draft may add to the resident bill",
            "the draft's weights and caches against the target alone",
            relative_to="fallback",
        )
        return [
            _metric_rule(
                SPEEDUP.name,
                SPEEDUP,
                POOLED,
                ">=",
                "1.0x",
                "the speedup a draft change must keep",
                "speculation must pay for itself against the fallback (paired requests)",
            ),
            _metric_rule(
                "itl-p99",
                ITL_MS,
                "p99",
                "<=",
                "500 ms",
                "your token-pacing SLO",
                "the slowest token gaps (a draft's verification steps)",
            ),
            _metric_rule(
                f"{share.name.split('_')[0]}-floor",
                share,
                share_agg,
                ">=",
                0.3,
                "a run of the draft you ship today, less a margin",
                f"the draft must keep proposing what the target would sample ({share_what})",
            ),
            exact,
            memory,
        ]
    if ctx.case == "release":
        rules = [
            _metric_rule(
                SPEEDUP.name,
                SPEEDUP,
                POOLED,
                ">=",
                "1.05x",
                "the speedup the release must bring",
                "speculation must pay for itself against the fallback (paired requests)",
            ),
            _metric_rule(
                "no-slow-category",
                SPEEDUP,
                POOLED,
                ">=",
                "0.95x",
                "the most a category may lose",
                "no prompt category may be more than 5% slower than the fallback",
                per="category",
            ),
            _metric_rule(
                "ttft",
                TTFT_MS,
                "median",
                "<=",
                "1.1x",
                "what the draft may add to the first token",
                "the draft must not slow down the first token",
                relative_to="fallback",
            ),
            _metric_rule(
                "itl-p99",
                ITL_MS,
                "p99",
                "<=",
                "500 ms",
                "your token-pacing SLO",
                "the slowest token gaps (a draft's verification steps)",
            ),
            _metric_rule(
                "memory-headroom",
                MEMORY_HEADROOM_BYTES,
                "min",
                ">=",
                "4 GiB",
                "what must stay free on the device",
                "device memory left at resources.sequences",
            ),
            _exactness_rule(
                "exact",
                "output follows the target's law: greedy token for token; sampled by PIT and next-token tests",
                tie_tolerance=0.01,
                detect_tv=0.1,
            ),
        ]
        return rules
    if ctx.case == "quantized-audit":
        rules = [
            _metric_rule(
                share.name.replace("_", "-"),
                share,
                share_agg,
                ">=",
                0.9 if share is OVERLAP else 0.6,
                "the released draft's, less a margin",
                f"the swap must keep {share_what}",
            ),
            _metric_rule(
                "accepted-length",
                MEAN_ACCEPTANCE_LENGTH,
                POOLED,
                ">=",
                "3 tokens",
                "the released draft's, less a margin",
                "tokens committed per verification step",
            ),
            _metric_rule(
                "draft-weights",
                MEMORY_LINE_BYTES,
                "max",
                "<=",
                "300 MiB",
                "what the quantized weights must fit in",
                "the draft's own weights",
                line="draft weights",
            ),
        ]
        if share is OVERLAP:
            rules.append(
                _metric_rule(
                    "overlap-per-category",
                    OVERLAP,
                    "mean",
                    ">=",
                    0.8,
                    "the floor of any one domain",
                    "the swap may not lose a domain, even if the mean holds",
                    per="category",
                )
            )
        rules.append(exact)
        return rules
    # served
    return [
        _metric_rule(
            "speedup-at-load",
            SPEEDUP,
            POOLED,
            ">=",
            "1.0x",
            "the speedup at every planned load",
            "a draft must not be slower than the fallback at any load we plan for",
            per="concurrency",
        ),
        _metric_rule(
            "ttft-median-at-top",
            TTFT_MS,
            "median",
            "<=",
            "500 ms",
            "your first-token SLO (a tail such as p90 needs more requests at that load)",
            "time to first token at the highest planned load",
            scope=top,
        ),
        _metric_rule(
            "itl-p99-at-top",
            ITL_MS,
            "p99",
            "<=",
            "120 ms",
            "your token-pacing SLO",
            "token pacing at the highest planned load",
            scope=top,
        ),
        _metric_rule(
            "acceptance",
            ACCEPTANCE_RATE,
            POOLED,
            ">=",
            0.3,
            "a run of the draft you ship today, less a margin",
            "the drafts' proposals, accepted per the server's own counts (warn: reported, not gating)",
            per="concurrency",
            level="warn",
        ),
        _exactness_rule(
            "exact-greedy",
            "greedy output of every draft runner equals the fallback runner's, token for token",
            tie_tolerance=0.01,
        ),
    ]


def _write_rules(doc: _Doc, rules: list[_Rule]) -> None:
    doc.key("rules")
    for rule in rules:
        doc.key("id", rule.id, indent=2, item=True)
        if rule.description:
            doc.key("description", rule.description, indent=4)
        for key, value, comment in rule.fields:
            doc.key(key, value, comment, indent=4)


def _footer(doc: _Doc, ctx: _Context, path: Path) -> None:
    if ctx.served:
        doc.comment(
            "Requests/s meeting load.goodput's SLOs is decided over windows, one per repetition at each load\n"
            "point: an interval needs measurement.repetitions: 5. Then add:\n"
            f'  - {{id: goodput-at-top, metric: {GOODPUT.name}, aggregation: {POOLED}, comparison: ">=", '
            "threshold: 0.5 requests/s, scope: {concurrency: [4]}}"
        )
    if ctx.case == "release":
        first = ctx.drafts[0].name
        doc.comment(
            "Against the release you ship today: save its report (gate check ... --json released.json), then\n"
            f"baseline: {{report: released.json, drafts: {{{first}: {first}}}}}   # this draft -> the baseline's\n"
            "and rules with relative_to: baseline (e.g. speedup >= 0.98x of the baseline's), or compare two reports:\n"
            "  gate compare released.json gate-report.json\n"
            "A time-limited exception, when a known regression must ship (every field required):\n"
            "waivers:\n"
            '  - {rule: itl-p99, scope: "'
            + first
            + '/*", reason: "short prompts, fix in #412", owner: you@example.com, '
            "expires: 2030-12-31}"
        )
    if ctx.case == "quantized-audit":
        doc.comment(
            "To audit against a saved report of the released draft instead of running it here:\n"
            "baseline: {report: released.json, drafts: {quantized: released}}, rules with relative_to: baseline,\n"
            "or compare two reports: gate compare released.json gate-report.json"
        )


def render(request: Request, path: Path = DEFAULT_PATH) -> str:
    """The commented policy text of a checked request (check_request) to be written at `path`."""
    runner = request.runner or default_runner(request.use_case)
    caps = _capabilities(runner)
    ctx = _Context(request, runner, bool(caps.in_process), bool(caps.load_points), _managed(runner))
    doc = _Doc()
    _header(doc, ctx, path)
    _target(doc, ctx)
    _drafts(doc, ctx)
    _laws(doc, ctx)
    _workload(doc, ctx)
    _resources(doc, ctx)
    _runner(doc, ctx)
    _measurement(doc, ctx)
    _write_rules(doc, _rules(ctx))
    _footer(doc, ctx, path)
    return doc.text()


# ---------------------------------------------------------------------------------------------
# Creating the file


def _target_from(path: Path, target: str) -> str:
    """A target given as a relative path that exists here, rewritten relative to the policy's
    folder (a policy's paths are read relative to it); anything else as given."""
    given = Path(target).expanduser()
    if given.is_absolute() or not given.exists():
        return target
    folder = path.parent.resolve()
    return os.path.relpath(given.resolve(), folder)


def write(request: Request, path: Path = DEFAULT_PATH) -> Written:
    """Create the policy of `request` at `path` (its folder made when missing). The text is
    read back through gate's policy loader first. Raises InitError when `path` exists (never
    overwritten) or cannot be written, and InitBug when the loader refuses the text."""
    if path.exists() or path.is_symlink():
        raise InitError(f"{path} exists; gate init never overwrites a file (remove it or name another path)")
    checked = check_request(request)
    checked = Request(checked.use_case, _target_from(path, checked.target), checked.drafts, checked.runner)
    text = render(checked, path)
    loaded_rules = _load(text, path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise InitError(f"{path} exists; gate init never overwrites a file (remove it or name another path)") from None
    except OSError as e:
        raise InitError(f"cannot write {path}: {e.strerror or e}") from None
    lines = text.splitlines()
    return Written(
        path,
        text,
        loaded_rules,
        [i for i, line in enumerate(lines, 1) if f"# {SET}" in line],
        [i for i, line in enumerate(lines, 1) if f"# {TODO}" in line],
        _target_problem(checked.target, path),
    )


def _target_problem(target: str, path: Path) -> str | None:
    """Why target.model, as written to the policy at `path`, would not be found by `gate
    validate` (a typo, a folder not made yet), or None. The policy is written all the same: a
    team may write it before the model is on the machine."""
    from gate.models.loading import resolve_source

    try:
        resolve_source(target, None, path.parent, "target.model")
    except PolicyValueError as e:
        return e.message
    return None


def _load(text: str, path: Path) -> int:
    """Read `text` back with gate's policy loader (in a scratch folder beside nothing); the
    number of rules. Raises InitBug with the loader's problems."""
    with tempfile.TemporaryDirectory(prefix="gate-init-") as scratch:
        probe = Path(scratch) / path.name
        probe.write_text(text, encoding="utf-8")
        try:
            loaded = load_policy(probe)
        except InputError as e:
            raise InitBug(
                f"internal error: gate init wrote a policy gate cannot load (a bug in gate init): {e}"
            ) from None
    return len(loaded.policy.rules)


# ---------------------------------------------------------------------------------------------
# Asking in a terminal


def ask_missing(
    ask: Ask,
    case: str | None,
    target: str | None,
    drafts: tuple[DraftChoice, ...],
    runner: str | None,
    path: Path | None,
) -> tuple[Request, Path]:
    """The request and path, asking for what was not given. With nothing given, every
    question is asked (use case, target, runner, drafts, file); otherwise only the use case
    and target when missing."""
    everything = case is None and target is None and not drafts and runner is None and path is None
    if case is None:
        listed = "".join(f"\n  {name}: {what}" for name, what in USE_CASES.items())
        case = ask(f"Use cases:{listed}\nUse case ({', '.join(USE_CASES)})", "ci", list(USE_CASES), use_case)
    assert case is not None
    if target is None:
        target = ask(
            "Target model (a packaged name, a local directory, a .gguf file or a hub id)",
            DEFAULT_TARGET,
            None,
            _nonempty_target,
        )
    if everything:
        kinds = runner_kinds.registered_kinds() if case != "served" else served_kinds()
        runner = ask(f"Runner ({', '.join(kinds)})", default_runner(case), kinds, lambda v: _runner_for(case, v))
        assert runner is not None
        default = ", ".join(f"{d.name}:{d.kind}" for d in default_drafts(case, runner))
        drafts = ask(
            f"Drafts, NAME:KIND separated by commas (kinds: {', '.join(draft_kinds.names())})",
            default,
            None,
            lambda v: _drafts_for(case, runner, v),
        )
        path = ask("Write the policy to", str(DEFAULT_PATH), None, _new_path)
    assert target is not None
    return Request(case, target, drafts, runner), path or DEFAULT_PATH


def _nonempty_target(value: str) -> str:
    if not value.strip():
        raise InitError("give the target model")
    return value.strip()


def _runner_for(case: str, value: str) -> str:
    kind = runner_kind(value.strip())
    check_request(Request(case, DEFAULT_TARGET, runner=kind))
    return kind


def _drafts_for(case: str, runner: str, value: str) -> tuple[DraftChoice, ...]:
    drafts = parse_drafts([v for v in (p.strip() for p in value.split(",")) if v])
    check_request(Request(case, DEFAULT_TARGET, drafts, runner))
    return drafts


def _new_path(value: str) -> Path:
    path = Path(value.strip() or DEFAULT_PATH)
    if path.exists() or path.is_symlink():
        raise InitError(f"{path} exists; gate init never overwrites a file (name another path)")
    return path


def run(
    path: Path | None,
    case: str | None,
    target: str | None,
    drafts: Sequence[str],
    runner: str | None,
    ask: Ask | None,
) -> Written:
    """gate init: check what was given, ask for what is missing when `ask` is given (a
    terminal), and create the policy. Without `ask`, --for and --target are required.
    Raises InitError (exit 2) or InitBug (exit 3)."""
    case = use_case(case) if case is not None else None
    given = parse_drafts(drafts)
    kind = runner_kind(runner) if runner is not None else None
    if path is not None and (path.exists() or path.is_symlink()):
        raise InitError(f"{path} exists; gate init never overwrites a file (remove it or name another path)")
    if case is None or target is None:
        if ask is None:
            missing = " and ".join(o for o, v in (("--for", case), ("--target", target)) if v is None)
            raise InitError(
                f"gate init needs {missing} when it is not run in a terminal (in one, it asks), e.g. "
                f"gate init --for ci --target {DEFAULT_TARGET} --draft lookup:prompt_lookup"
            )
        request, path = ask_missing(ask, case, target, given, kind, path)
    else:
        request = Request(case, target, given, kind)
    return write(request, path or DEFAULT_PATH)


def summary(written: Written) -> list[str]:
    """What gate init prints once the policy is written."""
    lines = [f"{written.path}: written ({written.rules} rules), and gate's policy loader reads it back"]

    def values(marked: list[int]) -> str:
        return f"{len(marked)} value{'s' * (len(marked) != 1)}"

    def at(marked: list[int]) -> str:
        return f"line{'s' * (len(marked) != 1)} {', '.join(map(str, marked))}"

    if written.to_set:
        lines.append(
            f'set: {values(written.to_set)} marked "# {SET.strip()}" for the team to set ({at(written.to_set)})'
        )
    if written.todo:
        lines.append(
            f'todo: {values(written.todo)} marked "# {TODO.strip()}" that gate cannot know ({at(written.todo)}): '
            "set each; gate validate refuses a missing file, not a placeholder URL"
        )
    if written.target_problem:
        lines.append(f"warning: target.model: {written.target_problem}; gate validate refuses it until it is found")
    lines.append(f"next: gate validate {written.path}, then gate check {written.path}")
    return lines
