"""Screenshots of every dashboard page at its default state, taken in headless Chromium.

    python -m dashboard.screenshots [--out docs/screenshots] [--width 1280] [--height 900]

Starts ``streamlit run dashboard/app.py`` on a free local port (with the results files the
repository ships, or those ``$IOAWARE_RESULTS`` names), opens each page by its URL, waits until
it has finished drawing (``dashboard.browser``), fails on any error box, and saves the viewport
as ``<out>/<page>.png`` (PNG, optimised with Pillow when it is installed). Prints how long each
page took: the first from the start of the server (a cold start), the others from navigation.
Needs Chromium (Debian: ``apt-get install -y chromium``, or ``$CHROMIUM``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dashboard import browser

ROOT = Path(__file__).resolve().parent.parent


def optimise_png(path: Path, colours: int | None = 256) -> None:
    """Rewrite a PNG smaller: palette of ``colours`` (None: keep full colour), maximal
    compression. Does nothing without Pillow."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        im = im.convert("RGB")
        if colours:
            im = im.quantize(colors=colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        im.save(path, optimize=True)


def take(out: Path, width: int = 1280, height: int = 900, pages=None, colours: int | None = 256,
         log: Path | None = None) -> list[tuple[str, float, Path]]:
    """Screenshot ``pages`` (default: all) into ``out``; returns ``[(page, seconds, path)]``."""
    pages = list(pages or browser.PAGES)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with browser.Browser(width, height) as br, browser.App(log=log) as app:
        app.wait_ready()
        since = app.started
        for page in pages:
            want, marker = browser.PAGES[page]
            load = br.load(f"{app.url}/{page}", want, marker, since=since, timeout=120)
            br.tools.evaluate("window.scrollTo(0, 0)")
            path = br.screenshot(out / f"{page}.png")
            optimise_png(path, colours)
            rows.append((page, load.seconds, path))
            since = None
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots",
                    help="folder for the PNGs (default: docs/screenshots)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--pages", nargs="+", choices=list(browser.PAGES), default=list(browser.PAGES))
    ap.add_argument("--colours", type=int, default=256,
                    help="palette size of the saved PNGs (0: full colour)")
    ap.add_argument("--log", type=Path, help="write the server's output here")
    args = ap.parse_args(argv)
    if browser.chromium_path() is None:
        ap.error("chromium not found (Debian: apt-get install -y chromium; or set $CHROMIUM)")
    rows = take(args.out, args.width, args.height, args.pages, args.colours or None, args.log)
    for i, (page, seconds, path) in enumerate(rows):
        what = "from server start" if i == 0 else "from navigation"
        print(f"{page:<12} {seconds:6.2f} s ({what})  {path} ({path.stat().st_size / 1e3:,.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
