"""The plan of the Hopper backward (`kernels.wgmma_bwd`, family ``wgmma``), and the layout facts
its launcher reads: tile choices and defaults, threads, dynamic shared memory.

The backward has the structure of the ``mma`` family's two-kernel backward
(`sim.plans.tensor_core_bwd`, ``dq_mode="kernel"``: seven matmul-sized passes, no atomics, no
pre-pass), each kernel built like the Hopper forward (`sim.plans.wgmma_fwd`): one program per
tile of ``rows`` rows (64 per consumer warpgroup), a producer that loads the program's two
*resident* operands once and streams two operands tile by tile through a ring of
:data:`WGMMA_BWD_STAGES` shared-memory stages by TMA (full / empty mbarriers), ``wgmma``
products from shared memory (16-bit operands, 128-byte swizzle, boxes of 64 columns):

1. the **dQ kernel** (``flash_wgmma_bwd_dq``, phase ``bwd.dq``), grid (cdiv(Nq, rows), B * Hq):
   resident Q and dO (rows = query rows), delta = rowsum(dO * O) from O and dO read as
   accumulator fragments (written for the second kernel), the K/V tiles of
   `BlockInfo.kv_schedule()` streamed (``cols`` keys a stage); per tile S = Q K^T,
   dP = dO V^T (both K-major from shared memory), P and dS = P (dP - delta) on the accumulator
   fragment, dQ += dS K (dS from registers, K MN-major);
2. the **dK/dV kernel** (``flash_wgmma_bwd_dkdv``, phase ``bwd.main``), grid
   (cdiv(Nk, rows), B * Hkv): resident K and V (rows = key rows), over the query heads of its
   GQA group and the Q tiles of `BlockInfo.q_schedule()`, Q and dO streamed (``cols`` queries a
   stage); each consumer thread reads the lse and delta of its columns' queries from global
   memory (L1); per tile S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.

With ``dq_mode="atomic"`` (FlashAttention-2's and -3's structure, five matmul-sized passes)
there is no dQ kernel: a pre-pass (``flash_wgmma_bwd_pre``, phase ``bwd.pre``: the ``mma``
family's, `sim.plans.tensor_core_bwd`) writes delta and zeroes a float32 dQ accumulator; the
dK/dV kernel also computes dQ += dS K per item: each consumer warpgroup stores its dS^T (16-bit,
the A fragment words it already packed) in shared memory (two buffers, 128-byte swizzled, MN-major
for the product), a named barrier over the consumers, then each warpgroup issues a ``wgmma``
with both operands MN-major from shared memory (dS^T and the resident K) for its share of the
tile's dQ (:func:`wgmma_bwd_dq_split`), stores it in shared memory (float32, 128-byte swizzled
boxes of 32 columns) and one of its threads adds it to the accumulator by TMA
(``cp.reduce.async.bulk.tensor``: the L2 adds whole lines, where per-thread
``red.global.add`` measured at about 1 TB/s of float32 adds bound the kernel); a conversion
(``flash_wgmma_bwd_convert``, phase ``bwd.post``) writes dQ = scale * accumulator in the input
dtype.

Tiles are given in (queries, keys) order for both kernels, as `sim.plans.tensor_core_bwd`'s:
``dq_tile`` = (query rows per program, keys per stage), ``kv_tile`` = (queries per stage, key
rows per program).

Owns the layout section just below (read by the launcher) and, after it, the plan:
:func:`wgmma_backward_plan`, :func:`wgmma_backward_configs` and :func:`launch_of`. Only the
problems without dropout, boolean mask (``workload.key_lengths``) or block mask are planned;
causal and sliding windows are (the visited tiles are `BlockInfo`'s, through
`sim.counts.tile_stats_closed`), and GQA (the dK/dV kernel sums its group's query heads).

What the plan counts, read from the kernels' source (`kernels.wgmma_bwd`; not yet held against
their SASS or Nsight Compute counters). The per-score, per-row and per-element constants are
the ``mma`` backward's (`sim.plans.tensor_core_bwd`): the element-wise code is the same on the
same accumulator layout, four threads a row.

* **Products** on whole tiles, ``2 rows cols d`` FLOPs each, on ``wgmma.f16`` / ``wgmma.bf16``:
  three per visited tile in the dQ kernel, four per visited (query head, Q tile) item in the
  dK/dV kernel.
* **Element-wise FP32 and MUFU** as the ``mma`` backward's two-kernel plan counts them: per
  score (whole tiles) ``DQ_FLOPS_PER_SCORE`` / ``DKDV_FLOPS_PER_SCORE`` and one ``ex2``; in the
  dQ kernel delta's products per element, its quad shuffles per held row, lse * log2(e) per row
  and dQ's scale per element; in the dK/dV kernel lse * log2(e) per column of each item on every
  consumer thread that holds it (``cols / 4`` a thread) and dK's scale per element.
* **Bytes**. By TMA (``"tma"``, whole rows: a box starting at or past the last row is not
  issued, rows past it inside a box are zero-filled without a read): the dQ kernel's Q and dO
  once per row, K and V once per visited tile (the tile's keys inside the problem); the dK/dV
  kernel's K and V once per row, Q and dO once per item (its queries inside the problem). As
  4-byte words of the accumulator fragment (``"fragment"``, 16 bytes of a row a warp
  instruction): the dQ kernel's O and dO for delta (so dO is read twice: TMA and fragment),
  dQ, dK and dV stores. Row statistics (float32, ``"ld"``/``"st"``): lse read and delta
  written once per row by the dQ kernel; lse and delta read once per query of each item inside
  the problem by each consumer warpgroup of the dK/dV kernel (each stages its item's pairs in
  shared memory: 64 of its threads load them). The tile schedules' CSR entries
  (``"schedule"``, warp-uniform 4-byte loads, a sector each): the consumer warps and the
  producer warp read start and stop once (the dK/dV kernel: once per query head of its group)
  and one index per visited tile or item; a producer warpgroup's other three warps leave
  before the loop (:data:`WGMMA_BWD_SCHEDULE_LOADS_PER_WARP`). The tensor maps are not
  counted.
* **Shared memory moved**: the TMA destinations (the resident operands' 64-row boxes, the
  streamed tiles whole); the ``wgmma`` operand reads are not counted (as the forward leaves them out).
* **Overlap**: the forward's model (`sim.plans.flash3.overlap_serial`, warp-specialised,
  :data:`WGMMA_BWD_STAGES` stages, no ping-pong, no intra-warpgroup overlap): each consumer
  warpgroup's products and element-wise work add, the loads overlap them; the programs
  resident on an SM run their chains independently (``serial_per_program``). Each consumer
  warpgroup's waits for its ``wgmma`` groups (:data:`WGMMA_BWD_WAITS_PER_TILE` a tile,
  ``group_waits``) are on that chain too, priced by the profile's measured wait latency
  (``python -m benchmarks rates --only wgmma-wait``; without it the "wait" level is 0).
* **Registers**: with a producer warpgroup the launch's even share of the register file
  (``setmaxnreg`` moves them after), else not known (None: the residency ignores registers).

The TMA loads are ``Access.how = "tma"`` (the LSU counters do not see them; the dQ kernel's
fragment loads of dO for delta are plain loads). The plan's config names the dynamic shared memory
of each kernel (``dynamic_shared_bytes``, what :func:`launch_of` hands the launcher).
"""
from __future__ import annotations

