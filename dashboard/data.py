"""Everything the dashboard computes, kept apart from its layout and cached with ``st.cache_data``.

* model tables: the three schedules side by side, the (block_q, block_k) grid, the N sweep —
  all answered by ``sim`` (this module only calls it and shapes the answers into DataFrames);
* results: loading and validating a results file (``sim.results``), its provenance, and the join
  of measured records with ``sim``'s predictions for the same configuration;
* the step-through: ``sim.trace`` events of a small problem, cumulated per step, and the online
  softmax of one query row (running max ``m``, sum ``l`` and output ``o``) as key blocks arrive.

Functions take plain values (ints, strings, tuples) so that they are cheap to hash for the cache.
"""
from __future__ import annotations

import hashlib
import importlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ("naive", "flash1", "flash2")
CUSTOM = "custom"


# ------------------------------------------------------------------------------------------------
# sim import
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
        raise RuntimeError(f"sim is not importable: {err}")
    return sim


# ------------------------------------------------------------------------------------------------
# The online softmax of one query row, step by step
# ------------------------------------------------------------------------------------------------
@st.cache_data(show_spinner=False, max_entries=64)
def online_softmax_walk(seq_len: int, head_dim: int, block_k: int, row: int, causal: bool,
                        seed: int = 0) -> dict:
    """Walk the online softmax of query ``row`` over key blocks of ``block_k`` columns.

    Inputs are seeded standard-normal Q, K, V of shape ``[seq_len, head_dim]`` (float64), scale
    ``1/sqrt(head_dim)``. After key block ``j`` arrives the running state is
    ``m_j = max(m_{j-1}, max_k s_k)``, ``l_j = l_{j-1} * exp(m_{j-1} - m_j) + sum_k exp(s_k - m_j)``,
    ``acc_j = acc_{j-1} * exp(m_{j-1} - m_j) + sum_k exp(s_k - m_j) v_k`` and the output so far is
    ``o_j = acc_j / l_j`` — the exact attention output over the keys seen so far.

    Returns a dict of DataFrames: ``steps`` (one row per key block: block, key range, block max,
    m, l, |o_j - o_final|, the rescale factor exp(m_{j-1} - m_j)), ``output`` (o_j per block and
    output dim, long form), ``scores`` (s and the final softmax probabilities per key), and
    ``check`` (max |o_final - exact softmax output| against a float64 materialised reference,
    and against ``ioaware.tiled`` when it is importable).
    """
    if not (1 <= block_k <= seq_len) or not (0 <= row < seq_len) or head_dim < 1:
        raise ValueError(f"need 1 <= block_k <= seq_len and 0 <= row < seq_len, got "
                         f"seq_len={seq_len}, block_k={block_k}, row={row}")
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((seq_len, head_dim)) for _ in range(3))
    scale = 1.0 / np.sqrt(head_dim)
    s = (k @ q[row]) * scale                                   # [seq_len] scores of this row
    n_keys = row + 1 if causal else seq_len                   # causal: keys 0..row
    s_vis = s[:n_keys]
    p_exact = np.exp(s_vis - s_vis.max())
    p_exact /= p_exact.sum()
    o_exact = p_exact @ v[:n_keys]

    m, l_sum = -np.inf, 0.0
    acc = np.zeros(head_dim)
    steps, outputs = [], []
    for j, start in enumerate(range(0, n_keys, block_k)):
        stop = min(start + block_k, n_keys)
        s_j = s[start:stop]
        # -- update m and l --
        m_new = max(m, float(s_j.max()))
        alpha = float(np.exp(m - m_new)) if np.isfinite(m) else 0.0
        p_j = np.exp(s_j - m_new)
        l_sum = l_sum * alpha + float(p_j.sum())
        # -- update output accumulator --
        acc = acc * alpha + p_j @ v[start:stop]
        m = m_new
        o_j = acc / l_sum
        steps.append({"key_block": j, "keys": f"{start}..{stop - 1}", "block_max": float(s_j.max()),
                      "m": m, "l": l_sum, "rescale_alpha": alpha,
                      "err_vs_final": float(np.abs(o_j - o_exact).max())})
        outputs.extend({"key_block": j, "dim": c, "o": float(o_j[c])} for c in range(head_dim))
    checks = {"max_abs_err_vs_exact_softmax": float(np.abs(acc / l_sum - o_exact).max())}
    tiled_err = _tiled_row_error(q, k, v, scale, row, block_k, causal, o_exact)
    if tiled_err is not None:
        checks["max_abs_err_ioaware_tiled_fp32"] = tiled_err
    scores = pd.DataFrame({"key": np.arange(seq_len), "score": s,
                           "visible": np.arange(seq_len) < n_keys,
                           "p_final": np.concatenate([p_exact, np.zeros(seq_len - n_keys)])})
    return {"steps": pd.DataFrame(steps), "output": pd.DataFrame(outputs), "scores": scores,
            "check": checks}


