"""Page 5 — Step through: a schedule of a small problem, tile by tile, from ``sim.trace``; and the
online softmax of one query row as key blocks arrive."""
from __future__ import annotations

import streamlit as st

from dashboard import charts, data, figures, ui

st.title("Step through")
st.caption("A small attention problem walked one step at a time: which tiles of Q, K, V and O are "
           "on chip, and how many bytes have moved so far (from `sim.trace`, the same event "
           "trace the cost model counts). Below, one query row's online softmax as key blocks "
           "arrive.")

c = st.columns(6)
schedule = c[0].selectbox("Schedule", list(data.SCHEDULES)[::-1], key="st_schedule")
seq_len = c[1].selectbox("N", [16, 32, 64, 128, 256], index=2, key="st_seq_len")
head_dim = c[2].selectbox("d", [8, 16, 32, 64], index=1, key="st_head_dim")
block_q = c[3].selectbox("block_q", [8, 16, 32, 64], index=1, key="st_block_q")
block_k = c[4].selectbox("block_k", [8, 16, 32, 64], index=1, key="st_block_k")
causal = c[5].checkbox("Causal", key="st_causal")

# -- the schedule, step by step --------------------------------------------------------------
sim, sim_err = data.import_sim()
if sim is None:
    st.error(f"The cost model (`sim`) could not be imported, so the trace is unavailable: `{sim_err}`")
else:
    try:
        walk = data.trace_walk(schedule, seq_len, head_dim, block_q, block_k, causal)
    except ValueError as exc:
        st.warning(f"`sim.trace` rejected this problem: {exc}")
        walk = None
    if walk is not None:
        n_steps = len(walk["steps"])
        if st.session_state.get("st_step", 1) > n_steps:
            st.session_state["st_step"] = n_steps
        step = st.slider("Step", 1, max(2, n_steps), 1, key="st_step",
                         help="One step = one tile of work of one thread block (or its prologue "
                              "/ epilogue), with the loads and stores it issues; for naive, one "
                              "kernel's pass over whole tensors.") - 1
        step = min(step, n_steps - 1)
        walk, state, tiles_fig, bytes_fig = charts.step_view(schedule, seq_len, head_dim, block_q,
                                                             block_k, causal, step)
        m = st.columns(4)
        m[0].metric("Step", f"{step + 1} / {n_steps}")
        m[1].metric("Global bytes read so far", figures.fmt_bytes(state["read_bytes"]))
        m[2].metric("Global bytes written so far", figures.fmt_bytes(state["write_bytes"]))
        m[3].metric("Of total traffic", f"{state['fraction']:.0%}")
        left, right = st.columns([3, 2])
        with left:
            ui.chart(tiles_fig, "step-tiles")
        with right:
            ui.chart(bytes_fig, "step-bytes")
        st.caption(f"Events of step {step + 1}")
        ui.table(state["events"], "step-events", hide_index=True)

# -- the online softmax of one query row ---------------------------------------------------------
st.header("Online softmax of one query row")
row = st.slider("Query row", 0, seq_len - 1, min(seq_len - 1, seq_len // 2 + 1), key="st_row")
walk_row, ml_fig, out_fig, scores_fig = charts.online_softmax(seq_len, head_dim, block_k, row, causal)
st.caption(
    "Scores s = q·kᵀ/√d of the row arrive one key block at a time. After each block: "
    "m = max(m, max s), l = l·e^(m_old−m) + Σ e^(s−m), o = (o·l_old·e^(m_old−m) + Σ e^(s−m) v)/l. "
    "The output after the last block is exactly softmax(s)·V, without ever holding the whole row.")
c1, c2 = st.columns(2)
with c1:
    ui.chart(ml_fig, "online-softmax-m-l")
with c2:
    ui.chart(out_fig, "online-softmax-output")
ui.chart(scores_fig, "online-softmax-scores")
ui.table(walk_row["steps"], "online-softmax-steps", hide_index=True)
checks = walk_row["check"]
st.info("Final output against a materialised float64 softmax: max |error| = "
        f"{checks['max_abs_err_vs_exact_softmax']:.2e}"
        + (f"; `ioaware.tiled` (float32) for the same row: {checks['max_abs_err_ioaware_tiled_fp32']:.2e}"
           if "max_abs_err_ioaware_tiled_fp32" in checks else ""))
