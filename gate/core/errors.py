"""Errors that the CLI turns into one clear message and an exit code, never a traceback.

Exit codes (EXIT_CODES below, from which the docs' exit-code page is generated): 0 every
error-level rule passed, 1 a rule failed, 2 invalid policy, input or usage, 3 a measurement
could not be made; 130 and 143 interrupted.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_MEASUREMENT = 3
EXIT_SIGINT = 130  # 128 + the signal (gate.loop.interrupt.exit_code)
EXIT_SIGTERM = 143

# Every exit code gate returns and what it means: the one table the docs' exit-code page is
# generated from (each command's help says what the codes mean for it).
EXIT_CODES: dict[int, str] = {
    EXIT_PASS: "pass: every error-level rule passed (gate validate: the policy is valid)",
    EXIT_FAIL: "fail: an error-level rule failed (a warn-level one too with --fail-on-warn; an inconclusive "
    "verdict with measurement.inconclusive: fail or --fail-on-inconclusive)",
    EXIT_USAGE: "invalid policy, input or usage: every problem names the file, the YAML path and the line",
    EXIT_MEASUREMENT: "not decided: a measurement could not be made or is missing, or an error-level verdict is "
    "inconclusive with measurement.inconclusive: error (the default)",
    EXIT_SIGINT: "interrupted by SIGINT (Ctrl-C), not a verdict: gate check writes its reports with what was "
    "measured first",
    EXIT_SIGTERM: "interrupted by SIGTERM (a CI system's cancel), not a verdict: as for SIGINT",
}


class GateError(Exception):
    """Base class of errors reported to the user without a traceback."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file: where (file, YAML path, line) and what."""

    file: str
    path: str  # YAML path, e.g. "drafts.bf16.dtype" or "rules[2].threshold"; "" for the document
    line: int | None  # 1-based
    message: str

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line else "")
        if not self.path and self.file.startswith("-"):  # a command-line option, not a file: no document to name
            return f"{where}: {self.message}"
        return f"{where}: {self.path or '(document)'}: {self.message}"


class InputError(GateError):
    """Invalid policy or input file: every problem names the file, the YAML path and the line."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class PolicyValueError(GateError):
    """A policy value that turned out wrong when used (missing model file, prompt file,
    incompatible tokenizer). Raised with the YAML path; the caller adds file and line."""

    exit_code = EXIT_USAGE

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


def describe_error(e: BaseException) -> str:
    """A failure message for a report: the exception's type and text, plus where it was raised
    unless it names its own place (a served runner's error names runner and URL)."""
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = (
        f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
        if frame and not getattr(e, "names_its_place", False)
        else ""
    )
    return f"{type(e).__name__}: {e}{where}"
