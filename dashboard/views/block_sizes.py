"""Page 2 — Block sizes: the (block_q, block_k) plane of one workload, feasibility and optimum,
with measured points overlaid where results exist."""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures, ui

st.title("Block sizes")
st.caption("Every (block_q, block_k) pair the model considers for the workload in the sidebar. "
           "Crossed-out cells do not fit: their tiles exceed shared memory per block, or they "
           "leave too few blocks resident per SM. ★ marks the predicted optimum; circles are "
           "measured runs of our kernel on the same workload, ◆ the measured optimum.")

ui.require_sim()
w = ui.workload_sidebar(show_density=False)
c1, c2, c3 = st.columns(3)
schedule = c1.selectbox("Schedule", ["flash2", "flash1"], key="bs_schedule")
metric = c2.selectbox("Colour by", list(data.GRID_METRICS), key="bs_metric",
                      format_func=lambda k: data.GRID_METRICS[k])
results_name = c3.selectbox("Measured overlay from", ["(none)"] + data.results_choices(),
                            index=1 if data.results_choices() else 0, key="bs_results")

try:
    grid = data.block_grid(schedule=schedule, **w)
except ValueError as exc:
    st.warning(f"The model rejected these inputs: {exc}")
    st.stop()

measured = None
if results_name != "(none)":
    try:
        measured = data.measured_blocks(results_name, schedule=schedule, **w)
    except data.format_error_types() as exc:
        st.warning(f"Could not read `{results_name}` for the overlay: {exc}")
if measured is not None and measured.empty:
    st.info(f"`{results_name}` has no runs of our kernel for this workload "
            f"(N={w['seq_len']}, d={w['head_dim']}, {w['dtype']}, "
            f"{'causal' if w['causal'] else 'non-causal'}, {w['pass_']}, "
            f"batch·heads={w['batch'] * w['heads']}); nothing to overlay.")
    available = data.measured_workloads(results_name, schedule)
    if not available.empty:
        with st.expander("Workloads this file has runs for (set them in the sidebar)"):
            ui.table(available, "measured-workloads", hide_index=True)

feasible = grid[grid["feasible"]]
if feasible.empty:
    st.warning("No block size is feasible for this workload on this GPU profile.")
else:
    best = feasible.loc[feasible[metric].idxmin()]
    m = st.columns(3)
    m[0].metric("Predicted optimum", f"{int(best['block_q'])} × {int(best['block_k'])}")
    m[1].metric(data.GRID_METRICS[metric], data.fmt_metric(metric, best[metric]))
    m[2].metric("Feasible cells", f"{len(feasible)} / {len(grid)}")
    if measured is not None and not measured.empty:
        mbest = measured.loc[measured["time_ms"].idxmin()]
        st.caption(f"Measured optimum: {int(mbest['block_q'])} × {int(mbest['block_k'])} at "
                   f"{mbest['time_ms']:.3g} ms (predicted optimum measured at "
                   + data.measured_at(measured, best) + ").")

ui.chart(figures.block_heatmap(grid, metric, data.GRID_METRICS[metric], measured), "block-sizes")
ui.table(grid, "block-sizes-grid", hide_index=True)
