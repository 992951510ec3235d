"""Block-size search and sweeps.

* :func:`search_blocks` — every (block_q, block_k) from a candidate grid whose shared-memory
  footprint fits the profile, with occupancy, counts and predicted time; the predicted best and
  the Pareto frontier of (sram_bytes_per_block, global bytes, predicted time).
* :func:`sweep` — closed-form counts and a roofline time over the Cartesian product of parameter
  lists, vectorised with numpy (no trace, no L2 replay: DRAM = global traffic, i.e. ``l2="none"``
  unless :func:`predict` is used per row).
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field

import numpy as np

from .counts import slice_terms, tile_stats_arrays, reduce_terms
from .model import predict
from .profiles import load_profile
from .workload import DTYPE_BYTES, Schedule, Workload, occupancy, sram_bytes_per_block

__all__ = ["SearchResult", "search_blocks", "sweep", "DEFAULT_BLOCKS", "progress_bar"]

DEFAULT_BLOCKS = (16, 32, 64, 128, 256)


@dataclass
class SearchResult:
    """grid: one dict per feasible (block_q, block_k) (keys as ``Prediction.to_dict()`` plus
    ``on_frontier``); best: the grid row with the smallest predicted_ms (ties: fewer global
    bytes); frontier: rows not dominated in (sram_bytes_per_block, hbm bytes, predicted_ms);
    infeasible: [(block_q, block_k, sram_bytes)] that do not fit."""

    grid: list
    best: dict | None
    frontier: list
    infeasible: list = field(default_factory=list)
    occupancy_model: str = ("blocks/SM = min(max_blocks_per_sm, smem_per_sm // (sram + 1 KiB), "
                            "max_threads_per_sm // (32 * num_warps)); registers not modelled (no compiled "
                            "kernel per candidate)")


def search_blocks(workload: Workload, profile="h100", schedule_name: str = "flash2", *,
                  blocks=DEFAULT_BLOCKS, num_warps: int = 4, l2: str = "none", progress=None,
                  calibration=None) -> SearchResult:
    """Search feasible (block_q, block_k) for a tiled schedule. ``l2`` as :func:`sim.predict`
    ("none" by default: fast; "auto" replays the L2 model per candidate). ``calibration`` as
    :func:`sim.predict` (None by default: raw times only; the ranking always uses the raw
    ``predicted_ms``, the calibrated time is reported beside it)."""
    if schedule_name not in ("flash1", "flash2"):
        raise ValueError(f"schedule_name must be 'flash1' or 'flash2', got {schedule_name!r}")
    prof = load_profile(profile)
    grid, infeasible = [], []
    cands = list(itertools.product(blocks, blocks))
    for i, (bq, bk) in enumerate(cands):
        sram = max(int(sram_bytes_per_block(schedule_name, p, bq, bk, workload.head_dim, workload.dtype_bytes))
                   for p in workload.passes)
        if sram > prof.smem_bytes_per_block or occupancy(prof, sram, num_warps) == 0:
            infeasible.append((bq, bk, sram))
            continue
        p = predict(workload, Schedule(schedule_name, bq, bk, num_warps=num_warps), prof, l2=l2,
                    calibration=calibration)
        grid.append(p.to_dict())
        if progress:
            progress(i + 1, len(cands))
    for row in grid:
        row["on_frontier"] = not any(_dominates(o, row) for o in grid)
    frontier = sorted((r for r in grid if r["on_frontier"]), key=lambda r: r["sram_bytes_per_block"])
    best = min(grid, key=lambda r: (r["predicted_ms"], r["hbm_read_bytes"] + r["hbm_write_bytes"])) if grid else None
    return SearchResult(grid, best, frontier, infeasible)


def _dominates(a, b) -> bool:
    ka = (a["sram_bytes_per_block"], a["hbm_read_bytes"] + a["hbm_write_bytes"], a["predicted_ms"])
    kb = (b["sram_bytes_per_block"], b["hbm_read_bytes"] + b["hbm_write_bytes"], b["predicted_ms"])
    return all(x <= y for x, y in zip(ka, kb)) and ka != kb


def progress_bar(done: int, total: int, *, stream=None, width: int = 30) -> None:
    """A plain stderr progress bar (no dependency)."""
    stream = stream or sys.stderr
    frac = done / max(1, total)
    stream.write(f"\r[{'#' * int(frac * width):<{width}}] {done}/{total}")
    if done >= total:
        stream.write("\n")
    stream.flush()


SWEEP_COLUMNS = ("schedule", "pass", "dtype", "batch", "heads", "heads_kv", "seq_len_q", "seq_len_k",
                 "head_dim", "causal", "block_q", "block_k", "sram_bytes_per_block", "fits_sram",
                 "hbm_read_bytes", "hbm_write_bytes", "matmul_flops", "flops", "arithmetic_intensity",
                 "predicted_ms", "bound")


def sweep(*, schedule="flash2", seq_len=(1024,), head_dim=(64,), block_q=(64,), block_k=(64,),
          batch=(1,), heads=(16,), heads_kv=None, dtype="fp16", causal=False, dropout=False,
          pass_="fwd", profile="h100", seq_len_k=None, num_warps: int = 4, progress=None) -> dict:
    """Closed-form counts and raw roofline time over the product of the given lists.

    Returns a dict of equal-length numpy arrays (columns :data:`SWEEP_COLUMNS`). Vectorised:
    10,000 configurations take well under a second. ``seq_len_k`` None = ``seq_len``. DRAM =
    global traffic here (no L2 replay); the time uses one wave-quantised utilisation factor per
    phase like :func:`sim.predict`. Masks other than causal: use :func:`sim.predict` per row.
    ``progress(done, total)`` is called per schedule/pass chunk.
    """
    prof = load_profile(profile)
    sch = Schedule(schedule, num_warps=num_warps)
    e = DTYPE_BYTES[dtype]
    heads_kv_list = heads_kv if heads_kv is not None else (None,)
    lists = [np.atleast_1d(np.asarray(x)) for x in (seq_len, head_dim, block_q, block_k, batch, heads)]
    grids = np.meshgrid(*lists, np.arange(len(heads_kv_list)), indexing="ij")
    N, d, bq, bk, B, H, hk_idx = (g.ravel().astype(np.int64) for g in grids)
    Hkv = np.array([H[i] if heads_kv_list[j] is None else heads_kv_list[j] for i, j in enumerate(hk_idx)],
                   dtype=np.int64) if heads_kv is not None else H.copy()
    Nk = N.copy() if seq_len_k is None else np.full_like(N, int(seq_len_k))
    if schedule == "naive":
        bq = np.zeros_like(N)
        bk = np.zeros_like(N)
    n = len(N)
    passes = ("fwd", "bwd") if pass_ == "fwd+bwd" else (pass_,)
    hr = np.zeros(n, np.int64); hw = np.zeros(n, np.int64)
    mm = np.zeros(n, np.int64); ot = np.zeros(n, np.int64)
    t_ms = np.zeros(n); bound_idx = np.zeros((n, 4))
    sram = np.zeros(n, np.int64)
    if schedule != "naive":
        st = tile_stats_arrays(N, Nk, bq, bk, causal)
        sram = np.max([sram_bytes_per_block(schedule, p, bq, bk, d, e) for p in passes], axis=0).astype(np.int64)
    else:
        st = None
    fits = sram <= prof.smem_bytes_per_block
    uniq, inv = np.unique(sram, return_inverse=True)
    bps = np.array([occupancy(prof, int(s), num_warps) for s in uniq], dtype=np.int64)[inv.ravel()]
    slots = np.maximum(1, prof.num_sms * bps)
    peak_mm = prof.matmul_flops_per_s(dtype, sch.matmul_unit)
    l2_bw = prof.l2_bandwidth_bytes_per_s
    done = 0
    total = len(passes)
    for p in passes:
        b, fl = slice_terms(schedule, p, st, N, Nk, d, e, masked=bool(causal), dropout=dropout,
                            fused_softmax=False, gqa=False)
        phase_bytes: dict = {}
        for (ph, _t, op), v in b.items():
            r, wr = phase_bytes.setdefault(ph, (np.zeros(n, np.int64), np.zeros(n, np.int64)))
            (r if op == "load" else wr)[:] += np.broadcast_to(np.asarray(v * B * H, dtype=np.int64), (n,))
        gqa_mask = Hkv != H
        if p == "bwd" and gqa_mask.any():
            # GQA in a sweep: dK/dV per query head, then a reduction (counted where heads != heads_kv)
            rb, rf = reduce_terms(B, H, Hkv, Nk, d, e)
            r = np.zeros(n, np.int64); wr = np.zeros(n, np.int64)
            for (ph, _t, op), v in rb.items():
                (r if op == "load" else wr)[:] += np.where(gqa_mask, v, 0)
            phase_bytes["bwd.reduce"] = (r, wr)
            fl = dict(fl, **{"bwd.reduce": (0, np.where(gqa_mask, rf["bwd.reduce"][1], 0))})
        for ph in set(phase_bytes) | set(fl):
            r, wr = phase_bytes.get(ph, (np.zeros(n, np.int64), np.zeros(n, np.int64)))
            m_, o_ = fl.get(ph, (0, 0))
            m_ = np.broadcast_to(np.asarray(m_ * B * H if ph != "bwd.reduce" else m_, dtype=np.int64), (n,))
            o_ = np.broadcast_to(np.asarray(o_ * B * H if ph != "bwd.reduce" else o_, dtype=np.int64), (n,))
            hr += r; hw += wr; mm += m_; ot += o_
            lv = np.stack([(r + wr) / prof.hbm_bandwidth_bytes_per_s,
                           (r + wr) / l2_bw if l2_bw else np.zeros(n),
                           m_ / peak_mm, o_ / prof.fp32_flops_per_s], 1) * 1e3
            if schedule != "naive":
                if ph.startswith("fwd") or ph in ("bwd.pre", "bwd.dq", "bwd.post"):
                    nprog = B * H * (np.ceil(N / np.maximum(bq, 1)).astype(np.int64) if schedule == "flash2" else 1)
                elif ph == "bwd.main":
                    nprog = B * H * (np.ceil(Nk / np.maximum(bk, 1)).astype(np.int64) if schedule == "flash2" else 1)
                else:
                    nprog = B * Hkv
                waves = np.ceil(nprog / slots)
                util = nprog / (waves * slots)
            else:
                util = np.ones(n)
            lv = lv / util[:, None]
            t_ms += lv.max(1)
            bound_idx += lv
        done += 1
        if progress:
            progress(done, total)
    levels = np.array(["dram", "l2", "matmul", "other"])
    out = {
        "schedule": np.full(n, schedule), "pass": np.full(n, pass_), "dtype": np.full(n, dtype),
        "batch": B, "heads": H, "heads_kv": Hkv, "seq_len_q": N, "seq_len_k": Nk, "head_dim": d,
        "causal": np.full(n, bool(causal)), "block_q": bq, "block_k": bk,
        "sram_bytes_per_block": sram, "fits_sram": fits, "hbm_read_bytes": hr, "hbm_write_bytes": hw,
        "matmul_flops": mm, "flops": mm + ot, "arithmetic_intensity": (mm + ot) / np.maximum(1, hr + hw),
        "predicted_ms": np.where(fits, t_ms, np.nan), "bound": levels[bound_idx.argmax(1)],
    }
    return out
