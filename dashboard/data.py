"""Everything the dashboard computes, kept apart from its layout: the one place that calls the
cost model (``sim``), so that a change of the model's interface touches this file only.

* the one predicted time: a plan (the kernels a schedule or a measured implementation
  launches) priced at the chosen rates, datasheet or measured (``rated_profile``,
  ``schedule_time``, ``rates_label``), the schedule model's roofline at peak rates only where
  nothing has a plan, and then named as the bound it is;
* model tables: the three schedules side by side, the N sweep;
* scaling, measured: each implementation's time and TFLOP/s against N from a results file,
  beside its priced plan (``scaling_measured``, ``attention_flops``);
* block sizes: every legal tile configuration of a kernel family priced by the model that picks
  the kernels' tiles (``sim.plans``, ``sim.plan.price``), beside the tile times a sweep measured
  (``tile_plane``, ``load_tile_sweep``, ``measured_tiles``, ``tile_verdict``);
* the step-through: the cost model's event trace of a small problem (``trace_events``), grouped
  into steps by ``dashboard.walk``;
* results files: listing, validating (every problem listed, not just the first), loading,
  provenance, the format description and an example file; the join of measured records with the
  model's predictions (per kernel, against N, as roofline points), and the trace replay of that
  join in the background with progress;
* measuring on this machine: the GPU probe and the sweep's configurations;
* decoding: the split-KV plan (``sim.decode``) of one decoding workload at every split count
  (``decode_prediction``), and a file of measured decoding (``python -m benchmarks decode``)
  re-priced by ``benchmarks.decode.decode_report``, ``decode --report``'s code
  (``load_decode``, ``decode_measured``).

Functions take plain values (ints, strings, tuples) so that they are cheap to hash for
Streamlit's caches; cached results are shared between reruns and must not be mutated.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ("naive", "flash1", "flash2")
CUSTOM = "custom"

#: What the pages call the schedules.
SCHEDULE_LABELS = {"naive": "Standard attention", "flash1": "FlashAttention",
                   "flash2": "FlashAttention-2"}
#: What limits a roofline time (the model's ``bound``).
BOUND_LABELS = {"dram": "DRAM bandwidth", "l2": "L2 bandwidth", "smem": "shared-memory bandwidth",
                "matmul": "matmul peak", "other": "CUDA-core peak (softmax, scaling)"}
#: Kernels of a results file (``kernel``, or ``kernel/variant`` for our other kernel families).
FAMILY_LABELS = {
    "ioaware-numba": "ioaware, CUDA cores",
    "ioaware-numba/mma": "ioaware, tensor cores (fp16/bf16)",
    "ioaware-numba/tf32": "ioaware, tensor cores (3xTF32)",
    "ioaware-numba/wgmma": "ioaware, Hopper tensor cores (warpgroup MMA)",
    "sdpa-flash": "PyTorch SDPA: FLASH",
    "sdpa-efficient": "PyTorch SDPA: EFFICIENT",
    "sdpa-cudnn": "PyTorch SDPA: cuDNN",
    "sdpa-math": "PyTorch SDPA: MATH",
    "eager": "PyTorch eager (matmul, softmax, matmul)",
}
PASS_LABELS = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}
L2_LABELS = {"analytic": "analytic estimate", "trace": "trace replay", "none": "none"}
#: The label of the model's peak-rate time wherever it is shown.
ROOFLINE = "Roofline bound at peak rates"


def family_label(key) -> str:
    return FAMILY_LABELS.get(str(key), str(key))


def schedule_label(key) -> str:
    return SCHEDULE_LABELS.get(str(key), str(key))


# ------------------------------------------------------------------------------------------------
# The cost model (imported lazily: a page that does not need it does not pay for it)
# ------------------------------------------------------------------------------------------------
def import_sim():
    """``(sim module, None)`` or ``(None, error text)`` when the cost model cannot be imported."""
    try:
        sim = importlib.import_module("sim")
    except Exception as exc:  # noqa: BLE001 - any import failure is reported on the page
        return None, f"{type(exc).__name__}: {exc}"
    if not callable(getattr(sim, "predict", None)):
        return None, f"the sim package at {getattr(sim, '__path__', '?')} has no predict()"
    return sim, None


def _sim():
    sim, err = import_sim()
    if sim is None:
        raise RuntimeError(f"the cost model is not importable: {err}")
    return sim


# ------------------------------------------------------------------------------------------------
# Profiles, workloads, schedules
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CustomField:
    """One number of a user-given GPU profile: ``name`` is the ``sim.GPUProfile`` field, the
    value typed in ``unit`` is multiplied by ``factor`` to get the model's unit."""

    name: str
    label: str
    unit: str
    factor: float
    default: float
    minimum: float
    step: float
    help: str = ""


# Defaults: an H100 SXM-like part (the user edits them). ``name`` is the GPUProfile field.
CUSTOM_PROFILE_FIELDS = (
    CustomField("hbm_bandwidth_bytes_per_s", "DRAM bandwidth", "GB/s", 1e9, 3350.0, 1.0, 50.0,
                "Peak DRAM (HBM) bandwidth."),
    CustomField("l2_bytes", "L2 size", "MiB", 2**20, 50.0, 0.25, 1.0),
    CustomField("l2_bandwidth_bytes_per_s", "L2 bandwidth", "GB/s", 1e9, 10000.0, 1.0, 500.0,
                "L2 <-> SM bandwidth (an estimate on every GPU)."),
    CustomField("num_sms", "SMs", "count", 1, 132.0, 1.0, 1.0),
    CustomField("smem_bytes_per_sm", "Shared memory per SM", "KiB", 1024, 228.0, 16.0, 4.0),
    CustomField("smem_bytes_per_block", "Shared memory per block", "KiB", 1024, 227.0, 16.0, 4.0,
                "At most the shared memory per SM."),
    CustomField("tensor_flops_per_s", "Tensor-core fp16/bf16 peak", "TFLOP/s", 1e12, 989.4, 0.1, 10.0,
                "Dense matmul peak for fp16 and bf16."),
    CustomField("fp32_flops_per_s", "CUDA-core fp32 peak", "TFLOP/s", 1e12, 66.9, 0.1, 1.0),
)
CUSTOM_PROFILE_FIELDS_KEYS = tuple("w_custom_" + f.name for f in CUSTOM_PROFILE_FIELDS)


def profile_names() -> list[str]:
    """Names of the model's built-in GPU profiles (empty when it is unavailable)."""
    sim, _ = import_sim()
    return sorted(sim.PROFILES) if sim is not None else []


def default_profile_name() -> str:
    names = profile_names()
    return "h100" if "h100" in names else (names[0] if names else CUSTOM)


def profile_label(name: str) -> str:
    """Readable label of a profile for a selectbox (its description, e.g. the GPU's name)."""
    if name == CUSTOM:
        return "Custom GPU…"
    sim, _ = import_sim()
    prof = sim.PROFILES.get(name) if sim is not None else None
    return getattr(prof, "description", "") or name


def profile_for_gpu(gpu_name: str) -> str | None:
    """The built-in profile matching a GPU name from a results file's provenance, or None."""
    sim, _ = import_sim()
    if sim is None:
        return None
    prof = importlib.import_module("sim.profiles").profile_for_gpu_name(gpu_name)
    return prof.name if prof is not None else None


def _profile(name: str, custom: tuple | None):
    """A ``sim.GPUProfile``: a built-in one by name, or the custom one from ``(field, value)``
    pairs typed in the sidebar's units."""
    sim = _sim()
    if name != CUSTOM:
        if name not in sim.PROFILES:
            raise ValueError(f"unknown GPU profile {name!r}; known: {sorted(sim.PROFILES)}")
        return sim.PROFILES[name]
    typed = dict(custom or ())
    fields = {f.name: f for f in CUSTOM_PROFILE_FIELDS}
    values = {k: typed.get(k, fields[k].default) * fields[k].factor for k in fields}
    for k in ("l2_bytes", "smem_bytes_per_sm", "smem_bytes_per_block", "num_sms"):
        values[k] = int(round(values[k]))
    tensor = values.pop("tensor_flops_per_s")
    values["tensor_flops_per_s"] = {"fp16": tensor, "bf16": tensor}
    return sim.GPUProfile(name="custom", description="custom GPU", **values)


def window_size(window: int, causal: bool) -> tuple[int, int] | None:
    """The sidebar's sliding window (keys each side, 0 = none) as ``window_size``: (w, 0) with
    causal (Mistral-style), (w, w) without (Longformer-style)."""
    if window <= 0:
        return None
    return (int(window), 0) if causal else (int(window), int(window))


def _workload(seq_len, head_dim, batch, heads, dtype, pass_, causal, density, window=0):
    # density 1.0 is dense attention: no block mask at all (not a mask that keeps every tile)
    return _sim().Workload(batch=batch, heads=heads, seq_len_q=seq_len, head_dim=head_dim,
                           dtype=dtype, causal=causal, pass_=pass_,
                           block_density=None if density >= 1.0 else float(density),
                           window_size=window_size(window, causal))


def _schedule(name, block_q=None, block_k=None):
    return _sim().Schedule(name=name, block_q=block_q, block_k=block_k)


L2_MODES = {"analytic": "analytic estimate (instant)",
            "trace": "replay of every memory access through the L2 (exact, seconds)"}
# Largest batch·heads·N² for which the Explore page replays the trace through the L2 model:
# at 16·8192² the three schedules' replays take a few seconds, and the time grows as N².
TRACE_L2_MAX_SCORES = 16 * 8192**2


def trace_l2_affordable(batch: int, heads: int, seq_len: int) -> bool:
    """Whether the trace-replay L2 model is quick enough to run interactively."""
    return batch * heads * seq_len**2 <= TRACE_L2_MAX_SCORES


def _predict(workload, schedule, profile, l2: str = "analytic", calibration=None) -> dict:
    """sim.predict(...).to_dict() without its nested (dict-valued) entries. ``calibration``: as
    sim.predict (None: raw time only)."""
    d = _sim().predict(workload, schedule, profile, l2=l2, calibration=calibration).to_dict()
    return {k: v for k, v in d.items() if not isinstance(v, (dict, list, tuple))}


# -- the one predicted time: a plan priced with the chosen rates ---------------------------------
#: How a predicted time was obtained: a plan (the kernels a schedule or kernel launches) priced by
#: `sim.plan.price` at the chosen rates, or, where nothing has a plan, the schedule model's
#: roofline at the GPU's peak rates (a bound, not a forecast).
PRICED_BY_PLAN = "plan"
PRICED_BY_ROOFLINE = "roofline"


def rated_profile(profile: str, custom: tuple | None = None, rates: bytes | None = None):
    """``(GPUProfile, error)``: the profile carrying the measured rates of ``rates`` (a rates
    file's bytes, ``python -m benchmarks rates``) when given and usable; ``error``: one line
    saying why a given rates file was not used (then the datasheet profile), else None."""
    prof = _profile(profile, custom)
    if rates is None:
        return prof, None
    try:
        return importlib.import_module("sim.profiles").load_profile(
            prof, rates=json.loads(rates.decode("utf-8"))), None
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, FileNotFoundError) as exc:
        return prof, plain_reason(exc)


def rates_label(rates: str) -> str:
    """``"datasheet rates"`` -> ``"Predicted from datasheet rates"``: what every predicted time
    is called on the pages."""
    return f"Predicted from {rates}"


def rates_metric_label(rates: str) -> str:
    """The short form of :func:`rates_label` for a metric's label: ``"Predicted (datasheet
    rates)"``."""
    return f"Predicted ({rates})"


def priced_by_text(time_from: str, rates: str) -> str:
    """How one predicted time was obtained, as a table cell."""
    if time_from == PRICED_BY_PLAN:
        return f"plan, {rates}"
    return "roofline at peak rates (a bound)"


def schedule_time(workload, schedule: str, prof) -> dict | None:
    """A textbook schedule's plan (`sim.plans.plan_for`, every pass of ``workload``) priced on
    ``prof`` (`sim.plan.price`): ``{"time_ms", "rates" ("datasheet rates" or "measured rates"),
    "bound" (what limits its slowest kernel), "global_bytes", "dram_bytes", "flops"}``, or None
    where the model has no plan for it (then the schedule model's roofline stands in)."""
    plans = importlib.import_module("sim.plans")
    plan_mod = importlib.import_module("sim.plan")
    costs = []
    try:
        for p in workload.passes:
            plan = plans.plan_for(schedule, p, workload.replace(pass_=p), profile=prof)
            costs.append(plan_mod.price(plan, prof))
    except (ValueError, TypeError, KeyError):
        return None
    slowest = max((k for c in costs for k in c.kernels), key=lambda k: k.time_s)
    return {"time_ms": sum(c.time_ms for c in costs), "rates": _costs_rates(costs),
            "bound": PLAN_BOUND_LABELS.get(slowest.bound, slowest.bound),
            "global_bytes": sum(c.global_bytes for c in costs),
            "dram_bytes": sum(c.dram_bytes for c in costs),
            "flops": sum(c.flops for c in costs)}


NO_CALIBRATION = "(none)"


def calibration_path(name: str | None) -> Path | None:
    """The results file of :func:`results_choices` named ``name``, or None for no calibration
    (``None`` or :data:`NO_CALIBRATION`)."""
    if not name or name == NO_CALIBRATION:
        return None
    for path in shipped_results():
        if _choice_name(path) == name:
            return path
    raise FileNotFoundError(f"results file {name!r} is no longer available")


def _ceilings(profile, dtype: str) -> dict:
    """Roofline ceilings of a profile for ``dtype``: DRAM bandwidth (bytes/s), matmul peak and
    CUDA-core fp32 peak (FLOP/s)."""
    return {"name": profile.description or profile.name,
            "dram_bandwidth": float(profile.hbm_bandwidth_bytes_per_s),
            "l2_bandwidth": float(profile.l2_bandwidth_bytes_per_s or 0.0),
            "matmul_peak": float(profile.matmul_flops_per_s(dtype)),
            "fp32_peak": float(profile.fp32_flops_per_s)}


def _row(schedule: str, pred: dict, priced: dict | None = None) -> dict:
    """One schedule's prediction with the derived presentation columns. ``priced``: the
    schedule's plan priced (:func:`schedule_time`), or None: then the predicted time is the
    schedule model's roofline at peak rates."""
    row = {"schedule": schedule, **pred}
    row["global_bytes"] = pred["hbm_read_bytes"] + pred["hbm_write_bytes"]
    row["dram_bytes"] = pred["dram_read_bytes"] + pred["dram_write_bytes"]
    row["intensity_global"] = pred["flops"] / max(1, row["global_bytes"])    # FLOP / byte
    row["intensity_dram"] = pred["flops"] / max(1, row["dram_bytes"])
    if priced is not None:
        row.update(time_ms=priced["time_ms"], time_from=PRICED_BY_PLAN, rates=priced["rates"],
                   plan_bound=priced["bound"])
    else:
        row.update(time_ms=pred["predicted_ms"], time_from=PRICED_BY_ROOFLINE,
                   rates="datasheet rates",
                   plan_bound=BOUND_LABELS.get(pred.get("bound"), pred.get("bound")))
    row["achieved_flops"] = pred["flops"] / (row["time_ms"] * 1e-3)   # FLOP / s, predicted
    return row


def estimated_trace_seconds(seq_len: int, batch: int, heads: int, passes: int = 1) -> float:
    """Seconds the Explore page's trace replay of the three schedules should take here."""
    # the naive schedule dominates: its events touch every 4 KiB granule of S and P
    scores = batch * heads * seq_len**2 * passes
    return scores * 4 * 2 / 4096 * 3 * replay_seconds_per_event()


@st.cache_data(show_spinner=False, max_entries=256)
def compare_schedules(seq_len: int, head_dim: int, batch: int, heads: int, dtype: str,
                      pass_: str, causal: bool, density: float, profile: str,
                      custom: tuple | None = None, l2: str = "analytic",
                      calibrate_on: str | None = None, window: int = 0,
                      rates: bytes | None = None) -> tuple[pd.DataFrame, dict]:
    """naive, flash1 and flash2 (default block sizes) for one workload on one profile.

    Returns ``(table, ceilings)``: one row per schedule with the model's prediction
    (``to_dict()`` keys: ``predicted_ms`` is the schedule model's roofline at peak rates) plus
    ``global_bytes``, ``dram_bytes``, arithmetic intensities (FLOP/byte), the one predicted
    time ``time_ms`` (the schedule's plan priced at the chosen rates, :func:`schedule_time`;
    the roofline where there is no plan), ``time_from`` (:data:`PRICED_BY_PLAN` or
    :data:`PRICED_BY_ROOFLINE`), ``rates``, ``plan_bound`` (what limits it) and the FLOP/s
    ``time_ms`` implies; ``ceilings``: the profile's datasheet ceilings for the roofline chart,
    with ``rates`` (how the times were priced) and ``rates_error`` (why a rates file given as
    ``rates``, its bytes, was not used). ``calibrate_on``: the results file (a name of
    :func:`results_choices`) the calibrated time is fitted on, passed to sim.predict as its
    ``calibration``; None: no calibrated time.
    """
    prof, rates_error = rated_profile(profile, custom, rates)
    wl = _workload(seq_len, head_dim, batch, heads, dtype, pass_, causal, density, window)
    cal = calibration_path(calibrate_on)
    rows = [_row(name, _predict(wl, _schedule(name), prof, l2, cal),
                 schedule_time(wl, name, prof)) for name in SCHEDULES]
    table = pd.DataFrame(rows)
    priced = table[table["time_from"] == PRICED_BY_PLAN]
    ceilings = _ceilings(prof, dtype)
    ceilings.update(rates=priced["rates"].iloc[0] if not priced.empty else "datasheet rates",
                    rates_error=rates_error, all_planned=len(priced) == len(table))
    return table, ceilings


