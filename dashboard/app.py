"""Entry point of the ioaware dashboard: ``streamlit run dashboard/app.py``.

Registers the six pages (files in ``dashboard/views/``) with ``st.navigation``. The sidebar's
workload controls are drawn by the model pages themselves (``dashboard.ui.workload_sidebar``);
their values persist across pages (Streamlit keeps widget values per browser tab).
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

from dashboard import ui  # noqa: E402

VIEWS_DIR = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="ioaware: IO-aware attention", layout="wide")

pages = [
    st.Page(str(VIEWS_DIR / "explore.py"), title="Explore", url_path="explore", default=True),
    st.Page(str(VIEWS_DIR / "block_sizes.py"), title="Block sizes", url_path="block_sizes"),
    st.Page(str(VIEWS_DIR / "scaling.py"), title="Scaling", url_path="scaling"),
    st.Page(str(VIEWS_DIR / "measured.py"), title="Predicted vs measured", url_path="measured"),
    st.Page(str(VIEWS_DIR / "step.py"), title="Step through", url_path="step"),
    st.Page(str(VIEWS_DIR / "measure.py"), title="Measure", url_path="measure"),
]
page = st.navigation(pages)
ui.keep_workload_state()
page.run()