def _tiled_row_error(q, k, v, scale, row, block_k, causal, o_exact):
    """max |o_exact - ioaware.tiled output| for ``row`` (float32 path), or None if unavailable."""
    try:
        from ioaware.block_info import BlockInfo
        from ioaware.tiled import tiled_forward
    except Exception:  # noqa: BLE001 - the cross-check is optional
        return None
    n = q.shape[0]
    info = BlockInfo(n, n, max(1, min(block_k, n)), block_k, causal)
    shape = (1, 1, 1, n, q.shape[1])
    out, _ = tiled_forward(q.reshape(shape).astype(np.float32), k.reshape(shape).astype(np.float32),
                           v.reshape(shape).astype(np.float32), scale=scale, info=info,
                           bh=np.zeros((1, 1, 1), dtype=np.int64))
    return float(np.abs(out[0, 0, 0, row].astype(np.float64) - o_exact).max())


# ------------------------------------------------------------------------------------------------
# Results files (measured data)
# ------------------------------------------------------------------------------------------------
PROVENANCE_KEYS = ("gpu", "driver", "cuda", "torch", "numba", "numba_cuda", "date", "command")


class ResultsUnavailable(RuntimeError):
    """``sim.results`` (the results-file validator) cannot be imported."""


def _results_module():
    try:
        return importlib.import_module("sim.results")
    except Exception as exc:  # noqa: BLE001
        raise ResultsUnavailable(f"sim.results is not importable: {type(exc).__name__}: {exc}")


def format_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this results file is malformed" (shown to the user, not raised)."""
    types: list[type[BaseException]] = [ValueError, UnicodeDecodeError]
    try:
        types.insert(0, _results_module().ResultsFormatError)
    except ResultsUnavailable:
        pass
    return tuple(types)


def shipped_results() -> list[Path]:
    """Results files the app offers: those named in ``$IOAWARE_RESULTS`` (files or directories,
    separated by ``os.pathsep``) first, then the repository's ``results/*.json`` (as listed by
    ``sim.results.shipped_results``), largest first so that the default is the fullest sweep."""
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


@st.cache_data(show_spinner=False, max_entries=16)
def load_results_bytes(content: bytes, name: str = "<upload>") -> dict:
    """Validate a results file given as bytes and return ``{"records": DataFrame,
    "provenance": dict, "name": str}``.

    Validation is ``sim.results.load_results``; a malformed file raises its
    ``ResultsFormatError`` (a ValueError) with a readable message, which the page displays.
    """
    mod = _results_module()
    buf = io.BytesIO(content)
    buf.name = name
    try:
        doc = mod.load_results_file(buf)
    except UnicodeDecodeError as exc:
        raise mod.ResultsFormatError(f"{name}: not UTF-8 text ({exc})") from None
    provenance = dict(doc.get("provenance") or {})
    raw = [dict(r, provenance=provenance) for r in doc["records"]]
    df = pd.DataFrame.from_records([{k: v for k, v in r.items() if k != "provenance"}
                                    for r in doc["records"]])
    if not df.empty and "gpu" not in df.columns:
        df.insert(0, "gpu", provenance.get("gpu", "unknown"))
    digest = hashlib.sha1(content).hexdigest()
    return {"records": df, "raw": raw, "provenance": provenance, "name": name, "digest": digest}


