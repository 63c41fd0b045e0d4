"""The `gate` command: parses arguments, wires implementations, prints. No logic of its own.

Exit codes: 0 every error-level rule passed; 1 a rule failed; 2 invalid policy, input or
usage; 3 a measurement could not be made; 130 (SIGINT) and 143 (SIGTERM) interrupted, not a
verdict (gate check writes its reports with what was measured first).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from gate import __version__
from gate.core.errors import EXIT_MEASUREMENT, EXIT_USAGE, GateError, describe_error

if TYPE_CHECKING:
    from gate.commands.check import CheckResult

# emoji=False: a path like "/ci/:cat:/policy.yaml" must print as written
_err = Console(stderr=True, highlight=False, emoji=False)


def _fail(exc: GateError) -> None:
    for line in str(exc).splitlines() or [""]:
        _err.print(f"gate: error: {line}", markup=False, soft_wrap=True)
    sys.exit(exc.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gate")
def cli() -> None:
    """Release gate for speculative-decoding drafts: measure overlap, verified-prefix
    behaviour, latency and the resource bill against a non-speculative fallback, and
    check them against a YAML policy."""


@cli.command("init")
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--for",
    "use_case",
    metavar="[ci|release|quantized-audit|served]",
    help="The use case: ci (the draft-change gate), release (pre-release approval), quantized-audit (a "
    "quantized draft against the released one), served (a served engine at load points).",
)
@click.option(
    "--target",
    metavar="MODEL",
    help="The target model as a policy names it: a packaged name (smollm2-135m-instruct), a local "
    "directory, a .gguf file or a hub id.",
)
@click.option(
    "--draft",
    "drafts",
    multiple=True,
    metavar="NAME:KIND",
    help="A draft to gate (repeatable); KIND a draft kind, e.g. prompt_lookup, model, early_exit (an unknown one "
    "lists them all). Default: lookup:prompt_lookup (ci, served), candidate:model (release), released:model and "
    "quantized:model (quantized-audit).",
)
@click.option(
    "--runner",
    metavar="KIND",
    help="transformers (gate's in-process loop; the default), or a served engine: llama_server (the default "
    "for --for served), vllm, openai.",
)
def init_command(
    path: Path | None, use_case: str | None, target: str | None, drafts: tuple[str, ...], runner: str | None
) -> None:
    """Write a commented starting policy to PATH (default gate.yaml) for a use case, a target,
    drafts and a runner: the rules that use case needs, every threshold marked `# set:` for the
    team to set. gate's policy loader reads it back before it is written. `# TODO: set` marks
    what gate cannot know: files (a model draft's on llama_server or vllm, a trained draft's
    checkpoint) fail `gate validate` until set; placeholders that are valid values (an openai
    runner's server URLs) validate as they are and must be set by hand.

    Never overwrites a file (exit 2). Without --for and --target in a terminal it asks for
    them (with no argument at all: for everything); elsewhere they are required (exit 2)."""
    from gate.commands import init as do_init

    def ask(text: str, default: str, choices: Any, check: Any) -> Any:
        def value(answer: str) -> Any:
            try:
                return check(answer)
            except GateError as e:
                raise click.UsageError(str(e)) from None

        return click.prompt(text, default=default, value_proc=value)

    try:
        written = do_init.run(path, use_case, target, drafts, runner, ask if _stdin_is_terminal() else None)
    except GateError as e:
        _fail(e)
    for line in do_init.summary(written):
        click.echo(line)


def _stdin_is_terminal() -> bool:
    """Whether gate may ask questions (gate init): stdin is a terminal."""
    return sys.stdin.isatty()


def _count(n: int, noun: str) -> str:
    """'1 draft', '2 drafts'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


@cli.command()
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
def validate(policy: Path) -> None:
    """Check a policy file without running models (exit 0 valid, 2 invalid)."""
    from gate.commands.check import validate as do_validate

    try:
        loaded = do_validate(policy)
    except GateError as e:
        _fail(e)
    p = loaded.policy
    for w in loaded.warnings:
        _err.print(f"gate: warning: {w}", markup=False, soft_wrap=True)
    swept = f" and {len(p.sweep)} num_draft_tokens_sweep runners" if p.sweep else ""
    click.echo(
        f"{policy}: valid (version {p.version}; {_count(len(p.declared_drafts), 'draft')}{swept}, "
        f"{_count(len(p.laws), 'law')}, {_count(len(p.rules), 'rule')})"
        + (f", {_count(len(loaded.warnings), 'warning')}" if loaded.warnings else "")
    )
    from gate.exactness.sampled import planned_cost
    from gate.plan.rounds import planned_looks

    for line in [planned_looks(loaded), *planned_cost(loaded)]:
        if line:
            click.echo(line)


def verdict_options(command: Any) -> Any:
    """The report paths and verdict switches gate check and gate merge share (click options)."""
    for option in reversed(_VERDICT_OPTIONS):
        command = option(command)
    return command


_VERDICT_OPTIONS = [
    click.option(
        "--junit",
        "junit_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=Path("gate-junit.xml"),
        show_default=True,
        help="Where to write the JUnit XML report.",
    ),
    click.option(
        "--json",
        "json_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=Path("gate-report.json"),
        show_default=True,
        help="Where to write the JSON report (every raw measurement).",
    ),
    click.option(
        "--markdown",
        "markdown_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Also write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY; appended to an existing file).",
    ),
    click.option(
        "--html",
        "html_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Also write one self-contained HTML page with plots (linked from the Markdown summary).",
    ),
    click.option(
        "--html-url",
        help="Where the Markdown summary's link to the HTML page points (e.g. the CI artifact's URL; "
        "default: the --html path).",
    ),
    click.option("--fail-on-warn", is_flag=True, help="Exit 1 when a warn-level rule is violated."),
    click.option(
        "--fail-on-inconclusive",
        is_flag=True,
        help="Exit 1 when a verdict is inconclusive (whatever measurement.inconclusive says).",
    ),
    click.option("--no-waivers", is_flag=True, help="Ignore the policy's waivers: the full truth."),
    click.option(
        "--junit-warn",
        type=click.Choice(["skipped", "failure", "passed"]),
        default=None,
        help="How warn outcomes appear in JUnit [default: skipped; failure with --fail-on-warn].",
    ),
    click.option(
        "--junit-inconclusive",
        type=click.Choice(["auto", "error", "failure", "skipped"]),
        default="auto",
        show_default=True,
        help="How inconclusive outcomes appear in JUnit; auto follows their effect on the exit code.",
    ),
]


@cli.command()
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
@verdict_options
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress output (bars on a terminal; otherwise a plain line at most every 10 s and at each phase change).",
)
@click.option("--no-warmup", is_flag=True, help="Skip the untimed warm-up requests (measurement.warmup_requests).")
@click.option(
    "--report",
    "extra_reports",
    multiple=True,
    metavar="FORMAT=PATH",
    help="Also write the report in another registered format (gate.report.registry), e.g. a plugin's; repeatable.",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Measure only the I-th of N shards of the run (its (law, load point) cells in "
    "turn; what is not split runs in shard 1); `gate merge` joins the N JSON reports into one verdict.",
)
def check(
    policy: Path,
    junit_path: Path,
    json_path: Path,
    markdown_path: Path | None,
    html_path: Path | None,
    html_url: str | None,
    fail_on_warn: bool,
    fail_on_inconclusive: bool,
    no_waivers: bool,
    junit_warn: str | None,
    junit_inconclusive: str,
    no_progress: bool,
    no_warmup: bool,
    extra_reports: tuple[str, ...],
    shard: str | None,
) -> None:
    """Measure every draft in POLICY, evaluate every rule, write JUnit and JSON.

    Exit 0 when every error-level rule passes, 1 when a rule fails (or warns with
    --fail-on-warn, or is inconclusive with --fail-on-inconclusive or measurement.inconclusive:
    fail), 2 for an invalid policy or input, 3 when a measurement could not be made or an
    error-level verdict is inconclusive (measurement.inconclusive: error, the default);
    130 (SIGINT, Ctrl-C) or 143 (SIGTERM) when interrupted: the reports are written with
    what was measured, and rules without measurements are errors (not a verdict)."""
    from gate.commands.check import Options
    from gate.commands.check import check as do_check
    from gate.commands.merge import parse_shard

    extra = _extra_reports(extra_reports)
    if html_path is not None:
        extra.append(("html", html_path))
    show = None if no_progress else ("bars" if _err.is_terminal else "lines")
    try:
        part = parse_shard(shard) if shard is not None else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--shard") from None
    options = Options(fail_on_warn, fail_on_inconclusive, not no_waivers, part)
    check_report_paths([("json", json_path), ("junit", junit_path), ("markdown", markdown_path), *extra])
    try:
        with _progress(show) as progress:
            result = do_check(policy, progress=progress, options=options, warmup=not no_warmup)
    except GateError as e:
        _fail(e)
    junit = {
        "fail_on_warn": fail_on_warn,
        "fail_on_inconclusive": fail_on_inconclusive,
        "warn_as": junit_warn,
        "inconclusive_as": junit_inconclusive,
    }
    _write_and_exit(result, json_path, junit_path, markdown_path, {"junit": junit}, extra, html_url)


@cli.command()
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("shards", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@verdict_options
def merge(
    policy: Path,
    shards: tuple[Path, ...],
    junit_path: Path,
    json_path: Path,
    markdown_path: Path | None,
    html_path: Path | None,
    html_url: str | None,
    fail_on_warn: bool,
    fail_on_inconclusive: bool,
    no_waivers: bool,
    junit_warn: str | None,
    junit_inconclusive: str,
) -> None:
    """Join the JSON reports of `gate check POLICY --shard I/N` (every shard of one run, each
    once) into one verdict: every rule decided once on all their measurements, one JUnit file.
    Exit codes as gate check's; 2 when a report is not a shard of this run or one is missing."""
    from gate.commands.check import Options
    from gate.commands.merge import merge as do_merge

    check_report_paths([("json", json_path), ("junit", junit_path), ("markdown", markdown_path), ("html", html_path)])
    try:
        result = do_merge(policy, list(shards), Options(fail_on_warn, fail_on_inconclusive, not no_waivers))
    except GateError as e:
        _fail(e)
    junit = {
        "fail_on_warn": fail_on_warn,
        "fail_on_inconclusive": fail_on_inconclusive,
        "warn_as": junit_warn,
        "inconclusive_as": junit_inconclusive,
    }
    _write_and_exit(
        result,
        json_path,
        junit_path,
        markdown_path,
        {"junit": junit},
        [("html", html_path)] if html_path is not None else [],
        html_url,
    )


def _extra_reports(given: tuple[str, ...]) -> list[tuple[str, Path]]:
    """--report FORMAT=PATH values as (format, path); an unknown format or a malformed value
    is a usage error (exit 2) before anything is measured."""
    from gate.report import registry as formats

    out = []
    for value in given:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise click.UsageError(f"--report {value!r}: expected FORMAT=PATH (formats: {', '.join(formats.names())})")
        try:
            formats.get(name)
        except KeyError as e:
            raise click.UsageError(f"--report {value!r}: {e.args[0]}") from None
        out.append((name, Path(path)))
    return out


def _write_and_exit(
    result: CheckResult,
    json_path: Path,
    junit_path: Path,
    markdown_path: Path | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    extra: list[tuple[str, Path]] | None = None,
    html_url: str | None = None,
) -> None:
    """Write the JSON, JUnit (and Markdown) reports and those of `extra` ((format, path),
    --report) through gate.report.registry, print the console summary, exit with the gate's
    code. `options`: format name -> its keywords. With an html report and a Markdown one,
    the Markdown summary ends with a link to the page (`html_url`, else its path)."""
    from gate.loop import interrupt
    from gate.report import registry as formats

    # a signal once every measurement was made: noted before each write, exit 128 + signal
    targets = [("json", json_path), ("junit", junit_path), ("markdown", markdown_path), *(extra or [])]
    broken, unwritable = _write_reports(result.report, targets, options, html_url, lambda: interrupt.mark_late(result))
    out = Console(highlight=False, emoji=False)
    if not out.is_terminal:
        out = Console(highlight=False, emoji=False, width=160)
    try:
        formats.create("console").print(result.report, out)
    except Exception as e:  # noqa: BLE001 - a summary that cannot be drawn: the files are written, say so
        _err.print(f"gate: internal error: the console summary could not be drawn: {describe_error(e)}", markup=False)
        broken = True
    click.echo(
        "reports: " + " ".join(str(path) for name, path in targets if path is not None and name not in unwritable)
    )
    interrupt.mark_late(result)
    if unwritable and result.exit_code < 128:
        sys.exit(EXIT_USAGE)
    sys.exit(max(result.exit_code, EXIT_MEASUREMENT) if broken and result.exit_code < 128 else result.exit_code)


def check_report_paths(targets: list[tuple[str, Path | None]]) -> None:
    """Before anything is measured: each report gets a file of its own, and each can be
    written (its folder exists or can be made, and is writable). Raises click.UsageError
    (exit 2) naming the option and the path."""
    seen: dict[Path, str] = {}
    for name, path in targets:
        if path is None:
            continue
        option = f"--{name}" if name in ("json", "junit", "markdown", "html") else f"--report {name}="
        key = path.resolve()
        if key in seen:
            raise click.UsageError(
                f"{option} {path}: {seen[key]} writes the same file; each report needs a file of its own"
            )
        seen[key] = option
        if path.is_dir():
            raise click.UsageError(f"{option} {path}: is a directory, not a file")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise click.UsageError(f"{option} {path}: cannot be written ({folder} is not a writable directory)")


def _write_reports(
    report: Any,
    targets: list[tuple[str, Path | None]],
    options: dict[str, dict[str, Any]] | None = None,
    html_url: str | None = None,
    each: Any = None,
) -> tuple[bool, list[str]]:
    """Write `report` in every (format, path) of `targets` (None paths skipped) through
    gate.report.registry; `each` is called before every write. A Markdown summary written
    beside an html page gets a link to it. A file that cannot be written, or a format that
    fails on the report itself (a bug in it), is named on stderr and the others are still
    written (nothing measured is lost). Returns (whether a format broke, the formats whose
    file could not be written)."""
    from gate.report import registry as formats

    options = options or {}
    broken, unwritable = False, []
    html = next((path for name, path in targets if name == "html" and path is not None), None)
    for name, path in targets:
        if path is None:
            continue
        fmt = formats.create(name, **options.get(name, {}))
        if each is not None:
            each()
        try:
            fmt.write(report, path)
            if name == "markdown" and html is not None:
                with path.open("a", encoding="utf-8") as f:
                    f.write(f"\nPlots: [{html.name}]({html_url or html}) (self-contained HTML report).\n")
        except OSError as e:
            _err.print(
                f"gate: error: cannot write the {fmt.name} report to {path}: {e.strerror or e} (the other reports "
                "are written)",
                markup=False,
            )
            unwritable.append(name)
        except Exception as e:  # noqa: BLE001 - one format's bug must not cost the other reports
            _err.print(
                f"gate: internal error: the {fmt.name} report to {path} could not be written: {describe_error(e)}"
                " (the other reports are written)",
                markup=False,
            )
            broken = True
    return broken, unwritable


@cli.command("report")
@click.argument("report_path", metavar="REPORT", type=click.Path(path_type=Path))
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one self-contained HTML page with plots.",
)
@click.option(
    "--html-url", help="Where the Markdown summary's link to the HTML page points (default: the --html path)."
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the Markdown summary (appended to an existing file).",
)
@click.option(
    "--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the JUnit XML report."
)
@click.option(
    "--report",
    "extra_reports",
    multiple=True,
    metavar="FORMAT=PATH",
    help="Also write the report in another registered format (gate.report.registry); repeatable.",
)
@click.option(
    "--roofline-policy",
    "roofline_policy",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --bandwidth and --peak: add the roofline and predicted-vs-measured plots to the HTML page "
    "(the policy the report was made with; see gate roofline).",
)
@click.option("--bandwidth", help="Memory bandwidth for the roofline, e.g. 100GB/s.")
@click.option("--peak", help="Compute roof for the roofline, e.g. 1000GFLOP/s.")
def report_command(
    report_path: Path,
    html_path: Path | None,
    html_url: str | None,
    markdown_path: Path | None,
    junit_path: Path | None,
    extra_reports: tuple[str, ...],
    roofline_policy: Path | None,
    bandwidth: str | None,
    peak: str | None,
) -> None:
    """Render a saved gate JSON REPORT (also gzip-compressed) again: as an HTML page with
    plots (--html), a Markdown summary, JUnit, or any registered format. Exit 0 when
    written, 2 for a file that is not a gate report or a report that cannot be written, 3
    when a format failed on the report (the others are still written; the report's own
    verdict is its exit_code field, not this command's)."""
    from gate.core.errors import InputError, Problem
    from gate.policy import saved

    extra = _extra_reports(extra_reports)
    targets = [("html", html_path), ("markdown", markdown_path), ("junit", junit_path), *extra]
    if not any(path is not None for _, path in targets):
        raise click.UsageError("nothing to write: give --html, --markdown, --junit or --report FORMAT=PATH")
    check_report_paths(targets)
    options: dict[str, dict[str, Any]] = {}
    try:
        data = saved.read_data(report_path)
        report = saved.as_report(report_path, data)
        if roofline_policy is not None or bandwidth is not None or peak is not None:
            if roofline_policy is None or bandwidth is None or peak is None:
                raise InputError(
                    [
                        Problem(
                            "command line",
                            "--roofline-policy/--bandwidth/--peak",
                            None,
                            "the roofline needs all three: the policy, --bandwidth and --peak",
                        )
                    ]
                )
            options["html"] = _roofline_options(roofline_policy, report_path, data, bandwidth, peak)
    except GateError as e:
        _fail(e)
    broken, unwritable = _write_reports(report, targets, options, html_url)
    for name, path in targets:
        if path is not None and name not in unwritable:
            click.echo(f"wrote {name}: {path}")
    if unwritable:
        sys.exit(EXIT_USAGE)
    if broken:
        sys.exit(EXIT_MEASUREMENT)


def _roofline_options(
    policy: Path, report_path: Path, data: dict[str, Any], bandwidth: str, peak: str
) -> dict[str, Any]:
    """The html format's roofline keywords from a policy, a bandwidth and a peak (as gate roofline)."""
    from gate.commands.bill import policy_roofline
    from gate.commands.check import validate as do_validate
    from gate.core.errors import InputError, PolicyValueError, Problem
    from gate.measure.roofline import parse_rate

    try:
        bw, pk = parse_rate(bandwidth, "B/s"), parse_rate(peak, "FLOP/s")
    except ValueError as e:
        raise InputError([Problem("command line", "--bandwidth/--peak", None, str(e))]) from None
    if not (bw > 0 and pk > 0):
        raise InputError([Problem("command line", "--bandwidth/--peak", None, "bandwidth and peak must be positive")])
    loaded = do_validate(policy)
    _check_report_drafts(data, loaded, report_path)
    try:
        rows = policy_roofline(loaded, bw, pk, [1, 8, 64], data)
    except PolicyValueError as e:
        raise loaded.error(e) from None
    return {"roofline": rows, "bandwidth": bw, "peak_flops": pk}


@cli.command()
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("samples", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("gate-exactness-junit.xml"),
    show_default=True,
    help="Where to write the JUnit XML report.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("gate-exactness.json"),
    show_default=True,
    help="Where to write the JSON report.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the PIT randomisation.")
@click.option(
    "--served",
    "reference",
    metavar="SOURCE",
    help="The samples come from a served engine (its first output token is the prefill's): SOURCE names "
    "the lines drawn with speculation off, the reference; every other source is tested at the "
    "speculative positions, one-sample against the target and two-sample against SOURCE.",
)
def exactness(policy: Path, samples: Path, junit_path: Path, json_path: Path, seed: int, reference: str | None) -> None:
    """Test recorded SAMPLES (JSONL of prompt_ids, output_ids, law) against the target law of
    POLICY, with the policy's exactness rules (or the defaults: significance 0.001, power 0.9,
    detect_tv 0.1). Exit 0 pass, 1 fail, 2 bad input, 3 inconclusive or not measured."""
    from gate.commands.exactness import check_samples

    try:
        result = check_samples(policy, samples, seed, served_reference=reference)
    except GateError as e:
        _fail(e)
    _write_and_exit(result, json_path, junit_path)


@cli.command()
@click.argument("policy", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--target",
    "target_config",
    type=click.Path(path_type=Path),
    help="A config.json, a model folder, a .gguf file or the packaged model's name: bill it without a policy.",
)
@click.option(
    "--draft",
    "draft_config",
    type=click.Path(path_type=Path),
    help="The draft's config (with --target; the same forms).",
)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option(
    "--kv-dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16", "fp8", "int8", "int4"]),
    default="auto",
    show_default=True,
    help="Cached K/V format (auto: --dtype).",
)
@click.option("--num-draft-tokens", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--context-tokens", type=click.IntRange(1), default=4096, show_default=True)
@click.option("--sequences", type=click.IntRange(1), default=1, show_default=True)
@click.option("--capacity", help="Device memory, e.g. '80 GiB': adds the budget statement.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def bill(
    policy: Path | None,
    target_config: Path | None,
    draft_config: Path | None,
    dtype: str,
    kv_dtype: str,
    num_draft_tokens: int,
    context_tokens: int,
    sequences: int,
    capacity: str | None,
    as_json: bool,
) -> None:
    """Print the resident resource bill of POLICY (or of --target/--draft configs): every
    allocation with its formula and bytes, and with a capacity the headroom and how many
    more sequences fit. No model weights are loaded."""
    from pydantic import TypeAdapter, ValidationError

    from gate.core.errors import InputError, PolicyValueError, Problem
    from gate.loop.bill import config_bills, policy_bills
    from gate.measure.kv import ConfigError
    from gate.policy.model import ResourcesSpec
    from gate.records import BillRecord

    try:
        if policy is not None and target_config is None:
            from gate.commands.check import validate as do_validate

            loaded = do_validate(policy)
            try:
                bills = policy_bills(loaded)
            except PolicyValueError as e:
                raise loaded.error(e) from None
        elif target_config is not None and policy is None:
            from gate.models.loading import config_path

            found = {}
            for flag, given in (("--target", target_config), ("--draft", draft_config)):
                if given is not None:  # a packaged model's name (--target smollm2-135m-instruct) is its GGUF file
                    try:
                        found[flag] = config_path(given, flag)
                    except PolicyValueError as e:
                        raise InputError([Problem("command line", flag, None, e.message)]) from None
            target_config, draft_config = found.get("--target"), found.get("--draft")
            for flag, given in (("--target", target_config), ("--draft", draft_config)):
                if given is not None and not given.exists():
                    raise InputError([Problem("command line", flag, None, f"no such file or folder: {given}")])
            try:
                res = ResourcesSpec(kv_dtype=kv_dtype, capacity=capacity)
            except ValidationError as e:
                raise InputError(
                    [Problem("command line", "--capacity", None, e.errors()[0]["msg"].removeprefix("Value error, "))]
                ) from None
            try:
                bills = config_bills(
                    target_config, draft_config, dtype, num_draft_tokens, context_tokens, sequences, res
                )
            except ConfigError as e:
                raise InputError([Problem(str(draft_config or target_config), "", None, str(e))]) from None
        else:
            raise click.UsageError("give either a POLICY or --target CONFIG (with an optional --draft CONFIG)")
    except GateError as e:
        _fail(e)
    if as_json:
        click.echo(TypeAdapter(list[BillRecord]).dump_json(bills, indent=1).decode())
        return
    from gate.report.console import bill_tables

    out = Console(highlight=False, emoji=False, width=None if _err.is_terminal else 160)
    for table in bill_tables(bills):
        out.print(table)


@cli.command()
@click.argument("policy", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--bandwidth", required=True, help="Memory bandwidth, e.g. 100GB/s.")
@click.option("--peak", required=True, help="Compute roof, e.g. 1000GFLOP/s.")
@click.option("--intensity", type=float, multiple=True, help="Operational intensity in FLOP/byte (repeatable).")
@click.option(
    "--batch", type=click.IntRange(1), multiple=True, help="Batch sizes to place a policy's steps at (repeatable)."
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path),
    help="A gate check JSON report: adds the predicted speedup from its measured acceptance rate.",
)
def roofline(
    policy: Path | None,
    bandwidth: str,
    peak: str,
    intensity: tuple[float, ...],
    batch: tuple[int, ...],
    report_path: Path | None,
) -> None:
    """Attainable FLOP/s = min(peak, bandwidth x intensity); with a POLICY, the fallback's
    decode step and every draft's verification step on the roofline, which is
    bandwidth-bound, and the batch at which verification meets the compute roof."""
    from gate.core.errors import InputError, Problem
    from gate.measure.roofline import attainable, parse_rate

    try:
        try:
            bw, pk = parse_rate(bandwidth, "B/s"), parse_rate(peak, "FLOP/s")
        except ValueError as e:
            raise InputError([Problem("command line", "--bandwidth/--peak", None, str(e))]) from None
        if bw <= 0 or pk <= 0:
            raise InputError(
                [Problem("command line", "--bandwidth/--peak", None, "bandwidth and peak must be positive")]
            )
        bad = [i for i in intensity if not (i > 0 and math.isfinite(i))]
        if bad:
            raise InputError(
                [Problem("command line", "--intensity", None, f"{bad[0]:g} is not a positive, finite FLOP/byte")]
            )
        if report_path is not None and policy is None:
            raise InputError(
                [Problem("command line", "--report", None, "--report needs the POLICY the report was made with")]
            )
        rows = None
        if policy is not None:  # every input is read before anything is printed
            from gate.commands.bill import policy_roofline
            from gate.commands.check import validate as do_validate
            from gate.core.errors import PolicyValueError

            loaded = do_validate(policy)
            report = _read_report(report_path, loaded) if report_path else None
            try:
                rows = policy_roofline(loaded, bw, pk, list(batch) or [1, 8, 64], report)
            except PolicyValueError as e:
                raise loaded.error(e) from None
    except GateError as e:
        _fail(e)
    click.echo(f"roof: {pk / 1e9:g} GFLOP/s compute, {bw / 1e9:g} GB/s bandwidth, ridge point {pk / bw:g} FLOP/byte")
    for i in intensity:
        att = attainable(pk, bw, i)
        click.echo(
            f"intensity {i:g} FLOP/byte -> attainable {att / 1e9:g} GFLOP/s "
            f"({'bandwidth' if bw * i < pk else 'compute'}-bound)"
        )
    if rows is None:
        return
    from gate.report.console import roofline_tables

    out = Console(highlight=False, emoji=False, width=None if _err.is_terminal else 160)
    for table in roofline_tables(rows):
        out.print(table)


@cli.command()
@click.argument("report_path", metavar="REPORT", type=click.Path(path_type=Path))
@click.argument("rule_id")
@click.option("--scope", help="Only this scope, e.g. bf16/greedy.")
@click.option(
    "--values",
    "max_values",
    type=click.IntRange(0),
    default=20,
    show_default=True,
    help="Raw values to print per scope.",
)
def explain(report_path: Path, rule_id: str, scope: str | None, max_values: int) -> None:
    """Show how REPORT's verdicts for RULE_ID were reached: the samples, the aggregation,
    the threshold, the comparison and the raw values (or the exactness tests)."""
    from gate.core.errors import InputError, Problem
    from gate.policy import saved
    from gate.report.explain import explain_rule

    try:
        report = saved.read_report(report_path)
        text = explain_rule(report, rule_id, scope, max_values)
    except GateError as e:
        _fail(e)
    except KeyError as e:
        _fail(InputError([Problem(str(report_path), "outcomes", None, str(e.args[0]))]))
    click.echo(text)


@cli.command()
@click.argument("base_path", metavar="BASE", type=click.Path(path_type=Path))
@click.argument("candidate_path", metavar="CANDIDATE", type=click.Path(path_type=Path))
@click.option(
    "--draft",
    "mapping",
    multiple=True,
    metavar="CANDIDATE=BASE",
    help="Compare candidate draft CANDIDATE with the baseline's BASE (repeatable; default: same names).",
)
@click.option(
    "--tolerance",
    type=click.FloatRange(0, 1),
    default=0.05,
    show_default=True,
    help="Relative change within which a figure is unchanged.",
)
@click.option("--confidence", type=click.FloatRange(0.5, 0.9999), default=0.95, show_default=True)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write the comparison as JSON."
)
@click.option(
    "--allow-unmatched",
    is_flag=True,
    help="A draft of either report without a partner does not make the exit code 3 (it is still listed).",
)
@click.option(
    "--inconclusive",
    type=click.Choice(["error", "fail", "warn"]),
    default="error",
    show_default=True,
    help="What an inconclusive figure does: exit 3 (error, as gate check), exit 1 (fail), or nothing (warn).",
)
def compare(
    base_path: Path,
    candidate_path: Path,
    mapping: tuple[str, ...],
    tolerance: float,
    confidence: float,
    json_path: Path | None,
    allow_unmatched: bool,
    inconclusive: str,
) -> None:
    """Compare a CANDIDATE report's drafts with a BASE report's (the released draft): overlap
    per category, mean acceptance length, speedup, bill lines and exactness, each with a
    confidence interval. Drafts pair by --draft, else by name, else (one draft in each
    report) with each other; a draft left without a partner is listed. Exit 0 no
    regression, 1 a regression, 2 bad input, 3 not decided: environments or workloads
    differ, nothing to compare, a figure missing on one side, an unmatched draft (unless
    --allow-unmatched) or an inconclusive figure (unless --inconclusive says otherwise)."""
    import json as json_module
    from dataclasses import asdict

    from gate.commands.compare import compare as do_compare
    from gate.core.errors import InputError, Problem
    from gate.policy import saved
    from gate.report.console import comparison_table

    try:
        drafts = {}
        for item in mapping:
            cand, sep, base = item.partition("=")
            if not sep or not cand or not base:
                raise InputError([Problem("--draft", "", None, f"expected CANDIDATE=BASE, got {item!r}")])
            if cand in drafts:
                raise InputError([Problem("--draft", "", None, f"candidate draft {cand!r} is mapped twice")])
            drafts[cand] = base
        result = do_compare(
            saved.read_report(base_path),
            saved.read_report(candidate_path),
            drafts,
            tolerance,
            confidence,
            base_file=str(base_path),
            cand_file=str(candidate_path),
            allow_unmatched=allow_unmatched,
            inconclusive=inconclusive,
        )
    except GateError as e:
        _fail(e)
    out = Console(highlight=False, emoji=False, width=None if _err.is_terminal else 160)
    out.print(comparison_table(result))
    for diff in result.environment_differences:
        out.print(
            f"not comparable: {diff}: verdicts are inconclusive (run both with the same policy on one machine)",
            markup=False,
        )
    out.print(f"paired: {', '.join(result.pairs) or 'none'}", markup=False)
    for side_name in result.unmatched:
        side, name = side_name.split(" ", 1)
        hint = f"pair it with --draft {name}=BASE" if side == "candidate" else f"pair it with --draft CANDIDATE={name}"
        out.print(
            f"unmatched: the {side} draft {name} has no partner in the other report ({hint}"
            + (")" if allow_unmatched else ", or pass --allow-unmatched)"),
            markup=False,
        )
    if not result.comparisons:
        out.print(
            "nothing to compare: no draft and law in common (map names with --draft CANDIDATE=BASE)", markup=False
        )
    if json_path is not None:
        json_path.write_text(json_module.dumps(asdict(result), indent=2, default=str) + "\n", encoding="utf-8")
    out.print(result.summary(), markup=False)
    sys.exit(result.exit_code)


