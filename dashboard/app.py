"""Entry point of the ioaware dashboard: ``streamlit run dashboard/app.py``.

Registers the eight pages (files in ``dashboard/views/``) with ``st.navigation``, each at its own
URL (``/explore``, ``/block_sizes``, ``/scaling``, ``/measured``, ``/decode``, ``/hopper``, ``/step``,
``/measure``); the app's root URL opens *Explore*. The sidebar's workload controls are drawn by
the model pages themselves (``dashboard.ui.workload_sidebar``); their values persist across pages
(Streamlit keeps widget values per browser tab). *Decoding* draws its own decoding workload
(batch, query and KV heads, query rows, cache length, splits), kept while it is open; the GPU
profile and the rates are every page's.
"""
from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run dashboard/app.py` puts dashboard/ on sys.path, not the repository root; add the
# root so that `dashboard`, `sim`, `ioaware` and `kernels` import without an installed package.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

VIEWS_DIR = Path(__file__).resolve().parent / "views"

#: (file in views/, title, URL path) of the pages, in menu order.
PAGES = (
    ("explore.py", "Explore", "explore"),
    ("block_sizes.py", "Block sizes", "block_sizes"),
    ("scaling.py", "Scaling", "scaling"),
    ("measured.py", "Predicted vs measured", "measured"),
    ("decode.py", "Decoding", "decode"),
    ("hopper.py", "What asynchrony buys", "hopper"),
    ("step.py", "Step through", "step"),
    ("measure.py", "Measure", "measure"),
)

st.set_page_config(page_title="ioaware: IO-aware attention", layout="wide")

pages = [st.Page(str(VIEWS_DIR / f), title=t, url_path=u) for f, t, u in PAGES]


def _root():
    # Streamlit serves its default page at "/" only, so that every page can have a URL of its
    # own the default page is this hidden one, which opens Explore.
    st.switch_page(pages[0])


page = st.navigation([st.Page(_root, title="ioaware", url_path="home", default=True,
                              visibility="hidden")] + pages)
from dashboard import ui  # noqa: E402

ui.keep_workload_state()
page.run()
