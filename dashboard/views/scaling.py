"""Page 3 — Scaling: bytes, time and memory against N for the three schedules, with the papers'
asymptotic curves."""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures, fmt, ui

st.title("Scaling")
st.caption("How traffic, time and memory grow with the sequence length N (log-log). Dashed: "
           "the FlashAttention paper's bounds — standard attention moves Θ(Nd + N²) elements, "
           "FlashAttention Θ(N²d²/M) for on-chip memory M — drawn through the model's value at "
           "the smallest N so that the slopes can be compared. The sidebar's N is marked on "
           "every chart.")

ui.require_sim()
w = ui.workload_sidebar(seq_len_help="Marked on the charts and compared below; the range of N "
                                     "drawn is chosen above the charts.")
lo, hi = st.select_slider("Range of N drawn", options=ui.SEQ_LENS,
                          value=(ui.SEQ_LENS[0], ui.SEQ_LENS[-1]), key="sc_range",
                          format_func=lambda n: f"{n:,}")
if lo == hi:
    st.info("Pick a range with at least two sequence lengths.")
    st.stop()
seq_lens = tuple(n for n in ui.SEQ_LENS if lo <= n <= hi)
try:
    table, bounds = data.scaling(seq_lens=seq_lens, **{k: v for k, v in w.items() if k != "seq_len"})
except ValueError as exc:
    st.warning(f"The model rejected these inputs: {exc}")
    st.stop()

n = w["seq_len"]
if lo <= n <= hi:
    at = table[table["seq_len"] == n].set_index("schedule")
    naive, flash2 = at.loc["naive"], at.loc["flash2"]
    st.markdown(f"At the sidebar's **N = {n:,}**, FlashAttention-2 against standard attention")
    m = st.columns(3)
    m[0].metric("Global memory", fmt.bytes_(flash2["global_bytes"]),
                delta=f"{fmt.ratio(naive['global_bytes'] / flash2['global_bytes'])} less",
                delta_color="off")
    m[1].metric(data.ROOFLINE, fmt.ms(flash2["predicted_ms"]),
                delta=f"{fmt.ratio(naive['predicted_ms'] / flash2['predicted_ms'])} faster",
                delta_color="off")
    m[2].metric("Memory beyond Q, K, V, O", fmt.bytes_(flash2["extra_memory_bytes"]),
                delta=f"standard attention: {fmt.bytes_(naive['extra_memory_bytes'])}",
                delta_color="off")
    mark = n
else:
    st.info(f"The sidebar's N = {n:,} is outside the range drawn ({lo:,} to {hi:,}).")
    mark = None

c1, c2 = st.columns(2)
with c1:
    ui.chart(figures.scaling_bytes(table, bounds, mark), "scaling-bytes")
with c2:
    ui.chart(figures.scaling_time(table, mark), "scaling-time")
ui.chart(figures.scaling_memory(table, mark), "scaling-memory")
ui.table(table.assign(schedule=table["schedule"].map(data.schedule_label)), "scaling",
         columns=data.scaling_columns())
