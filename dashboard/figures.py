"""Plotly figures of the dashboard, built from the DataFrames of `dashboard.data` (no Streamlit).

Each function returns a ``plotly.graph_objects.Figure``; the pages show them with
``dashboard.ui.chart`` (which adds the download buttons).
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard import fmt

SCHEDULE_COLORS = {"naive": "#d62728", "flash1": "#ff7f0e", "flash2": "#1f77b4"}
SCHEDULE_LABELS = {"naive": "Standard attention", "flash1": "FlashAttention",
                   "flash2": "FlashAttention-2"}
ROOFLINE = "roofline bound at peak rates"
#: The datasheet ceilings of a roofline chart: a bound, not the prediction.
PEAK_BOUND = "peak-rate bound (datasheet)"
# No per-figure template: applying one deep-copies it on every figure (~50 ms each); in the app
# Streamlit's own chart theme styles the figures, and downloads use Plotly's default look.


def fmt_bytes(n: float) -> str:
    """Human-readable bytes (powers of 1000, as bandwidth figures are quoted)."""
    return fmt.bytes_(n)


def _label(schedule: str) -> str:
    return SCHEDULE_LABELS.get(schedule, schedule)


def _layout(fig: go.Figure, title: str, height: int = 380, **kwargs) -> go.Figure:
    # the title sits below the chart's toolbar (which Plotly draws at the top right)
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0, xref="paper", xanchor="left",
                                 y=1, yref="container", yanchor="top", pad=dict(t=32)),
                      height=height, margin=dict(l=60, r=20, t=72 if title else 40, b=50),
                      legend=dict(orientation="h", y=-0.2), **kwargs)
    return fig


# ------------------------------------------------------------------------------------------------
# Explore (page 1)
# ------------------------------------------------------------------------------------------------
def schedule_bytes(table: pd.DataFrame) -> go.Figure:
    """Global-memory and DRAM bytes read/written by each schedule (log scale)."""
    fig = go.Figure()
    parts = [("hbm_read_bytes", "global read", "#6baed6"), ("hbm_write_bytes", "global write", "#2171b5"),
             ("dram_read_bytes", "DRAM read", "#fd8d3c"), ("dram_write_bytes", "DRAM write", "#d94701")]
    for col, name, color in parts:
        fig.add_trace(go.Bar(x=table["schedule"].map(_label), y=table[col], name=name,
                             marker_color=color,
                             hovertemplate="%{x}: %{y:.3s}B<extra>" + name + "</extra>"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log", title="bytes")
    return _layout(fig, "Bytes moved: global memory and DRAM")


def _peak_bound(fig: go.Figure, ceilings: dict, xs) -> None:
    """The datasheet's peak-rate roofline (DRAM bandwidth under the matmul and FP32 peaks, and
    the L2 estimate), drawn as the bound it is, over the intensities ``xs``."""
    bw, peak, fp32 = ceilings["dram_bandwidth"], ceilings["matmul_peak"], ceilings["fp32_peak"]
    xs = np.asarray([v for v in xs if np.isfinite(v) and v > 0] or [1.0], dtype=float)
    lo = max(1e-3, min(xs.min() / 4, peak / bw / 100))
    hi = max(xs.max() * 4, peak / bw * 10)
    x = np.geomspace(lo, hi, 200)
    fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * bw) / 1e12, mode="lines",
                             name=f"{PEAK_BOUND}: matmul {peak / 1e12:,.0f} TFLOP/s, DRAM "
                                  f"{bw / 1e12:,.2f} TB/s",
                             line=dict(color="#444"), hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=np.minimum(fp32, x * bw) / 1e12, mode="lines",
                             name=f"{PEAK_BOUND}: FP32 {fp32 / 1e12:,.0f} TFLOP/s",
                             line=dict(color="#999", dash="dash"), hoverinfo="skip"))
    l2 = ceilings.get("l2_bandwidth") or 0.0
    if l2 > 0:
        fig.add_trace(go.Scatter(x=x, y=np.minimum(peak, x * l2) / 1e12, mode="lines",
                                 name=f"{PEAK_BOUND}: L2 {l2 / 1e12:,.0f} TB/s (an estimate)",
                                 line=dict(color="#444", dash="dot"), hoverinfo="skip"))


def roofline(table: pd.DataFrame, ceilings: dict) -> go.Figure:
    """Each schedule at (FLOP per DRAM byte, FLOP/s implied by its predicted time ``time_ms``)
    under the profile's peak-rate bound (datasheet DRAM bandwidth and compute peaks); hollow
    markers use global-memory bytes."""
    fig = go.Figure()
    _peak_bound(fig, ceilings, np.concatenate([table["intensity_dram"],
                                               table["intensity_global"]]))
    for _, r in table.iterrows():
        color = SCHEDULE_COLORS.get(r["schedule"], "#333")
        y = r["achieved_flops"] / 1e12
        fig.add_trace(go.Scatter(x=[r["intensity_dram"]], y=[y], mode="markers+text",
                                 text=[_label(r["schedule"])], textposition="top center",
                                 marker=dict(size=13, color=color), name=_label(r["schedule"]),
                                 hovertemplate="%{x:.3g} FLOP/B, %{y:.3g} TFLOP/s"))
        fig.add_trace(go.Scatter(x=[r["intensity_global"]], y=[y], mode="markers",
                                 marker=dict(size=11, color="white", line=dict(color=color, width=2)),
                                 name=f"{_label(r['schedule'])} (global bytes)", showlegend=False,
                                 hovertemplate="%{x:.3g} FLOP/B, %{y:.3g} TFLOP/s"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="hollow: per global byte",
                             marker=dict(size=11, color="white", line=dict(color="#333", width=2))))
    rates = ceilings.get("rates", "datasheet rates")
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title=f"TFLOP/s predicted ({rates})")
    return _roofline_layout(fig, f"Roofline: {ceilings['name']}")


def _roofline_layout(fig: go.Figure, title: str) -> go.Figure:
    fig = _layout(fig, title, height=540)
    fig.update_layout(legend=dict(orientation="h", y=-0.22, yanchor="top"),
                      margin=dict(b=190))
    return fig


# ------------------------------------------------------------------------------------------------
# Block sizes (page 2)
# ------------------------------------------------------------------------------------------------
def _cell_ms(t: float) -> str:
    """A time written in a heatmap cell: 3 decimals from 0.1 ms (``"2.370"``), else 3
    significant digits (``"0.0123"``)."""
    return f"{t:,.3f}" if t >= 0.1 else fmt.num(t, 3)


#: Outline of the model's pick and of the measured best in the tile heatmaps.
PICK_LINE = dict(color="black", width=3)
BEST_LINE = dict(color="#d62728", width=3, dash="dot")


def tile_heatmaps(cells: pd.DataFrame, measured: pd.DataFrame | None, *, pick, best=None,
                  predicted_title: str, measured_title: str | None = None,
                  title: str = "") -> go.Figure:
    """The model's predicted ms over (block_q rows, block_k columns) and, when ``measured`` is
    given, the measured ms beside it on the same linear colour scale. Values are written in the
    cells; cells that are not legal are blank, their reason on hover. ``pick`` and ``best``
    (``(block_q, block_k)``) are outlined in both (solid black: the model's pick ★; dotted red:
    the measured best ◆).

    ``cells``: ``dashboard.data.tile_plane``'s (block_q, block_k, legal, predicted_ms, rank,
    bound, why); ``measured``: block_q, block_k, time_ms (NaN: refused), why."""
    from plotly.subplots import make_subplots

    qs = set(int(q) for q in cells["block_q"])
    ks = set(int(k) for k in cells["block_k"])
    if measured is not None:
        qs |= set(int(q) for q in measured["block_q"])
        ks |= set(int(k) for k in measured["block_k"])
    qs, ks = sorted(qs), sorted(ks)
    xs, ys = [str(k) for k in ks], [str(q) for q in qs]
    by = cells.set_index(["block_q", "block_k"])
    n_legal = int(cells["legal"].sum())
    marks = {pick: " ★"} if pick else {}
    if best:
        marks[best] = marks.get(best, "") + " ◆"

    def tiles(q, k):
        return f"{q} queries × {k} keys"

    def predicted(q, k):
        if (q, k) not in by.index:
            return np.nan, "", f"{tiles(q, k)}: not a configuration of this kernel"
        r = by.loc[(q, k)]
        if not bool(r["legal"]):
            return np.nan, "", f"{tiles(q, k)}: not legal here: {r['why']}"
        t = float(r["predicted_ms"])
        return t, _cell_ms(t) + marks.get((q, k), ""), (
            f"{tiles(q, k)}<br>predicted {fmt.ms(t, 4)}, rank {int(r['rank'])} of {n_legal}"
            f"<br>limited by {r['bound']}")

    panels = [[[predicted(q, k) for k in ks] for q in qs]]
    titles = [predicted_title]
    if measured is not None:
        m = measured.groupby(["block_q", "block_k"]).agg(time_ms=("time_ms", "min"),
                                                          why=("why", "first"))

        def timed(q, k):
            if (q, k) not in m.index:
                return np.nan, "", f"{tiles(q, k)}: not measured"
            t, why = m.loc[(q, k), "time_ms"], m.loc[(q, k), "why"]
            if pd.isna(t):
                return np.nan, "", f"{tiles(q, k)}: not timed: {why or 'refused'}"
            return float(t), _cell_ms(float(t)) + marks.get((q, k), ""), (
                f"{tiles(q, k)}<br>measured {fmt.ms(float(t), 4)}")

        panels.append([[timed(q, k) for k in ks] for q in qs])
        titles.append(measured_title or "Measured (ms)")
    values = [v[0] for p in panels for row in p for v in row if not np.isnan(v[0])]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo * 0.95, hi * 1.05 + 1e-9
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=titles,
                        horizontal_spacing=0.1)
    for col, panel in enumerate(panels, start=1):
        fig.add_trace(go.Heatmap(
            x=xs, y=ys, z=[[v[0] for v in row] for row in panel],
            text=[[v[1] for v in row] for row in panel], texttemplate="%{text}",
            textfont=dict(size=15), customdata=[[v[2] for v in row] for row in panel],
            hovertemplate="%{customdata}<extra></extra>", hoverongaps=True,
            coloraxis="coloraxis", xgap=3, ygap=3, name=titles[col - 1]), row=1, col=col)
        for where, line in ((pick, PICK_LINE), (best, BEST_LINE)):
            if where and where[0] in qs and where[1] in ks:
                x, y = ks.index(where[1]), qs.index(where[0])
                fig.add_shape(type="rect", x0=x - 0.47, x1=x + 0.47, y0=y - 0.47, y1=y + 0.47,
                              line=line, row=1, col=col)
        # whole cells even where a row or column is all blank (Plotly trims empty edges)
        fig.update_xaxes(title="keys per tile (block_k)", type="category",
                         range=[-0.5, len(ks) - 0.5], showgrid=False, row=1, col=col)
        fig.update_yaxes(title="queries per tile (block_q)" if col == 1 else None,
                         type="category", range=[-0.5, len(qs) - 0.5], showgrid=False,
                         row=1, col=col)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="★ the model's pick",
                             marker=dict(symbol="square-open", size=16, line=PICK_LINE,
                                         color="black")))
    if best:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="◆ the measured best",
                                 marker=dict(symbol="square-open", size=16, color="#d62728",
                                             line=dict(width=3, color="#d62728"))))
    fig.update_layout(coloraxis=dict(colorscale="Viridis_r", cmin=lo, cmax=hi,
                                     colorbar=dict(title="ms")), showlegend=True)
    return _layout(fig, title, height=440)


# ------------------------------------------------------------------------------------------------
# Scaling (page 3)
# ------------------------------------------------------------------------------------------------
def _per_schedule(fig, table, col, hover, unit=""):
    for name, sel in table.groupby("schedule", sort=False):
        label = _label(name)
        fig.add_trace(go.Scatter(x=sel["seq_len"], y=sel[col], mode="lines+markers", name=label,
                                 line=dict(color=SCHEDULE_COLORS.get(name)),
                                 hovertemplate="N = %{x:,}: %{y:" + hover + "}" + unit
                                               + "<extra>" + label + "</extra>"))


def _loglog(fig, ytitle, mark_n=None):
    fig.update_xaxes(type="log", title="sequence length N", dtick=np.log10(2) * 2,
                     tickformat=",d")
    fig.update_yaxes(type="log", title=ytitle)
    if mark_n:
        fig.add_vline(x=mark_n, line=dict(color="#555", dash="dot", width=1),
                      annotation_text=f"N = {mark_n:,}", annotation_position="top left")


def scaling_bytes(table: pd.DataFrame, bounds: pd.DataFrame, mark_n=None) -> go.Figure:
    """Global-memory bytes against N, with the papers' Θ curves (dashed)."""
    fig = go.Figure()
    _per_schedule(fig, table, "global_bytes", ".3s", "B")
    fig.add_trace(go.Scatter(x=bounds["seq_len"], y=bounds["naive_bound"], mode="lines",
                             name="Θ(Nd + N²)", line=dict(color=SCHEDULE_COLORS["naive"], dash="dash")))
    fig.add_trace(go.Scatter(x=bounds["seq_len"], y=bounds["flash_bound"], mode="lines",
                             name="Θ(N²d²/M)", line=dict(color=SCHEDULE_COLORS["flash1"], dash="dash")))
    _loglog(fig, "global-memory bytes", mark_n)
    return _layout(fig, "Global-memory traffic against N")


