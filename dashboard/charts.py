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