def load_results_path(path: str | Path) -> dict:
    """:func:`load_results_bytes` for a file on disk."""
    path = Path(path)
    return load_results_bytes(path.read_bytes(), path.name)


def provenance_table(provenance: dict) -> pd.DataFrame:
    """The provenance block as a two-column table (missing fields say so)."""
    rows = [{"field": k, "value": str(provenance.get(k, "— (not recorded)"))} for k in PROVENANCE_KEYS]
    rows += [{"field": k, "value": str(v)} for k, v in provenance.items() if k not in PROVENANCE_KEYS]
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------
# Measuring on this machine
# ------------------------------------------------------------------------------------------------
_CUDA_NOTE: list[str] = []


@st.cache_data(show_spinner=False)
def cuda_device() -> str | None:
    """Name of the CUDA GPU torch sees, or None (no torch, no driver, no device)."""
    _CUDA_NOTE.clear()
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
# Model: profiles, workloads, schedules (thin adapters over sim's data classes)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CustomField:
    """One number of a user-given GPU profile: ``name`` is the ``sim.GPUProfile`` field, the
    value typed in ``unit`` is multiplied by ``factor`` to get sim's unit."""

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
    """Names of sim's built-in GPU profiles (empty when sim is unavailable)."""
    sim, _ = import_sim()
    return sorted(sim.PROFILES) if sim is not None else []


def default_profile_name() -> str:
    names = profile_names()
    return "h100" if "h100" in names else (names[0] if names else CUSTOM)


def profile_label(name: str) -> str:
    """Readable label of a profile name for the selectbox."""
    if name == CUSTOM:
        return "Custom GPU…"
    sim, _ = import_sim()
    prof = sim.PROFILES.get(name) if sim is not None else None
    desc = getattr(prof, "description", "")
    return f"{name} — {desc}" if desc else name


def profile_for_gpu(gpu_name: str) -> str | None:
    """The built-in profile matching a GPU name from a results file's provenance
    (``sim.profile_for_gpu_name``), or None."""
    sim, _ = import_sim()
    prof = importlib.import_module("sim.profiles").profile_for_gpu_name(gpu_name) if sim else None
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


def _workload(seq_len, head_dim, batch, heads, dtype, pass_, causal, density):
    # density 1.0 is dense attention: no block mask at all (not a mask that keeps every tile)
    return _sim().Workload(batch=batch, heads=heads, seq_len_q=seq_len, head_dim=head_dim,
                           dtype=dtype, causal=causal, pass_=pass_,
                           block_density=None if density >= 1.0 else float(density))


def _schedule(name, block_q=None, block_k=None):
    return _sim().Schedule(name=name, block_q=block_q, block_k=block_k)


L2_MODES = {"analytic": "analytic estimate (fast)", "trace": "trace replay (exact, slow at large N)"}
# Largest batch·heads·N² for which the Explore page replays the trace through the L2 model:
# at 16·8192² the naive schedule's replay takes a few seconds on a laptop, and grows as N².
TRACE_L2_MAX_SCORES = 16 * 8192**2


def trace_l2_affordable(batch: int, heads: int, seq_len: int) -> bool:
    """Whether the trace-replay L2 model is quick enough to run interactively."""
    return batch * heads * seq_len**2 <= TRACE_L2_MAX_SCORES


def _predict(workload, schedule, profile, l2: str = "analytic", calibration=None) -> dict:
    """sim.predict(...).to_dict() without its nested (dict-valued) entries. ``calibration``: as
    sim.predict (None: raw time only)."""
    d = _sim().predict(workload, schedule, profile, l2=l2, calibration=calibration).to_dict()
    return {k: v for k, v in d.items() if not isinstance(v, (dict, list, tuple))}


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


def _row(schedule: str, pred: dict) -> dict:
    """One schedule's prediction with the derived presentation columns."""
    row = {"schedule": schedule, **pred}
    row["global_bytes"] = pred["hbm_read_bytes"] + pred["hbm_write_bytes"]
    row["dram_bytes"] = pred["dram_read_bytes"] + pred["dram_write_bytes"]
    row["intensity_global"] = pred["flops"] / max(1, row["global_bytes"])    # FLOP / byte
    row["intensity_dram"] = pred["flops"] / max(1, row["dram_bytes"])
    row["achieved_flops"] = pred["flops"] / (pred["predicted_ms"] * 1e-3)   # FLOP / s
    return row