def scaling_time(table: pd.DataFrame, mark_n=None, label: str = "predicted time") -> go.Figure:
    """The model's predicted time against N (``label``: what it is, e.g. "predicted from
    datasheet rates")."""
    fig = go.Figure()
    _per_schedule(fig, table, "time_ms", ".3g", " ms")
    _loglog(fig, "time (ms)", mark_n)
    return _layout(fig, f"Time against N, {label[0].lower()}{label[1:]}")


def scaling_memory(table: pd.DataFrame, mark_n=None) -> go.Figure:
    """Extra device memory (beyond Q, K, V, O) against N: naive's N² score matrices versus the
    tiled schedules' O(N) statistics."""
    fig = go.Figure()
    _per_schedule(fig, table, "extra_memory_bytes", ".3s", "B")
    _loglog(fig, "extra memory (bytes)", mark_n)
    return _layout(fig, "Memory beyond Q, K, V and O: standard attention holds N×N, the tiled "
                        "schedules do not", height=340)


#: One colour per implementation of a benchmark file (measured: solid, predicted: dashed).
IMPL_COLORS = {"ioaware-numba/mma": "#1f77b4", "ioaware-numba/tf32": "#17becf",
               "ioaware-numba/wgmma": "#e377c2", "ioaware-numba": "#9467bd", "sdpa-flash": "#ff7f0e", "sdpa-cudnn": "#2ca02c",
               "sdpa-efficient": "#d62728", "sdpa-math": "#8c564b", "eager": "#7f7f7f"}