import numbers

import numpy as np

from ioaware.block_info import BlockInfo, cdiv
from ioaware.launch_order import head_group

from ..plan import Access, KernelPlan, Matmul, Plan
from ..workload import STAT_BYTES, Workload
from .flash3 import REGISTERS_PER_SM, overlap_serial
from .tensor_core_bwd import (DELTA_FLOPS_PER_ELEMENT, DELTA_SHUFFLE_FLOPS_PER_ROW_THREAD,
                              DKDV_FLOPS_PER_SCORE, DKDV_MUFU_PER_SCORE, DKDV_PRODUCTS_PER_TILE,
                              DQ_FLOPS_PER_SCORE, DQ_MUFU_PER_SCORE, DQ_PRODUCTS_PER_TILE,
                              DYNAMIC_SMEM_LIMIT_BYTES, FRAGMENT_ROW_BYTES, LSE_LOG2_FLOPS_PER_ROW,
                              SCALE_FLOPS_PER_ELEMENT, SCHEDULE_ENTRY_BYTES, THREADS_PER_ROW,
                              _atomic_dq_kernels, _check_registers, _check_workload,
                              _first_tiles_in_step, _kernel_tiles_stats)
from .wgmma_fwd import (ALIGN_SLACK_BYTES, OVERLAP_REGISTERS, PRODUCER_THREADS,
                        ROWS_PER_WARPGROUP, WARPGROUP_THREADS)

__all__ = ["WGMMA_BWD_KERNEL_NAMES", "WGMMA_BWD_HEAD_DIMS", "WGMMA_BWD_ROWS_CHOICES",
           "WGMMA_BWD_COLS_CHOICES", "WGMMA_BWD_STAGES", "WGMMA_BWD_BARRIER_BYTES",
           "wgmma_bwd_default_tiles", "wgmma_bwd_threads", "wgmma_bwd_producer_warpgroup",
           "wgmma_bwd_smem_bytes", "wgmma_bwd_stats_bytes", "WGMMA_BWD_REGISTERS",
           "WGMMA_BWD_WAITS_PER_TILE", "WGMMA_BWD_WIDE_DQ_FROM", "WGMMA_BWD_SERIALISED",
           "wgmma_bwd_ds_under_dv", "wgmma_bwd_waits_per_tile", "record_config", "record_fields",
           "wgmma_backward_plan", "wgmma_backward_configs", "launch_of",
           "WGMMA_BWD_SCHEDULE_LOADS_PER_WARP", "WGMMA_BWD_DQ_MODES", "WGMMA_BWD_DS_BUFFERS",
           "wgmma_bwd_dq_split", "wgmma_bwd_ds_bytes", "wgmma_bwd_dq_stage_bytes", "wgmma_bwd_dq_refusal",
           "wgmma_default_dq_mode"]

#: Kernel names as Nsight Compute lists them: kernel ("dq", "dkdv") -> name.
WGMMA_BWD_KERNEL_NAMES = {"dq": "flash_wgmma_bwd_dq", "dkdv": "flash_wgmma_bwd_dkdv",
                          "pre": "flash_wgmma_bwd_pre", "convert": "flash_wgmma_bwd_convert"}
