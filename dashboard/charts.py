"""Figures and views cached per set of inputs (``st.cache_resource``: the same object is reused,
not copied), so that moving a control back to a value already seen redraws without rebuilding.

Builders take plain values; the data comes from `dashboard.data`, the drawing from
`dashboard.figures`. Cached objects are never mutated after they are built.
"""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures


@st.cache_resource(max_entries=512, show_spinner=False)
def step_figures(walk_key: tuple, step: int, row: int | None):
    """``(tile map, traffic per tensor)`` figures of one step of the walk ``data.step_walk(
    *walk_key)``, with the followed ``row`` (0-based) marked."""
    walk = data.step_walk(*walk_key)
    final = walk.tensor_table(walk.n_steps)
    xmax = float(max(final["times read"].max(), final["times written"].max(), 1.0))
    return (figures.tile_map(walk, step, row),
            figures.tensor_traffic(walk.tensor_table(step), xmax))


@st.cache_resource(max_entries=128, show_spinner=False)
def measured_view(digest: str, profile: str, l2: str, filters: tuple, _joined: dict):
    """``(view, summary, metrics)`` of the predicted-vs-measured page for one results file
    (``digest``), profile, L2 model (``l2``: which join ``_joined`` is) and filter choice
    (``((field, (values...)), ...)``); ``metrics``: ``{metric: label}`` of the metrics with both
    sides present in ``view``."""
    view = data.filter_records(_joined["records"], dict(filters))
    summary = data.compare_summary(view) if not view.empty else None
    metrics = {m: label for m, label in data.compared_metrics().items()
               if not view.empty and view[f"measured_{m}"].notna().any()
               and view[f"predicted_{m}"].notna().any()}
    return view, summary, metrics


@st.cache_resource(max_entries=256, show_spinner=False)
def measured_scatter(digest: str, profile: str, l2: str, filters: tuple, metric: str, label: str,
                     _view):
    """The predicted-against-measured scatter of one metric (cached like `measured_view`)."""
    return figures.predicted_vs_measured(_view, metric, label, data.FAMILY_LABELS)


@st.cache_resource(max_entries=256, show_spinner=False)
def tile_figure(key: tuple, _cells, _measured, pick, best, predicted_title: str,
                measured_title: str | None, title: str):
    """The block-size page's heatmaps (`figures.tile_heatmaps`) for one view, identified by
    ``key`` (the kernel, workload, profile, rates and measured file it shows)."""
    return figures.tile_heatmaps(_cells, _measured, pick=pick, best=best,
                                 predicted_title=predicted_title, measured_title=measured_title,
                                 title=title)


@st.cache_resource(max_entries=128, show_spinner=False)
def error_figure(digest: str, profile: str, l2: str, filters: tuple, _points):
    """The predicted time's error against N (`figures.error_against_n`), cached like
    `measured_view`."""
    return figures.error_against_n(_points, data.FAMILY_LABELS)


@st.cache_resource(max_entries=128, show_spinner=False)
def measured_roofline(digest: str, model: str, l2: str, filters: tuple, profile: str, _points):
    """The measured records' roofline (`figures.measured_roofline`) under ``profile``'s
    datasheet bound, cached like `measured_view`."""
    return figures.measured_roofline(_points, data.roofline_ceilings(profile), data.FAMILY_LABELS)
