"""The documentation site builds with `mkdocs build --strict` and no warning, as `make docs` and CI
build it, here with every link's #anchor checked too (mkdocs only logs a missing anchor by default),
and the reference pages hold what the hook generated from the code (scripts/docs_reference.py).

Needs the docs extra (`make docs` installs it: pip install -e '.[docs]'); skips, saying so, without it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.cli import cli

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocs_click") is None,
    reason="the docs extra is not installed (make docs installs it)",
)


def test_site_builds_strict_with_every_anchor_found(tmp_path: Path) -> None:
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        f"docs_dir: {ROOT / 'docs'}\n"
        f"hooks: [{ROOT / 'scripts' / 'docs_reference.py'}]\n"
        "validation: {anchors: warn}\n",
        encoding="utf-8",
    )
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or result.stderr[-4000:]

    reference = site / "reference"
    for page in ("policy", "cli", "metrics", "rule-kinds", "exit-codes", "reports"):
        html = (reference / page / "index.html").read_text(encoding="utf-8")
        assert "gate-reference:" not in html, f"reference/{page}.md: its marker was not replaced"
    cli_html = (reference / "cli" / "index.html").read_text(encoding="utf-8")
    for name in cli.commands:
        assert f'id="gate-{name}"' in cli_html, f"mkdocs-click rendered no section for gate {name}"
    assert "--fail-on-warn" in cli_html and "Sentinel" not in cli_html  # click's defaults as --help shows them
