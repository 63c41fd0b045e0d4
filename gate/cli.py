"""The `gate` command: parses arguments, wires implementations, prints. No logic of its own.

Exit codes: 0 every error-level rule passed; 1 a rule failed; 2 invalid policy, input or
usage; 3 a measurement could not be made.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from gate import __version__
from gate.errors import EXIT_MEASUREMENT, EXIT_USAGE, GateError

if TYPE_CHECKING:
    from gate.check import CheckResult

# emoji=False: a path like "/ci/:cat:/policy.yaml" must print as written
_err = Console(stderr=True, highlight=False, emoji=False)


def _fail(exc: GateError) -> None:
    _err.print(f"gate: error: {exc}", markup=False, soft_wrap=True)
    sys.exit(exc.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gate")
def cli() -> None:
    """Release gate for speculative-decoding drafts: measure overlap, verified-prefix
    behaviour, latency and the resource bill against a non-speculative fallback, and
    check them against a YAML policy."""


@cli.command()
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
def validate(policy: Path) -> None:
    """Check a policy file without running models (exit 0 valid, 2 invalid)."""
    from gate.check import validate as do_validate

    try:
        loaded = do_validate(policy)
    except GateError as e:
        _fail(e)
    p = loaded.policy
    click.echo(f"{policy}: valid (version {p.version}; {len(p.drafts)} drafts, {len(p.laws)} laws, {len(p.rules)} rules)")


@cli.command()
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("gate-junit.xml"),
              show_default=True, help="Where to write the JUnit XML report.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("gate-report.json"),
              show_default=True, help="Where to write the JSON report (every raw measurement).")
@click.option("--fail-on-warn", is_flag=True, help="Exit 1 when a warn-level rule is violated.")
@click.option("--no-progress", is_flag=True, help="No progress bars (they are off anyway when stderr is not a terminal).")
@click.option("--no-warmup", is_flag=True, help="Skip the untimed warm-up request per runner.")
def check(policy: Path, junit_path: Path, json_path: Path, fail_on_warn: bool, no_progress: bool, no_warmup: bool) -> None:
    """Measure every draft in POLICY, evaluate every rule, write JUnit and JSON.

    Exit 0 when every error-level rule passes, 1 when a rule fails, 2 for an invalid
    policy or input, 3 when a measurement could not be made."""
    from gate.check import check as do_check

    show = not no_progress and _err.is_terminal
    try:
        with _progress(show) as progress:
            result = do_check(policy, progress=progress, fail_on_warn=fail_on_warn, warmup=not no_warmup)
    except GateError as e:
        _fail(e)
    _write_and_exit(result, json_path, junit_path)


def _write_and_exit(result: "CheckResult", json_path: Path, junit_path: Path) -> None:
    """Write the JSON and JUnit reports, print the console summary, exit with the gate's code."""
    from gate.report.console import ConsoleReport
    from gate.report.json import JsonReport
    from gate.report.junit import JunitReport

    for fmt, path in ((JsonReport(), json_path), (JunitReport(), junit_path)):
        try:
            fmt.write(result.report, path)
        except OSError as e:
            _err.print(f"gate: error: cannot write the {fmt.name} report to {path}: {e.strerror or e}", markup=False)
            sys.exit(EXIT_USAGE)
    out = Console(highlight=False, emoji=False)
    if not out.is_terminal:
        out = Console(highlight=False, emoji=False, width=160)
    ConsoleReport().print(result.report, out)
    click.echo(f"reports: {json_path} {junit_path}")
    sys.exit(result.exit_code)


@cli.command()
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("samples", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("gate-exactness-junit.xml"),
              show_default=True, help="Where to write the JUnit XML report.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("gate-exactness.json"),
              show_default=True, help="Where to write the JSON report.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the PIT randomisation.")
def exactness(policy: Path, samples: Path, junit_path: Path, json_path: Path, seed: int) -> None:
    """Test recorded SAMPLES (JSONL of prompt_ids, output_ids, law) against the target law of
    POLICY, with the policy's exactness rules (or the defaults: significance 0.01, power 0.9,
    detect_tv 0.1). Exit 0 pass, 1 fail, 2 bad input, 3 inconclusive or not measured."""
    from gate.samples import check_samples

    try:
        result = check_samples(policy, samples, seed)
    except GateError as e:
        _fail(e)
    _write_and_exit(result, json_path, junit_path)


@cli.command()
@click.option("--report", "which", flag_value="report", help="The JSON report's schema instead of the policy's.")
@click.option("--samples", "which", flag_value="samples", help="The schema of one line of a `gate exactness` samples file.")
@click.option("--policy", "which", flag_value="policy", default=True, help="The policy's schema (default).")
def schema(which: str) -> None:
    """Print the JSON Schema of the policy (or of the JSON report, or of a samples line)."""
    if which == "report":
        from gate.report.document import report_schema

        doc = report_schema()
    elif which == "samples":
        from gate.samples import samples_schema

        doc = samples_schema()
    else:
        from gate.policy.schema import policy_schema

        doc = policy_schema()
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


class _progress:
    """rich progress bars for the phases of a run, or a no-op callback."""

    def __init__(self, show: bool):
        self.show = show

    def __enter__(self):  # type: ignore[no-untyped-def]
        if not self.show:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=_err)
        self._bar.__enter__()
        self._tasks: dict[str, int] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in self._tasks:
                self._tasks[phase] = self._bar.add_task(phase, total=total)
            self._bar.update(self._tasks[phase], completed=done, total=total)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.show:
            self._bar.__exit__(*exc)


def main() -> None:
    """Entry point: click's own usage errors exit 2; unexpected errors exit 3 without a
    traceback unless GATE_DEBUG=1."""
    if not sys.stderr.isatty():
        # tqdm reads this when first imported: no loading bars in CI logs
        os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        cli.main(standalone_mode=True)
    except KeyboardInterrupt:
        _err.print("gate: interrupted")
        sys.exit(130)
    except Exception as e:  # noqa: BLE001
        if os.environ.get("GATE_DEBUG"):
            traceback.print_exc()
        _err.print(f"gate: internal error: {type(e).__name__}: {e} (set GATE_DEBUG=1 for the traceback)", markup=False)
        sys.exit(EXIT_MEASUREMENT)