@cli.command()
@click.option("--report", "which", flag_value="report", help="The JSON report's schema instead of the policy's.")
@click.option(
    "--samples", "which", flag_value="samples", help="The schema of one line of a `gate exactness` samples file."
)
@click.option("--policy", "which", flag_value="policy", default=True, help="The policy's schema (default).")
def schema(which: str) -> None:
    """Print the JSON Schema of the policy (or of the JSON report, or of a samples line)."""
    if which == "report":
        from gate.report.document import report_schema

        doc = report_schema()
    elif which == "samples":
        from gate.commands.exactness import samples_schema

        doc = samples_schema()
    else:
        from gate.policy.schema import policy_schema

        doc = policy_schema()
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


def _read_report(path: Path, loaded: Any) -> dict[str, Any]:
    """A gate check JSON report made with this policy's drafts (same num_draft_tokens).
    Raises InputError for a file that is not such a report."""
    from gate.policy import saved

    report = saved.read_data(path, "gate check")
    _check_report_drafts(report, loaded, path)
    return report


def _check_report_drafts(report: dict[str, Any], loaded: Any, path: Path) -> None:
    """Raise InputError unless the report's drafts are the policy's (same num_draft_tokens)."""
    from gate.core.errors import InputError, Problem

    drafts = report.get("measurements", {}).get("drafts", {})
    for name, d in loaded.policy.drafts.items():
        if name not in drafts or drafts[name].get("num_draft_tokens") != d.num_draft_tokens:
            raise InputError(
                [
                    Problem(
                        str(path),
                        f"measurements.drafts.{name}",
                        None,
                        f"the report was not made with this policy: draft {name!r} "
                        f"{'is missing' if name not in drafts else 'has another num_draft_tokens'} there",
                    )
                ]
            )


