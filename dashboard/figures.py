"""Plotly figures of the dashboard, built from the DataFrames of `dashboard.data` (no Streamlit).

Each function returns a ``plotly.graph_objects.Figure``; the pages show them with
``dashboard.ui.chart`` (which adds the download buttons).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

SCHEDULE_COLORS = {"naive": "#d62728", "flash1": "#ff7f0e", "flash2": "#1f77b4"}
# No per-figure template: applying one deep-copies it on every figure (~50 ms each); in the app
# Streamlit's own chart theme styles the figures, and downloads use Plotly's default look.


def fmt_bytes(n: float) -> str:
    """Human-readable bytes (powers of 1000, as bandwidth figures are quoted)."""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n:.2f} PB"


def _layout(fig: go.Figure, title: str, height: int = 380, **kwargs) -> go.Figure:
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=height,
                      margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.2),
                      **kwargs)
    return fig


# ------------------------------------------------------------------------------------------------
# Online softmax (page 5)
# ------------------------------------------------------------------------------------------------
def softmax_state(walk: dict) -> go.Figure:
    """Running max m and running sum l after each key block."""
    steps = walk["steps"]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=steps["key_block"], y=steps["block_max"], name="max of block",
                             mode="markers", marker=dict(symbol="x", size=9, color="#999")))
    fig.add_trace(go.Scatter(x=steps["key_block"], y=steps["m"], name="running max m",
                             mode="lines+markers", line=dict(shape="hv")))
    fig.add_trace(go.Scatter(x=steps["key_block"], y=steps["l"], name="running sum l",
                             mode="lines+markers"), secondary_y=True)
    fig.update_xaxes(title="key block arrived", dtick=1)
    fig.update_yaxes(title="m (score units)", secondary_y=False)
    fig.update_yaxes(title="l = Σ exp(s − m)", secondary_y=True)
    return _layout(fig, "Running max and sum")


def softmax_output(walk: dict, max_dims: int = 8) -> go.Figure:
    """The normalised output o = acc / l after each key block (first ``max_dims`` dims)."""
    out = walk["output"]
    fig = go.Figure()
    for dim in sorted(out["dim"].unique())[:max_dims]:
        sel = out[out["dim"] == dim]
        fig.add_trace(go.Scatter(x=sel["key_block"], y=sel["o"], mode="lines+markers",
                                 name=f"o[{dim}]"))
    fig.update_xaxes(title="key block arrived", dtick=1)
    fig.update_yaxes(title="output so far")
    return _layout(fig, "Output o after each key block")


def softmax_scores(walk: dict, block_k: int) -> go.Figure:
    """Scores of the row coloured by key block, with the final softmax probabilities."""
    sc = walk["scores"]
    vis = sc[sc["visible"]]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=vis["key"], y=vis["score"], name="score s",
                         marker=dict(color=(vis["key"] // block_k) % 2, colorscale=[[0, "#9ecae1"], [1, "#3182bd"]])))
    fig.add_trace(go.Scatter(x=vis["key"], y=vis["p_final"], name="softmax p", mode="lines",
                             line=dict(color="#d62728")), secondary_y=True)
    fig.update_layout(shapes=[dict(type="line", x0=edge - 0.5, x1=edge - 0.5, y0=0, y1=1,
                                   yref="paper", line=dict(color="#bbb", dash="dot", width=1))
                              for edge in range(block_k, int(vis["key"].max()) + 1, block_k)])
    fig.update_xaxes(title="key index (alternating shades = key blocks)")
    fig.update_yaxes(title="s", secondary_y=False)
    fig.update_yaxes(title="p", secondary_y=True)
    return _layout(fig, "Scores of the row, one key block at a time", height=320)


# ------------------------------------------------------------------------------------------------
# Explore (page 1)
# ------------------------------------------------------------------------------------------------
def schedule_bytes(table: pd.DataFrame) -> go.Figure:
    """Global-memory and DRAM bytes read/written by each schedule (log scale)."""
    fig = go.Figure()
    parts = [("hbm_read_bytes", "global read", "#6baed6"), ("hbm_write_bytes", "global write", "#2171b5"),
             ("dram_read_bytes", "DRAM read", "#fd8d3c"), ("dram_write_bytes", "DRAM write", "#d94701")]
    for col, name, color in parts:
        fig.add_trace(go.Bar(x=table["schedule"], y=table[col], name=name, marker_color=color,
                             hovertemplate="%{x}: %{y:.4s}B<extra>" + name + "</extra>"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log", title="bytes")
    return _layout(fig, "Bytes moved: global memory and DRAM")


def roofline(table: pd.DataFrame, ceilings: dict) -> go.Figure:
    """Each schedule at (FLOP per DRAM byte, FLOP/s implied by its predicted time) against the
    profile's DRAM-bandwidth and compute ceilings; hollow markers use global-memory bytes."""
    bw, peak, fp32 = ceilings["dram_bandwidth"], ceilings["matmul_peak"], ceilings["fp32_peak"]
    xs = np.concatenate([table["intensity_dram"], table["intensity_global"]])
    lo = max(1e-3, min(xs.min() / 4, peak / bw / 100))
    hi = max(xs.max() * 4, peak / bw * 10)
    x = np.geomspace(lo, hi, 200)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * bw) / 1e12, mode="lines",
                             name=f"matmul {peak / 1e12:.0f} TFLOP/s",
                             line=dict(color="#444")))
    fig.add_trace(go.Scatter(x=x, y=np.minimum(fp32, x * bw) / 1e12, mode="lines",
                             name=f"fp32 {fp32 / 1e12:.0f} TFLOP/s",
                             line=dict(color="#999", dash="dash")))
    l2 = ceilings.get("l2_bandwidth") or 0.0
    if l2 > 0:
        fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * l2) / 1e12, mode="lines",
                                 name=f"L2 {l2 / 1e12:.0f} TB/s (est.)",
                                 line=dict(color="#444", dash="dot")))
    for _, r in table.iterrows():
        color = SCHEDULE_COLORS.get(r["schedule"], "#333")
        y = r["achieved_flops"] / 1e12
        fig.add_trace(go.Scatter(x=[r["intensity_dram"]], y=[y], mode="markers+text",
                                 text=[r["schedule"]], textposition="top center",
                                 marker=dict(size=13, color=color), name=r["schedule"],
                                 hovertemplate="%{x:.3g} FLOP/B, %{y:.3g} TFLOP/s"))
        fig.add_trace(go.Scatter(x=[r["intensity_global"]], y=[y], mode="markers",
                                 marker=dict(size=11, color="white", line=dict(color=color, width=2)),
                                 name=f"{r['schedule']} (global bytes)", showlegend=False,
                                 hovertemplate="%{x:.3g} FLOP/B, %{y:.3g} TFLOP/s"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="hollow: per global byte",
                             marker=dict(size=11, color="white", line=dict(color="#333", width=2))))
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title="TFLOP/s (FLOPs / predicted time)")
    return _layout(fig, f"Roofline: {ceilings['name']}, DRAM {bw / 1e9:,.0f} GB/s", height=420)


