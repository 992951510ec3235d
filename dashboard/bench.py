"""Page-update latency of the dashboard: through Streamlit's testing API, and in Chromium.

    python -m dashboard.bench [--rounds 3] [--pages explore scaling ...] [--json out.json]
    python -m dashboard.bench --browser [--rounds 3]

For each page the benchmark opens the app (``AppTest``), then replays a fixed list of user
interactions (the controls a user touches on that page: N, d, causal, dtype, GPU profile, the
kernel on Block sizes, the step slider, ...) ``--rounds`` times. Each interaction's time is the
wall time of ``AppTest.run()`` — the whole script rerun, model calls and figure building
included (the browser's drawing is not). The first round meets cold caches; later rounds hit
``st.cache_data``, as a user going back and forth does. The table reports p50 / p95 / max per
page over all interactions, and p95 of the cold round and of the warm rounds separately,
against the 300 ms target.

Results files: the synthetic test fixture (tests/data/) is offered so that the measured-data
pages have something to draw; set ``IOAWARE_RESULTS`` to benchmark with your own.

``--browser`` measures what a reader waits for, in headless Chromium (``dashboard.browser``),
with the results files the repository ships: per round a fresh server and a fresh browser
profile; the *cold start* from launching ``streamlit run`` to the first page (``/``) drawn, then
each page opened by its URL (a full page load), each page opened from the sidebar menu, and on
*Step through* the *Next* button and one step of *Play*. Medians over the rounds, each beside
its target (`BROWSER_TARGETS_S`: a cold start within 5 s, a page within 3 s, a widget change
within 1 s).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
FIXTURE = ROOT / "tests" / "data" / "fixture_results_synthetic.json"
TARGET_MS = 300.0
#: What a reader should wait at most in a browser (``--browser``), seconds.
BROWSER_TARGETS_S = {"cold_start": 5.0, "page": 3.0, "widget": 1.0}

# page -> list of (widget kind, key, value) interactions, replayed in order
INTERACTIONS = {
    "explore": [("select_slider", "w_seq_len", 1024), ("select_slider", "w_seq_len", 16384),
                ("select_slider", "w_head_dim", 128), ("checkbox", "w_causal", True),
                ("selectbox", "w_dtype", "bf16"), ("selectbox", "w_profile", "a100-80gb"),
                ("slider", "w_density", 0.5), ("selectbox", "w_pass", "fwd+bwd"),
                ("selectbox", "w_profile", "h100"), ("checkbox", "w_causal", False),
                ("select_slider", "w_head_dim", 64), ("select_slider", "w_seq_len", 4096)],
    "block_sizes": [("selectbox", "bs_group", "1"), ("selectbox", "bs_group", "2"),
                    ("selectbox", "w_profile", "h200"), ("selectbox", "w_profile", "h100"),
                    ("selectbox", "bs_family", "tf32/fwd"), ("selectbox", "w_dtype", "fp32"),
                    ("select_slider", "w_seq_len", 16384), ("selectbox", "bs_family", "mma/fwd"),
                    ("selectbox", "w_dtype", "fp16"), ("selectbox", "bs_group", "0")],
    "scaling": [("select_slider", "w_head_dim", 128), ("checkbox", "w_causal", True),
                ("selectbox", "w_dtype", "fp32"), ("select_slider", "sc_range", (512, 8192)),
                ("select_slider", "sc_range", (128, 65536)), ("checkbox", "w_causal", False),
                ("selectbox", "w_dtype", "fp16"), ("select_slider", "w_head_dim", 64),
                ("selectbox", "w_pass", "fwd+bwd"), ("select_slider", "w_seq_len", 1024),
                ("selectbox", "w_pass", "fwd"), ("select_slider", "w_seq_len", 4096)],
    "measured": [("multiselect", "pm_family", ["ioaware-numba"]), ("multiselect", "pm_dtype", ["fp16"]),
                 ("selectbox", "pm_profile", "h200"), ("selectbox", "pm_profile", "h100"),
                 ("radio", "pm_metric", "time_raw"), ("radio", "pm_metric", "global_bytes"),
                 ("multiselect", "pm_dtype", None), ("multiselect", "pm_family", None)],
    "step": [("button", "st_play", None), ("run", None, None), ("run", None, None),
             ("button", "st_play", None), ("button", "st_next", None), ("button", "st_back", None),
             ("slider", "st_step", 10), ("number_input", "st_row", 20),
             ("radio", "st_direction", "backward"), ("slider", "st_step", 12),
             ("selectbox", "st_schedule", "flash1"), ("checkbox", "st_causal", True),
             ("selectbox", "st_seq_len", 128), ("selectbox", "st_seq_len", 64),
             ("checkbox", "st_causal", False), ("selectbox", "st_schedule", "flash2"),
             ("radio", "st_direction", "forward"), ("number_input", "st_row", 5),
             ("button", "st_first", None)],
    "measure": [],
}


def _open(page: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=300).run()
    if page != "explore":
        at.switch_page(f"views/{page}.py").run()
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception}")
    return at


def _apply(at, kind, key, value, defaults):
    if kind == "run":          # a rerun with no change (a timer tick of the step-through)
        return
    widget = getattr(at, kind)(key=key)
    if kind == "button":
        widget.click()
        return
    defaults.setdefault(key, widget.value)
    if value is None:  # restore what the page started with
        value = defaults[key]
    if kind == "checkbox":
        widget.check() if value else widget.uncheck()
    else:
        widget.set_value(value)


def bench_page(page: str, rounds: int) -> dict:
    """Time every interaction of ``page`` over ``rounds`` rounds; return the latencies (ms)."""
    t0 = time.perf_counter()
    at = _open(page)
    open_ms = (time.perf_counter() - t0) * 1e3
    steps = INTERACTIONS[page] or [(None, None, None)]
    per_round: list[list[float]] = []
    defaults: dict = {}
    for _ in range(rounds):
        times = []
        for kind, key, value in steps:
            if kind is not None:
                _apply(at, kind, key, value, defaults)
            t = time.perf_counter()
            at.run()
            times.append((time.perf_counter() - t) * 1e3)
            if at.exception:
                raise RuntimeError(f"{page} after {key}={value!r}: {at.exception}")
        per_round.append(times)
    return {"page": page, "open_ms": open_ms, "rounds": per_round}


def summarise(res: dict) -> dict:
    all_ms = np.concatenate([np.asarray(r) for r in res["rounds"]])
    cold = np.asarray(res["rounds"][0])
    warm = np.concatenate([np.asarray(r) for r in res["rounds"][1:]]) if len(res["rounds"]) > 1 else cold
    return {"page": res["page"], "updates": int(all_ms.size), "first_load_ms": res["open_ms"],
            "p50_ms": float(np.percentile(all_ms, 50)), "p95_ms": float(np.percentile(all_ms, 95)),
            "max_ms": float(all_ms.max()), "cold_p95_ms": float(np.percentile(cold, 95)),
            "warm_p95_ms": float(np.percentile(warm, 95))}


def browser_bench(rounds: int) -> dict:
    """The ``--browser`` measurements (seconds): ``{"cold_start": [...], "url": {page: [...]},
    "menu": {page: [...]}, "step_next": [...], "step_play": [...]}``."""
    from dashboard import browser

    out = {"cold_start": [], "url": {}, "menu": {}, "step_next": [], "step_play": []}
    pages = list(browser.PAGES)
    for r in range(rounds):
        print(f"[browser round {r + 1}/{rounds}]", file=sys.stderr, flush=True)
        with browser.Browser(1280, 900) as br, browser.App() as app:
            app.wait_ready()
            want, marker = browser.PAGES["explore"]
            out["cold_start"].append(br.load(app.url + "/", want, marker, since=app.started).seconds)
            for page in pages:
                want, marker = browser.PAGES[page]
                out["url"].setdefault(page, []).append(br.load(f"{app.url}/{page}", want, marker).seconds)
            for page in pages[1:] + pages[:1]:
                want, marker = browser.PAGES[page]
                t0 = time.monotonic()
                br.click(f'[data-testid="stSidebarNavLink"][href$="/{page}"]')
                out["menu"].setdefault(page, []).append(br.wait_until(
                    f"(document.querySelector('h1') || {{}}).innerText === "
                    f"{json.dumps(browser.TITLES[page])}", want, marker, t0=t0).seconds)
            want, marker = browser.PAGES["step"]
            br.load(f"{app.url}/step", want, marker)
            t0 = time.monotonic()
            br.click("button", text="Next")
            out["step_next"].append(br.wait_until(
                "Array.from(document.querySelectorAll('h4')).some(h => h.innerText.startsWith('Step 2 of'))",
                want, marker, t0=t0).seconds)
            br.click("button", text="Play")
            t0 = time.monotonic()
            out["step_play"].append(br.wait_until(
                "Array.from(document.querySelectorAll('h4')).some(h => /^Step [4-9]/.test(h.innerText))",
                want, marker, t0=t0, settle=0.0).seconds)
    return out


def _print_browser(res: dict) -> None:
    med = lambda xs: float(np.median(xs))  # noqa: E731
    tgt = BROWSER_TARGETS_S
    cold = med(res["cold_start"])
    print(f"cold start (launch -> first page drawn): median {cold:.2f} s, target {tgt['cold_start']:.0f} s "
          f"({cold / tgt['cold_start']:.2f} of it; rounds: {', '.join(f'{x:.2f}' for x in res['cold_start'])})")
    print(f"{'page':<12} {'by URL':>8} {'from menu':>10}   (target {tgt['page']:.0f} s)")
    for page in res["url"]:
        worst = max(med(res["url"][page]), med(res["menu"][page]))
        print(f"{page:<12} {med(res['url'][page]):>7.2f}s {med(res['menu'][page]):>9.2f}s"
              f"{'   over target' if worst > tgt['page'] else ''}")
    nxt = med(res["step_next"])
    print(f"step-through: Next -> step drawn {nxt:.2f} s (target {tgt['widget']:.0f} s: "
          f"{nxt / tgt['widget']:.2f} of it); Play -> two more steps drawn "
          f"{med(res['step_play']):.2f} s (at 1 step/s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="replays of each page's interactions (default 3)")
    ap.add_argument("--pages", nargs="+", default=list(INTERACTIONS), choices=list(INTERACTIONS))
    ap.add_argument("--json", type=Path, help="also write the summary as JSON here")
    ap.add_argument("--browser", action="store_true",
                    help="measure in headless Chromium instead (cold start, page loads, clicks)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if args.browser:
        res = browser_bench(args.rounds)
        _print_browser(res)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return 0
    os.environ.setdefault("IOAWARE_RESULTS", str(FIXTURE))

    rows = []
    for i, page in enumerate(args.pages, 1):
        print(f"[{i}/{len(args.pages)}] {page} ...", file=sys.stderr, flush=True)
        rows.append(summarise(bench_page(page, args.rounds)))
    head = f"{'page':<12} {'updates':>7} {'first load':>10} {'p50':>8} {'p95':>8} {'max':>8} " \
           f"{'cold p95':>9} {'warm p95':>9} {'p95/target':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['page']:<12} {r['updates']:>7} {r['first_load_ms']:>8.0f}ms {r['p50_ms']:>6.0f}ms "
              f"{r['p95_ms']:>6.0f}ms {r['max_ms']:>6.0f}ms {r['cold_p95_ms']:>7.0f}ms "
              f"{r['warm_p95_ms']:>7.0f}ms {r['p95_ms'] / TARGET_MS:>10.2f}")
    print(f"(times in ms of AppTest.run(), target p95 < {TARGET_MS:.0f} ms; "
          f"{args.rounds} rounds, first round with cold caches)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