@st.cache_data(show_spinner=False, max_entries=256)
def compare_schedules(seq_len: int, head_dim: int, batch: int, heads: int, dtype: str,
                      pass_: str, causal: bool, density: float, profile: str,
                      custom: tuple | None = None, l2: str = "analytic",
                      calibrate_on: str | None = None) -> tuple[pd.DataFrame, dict]:
    """naive, flash1 and flash2 (default block sizes) for one workload on one profile.

    Returns ``(table, ceilings)``: one row per schedule with sim's prediction (``to_dict()``
    keys) plus ``global_bytes``, ``dram_bytes``, arithmetic intensities (FLOP/byte) and the
    roofline-implied FLOP/s; ``ceilings`` for the roofline chart. ``calibrate_on``: the
    results file (a name of :func:`results_choices`) the calibrated time is fitted on, passed
    to sim.predict as its ``calibration``; None: no calibrated time.
    """
    prof = _profile(profile, custom)
    wl = _workload(seq_len, head_dim, batch, heads, dtype, pass_, causal, density)
    cal = calibration_path(calibrate_on)
    rows = [_row(name, _predict(wl, _schedule(name), prof, l2, cal)) for name in SCHEDULES]
    return pd.DataFrame(rows), _ceilings(prof, dtype)


SCHEDULE_COLUMNS = {
    "schedule": "schedule", "block_q": "block_q", "block_k": "block_k",
    "hbm_read_bytes": "global read (B)", "hbm_write_bytes": "global write (B)",
    "dram_read_bytes": "DRAM read (B)", "dram_write_bytes": "DRAM write (B)",
    "flops": "FLOPs", "matmul_flops": "matmul FLOPs",
    "intensity_global": "FLOP / global byte", "intensity_dram": "FLOP / DRAM byte",
    "sram_bytes_per_block": "SRAM per block (B)", "blocks_per_sm": "blocks / SM",
    "predicted_ms": "predicted (ms)", "predicted_ms_calibrated": "calibrated (ms)",
    "bound": "bound by", "l2_model": "L2 model",
}


def display_schedule_table(table: pd.DataFrame) -> pd.DataFrame:
    """The schedule table with readable column names, in a fixed order (the calibrated time
    only when one was asked for)."""
    cols = [c for c in SCHEDULE_COLUMNS if c in table
            and not (c == "predicted_ms_calibrated" and table[c].isna().all())]
    return table[cols].rename(columns=SCHEDULE_COLUMNS)


def model_notes() -> str:
    """The model's stated assumptions, when sim documents them."""
    sim, _ = import_sim()
    note = getattr(sim, "MODEL_NOTES", None) if sim is not None else None
    return note or (
        "Predicted time is sim's roofline, per kernel phase: max(DRAM bytes / DRAM bandwidth, "
        "global bytes / L2 bandwidth, matmul FLOPs / matmul peak, other FLOPs / fp32 peak), "
        "divided by the SMs' utilisation (wave quantisation of the thread blocks). Raw = at peak; "
        "calibrated (only with a file chosen under *Calibrate time on*) = with efficiency "
        "factors fitted on that file's records of the same GPU and kernel program. "
        "`python -m sim predict ... --l2 analytic [--calibrate-on FILE]` (or `--l2 trace`) "
        "gives the same numbers.")


GRID_METRICS = {
    "predicted_ms": "Predicted time (ms)",
    "global_bytes": "Global-memory bytes",
    "dram_bytes": "DRAM bytes",
    "sram_bytes_per_block": "SRAM per block (bytes)",
}


def fmt_metric(metric: str, value: float) -> str:
    """A grid metric's value with its unit."""
    if metric == "predicted_ms":
        return f"{value:.3g} ms"
    from dashboard.figures import fmt_bytes
    return fmt_bytes(value)