# ------------------------------------------------------------------------------------------------
# Block sizes (page 2)
# ------------------------------------------------------------------------------------------------
def block_heatmap(grid: pd.DataFrame, metric: str, label: str,
                  measured: pd.DataFrame | None = None) -> go.Figure:
    """Heatmap of ``metric`` over (block_k, block_q); infeasible cells crossed, optimum starred,
    measured points circled with their time, the measured optimum as a diamond."""
    bqs = sorted(grid["block_q"].unique())
    bks = sorted(grid["block_k"].unique())
    z = grid.pivot(index="block_q", columns="block_k", values=metric).loc[bqs, bks]
    ok = grid.pivot(index="block_q", columns="block_k", values="feasible").loc[bqs, bks]
    why = grid.pivot(index="block_q", columns="block_k", values="why").loc[bqs, bks]
    xs, ys = [str(b) for b in bks], [str(b) for b in bqs]
    shown = z.where(ok.astype(bool))
    fig = go.Figure(go.Heatmap(
        x=xs, y=ys, z=np.log10(shown.to_numpy(dtype=float)), customdata=z.to_numpy(dtype=float),
        colorscale="Viridis_r", colorbar=dict(title=f"log10<br>{label}"),
        hovertemplate="block_q %{y}, block_k %{x}<br>" + label + ": %{customdata:.4g}<extra></extra>"))
    bad = [(x, y, why.loc[int(y), int(x)]) for y in ys for x in xs if not ok.loc[int(y), int(x)]]
    if bad:
        fig.add_trace(go.Scatter(x=[b[0] for b in bad], y=[b[1] for b in bad], mode="markers",
                                 marker=dict(symbol="x-thin", size=26, line=dict(width=2, color="#888")),
                                 name="infeasible", text=[b[2] for b in bad],
                                 hovertemplate="infeasible: %{text}<extra></extra>"))
    feas = grid[grid["feasible"]]
    if not feas.empty:
        best = feas.loc[feas[metric].idxmin()]
        fig.add_trace(go.Scatter(x=[str(int(best["block_k"]))], y=[str(int(best["block_q"]))],
                                 mode="markers", name="predicted optimum",
                                 marker=dict(symbol="star", size=24, color="white",
                                             line=dict(color="black", width=2))))
    if measured is not None and not measured.empty:
        fig.add_trace(go.Scatter(
            x=measured["block_k"].astype(str), y=measured["block_q"].astype(str), mode="markers+text",
            text=[f"{t:.3g} ms" for t in measured["time_ms"]], textposition="bottom center",
            textfont=dict(color="white"), name="measured",
            marker=dict(symbol="circle-open", size=18, color="white", line=dict(width=2))))
        mbest = measured.loc[measured["time_ms"].idxmin()]
        fig.add_trace(go.Scatter(x=[str(int(mbest["block_k"]))], y=[str(int(mbest["block_q"]))],
                                 mode="markers", name="measured optimum",
                                 marker=dict(symbol="diamond-open", size=28, color="red",
                                             line=dict(width=3))))
    fig.update_xaxes(title="block_k (keys per tile)", type="category")
    fig.update_yaxes(title="block_q (queries per tile)", type="category")
    return _layout(fig, f"{label} over block sizes", height=480)