_MORE_COLORS = ("#bcbd22", "#393b79", "#637939", "#e7ba52")


def impl_color(impl: str) -> str:
    """The implementation's colour: its own, else one of the spare colours chosen from its name
    (the same in every process: ``hash`` of a string is not)."""
    spare = int(hashlib.sha1(str(impl).encode()).hexdigest(), 16) % len(_MORE_COLORS)
    return IMPL_COLORS.get(impl, _MORE_COLORS[spare])


def scaling_measured(result: dict, metric: str, labels: dict, predicted_name: str,
                     mark_n=None, title: str = "") -> go.Figure:
    """Measured ``metric`` ("tflops" or "time_ms") against N, one solid line per implementation,
    and the model's prediction for it dashed in the same colour where a plan prices it
    (``result``: `dashboard.data.scaling_measured`). Log-log for time, log N for TFLOP/s."""
    fig = go.Figure()
    measured, predicted = result["measured"], result["predicted"]
    unit, hover = ("TFLOP/s", ".3g") if metric == "tflops" else ("ms", ".3g")
    no_plan = set(result.get("no_plan", ()))
    for impl, sel in measured.groupby("impl", sort=False):
        label = labels.get(impl, impl)
        color = impl_color(impl)
        name = label + (" (no prediction)" if impl in no_plan else "")
        fig.add_trace(go.Scatter(
            x=sel["seq_len"], y=sel[metric], mode="lines+markers", name=name,
            legendgroup=impl, line=dict(color=color), marker=dict(size=7),
            hovertemplate="N = %{x:,}: %{y:" + hover + "} " + unit + "<extra>" + label
                          + ", measured</extra>"))
        pred = predicted[predicted["impl"] == impl] if not predicted.empty else predicted
        if not pred.empty:
            fig.add_trace(go.Scatter(
                x=pred["seq_len"], y=pred[metric], mode="lines", name=f"{label}, {predicted_name}",
                legendgroup=impl, showlegend=False, line=dict(color=color, dash="dash", width=1.5),
                hovertemplate="N = %{x:,}: %{y:" + hover + "} " + unit + "<extra>" + label
                              + ", " + predicted_name + "</extra>"))
    if not predicted.empty:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"dashed: {predicted_name}",
                                 line=dict(color="#444", dash="dash", width=1.5)))
    fig.update_xaxes(type="log", title="sequence length N", dtick=np.log10(2), tickformat=",d")
    if metric == "tflops":
        fig.update_yaxes(title="TFLOP/s (useful FLOPs / time)", rangemode="tozero")
    else:
        fig.update_yaxes(type="log", title="time (ms)")
    if mark_n:
        fig.add_vline(x=mark_n, line=dict(color="#555", dash="dot", width=1),
                      annotation_text=f"N = {mark_n:,}", annotation_position="top left")
    fig = _layout(fig, title, height=460)
    fig.update_layout(legend=dict(orientation="h", y=-0.25), margin=dict(b=110))
    return fig