def schedule_table(table: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The Explore table: ``(DataFrame, {column: fmt.Col})`` with readable values (schedule
    names, tile sizes, what bounds the time, which L2 model), the calibrated time only when one
    was asked for."""
    from dashboard.fmt import Col

    df = table.copy()
    df["schedule"] = df["schedule"].map(schedule_label)
    df["tiles"] = [("—" if pd.isna(q) else f"{int(q)} × {int(k)}")
                   for q, k in zip(df["block_q"], df["block_k"])]
    df["bound"] = df["bound"].map(lambda b: BOUND_LABELS.get(b, b))
    df["l2_model"] = df["l2_model"].map(lambda m: L2_LABELS.get(m, m))
    df["sram_bytes_per_block"] = pd.to_numeric(df["sram_bytes_per_block"], errors="coerce")
    cols = {
        "schedule": Col("Schedule"),
        "tiles": Col("Tile (queries × keys)"),
        "hbm_read_bytes": Col("Global read", "bytes", "Bytes read from global memory (L2 and DRAM)."),
        "hbm_write_bytes": Col("Global write", "bytes"),
        "dram_read_bytes": Col("DRAM read", "bytes", "Bytes that miss the L2 and reach DRAM."),
        "dram_write_bytes": Col("DRAM write", "bytes"),
        "flops": Col("FLOPs", "flops"),
        "intensity_dram": Col("FLOP per DRAM byte", "num"),
        "sram_bytes_per_block": Col("On-chip memory per block", "bytes",
                                    "Shared memory one thread block needs for its tiles."),
        "blocks_per_sm": Col("Blocks per SM", "count"),
        "time_ms": Col(time_label(table), "ms", "The model's time: each kernel of the schedule's "
                       "plan priced at these rates (the slowest of its DRAM, L2, shared-memory "
                       "and compute times, stretched by how evenly its thread blocks fill the "
                       "SMs). Datasheet rates are peaks real kernels do not reach: a measured "
                       "time is longer."),
        "predicted_ms_calibrated": Col("Calibrated time", "ms", "The roofline with efficiency "
                                       "factors fitted on the chosen results file."),
        "plan_bound": Col("Limited by"),
        "time_from": Col("Time from"),
        "l2_model": Col("DRAM bytes from"),
    }
    df["time_from"] = [priced_by_text(f, r) for f, r in zip(df["time_from"], df["rates"])]
    if "predicted_ms_calibrated" not in df or df["predicted_ms_calibrated"].isna().all():
        cols.pop("predicted_ms_calibrated")
    if df["time_from"].nunique() == 1:      # the header says it
        cols.pop("time_from")
    return df, cols


def time_label(table: pd.DataFrame) -> str:
    """The header of a column of predicted times: ``"Predicted from datasheet rates"`` when
    every row is a priced plan, else one that names the roofline too."""
    if (table["time_from"] == PRICED_BY_PLAN).all():
        return rates_label(str(table["rates"].iloc[0]))
    if (table["time_from"] == PRICED_BY_ROOFLINE).all():
        return ROOFLINE
    return "Predicted time"


def model_notes() -> str:
    """How the model prices time, in one paragraph."""
    return ("The predicted time prices each kernel of the schedule's plan: per kernel the "
            "slowest of DRAM bytes / DRAM rate, global bytes / L2 rate, shared-memory bytes / "
            "its rate, matmul FLOPs / matmul rate and other FLOPs / CUDA-core rate, stretched by "
            "how evenly the thread blocks fill the SMs. With datasheet rates it is the roofline "
            "at the GPU's peaks, a lower bound: real kernels reach a fraction of them, so "
            "measured times are longer. A rates file measured on the GPU prices it at the rates "
            "it reaches; a calibrated time (choose a results file under *Calibrate time on*) "
            "scales each level by efficiencies fitted on that file's measurements of the same "
            "GPU and kernel.")


@st.cache_data(show_spinner=False, max_entries=128)
def scaling(seq_lens: tuple[int, ...], head_dim: int, batch: int, heads: int, dtype: str,
            pass_: str, causal: bool, density: float, profile: str,
            custom: tuple | None = None, window: int = 0,
            rates: bytes | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The three schedules over ``seq_lens``; returns ``(table, bounds)``.

    ``table``: one row per (N, schedule) with global/DRAM bytes, the predicted time (``time_ms``,
    ``time_from``, ``rates``: as :func:`compare_schedules`, ``rates`` a rates file's bytes),
    the roofline at peak rates (``predicted_ms``) and the extra memory the schedule allocates
    beyond Q, K, V and O (``extra_memory_bytes``).
    ``bounds``: per N, the papers' Θ(Nd + N²) (standard attention) and Θ(N²d²/M) (FlashAttention,
    M = shared memory per block in elements) curves, each scaled to equal the model's naive /
    flash1 global bytes at the smallest N (only the shape is the papers'; the constant is not).
    """
    prof, _error = rated_profile(profile, custom, rates)
    rows = []
    for n in seq_lens:
        wl = _workload(n, head_dim, batch, heads, dtype, pass_, causal, density,
                       window if window < n else 0)
        for name in SCHEDULES:
            row = _row(name, _predict(wl, _schedule(name), prof, "analytic"),
                       schedule_time(wl, name, prof))
            rows.append({"seq_len": n, "schedule": name, "global_bytes": row["global_bytes"],
                         "dram_bytes": row["dram_bytes"], "time_ms": row["time_ms"],
                         "time_from": row["time_from"], "rates": row["rates"],
                         "predicted_ms": row["predicted_ms"],
                         "extra_memory_bytes": _extra_memory(row, wl)})
    table = pd.DataFrame(rows)
    n = np.asarray(seq_lens, dtype=float)
    d = float(head_dim)
    m_elems = float(prof.smem_bytes_per_block) / {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    naive_shape = n * d + n**2
    flash_shape = n**2 * d**2 / m_elems
    first = table[table["seq_len"] == seq_lens[0]].set_index("schedule")["global_bytes"]
    bounds = pd.DataFrame({
        "seq_len": seq_lens,
        "naive_bound": naive_shape * first["naive"] / naive_shape[0],
        "flash_bound": flash_shape * first["flash1"] / flash_shape[0],
    })
    return table, bounds


def scaling_columns(table: pd.DataFrame | None = None) -> dict:
    from dashboard.fmt import Col
    label = time_label(table) if table is not None and not table.empty else "Predicted time"
    return {"seq_len": Col("N", "count"), "schedule": Col("Schedule"),
            "global_bytes": Col("Global memory", "bytes"), "dram_bytes": Col("DRAM", "bytes"),
            "time_ms": Col(label, "ms"),
            "extra_memory_bytes": Col("Memory beyond Q, K, V, O", "bytes")}


def _extra_memory(row: dict, w) -> float:
    """Device memory a forward allocates besides Q, K, V and O (bytes): naive holds the N×N
    scores S and probabilities P (dtype) at once; flash2 keeps the logsumexp, flash1 the row
    statistics l and m (float32 per query row). Counted here because the model has no memory
    model."""
    rows = w.batch * w.heads * w.seq_len_q
    if row["schedule"] == "naive":
        return float(2 * rows * w.seq_len_k * w.dtype_bytes)
    return float(rows * 4 * (2 if row["schedule"] == "flash1" else 1))


# ------------------------------------------------------------------------------------------------
# Scaling, measured: each implementation's time and TFLOP/s against N, beside its priced plan
# ------------------------------------------------------------------------------------------------
#: The implementations a benchmark file times, in the order the pages list them.
IMPLEMENTATIONS = ("ioaware-numba/wgmma", "ioaware-numba/mma", "ioaware-numba/tf32",
                   "ioaware-numba", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math",
                   "eager")


def _bench_flops(batch, heads, seq_len_q, seq_len_k, head_dim, causal, pass_) -> float:
    # the benchmarks' convention, for installations without the benchmarks package
    f = 4.0 * batch * heads * seq_len_q * seq_len_k * head_dim * (0.5 if causal else 1.0)
    return f * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_]


def attention_flops(batch: int, heads: int, seq_len_q: int, seq_len_k: int, head_dim: int,
                    causal: bool, pass_: str) -> float:
    """The FLOPs a benchmark file's TFLOP/s counts (``benchmarks.common.attention_flops``: 4 B H
    Nq Nk d per forward, halved when causal, the backward 2.5 forwards, forward + backward
    3.5): the useful work of the problem, the same for every implementation, so that TFLOP/s
    compare as 1 / time does."""
    try:
        fn = importlib.import_module("benchmarks.common").attention_flops
    except Exception:  # noqa: BLE001 - the same count without the benchmarks package
        fn = _bench_flops
    return float(fn(batch, heads, seq_len_q, seq_len_k, head_dim, bool(causal), pass_))


def record_family(rec) -> str:
    """A results record's implementation: its ``kernel``, with our kernels' variant
    (``ioaware-numba/mma``, ``ioaware-numba/tf32``; the CUDA-core kernels are plain
    ``ioaware-numba``), as :data:`FAMILY_LABELS` names them."""
    kernel = str(rec.get("kernel"))
    if kernel != "ioaware-numba":
        return kernel
    variant = rec.get("variant") or ("mma" if rec.get("implementation") == "kernels.flash_mma_fwd"
                                     else "simt")
    return kernel if variant == "simt" else f"{kernel}/{variant}"


def _impl_order(key: str) -> tuple:
    return (IMPLEMENTATIONS.index(key) if key in IMPLEMENTATIONS else len(IMPLEMENTATIONS), key)


def _combo_text(head_dim, dtype, causal, pass_) -> str:
    return (f"d = {head_dim}, {dtype}, {'causal' if causal else 'not causal'}, "
            f"{PASS_LABELS.get(pass_, pass_)}")


def _file_combos(records: list) -> str:
    """What a results file measures, in one line: its head dims, dtypes, masks and passes."""
    def listed(values, show=str):
        order = sorted(values, key=lambda v: (0, v, "") if isinstance(v, (int, float))
                       else (1, 0, str(v)))
        return ", ".join(show(v) for v in order)
    ds = {r.get("head_dim") for r in records}
    dts = {r.get("dtype") for r in records}
    cs = {bool(r.get("causal")) for r in records}
    ps = {r.get("pass") for r in records}
    return (f"d {listed(ds)} · {listed(dts)} · "
            f"{listed(cs, lambda c: 'causal' if c else 'not causal')} · "
            f"{listed(ps, lambda p: PASS_LABELS.get(p, p))}")


def _plan_cost(rec: dict, prof) -> tuple[float, str] | None:
    """``(time_ms, rates text)`` of a record's plans (`sim.plans.plans_for_record`) priced on
    ``prof``, or None where no plan prices it."""
    plans_mod = importlib.import_module("sim.plans")
    plan_mod = importlib.import_module("sim.plan")
    try:
        plans = plans_mod.plans_for_record(rec)
        if not plans:
            return None
        costs = [plan_mod.price(pl, prof) for pl in plans]
    except (ValueError, TypeError, KeyError):
        return None
    return sum(c.time_ms for c in costs), _costs_rates(costs)


_SHAPE_FIELDS = ("batch", "heads", "heads_kv", "seq_len_q", "seq_len_k")


@st.cache_data(show_spinner=False, max_entries=64)
def scaling_measured(digest: str, head_dim: int, dtype: str, causal: bool, pass_: str,
                     profile: str | None = None, rates: bytes | None = None,
                     _records: list | None = None) -> dict:
    """A results file's times against N for one (head dim, dtype, mask, pass), one series per
    implementation, beside the model's prediction for each (``digest`` identifies ``_records``,
    the file's records with their provenance, for the cache). Returns a dict:

    * ``measured``: one row per (implementation, N): ``impl`` (:func:`record_family`),
      ``seq_len``, ``batch``, ``heads``, ``time_ms`` (the fastest where the file times several
      configurations of it: ``configs`` says how many), ``tflops`` (:func:`attention_flops` /
      time, as the file's benchmark counts them);
    * ``predicted``: one row per (implementation, N) a plan prices: the same key and shape,
      ``time_ms`` (`sim.plans.plans_for_record` of a record of that implementation at that N,
      priced by `sim.plan.price` on the profile, with the rates file's measured rates where it
      is usable) and ``tflops`` (the same FLOPs / that time);
    * ``no_plan``: implementations measured here that no plan prices;
    * ``profile`` / ``gpu``: what the model priced (the profile of the file's GPU; ``profile``,
      the sidebar's, where none matches: ``profile_guessed``), ``rates`` ("datasheet rates" /
      "measured rates"), ``rates_error``;
    * ``empty``: None, or the one line that says the file has no such records and what it has.

    The record priced at each N is the implementation's own measured record there (the fastest
    configuration) or, at an N where it was not measured, its record at the nearest N with the
    shape (batch, heads) the file used at that N: what "this implementation at N" means."""
    records = [r for r in (_records or []) if r.get("kernel")]
    out = {"measured": pd.DataFrame(columns=["impl", "seq_len", "batch", "heads", "time_ms",
                                             "tflops", "configs"]),
           "predicted": pd.DataFrame(columns=["impl", "seq_len", "batch", "heads", "time_ms",
                                              "tflops", "rates"]),
           "no_plan": [], "profile": profile, "gpu": "", "rates": "datasheet rates",
           "rates_error": None, "profile_guessed": False, "empty": None}
    gpu = str(((records[0].get("provenance") or {}) if records else {}).get("gpu") or "")
    out["gpu"] = gpu
    sel = [r for r in records
           if r.get("head_dim") == head_dim and r.get("dtype") == dtype
           and bool(r.get("causal")) == bool(causal) and r.get("pass") == pass_
           and isinstance(r.get("time_ms"), (int, float)) and r["time_ms"] > 0
           and (r.get("seq_len_k") in (None, r.get("seq_len_q")))]
    if not sel:
        out["empty"] = (f"has no records of {_combo_text(head_dim, dtype, causal, pass_)}; it "
                        f"measures {_file_combos(records)}." if records else "holds no records.")
        return out
    # the measured series: the fastest record per (implementation, N)
    best: dict = {}
    counts: dict = {}
    for r in sel:
        key = (record_family(r), int(r["seq_len_q"]))
        counts[key] = counts.get(key, 0) + 1
        if key not in best or r["time_ms"] < best[key]["time_ms"]:
            best[key] = r
    rows = []
    for (impl, n), r in sorted(best.items(), key=lambda kv: (_impl_order(kv[0][0]), kv[0][1])):
        fl = attention_flops(r["batch"], r["heads"], n, r.get("seq_len_k") or n, head_dim,
                             causal, pass_)
        rows.append({"impl": impl, "seq_len": n, "batch": int(r["batch"]),
                     "heads": int(r["heads"]), "time_ms": float(r["time_ms"]),
                     "tflops": fl / (float(r["time_ms"]) * 1e-3) / 1e12,
                     "configs": counts[(impl, n)]})
    out["measured"] = pd.DataFrame(rows)
    # the model: each implementation's plan at every N of the file, on its GPU's profile
    name = profile_for_gpu(gpu) if gpu else None
    if name is None:
        name, out["profile_guessed"] = profile or default_profile_name(), True
    out["profile"] = name
    prof, out["rates_error"] = rated_profile(name, None, rates)
    shape = {}
    for r in sel:
        shape.setdefault(int(r["seq_len_q"]), {k: r.get(k) for k in _SHAPE_FIELDS})
    preds, rates_seen = [], set()
    for impl in sorted({k[0] for k in best}, key=_impl_order):
        own = {n: r for (i, n), r in best.items() if i == impl}
        for n in sorted(shape):
            near = own.get(n) or own[min(own, key=lambda m: (abs(math.log(m / n)), m))]
            rec = {**near, **shape[n]} if n not in own else dict(near)
            priced = _plan_cost(rec, prof)
            if priced is None:
                continue
            t, how = priced
            rates_seen.add(how)
            fl = attention_flops(rec["batch"], rec["heads"], n, rec.get("seq_len_k") or n,
                                 head_dim, causal, pass_)
            preds.append({"impl": impl, "seq_len": n, "batch": int(rec["batch"]),
                          "heads": int(rec["heads"]), "time_ms": t,
                          "tflops": fl / (t * 1e-3) / 1e12, "rates": how})
    if preds:
        out["predicted"] = pd.DataFrame(preds)
    out["rates"] = "measured rates" if "measured rates" in rates_seen else "datasheet rates"
    planned = set(out["predicted"]["impl"])
    out["no_plan"] = [i for i in sorted({k[0] for k in best}, key=_impl_order) if i not in planned]
    return out


def scaling_at(result: dict, seq_len: int) -> pd.DataFrame:
    """The measured and predicted time and TFLOP/s of every implementation at one N (the
    sidebar's): ``impl``, ``measured_ms``, ``predicted_ms``, ``measured_tflops``,
    ``predicted_tflops``, ``ratio`` (predicted / measured time); empty where the file measured
    nothing at that N."""
    m = result["measured"]
    m = m[m["seq_len"] == seq_len]
    if m.empty:
        return pd.DataFrame(columns=["impl", "measured_ms", "predicted_ms", "measured_tflops",
                                     "predicted_tflops", "ratio"])
    p = result["predicted"]
    p = p[p["seq_len"] == seq_len].set_index("impl")
    rows = []
    for _, r in m.iterrows():
        pm = float(p.loc[r["impl"], "time_ms"]) if r["impl"] in p.index else np.nan
        pt = float(p.loc[r["impl"], "tflops"]) if r["impl"] in p.index else np.nan
        rows.append({"impl": r["impl"], "measured_ms": r["time_ms"], "predicted_ms": pm,
                     "measured_tflops": r["tflops"], "predicted_tflops": pt,
                     "ratio": pm / r["time_ms"]})
    return pd.DataFrame(rows)


def scaling_measured_table(result: dict) -> tuple[pd.DataFrame, dict]:
    """The measured and predicted series side by side, one row per (implementation, N):
    ``(DataFrame, {column: fmt.Col})``."""
    from dashboard.fmt import Col

    m = result["measured"].rename(columns={"time_ms": "measured_ms", "tflops": "measured_tflops"})
    p = result["predicted"][["impl", "seq_len", "time_ms", "tflops"]].rename(
        columns={"time_ms": "predicted_ms", "tflops": "predicted_tflops"})
    df = m.merge(p, on=["impl", "seq_len"], how="left")
    df["impl"] = df["impl"].map(family_label)
    pred = rates_label(result["rates"])
    cols = {"impl": Col("Implementation"), "seq_len": Col("N", "count"),
            "batch": Col("Batch", "count"), "heads": Col("Heads", "count"),
            "measured_ms": Col("Measured", "ms"), "predicted_ms": Col(pred, "ms"),
            "measured_tflops": Col("Measured TFLOP/s", "num"),
            "predicted_tflops": Col(f"TFLOP/s {pred[0].lower()}{pred[1:]}", "num")}
    if (df["configs"] > 1).any():
        cols["configs"] = Col("Configurations timed", "count",
                              "The file times several configurations (tiles) of this "
                              "implementation here; the fastest is shown.")
    return df, cols


# ------------------------------------------------------------------------------------------------
# Step through: the event trace of a small problem
# ------------------------------------------------------------------------------------------------
def trace_events(schedule: str, seq_len: int, head_dim: int, block_q: int, block_k: int,
                 causal: bool, direction: str = "forward", dtype: str = "fp16"):
    """The cost model's event trace of one head (batch 1) as ``(events, tensor_shapes)``.

    ``events``: DataFrame, one row per event in trace order: phase, program, step, op ("load",
    "store", "atomic", "compute"), tensor ("" for compute), q_block, k_block (0-based, -1: none),
    row_start, row_stop, bytes. ``tensor_shapes``: tensor -> (rows, bytes per row).
    """
    sim = _sim()
    ops = importlib.import_module("sim.trace").OPS
    pass_ = "fwd" if direction == "forward" else "bwd"
    wl = _workload(seq_len, head_dim, 1, 1, dtype, pass_, causal, 1.0)
    tiled = schedule != "naive"
    tr = sim.trace(wl, sim.Schedule(schedule, block_q if tiled else None, block_k if tiled else None),
                   block_q=block_q if tiled else None, block_k=block_k if tiled else None)
    c = tr.columns
    names = np.asarray(list(tr.tensors) + [""])
    events = pd.DataFrame({
        "phase": np.asarray(tr.phases)[c["phase"]], "program": c["program"], "step": c["step"],
        "op": np.asarray(ops)[c["op"]],
        "tensor": names[np.where(c["tensor"] >= 0, c["tensor"], len(tr.tensors))],
        "q_block": c["m"], "k_block": c["n"], "row_start": c["row_start"],
        "row_stop": c["row_stop"], "bytes": c["bytes"]})
    shapes = {t: (s[2], s[3]) for t, s in tr.meta["tensor_shape"].items()}
    return events, shapes


@st.cache_resource(show_spinner=False, max_entries=64)
def step_walk(schedule: str, seq_len: int, head_dim: int, block_q: int, block_k: int,
              causal: bool, direction: str = "forward", dtype: str = "fp16"):
    """The ``dashboard.walk.Walk`` of one problem (shared, not copied: do not mutate)."""
    from dashboard import walk

    events, shapes = trace_events(schedule, seq_len, head_dim, block_q, block_k, causal,
                                  direction, dtype)
    return walk.build_walk(events, shapes, schedule=schedule, direction=direction,
                           seq_len=seq_len, block_q=block_q, block_k=block_k, causal=causal)


@st.cache_resource(show_spinner=False, max_entries=32)
def step_inputs(seq_len: int, head_dim: int, kind: str, seed: int = 0) -> dict:
    from dashboard import walk
    return walk.inputs(seq_len, head_dim, kind, seed)


def tiled_row_error(x: dict, row: int, block_q: int, block_k: int, causal: bool,
                    o_exact: np.ndarray) -> float | None:
    """max |exact output − ioaware's tiled float32 output| for ``row``, or None if the tiled
    path is unavailable: the walk's arithmetic checked against the library's."""
    try:
        from ioaware.block_info import BlockInfo
        from ioaware.tiled import tiled_forward
    except Exception:  # noqa: BLE001 - the cross-check is optional
        return None
    q, k, v, scale = x["q"], x["k"], x["v"], x["scale"]
    n = q.shape[0]
    info = BlockInfo(n, n, block_q, block_k, causal)
    shape = (1, 1, 1, n, q.shape[1])
    out, _ = tiled_forward(q.reshape(shape).astype(np.float32), k.reshape(shape).astype(np.float32),
                           v.reshape(shape).astype(np.float32), scale=scale, info=info,
                           bh=np.zeros((1, 1, 1), dtype=np.int64))
    return float(np.abs(out[0, 0, 0, row].astype(np.float64) - o_exact).max())


# ------------------------------------------------------------------------------------------------
# Results files: listing, validation, loading
# ------------------------------------------------------------------------------------------------
PROVENANCE_KEYS = ("gpu", "driver", "cuda", "torch", "numba", "numba_cuda", "date", "command")
#: Uploads above this size are refused (also ``server.maxUploadSize`` in .streamlit/config.toml).
MAX_UPLOAD_MB = 50
#: Problems a validation lists at most.
MAX_PROBLEMS = 20


class ResultsUnavailable(RuntimeError):
    """``sim.results`` (the results-file schema) cannot be imported."""


def _results_module():
    try:
        return importlib.import_module("sim.results")
    except Exception as exc:  # noqa: BLE001
        raise ResultsUnavailable(f"the results-file schema is not importable: "
                                 f"{type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a results file: ``where`` (e.g. "record 3 (records[2])"),
    ``what``, the 0-based ``record`` index if it is about a record, and whether it is about
    the provenance only."""

    where: str
    what: str
    record: int | None = None
    provenance: bool = False

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


class ResultsInvalid(ValueError):
    """A results file does not follow the schema; ``problems`` lists what is wrong (record
    problems first, provenance last) and ``total`` how many there are."""

    def __init__(self, name: str, problems: list[Problem], total: int | None = None):
        self.name, self.problems = name, problems
        self.total = len(problems) if total is None else total
        super().__init__(f"{name}: " + "; ".join(map(str, problems[:3]))
                         + (f" (and {self.total - 3} more)" if self.total > 3 else ""))


def format_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this results file is malformed" (shown to the user, not raised)."""
    types: list[type[BaseException]] = [ResultsInvalid, ValueError, UnicodeDecodeError]
    try:
        types.insert(0, _results_module().ResultsFormatError)
    except ResultsUnavailable:
        pass
    return tuple(types)


_KIND_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
RESULT_PASSES = ("fwd", "bwd", "fwd+bwd")
RESULT_DTYPES = ("fp16", "bf16", "fp32")


def _type_ok(v, kind) -> bool:
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "bool":
        return isinstance(v, bool)
    return isinstance(v, str)


def results_problems(obj) -> list[Problem]:
    """Every way a parsed results object breaks the schema (``sim.results``' fields, kernels and
    rules), in order: the file's shape, then each record, then the provenance."""
    mod = _results_module()
    fields, kernels = mod.RECORD_FIELDS, mod.KERNELS
    if not isinstance(obj, dict):
        return [Problem("file", f"must be a JSON object, is {type(obj).__name__}")]
    top, recs_out, prov_out = [], [], []
    if obj.get("schema") != mod.SCHEMA:
        top.append(Problem("schema", f"must be {mod.SCHEMA!r}, is {obj.get('schema')!r}"))
    recs = obj.get("records")
    if not isinstance(recs, list):
        top.append(Problem("records", "must be a list of records"
                           + ("" if recs is None else f", is {type(recs).__name__}")))
        recs = []
    for i, rec in enumerate(recs):
        where = f"record {i + 1} (records[{i}])"
        if not isinstance(rec, dict):
            recs_out.append(Problem(where, "must be an object", i))
            continue
        missing = [k for k in fields if k not in rec]
        if missing:
            recs_out.append(Problem(where, "missing " + ", ".join(f"`{k}`" for k in missing), i))
        for k, (kind, nullable) in fields.items():
            if k not in rec or (rec[k] is None and nullable) or _type_ok(rec[k], kind):
                continue
            recs_out.append(Problem(where, f"`{k}` must be {_KIND_TEXT.get(kind, kind)}"
                                    f"{' or null' if nullable else ''}, is {rec[k]!r}", i))
        for k, allowed in (("kernel", kernels), ("pass", RESULT_PASSES), ("dtype", RESULT_DTYPES)):
            if isinstance(rec.get(k), str) and rec[k] not in allowed:
                recs_out.append(Problem(where, f"`{k}` must be one of {', '.join(allowed)}, "
                                        f"is {rec[k]!r}", i))
        t = rec.get("time_ms")
        if _type_ok(t, "float") and t <= 0:
            recs_out.append(Problem(where, f"`time_ms` must be > 0, is {t!r}", i))
    prov = obj.get("provenance")
    if not isinstance(prov, dict):
        prov_out.append(Problem("provenance", "must be an object with "
                                + ", ".join(mod.PROVENANCE_FIELDS), provenance=True))
    else:
        for k in mod.PROVENANCE_FIELDS:
            if not isinstance(prov.get(k), str):
                prov_out.append(Problem(f"provenance.{k}", "missing" if k not in prov else
                                        f"must be a string, is {prov[k]!r}", provenance=True))
    return top + recs_out + prov_out


def shipped_results() -> list[Path]:
    """Results files the app offers: those named in ``$IOAWARE_RESULTS`` (files or directories,
    separated by ``os.pathsep``) first, then the repository's ``results/*.json`` of the results
    schema, largest first so that the default is the fullest sweep."""
    files: list[Path] = []
    for entry in filter(None, os.environ.get("IOAWARE_RESULTS", "").split(os.pathsep)):
        path = Path(entry).expanduser()
        files += sorted(path.glob("*.json")) if path.is_dir() else [path] if path.is_file() else []
    try:
        shipped = [Path(f) for f in _results_module().shipped_results()]
    except ResultsUnavailable:
        shipped = sorted((ROOT / "results").glob("*.json"))
    files += sorted(shipped, key=lambda p: -p.stat().st_size)
    seen, unique = set(), []
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append(f)
    return unique


def _parse(content: bytes, name: str):
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultsInvalid(name, [Problem("file", f"is not UTF-8 text ({exc.reason} at byte "
                                                    f"{exc.start:,})")]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsInvalid(name, [Problem("file", f"is not valid JSON: {exc.msg} at line "
                                                    f"{exc.lineno}, column {exc.colno}")]) from None


def _validated(obj, name: str) -> list[Problem]:
    """Validate ``obj``: raise ResultsInvalid listing every problem (at most MAX_PROBLEMS)
    unless only the provenance is incomplete; return those provenance problems (shown as a
    warning). ``sim.results.validate_results`` has the last word on the records."""
    mod = _results_module()
    problems = results_problems(obj)
    if any(not p.provenance for p in problems):
        raise ResultsInvalid(name, problems[:MAX_PROBLEMS], len(problems))
    # the schema's own validator on the records (the provenance completed where it is not)
    prov = obj.get("provenance") if isinstance(obj.get("provenance"), dict) else {}
    filled = dict(prov)
    for k in mod.PROVENANCE_FIELDS:
        if not isinstance(prov.get(k), str):
            filled[k] = "(not recorded)"
    try:
        mod.validate_results({**obj, "provenance": filled}, name)
    except mod.ResultsFormatError as exc:
        raise ResultsInvalid(name, [Problem("file", str(exc).removeprefix(f"{name}: "))]) from None
    return problems


#: Columns of a results record kept in the page's records table (the rest stay in ``raw``).
_RECORD_COLUMNS = ("kernel", "variant", "schedule", "pass", "dtype", "batch", "heads", "heads_kv",
                   "seq_len_q", "seq_len_k", "head_dim", "causal", "block_q", "block_k", "time_ms")


def _load(content: bytes, name: str) -> dict:
    obj = _parse(content, name)
    warnings = _validated(obj, name)
    provenance = dict(obj.get("provenance") or {}) if isinstance(obj.get("provenance"), dict) else {}
    raw = [dict(r, provenance=provenance) for r in obj["records"]]
    df = pd.DataFrame.from_records([{k: r.get(k) for k in _RECORD_COLUMNS} for r in obj["records"]],
                                   columns=list(_RECORD_COLUMNS))
    if not df.empty:
        df.insert(0, "gpu", provenance.get("gpu", "unknown"))
    return {"records": df, "raw": raw, "provenance": provenance, "name": name,
            "digest": hashlib.sha1(content).hexdigest(), "warnings": warnings,
            "size": len(content)}


@st.cache_resource(show_spinner=False, max_entries=4)
def _load_upload(digest: str, name: str, _content: bytes) -> dict:
    return _load(_content, name)


def load_results_bytes(content: bytes, name: str = "<upload>") -> dict:
    """Validate a results file given as bytes; return ``{"records": DataFrame, "raw": [record
    dicts with provenance], "provenance", "name", "digest", "warnings": [Problem] (provenance
    incomplete), "size"}`` (cached by content, shared: do not mutate).

    Raises :class:`ResultsInvalid` listing every problem (at most :data:`MAX_PROBLEMS`, record
    problems before provenance ones), or when the file is larger than :data:`MAX_UPLOAD_MB`.
    """
    if len(content) > MAX_UPLOAD_MB * 10**6:
        raise ResultsInvalid(name, [Problem("file", f"is {len(content) / 1e6:,.0f} MB; files up "
                                                    f"to {MAX_UPLOAD_MB} MB are accepted")])
    return _load_upload(hashlib.sha1(content).hexdigest(), name, content)


@st.cache_resource(show_spinner=False, max_entries=8)
def _load_path(path: str, mtime_ns: int, size: int) -> dict:
    p = Path(path)
    return _load(p.read_bytes(), p.name)


def load_results_path(path: str | Path) -> dict:
    """:func:`load_results_bytes` for a file on disk (cached by path, time and size)."""
    path = Path(path)
    stat = path.stat()
    return _load_path(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def provenance_table(provenance: dict) -> pd.DataFrame:
    """The provenance block as a two-column table of its scalar fields (missing ones say so)."""
    rows = [{"field": k, "value": str(provenance.get(k, "— (not recorded)"))} for k in PROVENANCE_KEYS]
    rows += [{"field": k, "value": str(v)} for k, v in provenance.items()
             if k not in PROVENANCE_KEYS and not isinstance(v, (dict, list))]
    return pd.DataFrame(rows)


def results_choices() -> list[str]:
    """Display names of the results files the app offers (see :func:`shipped_results`)."""
    return [_choice_name(p) for p in shipped_results()]


def _choice_name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def load_results_choice(name: str) -> dict:
    """Load one of :func:`results_choices` by its display name."""
    for path in shipped_results():
        if _choice_name(path) == name:
            return load_results_path(path)
    raise FileNotFoundError(f"results file {name!r} is no longer available")


# -- the format, described and exemplified -------------------------------------------------------
#: What each record field means (the schema's fields: a test keeps this complete).
RECORD_FIELD_HELP = {
    "kernel": "which implementation ran: " + ", ".join(f"`{k}` ({v})" for k, v in {
        "ioaware-numba": "this project's kernels", "sdpa-flash": "PyTorch SDPA FLASH",
        "sdpa-efficient": "SDPA EFFICIENT", "sdpa-cudnn": "SDPA cuDNN", "sdpa-math": "SDPA MATH",
        "eager": "PyTorch eager attention"}.items()),
    "schedule": "the algorithm: `naive`, `flash1` or `flash2`",
    "pass": "`fwd`, `bwd` or `fwd+bwd`",
    "dtype": "`fp16`, `bf16` or `fp32`",
    "batch": "batch size", "heads": "query heads", "heads_kv": "key/value heads (GQA: fewer)",
    "seq_len_q": "query sequence length", "seq_len_k": "key sequence length",
    "head_dim": "head dimension d", "causal": "causal masking",
    "block_q": "query rows per tile (null: not a tiled kernel, or chosen by the library)",
    "block_k": "key columns per tile (null as block_q)",
    "time_ms": "median time of one call, milliseconds (> 0)",
    "time_ms_p10": "10th percentile of the timed calls, ms",
    "time_ms_p90": "90th percentile of the timed calls, ms",
    "peak_extra_bytes": "device memory allocated beyond the inputs and outputs",
    "dram_read_bytes": "DRAM bytes read (Nsight Compute `dram__bytes_read.sum`)",
    "dram_write_bytes": "DRAM bytes written (`dram__bytes_write.sum`)",
    "l2_bytes": "L2 traffic (`lts__t_bytes.sum`)",
    "global_load_bytes": "global-memory load bytes (`l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum`)",
    "global_store_bytes": "global-memory store bytes (`l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum`)",
    "flops_executed": "floating-point operations executed (2·FFMA + FADD + FMUL, + tensor ops)",
}
PROVENANCE_FIELD_HELP = {
    "gpu": "the GPU's name as PyTorch reports it (picks the GPU profile)", "driver": "driver version",
    "cuda": "CUDA version", "torch": "PyTorch version", "numba": "Numba version",
    "numba_cuda": "numba-cuda version", "date": "when it was measured (ISO 8601)",
    "command": "the command that wrote the file",
}


def results_format() -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """``(record fields, provenance fields, schema id)`` of the results format, from the schema
    itself: field, type, whether null is allowed, meaning."""
    mod = _results_module()
    rec = pd.DataFrame([{"field": k, "type": kind, "null allowed": "yes" if nullable else "no",
                         "meaning": RECORD_FIELD_HELP.get(k, "")}
                        for k, (kind, nullable) in mod.RECORD_FIELDS.items()])
    prov = pd.DataFrame([{"field": k, "type": "str", "meaning": PROVENANCE_FIELD_HELP.get(k, "")}
                         for k in mod.PROVENANCE_FIELDS])
    return rec, prov, mod.SCHEMA


def example_results() -> dict:
    """A small valid results object built from the schema: two records of one workload (this
    project's kernel and PyTorch's SDPA FLASH) whose numbers are the cost model's predictions
    (roofline time at peak rates, bytes and FLOPs), marked as such in the provenance: an example
    of the format, not a measurement."""
    mod = _results_module()
    sim = _sim()
    w = sim.Workload(batch=1, heads=16, seq_len_q=2048, head_dim=64, dtype="fp16")
    recs = []
    for kernel, bq, bk in (("ioaware-numba", 64, 64), ("sdpa-flash", None, None)):
        p = sim.predict(w, sim.Schedule("flash2", bq, bk), "h100", l2="analytic")
        rec = {}
        for k, (kind, nullable) in mod.RECORD_FIELDS.items():
            rec[k] = None if nullable else {"int": 0, "float": 0.0, "bool": False, "str": ""}[kind]
        rec.update(kernel=kernel, schedule="flash2", **{"pass": "fwd"}, dtype="fp16", batch=1,
                   heads=16, heads_kv=16, seq_len_q=2048, seq_len_k=2048, head_dim=64,
                   causal=False, block_q=bq, block_k=bk, time_ms=round(p.predicted_ms, 6),
                   time_ms_p10=round(p.predicted_ms, 6), time_ms_p90=round(p.predicted_ms, 6),
                   dram_read_bytes=int(p.dram_read_bytes), dram_write_bytes=int(p.dram_write_bytes),
                   global_load_bytes=int(p.hbm_read_bytes), global_store_bytes=int(p.hbm_write_bytes),
                   flops_executed=int(p.flops))
        recs.append({k: rec[k] for k in mod.RECORD_FIELDS})
    prov = {k: "example" for k in mod.PROVENANCE_FIELDS}
    prov.update(gpu="EXAMPLE, not a measurement: values are the cost model's for an NVIDIA H100",
                date="2000-01-01T00:00:00+00:00",
                command="dashboard example: numbers from the cost model, not measured")
    return {"schema": mod.SCHEMA, "provenance": prov, "records": recs}


def example_results_json() -> str:
    return json.dumps(example_results(), indent=1) + "\n"


# ------------------------------------------------------------------------------------------------
# Predicted vs measured: the join, errors, the trace replay in the background
# ------------------------------------------------------------------------------------------------
#: metric -> (short label, what it compares)
METRIC_LABELS = {
    "global_bytes": ("Global-memory bytes", "global-memory (L2 ↔ SM) bytes against Nsight "
                     "Compute's load + store bytes"),
    "dram_bytes": ("DRAM bytes", "DRAM bytes read + written against Nsight Compute's"),
    "flops": ("FLOPs", "FLOPs against the executed floating-point instructions"),
    "time_raw": ("Predicted time", "time: the plan of the kernels the record ran, priced at the "
                 "chosen rates (by default those measured on the GPU where a rates file has "
                 "them, else its datasheet peaks), where a plan "
                 "prices it, else the roofline at peak rates (a bound), against the median "
                 "measured time"),
    "time_calibrated": ("Calibrated time", "time: the roofline with efficiencies fitted per "
                        "kernel on these records (in-sample)"),
    "time_heldout": ("Calibrated time, held out", "time: efficiencies fitted on the kernel's "
                     "records at the other sequence lengths"),
}


def compared_metrics() -> dict:
    """``{metric: short label}`` of the metrics the comparison reports."""
    return {m: METRIC_LABELS.get(m, (spec[0],))[0]
            for m, spec in importlib.import_module("sim.compare").METRICS.items()}


def _join(records: list, profile: str, l2: str, progress=None, workers=None,
          rates_path: str | None = None) -> dict:
    cmp = importlib.import_module("sim.compare")
    df = cmp.compare(list(records), profile, l2=l2, progress=progress, workers=workers,
                     rates=[rates_path] if rates_path else None)
    df = df.drop(columns=[c for c in ("efficiency",) if c in df])
    return {"records": df, "summary": cmp.summary(df), "blocks": cmp.block_size_check(df),
            "l2": l2}


@st.cache_resource(show_spinner=False, max_entries=16)
def compare_measured(digest: str, profile: str, _records: list, rates_path: str | None = None
                     ) -> dict:
    """Join measured records with the model's predictions on ``profile``, DRAM bytes from the
    analytic L2 estimate; records priced from a plan use the measured rates of ``rates_path``
    (:func:`rates_file_path`) when it was measured on their GPU. ``digest`` identifies the
    records for the cache. Returns ``{"records": DataFrame (one row per record: key fields,
    measured_/predicted_/rel_error_ per metric, ``model_source``, ``rates``), "summary",
    "blocks", "l2"}`` (shared: do not mutate). In this process: the analytic estimate takes
    about a millisecond a record, less than starting worker processes."""
    return _join(_records, profile, "analytic", workers=1, rates_path=rates_path)


def rates_file_path(rates: bytes | None) -> str | None:
    """A path holding a rates file's bytes (for `sim.compare`, which reads rates files by
    path): one file per content in the temporary directory; None without rates."""
    if rates is None:
        return None
    import tempfile

    folder = Path(tempfile.gettempdir()) / "ioaware-dashboard-rates"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha1(rates).hexdigest()}.json"
    if not path.exists():
        path.write_bytes(rates)
    return str(path)


def priced_by(view: pd.DataFrame) -> list[str]:
    """How each joined record's predicted time was obtained (:func:`priced_by_text`)."""
    src = view.get("model_source", pd.Series(index=view.index, dtype=object))
    rates = view.get("rates", pd.Series(index=view.index, dtype=object))
    return [("—" if not isinstance(s_, str) else
             priced_by_text(PRICED_BY_PLAN if s_ == "plan" else PRICED_BY_ROOFLINE,
                            f"{r} rates" if isinstance(r, str) else "datasheet rates"))
            for s_, r in zip(src, rates)]


def plan_priced(view: pd.DataFrame) -> tuple[int, int]:
    """``(records priced from a plan, of which at measured rates)`` among joined records."""
    if view.empty or "model_source" not in view:
        return 0, 0
    planned = view["model_source"].eq("plan")
    rated = planned & view["rates"].eq("measured") if "rates" in view else planned & False
    return int(planned.sum()), int(rated.sum())


def error_against_n(view: pd.DataFrame) -> pd.DataFrame:
    """The predicted time's relative error against N, one row per record of ``view`` (the
    joined records, filtered): ``family``, ``pass``, ``dtype``, ``head_dim``, ``causal``,
    ``seq_len`` (the record's N), ``rel_error_time`` ((predicted − measured) / measured; NaN
    where nothing predicts it), ``priced_by``."""
    cols = ["family", "pass", "dtype", "head_dim", "causal", "seq_len", "rel_error_time",
            "priced_by"]
    if view.empty:
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame({"family": view["family"].astype(str), "pass": view["pass"],
                        "dtype": view["dtype"], "head_dim": view["head_dim"],
                        "causal": view["causal"].astype(bool),
                        "seq_len": pd.to_numeric(view["seq_len_q"]).astype(int),
                        "rel_error_time": pd.to_numeric(view["rel_error_time"], errors="coerce"),
                        "priced_by": priced_by(view)})
    return out.reset_index(drop=True)[cols]


#: The metrics of the per-family summary, in its column order, with their short names.
FAMILY_METRICS = {"time_raw": "Predicted time", "global_bytes": "Global bytes",
                  "dram_bytes": "DRAM bytes", "flops": "FLOPs"}


def family_summary(view: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per kernel family: how many records, how their time was predicted, and the median and
    worst |relative error| of each metric of :data:`FAMILY_METRICS` (`sim.compare.summary` per
    family): ``(DataFrame, {column: fmt.Col})``, metrics without any value left out."""
    from dashboard.fmt import Col

    cols = {"family": Col("Kernel"), "records": Col("Records", "count"),
            "priced_by": Col("Time from")}
    if view.empty:
        return pd.DataFrame(columns=list(cols)), cols
    cmp = importlib.import_module("sim.compare")
    long = cmp.summary(view, by_kernel=True)
    by = {}
    for fam, g in view.groupby("family", sort=False):
        kinds = sorted(set(priced_by(g)) - {"—"})
        by[fam] = {"family": fam, "records": len(g), "priced_by": "; ".join(kinds) or "—"}
    for metric in FAMILY_METRICS:
        part = long[long["metric"] == metric] if not long.empty else long
        if part.empty:
            continue
        label = FAMILY_METRICS[metric]
        for _, r in part.iterrows():
            if r["records"] in by:
                by[r["records"]][f"{metric}_median"] = r["median_abs_err_pct"] / 100.0
                by[r["records"]][f"{metric}_worst"] = r["max_abs_err_pct"] / 100.0
        cols[f"{metric}_median"] = Col(f"{label}: median", "pct",
                                       f"Median |relative error| of {label.lower()}.")
        cols[f"{metric}_worst"] = Col(f"{label}: worst", "pct",
                                      f"Largest |relative error| of {label.lower()}.")
    order = sorted(by, key=_impl_order)
    df = pd.DataFrame([by[f] for f in order])
    df["family"] = df["family"].map(family_label)
    return df, {k: v for k, v in cols.items() if k in df}


def roofline_points(view: pd.DataFrame) -> pd.DataFrame:
    """Each record with measured DRAM bytes, FLOPs and time as a roofline point, measured
    (achieved, as Nsight Compute draws it: measured FLOPs / measured time against measured FLOPs
    / measured DRAM bytes) and predicted (the model's FLOPs / its time against its FLOPs / its
    DRAM bytes): ``record`` (its index in ``view``), ``family``, ``seq_len``, ``pass``,
    ``dtype``, ``head_dim``, ``causal``, ``measured_intensity``, ``measured_tflops``,
    ``predicted_intensity``, ``predicted_tflops`` (NaN where the model has no figure)."""
    cols = ["record", "family", "seq_len", "pass", "dtype", "head_dim", "causal",
            "measured_intensity", "measured_tflops", "predicted_intensity", "predicted_tflops"]
    need = ["measured_dram_bytes", "measured_flops", "measured_time_raw"]
    if view.empty or any(c not in view for c in need):
        return pd.DataFrame(columns=cols)
    sel = view[view[need].notna().all(axis=1) & (view["measured_dram_bytes"] > 0)]
    if sel.empty:
        return pd.DataFrame(columns=cols)

    def num(c):
        return pd.to_numeric(sel[c], errors="coerce").astype(float)

    out = pd.DataFrame({
        "record": sel.index, "family": sel["family"].astype(str),
        "seq_len": pd.to_numeric(sel["seq_len_q"]).astype(int),
        "pass": sel["pass"], "dtype": sel["dtype"], "head_dim": sel["head_dim"],
        "causal": sel["causal"].astype(bool),
        "measured_intensity": num("measured_flops") / num("measured_dram_bytes"),
        "measured_tflops": num("measured_flops") / (num("measured_time_raw") * 1e-3) / 1e12,
        "predicted_intensity": num("predicted_flops") / num("predicted_dram_bytes"),
        "predicted_tflops": num("predicted_flops") / (num("predicted_time_raw") * 1e-3) / 1e12})
    return out.reset_index(drop=True)[cols]


def roofline_ceilings(profile: str) -> dict:
    """The datasheet ceilings of ``profile`` for the measured roofline: DRAM bandwidth, the
    half-precision tensor-core peak and the FP32 peak."""
    return _ceilings(_profile(profile, None), "fp16")


def filter_records(df: pd.DataFrame, filters: dict) -> pd.DataFrame:
    """Rows of ``df`` whose ``field`` (as text) is among the chosen values, for each filter."""
    keep = np.ones(len(df), dtype=bool)
    for field_, chosen in filters.items():
        if field_ in df:
            keep &= df[field_].astype(str).isin([str(c) for c in chosen]).to_numpy()
    return df[keep].reset_index(drop=True)


def compare_summary(view: pd.DataFrame) -> pd.DataFrame:
    """The per-metric error table of the (filtered) joined records."""
    return importlib.import_module("sim.compare").summary(view)


def _records_scope(text) -> str:
    text = str(text)
    if text == "all":
        return "all kernels"
    if text.endswith(" (all variants)"):
        base = text.removesuffix(" (all variants)")
        return "ioaware kernels (all)" if base == "ioaware-numba" else family_label(base) + " (all)"
    return family_label(text)


def display_summary(summary: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The per-metric error table with readable values: ``(DataFrame, {column: fmt.Col})``."""
    from dashboard.fmt import Col

    cols = {"metric": Col("Metric"), "records": Col("Records of"), "n": Col("Records", "count"),
            "median_abs_err_pct": Col("Median |err|", "pct"), "max_abs_err_pct": Col("Worst |err|", "pct"),
            "mean_signed_err_pct": Col("Bias", "signed_pct", "Mean signed error."),
            "target_pct": Col("Target", "pct", "|error| the model aims at."),
            "within_target_pct": Col("Within", "pct", "Share of the records within the target "
                                                      "(required: all, or 90 % for DRAM bytes)."),
            "met": Col("Met")}
    if summary.empty:
        return pd.DataFrame(columns=list(cols)), cols
    out = summary.copy()
    out["what"] = [METRIC_LABELS.get(m, (None, w))[1] for m, w in zip(out["metric"], out["what"])]
    out["metric"] = [METRIC_LABELS.get(m, (m,))[0] for m in out["metric"]]
    out["records"] = out["records"].map(_records_scope)
    for c in ("median_abs_err_pct", "max_abs_err_pct", "mean_signed_err_pct", "target_pct",
              "within_target_pct", "required_pct"):
        if c in out:
            out[c] = pd.to_numeric(out[c], errors="coerce") / 100.0
    out["met"] = ["—" if v is None or pd.isna(v) else ("yes" if v else "no") for v in out["met"]]
    return out, cols


def blocks_columns() -> dict:
    from dashboard.fmt import Col
    return {"gpu": Col("GPU"), "pass": Col("Pass"), "causal": Col("Causal", "bool"),
            "seq_len_q": Col("N", "count"), "head_dim": Col("d", "count"), "dtype": Col("dtype"),
            "n_blocks": Col("Tile sizes measured", "count"),
            "best_measured": Col("Fastest measured"), "best_ms": Col("Its time", "ms"),
            "model_pick": Col("Model's pick"), "pick_ms": Col("Pick's time", "ms"),
            "pick_slower_pct": Col("Pick slower by", "pct"),
            "model_margin_pct": Col("Model's margin", "pct"), "ok": Col("Within 10 %", "bool")}


def display_blocks(blocks: pd.DataFrame) -> pd.DataFrame:
    out = blocks.copy()
    for c in ("pick_slower_pct", "model_margin_pct"):
        if c in out:
            out[c] = pd.to_numeric(out[c], errors="coerce") / 100.0
    if "pass" in out:
        out["pass"] = out["pass"].map(lambda p: PASS_LABELS.get(p, p))
    for c in ("best_measured", "model_pick"):
        if c in out:
            out[c] = out[c].astype(str).str.replace("x", " × ", regex=False)
    return out


def records_view(view: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The records table of the page: readable kernel names and the columns a reader needs
    (``(DataFrame, {column: fmt.Col})``); every column stays in the CSV download."""
    from dashboard.fmt import Col

    df = view.copy()
    df["family"] = df["family"].map(family_label)
    df["pass"] = df["pass"].map(lambda p: PASS_LABELS.get(p, p))
    df["tiles"] = [("—" if pd.isna(q) else f"{int(q)} × {int(k)}")
                   for q, k in zip(df["block_q"], df["block_k"])]
    df["l2_model"] = df.get("l2_model", pd.Series(index=df.index, dtype=object)).map(
        lambda m: L2_LABELS.get(m, m))
    df["priced_by"] = priced_by(view)
    cols = {"family": Col("Kernel"), "pass": Col("Pass"), "dtype": Col("dtype"),
            "batch": Col("Batch", "count"), "heads": Col("Heads", "count"),
            "seq_len_q": Col("N", "count"), "head_dim": Col("d", "count"),
            "causal": Col("Causal", "bool"), "tiles": Col("Tile"),
            "measured_time_raw": Col("Measured time", "ms"),
            "predicted_time_raw": Col("Predicted time", "ms"),
            "rel_error_time": Col("Predicted time error", "signed_pct"),
            "priced_by": Col("Time from"),
            "predicted_time_calibrated": Col("Calibrated time", "ms"),
            "rel_error_time_calibrated": Col("Calibrated time error", "signed_pct"),
            "measured_global_bytes": Col("Global bytes, measured", "bytes"),
            "rel_error_global_bytes": Col("Global bytes error", "signed_pct"),
            "measured_dram_bytes": Col("DRAM bytes, measured", "bytes"),
            "rel_error_dram_bytes": Col("DRAM bytes error", "signed_pct"),
            "rel_error_flops": Col("FLOPs error", "signed_pct"),
            "l2_model": Col("DRAM predicted by")}
    return df, {k: v for k, v in cols.items() if k in df}


# -- the trace replay: estimated, then run in a background thread with progress -----------------
#: A record is replayed when its trace is at most this many events (as `python -m sim.compare`).
MAX_TRACE_EVENTS = 2_000_000
_GRANULE = 4096


@st.cache_resource(show_spinner=False)
def replay_seconds_per_event() -> float:
    """Seconds the L2 replay takes per trace event on this machine, measured once on a small
    trace (a few hundredths of a second)."""
    sim = _sim()
    w = sim.Workload(batch=1, heads=16, seq_len_q=2048, head_dim=64, dtype="fp16")
    s = sim.Schedule("flash2")
    sim.predict(w, s, "h100", l2="trace")          # warm up (imports, first allocations)
    t0 = time.perf_counter()
    p = sim.predict(w, s, "h100", l2="trace")
    dt = time.perf_counter() - t0
    return dt / max(1, _events_estimate(w, s, p.block_q, p.block_k, p.hbm_read_bytes + p.hbm_write_bytes))


def _events_estimate(w, schedule, bq, bk, global_bytes) -> int:
    """The trace size the model uses to decide whether to replay (events + 4 KiB granules)."""
    model = importlib.import_module("sim.model")
    est = getattr(model, "_estimate_events", None)
    if est is not None:
        events = est(w, schedule, bq, bk)
    elif schedule.tiled:
        events = (w.batch * w.heads * math.ceil(w.seq_len_q / bq) * math.ceil(w.seq_len_k / bk)
                  * 3 * len(w.passes))
    else:
        events = 48 * w.batch * w.heads * len(w.passes)
    return int(events + global_bytes // _GRANULE)


#: Parallel efficiency of the replay's worker processes (measured: 1.75 times faster on 2).
_PARALLEL_EFFICIENCY = 0.85


def replay_plan(joined: pd.DataFrame, records: list, profile: str | None = None) -> dict:
    """Which records a trace replay would replay and how long it should take here:
    ``{"replayed": n, "analytic": n (too large: keep the analytic estimate), "failed": n,
    "events": total events, "seconds": estimate, "workers": processes}``.

    The time per event is measured on this machine by replaying one of the file's own records
    (one of about 300,000 events, a few tenths of a second), since records replay slower per
    event than the model's default schedules."""
    cmp = importlib.import_module("sim.compare")
    sim = _sim()
    n_big = n_fail = 0
    ests: list[tuple[int, int]] = []
    for i, (rec, (_, row)) in enumerate(zip(records, joined.iterrows())):
        if row.get("model_error") or pd.isna(row.get("predicted_global_bytes")):
            n_fail += 1
            continue
        try:
            w, s, _ = cmp.model_for_record(rec, registers=False)
            bq, bk = sim.resolve_blocks(w, s, _profile(str(row["profile"]), None))
            est = _events_estimate(w, s, bq, bk, float(row["predicted_global_bytes"]))
        except (ValueError, KeyError, TypeError):
            n_fail += 1
            continue
        if est <= MAX_TRACE_EVENTS:
            ests.append((est, i))
        else:
            n_big += 1
    events = sum(e for e, _ in ests)
    workers = min(os.cpu_count() or 1, 8) if len(records) >= 32 else 1
    per_event = replay_seconds_per_event()
    if ests:
        est, i = min(ests, key=lambda e: abs(e[0] - 300_000))
        per_event = max(per_event, _record_seconds(records[i], profile or str(joined["profile"].iloc[i]))
                        / max(1, est))
    speedup = 1.0 if workers == 1 else min(workers, len(ests) or 1) * _PARALLEL_EFFICIENCY
    return {"replayed": len(ests), "analytic": n_big, "failed": n_fail, "events": events,
            "seconds": events * per_event / max(1.0, speedup), "workers": workers}


@st.cache_resource(show_spinner=False, max_entries=16)
def cached_replay_plan(digest: str, profile: str, _joined: pd.DataFrame, _records: list) -> dict:
    """:func:`replay_plan` of a results file (``digest``) on ``profile``, computed once."""
    return replay_plan(_joined, _records, profile)


def _record_seconds(rec: dict, profile: str) -> float:
    """Seconds the trace replay of one record takes here (best of two)."""
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        _join([rec], profile, "auto", workers=1)
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass
class ReplayJob:
    """A trace replay running in a background thread: ``done`` of ``total`` records."""

    key: tuple
    total: int
    estimate_s: float
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    finished: float | None = None
    result: dict | None = None
    error: str | None = None

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    @property
    def remaining_s(self) -> float:
        """Seconds left: from the rate so far once a tenth is done, else the estimate."""
        if self.finished:
            return 0.0
        if self.done >= max(1, self.total // 10):
            return self.elapsed / self.done * (self.total - self.done)
        return max(0.0, self.estimate_s - self.elapsed)


@st.cache_resource(show_spinner=False)
def _replay_jobs() -> dict:
    return {"lock": threading.Lock(), "jobs": {}}


def replay_job(digest: str, profile: str, rates_path: str | None = None) -> ReplayJob | None:
    """The replay job of a results file on a profile (and rates), running or finished, or
    None."""
    return _replay_jobs()["jobs"].get((digest, profile, rates_path))


def start_replay(digest: str, profile: str, records: list, estimate_s: float,
                 rates_path: str | None = None) -> ReplayJob:
    """Start (or return the running) trace replay of ``records`` on ``profile`` in a background
    thread; the page polls ``replay_job``."""
    reg = _replay_jobs()
    key = (digest, profile, rates_path)
    with reg["lock"]:
        job = reg["jobs"].get(key)
        if job is not None and job.error is None:
            return job
        job = ReplayJob(key, len(records), estimate_s)
        reg["jobs"][key] = job
        while len(reg["jobs"]) > 8:   # keep the latest few
            reg["jobs"].pop(next(iter(reg["jobs"])))

    def progress(done, total, *_):
        job.done = done

    def run():
        try:
            job.result = _join(records, profile, "auto", progress=progress,
                               rates_path=rates_path)
        except Exception as exc:  # noqa: BLE001 - reported on the page
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.finished = time.monotonic()

    threading.Thread(target=run, name=f"replay-{digest[:8]}-{profile}", daemon=True).start()
    return job


# ------------------------------------------------------------------------------------------------
# Block sizes: the kernels' tile configurations, priced by the model that picks their tiles, and
# the tile times a sweep measured
# ------------------------------------------------------------------------------------------------
#: What the pages call the kernel families of the model's configuration registry
#: (``sim.plans.CONFIGS``); a family not named here is called by its name.
TILE_FAMILY_LABELS = {"mma": "Tensor cores, fp16/bf16", "tf32": "Tensor cores, fp32 (3xTF32)",
                      "wgmma": "Hopper tensor cores (warpgroup MMA), fp16/bf16",
                      "simt": "CUDA cores"}
#: What limits a configuration's predicted time (the level `sim.plan.KernelCost.bound` names).
PLAN_BOUND_LABELS = {"dram": "DRAM bandwidth", "l2": "L2 bandwidth",
                     "smem": "shared-memory bandwidth", "matmul": "tensor-core peak",
                     "fp32": "CUDA-core FP32 peak", "mufu": "special-function units (exp2)",
                     "wait": "waiting for tensor-core results"}
#: Files of measured tile times the block-size page reads, by their ``schema``: ``python -m
#: benchmarks pick``'s (the shipped ones), ``tune --family``'s, and the older tensor-core tile
#: sweep's (the last two read through ``benchmarks.pick.load_timings``).
TILE_SWEEP_SCHEMAS = ("ioaware.pick/1", "ioaware.tune_blocks/1", "ioaware.tune_tc/1")
#: The fields that name one measured workload (a group of a tile sweep).
TILE_GROUP_FIELDS = ("dtype", "head_dim", "causal", "seq_len", "batch", "heads")
#: Head dims probed for the tile sizes a family takes (the rows and columns of its plane).
_PROBE_HEAD_DIMS = (32, 64, 96, 128, 256)
#: Two predicted times closer than this (relative) tie; the model then takes the larger tiles.
TIE = 1e-9


#: Families of ``sim.plans.CONFIGS`` whose configurations are not one (block_q, block_k) tile,
#: so not a plane the block-size page can draw, and where to see their ranking instead.
#: (On the command line: ``python -m sim plan --family wgmma --pass bwd --choose``.)
NOT_A_TILE_PLANE = {("wgmma", "bwd"): "whose settings are pairs of tiles (one for the kernel "
                                      "that computes dQ, one for the kernel that computes dK "
                                      "and dV), which a grid of single tiles cannot show"}


def tile_families() -> list[str]:
    """``"family/pass"`` of every kernel family whose legal configurations the model lists
    (``sim.plans.CONFIGS``) as (block_q, block_k) tiles, by family, the forward first: what the
    block-size page offers (`NOT_A_TILE_PLANE`: the others)."""
    keys = sorted((k for k in importlib.import_module("sim.plans").CONFIGS
                   if k not in NOT_A_TILE_PLANE), key=lambda k: (k[0], k[1] != "fwd", k[1]))
    return [f"{f}/{p}" for f, p in keys]


def tile_family_label(key: str) -> str:
    """``"mma/fwd"`` -> ``"Tensor cores, fp16/bf16, forward"``."""
    family, _, pass_ = str(key).partition("/")
    return f"{TILE_FAMILY_LABELS.get(family, family)}, {PASS_LABELS.get(pass_, pass_)}"


def tiles_label(block_q, block_k) -> str:
    """``"128 × 64"`` (queries × keys per tile)."""
    return f"{int(block_q)} × {int(block_k)}"


def plain_reason(exc) -> str:
    """An exception of the model as one plain line: the first line of its message, with the
    workload's field names written as words (``workload.head_dim=96`` -> ``head dim 96``)."""
    import re as _re

    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = _re.sub(r"workload\.(\w+)=", lambda m: m.group(1) + " ", text)
    text = _re.sub(r"'([\w.+/-]+)'", r"\1", text)
    return text.replace("head_dim", "head dim").replace("seq_len", "N")


def _legal_configs(family: str, pass_: str, workload) -> list[dict]:
    plans = importlib.import_module("sim.plans")
    module, function = plans.CONFIGS[(family, pass_)].split(":")
    return [dict(c) for c in getattr(importlib.import_module(module), function)(workload)]


def _tie_key(cfg: dict) -> tuple:
    # sim.plans.choose's order: the time, then the larger tiles
    return tuple(-v if isinstance(v, (int, float)) else 0 for v in cfg.values())


def _does_not_fit(plan, prof) -> str:
    from dashboard import fmt

    k = max(plan.kernels, key=lambda k: k.shared_bytes)
    regs = f", {k.registers} registers a thread" if k.registers else ""
    return (f"does not fit one SM of the {prof.description or prof.name}: "
            f"{fmt.bytes_(k.shared_bytes)} of shared memory, {k.threads} threads{regs}")


def _rates_text(sources: dict) -> str:
    """"measured rates" when any level's rate was measured, else "datasheet rates"."""
    return "measured rates" if "measured" in sources.values() else "datasheet rates"


def _costs_rates(costs) -> str:
    """:func:`_rates_text` over several priced plans (`sim.plan.PlanCost`)."""
    return ("measured rates" if any("measured" in c.rate_sources.values() for c in costs)
            else "datasheet rates")


@st.cache_data(show_spinner=False, max_entries=256)
def tile_plane(family: str, pass_: str, seq_len: int, head_dim: int, batch: int, heads: int,
               dtype: str, causal: bool, profile: str, custom: tuple | None = None,
               window: int = 0, rates: bytes | None = None, rates_name: str = "") -> dict:
    """The model's view of every tile configuration of ``family``'s ``pass_`` for one workload.

    Each legal configuration (``sim.plans.CONFIGS``) is priced by ``sim.plan.price`` on the
    profile (with the measured rates of ``rates``, a rates file's bytes, when given), and the
    pick is ``sim.plans.choose``'s: the fastest, ties to the larger tiles. Returns a dict:

    * ``refused``: None, or one plain line saying why the family cannot run this workload (then
      nothing else is filled);
    * ``cells``: DataFrame, one row per (block_q, block_k) of the family's tile sizes: ``legal``,
      ``predicted_ms`` (NaN where not legal), ``rank`` (1 = the pick), ``bound`` (what limits
      its time), ``global_bytes``, ``dram_bytes``, ``options`` (other settings of the
      configuration, if any) and ``why`` (why it is not legal);
    * ``pick`` (the chosen configuration), ``pick_ms``, ``ties`` (configurations priced the
      same as the pick), ``n_legal``;
    * ``rates``: "datasheet rates" or "measured rates", ``rate_sources`` (level -> source),
      ``rates_error`` (why a given rates file was not used, or None), ``rates_name``;
    * ``profile`` (the profile's name) and ``gpu`` (its description); ``partial``: some legal
      configuration does not fit the GPU (the pick is then among the rest, in the same order).
    """
    plans = importlib.import_module("sim.plans")
    plan_mod = importlib.import_module("sim.plan")
    out = {"refused": None, "cells": None, "pick": None, "pick_ms": None, "ties": [],
           "n_legal": 0, "rates": "datasheet rates", "rate_sources": {}, "rates_error": None,
           "rates_name": rates_name, "profile": profile, "gpu": profile, "partial": False}
    try:
        prof, out["rates_error"] = rated_profile(profile, custom, rates)
    except (ValueError, TypeError) as exc:
        out["refused"] = f"The GPU profile is not usable: {plain_reason(exc)}"
        return out
    out["profile"], out["gpu"] = prof.name, prof.description or prof.name
    try:
        w = _workload(seq_len, head_dim, batch, heads, dtype, pass_, causal, 1.0, window)
        legal = _legal_configs(family, pass_, w)
    except (ValueError, TypeError) as exc:
        out["refused"] = plain_reason(exc)
        return out
    if not legal:
        out["refused"] = "no tile configuration of this kernel is legal for this workload"
        return out
    priced, not_priced, first_refusal, smallest = [], {}, None, None
    for cfg in legal:
        try:
            plan = plans.plan_for(family, pass_, w, **cfg)
        except (ValueError, TypeError) as exc:
            first_refusal = first_refusal or plain_reason(exc)
            not_priced[(cfg.get("block_q"), cfg.get("block_k"))] = plain_reason(exc)
            continue
        try:
            cost = plan_mod.price(plan, prof)
        except ValueError:
            why = _does_not_fit(plan, prof)
            not_priced[(cfg.get("block_q"), cfg.get("block_k"))] = why
            smallest = min(smallest or (math.inf, ""),
                           (max(k.shared_bytes for k in plan.kernels), why))
            continue
        priced.append((cost.time_s, _tie_key(cfg), cfg, cost))
    if not priced:
        out["refused"] = first_refusal or (
            "no tile configuration of this kernel fits one SM of the "
            f"{out['gpu']} (the smallest needs {smallest[1].partition(': ')[2]})")
        return out
    priced.sort(key=lambda r: r[:2])
    out["partial"] = bool(not_priced)
    if not not_priced:   # every legal configuration priced: the model's own pick first
        pick = plans.choose(family, pass_, w, prof)[0]
        priced.sort(key=lambda r: r[2] != pick)     # stable: the rest keep their order
    best_s = priced[0][0]
    out["pick"], out["pick_ms"] = dict(priced[0][2]), best_s * 1e3
    out["ties"] = [dict(c) for t, _k, c, _p in priced[1:] if abs(t - best_s) <= TIE * best_s]
    out["n_legal"] = len(priced)
    out["rate_sources"] = dict(priced[0][3].rate_sources)
    out["rates"] = _rates_text(out["rate_sources"])
    # the plane: every tile size the family takes (probed over head dims), each cell the
    # fastest of its configurations
    qs = {c.get("block_q") for c in legal}
    ks = {c.get("block_k") for c in legal}
    for d in _PROBE_HEAD_DIMS:
        try:
            for c in _legal_configs(family, pass_, _workload(seq_len, d, batch, heads, dtype,
                                                              pass_, causal, 1.0, window)):
                qs.add(c.get("block_q"))
                ks.add(c.get("block_k"))
        except (ValueError, TypeError):
            continue
    qs = sorted(q for q in qs if isinstance(q, int))
    ks = sorted(k for k in ks if isinstance(k, int))
    cells = {}
    for rank, (t, _k, cfg, cost) in enumerate(priced, start=1):
        key = (cfg.get("block_q"), cfg.get("block_k"))
        if key in cells:
            continue
        slowest = max(cost.kernels, key=lambda k: k.time_s)
        cells[key] = {"legal": True, "predicted_ms": t * 1e3, "rank": rank,
                      "bound": PLAN_BOUND_LABELS.get(slowest.bound, slowest.bound),
                      "global_bytes": cost.global_bytes, "dram_bytes": cost.dram_bytes,
                      "options": ", ".join(f"{k} {v}" for k, v in cfg.items()
                                           if k not in ("block_q", "block_k")),
                      "why": ""}
    rows = []
    for q in qs:
        for k in ks:
            cell = cells.get((q, k))
            if cell is None:
                why = not_priced.get((q, k))
                if why is None:
                    try:
                        plans.plan_for(family, pass_, w, block_q=q, block_k=k)
                        why = "not among this kernel's legal configurations for this workload"
                    except (ValueError, TypeError) as exc:
                        why = plain_reason(exc)
                cell = {"legal": False, "predicted_ms": np.nan, "rank": np.nan, "bound": "",
                        "global_bytes": np.nan, "dram_bytes": np.nan, "options": "", "why": why}
            rows.append({"block_q": q, "block_k": k, **cell})
    out["cells"] = pd.DataFrame(rows)
    return out


# -- measured tile times -----------------------------------------------------------------------
def tile_sweep_files() -> list[Path]:
    """Files of measured tile times the page offers: those of :data:`TILE_SWEEP_SCHEMAS` named
    in ``$IOAWARE_RESULTS`` (files or directories), then the repository's ``results/``; the
    newest schema first (``pick`` files, then tile tunes), by name within a schema."""
    return _files_of_schemas(TILE_SWEEP_SCHEMAS)


def rates_files() -> list[Path]:
    """Measured-rates files (``python -m benchmarks rates``) in ``$IOAWARE_RESULTS`` and
    ``results/``."""
    return _files_of_schemas(("ioaware.rates/1",))


def rates_choices() -> list[str]:
    return [_choice_name(p) for p in rates_files()]


def rates_choice_bytes(name: str) -> bytes:
    for path in rates_files():
        if _choice_name(path) == name:
            return path.read_bytes()
    raise FileNotFoundError(f"rates file {name!r} is no longer available")


def rates_provenance(content: bytes | None) -> dict:
    """``{"gpu", "date"}`` (``date``: the day, ``YYYY-MM-DD``) a rates file's provenance names;
    empty strings where it names none or cannot be read."""
    try:
        prov = json.loads(content.decode("utf-8")).get("provenance") or {}
    except (AttributeError, UnicodeDecodeError, json.JSONDecodeError):
        prov = {}
    if not isinstance(prov, dict):
        prov = {}
    return {"gpu": str(prov.get("gpu") or ""), "date": str(prov.get("date") or "")[:10]}


#: The rates file each shipped profile is priced with by default (named here, so that a file
#: added to ``results/`` changes no prediction until this table names it; re-measuring a GPU
#: replaces its file and the name here).
DEFAULT_RATES_FILES = {"h100": "rates_h100_2026-11-24.json", "h200": "rates_h200_2026-11-24.json"}


@st.cache_data(show_spinner=False, max_entries=8)
def _checked_default(profile: str, name: str) -> bool:
    """Whether the named default rates file is there and was measured on ``profile``'s GPU."""
    try:
        prov = rates_provenance(rates_choice_bytes(name))
    except OSError:
        return False
    return bool(prov["gpu"]) and profile_for_gpu(prov["gpu"]) == profile


def rates_for_profile(profile: str | None) -> str | None:
    """The rates file (a name of :func:`rates_choices`) the pages price ``profile`` with by
    default: the one `DEFAULT_RATES_FILES` names, if it is in ``results/`` and was measured on
    that GPU; None otherwise (a custom GPU, or a GPU without a measured file)."""
    if not profile or profile == CUSTOM:
        return None
    name = DEFAULT_RATES_FILES.get(profile)
    if name is None:
        return None
    choices = {c.replace("\\", "/").rsplit("/", 1)[-1]: c for c in rates_choices()}
    choice = choices.get(name)
    return choice if choice is not None and _checked_default(profile, choice) else None


def _files_of_schemas(schemas: tuple) -> list[Path]:
    """JSON files whose ``schema`` (read from their first kilobyte) is one of ``schemas``, in
    the order of ``schemas``, then of their names."""
    import re as _re

    found = []
    candidates: list[Path] = []
    for entry in filter(None, os.environ.get("IOAWARE_RESULTS", "").split(os.pathsep)):
        path = Path(entry).expanduser()
        candidates += (sorted(path.glob("*.json")) if path.is_dir() else
                       [path] if path.is_file() else [])
    candidates += sorted((ROOT / "results").glob("*.json"))
    seen = set()
    for path in candidates:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            with open(path, "rb") as fh:
                head = fh.read(1024)
        except OSError:
            continue
        m = _re.search(rb'"schema"\s*:\s*"([^"]+)"', head)
        if m and m.group(1).decode("utf-8", "replace") in schemas:
            found.append((schemas.index(m.group(1).decode()), len(found), path))
    return [p for _i, _n, p in sorted(found)]


def tile_sweep_choices() -> list[str]:
    """Display names of :func:`tile_sweep_files`."""
    return [_choice_name(p) for p in tile_sweep_files()]


_PICK_GROUP_KEYS = ("family", "pass", "dtype", "head_dim", "causal", "seq_len", "batch", "heads")


def _read_pick(doc: dict) -> tuple[dict, list[dict]]:
    """The records of a ``python -m benchmarks pick`` file as timing records (used when
    ``benchmarks.pick``, which reads every schema of :data:`TILE_SWEEP_SCHEMAS`, is not
    importable)."""
    if doc.get("schema") != "ioaware.pick/1":
        raise ValueError(f"schema {doc.get('schema')!r} can be read only with the benchmarks "
                         f"package installed (this installation reads ioaware.pick/1)")
    rows = doc.get("records")
    if not isinstance(rows, list):
        raise ValueError("has no list of records")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or any(k not in row for k in _PICK_GROUP_KEYS + ("config",)):
            raise ValueError(f"record {i} lacks one of {', '.join(_PICK_GROUP_KEYS)}, config")
        why = row.get("refused") or row.get("failed")
        t = row.get("time_ms")
        if why is None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
            raise ValueError(f"record {i}: time_ms must be a positive number, got {t!r}")
        out.append({**{k: row[k] for k in _PICK_GROUP_KEYS}, "config": row["config"],
                    "time_ms": None if why is not None else float(t), "why": why})
    return doc, out


def _timings_reader():
    """``benchmarks.pick.load_timings`` when the benchmarks package is importable (it reads
    every schema of :data:`TILE_SWEEP_SCHEMAS`), else a reader of ``pick`` files."""
    try:
        fn = getattr(importlib.import_module("benchmarks.pick"), "load_timings", None)
    except Exception:  # noqa: BLE001 - the page reads pick files without it
        fn = None
    return fn if callable(fn) else _read_pick


_SWEEP_COLUMNS = ["family", "pass", *TILE_GROUP_FIELDS, "block_q", "block_k", "options",
                  "time_ms", "why"]
#: The records of a file of tile times that timed nothing.
EMPTY_SWEEP = pd.DataFrame(columns=_SWEEP_COLUMNS)


def _json_of_schema(content: bytes, name: str, schemas, what: str) -> dict:
    """The JSON object of a file given as bytes whose ``schema`` is one of ``schemas``; raises
    ValueError with one line (``name`` is not JSON, or not ``what``) otherwise."""
    try:
        obj = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{name} is not a JSON file ({exc})") from None
    if not isinstance(obj, dict) or obj.get("schema") not in schemas:
        got = obj.get("schema") if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f"{name} is not {what} (its schema is {got!r}; "
                         f"read: {', '.join(schemas)})")
    return obj


@st.cache_data(show_spinner=False, max_entries=16)
def load_tile_sweep(content: bytes, name: str) -> dict:
    """A file of measured tile times (:data:`TILE_SWEEP_SCHEMAS`) given as bytes: ``{"name",
    "schema", "gpu", "date", "profile" (the model's profile of its GPU, or None), "digest",
    "records": DataFrame}``, one record per timed (or refused) configuration: family, pass, the group's
    fields, block_q, block_k, ``options`` (other settings, as text), ``time_ms`` (NaN when
    refused) and ``why``. Raises ValueError with one line when the file cannot be read."""
    obj = _json_of_schema(content, name, TILE_SWEEP_SCHEMAS, "a file of measured tile times")
    try:
        doc, records = _timings_reader()(obj)
    except ValueError as exc:
        raise ValueError(f"{name}: {str(exc).removeprefix('file <object>: ')}") from None
    rows = []
    for r in records:
        cfg = dict(r.get("config") or {})
        bq, bk = cfg.pop("block_q", None), cfg.pop("block_k", None)
        if not isinstance(bq, int) or not isinstance(bk, int):
            continue
        t = r.get("time_ms")
        rows.append({"family": r["family"], "pass": r["pass"],
                     **{k: r.get(k) for k in TILE_GROUP_FIELDS}, "block_q": bq, "block_k": bk,
                     "options": ", ".join(f"{k} {v}" for k, v in sorted(cfg.items())),
                     "time_ms": float(t) if t is not None else np.nan,
                     "why": r.get("why") or ""})
    df = pd.DataFrame(rows, columns=_SWEEP_COLUMNS)
    if not df.empty:
        df["causal"] = df["causal"].astype(bool)
        for c in ("head_dim", "seq_len", "batch", "heads"):
            df[c] = df[c].astype(int)
    prov = obj.get("provenance") if isinstance(obj.get("provenance"), dict) else {}
    gpu = str(prov.get("gpu") or "an unrecorded GPU")
    return {"name": name, "schema": obj["schema"], "gpu": gpu, "date": str(prov.get("date", "")),
            "profile": profile_for_gpu(gpu) if prov.get("gpu") else None, "records": df,
            "digest": hashlib.sha1(content).hexdigest()}


def example_tile_sweep_json() -> str | None:
    """A small file of measured tile times, as an upload's template: the provenance and the
    records of the first workload of the first shipped ``pick`` file (measured times); None
    when no such file is shipped."""
    for path in tile_sweep_files():
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        records = doc.get("records") if doc.get("schema") == "ioaware.pick/1" else None
        if not isinstance(records, list) or not records:
            continue
        first = {k: records[0].get(k) for k in _PICK_GROUP_KEYS}
        keep = [r for r in records if {k: r.get(k) for k in _PICK_GROUP_KEYS} == first]
        return json.dumps({"schema": doc["schema"], "provenance": doc.get("provenance", {}),
                           "records": keep}, indent=1)
    return None


def load_tile_sweep_choice(name: str) -> dict:
    """:func:`load_tile_sweep` of one of :func:`tile_sweep_choices` by its display name."""
    for path in tile_sweep_files():
        if _choice_name(path) == name:
            return load_tile_sweep(path.read_bytes(), _choice_name(path))
    raise FileNotFoundError(f"tile sweep {name!r} is no longer available")


def tile_sweep_groups(sweep: dict, family_key: str) -> pd.DataFrame:
    """The workloads of ``family_key`` (``"family/pass"``) a sweep timed, in the file's order:
    the :data:`TILE_GROUP_FIELDS` and ``configs`` (configurations timed)."""
    family, _, pass_ = family_key.partition("/")
    df = sweep["records"]
    sel = df[(df["family"] == family) & (df["pass"] == pass_)]
    if sel.empty:
        return pd.DataFrame(columns=[*TILE_GROUP_FIELDS, "configs"])
    return (sel.groupby(list(TILE_GROUP_FIELDS), sort=False)["time_ms"].count()
            .rename("configs").reset_index())


def group_label(group) -> str:
    """One measured workload as text: ``"N = 4,096, d = 64, batch 4, 32 heads, fp16, not
    causal"``."""
    return (f"N = {int(group['seq_len']):,}, d = {int(group['head_dim'])}, batch "
            f"{int(group['batch'])}, {int(group['heads'])} heads, {group['dtype']}, "
            f"{'causal' if bool(group['causal']) else 'not causal'}")


def measured_tiles(sweep: dict, family_key: str, seq_len: int, head_dim: int, batch: int,
                   heads: int, dtype: str, causal: bool, window: int = 0) -> pd.DataFrame:
    """The sweep's times of ``family_key`` on exactly this workload: block_q, block_k,
    ``time_ms`` (the median over repeated records; NaN when refused), ``why``, ``options``.
    Empty with a sliding window (no sweep times one)."""
    cols = ["block_q", "block_k", "time_ms", "why", "options"]
    family, _, pass_ = family_key.partition("/")
    df = sweep["records"]
    if df.empty or window > 0:
        return pd.DataFrame(columns=cols)
    sel = df[(df["family"] == family) & (df["pass"] == pass_) & (df["dtype"] == dtype)
             & (df["head_dim"] == head_dim) & (df["causal"] == bool(causal))
             & (df["seq_len"] == seq_len) & (df["batch"] == batch) & (df["heads"] == heads)]
    if sel.empty:
        return pd.DataFrame(columns=cols)
    return (sel.groupby(["block_q", "block_k", "options"], as_index=False, sort=True)
            .agg(time_ms=("time_ms", "median"), why=("why", "first"))[cols])


def tile_verdict(plane: dict, measured: pd.DataFrame) -> dict | None:
    """The model's pick against the measured times of the same workload (None when nothing was
    timed): ``pick`` and ``best`` (``(block_q, block_k)``), ``pick_ms`` (measured; None when
    not timed: ``pick_why``), ``best_ms``, ``loss`` (pick / best - 1, a fraction),
    ``pick_rank`` among the ``timed`` configurations, ``ratio_lo`` / ``ratio_mid`` /
    ``ratio_hi`` (predicted / measured over the configurations with both), ``not_legal``
    (measured tiles the model does not list for this workload), and ``text``: the sentence the
    page shows."""
    timed = measured[measured["time_ms"].notna()] if measured is not None else measured
    if timed is None or timed.empty or plane.get("pick") is None:
        return None
    best = timed.loc[timed["time_ms"].idxmin()]
    pick = (int(plane["pick"]["block_q"]), int(plane["pick"]["block_k"]))
    best_t = (int(best["block_q"]), int(best["block_k"]))
    hit = measured[(measured["block_q"] == pick[0]) & (measured["block_k"] == pick[1])]
    pick_ms = float(hit["time_ms"].min()) if hit["time_ms"].notna().any() else None
    best_ms = float(best["time_ms"])
    loss = None if pick_ms is None else pick_ms / best_ms - 1
    rank = None if pick_ms is None else 1 + int((timed["time_ms"] < pick_ms).sum())
    cells = plane["cells"].set_index(["block_q", "block_k"])
    ratios = []
    not_legal = []
    for _, r in timed.iterrows():
        key = (int(r["block_q"]), int(r["block_k"]))
        if key in cells.index and bool(cells.loc[key, "legal"]):
            ratios.append(float(cells.loc[key, "predicted_ms"]) / float(r["time_ms"]))
        else:
            not_legal.append(tiles_label(*key))
    p, b = tiles_label(*pick), tiles_label(*best_t)
    if pick_ms is None:
        why = "" if hit.empty else str(hit["why"].iloc[0] or "")
        text = (f"The model picks {p}, which this file did not time"
                + (f" ({why})" if why else "")
                + f"; the measured best is {b}: {best_ms:,.3f} ms.")
    elif pick == best_t or loss <= 0:
        text = (f"The model picks {p}, the measured best ({pick_ms:,.3f} ms): nothing is lost by "
                f"following the model.")
    else:
        text = (f"The model picks {p}: {pick_ms:,.3f} ms, {loss * 100:,.1f} % slower than the "
                f"measured best {b}: {best_ms:,.3f} ms.")
    return {"pick": pick, "best": best_t, "pick_ms": pick_ms, "best_ms": best_ms, "loss": loss,
            "pick_rank": rank, "timed": len(timed),
            "pick_why": None if pick_ms is not None or hit.empty else hit["why"].iloc[0],
            "ratio_lo": min(ratios) if ratios else None,
            "ratio_mid": float(np.median(ratios)) if ratios else None,
            "ratio_hi": max(ratios) if ratios else None, "not_legal": not_legal, "text": text}


def tile_table(plane: dict, measured: pd.DataFrame | None) -> tuple[pd.DataFrame, dict]:
    """The page's table: one row per legal configuration, fastest predicted first, with the
    measured time where there is one: ``(DataFrame, {column: fmt.Col})``."""
    from dashboard.fmt import Col

    cells = plane["cells"]
    df = cells[cells["legal"]].sort_values("rank").copy()
    df["tiles"] = [tiles_label(q, k) for q, k in zip(df["block_q"], df["block_k"])]
    pred = f"Predicted from {plane['rates']}"
    cols = {"tiles": Col("Tile (queries × keys)"), "predicted_ms": Col(pred, "ms"),
            "rank": Col("Model's rank", "count"), "bound": Col("Limited by")}
    if measured is not None and not measured.empty:
        m = measured.set_index(["block_q", "block_k"])["time_ms"]
        df["measured_ms"] = [m.get((q, k), np.nan) for q, k in zip(df["block_q"], df["block_k"])]
        best = float(measured["time_ms"].min()) if measured["time_ms"].notna().any() else np.nan
        df["vs_best"] = df["measured_ms"] / best - 1
        df["measured_rank"] = df["measured_ms"].rank(method="min")
        cols.update({"measured_ms": Col("Measured", "ms"),
                     "measured_rank": Col("Measured rank", "count"),
                     "vs_best": Col("Slower than the measured best", "pct")})
    cols.update({"global_bytes": Col("Global memory", "bytes"), "dram_bytes": Col("DRAM", "bytes")})
    if df["options"].astype(bool).any():
        cols["options"] = Col("Other settings")
    return df.reset_index(drop=True), cols

# ------------------------------------------------------------------------------------------------
# Measuring on this machine
# ------------------------------------------------------------------------------------------------
_CUDA_NOTE: list[str] = []


def _has_cuda_driver() -> bool:
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@st.cache_data(show_spinner=False)
def cuda_device() -> str | None:
    """Name of the CUDA GPU torch sees, or None (no driver, no torch, no device). Without a
    CUDA driver torch is not imported at all (that alone takes seconds)."""
    _CUDA_NOTE.clear()
    if not _has_cuda_driver():
        _CUDA_NOTE.append("no CUDA driver (libcuda) on this machine")
        return None
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        _CUDA_NOTE.append(f"torch is not importable: {type(exc).__name__}")
        return None
    try:
        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except Exception as exc:  # noqa: BLE001
        _CUDA_NOTE.append(f"torch.cuda failed: {exc}")
        return None
    _CUDA_NOTE.append(f"torch {torch.__version__} reports no CUDA device")
    return None


def cuda_probe_note() -> str:
    """Why :func:`cuda_device` found nothing, when known."""
    return "; ".join(_CUDA_NOTE)


MEASURE_MODULE = "benchmarks.measure"


def import_measure():
    """``(benchmarks.measure module, None)`` or ``(None, reason)``; it must offer ``run_sweep``."""
    try:
        mod = importlib.import_module(MEASURE_MODULE)
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"
    if not callable(getattr(mod, "run_sweep", None)):
        return None, f"{MEASURE_MODULE} has no run_sweep(configs, progress=...)"
    return mod, None


def measure_configs(seq_lens, head_dims, dtypes, batch, heads, causal, passes) -> list[dict]:
    """The cross product of the Measure page's choices as ``benchmarks.measure`` configurations
    (keys named as in the results records)."""
    return [{"batch": batch, "heads": heads, "heads_kv": heads, "seq_len_q": n, "seq_len_k": n,
             "head_dim": d, "dtype": dt, "causal": bool(c), "pass": p}
            for n in seq_lens for d in head_dims for dt in dtypes for c in causal for p in passes]


def sweep_progress(done: int, total: int, elapsed_s: float) -> str:
    """The Measure page's progress line: configurations done, time so far and, from the rate so
    far, about how long is left."""
    from dashboard import fmt

    head = f"{done:,} / {total:,} configurations, {fmt.duration(elapsed_s)} so far"
    if done >= total:
        return f"{total:,} configurations measured in {fmt.duration(elapsed_s)}"
    if done == 0:
        return head + "; the time left is estimated after the first configuration"
    return head + f", about {fmt.duration(elapsed_s / done * (total - done))} left"


def new_results_path(gpu: str) -> Path:
    """A new, dated results file name in ``results/`` for a sweep on ``gpu``."""
    import datetime as _dt
    import re as _re

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = _re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "gpu"
    path = ROOT / "results" / f"{name}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------------------------------------
# Decoding: the split-KV plan (``sim.decode``) of one decoding workload, and a file of measured
# decoding (``python -m benchmarks decode``) re-priced as ``python -m benchmarks decode --report``
# prices it (``benchmarks.decode.decode_report``)
# ------------------------------------------------------------------------------------------------
#: The schema of the files ``python -m benchmarks decode`` writes.
DECODE_SCHEMAS = ("ioaware.decode/1",)
#: The decode file the Decoding page opens on (named here, as `DEFAULT_RATES_FILES` names the
#: rates files; the first decode file found where it is absent).
DEFAULT_DECODE_FILE = "decode_h200_2026-11-28.json"
#: The fields of a decode record that name its workload (what the plan is built from).
DECODE_FIELDS = ("batch", "heads_q", "heads_kv", "head_dim", "seq_len_q", "seq_len_k", "dtype")
#: The three scores of ``decode --report`` (its summary's keys), as the page names them.
DECODE_SCORE_LABELS = {
    "dram": "DRAM read bytes against Nsight Compute's",
    "time": "Predicted time against our GPU time alone",
    "splits": "Time lost by the split pick against the best split count timed",
}


def decode_limits() -> dict:
    """The split-KV plan's limits, from ``sim.decode``: ``max_seqlen_q`` (query rows per
    sequence the decoding kernel takes), ``max_splits`` (the most splits the choice considers)
    and ``min_keys_per_split`` (the fewest keys a split keeps)."""
    dec = importlib.import_module("sim.decode")
    return {"max_seqlen_q": dec.MAX_SEQLEN_Q, "max_splits": dec.MAX_SPLITS,
            "min_keys_per_split": dec.MIN_KEYS_PER_SPLIT}


def _decode_plan_cost(sizes: dict, prof, splits: int | None = None,
                      tensor_cores: bool | None = None, mma_warps: int | None = None):
    """``(plan, costs)`` of ``sim.decode`` for a decoding workload (``sizes``: the
    :data:`DECODE_FIELDS`) on ``prof``: ``split_kv_plan`` (splits by the model's choice unless
    given; its kernel and warps by the plan's rule unless ``tensor_cores`` and ``mma_warps`` say
    which, as for a measured record, ``benchmarks.decode.record_tensor_cores`` and
    ``record_mma_warps``) priced by ``split_kv_costs``."""
    dec = importlib.import_module("sim.decode")
    element = importlib.import_module("sim.workload").DTYPE_BYTES[sizes["dtype"]]
    plan = dec.split_kv_plan(int(sizes["batch"]), int(sizes["heads_q"]), int(sizes["heads_kv"]),
                             int(sizes["seq_len_q"]), int(sizes["seq_len_k"]),
                             int(sizes["head_dim"]), element, prof.num_sms, splits=splits,
                             tensor_cores=tensor_cores, smem_bytes_per_sm=prof.smem_bytes_per_sm,
                             mma_warps=mma_warps, gpu=prof)
    return plan, dec.split_kv_costs(plan, prof)


def _decode_checked(sizes: dict) -> None:
    """Raise ValueError (one plain line) where the split-KV plan does not take ``sizes``."""
    dtypes = importlib.import_module("sim.workload").DTYPE_BYTES
    for key in DECODE_FIELDS[:-1]:
        v = sizes.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{key.replace('_', ' ')} must be a positive whole number, is {v!r}")
    if sizes.get("dtype") not in dtypes:
        raise ValueError(f"dtype must be one of {', '.join(sorted(dtypes))}, is "
                         f"{sizes.get('dtype')!r}")
    if sizes["heads_q"] % sizes["heads_kv"]:
        raise ValueError(f"the {sizes['heads_q']} query heads do not divide into groups of "
                         f"{sizes['heads_kv']} KV heads (query heads must be a multiple of KV "
                         "heads)")


def _rate_of_dram(prof) -> tuple[float, str]:
    """``(bytes/s, source)``: the DRAM rate the plan's time streams at (``sim.decode.DRAM_RATE``
    of ``sim.plan.rates_of``: the measured read bandwidth where the profile carries a rates
    file, else the datasheet's)."""
    rates, sources = importlib.import_module("sim.plan").rates_of(prof)
    name = importlib.import_module("sim.decode").DRAM_RATE
    return rates[name], sources[name]


@st.cache_data(show_spinner=False, max_entries=256)
def decode_prediction(batch: int, heads_q: int, heads_kv: int, seq_len_q: int, seq_len_k: int,
                      head_dim: int, dtype: str, profile: str, custom: tuple | None = None,
                      rates: bytes | None = None, splits: int | None = None) -> dict:
    """The split-KV plan (``sim.decode``) of one decoding workload priced on ``profile`` (with
    the measured rates of ``rates``, a rates file's bytes, when given): the split count the
    model picks (or ``splits`` where given), and its cost at every split count the choice
    considers. Raises ValueError (one line) where the plan does not take the workload. Returns:

    * ``splits`` (the plan's: given or chosen), ``chosen`` (the model's own pick), ``given``;
      ``plan``: the plan as a dict (grid, threads, rows per program, ...);
    * ``time_ms``, ``time_main_ms``, ``time_merge_ms``, ``dram_read_bytes``,
      ``dram_write_bytes``, ``kv_bytes``, ``flops``, ``wave_efficiency``, ``launches`` of the
      plan; ``dram_rate`` (the bytes/s its DRAM traffic streams at) and ``bandwidth_fraction``
      (K and V bytes / predicted time / that rate: the fraction of the DRAM rate the prediction
      implies, as ``python -m benchmarks decode`` reports the measured fraction of the copy
      bandwidth);
    * ``one_split_ms`` (one split: one program per (batch, KV head, row chunk) streaming all
      the keys, a FlashAttention-2-like grid) and ``chosen_ms`` (the model's pick);
    * ``curve``: DataFrame of ``splits``, ``time_ms``, ``time_main_ms``, ``time_merge_ms``,
      ``wave_efficiency``, ``dram_bytes`` at every split count from 1 to ``most`` (each split
      keeping at least ``sim.decode.MIN_KEYS_PER_SPLIT`` keys, at most ``MAX_SPLITS``; the
      given count too where beyond);
    * ``rates`` ("measured rates" or "datasheet rates"), ``rate_sources``, ``rates_error``
      (why a given rates file was not used, or None), ``profile``, ``gpu``.
    """
    sizes = {"batch": batch, "heads_q": heads_q, "heads_kv": heads_kv, "seq_len_q": seq_len_q,
             "seq_len_k": seq_len_k, "head_dim": head_dim, "dtype": dtype}
    _decode_checked(sizes)
    if splits is not None and (isinstance(splits, bool) or int(splits) < 1):
        raise ValueError(f"the number of splits must be at least 1, is {splits!r}")
    prof, rates_error = rated_profile(profile, custom, rates)
    limits = decode_limits()
    chosen_plan, chosen = _decode_plan_cost(sizes, prof)
    plan, costs = (chosen_plan, chosen) if splits is None else _decode_plan_cost(
        sizes, prof, int(splits))
    most = max(1, min(limits["max_splits"], seq_len_k // limits["min_keys_per_split"]))
    counts = sorted(set(range(1, most + 1)) | {plan.splits, chosen_plan.splits})
    rows = []
    priced = {plan.splits: costs, chosen_plan.splits: chosen}
    for s in counts:
        c = priced[s] if s in priced else _decode_plan_cost(sizes, prof, s)[1]
        rows.append({"splits": s, "time_ms": c["time_s"] * 1e3,
                     "time_main_ms": c["time_main_s"] * 1e3,
                     "time_merge_ms": c["time_merge_s"] * 1e3,
                     "wave_efficiency": c["wave_efficiency"],
                     "dram_bytes": c["dram_read_bytes"] + c["dram_write_bytes"]})
    curve = pd.DataFrame(rows)
    rate, _ = _rate_of_dram(prof)
    time_s = costs["time_s"]
    return {"splits": plan.splits, "chosen": chosen_plan.splits, "given": splits is not None,
            "plan": plan.as_dict(), "time_ms": time_s * 1e3,
            "time_main_ms": costs["time_main_s"] * 1e3,
            "time_merge_ms": costs["time_merge_s"] * 1e3,
            "dram_read_bytes": costs["dram_read_bytes"],
            "dram_write_bytes": costs["dram_write_bytes"], "kv_bytes": costs["kv_bytes"],
            "flops": costs["flops"], "wave_efficiency": costs["wave_efficiency"],
            "launches": costs["launches"], "dram_rate": rate,
            "bandwidth_fraction": costs["kv_bytes"] / time_s / rate if time_s > 0 else None,
            "one_split_ms": float(curve.loc[curve["splits"] == 1, "time_ms"].iloc[0]),
            "chosen_ms": chosen["time_s"] * 1e3, "curve": curve, "most": most,
            "rate_sources": dict(costs["rates"]), "rates": _rates_text(costs["rates"]),
            "rates_error": rates_error, "profile": prof.name,
            "gpu": prof.description or prof.name}


def decode_files() -> list[Path]:
    """Files of measured decoding (``python -m benchmarks decode``, :data:`DECODE_SCHEMAS`) in
    ``$IOAWARE_RESULTS`` and ``results/``, by name."""
    return _files_of_schemas(DECODE_SCHEMAS)


def decode_choices() -> list[str]:
    """Display names of :func:`decode_files`."""
    return [_choice_name(p) for p in decode_files()]


def default_decode_choice() -> str | None:
    """The choice the Decoding page opens on: :data:`DEFAULT_DECODE_FILE` where it is found,
    else the first decode file; None when there is none."""
    choices = decode_choices()
    named = [c for c in choices if c.replace("\\", "/").rsplit("/", 1)[-1] == DEFAULT_DECODE_FILE]
    return (named or choices or [None])[0]


@st.cache_data(show_spinner=False, max_entries=16)
def load_decode(content: bytes, name: str) -> dict:
    """A file of measured decoding given as bytes: ``{"name", "doc" (the parsed file), "gpu",
    "date", "profile" (the model's profile of its GPU: the provenance's ``profile``, else the
    one matching its ``gpu``; None where neither), "peak_copy" (the copy bandwidth measured in
    the run, bytes/s, or None), "digest", "n_decode", "n_window", "kinds"}``; ``kinds`` counts
    the decode records carrying each optional part: ``device`` (our GPU time alone),
    ``splits`` (a split-count sweep), ``ncu`` (Nsight Compute's DRAM bytes), ``graph`` (CUDA
    graph replays). Raises ValueError with one line when the file cannot be read."""
    doc = _json_of_schema(content, name, DECODE_SCHEMAS, "a file of measured decoding")
    records = doc.get("decode", [])
    windows = doc.get("window", [])
    if not isinstance(records, list) or not isinstance(windows, list):
        raise ValueError(f"{name}: `decode` and `window` must be lists of records")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ValueError(f"{name}: decode record {i} is not an object")
        missing = [k for k in DECODE_FIELDS if k not in rec]
        if missing:
            raise ValueError(f"{name}: decode record {i} lacks {', '.join(missing)}")
        try:
            _decode_checked({k: rec[k] for k in DECODE_FIELDS})
        except ValueError as exc:
            raise ValueError(f"{name}: decode record {i}: {exc}") from None
        if not isinstance(rec.get("times_ms", {}), dict):
            raise ValueError(f"{name}: decode record {i}: `times_ms` must be an object")
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    gpu = str(prov.get("gpu") or "")
    profile = prov.get("profile") if prov.get("profile") in profile_names() else None
    if profile is None and gpu:
        profile = profile_for_gpu(gpu)
    peak = prov.get("peak_copy_bytes_per_s")
    kinds = {"device": sum(bool(r.get("ioaware_device_ms")) for r in records),
             "splits": sum(any(v for v in (r.get("splits_ms") or {}).values())
                           for r in records),
             "ncu": sum(bool((r.get("ncu") or {}).get("dram__bytes_read.sum"))
                        for r in records),
             "graph": sum(bool(r.get("graph_ms")) for r in records)}
    return {"name": name, "doc": doc, "gpu": gpu or "an unrecorded GPU",
            "date": str(prov.get("date") or "")[:10], "profile": profile,
            "peak_copy": float(peak) if isinstance(peak, (int, float)) and peak > 0 else None,
            "digest": hashlib.sha1(content).hexdigest(), "n_decode": len(records),
            "n_window": len(windows), "kinds": kinds}


def load_decode_choice(name: str) -> dict:
    """:func:`load_decode` of one of :func:`decode_choices` by its display name."""
    for path in decode_files():
        if _choice_name(path) == name:
            return load_decode(path.read_bytes(), _choice_name(path))
    raise FileNotFoundError(f"decode file {name!r} is no longer available")


def decode_case_label(case) -> str:
    """One decode case as text: ``"bf16, batch 8, Nk = 32,768, 32/8 heads, d = 128"`` (query
    heads / KV heads; the query rows per sequence where there is more than one)."""
    return (f"{case['dtype']}, batch {int(case['batch'])}, Nk = {int(case['seq_len_k']):,}, "
            f"{int(case['heads_q'])}/{int(case['heads_kv'])} heads, d = {int(case['head_dim'])}"
            + (f", {int(case['seq_len_q'])} query rows" if int(case["seq_len_q"]) != 1 else ""))


def _decode_report():
    try:
        fn = getattr(importlib.import_module("benchmarks.decode"), "decode_report", None)
    except Exception as exc:  # noqa: BLE001 - said on the page
        raise ResultsUnavailable(f"the benchmarks package is not importable "
                                 f"({type(exc).__name__}: {exc})") from None
    if not callable(fn):
        raise ResultsUnavailable("benchmarks.decode has no decode_report")
    return fn


@st.cache_data(show_spinner=False, max_entries=32)
def decode_measured(digest: str, profile: str, custom: tuple | None = None,
                    rates: bytes | None = None, _loaded: dict | None = None) -> dict:
    """The decode records of a loaded decode file (``_loaded``: :func:`load_decode`'s, whose
    ``digest`` keys the cache) re-priced on ``profile`` (and ``rates``) by ``python -m
    benchmarks decode --report``'s code (``benchmarks.decode.decode_report``: today's plan,
    nothing fitted on the file). Returns:

    * ``cases``: DataFrame, one row per decode record, in the file's order: the workload
      (:data:`DECODE_FIELDS`), ``label``, ``call_ms`` (our public call with its host time),
      ``gpu_ms`` (our GPU time alone), ``model_ms``, ``time_rel_error`` (against ``gpu_ms``),
      ``bw_fraction`` (K/V bytes / ``call_ms`` / the copy bandwidth measured in the run, as the
      file records it), ``gpu_bw_fraction`` (the same for ``gpu_ms``), ``fastest_sdpa`` (the
      fastest SDPA backend's label), ``fastest_sdpa_ms``, ``sdpa_ratio`` (the fastest SDPA's
      time / ours per call, as the file records it: above 1, ours is faster), ``splits`` (the
      model's pick), ``splits_best`` (the best timed), ``splits_loss``, ``dram_rel_error``
      (against Nsight Compute) and ``has_sweep``;
    * ``summary``: DataFrame of the report's scores (``metric``, ``label``, ``n``,
      ``median_abs``, ``within``, ``target``);
    * ``sweeps``: ``{row index: {"measured": DataFrame(splits, measured_ms), "predicted":
      DataFrame(splits, time_ms) at every split count from 1 to the largest timed, "pick",
      "pick_ms", "best", "best_ms", "one_ms" (measured at one split, or None), "loss"}}`` for
      the records with a split sweep;
    * ``rates``, ``rate_sources``, ``rates_error``, ``profile``, ``gpu``.
    """
    doc = _loaded["doc"]
    prof, rates_error = rated_profile(profile, custom, rates)
    rows, summary = _decode_report()(doc, prof)
    sdpa_names = [n for n in FAMILY_LABELS if n.startswith("sdpa-")]
    peak = _loaded.get("peak_copy")
    cases, sweeps = [], {}
    records = doc.get("decode", [])
    # the rates the plans price at: the plan's own where there are records
    bench = importlib.import_module("benchmarks.decode")
    ran_mma, ran_warps = bench.record_tensor_cores, bench.record_mma_warps
    sources = (_decode_plan_cost({k: records[0][k] for k in DECODE_FIELDS}, prof,
                                 tensor_cores=ran_mma(records[0]))[1]["rates"]
               if records else _rate_sources_of(prof))
    for i, (rec, row) in enumerate(zip(records, rows)):
        times = rec.get("times_ms") or {}
        ours = (times.get("ioaware") or {})
        sdpa = {n: e["ms"] for n, e in times.items()
                if n != "ioaware" and isinstance(e, dict) and e.get("ms")}
        fastest = min(sdpa, key=sdpa.get) if sdpa else None
        gpu_ms = row["gpu_ms"]
        sizes = {k: rec[k] for k in DECODE_FIELDS}
        cases.append({**sizes, "label": decode_case_label(sizes), "call_ms": ours.get("ms"),
                      "gpu_ms": gpu_ms, "model_ms": row["model_ms"],
                      "time_rel_error": row["time_rel_error"],
                      "bw_fraction": ours.get("kv_bandwidth_fraction"),
                      "gpu_bw_fraction": (rec["kv_bytes"] / (gpu_ms * 1e-3) / peak
                                          if gpu_ms and peak and rec.get("kv_bytes") else None),
                      "fastest_sdpa": (family_label(fastest) if fastest in sdpa_names
                                       else fastest),
                      "fastest_sdpa_ms": sdpa.get(fastest),
                      "sdpa_ratio": rec.get("ratio_vs_fastest_sdpa"),
                      "splits": row["splits"], "splits_best": row["splits_best"],
                      "splits_loss": row["splits_loss"], "dram_rel_error": row["dram_rel_error"],
                      "has_sweep": False})
        pick = row["splits"]          # the report's pick and time: today's plan of the record's kernel
        timed = {int(k): float(v) for k, v in (rec.get("splits_ms") or {}).items() if v}
        if not timed:
            continue
        cases[-1]["has_sweep"] = True
        predicted = pd.DataFrame(
            [{"splits": s, "time_ms": _decode_plan_cost(sizes, prof, s, ran_mma(rec),
                                                        ran_warps(rec))[1]["time_s"] * 1e3}
             for s in range(1, max(max(timed), pick) + 1)])
        best = min(timed, key=timed.get)
        sweeps[i] = {"measured": pd.DataFrame({"splits": list(timed),
                                               "measured_ms": list(timed.values())}
                                              ).sort_values("splits", ignore_index=True),
                     "predicted": predicted, "pick": pick,
                     "pick_ms": row["model_ms"], "best": best, "best_ms": timed[best],
                     "one_ms": timed.get(1), "pick_measured_ms": timed.get(pick),
                     "loss": row["splits_loss"]}
    score_rows = [{"metric": m, "label": DECODE_SCORE_LABELS.get(m, m), **s}
                  for m, s in summary.items()]
    return {"cases": pd.DataFrame(cases), "summary": pd.DataFrame(score_rows), "sweeps": sweeps,
            "rates": _rates_text(sources), "rate_sources": dict(sources),
            "rates_error": rates_error, "profile": prof.name,
            "gpu": prof.description or prof.name}


def _rate_sources_of(prof) -> dict:
    """``{rate name: "measured" or "datasheet"}`` of a profile (``sim.plan.rates_of``)."""
    return dict(importlib.import_module("sim.plan").rates_of(prof)[1])


def decode_cases_columns(rates: str) -> dict:
    """Columns of the Decoding page's table of measured cases (``rates``: what the predicted
    times come from, "measured rates" or "datasheet rates")."""
    from dashboard.fmt import Col

    return {
        "dtype": Col("dtype"),
        "batch": Col("Batch", "count"),
        "seq_len_k": Col("KV length Nk", "count"),
        "call_ms": Col("Measured per call", "ms",
                       help="Our public call (checks, the split-KV kernel with its merge), "
                            "synchronous, with its host time."),
        "gpu_ms": Col("Measured, GPU time alone", "ms",
                      help="The same call timed on the GPU alone (the host enqueues while the "
                           "GPU sleeps): what the model is scored against."),
        "model_ms": Col(rates_label(rates), "ms",
                        help="The split-KV plan the model picks, priced on the chosen profile."),
        "time_rel_error": Col("Time error", "signed_pct",
                              help="(predicted − GPU time alone) / GPU time alone."),
        "bw_fraction": Col("K/V bandwidth per call, of the copy bandwidth", "pct",
                           help="K and V bytes / time per call, as a fraction of the "
                                "device-to-device copy bandwidth measured in the same run."),
        "gpu_bw_fraction": Col("K/V bandwidth, GPU time alone", "pct",
                               help="The same for our GPU time alone."),
        "fastest_sdpa": Col("Fastest SDPA backend"),
        "sdpa_ratio": Col("Fastest SDPA time ÷ ours", "ratio",
                          help="Per call; above 1, ours is faster."),
        "splits": Col("Splits the model picks", "count"),
        "splits_best": Col("Best split count timed", "count"),
        "splits_loss": Col("Time lost by the pick", "signed_pct",
                           help="Measured time at the model's pick / the best timed − 1 (— "
                                "where the file did not time the pick)."),
        "dram_rel_error": Col("DRAM read bytes error", "signed_pct",
                              help="Predicted DRAM read bytes against Nsight Compute's."),
    }


def decode_summary_table(summary: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The report's scores as the page shows them: ``(frame, columns)``."""
    from dashboard.fmt import Col

    df = summary.copy()
    df["within_text"] = [f"{int(r.within)} of {int(r.n)}" if r.n else "—"
                         for r in df.itertuples()]
    return df, {"label": Col("Score"), "n": Col("Records scored", "count"),
                "median_abs": Col("Median |error|", "pct"),
                "target": Col("Target", "pct"), "within_text": Col("Within the target")}


# ------------------------------------------------------------------------------------------------
# What asynchrony buys (FlashAttention-3 on Hopper)
# ------------------------------------------------------------------------------------------------
#: FlashAttention-3's ideas as the page names them, in the order the model's ablation adds them
#: (`sim.plans.flash3.ABLATION_STEPS`), then the overlap without ping-pong.
ASYNC_STEPS = {
    "baseline": "No asynchrony (FlashAttention-2's structure on Hopper)",
    "+warp_specialisation": "Loading ahead (a producer warp)",
    "+pingpong": "Loading ahead and ping-pong (two warpgroups take turns on the tensor cores)",
    "+intra_overlap": "All three, FlashAttention-3 (each warpgroup also runs its softmax "
                      "under its own products)",
    "intra_only": "Loading ahead and the overlap, without ping-pong",
}
#: The critical path of the model's overlap reading, in words.
ASYNC_PATH_LABELS = {"matmul": "the tensor cores", "mufu": "the exponentials (MUFU)",
                     "fp32": "the softmax's float32 work", "dram": "DRAM bandwidth",
                     "l2": "L2 bandwidth", "smem": "shared-memory bandwidth"}
#: Input precisions the page offers: label -> the plan's dtype.
ASYNC_PRECISIONS = {"16-bit (float16 / bfloat16)": "fp16", "FP8 (e4m3)": "fp8"}
#: Files of measured schedules (``python -m benchmarks fp8 --schedules``).
SCHEDULE_SCHEMAS = ("ioaware.fp8/1",)
#: The measured schedules of our Hopper kernel (`benchmarks.fp8.SCHEDULES`) and the model's step
#: pair that prices the same idea: (name in the file, label, the model's step with the idea,
#: the model's step without it).
SCHEDULE_IDEAS = (("pingpong", "Ping-pong", "+pingpong", "+warp_specialisation"),
                  ("overlap", "Overlap", "intra_only", "+warp_specialisation"),
                  ("pingpong+overlap", "Both", "+intra_overlap", "+warp_specialisation"))
#: The tile at which the schedules are compared (two consumer warpgroups: ping-pong needs them).
SCHEDULE_TILE = "128x128"


def _path_label(label: str) -> str:
    """A critical path of `sim.plans.flash3.overlap_report` in words (a chain: its members)."""
    if label in ASYNC_PATH_LABELS:
        return ASYNC_PATH_LABELS[label]
    parts = [p for p in re.split(r"[^a-z0-9]+", label) if p in ASYNC_PATH_LABELS]
    return " then ".join(ASYNC_PATH_LABELS[p] for p in parts) if parts else label


def _flash3_costs(workload, precision: str, prof) -> dict:
    """``{step: PlanCost}`` of FlashAttention-3's forward plan at each of :data:`ASYNC_STEPS`."""
    f3 = importlib.import_module("sim.plans.flash3")
    price = importlib.import_module("sim.plan").price
    steps = dict(f3.ABLATION_STEPS)
    steps["intra_only"] = f3.INTRA_ONLY
    return {label: price(f3.flash3_forward_plan(workload, dtype=precision, **flags), prof)
            for label, flags in steps.items()}


@st.cache_data(show_spinner=False, max_entries=128)
def asynchrony_steps(seq_len: int, head_dim: int, batch: int, heads: int, causal: bool,
                     precision: str, profile: str, custom: tuple | None = None,
                     rates: bytes | None = None) -> tuple[pd.DataFrame, dict]:
    """The model's answer to "what does each of FlashAttention-3's ideas buy" for one forward
    workload: FlashAttention-3's plan (`sim.plans.flash3.flash3_forward_plan`, its tiles) at
    each of :data:`ASYNC_STEPS`, priced on the profile (with the measured rates of ``rates``,
    a rates file's bytes, when given). ``precision``: "fp16" or "fp8".

    Returns ``(table, info)``: one row per step with ``step`` (its label), ``time_ms``,
    ``tflops``, ``speedup`` (over the first step), ``gain`` (over the step before it; the last
    row's over loading ahead alone) and ``critical_path`` (what bounds it, in words); ``info``:
    ``rates`` ("datasheet rates" or "measured rates"), ``rates_error``, ``tiles`` (the plan's),
    ``mufu_over_matmul`` (the exponentials' time over the products', full kernel),
    ``hidden`` (the levels the full kernel hides, in words) and ``peak_tflops`` (the profile's
    datasheet tensor-core peak for the precision). Raises ValueError (the plan's
    message) for a workload it refuses."""
    f3 = importlib.import_module("sim.plans.flash3")
    prof, rates_error = rated_profile(profile, custom, rates)
    w = _sim().Workload(batch=batch, heads=heads, seq_len_q=seq_len, head_dim=head_dim,
                        dtype="bf16" if precision == "fp8" else "fp16", causal=causal)
    costs = _flash3_costs(w, precision, prof)
    base = costs["baseline"].time_s
    rows, before = [], None
    for label, cost in costs.items():
        rep = f3.overlap_report(cost)
        ref = costs["+warp_specialisation"].time_s if label == "intra_only" else before
        rows.append({"step": ASYNC_STEPS[label], "key": label, "time_ms": cost.time_ms,
                     "tflops": f3.tflops(w, cost.time_s), "speedup": base / cost.time_s,
                     "gain": None if ref is None else ref / cost.time_s,
                     "critical_path": _path_label(rep["critical_path"])})
        if label != "intra_only":
            before = cost.time_s
    full = f3.overlap_report(costs["+intra_overlap"])
    cfg = costs["+intra_overlap"].plan.config
    info = {"rates": _costs_rates(list(costs.values())), "rates_error": rates_error,
            "tiles": tiles_label(cfg["block_q"], cfg["block_k"]),
            "mufu_over_matmul": full["mufu_over_matmul"],
            "hidden": [ASYNC_PATH_LABELS.get(h, h) for h in full["hidden"]],
            "peak_tflops": (prof.tensor_flops_per_s or {}).get(precision, 0.0) / 1e12}
    return pd.DataFrame(rows), info


def asynchrony_columns() -> dict:
    """The columns of the steps table (`asynchrony_steps`) as the page shows them."""
    from dashboard.fmt import Col
    return {"step": Col("Step"),
            "time_ms": Col("Predicted time", "ms", "FlashAttention-3's plan at this step, "
                           "priced at the chosen rates with the model's overlap reading: what "
                           "hides under what is on the *Critical path* column."),
            "tflops": Col("TFLOP/s", "num"),
            "speedup": Col("× no asynchrony", "ratio"),
            "gain": Col("× the step before", "ratio", "The last row: over loading ahead "
                        "alone, so that it reads against the ping-pong row."),
            "critical_path": Col("Critical path")}


def schedule_files() -> list[Path]:
    """Files of measured schedules (:data:`SCHEDULE_SCHEMAS`) in ``$IOAWARE_RESULTS`` and
    ``results/``, by name."""
    return _files_of_schemas(SCHEDULE_SCHEMAS)


def schedule_choices() -> list[str]:
    """Display names of :func:`schedule_files`."""
    return [_choice_name(p) for p in schedule_files()]


@st.cache_data(show_spinner=False, max_entries=8)
def load_schedules(content: bytes, name: str) -> dict:
    """A file of ``python -m benchmarks fp8 --schedules`` given as bytes: ``{"name", "gpu",
    "date", "profile" (the model's profile of its GPU, or None), "rows"}``, ``rows`` its speed
    records that time the schedules. Raises ValueError with one line when the file cannot be
    read or times no schedule."""
    obj = _json_of_schema(content, name, SCHEDULE_SCHEMAS, "a file of measured schedules")
    rows = [r for r in obj.get("speed") or []
            if isinstance(r, dict) and any(str(k).endswith("-serial")
                                           for k in (r.get("times_ms") or {}))]
    if not rows:
        raise ValueError(f"{name} times no schedules (it was written without --schedules)")
    prov = obj.get("provenance") or {}
    return {"name": name, "gpu": prov.get("gpu"), "date": prov.get("date"),
            "profile": profile_for_gpu(prov.get("gpu") or ""), "rows": rows}


def load_schedules_choice(name: str) -> dict:
    """:func:`load_schedules` of the file of :func:`schedule_files` named ``name``."""
    for path in schedule_files():
        if _choice_name(path) == name:
            return load_schedules(path.read_bytes(), path.name)
    raise FileNotFoundError(f"results file {name!r} is no longer available")


def _measured_ms(times: dict, key: str):
    entry = times.get(key) or {}
    return entry.get("ms")


def schedule_gains(loaded: dict, head_dim: int, causal: bool, precision: str, profile: str,
                   custom: tuple | None = None, rates: bytes | None = None
                   ) -> tuple[pd.DataFrame, dict]:
    """Measured beside predicted, per sequence length of a schedules file (:func:`load_schedules`)
    at ``head_dim`` and ``causal``: what each schedule bought our Hopper kernel (t_serial /
    t_schedule at :data:`SCHEDULE_TILE`, 16-bit or FP8 as ``precision`` says) and what the
    model says the same idea buys FlashAttention-3 on the row's problem (the ratio of the
    :data:`SCHEDULE_IDEAS` step pair); and cuDNN's measured speedup over FlashAttention-2
    (t_FLASH / t_cuDNN, SDPA, 16-bit only) beside the model's FlashAttention-3 over its
    baseline. One row per N: ``seq_len``, ``batch``, ``heads``, ``<idea>_measured`` and
    ``<idea>_predicted`` for each idea, ``cudnn_measured``, ``cudnn_predicted`` (16-bit).
    Empty where the file has no such row. The model prices on the profile of the file's GPU:
    the sidebar's ``profile`` with ``rates`` where it is that GPU's or no profile matches the
    GPU, else that GPU's shipped rates (:func:`rates_for_profile`); the second value says which:
    ``{"profile", "profile_guessed", "rates", "gpu"}``."""
    prof_name = loaded.get("profile") or profile
    guessed = loaded.get("profile") is None
    if prof_name == profile:            # the sidebar's GPU: its rates as chosen
        prof, _ = rated_profile(profile, custom, rates)
    else:                               # another GPU's file: that GPU's shipped rates
        default = rates_for_profile(prof_name)
        prof, _ = rated_profile(prof_name, None, rates_choice_bytes(default) if default else None)
    unit = "fp8" if precision == "fp8" else f"fp16-{SCHEDULE_TILE}"
    out, priced = [], []
    for r in sorted(loaded["rows"], key=lambda r: r.get("seq_len", 0)):
        if r.get("head_dim") != head_dim or bool(r.get("causal")) != bool(causal):
            continue
        times = r.get("times_ms") or {}
        serial = _measured_ms(times, f"kernel-{unit}-serial")
        if serial is None:
            continue
        w = _sim().Workload(batch=r["batch"], heads=r["heads"], seq_len_q=r["seq_len"],
                            head_dim=head_dim, dtype="bf16" if precision == "fp8" else "fp16",
                            causal=bool(causal))
        try:
            costs = _flash3_costs(w, precision, prof)
        except ValueError:
            continue
        priced += list(costs.values())
        row = {"seq_len": r["seq_len"], "batch": r["batch"], "heads": r["heads"]}
        for name, _label, with_idea, without in SCHEDULE_IDEAS:
            t = _measured_ms(times, f"kernel-{unit}-{name}")
            row[f"{name}_measured"] = serial / t if t else None
            row[f"{name}_predicted"] = costs[without].time_s / costs[with_idea].time_s
        if precision != "fp8":      # SDPA's rows are 16-bit: no FP8 counterpart
            flash, cudnn = _measured_ms(times, "sdpa-flash"), _measured_ms(times, "sdpa-cudnn")
            row["cudnn_measured"] = flash / cudnn if flash and cudnn else None
            row["cudnn_predicted"] = costs["baseline"].time_s / costs["+intra_overlap"].time_s
        out.append(row)
    return pd.DataFrame(out), {"profile": prof_name, "profile_guessed": guessed,
                               "rates": _costs_rates(priced) if priced else "datasheet rates",
                               "gpu": loaded.get("gpu")}


def schedule_gain_columns() -> dict:
    """The columns of :func:`schedule_gains` as the page shows them."""
    from dashboard.fmt import Col
    cols = {"seq_len": Col("N", "count"), "batch": Col("Batch", "count"),
            "heads": Col("Heads", "count")}
    for name, label, _with, _without in SCHEDULE_IDEAS:
        cols[f"{name}_measured"] = Col(f"{label}: measured", "ratio",
                                       "Our Hopper kernel's time run serially over its time "
                                       "with this schedule, on the same inputs in one run.")
        cols[f"{name}_predicted"] = Col(f"{label}: predicted", "ratio",
                                        "What the model says the same idea buys "
                                        "FlashAttention-3 on this problem.")
    cols["cudnn_measured"] = Col("cuDNN over FlashAttention-2: measured", "ratio",
                                 "PyTorch's FLASH backend's time over its cuDNN backend's "
                                 "(cuDNN runs Hopper's asynchronous path).")
    cols["cudnn_predicted"] = Col("FlashAttention-3 over no asynchrony: predicted", "ratio")
    return cols