# ------------------------------------------------------------------------------------------------
# Scaling (page 3)
# ------------------------------------------------------------------------------------------------
def _per_schedule(fig, table, col, fmt):
    for name, sel in table.groupby("schedule", sort=False):
        fig.add_trace(go.Scatter(x=sel["seq_len"], y=sel[col], mode="lines+markers", name=name,
                                 line=dict(color=SCHEDULE_COLORS.get(name)),
                                 hovertemplate="N=%{x}: %{y:" + fmt + "}<extra>" + name + "</extra>"))


def _loglog(fig, ytitle):
    fig.update_xaxes(type="log", title="sequence length N", dtick=np.log10(2) * 2,
                     tickformat="d")
    fig.update_yaxes(type="log", title=ytitle)


def scaling_bytes(table: pd.DataFrame, bounds: pd.DataFrame) -> go.Figure:
    """Global-memory bytes against N, with the papers' Θ curves (dashed)."""
    fig = go.Figure()
    _per_schedule(fig, table, "global_bytes", ".4s")
    fig.add_trace(go.Scatter(x=bounds["seq_len"], y=bounds["naive_bound"], mode="lines",
                             name="Θ(Nd + N²)", line=dict(color=SCHEDULE_COLORS["naive"], dash="dash")))
    fig.add_trace(go.Scatter(x=bounds["seq_len"], y=bounds["flash_bound"], mode="lines",
                             name="Θ(N²d²/M)", line=dict(color=SCHEDULE_COLORS["flash1"], dash="dash")))
    _loglog(fig, "global-memory bytes")
    return _layout(fig, "Global-memory traffic against N")


def scaling_time(table: pd.DataFrame) -> go.Figure:
    """Predicted time against N."""
    fig = go.Figure()
    _per_schedule(fig, table, "predicted_ms", ".3g")
    _loglog(fig, "predicted time (ms)")
    return _layout(fig, "Predicted time against N")


def scaling_memory(table: pd.DataFrame) -> go.Figure:
    """Extra device memory (beyond Q, K, V, O) against N: naive's N² score matrices versus the
    tiled schedules' O(N) statistics."""
    fig = go.Figure()
    _per_schedule(fig, table, "extra_memory_bytes", ".4s")
    _loglog(fig, "extra memory (bytes)")
    return _layout(fig, "Memory beyond Q, K, V and O: naive materialises N×N, tiled does not",
                   height=340)


# ------------------------------------------------------------------------------------------------
# Predicted vs measured (page 4)
# ------------------------------------------------------------------------------------------------
def predicted_vs_measured(df: pd.DataFrame, metric: str, label: str) -> go.Figure:
    """Predicted against measured ``metric`` per record (log-log), coloured by kernel, with the
    y = x line and ±25 % band. Columns as ``sim.compare.compare``: ``measured_<metric>``,
    ``predicted_<metric>``, ``rel_error_<metric>``."""
    sel = df[df[f"measured_{metric}"].notna() & df[f"predicted_{metric}"].notna()]
    fig = go.Figure()
    if not sel.empty:
        lo = float(min(sel[f"measured_{metric}"].min(), sel[f"predicted_{metric}"].min())) / 1.5
        hi = float(max(sel[f"measured_{metric}"].max(), sel[f"predicted_{metric}"].max())) * 1.5
        line = np.array([lo, hi])
        fig.add_trace(go.Scatter(x=line, y=line, mode="lines", name="y = x",
                                 line=dict(color="black", dash="dash")))
        fig.add_trace(go.Scatter(x=line, y=line * 1.25, mode="lines", name="±25 %",
                                 line=dict(color="#bbb", dash="dot")))
        fig.add_trace(go.Scatter(x=line, y=line / 1.25, mode="lines", showlegend=False,
                                 line=dict(color="#bbb", dash="dot")))
        group = "family" if "family" in sel else "kernel"
        for kernel, part in sel.groupby(group):
            text = [f"{r['pass']} {r['dtype']} N={r['seq_len_q']} d={r['head_dim']}"
                    f"{' causal' if r['causal'] else ''} blocks {r['block_q']}×{r['block_k']}"
                    f"<br>error {r[f'rel_error_{metric}']:+.1%}" for _, r in part.iterrows()]
            fig.add_trace(go.Scatter(x=part[f"measured_{metric}"], y=part[f"predicted_{metric}"],
                                     mode="markers", name=str(kernel), text=text,
                                     hovertemplate="measured %{x:.4g}<br>predicted %{y:.4g}<br>"
                                                   "%{text}<extra></extra>"))
    fig.update_xaxes(type="log", title=f"measured {label}")
    fig.update_yaxes(type="log", title=f"predicted {label}")
    return _layout(fig, label, height=420)