# ------------------------------------------------------------------------------------------------
# Predicted vs measured (page 4)
# ------------------------------------------------------------------------------------------------
def predicted_vs_measured(df: pd.DataFrame, metric: str, label: str,
                          labels: dict | None = None) -> go.Figure:
    """Predicted against measured ``metric`` per record (log-log), coloured by kernel, with the
    y = x line and ±25 % band. Columns as ``sim.compare.compare``: ``measured_<metric>``,
    ``predicted_<metric>``, ``rel_error_<metric>``."""
    labels = labels or {}
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
            text = [f"{r['pass']} {r['dtype']} N={int(r['seq_len_q']):,} d={r['head_dim']}"
                    f"{' causal' if r['causal'] else ''}"
                    + ("" if pd.isna(r["block_q"]) else
                       f", tile {int(r['block_q'])}×{int(r['block_k'])}")
                    + f"<br>error {fmt.signed_pct(r[f'rel_error_{metric}'])}"
                    for _, r in part.iterrows()]
            fig.add_trace(go.Scatter(x=part[f"measured_{metric}"], y=part[f"predicted_{metric}"],
                                     mode="markers", name=labels.get(str(kernel), str(kernel)),
                                     text=text,
                                     hovertemplate="measured %{x:.4g}<br>predicted %{y:.4g}<br>"
                                                   "%{text}<extra></extra>"))
    fig.update_xaxes(type="log", title=f"measured {label}")
    fig.update_yaxes(type="log", title=f"predicted {label}")
    return _layout(fig, label, height=420)




def error_against_n(points: pd.DataFrame, labels: dict | None = None) -> go.Figure:
    """The predicted time's relative error against N (``points``: `dashboard.data.
    error_against_n`), one series per kernel family: every record a marker, the family's
    median at each N a line."""
    labels = labels or {}
    sel = points[points["rel_error_time"].notna()]
    fig = go.Figure()
    fig.add_hline(y=0, line=dict(color="black", width=1))
    for fam, part in sel.groupby("family", sort=False):
        color = impl_color(fam)
        label = labels.get(fam, fam)
        text = [f"{PASS_WORDS.get(r['pass'], r['pass'])}, {r['dtype']}, d = {r['head_dim']}"
                f"{', causal' if r['causal'] else ''}; {r['priced_by']}"
                for _, r in part.iterrows()]
        fig.add_trace(go.Scatter(
            x=part["seq_len"], y=part["rel_error_time"] * 100, mode="markers", name=label,
            legendgroup=fam, marker=dict(color=color, size=7, opacity=0.55), text=text,
            hovertemplate="N = %{x:,}: %{y:+.1f} %<br>%{text}<extra>" + label + "</extra>"))
        med = part.groupby("seq_len")["rel_error_time"].median().sort_index()
        if len(med) > 1:
            fig.add_trace(go.Scatter(
                x=med.index, y=med.values * 100, mode="lines", name=f"{label}, median",
                legendgroup=fam, showlegend=False, line=dict(color=color, width=2),
                hovertemplate="N = %{x:,}: median %{y:+.1f} %<extra>" + label + "</extra>"))
    fig.update_xaxes(type="log", title="sequence length N", dtick=np.log10(2), tickformat=",d")
    fig.update_yaxes(title="predicted time error (%)", ticksuffix=" %", zeroline=False)
    fig = _layout(fig, "Predicted time error against N (markers: records; lines: the median)",
                  height=440)
    fig.update_layout(legend=dict(orientation="h", y=-0.22, yanchor="top"), margin=dict(b=120))
    return fig


