"""The dashboard in a real browser: `streamlit run dashboard/app.py` driven by headless Chromium
(``dashboard.browser``, the DevTools protocol over the ``websockets`` client Streamlit ships).

What is checked (the times are printed; their budgets, 5 s for a cold start, 3 s for a page
and 1 s for a widget, are targets of ``python -m dashboard.bench --browser``, not assertions
here, so that a busy test machine cannot fail a correct dashboard):

* **cold start**: launching ``python -m streamlit run`` opens the first page (``/``) on Explore
  at ``/explore``, its charts drawn and Streamlit idle, in a browser already open (its profile
  fresh: no cached page assets);
* **page by URL**: a full page load of ``/<page>`` into a running server, every page including
  the default one, with no error box, no "page not found" dialog, the right title, no internal
  vocabulary in the visible text, and no number of five digits or more without thousands
  separators in a table;
* **a widget change**: the step-through's *Next* button draws the next step;
* **play**: the step-through advances on its own after *Play*.

Skipped when no Chromium is installed (Debian: ``apt-get install -y chromium``).
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
pytest.importorskip("streamlit")
pytest.importorskip("websockets")

from dashboard import browser  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "fixture_results_synthetic.json"
# Words of the code that must not reach the screen (as tests/test_dashboard.py checks).
INTERNAL = re.compile(r"ioaware-numba|\bsim\b|flash_(fwd|bwd)|_v2\b|kernels_sha|\bq_block\b|"
                      r"\bk_block\b|(?<![\w.\d])-1(?![\d.])|\bissue\b|#\d{2,}|"
                      r"\b(fwd|bwd)\.[a-z]", re.IGNORECASE)
STEP_HEADING = ("(Array.from(document.querySelectorAll('h4')).map(h => h.innerText)"
                ".find(t => t.startsWith('Step ')) || '')")

if browser.chromium_path() is None:
    pytest.skip("chromium not installed (Debian: apt-get install -y chromium)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def malformed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("results") / "malformed.json"
    path.write_text('{"schema": "ioaware.results/1", "records": "not a list"}')
    return path


@pytest.fixture(scope="module")
def br():
    with browser.Browser(1280, 900) as b:
        b.tools.call("Page.navigate", url="about:blank")
        time.sleep(1.0)   # let Chromium finish starting: the cold start measures the app's
        yield b


@pytest.fixture(scope="module")
def app(br, malformed, tmp_path_factory):
    """The app started while the browser waits: yields ``(App, cold start Load)``."""
    env = {"IOAWARE_RESULTS": os.pathsep.join([str(FIXTURE), str(malformed)])}
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with browser.App(env=env, log=log) as a:
        a.wait_ready(timeout=60)
        want, marker = browser.PAGES["explore"]
        cold = br.load(a.url + "/", want, marker, since=a.started, timeout=60)
        yield a, cold


def test_cold_start_opens_explore(app, br):
    a, cold = app
    print(f"cold start: first page drawn {cold.seconds:.2f} s after launch")
    assert cold.state["title"] == "Explore"
    assert br.tools.evaluate("location.pathname") == "/explore"
    assert not cold.state["errors"]


@pytest.mark.parametrize("page", list(browser.PAGES))
def test_page_by_url(app, br, page):
    """Every page loads at its own URL, draws, shows no error and speaks plainly."""
    a, _ = app
    want, marker = browser.PAGES[page]
    load = br.load(f"{a.url}/{page}", want, marker)
    print(f"/{page}: drawn {load.seconds:.2f} s after navigation")
    assert load.state["title"] == browser.TITLES[page]
    assert not load.state["errors"]
    hits = sorted({m.group(0) for m in INTERNAL.finditer(br.visible_text())})
    assert not hits, f"/{page}: internal words on screen: {hits}"
    bare = [c for c in br.text('[data-testid="stTable"] td') if re.fullmatch(r"−?-?\d{5,}", c)]
    assert not bare, f"/{page}: numbers without separators in a table: {bare}"


def test_step_through_next_and_play(app, br):
    a, _ = app
    want, marker = browser.PAGES["step"]
    br.load(f"{a.url}/step", want, marker)
    assert br.tools.evaluate(STEP_HEADING).startswith("Step 1 of ")
    t0 = time.monotonic()
    br.click("button", text="Next")
    load = br.wait_until(f"{STEP_HEADING}.startsWith('Step 2 of')", want, marker, t0=t0)
    print(f"Next: step 2 drawn {load.seconds:.2f} s after the click")
    br.click("button", text="Play")
    br.wait_until(f"/^Step ([4-9]|[1-9][0-9]) of/.test({STEP_HEADING})", want, marker,
                  t0=time.monotonic(), timeout=15, settle=0.0)
    br.click("button", text="Pause")
    time.sleep(0.5)
    paused = br.tools.evaluate(STEP_HEADING)
    time.sleep(2.0)
    assert br.tools.evaluate(STEP_HEADING) == paused


def test_error_box_is_detected(app, br, malformed):
    """The probe does see Streamlit's error box: a malformed results file shows one, with its
    problem listed."""
    from urllib.parse import quote

    a, _ = app
    load = br.load(f"{a.url}/measured?results={quote(str(malformed))}", 0,
                   '[data-testid="stAlert"]', fail_on_error=False)
    assert any("not a valid results file" in e and "records" in e for e in load.state["errors"]), \
        json.dumps(load.state)
