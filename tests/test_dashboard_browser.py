"""The dashboard in a real browser: `streamlit run dashboard/app.py` driven by headless Chromium.

Chromium is driven through the DevTools protocol (its ``--remote-debugging-port``) with the
``websockets`` client that Streamlit already depends on, so no browser-automation package is
needed. For each page the test navigates, waits until every Plotly chart has drawn its SVG and
Streamlit has stopped running, fails on any exception box or error alert, and saves a screenshot
(to a temp dir, or to ``$IOAWARE_SCREENSHOT_DIR`` when set).

Skipped when no Chromium is installed (Debian: ``apt-get install -y chromium``).
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
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
pytest.importorskip("streamlit")
pytest.importorskip("websockets")

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "fixture_results_synthetic.json"
CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                             "/usr/bin/chromium", shutil.which("chromium-browser"))
                 if p and Path(p).exists()), None)

# url path -> (minimum number of Plotly charts the page draws with the fixture results loaded,
#              CSS selector of an element the finished page must contain)
PAGES = {
    "explore": (2, '[data-testid="stDataFrame"]'),
    "block_sizes": (1, '[data-testid="stDataFrame"]'),
    "scaling": (3, '[data-testid="stDataFrame"]'),
    "measured": (1, '[data-testid="stDataFrame"]'),
    "step": (3, '[data-testid="stDataFrame"]'),
    "measure": (0, '[data-testid="stAlert"]'),  # "no GPU" (or, on a GPU machine, the form)
}

# JavaScript evaluated in the page: how many charts drew, whether Streamlit is still running,
# and the text of any error box.
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
    drawn: q('.js-plotly-plot .main-svg').length > 0 ?
           q('.js-plotly-plot').filter(p => p.querySelector('.main-svg')).length : 0,
    marker: q(marker).length + q('[data-testid="stForm"]').length,
    running: q('[data-testid="stStatusWidget"]').some(w => /running|stop/i.test(w.innerText)) ||
             q('[data-testid="stSkeleton"]').length > 0,
    errors: errors,
  });
})"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class DevTools:
    """Minimal synchronous Chrome DevTools protocol client over one page target."""

    def __init__(self, ws_url: str):
        from contextlib import ExitStack

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
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")

    def close(self):
        self._stack.close()


@pytest.fixture(scope="module")
def malformed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("results") / "malformed.json"
    path.write_text('{"schema": "ioaware.results/1", "records": "not a list"}')
    return path


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, malformed):
    port = _free_port()
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, IOAWARE_RESULTS=os.pathsep.join([str(FIXTURE), str(malformed)]),
               PYTHONPATH=pythonpath)
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
             "--server.headless", "true", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/_stcore/health", timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _stop(proc):
    """Terminate a child process, killing it if it has not exited within 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
         "--window-size=1400,1800", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(_wait_http(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t.get("type") == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        tools.call("Page.enable")
        tools.call("Emulation.setDeviceMetricsOverride", width=1400, height=1800,
                   deviceScaleFactor=1, mobile=False)
        yield tools
        tools.close()
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def shot_dir(tmp_path_factory):
    path = os.environ.get("IOAWARE_SCREENSHOT_DIR")
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)
    return tmp_path_factory.mktemp("screenshots")


def _load(browser, url: str, want_plots: int, marker: str, *, fail_on_error: bool = True) -> dict:
    """Navigate and wait until the page has finished: marker present, Streamlit idle, at least
    ``want_plots`` Plotly charts all drawn, one second without change. Returns the last probe."""
    browser.call("Page.navigate", url=url)
    probe = f"{PROBE}({json.dumps(marker)})"
    deadline = time.monotonic() + 45
    stable, state = 0, {}
    while time.monotonic() < deadline:
        time.sleep(0.25)
        raw = browser.evaluate(probe)
        if not raw:
            continue
        state = json.loads(raw)
        if fail_on_error:
            assert not state["errors"], f"{url}: Streamlit error box: {state['errors']}"
        done = (state["app"] and state["main"] and state["marker"] and not state["running"]
                and state["plots"] >= want_plots and state["drawn"] == state["plots"])
        stable = stable + 1 if done else 0
        if stable >= 4:  # one second without change: the run has finished
            return state
    pytest.fail(f"{url}: page did not finish rendering: {state}")


@pytest.mark.parametrize("url_path", list(PAGES))
def test_page_renders_in_chromium(browser, app_url, shot_dir, url_path):
    """Every page loads, its Plotly charts draw, and no error box appears."""
    want, marker = PAGES[url_path]
    # the default page (Explore) lives at the app's root URL
    _load(browser, f"{app_url}/{'' if url_path == 'explore' else url_path}", want, marker)
    png = browser.call("Page.captureScreenshot", format="png")["data"]
    (shot_dir / f"{url_path}.png").write_bytes(base64.b64decode(png))
    final = json.loads(browser.evaluate(f"{PROBE}({json.dumps(marker)})"))
    assert not final["errors"], f"{url_path}: Streamlit error box: {final['errors']}"
    assert final["plots"] >= want


def test_error_box_is_detected(browser, app_url, malformed):
    """The probe above does see Streamlit's error box: a malformed results file shows one."""
    from urllib.parse import quote

    state = _load(browser, f"{app_url}/measured?results={quote(str(malformed))}", 0,
                  '[data-testid="stAlert"]', fail_on_error=False)
    assert any("not a valid results file" in e for e in state["errors"]), state