PASS_WORDS = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}


def measured_roofline(points: pd.DataFrame, ceilings: dict, labels: dict | None = None
                      ) -> go.Figure:
    """Each record as Nsight Compute draws it, at its achieved point (measured FLOPs / time
    against measured FLOPs / DRAM byte: filled), beside the model's point for it (hollow),
    joined by a thin line, under the peak-rate bound of the datasheet (``points``:
    `dashboard.data.roofline_points`)."""
    labels = labels or {}
    fig = go.Figure()
    _peak_bound(fig, ceilings, np.concatenate([points["measured_intensity"],
                                               points["predicted_intensity"]]))
    for fam, part in points.groupby("family", sort=False):
        color = impl_color(fam)
        label = labels.get(fam, fam)
        text = [f"N = {int(r['seq_len']):,}, {PASS_WORDS.get(r['pass'], r['pass'])}, "
                f"{r['dtype']}, d = {r['head_dim']}{', causal' if r['causal'] else ''}"
                for _, r in part.iterrows()]
        xs, ys = [], []
        for _, r in part.iterrows():
            if np.isfinite(r["predicted_intensity"]) and np.isfinite(r["predicted_tflops"]):
                xs += [r["measured_intensity"], r["predicted_intensity"], None]
                ys += [r["measured_tflops"], r["predicted_tflops"], None]
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", legendgroup=fam,
                                     showlegend=False, hoverinfo="skip",
                                     line=dict(color=color, width=0.7)))
        fig.add_trace(go.Scatter(
            x=part["measured_intensity"], y=part["measured_tflops"], mode="markers",
            name=f"{label}, measured", legendgroup=fam, text=text,
            marker=dict(color=color, size=8),
            hovertemplate="measured: %{x:.3g} FLOP/B, %{y:.3g} TFLOP/s<br>%{text}<extra>"
                          + label + "</extra>"))
        fig.add_trace(go.Scatter(
            x=part["predicted_intensity"], y=part["predicted_tflops"], mode="markers",
            name=f"{label}, predicted", legendgroup=fam, text=text, showlegend=False,
            marker=dict(color="white", size=8, line=dict(color=color, width=1.5)),
            hovertemplate="predicted: %{x:.3g} FLOP/B, %{y:.3g} TFLOP/s<br>%{text}<extra>"
                          + label + "</extra>"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="hollow: the model's point",
                             marker=dict(size=8, color="white", line=dict(color="#333", width=1.5))))
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP / DRAM byte)")
    fig.update_yaxes(type="log", title="TFLOP/s")
    return _roofline_layout(fig, f"Roofline: measured (filled) and predicted (hollow), under "
                                 f"the {PEAK_BOUND} of the {ceilings['name']}")


# ------------------------------------------------------------------------------------------------
# Step through (page 5): figures of a `dashboard.walk.Walk` at one step
# ------------------------------------------------------------------------------------------------
_NOW, _BEFORE, _NOT_YET, _SKIPPED = "#e6550d", "#9ecae1", "#eeeeee", "#bdbdbd"