BLOCK_SIZES = (16, 32, 64, 128, 256)


@st.cache_data(show_spinner=False, max_entries=128)
def block_grid(schedule: str, seq_len: int, head_dim: int, batch: int, heads: int, dtype: str,
               pass_: str, causal: bool, profile: str, custom: tuple | None = None,
               density: float = 1.0) -> pd.DataFrame:
    """Every (block_q, block_k) in ``BLOCK_SIZES``² from ``sim.search_blocks`` (analytic L2).

    Columns: block_q, block_k, the ``GRID_METRICS`` (NaN where infeasible, except the SRAM
    footprint), blocks_per_sm, ``feasible`` and ``why`` (why a block size does not fit).
    """
    sim = _sim()
    prof = _profile(profile, custom)
    wl = _workload(seq_len, head_dim, batch, heads, dtype, pass_, causal, density)
    res = sim.search_blocks(wl, prof, schedule, blocks=BLOCK_SIZES, l2="analytic")
    rows = []
    for r in res.grid:
        row = _row(schedule, {k: v for k, v in r.items() if not isinstance(v, (dict, list))})
        rows.append({"block_q": r["block_q"], "block_k": r["block_k"],
                     **{m: row[m] for m in GRID_METRICS}, "blocks_per_sm": r["blocks_per_sm"],
                     "feasible": True, "why": ""})
    for bq, bk, sram in res.infeasible:
        why = (f"needs {sram:,} B of shared memory per block; {prof.name} has "
               f"{prof.smem_bytes_per_block:,}" if sram > prof.smem_bytes_per_block else
               "no thread block fits on an SM (occupancy 0)")
        rows.append({"block_q": bq, "block_k": bk, **{m: np.nan for m in GRID_METRICS},
                     "sram_bytes_per_block": sram, "blocks_per_sm": 0, "feasible": False, "why": why})
    return pd.DataFrame(rows).sort_values(["block_q", "block_k"]).reset_index(drop=True)


