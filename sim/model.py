"""Prediction: counts + L2 model + roofline time for one (workload, schedule, profile).

:func:`predict` is small and pure given its inputs: it resolves block sizes, takes the exact
closed-form counts (:mod:`sim.counts`), runs the L2 model (:mod:`sim.l2`), counts intra-SM
shared-memory traffic of the two warp splits, and prices each phase with a roofline:

    t_phase = max(dram_bytes / (hbm_bandwidth * e_dram),
                  global_bytes / (l2_bandwidth * e_l2),
                  smem_bytes / (smem_bandwidth * e_smem),
                  matmul_flops / (matmul_peak * e_matmul),
                  other_flops / (fp32_peak * e_other)) / sm_utilisation + launch_us

``smem_bytes`` is the shared-memory traffic of our CUDA-core kernels, counted from the register
micro-tile of the schedule (:mod:`sim.smem`; 0 for schedules without one) and priced at the
profile's ``smem_bandwidth_bytes_per_s``.

``sm_utilisation = programs / (waves * slots)`` (wave quantisation of the phase's programs over
``num_sms * blocks_per_sm`` slots; ``blocks_per_sm`` from :func:`sim.workload.occupancy`: threads,
shared memory and, where the schedule carries ``registers_per_thread`` /
``registers_per_thread_kv``, the register file). Occupancy enters the time only there and in the
L2 model's resident programs: the roofline has no latency term, so fewer resident warps cost
nothing unless they add a wave. The *raw* time uses all efficiencies 1 and no launch
overhead; the *calibrated* time, only when the caller gives ``calibration``, uses
:class:`Efficiency` factors: given, or fitted by :func:`calibrate`'s rule on the measured records
the caller passes (results files or records), those of the prediction's GPU and kernel program
(:func:`program_key`: schedule, pass, CUDA or tensor cores). Nothing is read implicitly: the
same arguments give the same prediction whatever files lie in ``results/``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .counts import closed_form, summarise, workload_tile_stats
from .l2 import DEFAULT_GRANULARITY, L2Result, l2_analytic, simulate_l2
from .profiles import GPUProfile, load_profile
from .smem import SMEM_PHASES, kernel_launch_shape, smem_bytes_by_phase
from .tiles import choose_tiles
from .trace import trace as make_trace
from .workload import (EXP_FLOPS, STAT_BYTES, Schedule, Workload, occupancy, resolve_blocks,
                       sram_bytes_per_block)

__all__ = ["Efficiency", "Prediction", "predict", "calibrate", "smem_traffic", "phase_programs",
           "MAX_TRACE_EVENTS", "schedule_for_record", "record_dq_mode", "record_delta_kernel",
           "record_micro_tiles", "fit_efficiency", "program_key", "kernel_version",
           "SIMT_FWD_KERNEL", "SIMT_DKDV_KERNEL"]

#: Bytes of a Q or O row one warp instruction of our tensor-core forward touches: an
#: m16n8k16 fragment gives each row 4 threads x 4 bytes (kernels/mma_fwd.py: Q by
#: ``ld_global_u32`` at column ``2 * tig``, O by ``st_global_u32`` likewise).
MMA_FRAGMENT_ROW_BYTES = 16
MAX_TRACE_EVENTS = 2_000_000  # events + granule visits above which l2="auto" uses the analytic estimate


@dataclass(frozen=True)
class Efficiency:
    """Named efficiency factors of the roofline (fractions of peak) and a per-kernel launch cost.

    Raw = all 1, launch 0. ``n_records``/``source``: what a calibration was fitted from.
    """

    dram: float = 1.0
    l2: float = 1.0
    smem: float = 1.0
    matmul: float = 1.0
    other: float = 1.0
    launch_us: float = 0.0
    n_records: int = 0
    source: str = "raw"

    def to_dict(self) -> dict:
        return asdict(self)


RAW = Efficiency()


def smem_traffic(stats_groups, head_dim: int, dtype_bytes: int, num_warps: int) -> dict:
    """Shared-memory bytes of the forward's tiles under the two warp splits (summed over slices).

    Per visited tile (r rows, c columns), w warps, e bytes/element:
    * staging (both): Q, K, V tiles written to shared memory: ``(r + 2c) d e``;
    * FlashAttention-1 split (K/V across warps, "split-K"): each warp reads all of Q and its
      slice of K and V: ``w r d e + 2 c d e``; partial outputs exchanged through shared memory:
      ``2 w r d 4`` (fp32 write + read) plus row max and sum: ``2 * 2 w r 4``;
    * FlashAttention-2 split (Q across warps): each warp reads its Q slice and all of K and V:
      ``r d e + 2 w c d e``; no exchange.
    """
    d, e, w, f = head_dim, dtype_bytes, num_warps, STAT_BYTES
    fa1 = fa2 = 0
    for mult, st in stats_groups:
        staging = (st.R + 2 * st.C) * d * e
        fa1 += mult * (staging + w * st.R * d * e + 2 * st.C * d * e + 2 * w * st.R * d * f + 4 * w * st.R * f)
        fa2 += mult * (staging + st.R * d * e + 2 * w * st.C * d * e)
    return {"smem_bytes_fa1_split": int(fa1), "smem_bytes_fa2_split": int(fa2)}


def phase_programs(w: Workload, name: str, block_q, block_k) -> dict:
    """Programs (thread blocks) launched per phase, and programs per (b, h) slice."""
    from ioaware.block_info import cdiv
    BH = w.batch * w.heads
    out = {}
    if name == "naive":
        return {"*": (BH, 1)}
    nq, nk = cdiv(w.seq_len_q, block_q), cdiv(w.seq_len_k, block_k)
    if name == "flash2":
        out["fwd"] = (BH * nq, nq)
        out["bwd.pre"] = (BH * nq, nq)
        out["bwd.main"] = (BH * nk, nk)
        out["bwd.dq"] = (BH * nq, nq)
        out["bwd.post"] = (BH * nq, nq)
    else:
        out["fwd"] = (BH, 1)
        out["bwd.main"] = (BH, 1)
    out["bwd.reduce"] = (w.batch * w.heads_kv, 1)
    return out


def _tensor_bytes(w: Workload, schedule: Schedule | None = None) -> dict:
    if schedule is not None and schedule.name == "naive" and schedule.variant is not None:
        from .counts import naive_kind_elems, naive_variant_kernels
        out: dict = {}
        for p in w.passes:
            for _ph, loads, stores, _mm, _ot, shared in naive_variant_kernels(
                    schedule.variant, p, w.seq_len_q, w.seq_len_k, w.head_dim, w.dtype_bytes,
                    causal=w.causal):
                for t, kind, width in loads + stores:
                    mult = 1 if (shared or t in ("mask", "mask_f")) else w.batch * w.heads
                    n = mult * naive_kind_elems(kind, w.seq_len_q, w.seq_len_k, w.head_dim) * width
                    out[t] = max(out.get(t, 0), n)
        return out
    e, f = w.dtype_bytes, STAT_BYTES
    B, H, Hk, Nq, Nk, d = w.batch, w.heads, w.heads_kv, w.seq_len_q, w.seq_len_k, w.head_dim
    tb = {t: B * H * Nq * d * e for t in ("Q", "O", "dO", "dQ")}
    tb.update({t: B * Hk * Nk * d * e for t in ("K", "V", "dK", "dV")})
    tb.update({t: B * H * Nk * d * e for t in ("dK_exp", "dV_exp")})
    tb.update({t: B * H * Nq * f for t in ("lse", "l", "m", "D")})
    tb["dQacc"] = B * H * Nq * d * f
    tb.update({t: B * H * Nq * Nk * e for t in ("S", "P", "Pd", "dP", "dS")})
    tb["drop_mask"] = B * H * Nq * Nk
    tb["mask"] = (B if w.key_lengths is not None else 1) * Nq * Nk
    return tb


@dataclass
class Prediction:
    """Everything :func:`predict` says about one (workload, schedule, profile).

    ``to_dict()`` gives the CLI's JSON object. Bytes are global-memory (``hbm_*``, the papers'
    HBM accesses) and DRAM after the L2 model (``dram_*``); times in milliseconds.
    """

    workload: Workload
    schedule: Schedule
    profile: GPUProfile
    block_q: int | None
    block_k: int | None
    flops: int
    matmul_flops: int
    other_flops: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    dram_read_bytes: int
    dram_write_bytes: int
    sram_bytes_per_block: int | None
    blocks_per_sm: int
    fits_sram: bool
    predicted_ms: float
    predicted_ms_calibrated: float | None
    bound: str
    times_ms: dict
    phases: dict
    smem: dict
    l2: L2Result
    efficiency: Efficiency | None
    counts: dict = field(repr=False, default_factory=dict)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per global-memory byte."""
        return self.flops / max(1, self.hbm_read_bytes + self.hbm_write_bytes)

    @property
    def dram_arithmetic_intensity(self) -> float:
        """FLOPs per DRAM byte (after the L2 model)."""
        return self.flops / max(1, self.dram_read_bytes + self.dram_write_bytes)

    def to_dict(self) -> dict:
        return {
            "schedule": self.schedule.name, "device": self.profile.name,
            "pass": self.workload.pass_, "dtype": self.workload.dtype,
            "batch": self.workload.batch, "heads": self.workload.heads,
            "heads_kv": self.workload.heads_kv, "seq_len_q": self.workload.seq_len_q,
            "seq_len_k": self.workload.seq_len_k, "head_dim": self.workload.head_dim,
            "causal": self.workload.causal, "dropout": self.workload.dropout,
            "window_size": list(self.workload.window_size) if self.workload.window_size else None,
            "flops": self.flops, "matmul_flops": self.matmul_flops, "other_flops": self.other_flops,
            "hbm_read_bytes": self.hbm_read_bytes, "hbm_write_bytes": self.hbm_write_bytes,
            "dram_read_bytes": self.dram_read_bytes, "dram_write_bytes": self.dram_write_bytes,
            "sram_bytes_per_block": self.sram_bytes_per_block,
            "block_q": self.block_q, "block_k": self.block_k,
            "blocks_per_sm": self.blocks_per_sm, "fits_sram": self.fits_sram,
            "predicted_ms": self.predicted_ms,
            "predicted_ms_calibrated": self.predicted_ms_calibrated,
            "bound": self.bound, "times_ms": self.times_ms,
            "arithmetic_intensity": self.arithmetic_intensity,
            "dram_arithmetic_intensity": self.dram_arithmetic_intensity,
            "l2_model": self.l2.model, "l2_granularity_bytes": self.l2.granularity,
            "l2_hit_rate": self.l2.hit_rate,
            **self.smem,
            "efficiency": self.efficiency.to_dict() if self.efficiency else None,
            "phases": self.phases,
        }


