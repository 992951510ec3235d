"""Shared-memory traffic of our CUDA-core kernels, counted from their register micro-tiles.

The float32 kernels of `kernels/` (`flash_fwd`, `flash_bwd`) are bound by shared-memory loads
per FFMA, not by DRAM, L2 or FLOP peaks: each thread owns a ``tm x tn`` register micro-tile of a
``block_m x block_n`` score tile and, for every step of the inner product, loads its ``tm``
row operands and ``tn`` column operands from shared memory (rows padded to d + 1 floats, so a
warp's load is one conflict-free wavefront; threads of a warp sharing an operand get it by
broadcast). The micro-tile is part of the mapping: :class:`sim.workload.Schedule` carries it
as data (``micro_tile`` for the block_q x block_k tile of the forward and of the dQ kernel,
``micro_tile_kv`` for the dK/dV kernel's block_k x block_q tile); nothing here looks it up.

Counts are thread-level 4-byte shared loads and stores (every tile is staged as float32,
:data:`sim.workload.SMEM_ELEM_BYTES`), per phase, read from the kernels' loops. With P threads
(``(bm / tm) (bn / tn)``), ``ntn = bn / tn`` threads per row and ``dn = d / ntn`` output
columns per thread, per visited tile:

* forward (``fwd``; m = Q rows, n = K rows): S = Q K^T loads ``P d (tm + tn)``, O += P V loads
  ``P bn (tm + dn)``; stores: the K and V tiles ``2 bn d`` and P ``bm bn``; per program the Q
  tile ``bm d``;
* dK/dV kernel (``bwd.main``; m = K rows, n = Q rows, micro-tile (tk, tq)): S^T and dP^T loads
  ``2 P d (tk + tq)``, lse and D per score column ``2 P tq``, dV += P^T dO and dK += dS^T Q loads
  ``2 P bq (tk + dn)``; with dQ atomics, dQ += dS K loads ``2 bq d bk`` (two operands per FFMA);
  stores: Q and dO tiles ``2 bq d``, lse and D ``2 bq``, P^T and dS^T ``2 bk bq``; per program
  the K and V tiles ``2 bk d``;
* dQ kernel (``bwd.dq``): S and dP loads ``2 P d (tm + tn)``, dQ += dS K loads
  ``P bn (tm + dn)``; stores: K and V tiles ``2 bn d``, dS ``bm bn``; per program Q and dO
  ``2 bm d``.

Tiles are computed whole (threads past the sequence end work on zero padding), so every
visited tile counts its full block shape. Row reductions use warp shuffles (the GPU path;
the simulator's shared-memory reduction is not counted). GQA: the K/V staging is counted per
query head (the dK/dV kernel stages it once per KV head and loops over the group).
"""
from __future__ import annotations

from .workload import SMEM_ELEM_BYTES, Schedule, Workload

__all__ = ["tile_smem_elems", "smem_bytes_by_phase", "SMEM_PHASES", "kernel_launch_shape"]

#: Phases of a flash2 schedule whose kernels stage tiles in shared memory.
SMEM_PHASES = ("fwd", "bwd.main", "bwd.dq")


def _split(name: str, bm: int, bn: int, d: int, tile) -> tuple[int, int, int, int]:
    tm, tn = tile
    if bm % tm or bn % tn:
        raise ValueError(f"{name}=({tm}, {tn}) must divide the {bm} x {bn} tile")
    ntm, ntn = bm // tm, bn // tn
    if d % ntn:
        raise ValueError(f"{name}=({tm}, {tn}): head_dim={d} must be a multiple of the "
                         f"{ntn} threads per row")
    return tm, tn, ntm * ntn, d // ntn