@st.cache_data(show_spinner=False, max_entries=128)
def scaling(seq_lens: tuple[int, ...], head_dim: int, batch: int, heads: int, dtype: str,
            pass_: str, causal: bool, density: float, profile: str,
            custom: tuple | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The three schedules over ``seq_lens``; returns ``(table, bounds)``.

    ``table``: one row per (N, schedule) with global/DRAM bytes, predicted time and the extra
    memory the schedule allocates beyond Q, K, V and O (``extra_memory_bytes``).
    ``bounds``: per N, the papers' Θ(Nd + N²) (standard attention) and Θ(N²d²/M) (FlashAttention,
    M = shared memory per block in elements) curves, each scaled to equal the model's naive /
    flash1 global bytes at the smallest N (only the shape is the papers'; the constant is not).
    """
    prof = _profile(profile, custom)
    rows = []
    for n in seq_lens:
        wl = _workload(n, head_dim, batch, heads, dtype, pass_, causal, density)
        for name in SCHEDULES:
            row = _row(name, _predict(wl, _schedule(name), prof, "analytic"))
            rows.append({"seq_len": n, "schedule": name, "global_bytes": row["global_bytes"],
                         "dram_bytes": row["dram_bytes"], "predicted_ms": row["predicted_ms"],
                         "extra_memory_bytes": _extra_memory(row, wl)})
    table = pd.DataFrame(rows)
    n = np.asarray(seq_lens, dtype=float)
    d = float(head_dim)
    m_elems = float(_smem_per_block(prof)) / _dtype_bytes(dtype)
    naive_shape = n * d + n**2
    flash_shape = n**2 * d**2 / m_elems
    first = table[table["seq_len"] == seq_lens[0]].set_index("schedule")["global_bytes"]
    bounds = pd.DataFrame({
        "seq_len": seq_lens,
        "naive_bound": naive_shape * first["naive"] / naive_shape[0],
        "flash_bound": flash_shape * first["flash1"] / flash_shape[0],
    })
    return table, bounds


def _dtype_bytes(dtype: str) -> int:
    return {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]


def _smem_per_block(profile) -> int:
    return int(profile.smem_bytes_per_block)


def _extra_memory(row: dict, w) -> float:
    """Device memory a forward allocates besides Q, K, V and O (bytes): naive holds the N×N
    scores S and probabilities P (dtype) at once; flash2 keeps the logsumexp, flash1 the row
    statistics l and m (float32 per query row). Counted here because sim has no memory model."""
    rows = w.batch * w.heads * w.seq_len_q
    if row["schedule"] == "naive":
        return float(2 * rows * w.seq_len_k * w.dtype_bytes)
    return float(rows * 4 * (2 if row["schedule"] == "flash1" else 1))


# ------------------------------------------------------------------------------------------------
# Results: choices, the join with predictions, errors
# ------------------------------------------------------------------------------------------------
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


_SHORT_LABELS = {"global_bytes": "Global-memory bytes", "dram_bytes": "DRAM bytes",
                 "flops": "FLOPs", "time_raw": "Time, raw roofline (ms)",
                 "time_calibrated": "Time, calibrated (ms)"}


def compared_metrics() -> dict:
    """``{metric: short label}`` of the metrics ``sim.compare`` compares (global bytes, DRAM
    bytes, FLOPs, raw and calibrated time)."""
    return {m: _SHORT_LABELS.get(m, spec[0])
            for m, spec in importlib.import_module("sim.compare").METRICS.items()}


@st.cache_data(show_spinner="Predicting every record…", max_entries=32)
def compare_measured(digest: str, profile: str, l2: str, _records: list) -> dict:
    """Join measured records with sim's predictions (``sim.compare.compare``) on ``profile``.

    ``digest`` identifies the records (content hash of the file) for the cache. Returns
    ``{"records": DataFrame (one row per record: key fields, measured_/predicted_/rel_error_
    per metric, model_note), "summary": sim.compare.summary, "blocks":
    sim.compare.block_size_check}``.
    """
    cmp = importlib.import_module("sim.compare")
    df = cmp.compare(list(_records), profile, l2=l2)
    df = df.drop(columns=[c for c in ("efficiency",) if c in df])
    return {"records": df, "summary": cmp.summary(df), "blocks": cmp.block_size_check(df)}


def filter_records(df: pd.DataFrame, filters: dict) -> pd.DataFrame:
    """Rows of ``df`` whose ``field`` (as text) is among the chosen values, for each filter."""
    keep = np.ones(len(df), dtype=bool)
    for field, chosen in filters.items():
        if field in df:
            keep &= df[field].astype(str).isin([str(c) for c in chosen]).to_numpy()
    return df[keep].reset_index(drop=True)


def compare_summary(view: pd.DataFrame) -> pd.DataFrame:
    """``sim.compare.summary`` of the (filtered) joined records."""
    return importlib.import_module("sim.compare").summary(view)


def display_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """``sim.compare.summary`` with readable columns (percentages as text)."""
    if summary.empty:
        return pd.DataFrame(columns=["metric", "records", "n"])
    out = summary.copy()
    for col in ("median_abs_err_pct", "max_abs_err_pct", "mean_signed_err_pct", "target_pct",
                "within_target_pct", "required_pct"):
        if col in out:
            out[col] = [("—" if v is None or pd.isna(v) else f"{v:.1f}%") for v in out[col]]
    out["met"] = ["—" if v is None or pd.isna(v) else ("yes" if v else "NO") for v in out["met"]]
    return out.rename(columns={
        "median_abs_err_pct": "median |error|", "max_abs_err_pct": "max |error|",
        "mean_signed_err_pct": "mean error (bias)", "target_pct": "target |error|",
        "within_target_pct": "within target", "required_pct": "required share", "met": "target met"})


def measured_blocks(results_name: str, schedule: str, seq_len: int, head_dim: int, batch: int,
                    heads: int, dtype: str, pass_: str, causal: bool, profile: str,
                    custom: tuple | None = None, density: float = 1.0) -> pd.DataFrame:
    """Measured runs of our kernel (``kernel == "ioaware-numba"``) of ``schedule`` on exactly the
    given workload (N, d, dtype, causal, pass, batch·heads): columns block_q, block_k and the
    median time_ms over repeated records."""
    loaded = load_results_choice(results_name)
    df = loaded["records"]
    if df.empty:
        return pd.DataFrame(columns=["block_q", "block_k", "time_ms"])
    if "variant" in df:  # the tensor-core forward is another kernel than the modelled schedule
        df = df[df["variant"].fillna("simt") == "simt"]
    sel = df[(df["kernel"] == "ioaware-numba") & (df["schedule"] == schedule)
             & (df["seq_len_q"] == seq_len) & (df["seq_len_k"] == seq_len)
             & (df["head_dim"] == head_dim) & (df["dtype"] == dtype)
             & (df["causal"].astype(bool) == causal) & (df["pass"] == pass_)
             & (df["batch"] * df["heads"] == batch * heads)
             & df["block_q"].notna() & df["block_k"].notna()]
    out = sel[["block_q", "block_k", "time_ms"]].copy()
    out[["block_q", "block_k"]] = out[["block_q", "block_k"]].astype(int)
    return out.groupby(["block_q", "block_k"], as_index=False)["time_ms"].median()


def measured_workloads(results_name: str, schedule: str) -> pd.DataFrame:
    """The distinct workloads with runs of our kernel (``ioaware-numba``) of ``schedule`` in a
    results file, with how many block sizes each has — what the overlay can show."""
    df = load_results_choice(results_name)["records"]
    cols = ["seq_len_q", "head_dim", "dtype", "causal", "pass", "batch", "heads"]
    if df.empty:
        return pd.DataFrame(columns=cols + ["block_sizes"])
    sel = df[(df["kernel"] == "ioaware-numba") & (df["schedule"] == schedule)
             & (df["seq_len_q"] == df["seq_len_k"]) & df["block_q"].notna()]
    return (sel.groupby(cols).size().rename("block_sizes").reset_index()
            .sort_values(["block_sizes"], ascending=False).reset_index(drop=True))


def measured_at(measured: pd.DataFrame, best) -> str:
    """Measured time at the predicted optimum's block size, as text ("not measured" if absent)."""
    hit = measured[(measured["block_q"] == int(best["block_q"]))
                   & (measured["block_k"] == int(best["block_k"]))]
    if hit.empty:
        return "— not measured"
    t, tmin = float(hit["time_ms"].iloc[0]), float(measured["time_ms"].min())
    return f"{t:.3g} ms, {t / tmin - 1:+.1%} vs the measured optimum"


# ------------------------------------------------------------------------------------------------
# Step through: sim.trace of a small problem
# ------------------------------------------------------------------------------------------------
TRACE_TENSORS = ("Q", "K", "V", "O")


@st.cache_data(show_spinner=False, max_entries=64)
def trace_walk(schedule: str, seq_len: int, head_dim: int, block_q: int, block_k: int,
               causal: bool, dtype: str = "fp16") -> dict:
    """The event trace (``sim.trace``) of one forward of a single-head problem, for the step view.

    A *step* is one (phase, program, step) group of consecutive trace events: for the tiled
    schedules one tile of work (or a program's prologue / epilogue), for ``naive`` one kernel's
    pass. Returns ``{"events": DataFrame[step, phase, program, op, tensor, q_block, k_block,
    row_start, row_stop, bytes], "steps": DataFrame[step, phase, q_block, k_block, read_bytes,
    write_bytes, cum_read, cum_write, flops], "n_blocks_q", "n_blocks_k", "block_q", "block_k",
    "total_bytes", "schedule"}``. Blocks of naive's whole-tensor passes are counted in the
    page's block_q / block_k for display.
    """
    sim = _sim()
    ops = importlib.import_module("sim.trace").OPS
    wl = _workload(seq_len, head_dim, 1, 1, dtype, "fwd", causal, 1.0)
    tiled = schedule != "naive"
    tr = sim.trace(wl, sim.Schedule(schedule, block_q if tiled else None, block_k if tiled else None),
                   block_q=block_q if tiled else None, block_k=block_k if tiled else None)
    c = tr.columns
    key = np.stack([c["phase"], c["program"], c["step"]], 1)
    new = np.ones(len(key), dtype=bool)
    new[1:] = (key[1:] != key[:-1]).any(1)
    step = np.cumsum(new) - 1
    op_names = np.asarray(ops)[c["op"]]
    tensors = np.asarray(list(tr.tensors) + [""])[np.where(c["tensor"] >= 0, c["tensor"], len(tr.tensors))]
    ev = pd.DataFrame({"step": step, "phase": np.asarray(tr.phases)[c["phase"]],
                       "program": c["program"], "op": op_names, "tensor": tensors,
                       "q_block": c["m"], "k_block": c["n"], "row_start": c["row_start"],
                       "row_stop": c["row_stop"], "bytes": c["bytes"],
                       "flops": c["matmul_flops"] + c["other_flops"]})
    read = np.where(ev["op"] == "load", ev["bytes"], 0)
    write = np.where(ev["op"].isin(["store", "atomic"]), ev["bytes"], 0)
    steps = ev.assign(read_bytes=read, write_bytes=write).groupby("step", as_index=False).agg(
        phase=("phase", "first"), q_block=("q_block", "max"), k_block=("k_block", "max"),
        read_bytes=("read_bytes", "sum"), write_bytes=("write_bytes", "sum"), flops=("flops", "sum"))
    steps["cum_read"] = steps["read_bytes"].cumsum()
    steps["cum_write"] = steps["write_bytes"].cumsum()
    mem = ev[ev["op"] != "compute"].drop(columns=["flops"]).reset_index(drop=True)
    tensors = ("Q", "K", "V", "S", "P", "O") if schedule == "naive" else TRACE_TENSORS
    return {"events": mem, "steps": steps, "block_q": block_q, "block_k": block_k,
            "tensors": tensors,
            "n_blocks_q": -(-seq_len // block_q), "n_blocks_k": -(-seq_len // block_k),
            "total_bytes": int(read.sum() + write.sum()), "schedule": schedule}


def _blocks_touched(rows: pd.DataFrame, block: int) -> set[int]:
    out: set[int] = set()
    for r0, r1 in zip(rows["row_start"], rows["row_stop"]):
        if r1 > r0:
            out.update(range(int(r0) // block, (int(r1) - 1) // block + 1))
    return out


def trace_state(walk: dict, step: int) -> dict:
    """What the step view shows at ``step``: bytes so far, this step's events, and per tensor
    (Q, K, V, O) which blocks are on chip now and which have been moved before."""
    steps, events = walk["steps"], walk["events"]
    step = int(min(max(step, 0), len(steps) - 1))
    upto = steps.iloc[: step + 1]
    read, write = int(upto["cum_read"].iloc[-1]), int(upto["cum_write"].iloc[-1])
    current = steps.iloc[step]
    size = {"Q": walk["block_q"], "O": walk["block_q"], "S": walk["block_q"], "P": walk["block_q"],
            "K": walk["block_k"], "V": walk["block_k"]}
    on_chip, moved = {}, {}
    for t in walk["tensors"]:
        ev_t = events[events["tensor"] == t]
        on_chip[t] = _blocks_touched(ev_t[ev_t["step"] == step], size[t])
        moved[t] = _blocks_touched(ev_t[ev_t["step"] <= step], size[t])
    # the tile being computed holds Q and O rows of its Q block, K and V rows of its K block
    qb, kb = int(current["q_block"]), int(current["k_block"])
    if qb >= 0:
        on_chip["Q"].add(qb)
        on_chip["O"].add(qb)
    if kb >= 0:
        on_chip["K"].add(kb)
        on_chip["V"].add(kb)
    tiles = upto[(upto["q_block"] >= 0) & (upto["k_block"] >= 0)]
    return {"read_bytes": read, "write_bytes": write,
            "fraction": (read + write) / max(1, walk["total_bytes"]),
            "events": events[events["step"] == step].reset_index(drop=True),
            "on_chip": on_chip, "moved": moved, "phase": str(current["phase"]),
            "tiles_done": list(zip(tiles["q_block"].astype(int), tiles["k_block"].astype(int))),
            "tile": (qb, kb)}
