"""One reader for saved gate JSON reports: the baseline (relative_to: baseline), the release
(target.release.report), gate compare, gate explain, gate report and gate roofline --report.

A saved report is what `gate check --json PATH` (or `gate exactness --json PATH`) wrote,
plain or gzip-compressed: the two are told apart by gzip's magic bytes, never by the name.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gate.core.errors import InputError, Problem
from gate.report.document import ADAPTER, FORMAT, Report

GZIP_MAGIC = b"\x1f\x8b"


def absent(path: Path) -> str | None:
    """Why `path` holds no saved report, as the end of a sentence naming it: "does not exist
    (gate check --json PATH writes one)" or "is a directory, not a report"; None for a file."""
    if path.is_file():
        return None
    if path.is_dir():
        return "is a directory, not a report"
    return f"does not exist (gate check --json {path} writes one)"


def read_data(path: Path, kind: str = "gate") -> dict[str, Any]:
    """The plain data of a saved gate JSON report (plain or gzip), its format checked, not the
    rest. Raises InputError naming the file when it is absent, unreadable or not such a
    report; `kind` words the message ("not a gate check JSON report")."""
    why = absent(path)
    if why is not None:
        raise InputError([Problem(str(path), "", None, f"the report {why}")])
    try:
        raw = path.read_bytes()
        if raw[:2] == GZIP_MAGIC:
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, gzip.BadGzipFile) as e:
        raise InputError([Problem(str(path), "", None, f"not a {kind} JSON report: {e}")]) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError([Problem(str(path), "format", None, f"not a {kind} JSON report (format {FORMAT!r} expected)")])
    return data


def as_report(path: Path, data: dict[str, Any]) -> Report:
    """The typed records of a report's plain data (read_data). Raises InputError at the first
    field that does not fit (file `path`, the field's dotted path)."""
    try:
        return ADAPTER.validate_python(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError([Problem(str(path), ".".join(str(x) for x in err["loc"]), None, err["msg"])]) from None


def read_report(path: Path) -> Report:
    """A saved gate JSON report (plain or gzip) as typed records. Raises InputError naming the file."""
    return as_report(path, read_data(path))