def _level_times(ph: dict, prof: GPUProfile, w: Workload, sched: Schedule, eff: Efficiency) -> dict:
    peak_mm = prof.matmul_flops_per_s(w.dtype, sched.matmul_unit)
    l2_bw = prof.l2_bandwidth_bytes_per_s
    smem_bw = prof.smem_bandwidth_bytes_per_s
    smem_b = ph.get("smem_load_bytes", 0) + ph.get("smem_store_bytes", 0)
    return {
        "dram": (ph["dram_read_bytes"] + ph["dram_write_bytes"]) / (prof.hbm_bandwidth_bytes_per_s * eff.dram) * 1e3,
        "l2": ((ph["hbm_read_bytes"] + ph["hbm_write_bytes"]) / (l2_bw * eff.l2) * 1e3) if l2_bw else 0.0,
        "smem": (smem_b / (smem_bw * eff.smem) * 1e3) if smem_bw else 0.0,
        "matmul": ph["matmul_flops"] / (peak_mm * eff.matmul) * 1e3,
        "other": ph["other_flops"] / (prof.fp32_flops_per_s * eff.other) * 1e3,
    }


def _price(phases: dict, prof, w, sched, eff: Efficiency):
    """Total ms, bound level, per-level ms (summed over phases) and per-phase detail."""
    total = 0.0
    levels = {"dram": 0.0, "l2": 0.0, "smem": 0.0, "matmul": 0.0, "other": 0.0}
    for ph in phases.values():
        lt = _level_times(ph, prof, w, sched, eff)
        util = ph.get("sm_utilisation", 1.0) or 1.0
        t = max(lt.values()) / util + eff.launch_us * 1e-3
        total += t
        for k in levels:
            levels[k] += lt[k] / util
    bound = max(levels, key=levels.get)
    return total, bound, levels