class _progress:
    """Progress of the phases of a run: rich bars ("bars", on a terminal), plain lines
    ("lines", when stderr is not a terminal: CI logs), or nothing (None)."""

    def __init__(self, show: str | None):
        self.show = show

    def __enter__(self):  # type: ignore[no-untyped-def]
        if self.show == "lines":
            return ProgressLines(lambda text: _err.print(text, markup=False, soft_wrap=True))
        if self.show != "bars":
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=_err
        )
        self._bar.__enter__()
        self._tasks: dict[str, int] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in self._tasks:
                self._tasks[phase] = self._bar.add_task(phase, total=total)
            self._bar.update(self._tasks[phase], completed=done, total=total)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.show == "bars":
            self._bar.__exit__(*exc)


class ProgressLines:
    """Plain progress lines for logs: `gate: requests 12/48 (25%), 1m05s` when a phase
    starts and ends, and in between at most every `interval` seconds."""

    def __init__(self, write: Any, interval: float = 10.0, clock: Any = None):
        import time

        self.write, self.interval, self.clock = write, interval, clock or time.monotonic
        self.start = self.clock()
        self.last: float | None = None
        self.phase: str | None = None
        self.shown: tuple[str, int, int] | None = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = self.clock()
        changed = phase != self.phase
        if changed or done >= total or self.last is None or now - self.last >= self.interval:
            if self.shown == (phase, done, total):
                return  # the same line twice (a phase's end reported again)
            self.phase, self.last, self.shown = phase, now, (phase, done, total)
            pct = f" ({100 * done // total}%)" if total else ""
            self.write(f"gate: {phase} {done}/{total}{pct}, {_duration(now - self.start)}")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return (
        f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s"
        if s >= 3600
        else f"{s // 60}m{s % 60:02d}s"
        if s >= 60
        else f"{s}s"
    )