# ------------------------------------------------------------------------------------------------
# Step through (page 5)
# ------------------------------------------------------------------------------------------------
_STATE_COLORS = {"on chip now": "#e6550d", "moved earlier": "#9ecae1", "not yet": "#eeeeee"}


def tile_map(walk: dict, state: dict) -> go.Figure:
    """Left: each tensor's row blocks (on chip now / moved earlier / not yet).
    Right: the (Q block, K block) tiles, done and current."""
    nq, nk = walk["n_blocks_q"], walk["n_blocks_k"]
    tensors = list(walk["tensors"])
    width = max(nq, nk)
    strips = np.full((len(tensors), width), np.nan)
    labels = np.full((len(tensors), width), "", dtype=object)
    for i, t in enumerate(tensors):
        n = nk if t in ("K", "V") else nq
        for b in range(n):
            code = 2 if b in state["on_chip"][t] else 1 if b in state["moved"][t] else 0
            strips[i, b] = code
            labels[i, b] = ("not yet", "moved earlier", "on chip now")[code]
    z = np.zeros((nq, nk))
    for m, n in state["tiles_done"]:
        if 0 <= m < nq and 0 <= n < nk:
            z[m, n] = 1.0
    m, n = state["tile"]
    if 0 <= m < nq and 0 <= n < nk:
        z[m, n] = 2.0
    scale = [[0, "#eeeeee"], [0.5, "#9ecae1"], [1, "#e6550d"]]
    # two panels side by side on explicit axis domains (make_subplots is slow to build)
    fig = go.Figure([
        go.Heatmap(z=strips, y=tensors, x=list(range(width)), customdata=labels, showscale=False,
                   zmin=0, zmax=2, colorscale=scale, xgap=2, ygap=4,
                   hovertemplate="%{y} block %{x}: %{customdata}<extra></extra>"),
        go.Heatmap(z=z, x=list(range(nk)), y=list(range(nq)), showscale=False, zmin=0, zmax=2,
                   colorscale=scale, xgap=2, ygap=2, xaxis="x2", yaxis="y2",
                   hovertemplate="Q block %{y}, K block %{x}<extra></extra>"),
    ])
    fig.update_layout(
        xaxis=dict(domain=[0, 0.42], title="block index", dtick=1 if width <= 16 else None),
        yaxis=dict(autorange="reversed"),
        xaxis2=dict(domain=[0.55, 1], title="K block", dtick=1 if nk <= 16 else None),
        yaxis2=dict(anchor="x2", title="Q block", autorange="reversed",
                    dtick=1 if nq <= 16 else None),
        annotations=[dict(text="Row blocks (orange: on chip now, blue: moved earlier)",
                          x=0.21, y=1.02, xref="paper", yref="paper", showarrow=False,
                          xanchor="center", yanchor="bottom", font=dict(size=11)),
                     dict(text="Tiles (Q block × K block)", x=0.775, y=1.02, xref="paper",
                          yref="paper", showarrow=False, xanchor="center", yanchor="bottom",
                          font=dict(size=11))])
    return _layout(fig, f"{walk['schedule']}, {state['phase']}: what is on chip at this step",
                   height=400)


def cumulative_bytes(walk: dict, step: int) -> go.Figure:
    """Global-memory bytes read and written so far, over the steps, the current step marked."""
    steps = walk["steps"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps["step"] + 1, y=steps["cum_read"], mode="lines", name="read",
                             line=dict(shape="hv", color="#3182bd")))
    fig.add_trace(go.Scatter(x=steps["step"] + 1, y=steps["cum_write"], mode="lines", name="written",
                             line=dict(shape="hv", color="#e6550d")))
    fig.update_layout(shapes=[dict(type="line", x0=step + 1, x1=step + 1, y0=0, y1=1, yref="paper",
                                   line=dict(color="black", dash="dot"))],
                      xaxis_title="step", yaxis_title="bytes so far")
    return _layout(fig, "Bytes moved so far", height=400)
