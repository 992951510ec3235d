"""The dashboard in headless Chromium: start ``streamlit run dashboard/app.py``, open its pages,
wait until each has finished drawing, time it and take screenshots.

Used by ``python -m dashboard.screenshots`` and by ``tests/test_dashboard_browser.py``. Chromium
is driven through the DevTools protocol (``--remote-debugging-port``) with the ``websockets``
client that Streamlit already depends on, so no browser-automation package is needed.

A page has *finished* when Streamlit's app and main block are in the DOM, the page's marker
element is there, Streamlit reports no script running and no skeleton, and every Plotly chart on
the page has drawn its SVG. Its load time is measured from the navigation (or, for the first
page, from the start of the server process) to the first probe that sees it finished; the probe
then checks that nothing changes for ``settle`` more seconds (not counted).
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"

#: url path -> (minimum number of Plotly charts the page draws at its default state, CSS
#: selector of an element the finished page must contain). The default page is served at "/"
#: and at its own path.
_TABLE = '[data-testid="stTable"], [data-testid="stDataFrame"]'
PAGES = {
    "explore": (2, _TABLE),
    "block_sizes": (1, _TABLE),
    "scaling": (3, _TABLE),
    "measured": (1, _TABLE),
    "decode": (2, _TABLE),
    "hopper": (2, _TABLE),
    "step": (3, '[data-testid="stExpander"]'),
    "measure": (0, '[data-testid="stAlert"]'),  # "no GPU" (or, on a GPU machine, the form)
}

#: url path -> the page's title (its h1).
TITLES = {"explore": "Explore", "block_sizes": "Block sizes", "scaling": "Scaling",
          "measured": "Predicted vs measured", "decode": "Decoding",
          "hopper": "What asynchrony buys", "step": "Step through", "measure": "Measure"}

# Evaluated in the page: how many charts drew, whether Streamlit is still running, the text of
# any error box, and the page's own "not found" dialog.
PROBE = """
((marker) => {
  const q = (s) => Array.from(document.querySelectorAll(s));
  const errors = q('[data-testid="stException"]').map(e => 'exception: ' + e.innerText)
    .concat(q('[data-testid="stAlertContentError"]').map(e => 'error: ' + e.innerText))
    .concat(q('[role="dialog"]').filter(e => /not found|error/i.test(e.innerText))
            .map(e => 'dialog: ' + e.innerText));
  return JSON.stringify({
    app: q('[data-testid="stApp"]').length,
    main: q('[data-testid="stMain"] [data-testid="stVerticalBlock"]').length,
    plots: q('.js-plotly-plot').length,
    drawn: q('.js-plotly-plot').filter(p => p.querySelector('.main-svg')).length,
    marker: q(marker).length + q('[data-testid="stForm"]').length,
    running: q('[data-testid="stStatusWidget"]').some(w => /running|stop/i.test(w.innerText)) ||
             q('[data-testid="stSkeleton"]').length > 0,
    title: (q('h1')[0] || {}).innerText || '',
    errors: errors,
  });
})"""


def chromium_path() -> str | None:
    """The Chromium executable (``$CHROMIUM``, ``chromium``, ``chromium-browser``), or None."""
    for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
              shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if p and Path(p).exists():
            return p
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> str:
    """GET ``url`` until it answers (at most ``timeout`` seconds); return the body."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    """Terminate a child process, killing it if it has not exited within 10 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class App:
    """``streamlit run dashboard/app.py`` on a free local port, headless; ``started`` is the
    ``time.monotonic()`` at which the process was launched."""

    def __init__(self, env: dict | None = None, log: Path | None = None, script: Path = APP):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        full_env = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
        self._log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(script),
             "--server.headless", "true", "--server.port", str(self.port),
             "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none"],
            cwd=Path(script).resolve().parent.parent, env=full_env, stdout=self._log,
            stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> float:
        """Wait for the server's health endpoint; seconds since launch."""
        wait_http(f"{self.url}/_stcore/health", timeout)
        return time.monotonic() - self.started

    def close(self) -> None:
        stop(self.proc)
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DevTools:
    """A minimal synchronous Chrome DevTools protocol client over one page target."""

    def __init__(self, ws_url: str):
        from websockets.sync.client import connect

        self._stack = ExitStack()
        self.ws = self._stack.enter_context(connect(ws_url, max_size=64 * 2**20, open_timeout=10))
        self.ids = itertools.count(1)

    def call(self, method: str, timeout: float = 20, **params):
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)
        return res.get("result", {}).get("value")

    def close(self) -> None:
        self._stack.close()


class PageNotFinished(AssertionError):
    """A page did not finish drawing in time, or showed an error box."""


@dataclass
class Load:
    """One page load: ``seconds`` to finished, the final probe ``state``."""

    url: str
    seconds: float
    state: dict = field(default_factory=dict)