def tile_map(walk, step: int, row: int | None = None) -> go.Figure:
    """Left: each tensor's row blocks (on chip at this step / moved before / not yet), with how
    many times each block has crossed global memory. Right: the (Q tile, K/V tile) grid: done,
    current, still to do, never computed (causal). ``row`` (0-based): the followed query row,
    marked on the grid. Tiles and blocks are numbered from 1."""
    from dashboard.walk import KEY_SIDE, tensor_label

    nq, nk = walk.n_blocks_q, walk.n_blocks_k
    tensors = list(walk.tensors)
    width = max(nq, nk)
    counts = walk.block_counts[step - 1]
    chip = walk.on_chip(step)
    z = np.full((len(tensors), width), np.nan)
    text = np.full((len(tensors), width), "", dtype=object)
    hover = np.full((len(tensors), width), "", dtype=object)
    for i, t in enumerate(tensors):
        size = walk.block_k if t in KEY_SIDE else walk.block_q
        n_blocks = nk if t in KEY_SIDE else nq
        for b in range(n_blocks):
            c = int(counts[i, b])
            code = 2 if b in chip.get(t, ()) else 1 if c else 0
            z[i, b] = code
            text[i, b] = f"{c}×" if c else ""
            r0, r1 = b * size + 1, min((b + 1) * size, walk.seq_len)
            hover[i, b] = (f"{tensor_label(t)} rows {r0}–{r1}: moved {c} time{'s' * (c != 1)}"
                           + (", on chip now" if code == 2 else ""))
    grid = np.zeros((nq, nk))
    for m in range(nq):
        for n in range(nk):
            grid[m, n] = 0 if (m, n) in walk.visited else -1
    for m, n in walk.tiles_done(step):
        grid[m, n] = 1
    cur = walk.steps.iloc[step - 1]
    if not pd.isna(cur["q_tile"]) and not pd.isna(cur["k_tile"]):
        grid[int(cur["q_tile"]) - 1, int(cur["k_tile"]) - 1] = 2
    gtext = np.where(grid == -1, "skipped", np.where(grid == 1, "done", np.where(grid == 2, "now", "")))
    strip_scale = [[0, _NOT_YET], [0.5, _BEFORE], [1, _NOW]]
    grid_scale = [[0, _SKIPPED], [1 / 3, _NOT_YET], [2 / 3, _BEFORE], [1, _NOW]]
    names = [tensor_label(t) for t in tensors]
    ticks = list(range(1, width + 1))
    fig = go.Figure([
        go.Heatmap(z=z, y=names, x=ticks, text=text, texttemplate="%{text}", customdata=hover,
                   showscale=False, zmin=0, zmax=2, colorscale=strip_scale, xgap=2, ygap=4,
                   hovertemplate="%{customdata}<extra></extra>"),
        go.Heatmap(z=grid, x=list(range(1, nk + 1)), y=list(range(1, nq + 1)), text=gtext,
                   texttemplate="%{text}", showscale=False, zmin=-1, zmax=2,
                   colorscale=grid_scale, xgap=2, ygap=2, xaxis="x2", yaxis="y2",
                   hovertemplate="Q tile %{y} × K/V tile %{x}: %{text}<extra></extra>"),
    ])
    shapes = []
    if row is not None:
        m = row // walk.block_q + 1
        shapes.append(dict(type="rect", xref="x2", yref="y2", x0=0.5, x1=nk + 0.5, y0=m - 0.5,
                           y1=m + 0.5, line=dict(color="#222", width=2, dash="dot")))
    fig.update_layout(
        xaxis=dict(domain=[0, 0.46], title="row block of the tensor",
                   dtick=1 if width <= 16 else None),
        yaxis=dict(autorange="reversed"),
        xaxis2=dict(domain=[0.62, 1], title="K/V tile", dtick=1 if nk <= 16 else None),
        yaxis2=dict(anchor="x2", title="Q tile", autorange="reversed",
                    dtick=1 if nq <= 16 else None),
        shapes=shapes,
        annotations=[dict(text=text_, x=x_, y=1.02, xref="paper", yref="paper", showarrow=False,
                          xanchor="center", yanchor="bottom", font=dict(size=12))
                     for text_, x_ in (("Tensors, block by block", 0.23), ("Tiles", 0.81))])
    return _layout(fig, "", height=max(300, 90 + 34 * len(tensors)))


def tensor_traffic(table: pd.DataFrame, xmax: float | None = None) -> go.Figure:
    """Bytes read and written per tensor so far, in multiples of the tensor's size: a bar at 4×
    is a tensor read four times (``Walk.tensor_table``)."""
    fig = go.Figure()
    hover = [f"{fmt.bytes_(r)} read, {fmt.bytes_(w)} written (tensor: {fmt.bytes_(s)})"
             for r, w, s in zip(table["read"], table["written"], table["size"])]
    fig.add_trace(go.Bar(y=table["tensor"], x=table["times read"], orientation="h", name="read",
                         marker_color="#3182bd", customdata=hover,
                         hovertemplate="%{y}: read %{x:.2f}× its size<br>%{customdata}<extra></extra>"))
    fig.add_trace(go.Bar(y=table["tensor"], x=table["times written"], orientation="h",
                         name="written", marker_color="#e6550d", customdata=hover,
                         hovertemplate="%{y}: written %{x:.2f}× its size<br>%{customdata}"
                                       "<extra></extra>"))
    fig.update_layout(barmode="group", xaxis_title="× the tensor's size",
                      yaxis=dict(autorange="reversed"))
    if xmax:
        fig.update_xaxes(range=[0, xmax * 1.05])
    fig = _layout(fig, "Moved so far, per tensor", height=max(300, 90 + 34 * len(table)))
    fig.update_layout(legend=dict(orientation="h", y=-0.3), margin=dict(b=80))
    return fig