#: How dQ is computed: by its own kernel ("kernel": seven matmul-sized passes, deterministic) or
#: by float32 atomics from the dK/dV kernel ("atomic": five, a pre-pass and a conversion).
WGMMA_BWD_DQ_MODES = ("kernel", "atomic")
#: Shared-memory buffers of the atomic dK/dV kernel's dS^T (one a tile, alternating: a
#: warpgroup stores tile i's while the other may still read tile i - 1's, so one named barrier
#: a tile orders both).
WGMMA_BWD_DS_BUFFERS = 2
WGMMA_BWD_HEAD_DIMS = (64, 128)
#: Rows of a program (query rows of the dQ kernel, key rows of the dK/dV kernel): two or one
#: consumer warpgroups.
WGMMA_BWD_ROWS_CHOICES = (128, 64)
#: Streamed rows a stage (keys of the dQ kernel, queries of the dK/dV kernel): one or two n64
#: blocks of the score tile.
WGMMA_BWD_COLS_CHOICES = (64, 128)
#: Shared-memory stages of the streamed operands.
WGMMA_BWD_STAGES = 2
#: At d = 64 the default dQ tile is 128 x 128 from this many queries on (64 x 64 below):
#: `wgmma_bwd_default_tiles`.
WGMMA_BWD_WIDE_DQ_FROM = 4096
#: ``wgmma.wait_group`` calls of a consumer warpgroup per visited tile, by kernel: the dQ kernel
#: waits for S (with dP in flight), dP and dQ's product; the dK/dV kernel for S^T (with dP^T in
#: flight), dP^T (with dV's product in flight where `wgmma_bwd_ds_under_dv`), dV's product and
#: dK's, or dP^T and then dV's and dK's products together (the ``wgmma_wait_group`` calls of
#: `kernels.wgmma_bwd`'s tile loop; tests/test_wgmma_bwd.py counts them in its PTX):
#: `wgmma_bwd_waits_per_tile`.
WGMMA_BWD_WAITS_PER_TILE = {"dq": 3, "dkdv": 4, "dkdv_back_to_back": 3}


def wgmma_bwd_ds_under_dv(cols: int) -> bool:
    """Whether the dK/dV kernel computes dS^T while dV's product runs (64 queries a stage), or
    after dP^T's product with dV's and dK's products then issued back to back (128: the
    registers of P^T's 16-bit copy beside the float32 S^T and dP^T made ptxas serialise the
    products). Measured on an H200 (docs/kernels.md, *Hopper backward*): back to back the d = 64
    dK/dV kernel at 128 queries a stage is 8-14 % faster; at 64 queries (d = 128) the overlap
    is up to 5 % faster."""
    return cols == 64


def wgmma_bwd_waits_per_tile(kernel: str, cols: int) -> int:
    """`WGMMA_BWD_WAITS_PER_TILE` of ``kernel`` ("dq" or "dkdv") at ``cols`` streamed rows a
    stage."""
    if kernel == "dkdv" and not wgmma_bwd_ds_under_dv(cols):
        return WGMMA_BWD_WAITS_PER_TILE["dkdv_back_to_back"]
    return WGMMA_BWD_WAITS_PER_TILE[kernel]


#: The kernels ``(kernel, head_dim, rows, cols)`` whose ``wgmma`` products ptxas (sm_90a)
#: serialises for want of registers (C7512; 768-876 bytes spilled): the dK/dV kernel at d = 128
#: with 128 queries a stage, whose S^T, dP^T and two 64 x 128 accumulators pass the 240
#: registers a consumer thread has (float16 and bfloat16, causal or not, alike).
#: `wgmma_backward_configs` leaves them out of the tuning space; tests/test_wgmma_bwd.py
#: compiles them and checks.
WGMMA_BWD_SERIALISED = (("dkdv", 128, 128, 128), ("dkdv", 128, 64, 128))
#: The mbarriers: resident_full, full[stages], empty[stages], 8 bytes each, rounded up.
WGMMA_BWD_BARRIER_BYTES = 64
#: Registers per thread with a producer warpgroup (two consumer warpgroups): ``setmaxnreg``
#: lowers the producer's to the first and raises the consumers' to the second, as the forward's.
WGMMA_BWD_REGISTERS = OVERLAP_REGISTERS


def wgmma_bwd_default_tiles(head_dim: int, seq_len_q: int = 0) -> dict:
    """Default tiles, (queries, keys) order. At d = 64: the dK/dV kernel 128 queries a stage
    against 128 key rows, the dQ kernel 64 x 64 (one consumer warpgroup, 64 keys a stage) below
    :data:`WGMMA_BWD_WIDE_DQ_FROM` queries (``seq_len_q``) and 128 x 128 from there. At d = 128:
    the dQ kernel 128 x 128, the dK/dV kernel 64 queries a stage against 128 key rows. Chosen
    on an H200 by ``python -m benchmarks pick --family wgmma --pass bwd``
    (`results/pick_wgmma_bwd_h200_2026-11-29.json`, float16, N 512-16,384, causal and not:
    within 3.4 % of the measured best in every group; docs/kernels.md, *Hopper backward*)."""
    if head_dim == 64:
        return {"dq": (128, 128) if seq_len_q >= WGMMA_BWD_WIDE_DQ_FROM else (64, 64),
                "dkdv": (128, 128)}
    return {"dq": (128, 128), "dkdv": (64, 128)}


def record_fields(head_dim: int, seq_len_q: int) -> dict:
    """What a results record of today's wgmma backward names, at its default tiles: its
    ``dq_tile`` and ``kv_tile`` (`wgmma_bwd_default_tiles`) and ``launch_balanced`` (its launch
    order balanced as `sim.plan.launch_group` does), and its ``dq_mode``
    (`wgmma_default_dq_mode`): what :func:`record_config` reads back."""
    tiles = wgmma_bwd_default_tiles(head_dim, seq_len_q)
    return {"dq_tile": list(tiles["dq"]), "kv_tile": list(tiles["dkdv"]),
            "launch_balanced": True, "dq_mode": wgmma_default_dq_mode(head_dim, seq_len_q)}


