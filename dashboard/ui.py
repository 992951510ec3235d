"""Layout pieces shared by the dashboard's pages: the workload sidebar, charts and tables with
their download buttons, and the guard that explains a missing `sim` instead of a traceback.

Nothing here computes model numbers; that is `dashboard.data` (and `sim` underneath).
"""
from __future__ import annotations

import importlib.util
import re

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import data

__all__ = ["workload_sidebar", "chart", "table", "require_sim", "slug"]

_HAS_KALEIDO = importlib.util.find_spec("kaleido") is not None

# Sequence lengths offered by the N slider (powers of two, the usual sweep points).
SEQ_LENS = [2**k for k in range(7, 17)]  # 128 .. 65536
HEAD_DIMS = [32, 64, 96, 128, 256]
DTYPES = ["fp16", "bf16", "fp32"]
PASSES = ["fwd", "bwd", "fwd+bwd"]

# Widget keys of the sidebar controls, with their defaults. Values persist across pages.
WORKLOAD_DEFAULTS = {
    "w_seq_len": 4096,
    "w_head_dim": 64,
    "w_batch": 1,
    "w_heads": 16,
    "w_dtype": "fp16",
    "w_pass": "fwd",
    "w_causal": False,
    "w_density": 1.0,
    "w_profile": None,  # filled with the first sim profile (h100 when present)
    "w_l2": "analytic",
}


def slug(text: str) -> str:
    """File-name-safe form of ``text`` (``"Block sizes: time"`` -> ``"block-sizes-time"``)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "figure"


def require_sim():
    """Return the imported ``sim`` module, or show why it is unavailable and stop the page."""
    sim, err = data.import_sim()
    if sim is None:
        st.error(
            "The cost model (`sim`) could not be imported, so this page has nothing to show.\n\n"
            f"`{err}`\n\nInstall the project (`pip install -e \".[dashboard]\"`) from the "
            "repository root and start the app from there."
        )
        st.stop()
    return sim


def _keep_state(keys) -> None:
    # A widget's value is dropped from st.session_state on a run where the widget is not drawn
    # (e.g. on a page without the sidebar); re-assigning it keeps it across page switches.
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def keep_workload_state() -> None:
    """Keep the sidebar's workload values alive on pages that do not draw the sidebar."""
    _keep_state(list(WORKLOAD_DEFAULTS) + list(data.CUSTOM_PROFILE_FIELDS_KEYS))


def workload_sidebar(*, show_pass: bool = True, show_density: bool = True) -> dict:
    """Draw the workload and GPU-profile controls in the sidebar; return the chosen values.

    The returned dict is plain and hashable-friendly (ints, floats, strings, and the custom
    profile as a tuple of ``(field, value)`` pairs) so it can key ``st.cache_data``.
    """
    profiles = data.profile_names()
    for key, default in WORKLOAD_DEFAULTS.items():
        if key not in st.session_state:
            st.session_state[key] = default
    if st.session_state["w_profile"] not in profiles + [data.CUSTOM]:
        st.session_state["w_profile"] = data.default_profile_name()

    sb = st.sidebar
    sb.header("Workload")
    sb.select_slider("Sequence length N", options=SEQ_LENS, key="w_seq_len")
    sb.select_slider("Head dim d", options=HEAD_DIMS, key="w_head_dim")
    c1, c2 = sb.columns(2)
    c1.number_input("Batch", min_value=1, max_value=512, step=1, key="w_batch")
    c2.number_input("Heads", min_value=1, max_value=256, step=1, key="w_heads")
    c1, c2 = sb.columns(2)
    c1.selectbox("dtype", DTYPES, key="w_dtype")
    if show_pass:
        c2.selectbox("Pass", PASSES, key="w_pass")
    sb.checkbox("Causal", key="w_causal")
    if show_density:
        sb.slider("Block-mask density", min_value=0.05, max_value=1.0, step=0.05, key="w_density",
                  help="Fraction of (Q block, K block) tiles computed (block-sparse attention). "
                       "1.0 = dense.")
    sb.header("GPU")
    sb.selectbox("Profile", profiles + [data.CUSTOM], key="w_profile",
                 format_func=data.profile_label)
    custom = None
    if st.session_state["w_profile"] == data.CUSTOM:
        custom = _custom_profile_inputs(sb)
    return {
        "seq_len": int(st.session_state["w_seq_len"]),
        "head_dim": int(st.session_state["w_head_dim"]),
        "batch": int(st.session_state["w_batch"]),
        "heads": int(st.session_state["w_heads"]),
        "dtype": st.session_state["w_dtype"],
        "pass_": st.session_state["w_pass"] if show_pass else "fwd",
        "causal": bool(st.session_state["w_causal"]),
        "density": float(st.session_state["w_density"]) if show_density else 1.0,
        "profile": st.session_state["w_profile"],
        "custom": custom,
    }


def _custom_profile_inputs(container) -> tuple:
    """Number inputs for a user-given GPU; returns ``((field, value), ...)`` in sim's units."""
    with container.expander("Custom GPU", expanded=True):
        values = []
        for field in data.CUSTOM_PROFILE_FIELDS:
            key = "w_custom_" + field.name
            if key not in st.session_state:
                st.session_state[key] = field.default
            st.number_input(f"{field.label} ({field.unit})", min_value=field.minimum,
                            step=field.step, key=key, help=field.help)
            values.append((field.name, float(st.session_state[key])))
    return tuple(values)


def chart(fig: go.Figure, name: str, *, key: str | None = None) -> None:
    """Show a Plotly figure with a download button (self-contained HTML; PNG if kaleido is
    installed). The figure's own toolbar also saves a PNG in the browser."""
    key = key or slug(name)
    st.plotly_chart(fig, key=f"chart-{key}", config={"displaylogo": False,
                                                      "toImageButtonOptions": {"filename": key}})
    with st.container(horizontal=True):
        st.download_button(
            "Download chart (HTML)",
            data=lambda fig=fig: fig.to_html(include_plotlyjs=True, full_html=True),
            file_name=f"{key}.html", mime="text/html", key=f"dl-html-{key}", on_click="ignore",
        )
        if _HAS_KALEIDO:
            st.download_button(
                "Download chart (PNG)", data=lambda fig=fig: fig.to_image(format="png", scale=2),
                file_name=f"{key}.png", mime="image/png", key=f"dl-png-{key}", on_click="ignore",
            )


def table(df: pd.DataFrame, name: str, *, key: str | None = None, **kwargs) -> None:
    """Show a table with a CSV download button."""
    key = key or slug(name)
    st.dataframe(df, key=f"table-{key}", **kwargs)
    st.download_button(
        "Download table (CSV)", data=lambda df=df: df.to_csv(index=False), file_name=f"{key}.csv",
        mime="text/csv", key=f"dl-csv-{key}", on_click="ignore",
    )
