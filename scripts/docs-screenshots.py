"""The docs' screenshot of the HTML report, made from a real run, never by hand (`make docs-screenshots`).

By default it runs the embedded default (`gate check examples/smollm2/policy.yaml --html ...`, about
5 minutes on 2 CPU cores) and photographs the page it writes; with --report it renders a saved JSON
report instead (`gate report REPORT --html ...`, seconds). Headless Chromium (Debian's package:
scripts/install-chromium.sh; driven as tests/browser.py drives it for tests/e2e/test_html_browser.py)
loads the page, and the top of it (--height CSS pixels, 1100 wide) is written to --out
(docs/report-screenshot.png). The page must load without a console error or a failed load, and
ask for nothing but itself.

    .venv/bin/python scripts/docs-screenshots.py                       # a fresh run
    .venv/bin/python scripts/docs-screenshots.py --report out/gate-report.json

Exit 0 when the screenshot is written; 1 when gate wrote no page, the browser is missing or the
page is broken (saying why).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser import Browser, BrowserError, find_chromium  # noqa: E402  (tests/browser.py)

DEFAULT_POLICY = "examples/smollm2/policy.yaml"


def gate(*args: str) -> int:
    """Run gate (this interpreter's) from the repository root; its exit code."""
    command = [sys.executable, "-m", "gate", *args]
    print("+ gate " + " ".join(args), flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def html_page(report: Path | None, policy: str, work: Path) -> Path:
    """The HTML report to photograph: rendered from `report`, or written by a fresh gate check."""
    page = work / "gate-report.html"
    if report is not None:
        code = gate("report", str(report), "--html", str(page))
        if code != 0:
            sys.exit(f"docs-screenshots: gate report exited {code}: no page to photograph")
        return page
    # a verdict (0 pass, 1 fail, 3 not decided) still writes the page; 2 is bad input, >= 128 interrupted
    code = gate(
        "check",
        policy,
        "--html",
        str(page),
        "--json",
        str(work / "gate-report.json"),
        "--junit",
        str(work / "gate-junit.xml"),
        "--no-progress",
    )
    if code == 2 or code >= 128 or not page.exists():
        sys.exit(f"docs-screenshots: gate check exited {code} without a report page")
    return page


def verdict_line(report: Path | None, work: Path) -> str:
    """What the photographed run said (for the log): its status counts and exit code."""
    path = report if report is not None else work / "gate-report.json"
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        return f"{data.get('created_utc')}: {data.get('status_counts')}, exit code {data.get('exit_code')}"
    except (OSError, ValueError) as e:
        return f"(could not read {path}: {e})"


def screenshot(page_path: Path, out: Path, width: int, height: int) -> tuple[int, int]:
    """Photograph the top `height` CSS pixels of the page at `page_path` into `out`. Raises
    BrowserError when the page logs an error or asks for anything but itself."""
    with Browser() as browser:
        page = browser.load(page_path, width=width)
        out.parent.mkdir(parents=True, exist_ok=True)
        size = page.screenshot(out, max_height=height)
        errors = page.errors()
        requests = page.requests()
    if errors:
        raise BrowserError(f"the page logged errors: {errors}")
    if requests != [page_path.resolve().as_uri()]:
        raise BrowserError(f"the page asked for more than itself: {requests}")
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="a saved gate JSON report (.json or .json.gz) instead of a run")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help=f"the policy to run (default {DEFAULT_POLICY})")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report-screenshot.png")
    parser.add_argument("--width", type=int, default=1100, help="page width in CSS pixels (default 1100)")
    parser.add_argument("--height", type=int, default=1500, help="the top of the page kept (default 1500)")
    args = parser.parse_args(argv)
    if find_chromium() is None:
        print("docs-screenshots: chromium is not installed (scripts/install-chromium.sh)", file=sys.stderr)
        return 1
    report = args.report.resolve() if args.report else None
    with tempfile.TemporaryDirectory(prefix="gate-docs-screenshots-") as tmp:
        work = Path(tmp)
        page = html_page(report, args.policy, work)
        try:
            width, height = screenshot(page, args.out, args.width, args.height)
        except BrowserError as e:
            print(f"docs-screenshots: {e}", file=sys.stderr)
            return 1
        print(f"wrote {args.out} ({width}x{height}) of the run {verdict_line(report, work)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