def record_config(rec: dict) -> dict:
    """``{"dq_tile", "kv_tile", "launch_order"}`` a results record of the wgmma backward ran
    (with ``"dq_mode": "atomic"`` and no ``dq_tile`` for a record that names that mode; a
    record without one ran the dQ kernel).
    Tiles: as it names them (records since 2026-11-29), else the defaults of the kernels before
    then, which every older record ran (dQ 64 x 64 at d = 64 and 128 x 128 at d = 128, dK/dV 64
    queries a stage against 128 key rows). Launch order: None (the default, balanced by
    `sim.plan.launch_group` as the launcher does) for a record marked ``launch_balanced``;
    otherwise the record's ``launch_head_group`` (or the pass's default), unbalanced, as the
    kernels before d67e264 ran it."""
    if rec.get("dq_mode") == "atomic":
        tiles = {"kv_tile": tuple(rec["kv_tile"]), "dq_mode": "atomic"}
    elif rec.get("dq_tile") is not None and rec.get("kv_tile") is not None:
        tiles = {"dq_tile": tuple(rec["dq_tile"]), "kv_tile": tuple(rec["kv_tile"])}
    else:
        d = int(rec["head_dim"])
        tiles = {"dq_tile": (64, 64) if d == 64 else (128, 128), "kv_tile": (64, 128)}
    if rec.get("launch_balanced"):
        return dict(tiles, launch_order=None)
    return dict(tiles, launch_order=head_group(rec.get("launch_head_group"),
                                               bool(rec.get("causal")), "bwd"))


def wgmma_bwd_producer_warpgroup(rows: int) -> bool:
    """Whether the producer is a whole warpgroup that hands its registers to the consumers
    (``setmaxnreg``, :data:`WGMMA_BWD_REGISTERS`): with two consumer warpgroups."""
    return rows // ROWS_PER_WARPGROUP == 2


