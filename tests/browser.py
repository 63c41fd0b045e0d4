"""Drive headless Chromium over the DevTools protocol with the standard library only.

Chromium is started with `--remote-debugging-pipe`: it reads protocol messages from file
descriptor 3 and writes its own to descriptor 4, each a JSON object followed by a NUL byte
(https://chromedevtools.github.io/devtools-protocol/), so no websocket client is needed.
`find_chromium()` says where the browser is (None when it is not installed: Debian's
package `chromium`, see scripts/install-chromium.sh).

    with Browser() as b:
        page = b.load(Path("report.html"))      # console errors, exceptions, failed loads
        page.evaluate("document.title")
        page.screenshot(Path("shot.png"), width=1100)
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    """The Chromium executable: $GATE_CHROMIUM, else the first of CANDIDATES on PATH, else None."""
    given = os.environ.get("GATE_CHROMIUM")
    if given:
        return given if shutil.which(given) else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class BrowserError(RuntimeError):
    """The browser did not start, answered with an error, or did not answer in time."""


class Browser:
    """One headless Chromium process spoken to over a pipe. `timeout_s` bounds every wait."""

    def __init__(self, executable: str | None = None, timeout_s: float = 60.0) -> None:
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserError("chromium is not installed (scripts/install-chromium.sh installs Debian's package)")
        self.timeout_s = timeout_s
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._closed = False

    def __enter__(self) -> "Browser":
        self._profile = tempfile.TemporaryDirectory(prefix="gate-chromium-")
        to_browser_r, self._to_browser = os.pipe()  # the browser reads fd 3
        self._from_browser, from_browser_w = os.pipe()  # and writes fd 4
        # the browser's ends at fd >= 10, so the trampoline can put them at 3 and 4 without
        # clashing (after Python's own child set-up, whose fds are close-on-exec)
        r, w = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)
        args = [self.executable, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--mute-audio",
                "--hide-scrollbars", f"--user-data-dir={self._profile.name}", "about:blank"]
        self._stderr = tempfile.TemporaryFile()
        # a tiny Python trampoline (dash cannot redirect fds above 9): fds to 3 and 4, then exec
        hop = f"import os, sys; os.dup2({r}, 3); os.dup2({w}, 4); os.close({r}); os.close({w}); os.execvp(sys.argv[1], sys.argv[1:])"
        self.proc = subprocess.Popen([sys.executable, "-c", hop, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, pass_fds=(r, w), close_fds=True)
        to_browser_r, from_browser_w = r, w
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.send("Browser.getVersion")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close", timeout_s=10)
                except BrowserError:
                    pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._stderr.close()
            self._profile.cleanup()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self._cond:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self._events.append(msg)
                self._cond.notify_all()

    def stderr(self) -> str:
        """What the browser wrote on stderr so far (for failure messages)."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float | None = None) -> dict[str, Any]:
        """Call one protocol method and wait for its result. Raises BrowserError on an error reply."""
        with self._cond:
            self._next_id += 1
            msg_id = self._next_id
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._to_browser, data):]
        except OSError as e:
            raise BrowserError(f"{method}: the browser is gone ({e}); stderr:\n{self.stderr()}") from None
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with self._cond:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise BrowserError(f"{method}: no answer ({'browser exited' if self._closed else 'timed out'}); "
                                       f"stderr:\n{self.stderr()}")
                self._cond.wait(left)
            reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, session: str | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        """The first event `method` (of `session`) not yet waited for."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with self._cond:
            while True:
                for i, ev in enumerate(self._events):
                    if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                        ev["_seen"] = True
                        return ev.get("params", {})
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise BrowserError(f"no {method} event; stderr:\n{self.stderr()}")
                self._cond.wait(left)

    def events(self, session: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self._events if session is None or e.get("sessionId") == session]

    def load(self, path: Path, width: int = 1100, height: int = 900) -> "Page":
        """Open a new tab on the file at `path`, wait for its load event and return it."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        self.wait_event("Page.loadEventFired", session)
        return Page(self, session, width)


class Page:
    """One loaded tab."""

    def __init__(self, browser: Browser, session: str, width: int) -> None:
        self.browser, self.session, self.width = browser, session, width

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression. Raises BrowserError when it throws."""
        got = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=self.session)
        if "exceptionDetails" in got:
            raise BrowserError(f"{expression[:60]}...: {got['exceptionDetails']}")
        return got["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries and failed loads so far."""
        out = []
        for ev in self.browser.events(self.session):
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
            elif method == "Network.loadingFailed":
                out.append(f"load failed: {p.get('errorText')} ({p.get('type')})")
        return out

    def requests(self) -> list[str]:
        """Every URL the page asked for (the page itself included)."""
        return [ev["params"]["request"]["url"] for ev in self.browser.events(self.session)
                if ev.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path, full_page: bool = True, max_height: int | None = None) -> tuple[int, int]:
        """A PNG of the page (the whole page, or the first `max_height` CSS pixels). Returns (width, height)."""
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)")) if full_page else 900
        if max_height is not None:
            height = min(height, max_height)
        self.browser.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": height, "deviceScaleFactor": 1,
                                                                 "mobile": False}, session=self.session)
        shot = self.browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False}, session=self.session)
        Path(path).write_bytes(base64.b64decode(shot["data"]))
        return self.width, height

    def pdf(self, path: Path) -> int:
        """Print the page to PDF (A4, the print stylesheet applies). Returns the number of pages."""
        got = self.browser.send("Page.printToPDF", {"paperWidth": 8.27, "paperHeight": 11.69, "printBackground": False},
                                session=self.session)
        data = base64.b64decode(got["data"])
        Path(path).write_bytes(data)
        return len(re.findall(rb"/Type\s*/Page[^s]", data))


PLOTS_JS = """JSON.stringify(Array.from(document.querySelectorAll('[data-plot]')).map(f => {
  const svg = f.querySelector('svg'); const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return {name: f.dataset.plot, points: Number(f.dataset.points), svg: !!svg, width: r.width, height: r.height,
          shapes: svg ? svg.querySelectorAll('path, use, rect, line, polyline').length : 0,
          caption: (f.querySelector('figcaption') || {}).textContent || ''};
}))"""