def main() -> None:
    """Entry point: click's own usage errors exit 2; unexpected errors exit 3 without a
    traceback unless GATE_DEBUG=1; SIGINT (Ctrl-C) and SIGTERM (CI's cancel) exit 130 and
    143 (gate check writes its reports first; gate.loop.interrupt), never a verdict's code."""
    from gate.loop import interrupt

    interrupt.install()
    if not sys.stderr.isatty():
        # tqdm reads this when first imported: no loading bars in CI logs
        os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        code = cli.main(
            standalone_mode=False
        )  # click's "Aborted!" (exit 1, a failed rule's code) is not for interrupts
    except (click.exceptions.Abort, KeyboardInterrupt):
        interrupt.caught()
        _err.print(
            f"gate: interrupted by {interrupt.name()}: nothing written; exit code {interrupt.exit_code()} "
            "(interrupted, not a verdict)",
            markup=False,
        )
        sys.exit(interrupt.exit_code())
    except click.exceptions.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except interrupt.OutOfTime as e:  # the run's guard takes it; one that escaped is a measurement not made
        _err.print(f"gate: error: {e}: nothing written (exit code 3)", markup=False)
        sys.exit(EXIT_MEASUREMENT)
    except Exception as e:  # noqa: BLE001
        if os.environ.get("GATE_DEBUG"):
            traceback.print_exc()
        _err.print(f"gate: internal error: {type(e).__name__}: {e} (set GATE_DEBUG=1 for the traceback)", markup=False)
        sys.exit(EXIT_MEASUREMENT)
    sys.exit(code if isinstance(code, int) else 0)
