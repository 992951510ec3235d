"""Figures cached per set of inputs (``st.cache_resource``: the same Figure object is reused,
not copied), so that moving a control back to a value already seen redraws without rebuilding.

Builders take plain values; the data comes from `dashboard.data`, the drawing from
`dashboard.figures`. Figures are never mutated after they are built.
"""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures


@st.cache_resource(max_entries=512, show_spinner=False)
def step_view(schedule: str, seq_len: int, head_dim: int, block_q: int, block_k: int,
              causal: bool, step: int):
    """``(walk, state, tile-map figure, bytes-so-far figure)`` of one step of a trace."""
    walk = data.trace_walk(schedule, seq_len, head_dim, block_q, block_k, causal)
    state = data.trace_state(walk, step)
    return walk, state, figures.tile_map(walk, state), figures.cumulative_bytes(walk, step)


@st.cache_resource(max_entries=256, show_spinner=False)
def online_softmax(seq_len: int, head_dim: int, block_k: int, row: int, causal: bool):
    """``(walk, m/l figure, output figure, scores figure)`` of one query row's online softmax."""
    walk = data.online_softmax_walk(seq_len, head_dim, block_k, row, causal)
    return (walk, figures.softmax_state(walk), figures.softmax_output(walk),
            figures.softmax_scores(walk, block_k))


@st.cache_resource(max_entries=128, show_spinner=False)
def measured_view(digest: str, profile: str, l2: str, filters: tuple, _records: list):
    """``(joined, view, summary, metrics)`` of the predicted-vs-measured page for one results
    file (``digest``), profile, L2 model and filter choice (``((field, (values...)), ...)``);
    ``metrics``: ``{metric: label}`` of the metrics with both sides present in ``view``."""
    joined = data.compare_measured(digest, profile, l2, _records=_records)
    view = data.filter_records(joined["records"], dict(filters))
    summary = data.compare_summary(view) if not view.empty else None
    metrics = {m: label for m, label in data.compared_metrics().items()
               if not view.empty and view[f"measured_{m}"].notna().any()
               and view[f"predicted_{m}"].notna().any()}
    return joined, view, summary, metrics


@st.cache_resource(max_entries=256, show_spinner=False)
def measured_scatter(digest: str, profile: str, l2: str, filters: tuple, metric: str, label: str,
                     _view):
    """The predicted-against-measured scatter of one metric (cached like `measured_view`)."""
    return figures.predicted_vs_measured(_view, metric, label)
