"""Predicted versus measured: joins results records with `sim.predict` and reports the error.

``python -m sim.compare [RESULTS.json ...] [--fit-on OTHER.json ...] [--rates RATES.json ...]
[--csv OUT]`` (default: the shipped ``results/*.json``) predicts
every record with the workload, schedule and block sizes it was measured with, on the profile of
the GPU it was measured on (``provenance.gpu``; ``--profile`` overrides), and prints

* a per-metric error table over the records (median and worst relative error, the share within
  the target, the target (`METRICS`) and whether it holds), per kernel;
* per kernel family and pass (`family_pass_summary`): global (or LSU) bytes, DRAM bytes, FLOPs
  and the plans' time at the rates given (``rel_error_time``, nothing fitted), and the time
  against its targets (`time_summary`: median <= 15 %, >= 90 % of records within 25 %);
* the block-size check: for each (pass, causal, N, d, dtype) of our kernel measured at several
  block sizes, whether the block size the model ranks fastest runs within 10% of the measured
  fastest;
* where a target is missed, the worst records and by how much.

The Python API (the dashboard's *Predicted vs measured* page uses it):

* `compare(records, profile=None, ...)` -> pandas DataFrame, one row per record: the record's
  key fields, ``measured_<metric>``, ``predicted_<metric>`` and ``rel_error_<metric>`` (signed,
  (predicted - measured) / measured) for each metric of `METRICS`, plus ``model_note`` (how the
  record was modelled), ``model_source`` ("plan": a record of a kernel family with a plan,
  `sim.plans.plans_for_record`, whose global bytes, DRAM bytes, FLOPs and raw time come from
  its priced plans, `sim.plan.price`; "schedule": `sim.predict` on the record's schedule) and
  ``profile``;
* `summary(df)` -> DataFrame of the per-metric table; `block_size_check(df)` -> DataFrame;
* `METRICS`: metric -> (label, target relative error or None, share of records that must meet
  it, which records the target applies to).

Metrics (measured side from the Nsight Compute counters `benchmarks.ncu` adds, predicted side
from `sim.predict`):

* ``global_bytes`` — ``global_load_bytes + global_store_bytes`` (ncu ``l1tex__t_bytes_pipe_lsu_
  mem_global_op_ld/st``) vs ``hbm_read_bytes + hbm_write_bytes``, the schedule's global-memory
  traffic. Kernels that move data with the Hopper tensor memory accelerator (cuDNN, cuBLAS's
  ``nvjet`` GEMMs; our ``wgmma`` forward) bypass the LSU pipe, so their counter reads 0 or
  only the few loads beside TMA; a record with such a launch among its ``ncu_kernels``
  (`tma_launches`), or with no LSU bytes at all, is left out (NaN, and ``global_bytes_note``
  says why) rather than compared with the bytes of its other launches. Where the record's
  plan moves tensors by TMA (``Access.how == "tma"``), ``lsu_bytes`` compares the LSU counters
  with the plan's other accesses. Global atomics and reductions
  (float32 dQ accumulation) are neither loads nor stores to ncu: they are added on the
  measured side when the record has ``global_atomic_bytes`` and left out of the predicted side
  when it has not;
  the delta pre-pass is modelled as the record's kernel list shows it (`sim.model.
  record_delta_kernel`: one thread per row re-reads a 32-byte sector per element);
* ``dram_bytes`` — ``dram_read_bytes + dram_write_bytes`` vs the model's DRAM bytes after its L2
  model (ncu flushes the L2 before every kernel, so each kernel starts cold, as the model
  assumes);
* ``flops`` — executed FLOPs (``2 FFMA + FADD + FMUL`` and tensor-core ops) vs ``flops``
  (matmul + the rest); for our CUDA-core kernel (variant "simt") float32 instructions only:
  it does no half-precision arithmetic, so the half instructions ncu counts in it are
  conversions and constant moves (ptxas's ``HFMA2.MMA``);
* ``time_raw`` — ``time_ms`` vs the raw roofline ``predicted_ms`` (peaks, no efficiencies);
* ``time_calibrated`` — vs the roofline with efficiency factors fitted by `sim.calibrate`'s rule
  on the records of the same kernel program in the compared results (``calibration_group``:
  kernel family, pass, and whether its matmuls run on CUDA or tensor cores) — in-sample: it says
  how well one set of factors per kernel explains all of its configurations, not how well it
  extrapolates; with ``--fit-on OTHER`` (``compare(..., fit_on=...)``) the factors are fitted on
  OTHER's records of the same group instead (another GPU, another grid): out of sample;
* ``time_heldout`` — the same, with the factors for a record fitted on the kernel's records at
  the *other* sequence lengths (leave-one-N-out): how well the calibration extrapolates.

Measured values are the sums over every launch of the record's call (`benchmarks.ncu`), for
every kernel alike: the SDPA backends' records carry them as ours do, and are scored on global
and DRAM bytes in the per-kernel table (``family`` sdpa-flash, sdpa-efficient, sdpa-cudnn);
the targets' headline rows keep their scopes (global bytes and FLOPs: our kernel).

How records are modelled: a record of a kernel family with a plan (`sim.plans.plans_for_record`:
our tensor-core and CUDA-core families, SDPA FLASH and EFFICIENT, cuDNN's forward, MATH and
eager as their kernel sequences) is priced
from the plans of the kernels it launches (``model_source`` "plan"); the calibrated times, and
every other record, come from `model_for_record`: our kernel (``ioaware-numba``) as ``flash2`` with
its block sizes, matmuls on CUDA cores with the register micro-tiles the launch used
(`sim.model.record_micro_tiles`: the record's ``micro_tile``, else `sim.tiles.
choose_tiles`; they price the shared-memory level, `sim.smem`) (``variant: mma`` on tensor
cores, no micro-tile), the backward's
``dq_mode`` as the record says (`sim.model.record_dq_mode`: its ``dq_mode`` field, else the
kernel names ncu profiled — a ``flash_bwd_dq`` kernel is the separate dQ kernel of earlier
versions, else dQ atomics, today's); SDPA FLASH,
EFFICIENT, CUDNN as ``flash2`` with the model's own block sizes on tensor cores (float32:
CUDA cores); MATH and eager as the ``naive`` variants "math" and "eager"
(`sim.counts.naive_variant_kernels`: the kernel sequences ncu recorded — MATH upcasts
float16/bfloat16 inputs and runs everything in float32 on CUDA cores, with ``_safe_softmax``'s
extra passes; eager makes separate scale and ``masked_fill`` passes). What the naive model
still lacks (GEMM operand re-reads) is listed in ``docs/model.md``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from .model import SIMT_DKDV_KERNEL, SIMT_FWD_KERNEL  # today's CUDA-core kernels' names
from .model import kernel_version as _kernel_version
from .resources import RESOURCES_PATH, load_resources, lookup

__all__ = ["METRICS", "compare", "summary", "block_size_check", "model_for_record", "main",
           "format_report", "record_registers", "kernel_resources", "RESOURCES_PATH",
           "SIMT_FWD_KERNEL", "SIMT_DKDV_KERNEL", "tma_launches", "global_bytes_note",
           "family_pass_summary", "time_summary", "FAMILY_PASS_TARGETS"]

KEY_COLUMNS = ("kernel", "variant", "pass", "dtype", "batch", "heads", "heads_kv", "seq_len_q",
               "seq_len_k", "head_dim", "causal", "block_q", "block_k")

#: metric -> (label, target |relative error| or None, required share of records, scope)
#: scope "ours" = our kernel's records only, "all" = every record.
METRICS = {
    "global_bytes": ("global-memory bytes (L2<->SM) vs ncu ld+st", 0.05, 1.0, "ours"),
    "dram_bytes": ("DRAM bytes read+written vs ncu", 0.20, 0.90, "all"),
    "flops": ("executed FLOPs vs ncu instruction counts", 0.02, 1.0, "ours"),
    "time_raw": ("time, raw roofline", None, None, "all"),
    "time_calibrated": ("time, calibrated per kernel (in-sample)", 0.25, 1.0, "all"),
    "time_heldout": ("time, calibrated per kernel leaving the record's N out (held out)", 0.25, 1.0, "all"),
}
_CALIBRATED = ("time_calibrated", "time_heldout")
BLOCK_TOLERANCE = 0.10
DEFAULT_MAX_TRACE_EVENTS = 2_000_000
_RESOURCES: dict = {}


def _variant(rec: dict) -> str | None:
    """Our kernel's variant: "simt" (`kernels.forward`/`backward`) or "mma" (the tensor-core
    forward; also records of `kernels.bench_mma`, marked ``implementation:
    kernels.flash_mma_fwd``); None for other kernels."""
    if rec.get("kernel") != "ioaware-numba":
        return None
    if rec.get("variant"):
        return rec["variant"]
    return "mma" if rec.get("implementation") == "kernels.flash_mma_fwd" else "simt"


def _family(rec: dict) -> str:
    v = _variant(rec)
    return rec["kernel"] + (f"/{v}" if v and v != "simt" else "")


def profiled_impl(rec: dict) -> str | None:
    """Which kernels ncu saw for a record (from ``ncu_kernels``): for our kernel the Numba kernel
    names joined by "+" (e.g. ``flash_bwd_delta+flash_bwd_dkdv_v2+fill``), else "K kernels";
    None without counters. Tells apart records profiled on different versions of the code."""
    ks = rec.get("ncu_kernels")
    if not ks:
        return None
    if rec.get("kernel") != "ioaware-numba":
        return f"{len(ks)} kernels"
    names = []
    for k in ks:
        n = k["name"]
        module = ""
        if "::" in n and not n.startswith("void"):
            module, n = n.split("::", 1)
        n = n.split("[")[0].split("(")[0]
        if n == "kernel" and module:      # a generic function name: say which module's
            n = module
        if n.startswith("void "):
            n = "fill" if "Fill" in n or "elementwise" in n else n[5:25]
        if n not in names:
            names.append(n)
    return "+".join(names)


def kernel_resources(path=None) -> dict:
    """``{key: entry}`` of a kernel resources JSON (default `RESOURCES_PATH`, read by
    `sim.resources.load_resources`), loaded once per path; ``{}`` when the file does not exist
    (registers then stay unmodelled)."""
    path = Path(path) if path is not None else RESOURCES_PATH
    key = str(path)
    if key not in _RESOURCES:
        _RESOURCES[key] = load_resources(path) if path.exists() else {}
    return _RESOURCES[key]


def record_registers(rec: dict, table: dict | None = None, dq_mode: str | None = None) -> tuple:
    """``(registers_per_thread, registers_per_thread_kv, status)`` of a record of our kernel:
    the ``ptxas -v`` figures (`sim.resources`) of the kernels the record ran, as
    `sim.model` reads them (the forward and dQ kernel with the micro-tile of
    `sim.model.record_micro_tiles`, the dK/dV kernel with its own; which version: the kernel
    names ncu profiled, else today's kernels, `SIMT_FWD_KERNEL` and `SIMT_DKDV_KERNEL`; dQ
    atomics or not: ``dq_mode``, else `sim.model.record_dq_mode`, else atomics). status:
    "found", "missing" (a configuration not in the table: None, not modelled) or "n/a" (not our
    kernel, or not measured on compute capability 9.0, the table's)."""
    from .model import record_dq_mode, record_micro_tiles
    table = kernel_resources() if table is None else table
    if rec.get("kernel") != "ioaware-numba" or not rec.get("block_q") or not rec.get("block_k"):
        return None, None, "n/a"
    cc = str((rec.get("provenance") or {}).get("compute_capability", ""))
    if cc != "9.0":
        return None, None, "n/a"
    d, dt, causal = int(rec["head_dim"]), rec.get("dtype"), bool(rec.get("causal"))
    bq, bk = int(rec["block_q"]), int(rec["block_k"])
    if dt not in ("fp32", "fp16"):
        return None, None, "missing"
    if _variant(rec) == "mma":
        if rec.get("pass") != "fwd":
            return None, None, "missing"
        e = lookup(table, "flash_mma_fwd", d, dt, causal, block_m=bq, block_n=bk)
        return (e["registers_per_thread"], None, "found") if e else (None, None, "missing")
    tile, tile_kv = record_micro_tiles(dict(rec, variant="simt"))
    if rec.get("pass") == "fwd":
        name = _kernel_version(rec, "flash_fwd", SIMT_FWD_KERNEL)
        e = lookup(table, name, d, dt, causal, block_m=bq, block_n=bk, tile=tile)
        return (e["registers_per_thread"], None, "found") if e else (None, None, "missing")
    if rec.get("pass") != "bwd":
        return None, None, "missing"
    mode = dq_mode or record_dq_mode(rec) or "atomic"
    name = _kernel_version(rec, "flash_bwd_dkdv", SIMT_DKDV_KERNEL)
    e_kv = lookup(table, name, d, dt, causal, block_m=bk, block_n=bq, tile=tile_kv,
                  dq_atomic=mode == "atomic")
    # a separate dQ kernel: records of the earlier backward only (today's accumulates dQ by atomics)
    e_q = (lookup(table, "flash_bwd_dq", d, dt, causal, block_m=bq, block_n=bk, tile=tile)
           if mode == "kernel" else None)
    if e_kv is None or (mode == "kernel" and e_q is None):
        return None, None, "missing"
    return (e_q["registers_per_thread"] if e_q else None), e_kv["registers_per_thread"], "found"


def model_for_record(rec: dict, registers: bool = True):
    """``(Workload, Schedule, note)`` that model a results record (see the module docstring).
    ``registers``: fill our kernel's registers per thread from `kernel_resources` (False: not
    modelled, the model before registers)."""
    from .model import MMA_FRAGMENT_ROW_BYTES, record_delta_kernel, record_dq_mode, record_micro_tiles
    from .workload import EXP_FLOPS, Schedule, Workload

    w = Workload.from_record(rec)
    kernel, variant = rec["kernel"], _variant(rec)
    note = ""
    if kernel == "ioaware-numba":
        unit = {"mma": "tensor", "wgmma": "tensor", "tf32": "tf32"}.get(variant, "cuda")
        dq_mode = (record_dq_mode(rec) or "atomic") if rec["pass"] != "fwd" else "atomic"
        if variant in ("mma", "tf32") and rec["pass"] != "fwd":
            dq_mode = "kernel"    # the tensor-core backwards: a dQ kernel and a dK/dV kernel
        if variant == "tf32":
            note = "3xTF32: three TF32 products per float32 one, priced as one; "
        delta = (record_delta_kernel(rec) or "warp") if rec["pass"] != "fwd" else "warp"
        tiles = record_micro_tiles(dict(rec, variant="simt")) if variant == "simt" else (None, None)
        # the tensor-core forward takes exp as ex2.approx (the MUFU unit, no FP32 arithmetic)
        exp_flops = 0 if variant in ("mma", "wgmma", "tf32") else EXP_FLOPS
        # ... and moves Q and O in mma fragments: 4 threads x 4 bytes of a row per warp access
        regs, regs_kv, reg_status = (record_registers(rec, dq_mode=dq_mode) if registers
                                     else (None, None, "off"))
        sched = Schedule("flash2", rec.get("block_q"), rec.get("block_k"), matmul_unit=unit,
                         dq_mode=dq_mode, micro_tile=tiles[0], micro_tile_kv=tiles[1],
                         delta_kernel=delta, exp_flops=exp_flops,
                         qo_segment_bytes=MMA_FRAGMENT_ROW_BYTES if variant == "mma" else None,
                         registers_per_thread=regs, registers_per_thread_kv=regs_kv,
                         launch_head_group=rec.get("launch_head_group"))
        note += "flash2, measured blocks, " + ("CUDA cores" if unit == "cuda"
                                                else "tensor cores, exp by ex2.approx")
        if tiles[0] is not None:
            note += f", micro-tile {tiles[0][0]}x{tiles[0][1]}"
            if rec["pass"] != "fwd":
                note += f" (dK/dV {tiles[1][0]}x{tiles[1][1]})"
        if rec["pass"] != "fwd":
            note += f", dQ by {'a separate kernel' if dq_mode == 'kernel' else 'atomics'}"
            note += f", delta by one {delta} per row"
        if reg_status == "found":
            note += ", registers " + "/".join(f"{k} {v}" for k, v in
                                               (("fwd" if rec["pass"] == "fwd" else "dQ", regs),
                                                ("dK/dV", regs_kv)) if v is not None)
        elif reg_status == "missing":
            note += ", registers not found (not modelled)"
    elif kernel in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        sched = Schedule("flash2", matmul_unit="tensor")
        note = "flash2, model's default blocks"
    elif kernel == "sdpa-math":
        sched = Schedule("naive", matmul_unit="cuda", variant="math")
        note = ("naive 'math': PyTorch's MATH kernel list" +
                ("; half inputs upcast, float32 throughout" if w.dtype != "fp32" else ""))
    elif kernel == "eager":
        sched = Schedule("naive", matmul_unit="tensor", variant="eager")
        note = "naive 'eager': matmul, scale, masked_fill, softmax, matmul"
    else:
        raise ValueError(f"no model for kernel {kernel!r}")
    return w, sched, note


#: DRAM bytes a launch must move, in a direction its LSU counter shows nothing of, to count as
#: moving them by TMA (a fill kernel reads about 4 KiB and loads nothing).
TMA_MIN_DRAM_BYTES = 64 * 1024
#: A launch reading more than this many times its LSU load (and atomic) bytes from DRAM loads
#: most of its data past the LSU pipe, by TMA. Every DRAM byte read is fetched for an L2
#: client; without TMA that client is the LSU pipe (or spilled local memory), so DRAM reads stay
#: at or below the LSU loads: at most 1.01 times them in every launch of the shipped results
#: without TMA, at least 7.2 times in those with it (cuDNN's backward, our wgmma forward: a
#: few LSU loads beside TMA).
TMA_DRAM_OVER_LSU_READS = 2.0


def tma_launches(rec: dict) -> list[str]:
    """Names of the record's profiled launches (``ncu_kernels``) that moved data past the LSU
    counters, by the Hopper tensor memory accelerator: DRAM reads of at least
    `TMA_MIN_DRAM_BYTES` and either no global load bytes at all (cuDNN's SDPA forward, cuBLAS
    ``nvjet`` GEMMs, whatever their atomics) or more than `TMA_DRAM_OVER_LSU_READS` times the
    launch's global load and atomic bytes (a few:
    cuDNN's backward, our ``wgmma`` forward, whose tile-schedule loads are LSU loads), or as
    many DRAM writes with no store bytes and atomic bytes recorded as 0 (launches profiled
    before per-launch atomics were kept are judged by their loads only). A record with one has
    incomplete global bytes."""
    out = []
    for k in rec.get("ncu_kernels") or ():
        if not isinstance(k, dict):
            continue
        ld, st = k.get("global_load_bytes"), k.get("global_store_bytes")
        dr, dw = k.get("dram_read_bytes") or 0, k.get("dram_write_bytes") or 0
        tma_load = (ld is not None and dr >= TMA_MIN_DRAM_BYTES
                    and (ld == 0 or dr > TMA_DRAM_OVER_LSU_READS
                         * (ld + (k.get("global_atomic_bytes") or 0))))
        tma_store = st == 0 and k.get("global_atomic_bytes") == 0 and dw >= TMA_MIN_DRAM_BYTES
        if tma_load or tma_store:
            out.append(str(k.get("name", "")))
    return out


def _lsu_bytes(rec: dict) -> float:
    """The record's LSU global load + store (+ atomic, where counted) bytes; NaN without them."""
    ld, st = rec.get("global_load_bytes"), rec.get("global_store_bytes")
    if ld is None or st is None or ld + st == 0:
        return math.nan
    return float(ld + st + (rec.get("global_atomic_bytes") or 0))


def global_bytes_note(rec: dict) -> str | None:
    """Why a record's measured global bytes are not scored (None where they are): launches that
    moved data by TMA (`tma_launches`), or no LSU counters."""
    if rec.get("global_load_bytes") is None or rec.get("global_store_bytes") is None:
        return None
    names = tma_launches(rec)
    if names:
        short = ", ".join(sorted({n.split("(")[0].split("[")[0][:48] for n in names}))
        return f"not scored: {short} moved data by TMA, which the LSU counters do not count"
    if rec["global_load_bytes"] + rec["global_store_bytes"] == 0:
        return "not scored: no LSU global bytes counted"
    return None


def _measured(rec: dict, metric: str):
    g = rec.get
    if metric == "global_bytes":
        if tma_launches(rec):
            return math.nan
        return _lsu_bytes(rec)
    if metric == "dram_bytes":
        r, w = g("dram_read_bytes"), g("dram_write_bytes")
        return math.nan if r is None or w is None else float(r + w)
    if metric == "flops":
        f = g("flops_executed")
        if f is None or (g("ncu_tensor_inst") and not g("flops_tensor_counted", True)):
            return math.nan
        if _variant(rec) == "simt":
            # our CUDA-core kernels do no half-precision arithmetic (half inputs are converted
            # to float32 on load): half instructions ncu counts there are conversions and
            # ptxas's constant moves (HFMA2.MMA), not FLOPs — count the float32 ones only
            parts = [g(f"ncu_smsp__sass_thread_inst_executed_op_{op}_pred_on.sum")
                     for op in ("ffma", "fadd", "fmul")]
            if all(p is not None for p in parts):
                return float(2 * parts[0] + parts[1] + parts[2])
        return float(f)
    if metric in ("time_raw",) + _CALIBRATED:
        t = g("time_ms")
        return math.nan if t is None else float(t)
    raise KeyError(metric)


#: Loads our tensor-core kernels stage through shared memory with ``cp.async`` (16 bytes a
#: thread, 512 contiguous bytes a warp): (phase, tensor) of the closed form's byte counts —
#: K/V in the forward and the dQ kernel, Q/dO in the dK/dV kernel (kernels/mma_*.py,
#: kernels/tf32_*.py).
ASYNC_COPY_LOADS = {("fwd", "K"), ("fwd", "V"), ("bwd.dq", "K"), ("bwd.dq", "V"),
                    ("bwd.main", "Q"), ("bwd.main", "dO")}


def async_copy_counter_extra(rec: dict, counts_bytes: dict, profile) -> float:
    """Bytes the global-load counter adds over the bytes moved for the record's ``cp.async``
    loads: (counted sectors per 512 bytes / 16 - 1) x those loads, from the GPU profile's
    ``async_copy_counted_sectors_per_512b`` (0 where the profile lacks it or the record's kernel
    makes no such copies)."""
    sectors = getattr(profile, "async_copy_counted_sectors_per_512b", None)
    if not sectors or rec.get("kernel") != "ioaware-numba" or _variant(rec) not in ("mma", "tf32"):
        return 0.0
    moved = sum(n for key, n in counts_bytes.items()
                if isinstance(key, tuple) and len(key) == 3 and key[2] == "load"
                and (key[0], key[1]) in ASYNC_COPY_LOADS)
    return moved * (sectors / 16.0 - 1.0)


_RATED_PROFILES: dict = {}


def profile_with_rates(name: str, rates) -> "object":
    """The profile ``name`` carrying the measured rates of the one file of ``rates`` (paths)
    measured on its GPU, or the profile alone when none is (cached per name and files)."""
    from .profiles import load_profile
    files = tuple(str(r) for r in ([rates] if isinstance(rates, (str, os.PathLike)) else rates or ()))
    key = (name, files)
    if key not in _RATED_PROFILES:
        prof = load_profile(name)
        for path in files:
            try:
                prof = prof.with_rates(path)
                break
            except ValueError as e:
                if "does not match" not in str(e):
                    raise
        _RATED_PROFILES[key] = prof
    return _RATED_PROFILES[key]


def _plan_predictions(row: dict, rec: dict, profile, rates=None) -> None:
    """For a record of a family with a plan (`sim.plans.plans_for_record`): its global bytes,
    DRAM bytes, FLOPs and time come from the priced plans (`sim.plan.price`, with the measured
    ``rates`` of its GPU when given) instead of the schedule model; ``model_source`` "plan".
    The calibrated times stay the schedule model's. A record whose configuration the family's
    plan refuses (a tile today's kernels do not take) keeps the schedule model's figures and
    says why in ``plan_error``."""
    from .plan import price
    from .plans import plans_for_record
    try:
        plans = plans_for_record(rec)
        if not plans:
            return
        prof = profile_with_rates(profile, rates)
        costs = [price(plan, prof) for plan in plans]
    except ValueError as exc:   # a configuration today's kernels do not take (an older version's)
        row["plan_error"] = str(exc)
        return
    row["rates"] = "measured" if prof.measured_rates else "datasheet"
    atomic = 0.0
    if rec.get("global_atomic_bytes") is None:   # atomics not counted on the measured side
        atomic = sum(a.bytes for plan in plans for k in plan.kernels for a in k.accesses
                     if a.op == "atomic")
    row["predicted_global_bytes"] = sum(c.global_bytes for c in costs) - atomic
    tma = sorted({a.tensor for plan in plans for k in plan.kernels for a in k.accesses
                  if a.how == "tma"})
    if tma:   # copies the LSU counters do not see: score what they do see, say what is left out
        row["measured_global_bytes"] = math.nan
        row["global_bytes_note"] = (f"not scored: the plan moves {', '.join(tma)} by TMA, which "
                                    f"the LSU counters do not count; lsu_bytes scores the rest")
        row["predicted_lsu_bytes"] = (sum(a.counted_bytes(prof) for plan in plans
                                          for k in plan.kernels for a in k.accesses
                                          if a.how != "tma") - atomic)
        row["measured_lsu_bytes"] = _lsu_bytes(rec)
    row["predicted_dram_bytes"] = sum(c.dram_bytes for c in costs)
    row["predicted_flops"] = float(sum(c.flops for c in costs))
    row["predicted_time_raw"] = sum(c.time_ms for c in costs)
    row["model_source"] = "plan"
    row["model_note"] = "plan: " + " + ".join(f"{pl.family} {pl.pass_} ({len(pl.kernels)} kernels)"
                                              for pl in plans)


def _predicted_raw(p, metric: str, rec: dict | None = None):
    if metric == "global_bytes":
        total = float(p.hbm_read_bytes + p.hbm_write_bytes) + getattr(p, "async_copy_extra", 0.0)
        if rec is not None and rec.get("global_atomic_bytes") is None:
            total -= p.atomic_bytes   # atomics were not counted on the measured side
        return total
    if metric == "dram_bytes":
        return float(p.dram_read_bytes + p.dram_write_bytes)
    if metric == "flops":
        return float(p.flops)
    if metric == "time_raw":
        return float(p.predicted_ms)
    raise KeyError(metric)


def _calibrated_ms(rec, p, eff, profile) -> float:
    """The roofline of the record's predicted phases priced with efficiencies ``eff``."""
    from .model import _price
    w, sched, _ = model_for_record(rec, registers=False)   # pricing does not use registers
    return float(_price(p.phases, _profile_for(rec, profile), w, sched, eff)[0])


def _profile_for(rec: dict, profile):
    from .profiles import load_profile, profile_for_gpu_name
    if profile is not None:
        return load_profile(profile)
    gpu = (rec.get("provenance") or {}).get("gpu", "")
    prof = profile_for_gpu_name(gpu) if gpu else None
    if prof is None:
        raise ValueError(f"no shipped profile matches the GPU {gpu!r} of a record; pass profile=")
    return prof


class _Pred:
    """The parts of a `sim.Prediction` the comparison uses (plain data: crosses processes)."""

    def __init__(self, p):
        self.hbm_read_bytes, self.hbm_write_bytes = p.hbm_read_bytes, p.hbm_write_bytes
        self.dram_read_bytes, self.dram_write_bytes = p.dram_read_bytes, p.dram_write_bytes
        self.flops, self.predicted_ms = p.flops, p.predicted_ms
        self.times_ms, self.phases, self.bound = dict(p.times_ms), p.phases, p.bound
        self.block_q, self.block_k, self.l2_model = p.block_q, p.block_k, p.l2.model
        self.profile_name = p.profile.name
        peak = p.profile.matmul_flops_per_s(p.workload.dtype, p.schedule.matmul_unit)
        self.matmul_path = "cuda" if peak == p.profile.fp32_flops_per_s else "tensor"
        self.atomic_bytes = sum(n for key, n in p.counts.get("bytes", {}).items()
                                if isinstance(key, tuple) and key[-1] == "atomic")


def _predict_one(args):
    rec, profile, l2, max_trace_events, registers = args
    from .model import predict
    try:
        prof = _profile_for(rec, profile)
        w, sched, note = model_for_record(rec, registers=registers)
        p = predict(w, sched, prof, l2=l2, calibration=None, max_trace_events=max_trace_events)
        pred = _Pred(p)
        pred.async_copy_extra = async_copy_counter_extra(rec, p.counts.get("bytes", {}), prof)
        pred.registers = (sched.registers_per_thread, sched.registers_per_thread_kv)
        return pred, note, None
    except (ValueError, KeyError, TypeError) as exc:
        return None, None, f"{type(exc).__name__}: {exc}"


def _predict_all(records, profile, l2, max_trace_events, workers, progress, registers=True):
    if registers:
        kernel_resources()     # load once, before the workers fork
    jobs = [(rec, profile, l2, max_trace_events, registers) for rec in records]
    n = len(jobs)
    if workers is None:
        workers = min(os.cpu_count() or 1, 8) if n >= 32 else 1
    out = []
    if workers > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        try:
            ctx = mp.get_context("fork")
        except ValueError:
            ctx = None
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
            for i, res in enumerate(ex.map(_predict_one, jobs, chunksize=1)):
                out.append(res)
                if progress is not None:
                    progress(i + 1, n)
        return out
    for i, job in enumerate(jobs):
        out.append(_predict_one(job))
        if progress is not None:
            progress(i + 1, n)
    return out


def compare(records: list[dict], profile=None, *, l2: str = "auto",
            max_trace_events: int = DEFAULT_MAX_TRACE_EVENTS, calibrate_time: bool = True,
            progress=None, workers: int | None = None, registers: bool = True,
            fit_on: list[dict] | None = None, rates=None):
    """Join measured records with the model's predictions; returns a pandas DataFrame (one row per
    record; columns in the module docstring). ``profile``: a profile name/path/object for every
    record, or None to match each record's ``provenance.gpu``. Records the model cannot predict
    get a ``model_error`` and NaN predictions. ``workers``: processes predicting in parallel
    (default: the CPU count for 32 records or more, else 1). ``registers``: model our kernels'
    registers per thread from `kernel_resources` (column ``registers_status``: found, missing,
    n/a, off; ``registers_per_thread`` / ``registers_per_thread_kv``). ``fit_on``: other records
    (another results file) on which the efficiency factors of ``time_calibrated`` are fitted,
    per calibration group, instead of on ``records`` themselves: an out-of-sample calibrated
    time (NaN for a record whose group ``fit_on`` has no record of); ``df.attrs["calibrated_on"]``
    says which ("the compared records" or "other records"). ``rates``: files of ``python -m
    benchmarks rates`` (a path or a list): a record priced from its plan uses the measured rates
    of the file measured on its profile's GPU (datasheet rates where none is); the column
    ``rates`` says "measured" or "datasheet". ``rel_error_time`` is the plan's time from those
    rates (nothing fitted on ``records``), where a plan prices the record; else the raw time."""
    import pandas as pd

    results = _predict_all(records, profile, l2, max_trace_events, workers, progress, registers)
    rows, preds, recs_by_family = [], [], {}
    for i, (rec, (p, note, err)) in enumerate(zip(records, results)):
        row = {k: rec.get(k) for k in KEY_COLUMNS}
        row["variant"] = _variant(rec)
        row["family"] = _family(rec)
        row["impl"] = profiled_impl(rec)
        row["kernels_sha"] = rec.get("kernels_sha")
        row["ncu_kernels_sha"] = rec.get("ncu_kernels_sha")
        row["gpu"] = (rec.get("provenance") or {}).get("gpu")
        if p is not None:
            row.update(profile=p.profile_name, model_note=note, model_error=None,
                       model_block_q=p.block_q, model_block_k=p.block_k, l2_model=p.l2_model,
                       bound=p.bound, registers_per_thread=p.registers[0],
                       registers_per_thread_kv=p.registers[1])
        else:
            row.update(profile=None, model_note=None, model_error=err)
        row["registers_status"] = ((record_registers(rec)[2] if registers else "off")
                                   if rec.get("kernel") == "ioaware-numba" else "n/a")
        for m in METRICS:
            row[f"measured_{m}"] = _measured(rec, m)
            row[f"predicted_{m}"] = _predicted_raw(p, m, rec) if (p is not None and m not in _CALIBRATED) else math.nan
        row["model_source"] = "schedule" if p is not None else None
        row["global_bytes_note"] = global_bytes_note(rec)
        if p is not None:
            _plan_predictions(row, rec, p.profile_name, rates)
        row["measured_time"] = row["measured_time_raw"]
        row["predicted_time"] = row["predicted_time_raw"]
        row["measured_time_ms_p10"] = rec.get("time_ms_p10")
        row["measured_time_ms_p90"] = rec.get("time_ms_p90")
        rows.append(row)
        preds.append(p)
        if p is not None:
            # one calibration per kernel program: family, pass (forward and backward are
            # different kernels) and the matmul path (CUDA cores or tensor cores: e.g. SDPA
            # EFFICIENT instantiates another kernel for half inputs)
            row["calibration_group"] = f"{row['family']} {rec.get('pass')} {p.matmul_path}"
            recs_by_family.setdefault((row["calibration_group"], row["profile"]), []).append(i)
    # -- calibrated time: one set of efficiency factors per (kernel family, profile) --
    if calibrate_time:
        for (fam, prof_name), idx in recs_by_family.items():
            sub = [records[i] for i in idx]
            eff = _fit(sub, prof_name, [preds[i] for i in idx])
            for i in idx:
                rows[i]["predicted_time_calibrated"] = (_calibrated_ms(records[i], preds[i], eff, profile)
                                                        if eff else math.nan)
                rows[i]["efficiency"] = eff.to_dict() if eff else None
            # held out: factors fitted on the family's records at the other sequence lengths
            by_n: dict = {}
            for i in idx:
                by_n.setdefault(records[i].get("seq_len_q"), []).append(i)
            for n, members in by_n.items():
                rest = [i for i in idx if records[i].get("seq_len_q") != n]
                eff_o = _fit([records[i] for i in rest], prof_name, [preds[i] for i in rest]) if rest else None
                for i in members:
                    rows[i]["predicted_time_heldout"] = (_calibrated_ms(records[i], preds[i], eff_o, profile)
                                                         if eff_o else math.nan)
    if calibrate_time and fit_on is not None:
        _calibrate_on_other(rows, records, preds, fit_on, profile, l2, max_trace_events, workers,
                            registers)
    df = pd.DataFrame(rows)
    df.attrs["calibrated_on"] = "other records" if fit_on is not None else "the compared records"
    for m in (*METRICS, "time", "lsu_bytes"):
        if f"measured_{m}" not in df:
            continue
        meas, pred = df[f"measured_{m}"].astype(float), df[f"predicted_{m}"].astype(float)
        df[f"rel_error_{m}"] = (pred - meas) / meas
    return df


def _calibrate_on_other(rows, records, preds, fit_on, profile, l2, max_trace_events, workers,
                        registers):
    """``predicted_time_calibrated`` of each row from efficiency factors fitted on ``fit_on``'s
    records of the row's calibration group (family, pass, matmul path; any GPU: the factors are
    fractions of each profile's peaks)."""
    fit_preds = _predict_all(fit_on, profile, l2, max_trace_events, workers, None, registers)
    groups: dict = {}
    for rec, (p, _, _) in zip(fit_on, fit_preds):
        if p is not None and rec.get("time_ms"):
            groups.setdefault(f"{_family(rec)} {rec.get('pass')} {p.matmul_path}", []).append(
                (rec, p))
    effs = {g: _fit([r for r, _ in members], "other records", [p for _, p in members])
            for g, members in groups.items()}
    for i, row in enumerate(rows):
        eff = effs.get(row.get("calibration_group")) if preds[i] is not None else None
        row["predicted_time_calibrated"] = (_calibrated_ms(records[i], preds[i], eff, profile)
                                            if eff else math.nan)
        row["efficiency"] = eff.to_dict() if eff else None


def _fit(records, profile, predictions):
    """Efficiency factors fitted on ``records`` with `sim.calibrate`'s rule (each record's bound
    level gets the sample raw_time / measured_time; median per level), using the predictions
    already made (same schedule mapping as the comparison) rather than re-predicting."""
    from .model import fit_efficiency
    return fit_efficiency(((p, rec.get("time_ms")) for rec, p in zip(records, predictions)),
                          f"records of one kernel, {profile}")


def _scope_mask(df, scope):
    if scope == "ours":
        return df["kernel"] == "ioaware-numba"
    return df["kernel"].notna()


#: The targets of the per family and pass table (`family_pass_summary`): metric -> |relative
#: error| a record must be within. ``time`` is the plans' time at the given rates
#: (``rel_error_time``: nothing fitted), whose targets are also a median (`TIME_MEDIAN_TARGET`)
#: and a share (`TIME_SHARE_TARGET`).
FAMILY_PASS_TARGETS = {"global_bytes": 0.05, "lsu_bytes": 0.05, "dram_bytes": 0.20,
                       "flops": 0.02, "time": 0.25}
TIME_MEDIAN_TARGET = 0.15
TIME_SHARE_TARGET = 0.90


def family_pass_summary(df):
    """One row per (family, pass): records, how many a plan prices (``plan``), and per metric of
    `FAMILY_PASS_TARGETS` the records scored (``<m>_n``), the median and worst |relative error|
    (``<m>_med``, ``<m>_max``, percent), the median signed error (``time_signed``) and the share
    within the metric's target (``<m>_in``, percent). A metric no record of the group has is NaN."""
    import pandas as pd
    rows = []
    for (fam, pass_), g in df.groupby(["family", "pass"], sort=True):
        row = {"family": fam, "pass": pass_, "n": int(len(g)),
               "plan": int((g["model_source"] == "plan").sum()) if "model_source" in g else 0}
        for m, target in FAMILY_PASS_TARGETS.items():
            col = f"rel_error_{m}"
            err = g[col].astype(float).dropna() if col in g else pd.Series(dtype=float)
            a = err.abs()
            row[f"{m}_n"] = int(len(a))
            row[f"{m}_med"] = 100 * float(a.median()) if len(a) else math.nan
            row[f"{m}_max"] = 100 * float(a.max()) if len(a) else math.nan
            row[f"{m}_in"] = 100 * float((a <= target).mean()) if len(a) else math.nan
            if m == "time":
                row["time_signed"] = 100 * float(err.median()) if len(a) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def time_summary(df) -> dict:
    """The plans' time at the given rates against its targets, over the records a plan prices:
    ``{"n", "rates", "median_abs_err_pct", "within_25_pct", "median_met", "share_met"}``."""
    plan = df[df.get("model_source") == "plan"] if "model_source" in df else df.iloc[0:0]
    err = plan["rel_error_time"].astype(float).dropna().abs() if "rel_error_time" in plan else []
    if len(err) == 0:
        return {"n": 0}
    rates = ", ".join(sorted(map(str, plan["rates"].dropna().unique()))) if "rates" in plan else ""
    med, within = float(err.median()), float((err <= FAMILY_PASS_TARGETS["time"]).mean())
    return {"n": int(len(err)), "rates": rates, "median_abs_err_pct": 100 * med,
            "within_25_pct": 100 * within, "median_met": med <= TIME_MEDIAN_TARGET,
            "share_met": within >= TIME_SHARE_TARGET}


def summary(df, by_kernel: bool = False, by: str | None = None):
    """Per-metric error table: n, median and worst |relative error|, share within the target, the
    target and whether it holds. ``by_kernel``: one row per (metric, kernel family); ``by``: one
    row per (metric, value of that column) within the metric's scope (e.g. ``"impl"``)."""
    import pandas as pd
    out = []
    for m, (label, target, share, scope) in METRICS.items():
        col = f"rel_error_{m}"
        if col not in df:
            continue
        groups = [("all" if scope == "all" else "ioaware-numba (all variants)", df[_scope_mask(df, scope)])]
        if by_kernel:
            groups = [(fam, g) for fam, g in df.groupby("family", sort=True)]
        elif by is not None:
            sub = df[_scope_mask(df, scope)]
            keys = [by, "pass"] if by == "impl" else [by]
            groups = [(" ".join(str(x) for x in (v if isinstance(v, tuple) else (v,))), g)
                      for v, g in sub.groupby(keys, sort=True)]
        for name, g in groups:
            err = g[col].astype(float).dropna()
            if err.empty:
                continue
            a = err.abs()
            row = {"metric": m, "what": label, "records": name, "n": int(len(a)),
                   "median_abs_err_pct": 100 * float(a.median()),
                   "max_abs_err_pct": 100 * float(a.max()),
                   "mean_signed_err_pct": 100 * float(err.mean()),
                   "target_pct": None if target is None else 100 * target,
                   "within_target_pct": None if target is None else 100 * float((a <= target).mean()),
                   "required_pct": None if share is None else 100 * share}
            if target is not None:
                row["met"] = bool((a <= target).mean() >= share - 1e-12)
            else:
                row["met"] = None
            out.append(row)
    return pd.DataFrame(out)


def block_size_check(df, time_col: str = "predicted_time_raw"):
    """For our kernel's (pass, causal, N, d, dtype) groups measured at >= 2 block sizes: the
    measured best block size, the model's pick (lowest predicted time among the measured block
    sizes, by ``time_col``) and whether the pick runs within `BLOCK_TOLERANCE` of the best;
    ``model_margin_pct``: how much slower the model predicts its second choice than its pick
    (a small margin is a near-tie in the model)."""
    import pandas as pd
    ours = df[(df["kernel"] == "ioaware-numba") & (df["variant"].fillna("simt") == "simt")]
    ours = ours[ours[time_col].notna()]
    rows = []
    keys = (["gpu"] if "gpu" in ours else []) + ["pass", "causal", "seq_len_q", "head_dim", "dtype"]
    for key, g in ours.groupby(keys, sort=True):
        if g[["block_q", "block_k"]].drop_duplicates().shape[0] < 2:
            continue
        best = g.loc[g["measured_time_raw"].idxmin()]
        pick = g.loc[g[time_col].idxmin()]
        slow = float(pick["measured_time_raw"] / best["measured_time_raw"] - 1.0)
        ranked = g[time_col].astype(float).sort_values().to_numpy()
        margin = float(ranked[1] / ranked[0] - 1.0) if len(ranked) > 1 else math.nan
        rows.append(dict(zip(keys, key), n_blocks=len(g),
                         best_measured=f"{int(best['block_q'])}x{int(best['block_k'])}",
                         best_ms=float(best["measured_time_raw"]),
                         model_pick=f"{int(pick['block_q'])}x{int(pick['block_k'])}",
                         pick_ms=float(pick["measured_time_raw"]), pick_slower_pct=100 * slow,
                         model_margin_pct=100 * margin, ok=bool(slow <= BLOCK_TOLERANCE)))
    return pd.DataFrame(rows)


def worst(df, metric: str, n: int = 5, scope: str | None = None):
    """The ``n`` records with the largest |error| of ``metric`` (within its target's scope)."""
    sc = scope or METRICS[metric][3]
    g = df[_scope_mask(df, sc)].copy()
    g["abs_err"] = g[f"rel_error_{metric}"].abs()
    g = g.dropna(subset=["abs_err"]).sort_values("abs_err", ascending=False).head(n)
    cols = ["family", "pass", "dtype", "seq_len_q", "head_dim", "causal", "block_q", "block_k",
            f"measured_{metric}", f"predicted_{metric}", f"rel_error_{metric}"]
    return g[cols]


def _fmt_table(df, floatfmt="{:.1f}") -> str:
    if df is None or len(df) == 0:
        return "(none)"
    d = df.copy()
    for c in d.columns:
        if d[c].dtype.kind == "f":
            d[c] = d[c].map(lambda x: "" if x is None or (isinstance(x, float) and math.isnan(x))
                            else (floatfmt.format(x) if abs(x) < 1e6 else f"{x:.4g}"))
    return d.to_string(index=False)


def format_report(df, *, by_kernel: bool = True, n_worst: int = 5) -> str:
    """The text the command prints."""
    lines = []
    n_err = int(df["model_error"].notna().sum()) if "model_error" in df else 0
    lines.append(f"{len(df)} measured records ({n_err} the model could not predict), "
                 f"profiles: {', '.join(sorted(map(str, df['profile'].dropna().unique())))}")
    lines.append("")
    lines.append("== Error per metric against the targets (relative error = (predicted - measured) / measured) ==")
    s = summary(df)
    lines.append(_fmt_table(s.drop(columns=["what"])))
    on = df.attrs.get("calibrated_on", "the compared records")
    lines.append(f"(time_calibrated: efficiency factors fitted on {on}, "
                 f"{'in sample' if on == 'the compared records' else 'out of sample'})")
    if by_kernel:
        lines.append("")
        lines.append("== Per kernel ==")
        sk = summary(df, by_kernel=True)
        lines.append(_fmt_table(sk[["metric", "records", "n", "median_abs_err_pct", "max_abs_err_pct",
                                    "mean_signed_err_pct"]]))
    # (the profiled implementation of our kernel only: SDPA records with counters have one too)
    if "impl" in df and df.loc[df["kernel"] == "ioaware-numba", "impl"].notna().any():
        lines.append("")
        lines.append("== Our kernel by the implementation ncu profiled (kernel names in the record) ==")
        si = summary(df[df["kernel"] == "ioaware-numba"], by="impl")
        si = si[si["metric"].isin(["global_bytes", "dram_bytes", "flops"])]
        lines.append(_fmt_table(si[["metric", "records", "n", "median_abs_err_pct", "max_abs_err_pct",
                                    "mean_signed_err_pct"]]))
    if "l2_model" in df and df["measured_dram_bytes"].notna().any():
        lines.append("")
        lines.append("== DRAM bytes by the L2 model used (trace-driven LRU vs analytic estimate) ==")
        sl = summary(df, by="l2_model")
        sl = sl[sl["metric"] == "dram_bytes"]
        lines.append(_fmt_table(sl[["records", "n", "median_abs_err_pct", "max_abs_err_pct",
                                    "mean_signed_err_pct", "within_target_pct"]]))
    fp = family_pass_summary(df)
    if not fp.empty:
        lines.append("")
        lines.append("== Per family and pass: |relative error| median / worst, % of records within "
                     "(global and LSU bytes 5 %, DRAM 20 %, FLOPs 2 %, time 25 %; time: the plans' "
                     "at the rates of column `rates`, nothing fitted) ==")
        cols = ["family", "pass", "n", "plan"]
        for m in FAMILY_PASS_TARGETS:
            if fp[f"{m}_n"].sum() == 0:
                continue
            cols += [f"{m}_n", f"{m}_med", f"{m}_max", f"{m}_in"] + (["time_signed"] if m == "time" else [])
        lines.append(_fmt_table(fp[cols]))
        ts = time_summary(df)
        if ts["n"]:
            lines.append(f"time of the {ts['n']} plan-priced records ({ts['rates']} rates): median "
                         f"|error| {ts['median_abs_err_pct']:.1f} % (target <= "
                         f"{100 * TIME_MEDIAN_TARGET:.0f} %: {'met' if ts['median_met'] else 'missed'}), "
                         f"{ts['within_25_pct']:.1f} % within 25 % (target >= "
                         f"{100 * TIME_SHARE_TARGET:.0f} %: {'met' if ts['share_met'] else 'missed'})")
    if "global_bytes_note" in df and df["global_bytes_note"].notna().any():
        lines.append("")
        lines.append("== Global bytes not scored (column global_bytes_note) ==")
        notes = df[df["global_bytes_note"].notna()]
        for (fam, pass_, note), g in notes.groupby(["family", "pass", "global_bytes_note"], sort=True):
            lines.append(f"{fam} {pass_}: {len(g)} records, {note}")
    if "registers_status" in df:
        st = df.loc[df["kernel"] == "ioaware-numba", "registers_status"].value_counts()
        lines.append("")
        lines.append(f"== Registers per thread of our kernels (ptxas, {RESOURCES_PATH.name}): "
                     f"{int(st.get('found', 0))} records found, {int(st.get('missing', 0))} not "
                     f"found (not modelled), {int(st.get('n/a', 0))} not applicable, "
                     f"{int(st.get('off', 0))} switched off ==")
    lines.append("")
    for col, label in (("predicted_time_raw", "raw"), ("predicted_time_calibrated", "calibrated")):
        if col not in df:
            continue
        bc = block_size_check(df, col)
        if bc.empty:
            continue
        lines.append(f"== Block size: model's pick ({label} time) within {int(BLOCK_TOLERANCE * 100)}% "
                     f"of the measured best: {int(bc['ok'].sum())}/{len(bc)} groups ==")
        lines.append(_fmt_table(bc))
        lines.append("")
    for m, (label, target, share, scope) in METRICS.items():
        if target is None:
            continue
        sub = s[s["metric"] == m]
        if not sub.empty and not bool(sub["met"].iloc[0]):
            lines.append(f"-- target missed: {m} ({label}), worst records --")
            lines.append(_fmt_table(worst(df, m, n_worst), "{:.4g}"))
            lines.append("")
    if n_err:
        lines.append("-- records the model could not predict --")
        lines.append(_fmt_table(df[df["model_error"].notna()][["family", "pass", "dtype", "seq_len_q",
                                                               "head_dim", "block_q", "block_k",
                                                               "model_error"]]))
    return "\n".join(lines)


def load_records(paths) -> list[dict]:
    """Records of the given results files; with none given, of every shipped ``results/*.json``
    that is a valid results file (other JSON there, e.g. benchmark tables, is skipped with a
    note on stderr). A given file that is not valid raises `sim.results.ResultsFormatError`."""
    from .results import ResultsFormatError, load_results, shipped_results
    explicit = bool(paths)
    paths = [Path(p) for p in paths] if paths else shipped_results()
    recs = []
    for p in paths:
        try:
            recs.extend(load_results(p))
        except ResultsFormatError as exc:
            if explicit:
                raise
            print(f"(skipping {p.name}: not a results file: {str(exc)[:120]})", file=sys.stderr)
    if not recs:
        raise SystemExit("no results records: give results files, or ship some in results/")
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.compare",
                                 description="Predicted versus measured: per-metric error of sim "
                                             "against results files (default: the shipped ones).")
    ap.add_argument("results", nargs="*", help="results files (default: results/*.json)")
    ap.add_argument("--profile", help="predict every record on this profile (default: each "
                                      "record's GPU)")
    ap.add_argument("--l2", default="auto", choices=["auto", "trace", "analytic", "none"])
    ap.add_argument("--max-trace-events", type=int, default=DEFAULT_MAX_TRACE_EVENTS,
                    help="above this, the L2 model uses its analytic estimate")
    ap.add_argument("--kernels", help="comma list of kernels to compare")
    ap.add_argument("--csv", help="also write the joined table here")
    ap.add_argument("--rates", nargs="+", metavar="RATES",
                    help="files of `python -m benchmarks rates`: records priced from their plans "
                         "use the measured rates of their GPU (default: datasheet rates)")
    ap.add_argument("--fit-on", nargs="+", metavar="OTHER",
                    help="fit the calibrated time's efficiency factors on these results files "
                         "(out of sample) instead of on the compared records")
    ap.add_argument("--dq-mode", choices=["atomic", "kernel"],
                    help="model our kernel's backward records with this dQ mode instead of the one "
                         "each record names (its dq_mode field or ncu kernel list) — for files whose "
                         "timings and counters come from different kernel versions")
    ap.add_argument("--no-registers", action="store_true",
                    help="do not model our kernels' registers per thread (the occupancy of "
                         "threads and shared memory only)")
    args = ap.parse_args(argv)
    recs = load_records(args.results)
    if args.kernels:
        keep = set(args.kernels.split(","))
        recs = [r for r in recs if r["kernel"] in keep]
    if args.dq_mode:
        recs = [dict(r, dq_mode=args.dq_mode) if (r["kernel"] == "ioaware-numba" and r["pass"] != "fwd")
                else r for r in recs]

    def prog(done, total):
        if sys.stderr.isatty() or done == total:
            print(f"\rpredicting {done}/{total}", end="\n" if done == total else "",
                  file=sys.stderr, flush=True)
    fit_on = None
    if args.fit_on:
        fit_on = load_records(args.fit_on)
        if args.kernels:
            fit_on = [r for r in fit_on if r["kernel"] in keep]
    df = compare(recs, args.profile, l2=args.l2, max_trace_events=args.max_trace_events, progress=prog,
                 registers=not args.no_registers, fit_on=fit_on, rates=args.rates)
    print(format_report(df))
    if args.csv:
        df.drop(columns=["efficiency"], errors="ignore").to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