def row_scores(scores: np.ndarray, visible: np.ndarray, seen: np.ndarray, block_k: int,
               tiles: pd.DataFrame, done: int) -> go.Figure:
    """The followed row's scores, key by key: keys of tiles already processed in colour
    (alternating per tile), the rest grey; the running max after each processed tile as a step
    line, with the rescale factor α where it changed."""
    keys = np.arange(1, len(scores) + 1)
    shown = np.where(visible, scores, np.nan)
    tile_of = (keys - 1) // block_k
    colors = np.where(~seen, "#dddddd", np.where(tile_of % 2 == 0, "#6baed6", "#2171b5"))
    fig = go.Figure(go.Bar(x=keys, y=shown, marker_color=colors, name="score s = q·k/√d",
                           hovertemplate="key %{x}: s = %{y:.3f}<extra></extra>"))
    xs, ys, notes = [], [], []
    for _, t in tiles.iloc[:done].iterrows():
        k0 = (int(t["k_tile"]) - 1) * block_k + 1
        k1 = min(int(t["k_tile"]) * block_k, len(scores))
        xs += [k0 - 0.5, k1 + 0.5, None]
        ys += [t["m"], t["m"], None]
        if not pd.isna(t["alpha"]) and t["alpha"] < 1:
            notes.append(dict(x=(k0 + k1) / 2, y=t["m"], text=f"α = {t['alpha']:.3g}",
                              showarrow=False, yshift=10, font=dict(size=11, color="#d62728")))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="running max m",
                             line=dict(color="#d62728", width=2), hoverinfo="skip"))
    fig.update_layout(annotations=notes, xaxis_title="key", yaxis_title="score",
                      bargap=0.05)
    return _layout(fig, "The row's scores, tile by tile (grey: not seen yet)", height=330)


def row_vector(now: np.ndarray | None, final: np.ndarray, name_now: str, name_final: str,
               title: str, max_dims: int = 16) -> go.Figure:
    """The first ``max_dims`` components of a row vector so far (bars) against its final,
    exact value (markers)."""
    dims = np.arange(1, min(max_dims, len(final)) + 1)
    fig = go.Figure()
    if now is not None:
        fig.add_trace(go.Bar(x=dims, y=now[:len(dims)], name=name_now, marker_color="#6baed6",
                             hovertemplate="dim %{x}: %{y:.4f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=dims, y=final[:len(dims)], mode="markers", name=name_final,
                             marker=dict(symbol="line-ew-open", size=22, color="#d62728",
                                         line=dict(width=3)),
                             hovertemplate="dim %{x}: %{y:.4f}<extra></extra>"))
    fig.update_xaxes(title="dimension", dtick=1, range=[0.4, len(dims) + 0.6])
    return _layout(fig, title, height=330)


def row_probabilities(p_now: np.ndarray, p_final: np.ndarray, visible: np.ndarray) -> go.Figure:
    """Backward: the row's probabilities recomputed so far from the logsumexp (bars) against the
    forward's softmax (markers)."""
    keys = np.arange(1, len(p_final) + 1)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=keys, y=np.where(visible, p_now, np.nan), name="P recomputed = exp(S − L)",
                         marker_color="#6baed6", hovertemplate="key %{x}: %{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=keys, y=np.where(visible, p_final, np.nan), mode="markers",
                             name="P of the forward", marker=dict(color="#d62728", size=5),
                             hovertemplate="key %{x}: %{y:.4g}<extra></extra>"))
    fig.update_layout(xaxis_title="key", bargap=0.05)
    fig.update_yaxes(type="log", title="probability (log scale)", exponentformat="power")
    return _layout(fig, "P of the row, recomputed tile by tile", height=330)


# ------------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------------
#: Colours of the Decoding page's charts: the model's curve, the measured sweep, their marks.
DECODE_COLORS = {"predicted": "#1f77b4", "measured": "#2ca02c", "pick": "#ff7f0e",
                 "one": "#d62728", "given": "#9467bd", "best": "#2ca02c"}


def _splits_axis(fig: go.Figure, most: int) -> None:
    ticks = [2**k for k in range(0, max(1, int(most)).bit_length() + 1)]
    fig.update_xaxes(type="log", title="splits of the keys", tickvals=ticks,
                     ticktext=[str(t) for t in ticks])


def _mark(fig: go.Figure, x, y, name: str, symbol: str, color: str, size: int = 15) -> None:
    fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=name,
                             marker=dict(symbol=symbol, size=size, color=color,
                                         line=dict(color="#333", width=1)),
                             hovertemplate="%{x} splits: %{y:.4g} ms<extra>" + name
                                           + "</extra>"))


def decode_splits(curve: pd.DataFrame, *, chosen: int, splits: int, given: bool,
                  predicted_name: str, title: str = "") -> go.Figure:
    """The split-KV plan's predicted time against its number of splits (``curve``:
    ``dashboard.data.decode_prediction``'s), the model's pick marked ★, one split (a
    FlashAttention-2-like grid) ●, and a given split count ◆; the hover adds the wave
    efficiency and the main kernel's and the merge's shares."""
    fig = go.Figure()
    custom = np.stack([curve["wave_efficiency"] * 100, curve["time_main_ms"],
                       curve["time_merge_ms"]], axis=-1)
    fig.add_trace(go.Scatter(
        x=curve["splits"], y=curve["time_ms"], mode="lines+markers", name=predicted_name,
        line=dict(color=DECODE_COLORS["predicted"]), marker=dict(size=4), customdata=custom,
        hovertemplate="%{x} splits: %{y:.4g} ms (main kernel %{customdata[1]:.4g}, merge "
                      "%{customdata[2]:.4g}; last wave %{customdata[0]:.0f} % busy)"
                      "<extra></extra>"))
    at = curve.set_index("splits")["time_ms"]
    _mark(fig, 1, at.loc[1], "1 split (a FlashAttention-2-like grid)", "circle",
          DECODE_COLORS["one"], 12)
    _mark(fig, chosen, at.loc[chosen], f"★ the model's pick: {chosen} splits", "star",
          DECODE_COLORS["pick"], 18)
    if given and splits != chosen:
        _mark(fig, splits, at.loc[splits], f"◆ the given split count: {splits}", "diamond",
              DECODE_COLORS["given"])
    _splits_axis(fig, int(curve["splits"].max()))
    fig.update_yaxes(type="log", title="predicted time (ms)")
    fig = _layout(fig, title, height=420)
    fig.update_layout(legend=dict(orientation="h", y=-0.25), margin=dict(b=110))
    return fig