def tile_smem_elems(phase: str, bq: int, bk: int, d: int, tile, *, dq_atomic: bool = True) -> dict:
    """Shared-memory element loads and stores of one kernel: ``{"tile_loads", "tile_stores",
    "program_stores"}`` — per visited tile and per program (see the module docstring).
    ``tile``: the phase's micro-tile ((tm, tn) for "fwd" and "bwd.dq", (tk, tq) for
    "bwd.main")."""
    if phase == "fwd":
        tm, tn, P, dn = _split("micro_tile", bq, bk, d, tile)
        return {"tile_loads": P * d * (tm + tn) + P * bk * (tm + dn),
                "tile_stores": 2 * bk * d + bq * bk, "program_stores": bq * d}
    if phase == "bwd.main":
        tk, tq, P, dn = _split("micro_tile_kv", bk, bq, d, tile)
        loads = 2 * P * d * (tk + tq) + 2 * P * tq + 2 * P * bq * (tk + dn)
        if dq_atomic:
            loads += 2 * bq * d * bk
        return {"tile_loads": loads, "tile_stores": 2 * bq * d + 2 * bq + 2 * bk * bq,
                "program_stores": 2 * bk * d}
    if phase == "bwd.dq":
        tm, tn, P, dn = _split("micro_tile", bq, bk, d, tile)
        return {"tile_loads": 2 * P * d * (tm + tn) + P * bk * (tm + dn),
                "tile_stores": 2 * bk * d + bq * bk, "program_stores": 2 * bq * d}
    raise ValueError(f"phase must be one of {SMEM_PHASES}, got {phase!r}")


def smem_bytes_by_phase(w: Workload, schedule: Schedule, block_q: int, block_k: int,
                        stats_groups=None) -> dict:
    """``{phase: {"smem_load_bytes", "smem_store_bytes"}}`` of a flash2 schedule with
    micro-tiles, summed over every (batch, head) slice; {} without a micro-tile.

    ``stats_groups``: ``[(multiplicity, TileStats)]`` (:func:`sim.counts.workload_tile_stats`),
    computed when not given.
    """
    if not schedule.simt or schedule.name != "flash2":
        return {}
    from .counts import workload_tile_stats
    if stats_groups is None:
        stats_groups = workload_tile_stats(w, block_q, block_k)
    d = w.head_dim
    atomic = schedule.dq_mode == "atomic"
    out: dict = {}
    for p in w.passes:
        phases = []
        if p == "fwd" and schedule.micro_tile is not None:
            phases.append(("fwd", schedule.micro_tile, "nq"))
        if p == "bwd":
            if schedule.micro_tile_kv is not None:
                phases.append(("bwd.main", schedule.micro_tile_kv, "nk"))
            if not atomic and schedule.micro_tile is not None:
                phases.append(("bwd.dq", schedule.micro_tile, "nq"))
        for phase, tile, per in phases:
            c = tile_smem_elems(phase, block_q, block_k, d, tile, dq_atomic=atomic)
            ld = st_ = 0
            for mult, stt in stats_groups:
                progs = int(stt.nq if per == "nq" else stt.nk)
                ld += mult * int(stt.T) * c["tile_loads"]
                st_ += mult * (int(stt.T) * c["tile_stores"] + progs * c["program_stores"])
            out[phase] = {"smem_load_bytes": SMEM_ELEM_BYTES * ld,
                          "smem_store_bytes": SMEM_ELEM_BYTES * st_}
    return out


def kernel_launch_shape(phase: str, bq: int, bk: int, d: int, tile) -> tuple[int, int]:
    """``(threads per block, static shared-memory bytes per block)`` of one of our CUDA-core
    kernels, as `kernels.config` lays its tiles out (float32, rows padded to d + 1 floats, score
    rows padded by the threads per row): the occupancy model's inputs for that phase."""
    d1 = d + 1
    if phase == "fwd":
        _tm, _tn, P, _dn = _split("micro_tile", bq, bk, d, tile)
        ntn = bk // tile[1]
        floats = bq * d1 + 2 * bk * d1 + bq * (bk + ntn) + bq * ntn
    elif phase == "bwd.main":
        _tk, _tq, P, _dn = _split("micro_tile_kv", bk, bq, d, tile)
        ntq = bq // tile[1]
        floats = 2 * bk * d1 + 2 * bq * d1 + 2 * bk * (bq + ntq) + 2 * bq
    elif phase == "bwd.dq":
        _tm, _tn, P, _dn = _split("micro_tile", bq, bk, d, tile)
        ntn = bk // tile[1]
        floats = 2 * bq * d1 + 2 * bk * d1 + bq * (bk + ntn)
    else:
        raise ValueError(f"phase must be one of {SMEM_PHASES}, got {phase!r}")
    return P, SMEM_ELEM_BYTES * floats