def predict(workload: Workload, schedule: Schedule | str, profile="h100", *, l2: str = "auto",
            granularity: int = DEFAULT_GRANULARITY, calibration=None,
            max_trace_events: int = MAX_TRACE_EVENTS) -> Prediction:
    """Predict counts and time of ``workload`` under ``schedule`` on ``profile``.

    l2: "auto" (replay the trace through the L2 model unless it would exceed
    ``max_trace_events``, then the analytic estimate), "trace", "analytic" or "none" (DRAM =
    global traffic).

    calibration: what the calibrated time (``predicted_ms_calibrated``, ``efficiency``) comes
    from —

    * None (default): nothing; the raw roofline only (``predicted_ms_calibrated`` is None);
    * an :class:`Efficiency`: these factors;
    * a results file (path), a list of results files, or a list of results records (dicts as
      `sim.results.load_results` returns them): factors fitted with :func:`calibrate`'s rule on
      those records that were measured on this profile's GPU (``provenance.gpu``; records
      without one count as this GPU's) and run the same kernel program (:func:`program_key`);
      None when no record qualifies.

    Raises ValueError when explicit block sizes do not fit the profile's shared memory per
    block, or for a ``calibration`` of another kind.
    """
    if isinstance(schedule, str):
        schedule = Schedule(schedule)
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(workload).__name__}")
    prof = load_profile(profile)
    w = workload
    bq, bk = resolve_blocks(w, schedule, prof)
    e = w.dtype_bytes
    if schedule.tiled:
        sram = max(int(sram_bytes_per_block(schedule.name, p, bq, bk, w.head_dim, e)) for p in w.passes)
        fits = sram <= prof.smem_bytes_per_block
        if not fits:
            raise ValueError(f"block_q={bq}, block_k={bk} need {sram} bytes of shared memory per block "
                             f"({schedule.name}, d={w.head_dim}, {w.dtype}); {prof.name} allows "
                             f"{prof.smem_bytes_per_block}")
        bps = occupancy(prof, sram, schedule.num_warps, schedule.registers_per_thread)
    else:
        sram, fits, bps = None, True, 1
    by_key, flops = closed_form(w, schedule, bq, bk)
    summ = summarise(by_key, flops)
    progs = phase_programs(w, schedule.name, bq, bk)
    slots = {ph: prof.num_sms * bps for ph in summ["phases"]}
    if schedule.tiled and not schedule.simt and schedule.registers_per_thread_kv is not None \
            and "bwd.main" in slots:
        slots["bwd.main"] = prof.num_sms * max(1, occupancy(prof, sram, schedule.num_warps,
                                                            schedule.registers_per_thread_kv))
    if schedule.simt:   # our CUDA-core kernels: occupancy from their own threads, tiles, registers
        for ph in summ["phases"]:
            tile = schedule.micro_tile_kv if ph == "bwd.main" else schedule.micro_tile
            regs = schedule.registers_per_thread_kv if ph == "bwd.main" else schedule.registers_per_thread
            if ph in SMEM_PHASES and tile is not None:
                threads, smem_b = kernel_launch_shape(ph, bq, bk, w.head_dim, tile)
                slots[ph] = prof.num_sms * max(1, occupancy(prof, smem_b, -(-threads // 32), regs))

    # -- L2 model --
    mode = l2
    if mode == "auto":
        # replay cost ~ events + granule visits (naive's whole-matrix events are millions of granules)
        est = _estimate_events(w, schedule, bq, bk) + (summ["hbm_read_bytes"] + summ["hbm_write_bytes"]) // granularity
        mode = "trace" if est <= max_trace_events else "analytic"
    if mode == "trace":
        tr = make_trace(w, schedule, prof, block_q=bq, block_k=bk)
        l2res = simulate_l2(tr, prof.l2_bytes, slots, granularity)
    elif mode == "analytic":
        pps = {ph: progs.get(ph, progs.get("*", (1, 1)))[1] for ph in summ["phases"]}
        steps = {}
        if schedule.name == "flash1":   # one program per slice, reuse from one K block to the next
            from ioaware.block_info import cdiv
            steps = {ph: cdiv(w.seq_len_k, bk) for ph in summ["phases"] if not ph.endswith("reduce")}
        # do the programs sharing a slice walk its tiles in the same order? (causal K-block
        # programs of the backward start at their first visiting Q block; with a window the
        # Q-block programs also start at their first visiting K block; block-sparse: no)
        windowed = w.window_size is not None
        lockstep = {ph: not (w.block_sparse or ((w.causal or windowed) and ph == "bwd.main")
                             or (windowed and ph in ("fwd", "bwd.dq")))
                    for ph in summ["phases"]}
        stagger = {}
        if schedule.name == "flash2" and (w.causal or windowed) and not w.block_sparse:
            tiles = sum(mult * int(st.T) for mult, st in workload_tile_stats(w, bq, bk))
            if "bwd.main" in summ["phases"]:
                # K-block program n starts block_k / block_q Q blocks after program n - 1
                stagger["bwd.main"] = (bk / bq, tiles)
            if windowed:
                # Q-block program m starts block_q / block_k K blocks after program m - 1
                for ph in ("fwd", "bwd.dq"):
                    if ph in summ["phases"]:
                        stagger[ph] = (bq / bk, tiles)
        l2res = l2_analytic(by_key, _tensor_bytes(w, schedule), pps, w.batch * w.heads, slots, prof.l2_bytes,
                            steps, lockstep, stagger)
    elif mode == "none":
        l2res = L2Result(summ["hbm_read_bytes"], summ["hbm_write_bytes"],
                         {p: {"dram_read_bytes": v["hbm_read_bytes"], "dram_write_bytes": v["hbm_write_bytes"]}
                          for p, v in summ["phases"].items()}, "none", 0, prof.l2_bytes, slots)
    else:
        raise ValueError(f"l2 must be 'auto', 'trace', 'analytic' or 'none', got {l2!r}")

    smem_ph = smem_bytes_by_phase(w, schedule, bq, bk) if schedule.simt else {}
    phases = {}
    for ph, v in summ["phases"].items():
        n_prog = progs.get(ph, progs.get("*", (1, 1)))[0]
        s = max(1, slots[ph])
        waves = math.ceil(n_prog / s)
        util = n_prog / (waves * s) if schedule.tiled else 1.0
        phases[ph] = dict(v, **l2res.phases.get(ph, {"dram_read_bytes": 0, "dram_write_bytes": 0}),
                          **smem_ph.get(ph, {"smem_load_bytes": 0, "smem_store_bytes": 0}),
                          programs=n_prog, sm_utilisation=util)
    raw_ms, bound, levels = _price(phases, prof, w, schedule, RAW)
    eff = _resolve_calibration(calibration, prof, schedule, w)
    cal_ms = _price(phases, prof, w, schedule, eff)[0] if eff is not None else None
    for ph, v in phases.items():
        v["times_ms"] = _level_times(v, prof, w, schedule, RAW)

    stats_groups = workload_tile_stats(w, bq, bk) if schedule.tiled else []
    smem = smem_traffic(stats_groups, w.head_dim, e, schedule.num_warps) if schedule.tiled and "fwd" in w.passes else {}
    if smem:
        smem["smem_bytes"] = smem["smem_bytes_fa1_split" if schedule.name == "flash1" else "smem_bytes_fa2_split"]
    if smem_ph:   # the CUDA-core kernels' own shared-memory traffic (micro-tile, sim.smem)
        smem["smem_load_bytes"] = sum(v["smem_load_bytes"] for v in smem_ph.values())
        smem["smem_store_bytes"] = sum(v["smem_store_bytes"] for v in smem_ph.values())
    return Prediction(w, schedule, prof, bq, bk, summ["matmul_flops"] + summ["other_flops"],
                      summ["matmul_flops"], summ["other_flops"], summ["hbm_read_bytes"],
                      summ["hbm_write_bytes"], l2res.dram_read_bytes, l2res.dram_write_bytes, sram, bps,
                      fits, raw_ms, cal_ms, bound, levels, phases, smem, l2res, eff,
                      counts={"bytes": by_key, "flops": flops})


def _estimate_events(w: Workload, schedule: Schedule, bq, bk) -> int:
    if not schedule.tiled:
        return 12 * w.batch * w.heads * len(w.passes) * 4
    from ioaware.block_info import cdiv
    tiles = w.batch * w.heads * cdiv(w.seq_len_q, bq) * cdiv(w.seq_len_k, bk)
    if w.window_size is not None:      # the band's tiles (closed form): a window skips most
        tiles = sum(mult * int(st.T) for mult, st in workload_tile_stats(w, bq, bk))
    per_tile = {"flash2": 3, "flash1": 9}[schedule.name]
    return tiles * per_tile * (2 if w.pass_ == "fwd+bwd" else 1)


# -- calibration --------------------------------------------------------------------------------
_CAL_CACHE: dict = {}
_FILE_CACHE: dict = {}


def _resolve_calibration(calibration, prof, schedule, w):
    """The :class:`Efficiency` a prediction is calibrated with (see :func:`predict`), or None."""
    if calibration is None or isinstance(calibration, Efficiency):
        return calibration
    if isinstance(calibration, str) and calibration == "auto":
        raise ValueError("calibration='auto' is gone: calibration is never implicit. Pass the "
                         "measurements to fit on: a results file or a list of them (e.g. "
                         "sim.results.shipped_results()), a list of records, an Efficiency, or "
                         "None for the raw roofline only")
    records, source = _calibration_records(calibration)
    program = program_key(w, schedule, prof)
    key = (prof.name, program, source)
    if key not in _CAL_CACHE:
        recs = []
        for rec in records:
            if not _measured_on(rec, prof):
                continue
            try:
                if program_key(Workload.from_record(rec), schedule_for_record(rec), prof) == program:
                    recs.append(rec)
            except (ValueError, KeyError, TypeError):
                continue
        _CAL_CACHE[key] = calibrate(recs, prof) if recs else None
    return _CAL_CACHE[key]


def _calibration_records(calibration) -> tuple[list, tuple]:
    """``(records, identity)`` of a ``calibration`` argument given as a results file, a list of
    results files or a list of records; ``identity`` keys the fit's cache (each file's path,
    modification time and size; the records' content)."""
    import os

    from .results import load_results
    items = [calibration] if isinstance(calibration, (str, os.PathLike)) else calibration
    try:
        items = list(items)
    except TypeError:
        raise ValueError("calibration must be None, an Efficiency, a results file (path), a list "
                         f"of results files or a list of records, got {type(calibration).__name__}"
                         ) from None
    records, ident = [], []
    for item in items:
        if isinstance(item, dict):
            records.append(item)
            ident.append(("record", _record_digest(item)))
        elif isinstance(item, (str, os.PathLike)):
            st = os.stat(item)
            fkey = (os.path.abspath(item), st.st_mtime_ns, st.st_size)
            if fkey not in _FILE_CACHE:
                _FILE_CACHE[fkey] = load_results(item)
            records.extend(_FILE_CACHE[fkey])
            ident.append(("file",) + fkey)
        else:
            raise ValueError("calibration: each item must be a results file (path) or a record "
                             f"(dict), got {type(item).__name__}")
    return records, tuple(ident)


def _record_digest(rec: dict) -> str:
    import hashlib
    import json
    return hashlib.sha1(json.dumps(rec, sort_keys=True, default=str).encode()).hexdigest()


def _measured_on(rec: dict, prof) -> bool:
    """Whether a record was measured on the GPU ``prof`` describes (its ``provenance.gpu``
    matched as `sim.results.records_for_profile` matches it); True for a record that names no
    GPU."""
    from .profiles import profile_for_gpu_name
    gpu = (rec.get("provenance") or {}).get("gpu")
    if not gpu:
        return True
    match = profile_for_gpu_name(gpu)
    return match is not None and match.name == prof.name


def program_key(w: Workload, schedule: Schedule, profile) -> tuple:
    """What one set of efficiency factors is fitted for: the schedule (name, naive variant,
    whether it is our CUDA-core kernel with a micro-tile), the pass, and whether its matmuls run
    on CUDA cores or tensor cores on ``profile``. ``predict(calibration=<records or files>)``
    fits on the given records of that GPU with the same key only."""
    prof = load_profile(profile)
    peak = prof.matmul_flops_per_s(w.dtype, schedule.matmul_unit)
    path = "cuda" if peak == prof.fp32_flops_per_s else "tensor"
    return (schedule.name, schedule.variant, schedule.simt, w.pass_, path)


def record_dq_mode(rec: dict) -> str | None:
    """The flash2 backward's dQ mode a results record ran with: its ``dq_mode`` field, else read
    from the kernel names ncu profiled (``ncu_kernels``: a ``flash_bwd_dq`` kernel = "kernel", a
    ``flash_bwd_dkdv`` kernel without it = "atomic"); None when the record does not say."""
    from .workload import DQ_MODES
    if rec.get("dq_mode") in DQ_MODES:
        return rec["dq_mode"]
    names = [str(k.get("name", "")) for k in rec.get("ncu_kernels") or [] if isinstance(k, dict)]
    if any("flash_bwd_dq" in n for n in names):
        return "kernel"
    if any("flash_bwd_dkdv" in n for n in names):
        return "atomic"
    return None


def _ncu_names(rec: dict) -> list:
    return [str(k.get("name", "")) for k in rec.get("ncu_kernels") or [] if isinstance(k, dict)]


#: Today's CUDA-core kernels (the names Nsight Compute lists): the forward and the dK/dV kernel
#: (dQ by atomics; the delta pre-pass, one warp per row, is ``flash_bwd_delta_v2``). Records
#: profiled on earlier versions name theirs in ``ncu_kernels`` (`kernel_version`).
SIMT_FWD_KERNEL = "flash_fwd_v2"
SIMT_DKDV_KERNEL = "flash_bwd_dkdv_v2"


def kernel_version(rec: dict, stem: str, default: str) -> str:
    """The name of the profiled kernel that starts with ``stem`` (``flash_fwd_v2`` before
    ``flash_fwd``: records profiled on earlier versions name them), else ``default`` (today's
    kernel)."""
    names = [n.split("::")[-1].split("[")[0] for n in _ncu_names(rec)]
    hits = sorted({n for n in names if n == stem or n.startswith(stem + "_v")}, reverse=True)
    return hits[0] if hits else default


def record_delta_kernel(rec: dict) -> str | None:
    """The delta pre-pass a backward record's counters come from: its ``delta_kernel`` field,
    else the kernel names ncu profiled (``flash_bwd_delta_v2`` = "warp", one warp per row;
    ``flash_bwd_delta`` = "thread", one thread per row); None when the record does not say."""
    from .workload import DELTA_KERNELS
    if rec.get("delta_kernel") in DELTA_KERNELS:
        return rec["delta_kernel"]
    names = _ncu_names(rec)
    if any("flash_bwd_delta_v2" in n for n in names):
        return "warp"
    if any("flash_bwd_delta" in n for n in names):
        return "thread"
    return None


def record_micro_tiles(rec: dict) -> tuple:
    """``(micro_tile, micro_tile_kv)`` our CUDA-core kernels ran a record with, as the launch
    chooses them: the record's ``micro_tile`` (the forward's, stored by `benchmarks.measure`
    since it pins it), else :func:`sim.tiles.choose_tiles` with 128 target threads — forward
    and dQ kernel over (block_q, block_k), dK/dV kernel over (block_k, block_q).
    ``(None, None)`` for records of other kernels or without block sizes."""
    if rec.get("kernel") != "ioaware-numba" or rec.get("variant", "simt") not in (None, "simt"):
        return None, None
    bq, bk, d = rec.get("block_q"), rec.get("block_k"), rec.get("head_dim")
    if not (bq and bk and d):
        return None, None
    fwd = rec.get("micro_tile")
    if fwd is not None and rec.get("pass") == "fwd":
        tile = (int(fwd[0]), int(fwd[1]))
    else:
        c = choose_tiles(int(bq), int(bk), int(d), 128)
        tile = (c.tm, c.tn)
    ckv = choose_tiles(int(bk), int(bq), int(d), 128)
    return tile, (ckv.tm, ckv.tn)


def schedule_for_record(rec: dict) -> Schedule:
    """The sim schedule modelling a results record: ``ioaware-numba`` as flash2 on CUDA cores
    with the register micro-tiles the launch used (:func:`record_micro_tiles`; ``variant:
    "mma"``: tensor cores, no micro-tile), its backward's ``dq_mode`` from
    :func:`record_dq_mode` (default "atomic") and delta pre-pass from
    :func:`record_delta_kernel` (default "warp"); ``sdpa-math`` and ``eager`` as the naive variants "math" (float32 on
    CUDA cores) and "eager"; other kernels as flash2 with the model's blocks."""
    kernel = rec.get("kernel")
    if kernel == "sdpa-math":      # float32 throughout, GEMMs on CUDA cores (TF32 off)
        return Schedule("naive", matmul_unit="cuda", variant="math")
    if kernel == "eager":
        return Schedule("naive", matmul_unit="tensor", variant="eager")
    unit = "cuda" if kernel == "ioaware-numba" and rec.get("variant") != "mma" else "tensor"
    name = rec.get("schedule") or "flash2"
    if name not in ("naive", "flash1", "flash2"):
        name = "flash2"
    dq_mode = (record_dq_mode(rec) if kernel == "ioaware-numba" else None) or "atomic"
    tiles = (None, None)
    delta = "warp"
    if kernel == "ioaware-numba" and rec.get("variant") in (None, "simt") and name == "flash2":
        tiles = record_micro_tiles(rec)
        delta = record_delta_kernel(rec) or "warp"
    # our tensor-core forward takes exp as ex2.approx (MUFU, no FP32 arithmetic) and moves Q
    # and O in mma fragments
    mma = kernel == "ioaware-numba" and rec.get("variant") == "mma"
    return Schedule(name, rec.get("block_q"), rec.get("block_k"), matmul_unit=unit, dq_mode=dq_mode,
                    micro_tile=tiles[0], micro_tile_kv=tiles[1], delta_kernel=delta,
                    exp_flops=0 if mma else EXP_FLOPS,
                    qo_segment_bytes=MMA_FRAGMENT_ROW_BYTES if mma else None,
                    launch_head_group=(rec.get("launch_head_group") if name == "flash2"
                                       else None))


def calibrate(records, profile) -> Efficiency | None:
    """Fit the roofline's efficiency factors from measured records (see :mod:`sim.results`).

    Each record is predicted raw; its *bound* level L (largest raw level time) gets the sample
    ``t_L_raw / t_measured``. ``e_L`` = median of its samples, clipped to [0.01, 1]; levels with no
    samples get the median of all samples. Returns None when no record can be predicted.
    """
    prof = load_profile(profile)
    pairs = []
    for rec in records:
        try:
            w = Workload.from_record(rec)
            p = predict(w, schedule_for_record(rec), prof, calibration=None, max_trace_events=200_000)
        except (ValueError, KeyError, TypeError):
            continue
        pairs.append((p, rec.get("time_ms")))
    return fit_efficiency(pairs, f"measured records on {prof.name}")


def fit_efficiency(pairs, source: str):
    """Efficiency factors from ``(raw Prediction, measured_ms)`` pairs, or None if none is usable.

    Each pair's bound level (the largest per-level time) gets the sample raw_time / measured_time;
    a level's factor is the median of its samples (the median of all samples for a level with
    none), clipped to [0.01, 1].
    """
    samples: dict = {"dram": [], "l2": [], "smem": [], "matmul": [], "other": []}
    n = 0
    for p, t_meas in pairs:
        if p is None or not t_meas or t_meas <= 0:
            continue
        lvl = max(p.times_ms, key=p.times_ms.get)
        samples[lvl].append(p.times_ms[lvl] / t_meas)
        n += 1
    if not n:
        return None
    allv = [x for v in samples.values() for x in v]
    fallback = float(np.median(allv))
    fit = {k: float(np.clip(np.median(v) if v else fallback, 0.01, 1.0)) for k, v in samples.items()}
    return Efficiency(**fit, n_records=n, source=f"fitted from {n} {source}")