def decode_sweep(measured: pd.DataFrame, predicted: pd.DataFrame, *, pick: int, best: int,
                 pick_ms: float, predicted_name: str, measured_name: str,
                 title: str = "") -> go.Figure:
    """A decode case's split sweep: the measured time at each split count timed (solid), the
    model's predicted time at every split count (dashed), the model's pick ★ (on the
    prediction) and the measured best ◆."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=measured["splits"], y=measured["measured_ms"], mode="lines+markers",
        name=measured_name, line=dict(color=DECODE_COLORS["measured"]), marker=dict(size=8),
        hovertemplate="%{x} splits: %{y:.4g} ms<extra>measured</extra>"))
    fig.add_trace(go.Scatter(
        x=predicted["splits"], y=predicted["time_ms"], mode="lines", name=predicted_name,
        line=dict(color=DECODE_COLORS["predicted"], dash="dash", width=1.5),
        hovertemplate="%{x} splits: %{y:.4g} ms<extra>predicted</extra>"))
    _mark(fig, pick, pick_ms, f"★ the model's pick: {pick} splits", "star",
          DECODE_COLORS["pick"], 18)
    best_ms = float(measured.set_index("splits")["measured_ms"].loc[best])
    _mark(fig, best, best_ms, f"◆ the measured best: {best} splits", "diamond",
          DECODE_COLORS["best"])
    _splits_axis(fig, int(max(measured["splits"].max(), predicted["splits"].max())))
    fig.update_yaxes(type="log", title="time (ms)")
    fig = _layout(fig, title, height=420)
    fig.update_layout(legend=dict(orientation="h", y=-0.25), margin=dict(b=110))
    return fig


# ------------------------------------------------------------------------------------------------
# What asynchrony buys
# ------------------------------------------------------------------------------------------------
def asynchrony_steps(table: pd.DataFrame, peak_tflops: float | None = None) -> go.Figure:
    """The model's TFLOP/s of FlashAttention-3's plan at each step (`dashboard.data
    .asynchrony_steps`), one bar per step, the tensor cores' peak as a line."""
    fig = go.Figure(go.Bar(x=table["tflops"], y=table["step"], orientation="h",
                           marker_color="#1f77b4",
                           hovertemplate="%{y}: %{x:.0f} TFLOP/s<extra></extra>"))
    if peak_tflops:
        fig.add_vline(x=peak_tflops, line_dash="dot", line_color="#7f7f7f",
                      annotation_text="tensor-core peak", annotation_position="top")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="TFLOP/s (predicted)", rangemode="tozero")
    fig = _layout(fig, "What each idea buys, predicted", height=320, showlegend=False)
    fig.update_layout(margin=dict(l=380))       # room for the steps' names
    return fig


#: Colours of the schedules on the measured-beside-predicted chart.
IDEA_COLORS = {"pingpong": "#ff7f0e", "overlap": "#2ca02c", "pingpong+overlap": "#d62728",
               "cudnn": "#9467bd"}


def schedule_gains(gains: pd.DataFrame, ideas, mark_n=None) -> go.Figure:
    """Measured (solid) and predicted (dashed) gains against N (`dashboard.data.schedule_gains`):
    one pair of lines per idea of ``ideas`` ((name, label, ...) as
    `dashboard.data.SCHEDULE_IDEAS`), and cuDNN's over FlashAttention-2 where the frame has it."""
    fig = go.Figure()
    series = [(name, label) for name, label, *_ in ideas]
    if "cudnn_measured" in gains:
        series.append(("cudnn", "cuDNN over FlashAttention-2 / FlashAttention-3 over none"))
    for name, label in series:
        color = IDEA_COLORS.get(name, "#1f77b4")
        for kind, dash in (("measured", "solid"), ("predicted", "dash")):
            col = f"{name}_{kind}"
            if col not in gains or gains[col].isna().all():
                continue
            fig.add_trace(go.Scatter(x=gains["seq_len"], y=gains[col], name=f"{label}, {kind}",
                                     mode="lines+markers", line=dict(color=color, dash=dash),
                                     hovertemplate="N=%{x}: %{y:.3f}×<extra>" + label + ", "
                                                   + kind + "</extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#7f7f7f")
    if mark_n is not None:
        fig.add_vline(x=mark_n, line_dash="dot", line_color="#bbbbbb")
    fig.update_xaxes(type="log", title="sequence length N", tickvals=list(gains["seq_len"]))
    fig.update_yaxes(title="speedup (×)")
    return _layout(fig, "Measured (solid) beside predicted (dashed)", height=420)