def wgmma_bwd_threads(rows: int) -> int:
    """Threads of one program: a consumer warpgroup per 64 rows, then the producer (a warp, or
    a warpgroup with two consumer warpgroups)."""
    producer = WARPGROUP_THREADS if wgmma_bwd_producer_warpgroup(rows) else PRODUCER_THREADS
    return WARPGROUP_THREADS * (rows // ROWS_PER_WARPGROUP) + producer


def wgmma_bwd_stats_bytes(kernel: str, rows: int, cols: int,
                          stages: int = WGMMA_BWD_STAGES) -> int:
    """Bytes of the dK/dV kernel's row statistics: per consumer warpgroup and stage, the lse (as
    log2) and delta of the stage's ``cols`` queries, float32 pairs (its threads store them,
    then read them per score); the dQ kernel holds its rows' in registers (0)."""
    return (rows // ROWS_PER_WARPGROUP) * stages * cols * 8 if kernel == "dkdv" else 0


def wgmma_bwd_ds_bytes(kernel: str, head_dim: int, rows: int, cols: int,
                       dq_atomic: bool = False) -> int:
    """Bytes of the atomic dK/dV kernel's own shared memory: its dS^T buffers
    (:data:`WGMMA_BWD_DS_BUFFERS` of ``rows`` keys x ``cols`` queries, 16-bit), then its dQ
    staging (:func:`wgmma_bwd_dq_stage_bytes`); 0 for other kernels."""
    if kernel != "dkdv" or not dq_atomic:
        return 0
    return (WGMMA_BWD_DS_BUFFERS * rows * cols * 2
            + wgmma_bwd_dq_stage_bytes(head_dim, rows, cols))


def wgmma_bwd_dq_stage_bytes(head_dim: int, rows: int, cols: int) -> int:
    """Bytes of the atomic dK/dV kernel's dQ staging: each consumer warpgroup's share of a
    tile's dQ (64 query rows x its columns, float32, :func:`wgmma_bwd_dq_split`), which one of
    its threads then adds to the accumulator by TMA."""
    share = wgmma_bwd_dq_split(head_dim, rows, cols)[1]
    return (rows // ROWS_PER_WARPGROUP) * ROWS_PER_WARPGROUP * share * 4


def wgmma_bwd_smem_bytes(kernel: str, head_dim: int, rows: int, cols: int,
                         stages: int = WGMMA_BWD_STAGES, dq_atomic: bool = False) -> int:
    """Dynamic shared memory of one program of ``kernel`` ("dq", "dkdv") in bytes: the
    alignment slack, the two resident operands (``rows`` x d, 16-bit), ``stages`` stages of the
    two streamed operands (``cols`` x d each), the atomic dK/dV kernel's dS^T buffers and dQ
    staging (:func:`wgmma_bwd_ds_bytes`), the row statistics (:func:`wgmma_bwd_stats_bytes`), the
    mbarriers."""
    return (ALIGN_SLACK_BYTES + 2 * rows * head_dim * 2 + stages * 2 * cols * head_dim * 2
            + wgmma_bwd_ds_bytes(kernel, head_dim, rows, cols, dq_atomic)
            + wgmma_bwd_stats_bytes(kernel, rows, cols, stages) + WGMMA_BWD_BARRIER_BYTES)


def wgmma_bwd_dq_split(head_dim: int, rows: int, cols: int) -> tuple[str, int]:
    """How the atomic dK/dV kernel's consumer warpgroups share a tile's dQ = dS K (``cols``
    queries x d, summed over the program's ``rows`` keys): ``("queries", d)``, warpgroup w the
    64 queries of block w, all d columns (as many query blocks as warpgroups); or
    ``("columns", 64)``, every warpgroup the tile's 64 queries, d columns 64 w .. 64 w + 63 (64
    queries a stage, two warpgroups, d = 128). Each product is one m64nNk16 ``wgmma`` per 16 keys.
    ValueError for the tiles it cannot share (:func:`wgmma_bwd_dq_refusal`)."""
    why = wgmma_bwd_dq_refusal(head_dim, rows, cols)
    if why:
        raise ValueError(why)
    if cols // ROWS_PER_WARPGROUP == rows // ROWS_PER_WARPGROUP:
        return "queries", head_dim
    return "columns", 64


def wgmma_bwd_dq_refusal(head_dim: int, rows: int, cols: int):
    """Why the atomic dK/dV kernel cannot run ``rows`` key rows a program and ``cols`` queries a
    stage (a string naming ``kv_tile``), or None: it needs two consumer warpgroups (128 key
    rows), and either one query block per warpgroup (128 queries a stage) or, at 64 queries a
    stage, d = 128 (each warpgroup 64 of dQ's columns)."""
    if rows != 2 * ROWS_PER_WARPGROUP:
        return (f"dQ by atomics in the wgmma backward needs 128 key rows a program "
                f"(kv_tile=({cols}, {rows}))")
    if cols == rows or (cols == ROWS_PER_WARPGROUP and head_dim == 128):
        return None
    return (f"dQ by atomics in the wgmma backward takes 128 queries a stage, or 64 at d = 128 "
            f"(kv_tile=({cols}, {rows}), d = {head_dim})")


def wgmma_default_dq_mode(head_dim: int, seq_len_q: int = 0, deterministic: bool = False) -> str:
    """The dQ mode the wgmma backward runs by default: its dQ kernel ("kernel",
    deterministic), at every head dim and length (and under ``deterministic`` algorithms).
    Measured on an H200 (``python -m benchmarks tune --backward-dq --dq-family wgmma``,
    2026-11-29, bfloat16, B * N = 16384; the run is cited in docs/kernels.md): dQ by
    atomics was 0.93-1.04x the dQ kernel's backward at d = 64 (faster only from N = 4096, by at
    most 4 %) and 0.91-0.96x at d = 128; too little, and too rarely, to trade determinism for
    (docs/kernels.md, *Hopper backward: dQ by atomics*). The arguments are the rule's inputs
    for when that changes."""
    return "kernel"


# -- the plan -----------------------------------------------------------------------------------
#: Schedule entries each working warp of a program (its consumer warps and the producer warp)
#: reads per head it walks: the CSR start and stop of its tile (``kernels.wgmma_bwd``: ``for it
#: in range(offsets[s, blk], offsets[s, blk + 1])``, once per query head of the GQA group in the
#: dK/dV kernel); then one ``index[it]`` per visited tile or item.
WGMMA_BWD_SCHEDULE_LOADS_PER_WARP = 2


def _check_tiles(name: str, tile, query_sizes, key_sizes) -> tuple[int, int]:
    """``tile`` as a pair (queries, keys) of ints with queries in ``query_sizes`` and keys in
    ``key_sizes``; ValueError naming ``name`` otherwise."""
    ok = (isinstance(tile, (tuple, list)) and len(tile) == 2
          and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in tile))
    if not ok or tile[0] not in query_sizes or tile[1] not in key_sizes:
        raise ValueError(f"{name} must be a pair (queries, keys) with queries in {query_sizes} "
                         f"and keys in {key_sizes}, got {tile!r}")
    return int(tile[0]), int(tile[1])


def _check(w: Workload):
    """What the backward plans: ValueError (TypeError for a non-workload) naming the field."""
    _check_workload("wgmma", w, ("fp16", "bf16"), WGMMA_BWD_HEAD_DIMS)
    if w.dropout:
        raise ValueError("the wgmma backward has no dropout (workload.dropout=True)")
    if w.block_sparse:
        raise ValueError("the wgmma backward takes no block mask (workload.block_sparse: "
                         "block_mask or block_density)")
    if w.key_lengths is not None:
        raise ValueError("the wgmma backward takes no boolean mask (workload.key_lengths, the "
                         "key-padding mask)")


def _launch_registers(rows: int, given):
    """Registers per thread at launch: ``given`` if not None; with a producer warpgroup the
    launch's even share of the register file (``setmaxnreg`` moves them after); else None (not
    known: no ptxas table of this kernel yet)."""
    if given is not None:
        return given
    if wgmma_bwd_producer_warpgroup(rows):
        return REGISTERS_PER_SM // wgmma_bwd_threads(rows) // 8 * 8
    return None


def _boxes_bytes(slices: int, rows: int, d: int, e: int) -> int:
    """Bytes the TMA lands in shared memory for a resident operand of ``rows`` rows per slice:
    every 64-row box that starts inside the problem, whole (rows past the problem zero-filled)."""
    return slices * cdiv(rows, ROWS_PER_WARPGROUP) * ROWS_PER_WARPGROUP * d * e


def _schedule_loads(rows: int, programs: int, heads_per_program: int, visits: int) -> int:
    """Warp-uniform schedule loads of a kernel of ``rows`` rows a program: the consumer warps and
    the producer warp (a producer warpgroup's other three warps leave before the loop) read
    start and stop once per head they walk and one index per visit."""
    working_warps = WARPGROUP_THREADS // 32 * (rows // ROWS_PER_WARPGROUP) + 1
    return working_warps * (WGMMA_BWD_SCHEDULE_LOADS_PER_WARP * heads_per_program * programs
                            + visits)


def wgmma_backward_plan(workload: Workload, *, dq_tile=None, kv_tile=None, launch_order=None,
                        registers=None, dq_mode=None) -> Plan:
    """The plan of the Hopper backward (`kernels.wgmma_bwd`, family ``wgmma``) for ``workload``
    (float16 or bfloat16, d 64 or 128, causal or not, a sliding window or none, GQA; no
    dropout, boolean mask or block mask): the dQ kernel, then the dK/dV kernel (module
    docstring).

    ``dq_tile`` = (query rows per program, keys per stage) of the dQ kernel, ``kv_tile`` =
    (queries per stage, key rows per program) of the dK/dV kernel; rows in
    :data:`WGMMA_BWD_ROWS_CHOICES`, stages in :data:`WGMMA_BWD_COLS_CHOICES` (None:
    :func:`wgmma_bwd_default_tiles`). ``registers``: (dQ kernel, dK/dV kernel) registers per
    thread at launch (None, or an entry None: with a producer warpgroup the launch's even share,
    else not known). ``launch_order`` is recorded in the config (it orders the programs, not
    what they do). ``dq_mode``: "kernel" or "atomic" (:data:`WGMMA_BWD_DQ_MODES`; None:
    :func:`wgmma_default_dq_mode`); with "atomic" the kernels are the pre-pass, the dK/dV kernel
    (which adds dQ) and the conversion, and ``dq_tile`` must be None (the config names none).
    Raises ValueError naming the argument for what the kernels do not run."""
    w = workload
    _check(w)
    d, e = w.head_dim, w.dtype_bytes
    if dq_mode is None:
        dq_mode = wgmma_default_dq_mode(d, w.seq_len_q)
    if dq_mode not in WGMMA_BWD_DQ_MODES:
        raise ValueError(f"dq_mode must be one of {WGMMA_BWD_DQ_MODES}, got {dq_mode!r}")
    dq_atomic = dq_mode == "atomic"
    if dq_atomic and dq_tile is not None:
        raise ValueError(f"dq_tile: the wgmma backward with dq_mode='atomic' has no dQ kernel "
                         f"(got {dq_tile!r})")
    defaults = wgmma_bwd_default_tiles(d, w.seq_len_q)
    dq_tile = _check_tiles("dq_tile", defaults["dq"] if dq_tile is None else dq_tile,
                           WGMMA_BWD_ROWS_CHOICES, WGMMA_BWD_COLS_CHOICES)
    kv_tile = _check_tiles("kv_tile", defaults["dkdv"] if kv_tile is None else kv_tile,
                           WGMMA_BWD_COLS_CHOICES, WGMMA_BWD_ROWS_CHOICES)
    if dq_atomic:
        why = wgmma_bwd_dq_refusal(d, kv_tile[1], kv_tile[0])
        if why:
            raise ValueError(why)
    registers = _check_registers(registers) or (None, None)
    B, H, Hkv, Nq, Nk = w.batch, w.heads, w.heads_kv, w.seq_len_q, w.seq_len_k
    (dq_rows, dq_cols), (kv_cols, kv_rows_per_program) = dq_tile, kv_tile
    unit = "wgmma.bf16" if w.dtype == "bf16" else "wgmma.f16"
    names = WGMMA_BWD_KERNEL_NAMES

    # visited tiles (BlockInfo's), summed over the (batch, query head) slices
    dq_stats = _kernel_tiles_stats(w, dq_tile, None, None)
    kv_stats = _kernel_tiles_stats(w, kv_tile, None, None)
    dq_visits = sum(m * int(st.T) for m, st, _ in dq_stats)      # (slice, Q tile, K tile)
    dq_keys = sum(m * int(st.C) for m, st, _ in dq_stats)        # keys inside, per visited tile
    kv_visits = sum(m * int(st.T) for m, st, _ in kv_stats)      # items: every query head of a
    kv_queries = sum(m * int(st.R) for m, st, _ in kv_stats)     # group, queries inside per item
    n_blocks_q, n_blocks_k = cdiv(Nq, dq_rows), cdiv(Nk, kv_rows_per_program)
    q_rows, kv_keys = B * H * Nq, B * Hkv * Nk                   # rows inside the problem
    q_held_rows = B * H * n_blocks_q * dq_rows                   # rows the dQ programs hold
    q_elems, kv_elems = q_rows * d, kv_keys * d
    dq_scores = dq_visits * dq_rows * dq_cols                    # whole tiles
    kv_scores = kv_visits * kv_cols * kv_rows_per_program

    # -- each program's work (visited tiles; the dK/dV kernel's over its GQA group) in dispatch
    # order (the dQ kernel's longest query tile first), and the launch order --
    bi = BlockInfo(Nq, Nk, dq_rows, dq_cols, w.causal, window_size=w.window_size)
    dq_work = tuple(int(x) for x in np.diff(bi.kv_schedule()[0])[::-1])
    bi = BlockInfo(Nq, Nk, kv_cols, kv_rows_per_program, w.causal, window_size=w.window_size)
    kv_work = tuple(w.group * int(x) for x in np.diff(bi.q_schedule()[0]))
    order = {"head_group": (None if launch_order is None
                            else head_group(launch_order, w.causal, "bwd")),
             "default_head_group": head_group(None, w.causal, "bwd")}

    def serial(rows: int) -> tuple:
        return overlap_serial(warp_specialised=True, stages=WGMMA_BWD_STAGES, pingpong=False,
                              intra_overlap=False,
                              consumer_warpgroups=rows // ROWS_PER_WARPGROUP, waits=True)

    # -- the dQ kernel ---------------------------------------------------------------------------
    dq_threads = wgmma_bwd_threads(dq_rows)
    dq_programs = n_blocks_q * B * H
    dq_schedule = _schedule_loads(dq_rows, dq_programs, 1, dq_visits)
    dq_accesses = (
        Access("schedule", "load", dq_schedule * SCHEDULE_ENTRY_BYTES, "fragment",
               SCHEDULE_ENTRY_BYTES),
        Access("Q", "load", q_elems * e, "tma"),                                 # TMA, resident
        Access("dO", "load", q_elems * e, "tma"),                                # TMA, resident
        Access("dO", "load", q_elems * e, "fragment", FRAGMENT_ROW_BYTES),       # delta
        Access("O", "load", q_elems * e, "fragment", FRAGMENT_ROW_BYTES),        # delta
        Access("lse", "load", q_rows * STAT_BYTES, "ld"),
        Access("K", "load", dq_keys * d * e, "tma"),                             # TMA, streamed
        Access("V", "load", dq_keys * d * e, "tma"),                             # TMA, streamed
        Access("delta", "store", q_rows * STAT_BYTES, "st"),
        Access("dQ", "store", q_elems * e, "fragment", FRAGMENT_ROW_BYTES),
    )
    dq_fp32 = (dq_scores * DQ_FLOPS_PER_SCORE
               + q_elems * DELTA_FLOPS_PER_ELEMENT
               + q_held_rows * THREADS_PER_ROW * DELTA_SHUFFLE_FLOPS_PER_ROW_THREAD
               + q_rows * THREADS_PER_ROW * LSE_LOG2_FLOPS_PER_ROW
               + q_elems * SCALE_FLOPS_PER_ELEMENT)
    dq_smem = wgmma_bwd_smem_bytes("dq", d, dq_rows, dq_cols)
    dq_kernel = KernelPlan(
        name=names["dq"], phase="bwd.dq", grid=(n_blocks_q, B * H), threads=dq_threads,
        shared_bytes=dq_smem, accesses=dq_accesses,
        matmuls=(Matmul(unit, dq_visits * DQ_PRODUCTS_PER_TILE * 2 * dq_rows * dq_cols * d),),
        fp32_flops=int(dq_fp32), mufu_ops=int(dq_scores * DQ_MUFU_PER_SCORE),
        shared_bytes_moved=int(2 * _boxes_bytes(B * H, Nq, d, e)
                               + dq_visits * 2 * dq_cols * d * e),
        registers=_launch_registers(dq_rows, registers[0]), programs_per_slice=n_blocks_q,
        lockstep=_first_tiles_in_step(w, dq_tile, "kv"),
        serial=serial(dq_rows), serial_per_program=True,
        group_waits=dq_visits * (dq_rows // ROWS_PER_WARPGROUP) * wgmma_bwd_waits_per_tile("dq", dq_cols),
        waiters_per_program=dq_rows // ROWS_PER_WARPGROUP, tile_work=dq_work, **order)

    # -- the dK/dV kernel ------------------------------------------------------------------------
    kv_threads = wgmma_bwd_threads(kv_rows_per_program)
    kv_warpgroups = kv_rows_per_program // ROWS_PER_WARPGROUP      # consumer warpgroups
    kv_consumer_threads = kv_warpgroups * WARPGROUP_THREADS
    kv_programs = n_blocks_k * B * Hkv
    kv_schedule = _schedule_loads(kv_rows_per_program, kv_programs, w.group, kv_visits)
    kv_accesses = (
        Access("schedule", "load", kv_schedule * SCHEDULE_ENTRY_BYTES, "fragment",
               SCHEDULE_ENTRY_BYTES),
        Access("K", "load", kv_elems * e, "tma"),                                # TMA, resident
        Access("V", "load", kv_elems * e, "tma"),                                # TMA, resident
        Access("Q", "load", kv_queries * d * e, "tma"),                          # TMA, streamed
        Access("dO", "load", kv_queries * d * e, "tma"),                         # TMA, streamed
        # each consumer warpgroup stages its item's (lse2, delta) pairs itself
        Access("lse", "load", kv_warpgroups * kv_queries * STAT_BYTES, "ld"),
        Access("delta", "load", kv_warpgroups * kv_queries * STAT_BYTES, "ld"),
        Access("dK", "store", kv_elems * e, "fragment", FRAGMENT_ROW_BYTES),
        Access("dV", "store", kv_elems * e, "fragment", FRAGMENT_ROW_BYTES),
        # atomic: each item's dQ (its queries inside the problem, float32) added once, by TMA
        *((Access("dQ_acc", "atomic", kv_queries * d * STAT_BYTES, "tma"),) if dq_atomic
          else ()),
    )
    kv_fp32 = (kv_scores * DKDV_FLOPS_PER_SCORE
               + kv_visits * kv_consumer_threads * (kv_cols // 4) * LSE_LOG2_FLOPS_PER_ROW
               + kv_elems * SCALE_FLOPS_PER_ELEMENT)
    kv_smem = wgmma_bwd_smem_bytes("dkdv", d, kv_rows_per_program, kv_cols,
                                   dq_atomic=dq_atomic)
    kv_products = DKDV_PRODUCTS_PER_TILE + (1 if dq_atomic else 0)
    kv_kernel = KernelPlan(
        name=names["dkdv"], phase="bwd.main", grid=(n_blocks_k, B * Hkv), threads=kv_threads,
        shared_bytes=kv_smem, accesses=kv_accesses,
        matmuls=(Matmul(unit, kv_visits * kv_products * 2 * kv_cols
                        * kv_rows_per_program * d),),
        fp32_flops=int(kv_fp32), mufu_ops=int(kv_scores * DKDV_MUFU_PER_SCORE),
        # (atomic: and each item's dS^T and its float32 dQ, stored by the consumer threads)
        shared_bytes_moved=int(2 * _boxes_bytes(B * Hkv, Nk, d, e)
                               + kv_visits * 2 * kv_cols * d * e
                               + (kv_visits * kv_cols * (kv_rows_per_program * e
                                                         + d * STAT_BYTES)
                                  if dq_atomic else 0)),
        registers=_launch_registers(kv_rows_per_program, registers[1]),
        programs_per_slice=n_blocks_k, lockstep=_first_tiles_in_step(w, kv_tile, "q"),
        serial=serial(kv_rows_per_program), serial_per_program=True,
        group_waits=kv_visits * kv_warpgroups * wgmma_bwd_waits_per_tile("dkdv", kv_cols),
        waiters_per_program=kv_warpgroups, tile_work=kv_work, **order)

    q_bytes, kv_bytes = q_elems * e, kv_elems * e
    # the CSR schedules of the distinct slices: offsets per program and one index per tile, of
    # each kernel that reads one
    schedules = (((kv_stats, n_blocks_k),) if dq_atomic
                 else ((dq_stats, n_blocks_q), (kv_stats, n_blocks_k)))
    tensor_bytes = {"Q": q_bytes, "O": q_bytes, "dO": q_bytes, "dQ": q_bytes,
                    "lse": q_rows * STAT_BYTES, "delta": q_rows * STAT_BYTES,
                    "K": kv_bytes, "V": kv_bytes, "dK": kv_bytes, "dV": kv_bytes,
                    "schedule": SCHEDULE_ENTRY_BYTES * sum(
                        n_blocks + 1 + int(st.T) for stats, n_blocks in schedules
                        for _m, st, _bi in stats)}
    config = {"dq_tile": None if dq_atomic else dq_tile, "kv_tile": kv_tile,
              "launch_order": launch_order, "stages": WGMMA_BWD_STAGES, "dq_mode": dq_mode,
              "consumer_warpgroups": {"dkdv": kv_rows_per_program // ROWS_PER_WARPGROUP}}
    if dq_atomic:
        tensor_bytes["dQ_acc"] = q_elems * STAT_BYTES
        kernels = _atomic_dq_kernels(w, names, kv_kernel)
        config["dynamic_shared_bytes"] = {names["pre"]: 0, names["dkdv"]: kv_smem,
                                          names["convert"]: 0}
        config["dq_split"] = wgmma_bwd_dq_split(d, kv_rows_per_program, kv_cols)
    else:
        kernels = (dq_kernel, kv_kernel)
        config["consumer_warpgroups"]["dq"] = dq_rows // ROWS_PER_WARPGROUP
        config["dynamic_shared_bytes"] = {names["dq"]: dq_smem, names["dkdv"]: kv_smem}
    return Plan("wgmma", "bwd", w, kernels, config, tensor_bytes)


def wgmma_backward_configs(workload: Workload, serialised: bool = False) -> list:
    """The wgmma backward's tuning space for ``workload``: ``[{dq_tile, kv_tile}]`` (each
    (queries, keys)) whose kernels' dynamic shared memory fits the 227 KiB a block may opt in to
    on sm_90, less (unless ``serialised``) those whose kernels ptxas serialises
    (:data:`WGMMA_BWD_SERIALISED`: they run, pinned, but slower than every other tile; the plan
    has no price for a product that waits for the one before). Listed in `sim.plans.CONFIGS`:
    `sim.plans.choose` prices them and ``python -m benchmarks pick --family wgmma --pass bwd``
    times each through ``kernels.KernelConfig(family="wgmma", dq_tile=..., kv_tile=...)``."""
    d = workload.head_dim
    dq_tiles = [(r, c) for r in WGMMA_BWD_ROWS_CHOICES for c in WGMMA_BWD_COLS_CHOICES
                if wgmma_bwd_smem_bytes("dq", d, r, c) <= DYNAMIC_SMEM_LIMIT_BYTES
                and (serialised or ("dq", d, r, c) not in WGMMA_BWD_SERIALISED)]
    kv_tiles = [(c, r) for r in WGMMA_BWD_ROWS_CHOICES for c in WGMMA_BWD_COLS_CHOICES
                if wgmma_bwd_smem_bytes("dkdv", d, r, c) <= DYNAMIC_SMEM_LIMIT_BYTES
                and (serialised or ("dkdv", d, r, c) not in WGMMA_BWD_SERIALISED)]
    return [{"dq_tile": q, "kv_tile": k} for q in dq_tiles for k in kv_tiles]


def launch_of(plan: Plan, kernel: str) -> tuple[tuple, int, int]:
    """``(grid, threads, dynamic shared bytes)`` a launcher passes for ``kernel`` ("dq" or
    "dkdv"; with dQ by atomics "pre", "dkdv" and "convert") of a wgmma backward plan (all its
    shared memory is dynamic)."""
    launched = tuple(k for k, name in WGMMA_BWD_KERNEL_NAMES.items()
                     if name in plan.config["dynamic_shared_bytes"])
    if kernel not in launched:
        raise ValueError(f"kernel must be one of {launched} (dq_mode="
                         f"{plan.config['dq_mode']!r}), got {kernel!r}")
    name = WGMMA_BWD_KERNEL_NAMES[kernel]
    k = plan.kernel(name)
    return k.grid, k.threads, plan.config["dynamic_shared_bytes"][name]
