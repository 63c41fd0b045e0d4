"""The HTML report in a real browser: headless Chromium (Debian's package; CI installs it
with scripts/install-chromium.sh) loads the page rendered from the example's report,
takes a screenshot, and the test checks there are no console errors or failed loads, no
request leaves the file, and every plot has data and a drawn SVG.

GATE_SCREENSHOT=PATH keeps the screenshot (docs/report-screenshot.png is made this way,
with GATE_SCREENSHOT_HEIGHT=1500 for the top of the page)."""

from __future__ import annotations

import gzip
import json
import os
import struct
from pathlib import Path

import pytest

from browser import PLOTS_JS, Browser, find_chromium
from gate.report.document import ADAPTER
from gate.report.html import HtmlReport

EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "smollm2-example-report.json.gz"

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="chromium is not installed (scripts/install-chromium.sh installs Debian's package)")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_example_page_in_headless_chromium(tmp_path):
    report = ADAPTER.validate_python(json.loads(gzip.decompress(EXAMPLE.read_bytes())))
    page_path = tmp_path / "gate-report.html"
    HtmlReport().write(report, page_path)
    shot = Path(os.environ.get("GATE_SCREENSHOT") or tmp_path / "screenshot.png")
    with Browser() as browser:
        page = browser.load(page_path, width=1100)
        plots = json.loads(page.evaluate(PLOTS_JS))
        height = os.environ.get("GATE_SCREENSHOT_HEIGHT")
        width, shot_height = page.screenshot(shot, max_height=int(height) if height else None)
        pages = page.pdf(tmp_path / "gate-report.pdf")
        errors = page.errors()
        requests = page.requests()
        title = page.evaluate("document.title")
        first = page.evaluate("document.querySelector('h1').textContent")
    assert errors == [], errors
    assert requests == [page_path.resolve().as_uri()], f"the page asked for more than itself: {requests}"
    assert title.startswith("gate: ") and first.startswith("gate: ")
    assert len(plots) >= 8, [p["name"] for p in plots]
    for p in plots:
        assert p["points"] > 0, p
        assert p["svg"] and p["width"] > 300 and p["height"] > 100, p  # rendered, not collapsed
        assert p["shapes"] >= 10, p  # axes, ticks and the data's marks were drawn
        assert p["caption"].strip(), p
    assert png_size(shot) == (width, shot_height)
    assert height or shot_height > 2000  # the whole page, every plot in it
    assert shot.stat().st_size > 20_000  # not a blank page
    assert pages >= 2 and (tmp_path / "gate-report.pdf").read_bytes().startswith(b"%PDF")  # printable
