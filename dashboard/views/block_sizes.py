"""Page 2 — Block sizes: the (block_q, block_k) plane of one workload, feasibility and optimum,
with measured points overlaid where results exist."""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures, fmt, ui

st.title("Block sizes")
st.caption("Every tile shape (queries × keys per tile) the model considers for the workload in "
           "the sidebar. Crossed-out cells do not fit: their tiles exceed the shared memory of a "
           "thread block, or no block fits on an SM. ★ marks the model's best; circles are "
           "measured runs of this project's CUDA-core kernel on the same workload, ◆ the "
           "fastest of them.")

ui.require_sim()
w = ui.workload_sidebar(show_density=False)
c1, c2, c3 = st.columns(3)
schedule = c1.selectbox("Schedule", ["flash2", "flash1"], key="bs_schedule",
                        format_func=data.schedule_label)
metric = c2.selectbox("Colour by", list(data.GRID_METRICS), key="bs_metric",
                      format_func=lambda k: data.GRID_METRICS[k])
choices = data.results_choices()
results_name = c3.selectbox("Measured runs from", ["(none)"] + choices,
                            index=1 if choices else 0, key="bs_results")

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
    st.info(f"`{results_name}` has no runs of this project's CUDA-core kernel for this workload "
            f"(N = {w['seq_len']:,}, d = {w['head_dim']}, {w['dtype']}, "
            f"{'causal' if w['causal'] else 'not causal'}, {data.PASS_LABELS[w['pass_']]}, "
            f"batch·heads = {w['batch'] * w['heads']:,}); nothing to overlay.")
    available = data.measured_workloads(results_name, schedule)
    if not available.empty:
        with st.expander("Workloads this file has runs for (set them in the sidebar)"):
            ui.table(available.assign(causal=available["causal"].astype(bool)),
                     "measured-workloads", columns={
                         "seq_len_q": fmt.Col("N", "count"), "head_dim": fmt.Col("d", "count"),
                         "dtype": fmt.Col("dtype"), "causal": fmt.Col("Causal", "bool"),
                         "pass": fmt.Col("Pass"), "batch": fmt.Col("Batch", "count"),
                         "heads": fmt.Col("Heads", "count"),
                         "block_sizes": fmt.Col("Tile shapes measured", "count")})

feasible = grid[grid["feasible"]]
if feasible.empty:
    st.warning("No tile shape fits this workload on this GPU profile.")
else:
    best = feasible.loc[feasible[metric].idxmin()]
    m = st.columns(3)
    m[0].metric("Model's best tile", f"{int(best['block_q'])} × {int(best['block_k'])}")
    m[1].metric(data.GRID_METRICS[metric].replace(" (ms)", "").replace(" (bytes)", ""),
                data.fmt_metric(metric, best[metric]))
    m[2].metric("Tile shapes that fit", f"{len(feasible)} of {len(grid)}")
    if measured is not None and not measured.empty:
        mbest = measured.loc[measured["time_ms"].idxmin()]
        st.caption(f"Measured fastest: {int(mbest['block_q'])} × {int(mbest['block_k'])} at "
                   f"{fmt.ms(mbest['time_ms'])} (the model's best tile measured at "
                   + data.measured_at(measured, best) + ").")

ui.chart(figures.block_heatmap(grid, metric, data.GRID_METRICS[metric], measured), "block-sizes")
ui.table(grid, "block-sizes-grid", columns=data.grid_columns())
