"""Page 3 — Scaling: bytes, time and memory against N for the three schedules, with the papers'
asymptotic curves."""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures, ui

st.title("Scaling")
st.caption("How traffic, time and memory grow with the sequence length N (log-log). Dashed: "
           "the FlashAttention paper's bounds — standard attention moves Θ(Nd + N²) elements, "
           "FlashAttention Θ(N²d²/M) for on-chip memory M — drawn through the model's value at "
           "the smallest N so that the slopes can be compared.")

ui.require_sim()
w = ui.workload_sidebar()
lo, hi = st.select_slider("Range of N", options=ui.SEQ_LENS, value=(ui.SEQ_LENS[0], ui.SEQ_LENS[-1]),
                          key="sc_range")
if lo == hi:
    st.info("Pick a range with at least two sequence lengths.")
    st.stop()
seq_lens = tuple(n for n in ui.SEQ_LENS if lo <= n <= hi)
try:
    table, bounds = data.scaling(seq_lens=seq_lens, **{k: v for k, v in w.items() if k != "seq_len"})
except ValueError as exc:
    st.warning(f"The model rejected these inputs: {exc}")
    st.stop()

c1, c2 = st.columns(2)
with c1:
    ui.chart(figures.scaling_bytes(table, bounds), "scaling-bytes")
with c2:
    ui.chart(figures.scaling_time(table), "scaling-time")
ui.chart(figures.scaling_memory(table), "scaling-memory")
ui.table(table, "scaling", hide_index=True)