class Browser:
    """Headless Chromium with one page, ``width`` × ``height`` CSS pixels."""

    def __init__(self, width: int = 1400, height: int = 1800, executable: str | None = None):
        exe = executable or chromium_path()
        if exe is None:
            raise FileNotFoundError("chromium not found (Debian: apt-get install -y chromium)")
        self._tmp = tempfile.TemporaryDirectory(prefix="ioaware-chromium-",
                                                ignore_cleanup_errors=True)
        profile = Path(self._tmp.name)
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            targets = json.loads(wait_http(f"http://127.0.0.1:{port}/json/list", timeout=10))
            page = next(t for t in targets if t.get("type") == "page")
            self.tools = DevTools(page["webSocketDebuggerUrl"])
            self.tools.call("Page.enable")
            self.resize(width, height)
        except BaseException:
            self.close()
            raise

    def resize(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=False)

    def probe(self, marker: str = "body") -> dict:
        raw = self.tools.evaluate(f"{PROBE}({json.dumps(marker)})")
        return json.loads(raw) if raw else {}

    def load(self, url: str, want_plots: int = 0, marker: str = "body", *, since: float | None = None,
             timeout: float = 60, settle: float = 1.0, fail_on_error: bool = True) -> Load:
        """Navigate to ``url`` and wait until the page has finished (see the module docstring).
        ``since``: the ``time.monotonic()`` the load time counts from (default: now)."""
        t0 = time.monotonic() if since is None else since
        self.tools.call("Page.navigate", url=url)
        return self.wait(url, want_plots, marker, t0=t0, timeout=timeout, settle=settle,
                         fail_on_error=fail_on_error)

    def wait(self, url: str, want_plots: int = 0, marker: str = "body", *, t0: float,
             timeout: float = 60, settle: float = 1.0, fail_on_error: bool = True,
             min_wait: float = 0.0) -> Load:
        """Wait until the current page has finished; the time counts from ``t0``."""
        deadline = time.monotonic() + timeout
        first_done, state = None, {}
        while time.monotonic() < deadline:
            try:
                state = self.probe(marker)
            except RuntimeError:  # the page is navigating: no execution context yet
                state = {}
            now = time.monotonic()
            if state:
                if fail_on_error and state["errors"]:
                    raise PageNotFinished(f"{url}: Streamlit error box: {state['errors']}")
                done = (state["app"] and state["main"] and state["marker"]
                        and not state["running"] and state["plots"] >= want_plots
                        and state["drawn"] == state["plots"] and now - t0 >= min_wait)
                if done and first_done is None:
                    first_done = now
                elif not done:
                    first_done = None
                if first_done is not None and now - first_done >= settle:
                    return Load(url, first_done - t0, state)
            time.sleep(0.05)
        raise PageNotFinished(f"{url}: page did not finish rendering in {timeout:.0f} s: {state}")

    def click(self, selector: str, index: int = 0, text: str | None = None) -> None:
        """Click the ``index``-th element matching ``selector`` (whose text contains ``text``,
        if given) with a JS ``click()``."""
        ok = self.tools.evaluate(
            f"(() => {{ const all = Array.from(document.querySelectorAll({json.dumps(selector)}))"
            f".filter(e => {json.dumps(text)} === null || e.innerText.includes({json.dumps(text)}));"
            f" const e = all[{index}]; if (!e) return false; e.click(); return true; }})()")
        if not ok:
            raise LookupError(f"no element {selector!r}[{index}]" + (f" with {text!r}" if text else ""))

    def text(self, selector: str) -> list[str]:
        """innerText of every element matching ``selector``."""
        raw = self.tools.evaluate(f"JSON.stringify(Array.from(document.querySelectorAll("
                                  f"{json.dumps(selector)})).map(e => e.innerText))")
        return json.loads(raw) if raw else []

    def wait_until(self, predicate: str, want_plots: int = 0, marker: str = "body", *,
                   t0: float, timeout: float = 30, settle: float = 0.5) -> Load:
        """After an interaction: wait until the JS expression ``predicate`` is true and the page
        has finished again (as :meth:`wait`); the time counts from ``t0``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.tools.evaluate(f"Boolean({predicate})"):
                break
            time.sleep(0.02)
        else:
            raise PageNotFinished(f"{predicate} did not become true in {timeout:.0f} s")
        return self.wait("(interaction)", want_plots, marker, t0=t0, timeout=timeout, settle=settle)

    def visible_text(self) -> str:
        """The text a reader sees on the page (``innerText``: not what collapsed expanders or
        hidden elements hold)."""
        return self.tools.evaluate("document.body.innerText") or ""

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        """Save a PNG of the viewport (or of the whole page) to ``path``."""
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        png = self.tools.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(png))
        return path

    def close(self) -> None:
        tools = getattr(self, "tools", None)
        if tools is not None:
            tools.close()
        stop(self.proc)
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def page_url(app_url: str, url_path: str) -> str:
    return f"{app_url}/{url_path}"
