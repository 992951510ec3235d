"""The plans of the tensor-core backwards (`kernels.mma_bwd`: float16/bfloat16, `kernels.tf32_bwd`:
3xTF32 float32), and the layout facts their launchers read: default tiles, threads, shared
memory, which operands stay in registers.

Each backward with ``dq_mode="kernel"`` launches two kernels, in this order, and nothing else: delta = rowsum(dO * O) is
computed and written by the dQ kernel (no pre-pass), dK and dV of a GQA group are summed inside
the dK/dV kernel (no per-query-head buffers, no reduction kernel), every gradient is written once
in the input dtype (no float32 accumulator, no zero fill, no conversion kernel):

1. the **dQ kernel** (``flash_{mma,tf32}_bwd_dq``, phase ``bwd.dq``), grid
   (cdiv(Nq, rows), B * Hq), a warp per 16 query rows: Q, dO and O rows as mma fragments,
   delta written, the K/V tiles of `BlockInfo.kv_schedule()` by ``cp.async``; per tile
   S = Q K^T, dP = dO V^T, dQ += dS K;
2. the **dK/dV kernel** (``flash_{mma,tf32}_bwd_dkdv``, phase ``bwd.main``), grid
   (cdiv(Nk, key rows), B * Hkv), a warp per 16 key rows: over the query heads of its GQA group
   and the Q tiles of `BlockInfo.q_schedule()`, Q and dO by ``cp.async``, lse and delta staged;
   per tile S^T = K Q^T, dP^T = V dO^T, dV += (P^T Z) dO, dK += dS^T Q.

``dq_mode="atomic"`` (FlashAttention-2's structure; the default on sm_90 of the mma backward at
d = 128 and of the tf32 one at d = 64 and 128) launches instead a pre-pass
(``flash_{mma,tf32}_bwd_pre``, phase ``bwd.pre``: delta and the zeroed float32 dQ
accumulator), the dK/dV kernel with a fifth product per tile (dQ += dS K, added to the
accumulator by ``red`` atomics: ``"atomic"`` accesses) and its K tile by ``cp.async``, and a
conversion (``flash_{mma,tf32}_bwd_convert``, phase ``bwd.post``).

Tiles are given in (queries, keys) order for both kernels: ``dq_tile`` = (query rows per
program, keys per stage), ``kv_tile`` = (queries per stage, key rows per program). The kernels'
own order for the dK/dV kernel (``default_tiles()["dkdv"]``, the ptxas table's ``block_m x
block_n``) is (key rows, queries).

What the plans count, read from the kernels' code (the constants below name their lines):

* **Products on whole tiles.** The mma instructions multiply every row of a program and every
  key of a stage, padding included (tail rows read as zeros, tail keys zero-filled by the copy),
  so the executed FLOPs are 2 d rows keys per product per visited tile: three products per
  tile in the dQ kernel, four in the dK/dV kernel (seven matmul-sized passes in all; dQ by
  atomics: five in the dK/dV kernel and no dQ kernel). The tf32
  family runs each product as three ``mma.sync.m16n8k8`` tf32 (``mma3``: small x big,
  big x small, big x big): ``passes=3``.
* **Element-wise FP32 FLOPs** as Nsight Compute counts them (FFMA 2, FADD and FMUL 1; compares,
  selects, max and conversions 0) and **MUFU** operations (``ex2.approx``), per score of a
  visited tile (whole tiles: padding goes through ``ex2`` too), per row and per element, and for
  the tf32 family the operand splits (``ptx.split_tf32``: one ``sub.f32`` each), counted per
  thread that executes them: a B operand in shared memory is split by every warp that reads it;
  an A operand held in registers is split once, before the tile loop (the compiler hoists it).
  Left out: a few ``MUFU.RCP`` per thread of the integer divisions by runtime values
  (``bh // n_heads``, ``h // group``, the launch order's), and the mma dQ kernel's float16 ->
  float32 conversions of O and dO in its prologue (``HADD2.F32``, which Nsight Compute counts
  as half-precision adds: 2 d per row).
* **Bytes** per tensor and how they reach global memory: the rows a warp reads or writes as mma
  fragments move 16 bytes of a row per warp instruction (4 threads x 4 bytes: ``"fragment"``,
  counted as a 32-byte sector per 16 bytes by the L1 counters); tiles copied to shared memory
  by 16-byte ``cp.async`` count only the rows inside the problem (the copy zero-fills the others
  without reading); lse and delta are whole rows of 4-byte values (``"ld"``/``"st"``); the
  tf32 family re-reads the operands it does not keep in registers from global memory (where they
  stay in L1) at every k-step, which the L1 counters count every time; the tile schedules are
  read by every warp, one 4-byte entry (a whole sector) per load (``"schedule"``).
* **Overlap** (``KernelPlan.serial``): in the dQ and dK/dV kernels each warp's ``ldmatrix``
  reads, products and element-wise work follow one another (`sim.plan.SYNC_WARP_CHAIN`), and the
  programs resident on an SM overlap their chains (``serial_per_program``); the pre-pass and the
  conversion are memory passes, priced as their largest level.

The per-score, per-row and per-tile constants were held against the SASS that ptxas 13.0
makes for sm_90 of the default configurations (FFMA, FADD, FMUL, MUFU and LDG per loop body,
with and without dropout); the names below say which source line each comes from.

Which tiles are visited is `ioaware.block_info.BlockInfo`'s answer: `sim.counts.tile_stats_closed`
for dense, causal and windowed workloads, `sim.counts.tile_stats_blockinfo` per distinct block
mask slice (the workload's ``block_mask`` / ``block_density``, laid out on ``block_mask_tiles``
and refined to each kernel's tiles, as `kernels.tile_scheduler.refine_block_mask` does). A
boolean mask (``mask_shape``; a workload's ``key_lengths`` is the key-padding mask
``[B, 1, 1, Nk]``) skips no tile: every visited tile is masked element by element and one byte
is read per score that the causal rule and the window allow.
"""
from __future__ import annotations

import numpy as np

from ioaware.block_info import BlockInfo, band_offsets, cdiv

from ..counts import tile_stats_blockinfo, tile_stats_closed
from ..plan import SYNC_WARP_CHAIN, Access, KernelPlan, Matmul, Plan
from ..resources import shipped_registers
from ..workload import STAT_BYTES, Workload, density_block_mask

__all__ = ["mma_backward_plan", "tf32_backward_plan", "launch_of", "KERNEL_NAMES",
           "TILE_SIZES", "STATIC_SMEM_LIMIT_BYTES", "DYNAMIC_SMEM_LIMIT_BYTES", "backward_threads",
           "MMA_HEAD_DIMS", "MMA_PAD_HALVES", "mma_default_tiles", "mma_dq_smem_bytes",
           "mma_k_in_shared", "mma_dkdv_smem_bytes", "mma_dq_atomic_layout",
           "mma_dkdv_atomic_dynamic_smem_bytes", "DQ_ATOMIC_MAX_ACCUMULATORS",
           "mma_default_dq_mode", "red_adds_pairs", "ATOMIC_DQ_FROM_CC", "ATOMIC_DQ_HEAD_DIMS",
           "DQ_MODES",
           "TF32_HEAD_DIMS", "TF32_PAD_FLOATS", "TF32_DEFAULT_CONFIG", "tf32_default_config",
           "tf32_default_tiles", "tf32_dq_smem_bytes", "tf32_dkdv_smem_bytes",
           "tf32_operands_in_registers", "tf32_dkdv_dropout_config", "tf32_dq_dynamic_smem_bytes",
           "tf32_dkdv_dynamic_smem_bytes", "FRAGMENT_ROW_BYTES", "TF32_K_TILE_PAD_FLOATS",
           "TF32_DS_PAD_FLOATS", "TF32_DQ_ATOMIC_MAX_ACCUMULATORS", "tf32_dq_atomic_layout",
           "tf32_dkdv_atomic_dynamic_smem_bytes", "TF32_ATOMIC_DQ_HEAD_DIMS",
           "tf32_default_dq_mode"]

#: Kernel names as Nsight Compute lists them and the ptxas table keys them
#: (`benchmarks.common.KERNEL_NAMES`): (family, kernel) -> name.
KERNEL_NAMES = {("mma", "dq"): "flash_mma_bwd_dq", ("mma", "dkdv"): "flash_mma_bwd_dkdv",
                ("mma", "pre"): "flash_mma_bwd_pre", ("mma", "convert"): "flash_mma_bwd_convert",
                ("tf32", "dq"): "flash_tf32_bwd_dq", ("tf32", "dkdv"): "flash_tf32_bwd_dkdv",
                ("tf32", "pre"): "flash_tf32_bwd_pre", ("tf32", "convert"): "flash_tf32_bwd_convert"}

#: Tile sizes (rows or keys) the launchers choose from (`kernels.config.backward_tiles`: the
#: default, or the largest of these that divides a block mask's tile).
TILE_SIZES = (64, 32, 16)
#: ... and of the atomic-dQ backward's dK/dV kernel (dynamic shared memory: 128 key rows fit).
ATOMIC_TILE_SIZES = (128, 64, 32, 16)
#: Static shared memory a block may declare (``cuda.shared.array``), bytes.
STATIC_SMEM_LIMIT_BYTES = 48 * 1024
#: Dynamic shared memory a block may use with the opt-in on sm_90 (227 KiB), bytes.
DYNAMIC_SMEM_LIMIT_BYTES = 227 * 1024
#: Bytes of a row one warp instruction touches in an mma fragment: 4 threads x 4 bytes.
FRAGMENT_ROW_BYTES = 16
#: Threads holding one row of an mma fragment (a quad), each doing the row's bookkeeping.
THREADS_PER_ROW = 4
#: Rows (query rows of the dQ kernel, key rows of the dK/dV kernel) per warp.
ROWS_PER_WARP = 16
#: Warps (a query row each) per program of the atomic-dQ backward's pre-pass and conversion.
ROW_KERNEL_WARPS = 8


def backward_threads(rows: int) -> int:
    """Threads of one program of either kernel: a warp per 16 of its ``rows`` (query rows of the
    dQ kernel, key rows of the dK/dV kernel)."""
    return 32 * (rows // ROWS_PER_WARP)


# -- the mma backward (float16 / bfloat16): layout --------------------------------------------
MMA_HEAD_DIMS = (64, 128)
#: Halves of padding per shared row (16 bytes: conflict-free ``ldmatrix``).
MMA_PAD_HALVES = 8


def mma_default_tiles(head_dim: int) -> dict:
    """Default kernel tiles: ``dq`` = (query rows per block, keys per stage) of the dQ kernel,
    ``dkdv`` = (key rows per block, queries per stage) of the dK/dV kernel, ``dkdv_atomic``
    that of the dK/dV kernel that also adds dQ. 16 rows per warp; the stage sizes of the first
    two keep two buffers of two tiles within 48 KiB of static shared memory; the atomic kernel's
    shared memory is dynamic, and 128 queries per stage were faster than 64 at every benchmark
    shape measured (H100, float16, N 2048 and 8192: docs/kernels.md)."""
    if head_dim <= 64:
        return {"dq": (64, 64), "dkdv": (64, 64), "dkdv_atomic": (64, 128)}
    return {"dq": (64, 32), "dkdv": (64, 16), "dkdv_atomic": (128, 128)}


def mma_dq_smem_bytes(head_dim: int, block_k: int) -> int:
    """Shared memory of one dQ block: K and V, two buffers each, rows padded by 8 halves."""
    return 4 * block_k * (head_dim + MMA_PAD_HALVES) * 2


def mma_k_in_shared(head_dim: int) -> bool:
    """Whether the dK/dV kernel reads K from shared memory (d=128: K and V fragments plus the
    dK and dV accumulators in registers would spill) instead of holding its fragments."""
    return head_dim > 64


#: Most float32 dQ accumulators a thread of the atomic dK/dV kernel holds at once (beside its
#: dK and dV accumulators), per head dim: `mma_dq_atomic_layout` splits a warp's dQ columns into
#: passes so that each pass holds at most this many. At d = 64, 64 (one pass at the default
#: tiles) fit without spilling and were faster than 32 (two passes) in a one-off A/B run
#: (docs/kernels.md); at d = 128, 64 spill.
DQ_ATOMIC_MAX_ACCUMULATORS = {64: 64, 128: 32}


def mma_dq_atomic_layout(head_dim: int, block_q: int, block_k: int) -> tuple[int, int, int]:
    """How the atomic dK/dV kernel's warps share dQ = dS K of one visited tile (``block_q``
    queries x ``head_dim`` columns, summed over the block's ``block_k`` keys), once per tile
    after dS of all its queries is in shared memory: ``(warps_q, warps_d, column_passes)``.
    The block's ``block_k / 16`` warps form a ``warps_q x warps_d`` grid (two rows of warps
    where the warps and ``block_q / 16`` allow it), each warp owning ``block_q / warps_q``
    queries and ``head_dim / warps_d`` columns, which it computes in ``column_passes`` passes of
    at most `DQ_ATOMIC_MAX_ACCUMULATORS` (of its head dim) accumulators per thread (each pass
    re-reads its rows of dS). Raises ValueError naming ``kv_tile`` where a warp's columns are not a multiple of
    16 (the ``ldmatrix.trans`` B operand)."""
    warps = block_k // ROWS_PER_WARP
    warps_q = 2 if warps % 2 == 0 and block_q % (2 * ROWS_PER_WARP) == 0 else 1
    warps_d = warps // warps_q
    cols = head_dim // warps_d
    if head_dim % warps_d or cols % 16:
        raise ValueError(f"kv_tile=({block_q}, {block_k}): the atomic dK/dV kernel's {warps} "
                         f"warps split dQ's {head_dim} columns {warps_d} ways, not in multiples "
                         f"of 16; use fewer key rows")
    most = DQ_ATOMIC_MAX_ACCUMULATORS.get(head_dim, min(DQ_ATOMIC_MAX_ACCUMULATORS.values()))
    return warps_q, warps_d, _column_passes(block_q // warps_q, cols, 16, most, block_q, block_k)


def _column_passes(rows: int, cols: int, unit: int, most: int, block_q: int,
                   block_k: int) -> int:
    """The fewest passes in which a warp computes its ``rows`` x ``cols`` of dQ with at most
    ``most`` accumulators per thread, each pass a multiple of ``unit`` columns (the B operand's
    width). Raises ValueError naming ``kv_tile`` where ``unit`` columns at a time are too many."""
    passes = 1
    while rows * (cols // passes) // 32 > most or cols % (unit * passes):
        passes += 1
        if passes > cols // unit:
            raise ValueError(f"kv_tile=({block_q}, {block_k}): a warp's {rows} dQ rows need more "
                             f"than {most} accumulators per thread even "
                             f"{unit} columns at a time; use fewer queries per stage")
    return passes


def mma_dkdv_atomic_dynamic_smem_bytes(head_dim: int, block_q: int, block_k: int) -> int:
    """Dynamic shared memory of one dK/dV block of the atomic-dQ backward: Q and dO, two buffers
    each, the block's K tile (the B operand of dQ += dS K), and dS of the visited tile
    (``block_q`` rows of ``block_k`` + 8 halves); lse / delta of two stages stay static."""
    rows = 4 * block_q + block_k
    return (rows * (head_dim + MMA_PAD_HALVES) + block_q * (block_k + MMA_PAD_HALVES)) * 2


def mma_dkdv_smem_bytes(head_dim: int, block_q: int, block_k: int = 64) -> int:
    """Shared memory of one dK/dV block: Q and dO, two buffers each (and the K tile where
    `mma_k_in_shared`), rows padded by 8 halves, plus lse / delta of two stages."""
    rows = 4 * block_q + (block_k if mma_k_in_shared(head_dim) else 0)
    return rows * (head_dim + MMA_PAD_HALVES) * 2 + 16 * block_q


# -- the tf32 backward (3xTF32 float32): layout -----------------------------------------------
TF32_HEAD_DIMS = (64, 128)
#: Floats of padding per shared row: both access patterns conflict-free.
TF32_PAD_FLOATS = 4
#: Per head dim: ``dq`` = (query rows per block, keys per stage) of the dQ kernel, ``dkdv`` =
#: (key rows per block, queries per stage) of the dK/dV kernel, and ``unroll`` (k-steps per
#: iteration of the S / dP k-loops as written).
TF32_DEFAULT_CONFIG = {
    64: {"dq": (64, 32), "dkdv": (64, 32), "unroll": 1},
    128: {"dq": (64, 32), "dkdv": (64, 32), "unroll": 2},
}


def tf32_default_config(head_dim: int) -> dict:
    """The kernel configuration for ``head_dim`` (a copy): ``dq`` / ``dkdv`` tiles (16 rows
    per warp, four warps) and ``unroll``: the S = Q K^T and dP = dO V^T k-loops (and their
    transposes) are written as an outer loop over ``head_dim / 8 / unroll`` iterations of
    ``unroll`` k-steps each."""
    return dict(TF32_DEFAULT_CONFIG[64 if head_dim <= 64 else 128])


def tf32_default_tiles(head_dim: int) -> dict:
    """Default kernel tiles (`tf32_default_config`): ``dq`` = (query rows per block, keys per
    stage) of the dQ kernel, ``dkdv`` = (key rows per block, queries per stage) of the dK/dV
    kernel (``dkdv_atomic``: the same, for the dK/dV kernel that also adds dQ). 16 rows per warp,
    four warps; 32-row stages (d=64: static shared memory, 34816 / 35328 bytes; d=128: dynamic
    shared memory, 67584 / 68096 bytes)."""
    cfg = tf32_default_config(head_dim)
    return {"dq": cfg["dq"], "dkdv": cfg["dkdv"], "dkdv_atomic": cfg["dkdv"]}


def tf32_dq_smem_bytes(head_dim: int, block_k: int) -> int:
    """Shared memory of one dQ block: K and V, two buffers each, rows padded by 4 floats."""
    return 4 * block_k * (head_dim + TF32_PAD_FLOATS) * 4


def tf32_dkdv_smem_bytes(head_dim: int, block_q: int) -> int:
    """Shared memory of one dK/dV block: Q and dO as `tf32_dq_smem_bytes` lays out K and V, plus
    lse / delta of two stages (static)."""
    return tf32_dq_smem_bytes(head_dim, block_q) + 16 * block_q


#: Floats of padding per row of the atomic dK/dV kernel's K tile (the B operand of dQ += dS K,
#: read as K[key t][dim g], K[key t + 4][dim g]: conflict-free with rows 8 banks apart) and of
#: its dS tile (queries x keys: written as dS^T fragments, rows 2t apart, and read as A
#: fragments dS[query g][key t]: both conflict-free with rows 4 banks apart).
TF32_K_TILE_PAD_FLOATS = 8
TF32_DS_PAD_FLOATS = 4
#: Most float32 dQ accumulators a thread of the atomic 3xTF32 dK/dV kernel holds at once beside
#: its dK and dV accumulators (128 registers at d = 128): `tf32_dq_atomic_layout`.
TF32_DQ_ATOMIC_MAX_ACCUMULATORS = 32


def tf32_dq_atomic_layout(head_dim: int, block_q: int, block_k: int) -> tuple[int, int, int]:
    """How the atomic 3xTF32 dK/dV kernel's warps share dQ = dS K of one stage (``block_q``
    queries x ``head_dim`` columns, summed over the block's ``block_k`` keys), once per stage
    after dS of all its queries is in shared memory: ``(warps_q, warps_d, column_passes)`` as
    `mma_dq_atomic_layout` says; here every warp takes all the stage's queries
    (``warps_q`` = 1: each dS A fragment it loads serves ``head_dim / warps_d / 8`` products)
    and ``head_dim / warps`` columns, in passes of at most `TF32_DQ_ATOMIC_MAX_ACCUMULATORS`
    accumulators. Raises ValueError naming ``kv_tile`` where a warp's columns are not a
    multiple of 8."""
    warps = block_k // ROWS_PER_WARP
    cols = head_dim // warps
    if head_dim % warps or cols % 8 or block_q % ROWS_PER_WARP:
        raise ValueError(f"kv_tile=({block_q}, {block_k}): the atomic dK/dV kernel's {warps} "
                         f"warps split dQ's {head_dim} columns {warps} ways, not in multiples "
                         f"of 8 (or {block_q} queries are not a multiple of 16)")
    return 1, warps, _column_passes(block_q, cols, 8, TF32_DQ_ATOMIC_MAX_ACCUMULATORS, block_q,
                                    block_k)


def tf32_dkdv_atomic_dynamic_smem_bytes(head_dim: int, block_q: int, block_k: int) -> int:
    """Dynamic shared memory of one dK/dV block of the atomic-dQ 3xTF32 backward: Q and dO, two
    buffers each (as `tf32_dq_smem_bytes` lays them out), the block's K tile (rows padded by
    `TF32_K_TILE_PAD_FLOATS`) and dS of a stage (``block_q`` rows of ``block_k`` +
    `TF32_DS_PAD_FLOATS` floats); lse / delta of two stages stay static."""
    return (tf32_dq_smem_bytes(head_dim, block_q)
            + 4 * block_k * (head_dim + TF32_K_TILE_PAD_FLOATS)
            + 4 * block_q * (block_k + TF32_DS_PAD_FLOATS))


def tf32_dq_dynamic_smem_bytes(head_dim: int, block_k: int) -> int:
    """Dynamic shared memory the dQ kernel is launched with: its K/V buffers when they exceed
    the static limit (then declared ``cuda.shared.array(0)``), else 0 (static)."""
    total = tf32_dq_smem_bytes(head_dim, block_k)
    return total if total > STATIC_SMEM_LIMIT_BYTES else 0


def tf32_dkdv_dynamic_smem_bytes(head_dim: int, block_q: int) -> int:
    """Dynamic shared memory the dK/dV kernel is launched with: its Q/dO buffers when the
    block's shared memory exceeds the static limit, else 0; lse / delta stay static."""
    if tf32_dkdv_smem_bytes(head_dim, block_q) > STATIC_SMEM_LIMIT_BYTES:
        return tf32_dq_smem_bytes(head_dim, block_q)
    return 0


def tf32_operands_in_registers(kernel: str, head_dim: int) -> tuple[bool, bool]:
    """Which of a kernel's two A operands (Q and dO for ``kernel="dq"``, K and V for
    ``"dkdv"``) it keeps in registers as float32 fragments; the others are re-read from global
    memory, where the block's rows stay in L1, at every k-step. Chosen so that ptxas needs no
    local memory (``python -m benchmarks check``): the dQ kernel at d=64 holds both
    (accumulator 32 registers), the dK/dV kernel (dK and dV accumulators, 64 registers at d=64)
    and the dQ kernel at d=128 neither."""
    return (head_dim <= 64 and kernel == "dq",) * 2


def tf32_dkdv_dropout_config(head_dim: int, block_q: int, has_dropout: bool) -> dict:
    """Overrides of the dK/dV kernel's configuration for a call: with dropout at d=128 the
    default 32-query stages spilled when measured (the per-column dropout hashes, 16 more
    registers: 20-44 bytes of spill loads from ``ptxas -v``), so 16-query stages without
    unrolling (spill-free) are used; {} otherwise."""
    if has_dropout and head_dim == 128 and block_q > 16:
        return {"block_q": 16, "unroll": 1}
    return {}


# -- element-wise work, per the kernels' code --------------------------------------------------
#: dQ kernel, per score (``# -- P = exp2(S * scale * log2e - lse2), dS = P * (dP * Z - delta)``):
#: ``p = ptx.ex2(s_reg[e] * scale_log2 - lse2_r[r])`` is one FFMA and one MUFU ex2,
#: ``s_reg[e] = p * (dpv - delta_r[r])`` one FADD and one FMUL.
DQ_FLOPS_PER_SCORE = 4
DQ_MUFU_PER_SCORE = 1
#: ... with dropout, ``dpv = dpv * inv_keep if keep else float32(0.0)``: one FMUL (the keep
#: hash is integer arithmetic).
DQ_DROPOUT_FLOPS_PER_SCORE = 1
#: dK/dV kernel, per score (``# -- P^T = exp2(S^T * scale * log2e - lse2), Z from the dropout
#: hash``): ``p = ptx.ex2(st[e] * scale_log2 - rowv[col])`` one FFMA and one MUFU ex2,
#: ``dpt[e] = p * (dpt[e] * z - rowv[col + BQ])`` one FADD and one FMUL (without dropout
#: z = 1.0 and ``st[e] = p * z``, ``dpt[e] * z`` fold away).
DKDV_FLOPS_PER_SCORE = 4
DKDV_MUFU_PER_SCORE = 1
#: ... with dropout, ``st[e] = p * z`` is an FMUL and ``dpt[e] * z - delta`` an FFMA: 2 more.
DKDV_DROPOUT_FLOPS_PER_SCORE = 2
#: dQ kernel prologue (``delta = rowsum(dO * O)``), per element of a row inside the problem:
#: mma ``dsum[r & 1] += o2[0] * d2[0] + o2[1] * d2[1]`` (FMUL + FFMA + FADD per two elements),
#: tf32 ``dsum[r & 1] += dv * out[b, h, row, col]`` (one FFMA).
DELTA_FLOPS_PER_ELEMENT = 2
#: `kernels.softmax.dq_row_stats`, per row of a dQ program (padding rows too), per thread of
#: the row's quad: ``t += cuda.shfl_xor_sync(..., 1)``, ``t += cuda.shfl_xor_sync(..., 2)``.
DELTA_SHUFFLE_FLOPS_PER_ROW_THREAD = 2
#: `kernels.softmax.dq_row_stats`, per row inside the problem, per thread of its quad, and
#: `kernels.softmax.stage_rows`, per row of a staged Q tile inside the problem (one thread):
#: ``l2 = lv * float32(LOG2E)`` (skipped for a fully masked row, whose lse is -inf: counted).
LSE_LOG2_FLOPS_PER_ROW = 1
#: Epilogues, per element of a row inside the problem: dQ ``acc[...] * scale`` and dK
#: ``dk_acc[e] * scale`` (one FMUL each; dV is written unscaled).
SCALE_FLOPS_PER_ELEMENT = 1
#: tf32: ``ptx.split_tf32`` (``and.b32``, ``sub.f32``, ``add.u32``): one FADD (the integer and
#: and add are ALU work, not priced).
TF32_SPLIT_FLOPS = 1
#: The products of each kernel per visited tile: dQ kernel S = Q K^T, dP = dO V^T, dQ += dS K;
#: dK/dV kernel S^T = K Q^T, dP^T = V dO^T, dV += (P^T Z) dO, dK += dS^T Q.
DQ_PRODUCTS_PER_TILE = 3
DKDV_PRODUCTS_PER_TILE = 4
#: 3xTF32: three tf32 products per float32 one (``mma3``).
TF32_PASSES = 3


def tf32_dq_splits_per_tile(block_q: int, block_k: int, head_dim: int,
                            a_in_registers: bool) -> int:
    """Splits into big/small of one visited tile of the dQ kernel (``_rows_times_shared_rows``
    and ``_c_times_shared_b``): the K and V B operands of S and dP and the K operand of
    dQ += dS K once per element *per warp* (each warp splits the shared rows it reads), dS once
    per score (``p0 .. p3``), and the Q and dO A operands once per element of the program's rows
    (``a0 .. a3`` per k-step) where they are re-read from global memory. Where they stay in
    registers the compiler hoists their splits out of the tile loop (the SASS for sm_90 has them
    in the prologue): `tf32_a_splits_per_program`."""
    warps = block_q // ROWS_PER_WARP
    a_splits = 0 if a_in_registers else 2 * block_q * head_dim
    return a_splits + 3 * warps * block_k * head_dim + block_q * block_k


def tf32_dkdv_splits_per_tile(block_q: int, block_k: int, head_dim: int,
                              a_in_registers: bool, dq_atomic: bool = False) -> int:
    """Splits of one visited tile of the dK/dV kernel: the Q and dO B operands of S^T, dP^T, dV
    and dK once per element per warp, P^T Z and dS^T once per score, and the K and V A operands
    once per element of the program's key rows where they are re-read from global memory (at
    every tile: `tf32_operands_in_registers` keeps neither). With dQ by atomics
    (``_shared_a_times_shared_b``, `tf32_dq_atomic_layout`), dQ += dS K splits each warp's dS A
    fragments once per column pass and its K B fragments once per m-tile group: every warp
    splits its rows of dS (``block_q / warps_q`` x ``block_k``) per pass, and the block's K
    tile is split ``warps_q`` times."""
    warps = block_k // ROWS_PER_WARP
    a_splits = 0 if a_in_registers else 2 * block_k * head_dim
    splits = a_splits + 4 * warps * block_q * head_dim + 2 * block_q * block_k
    if dq_atomic:
        warps_q, warps_d, passes = tf32_dq_atomic_layout(head_dim, block_q, block_k)
        splits += warps * passes * (block_q // warps_q) * block_k + warps_q * block_k * head_dim
    return splits


def tf32_a_splits_per_program(rows: int, head_dim: int, a_in_registers: bool) -> int:
    """Splits of a program's two register-resident A operands (its ``rows`` x ``head_dim``
    fragments of Q and dO, or K and V), made once before the tile loop; 0 where they are
    re-read (and split) at every tile."""
    return 2 * rows * head_dim if a_in_registers else 0


#: The tile schedules (`kernels.tile_scheduler`) are read by every warp with warp-uniform 4-byte
#: loads (one sector each for the L1 counters). dQ kernel: ``offsets[s, m_blk]`` and
#: ``offsets[s, m_blk + 1]``, ``kv_index[start]`` before the loop, ``kv_index[it]`` and the
#: prefetch's ``kv_index[it + 1]`` per tile (not on the last): 2 + 2 T loads for T tiles.
DQ_SCHEDULE_LOADS_PER_PROGRAM = 2
DQ_SCHEDULE_LOADS_PER_TILE = 2
#: dK/dV kernel: the item count (``offsets[s, n_blk]`` and ``offsets[s, n_blk + 1]`` per query
#: head of the GQA group), the cursor's seeks (`kernels.tile_scheduler.gqa_cursor`: the same two
#: ``offsets`` per head it looks at; over a program's sweep it looks at each head of the group
#: once, fewer only under a block mask that leaves the group's last heads without work on the
#: tile) and one ``q_index`` per item: 4 g + n loads for n items and a group of g query heads.
DKDV_SCHEDULE_LOADS_PER_PROGRAM_PER_HEAD = 4
DKDV_SCHEDULE_LOADS_PER_TILE_PER_HEAD = 0
DKDV_SCHEDULE_LOADS_PER_TILE = 1
#: Bytes of one schedule entry (int32).
SCHEDULE_ENTRY_BYTES = 4


# -- visited tiles -----------------------------------------------------------------------------
def _band(w: Workload):
    """(lo, hi) of the workload's causal rule (top-left) and window (`band_offsets`)."""
    return band_offsets(w.seq_len_q, w.seq_len_k, w.causal, "top_left", w.window_size)


def _band_pairs(rows: np.ndarray, c0: int, c1: int, lo, hi) -> int:
    """(row, column) pairs with ``c0 <= column < c1`` that the band allows, over ``rows``."""
    first = np.full(rows.shape, c0, np.int64) if lo is None else np.maximum(c0, rows + lo)
    last = np.full(rows.shape, c1 - 1, np.int64) if hi is None else np.minimum(c1 - 1, rows + hi)
    return int(np.maximum(0, last - first + 1).sum())


def _refine(mask: np.ndarray, mask_tiles, tiles, seq_len_q: int, seq_len_k: int) -> np.ndarray:
    """A block mask on ``mask_tiles`` at the finer kernel ``tiles`` (as
    `kernels.tile_scheduler.refine_block_mask`): a kernel tile is visited iff its mask tile is."""
    iq = (np.arange(cdiv(seq_len_q, tiles[0])) * tiles[0]) // mask_tiles[0]
    ik = (np.arange(cdiv(seq_len_k, tiles[1])) * tiles[1]) // mask_tiles[1]
    return mask[iq][:, ik]


def _block_mask_slices(w: Workload, mask_tiles):
    """``[(multiplicity, 2-D mask on mask_tiles), ...]`` over the (batch, query head) slices, one
    entry per distinct mask; None without a block mask."""
    if w.block_mask is not None:
        bm = w.block_mask
        expected = (cdiv(w.seq_len_q, mask_tiles[0]), cdiv(w.seq_len_k, mask_tiles[1]))
        if bm.shape[2:] != expected:
            raise ValueError(f"workload.block_mask has {bm.shape[2:]} tiles but block_mask_tiles="
                             f"{tuple(mask_tiles)} give {expected}")
    elif w.block_density is not None:
        bm = density_block_mask(cdiv(w.seq_len_q, mask_tiles[0]), cdiv(w.seq_len_k, mask_tiles[1]),
                                w.block_density, w.block_mask_seed)[None, None]
    else:
        return None
    per_slice = (w.batch // bm.shape[0]) * (w.heads // bm.shape[1])
    groups: dict = {}
    for b in range(bm.shape[0]):
        for h in range(bm.shape[1]):
            key = bm[b, h].tobytes()
            if key not in groups:
                groups[key] = [0, np.asarray(bm[b, h], bool)]
            groups[key][0] += per_slice
    return [tuple(g) for g in groups.values()]


def _kernel_tiles_stats(w: Workload, tiles, mask_slices, mask_tiles):
    """``[(multiplicity, TileStats, BlockInfo or None), ...]`` of the (batch, query head) slices at
    kernel ``tiles`` = (queries, keys)."""
    if mask_slices is None:
        return [(w.batch * w.heads, tile_stats_closed(w.seq_len_q, w.seq_len_k, tiles[0], tiles[1],
                                                      w.causal, w.window_size), None)]
    out = []
    for mult, mask in mask_slices:
        bi = BlockInfo.with_block_mask(w.seq_len_q, w.seq_len_k, tiles[0], tiles[1], w.causal,
                                       _refine(mask, mask_tiles, tiles, w.seq_len_q, w.seq_len_k),
                                       window_size=w.window_size)
        out.append((mult, tile_stats_blockinfo(bi), bi))
    return out


def _first_tiles_in_step(w: Workload, tiles, which: str) -> bool:
    """Whether every program of a dense, causal or windowed slice starts at the same tile:
    ``which="kv"``: the first K/V tile of each Q tile's sweep (dQ kernel), ``"q"``: the first Q
    tile of each K/V tile's sweep (dK/dV kernel); programs that visit nothing are left out."""
    bi = BlockInfo(w.seq_len_q, w.seq_len_k, tiles[0], tiles[1], w.causal,
                   window_size=w.window_size)
    ranges = np.array([bi.k_block_range(m) for m in range(bi.n_blocks_q)], np.int64)
    visits = ranges[:, 1] > ranges[:, 0]
    lo, hi = ranges[visits, 0], ranges[visits, 1]
    if which == "kv":
        return len(set(lo.tolist())) <= 1
    # the visiting Q tiles' ranges are monotone in m: the first Q tile of K tile n is the first
    # range that ends past n (if it starts at or before n)
    n = np.arange(bi.n_blocks_k)
    first = np.searchsorted(hi, n, side="right")
    inside = first < len(hi)
    inside[inside] &= lo[first[inside]] <= n[inside]
    return len(set(first[inside].tolist())) <= 1


# -- registers ----------------------------------------------------------------------------------


def _registers(name: str, w: Workload, block_m: int, block_n: int, has_mask: bool,
               dq_atomic: bool = False):
    """Registers per thread of one kernel from the shipped ptxas table
    (`sim.resources.lookup`, keyed as ``python -m benchmarks resources`` writes it: the kernel's
    own tile ``block_m x block_n``, bfloat16 under float16's entry, which differs only in the mma
    and conversion instructions), None where the table has no such configuration (windowed,
    masked or dropout kernels are not in the shipped table). The table holds each
    configuration at its pass's default launch order; ``dq_atomic``: the dK/dV kernel that adds
    dQ by atomics (keyed apart)."""
    if w.window_size is not None:
        return None
    dtype = "fp16" if w.dtype == "bf16" else w.dtype
    extra = {"dq_atomic": True} if dq_atomic else {}
    return shipped_registers(name, w.head_dim, dtype, bool(w.causal), block_m=block_m,
                             block_n=block_n, mask=bool(has_mask), dropout=bool(w.dropout),
                             **extra)


# -- checks -------------------------------------------------------------------------------------
def _check_workload(family: str, w: Workload, dtypes, head_dims):
    if not isinstance(w, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(w).__name__}")
    if "bwd" not in w.passes:
        raise ValueError(f"the {family} backward plan needs a workload with pass_ 'bwd' or "
                         f"'fwd+bwd', got workload.pass_={w.pass_!r}")
    if w.dtype not in dtypes:
        raise ValueError(f"the {family} backward runs dtype {' or '.join(dtypes)}, got "
                         f"workload.dtype={w.dtype!r}")
    if w.head_dim not in head_dims:
        raise ValueError(f"the {family} backward runs head_dim in {head_dims}, got "
                         f"workload.head_dim={w.head_dim}")


def _check_tile(name: str, tile, sizes=TILE_SIZES) -> tuple[int, int]:
    ok = (isinstance(tile, (tuple, list)) and len(tile) == 2
          and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tile))
    if not ok or any(int(t) not in sizes for t in tile):
        raise ValueError(f"{name} must be a pair (queries, keys) of sizes in {sizes}, got "
                         f"{tile!r}")
    return int(tile[0]), int(tile[1])


def _check_smem(family: str, name: str, tile, need: int, limit: int, head_dim: int, kind: str):
    if need > limit:
        raise ValueError(f"{name}={tile} needs {need} bytes of shared memory per block at "
                         f"head_dim={head_dim}, more than the {limit} bytes of {kind} shared "
                         f"memory the {family} backward's kernels may use")


def _atomic_shared(family: str, head_dim: int, kv_tile, layout, dynamic_bytes):
    """``(shared, dynamic)`` bytes of an atomic-dQ backward's kernels at ``kv_tile``: its
    ``layout`` checked (ValueError naming ``kv_tile``), the dK/dV kernel's ``dynamic_bytes``
    plus its static lse / delta stages (16 bytes a query), within the dynamic limit; the
    pre-pass and conversion take none."""
    layout(head_dim, *kv_tile)
    dyn = dynamic_bytes(head_dim, *kv_tile)
    shared = {"dq": 0, "dkdv": dyn + 16 * kv_tile[0]}
    _check_smem(family, "kv_tile", kv_tile, shared["dkdv"], DYNAMIC_SMEM_LIMIT_BYTES, head_dim,
                "dynamic")
    return shared, {"pre": 0, "dkdv": dyn, "convert": 0}


def _check_mask_shape(w: Workload, mask_shape):
    """The boolean mask's shape ``(Bm, Hm, Mq, Nk)`` (a workload's key lengths: the key-padding
    mask ``(B, 1, 1, Nk)``), or None."""
    if mask_shape is None:
        return (w.batch, 1, 1, w.seq_len_k) if w.key_lengths is not None else None
    shape = tuple(int(s) for s in mask_shape)
    if (len(shape) != 4 or shape[0] not in (1, w.batch) or shape[1] not in (1, w.heads)
            or shape[2] not in (1, w.seq_len_q) or shape[3] != w.seq_len_k):
        raise ValueError(f"mask_shape must be (1|batch, 1|heads, 1|seq_len_q, seq_len_k) = "
                         f"(1|{w.batch}, 1|{w.heads}, 1|{w.seq_len_q}, {w.seq_len_k}), got "
                         f"{mask_shape!r}")
    return shape


def _check_mask_tiles(w: Workload, block_mask_tiles, kernel_tiles: dict):
    """The tiles the workload's block mask is laid out on (default: the dQ kernel's), which each
    kernel's tiles must divide; None without a block mask."""
    if w.block_mask is None and w.block_density is None:
        return None
    tiles = kernel_tiles["dq_tile"] if block_mask_tiles is None else tuple(block_mask_tiles)
    if len(tiles) != 2 or min(tiles) < 1:
        raise ValueError(f"block_mask_tiles must be a pair (queries, keys), got "
                         f"{block_mask_tiles!r}")
    for name, (tq, tk) in kernel_tiles.items():
        if tiles[0] % tq or tiles[1] % tk:
            raise ValueError(f"{name}={(tq, tk)} must divide block_mask_tiles={tiles} (a kernel "
                             f"tile lies inside one block-mask tile)")
    return tiles


# -- the plan -----------------------------------------------------------------------------------
def _backward(family: str, w: Workload, *, dq_tile, kv_tile, names, shared, dynamic, unit: str,
              passes: int, tf32: bool, k_in_shared: bool, operands_in_registers: dict,
              registers, launch_order, mask_shape, block_mask_tiles, extra_config: dict,
              dq_atomic: bool = False) -> Plan:
    """The two-kernel plan both families share (see the module docstring); ``tf32``: float32
    operands (``ld``/``st`` of single floats, re-reads where ``operands_in_registers`` says a
    kernel keeps none, operand splits)."""
    d, e = w.head_dim, w.dtype_bytes
    B, H, Hkv, Nq, Nk = w.batch, w.heads, w.heads_kv, w.seq_len_q, w.seq_len_k
    (dq_q, dq_k), (kv_q, kv_k) = dq_tile, kv_tile
    mask_tiles = _check_mask_tiles(w, block_mask_tiles, {"dq_tile": dq_tile, "kv_tile": kv_tile})
    mask_slices = _block_mask_slices(w, mask_tiles) if mask_tiles is not None else None
    mask_shape = _check_mask_shape(w, mask_shape)
    drop = 1 if w.dropout else 0
    lo, hi = _band(w)

    dq_stats = _kernel_tiles_stats(w, dq_tile, mask_slices, mask_tiles)
    kv_stats = _kernel_tiles_stats(w, kv_tile, mask_slices, mask_tiles)
    dq_visits = sum(m * int(st.T) for m, st, _ in dq_stats)        # visited tiles, all slices
    dq_keys = sum(m * int(st.C) for m, st, _ in dq_stats)          # keys copied per those tiles
    kv_visits = sum(m * int(st.T) for m, st, _ in kv_stats)
    kv_rows = sum(m * int(st.R) for m, st, _ in kv_stats)          # query rows copied and staged
    n_blocks_q, n_blocks_k = cdiv(Nq, dq_q), cdiv(Nk, kv_k)
    q_rows = B * H * Nq                                            # query rows in the problem
    q_padded_rows = B * H * n_blocks_q * dq_q                      # rows the dQ programs hold
    kv_keys = B * Hkv * Nk                                         # key rows in the problem
    dq_scores = dq_visits * dq_q * dq_k                            # scores on whole tiles
    kv_scores = kv_visits * kv_q * kv_k
    q_elems, kv_elems = q_rows * d, kv_keys * d

    # one byte of the boolean mask per score the band allows, in each kernel
    mask_reads = 0
    if mask_shape is not None:
        rows = np.arange(Nq, dtype=np.int64)
        for mult, _st, bi in dq_stats:
            if bi is None:
                mask_reads += mult * _band_pairs(rows, 0, Nk, lo, hi)
            else:
                for m, n in bi.tiles():
                    r0, r1 = bi.q_range(m)
                    mask_reads += mult * _band_pairs(rows[r0:r1], *bi.k_range(n), lo, hi)

    def mask_access(segment_bytes: int):
        """The mask reads of a kernel whose warp instruction reads ``segment_bytes`` of each of
        several mask rows (of one row, in whole sectors, for a mask broadcast over queries)."""
        if mask_shape is None:
            return ()
        if mask_shape[2] == 1:
            return (Access("mask", "load", mask_reads, "ld"),)
        return (Access("mask", "load", mask_reads, "fragment", segment_bytes),)

    # -- the dQ kernel ---------------------------------------------------------------------------
    q_in_regs, do_in_regs = operands_in_registers["dq"]
    # Q: prologue fragments where it stays in registers, else re-read at every k-step of every
    # visited tile (all rows of the program, tail rows clamped); dO: always once in the prologue
    # (delta), and re-read like Q where it does not stay in registers
    reread_bytes = dq_visits * dq_q * d * e
    q_load = q_elems * e if q_in_regs else reread_bytes
    do_load = q_elems * e + (0 if do_in_regs else reread_bytes)
    dq_warps = backward_threads(dq_q) // 32
    dq_schedule_loads = dq_warps * (B * H * n_blocks_q * DQ_SCHEDULE_LOADS_PER_PROGRAM
                                    + dq_visits * DQ_SCHEDULE_LOADS_PER_TILE)
    dq_accesses = (
        Access("Q", "load", q_load, "fragment", FRAGMENT_ROW_BYTES),
        Access("dO", "load", do_load, "fragment", FRAGMENT_ROW_BYTES),
        Access("O", "load", q_elems * e, "fragment", FRAGMENT_ROW_BYTES),
        Access("lse", "load", q_rows * STAT_BYTES, "ld"),
        Access("K", "load", dq_keys * d * e, "cp.async"),
        Access("V", "load", dq_keys * d * e, "cp.async"),
        *mask_access(4),       # 8 rows x 4 threads x 1 byte at stride 2 per instruction
        Access("schedule", "load", dq_schedule_loads * SCHEDULE_ENTRY_BYTES, "fragment",
               SCHEDULE_ENTRY_BYTES),
        Access("delta", "store", q_rows * STAT_BYTES, "st"),
        Access("dQ", "store", q_elems * e, "fragment", FRAGMENT_ROW_BYTES),
    )
    dq_fp32 = (dq_scores * (DQ_FLOPS_PER_SCORE + drop * DQ_DROPOUT_FLOPS_PER_SCORE)
               + q_elems * DELTA_FLOPS_PER_ELEMENT
               + q_padded_rows * THREADS_PER_ROW * DELTA_SHUFFLE_FLOPS_PER_ROW_THREAD
               + q_rows * THREADS_PER_ROW * LSE_LOG2_FLOPS_PER_ROW
               + q_elems * SCALE_FLOPS_PER_ELEMENT)
    if tf32:
        dq_fp32 += TF32_SPLIT_FLOPS * (
            dq_visits * tf32_dq_splits_per_tile(dq_q, dq_k, d, q_in_regs)
            + B * H * n_blocks_q * tf32_a_splits_per_program(dq_q, d, q_in_regs))
    dq_kernel = KernelPlan(
        name=names["dq"], phase="bwd.dq", grid=(n_blocks_q, B * H),
        threads=backward_threads(dq_q), shared_bytes=shared["dq"], accesses=dq_accesses,
        matmuls=(Matmul(unit, dq_visits * DQ_PRODUCTS_PER_TILE * 2 * dq_q * dq_k * d, passes),),
        fp32_flops=int(dq_fp32), mufu_ops=int(dq_scores * DQ_MUFU_PER_SCORE),
        registers=(registers[0] if registers is not None
                   else _registers(names["dq"], w, dq_q, dq_k, mask_shape is not None)),
        programs_per_slice=n_blocks_q, serial=SYNC_WARP_CHAIN, serial_per_program=True,
        lockstep=mask_slices is None and _first_tiles_in_step(w, dq_tile, "kv"),
        shared_bytes_moved=dq_shared_moved(dq_visits, dq_keys, dq_q, dq_k, d, e))

    # -- the dK/dV kernel ------------------------------------------------------------------------
    k_in_regs, v_in_regs = operands_in_registers["dkdv"]
    kv_reread = kv_visits * kv_k * d * e     # K or V rows of the program at every visited tile
    kv_warps, group = backward_threads(kv_k) // 32, w.group
    kv_schedule_loads = kv_warps * (
        B * Hkv * n_blocks_k * group * DKDV_SCHEDULE_LOADS_PER_PROGRAM_PER_HEAD
        + kv_visits * (group * DKDV_SCHEDULE_LOADS_PER_TILE_PER_HEAD
                       + DKDV_SCHEDULE_LOADS_PER_TILE))
    if tf32:      # (dQ by atomics: the block's K tile by cp.async too, for dQ += dS K)
        k_access = (Access("K", "load", kv_elems * e if k_in_regs else kv_reread, "fragment",
                           FRAGMENT_ROW_BYTES),)
        if dq_atomic:
            k_access += (Access("K", "load", kv_elems * e, "cp.async"),)
        v_access = Access("V", "load", kv_elems * e if v_in_regs else kv_reread, "fragment",
                          FRAGMENT_ROW_BYTES)
    else:      # K fragments once unless read from shared; its tile by cp.async where it is
        #        (for dQ += dS K too); V fragments once
        k_access = (() if k_in_shared
                    else (Access("K", "load", kv_elems * e, "fragment", FRAGMENT_ROW_BYTES),))
        if k_in_shared or dq_atomic:
            k_access += (Access("K", "load", kv_elems * e, "cp.async"),)
        v_access = Access("V", "load", kv_elems * e, "fragment", FRAGMENT_ROW_BYTES)
    # atomic: dQ += dS K of each visited tile's query rows inside the problem (float32)
    dq_red = ((Access("dQ_acc", "atomic", kv_rows * d * STAT_BYTES, "atomic"),) if dq_atomic
              else ())
    kv_accesses = (
        *k_access, v_access,
        Access("Q", "load", kv_rows * d * e, "cp.async"),
        Access("dO", "load", kv_rows * d * e, "cp.async"),
        Access("lse", "load", kv_rows * STAT_BYTES, "ld"),
        Access("delta", "load", kv_rows * STAT_BYTES, "ld"),
        *mask_access(8),       # 4 query rows x 8 keys of 1 byte per instruction
        Access("schedule", "load", kv_schedule_loads * SCHEDULE_ENTRY_BYTES, "fragment",
               SCHEDULE_ENTRY_BYTES),
        Access("dK", "store", kv_elems * e, "fragment", FRAGMENT_ROW_BYTES),
        Access("dV", "store", kv_elems * e, "fragment", FRAGMENT_ROW_BYTES),
        *dq_red,
    )
    kv_products = DKDV_PRODUCTS_PER_TILE + (1 if dq_atomic else 0)
    kv_fp32 = (kv_scores * (DKDV_FLOPS_PER_SCORE + drop * DKDV_DROPOUT_FLOPS_PER_SCORE)
               + kv_rows * LSE_LOG2_FLOPS_PER_ROW
               + kv_elems * SCALE_FLOPS_PER_ELEMENT)
    if tf32:
        kv_fp32 += TF32_SPLIT_FLOPS * (
            kv_visits * tf32_dkdv_splits_per_tile(kv_q, kv_k, d, k_in_regs, dq_atomic)
            + B * Hkv * n_blocks_k * tf32_a_splits_per_program(kv_k, d, k_in_regs))
    kv_kernel = KernelPlan(
        name=names["dkdv"], phase="bwd.main", grid=(n_blocks_k, B * Hkv),
        threads=backward_threads(kv_k), shared_bytes=shared["dkdv"], accesses=kv_accesses,
        matmuls=(Matmul(unit, kv_visits * kv_products * 2 * kv_q * kv_k * d, passes),),
        fp32_flops=int(kv_fp32), mufu_ops=int(kv_scores * DKDV_MUFU_PER_SCORE),
        registers=(registers[1] if registers is not None
                   else _registers(names["dkdv"], w, kv_k, kv_q, mask_shape is not None,
                                   dq_atomic)),
        programs_per_slice=n_blocks_k, serial=SYNC_WARP_CHAIN, serial_per_program=True,
        lockstep=mask_slices is None and _first_tiles_in_step(w, kv_tile, "q"),
        shared_bytes_moved=dkdv_shared_moved(
            kv_visits, kv_rows, kv_elems, kv_q, kv_k, d, e, k_in_shared or dq_atomic,
            k_in_shared, (tf32_dq_atomic_layout if tf32 else mma_dq_atomic_layout)
            if dq_atomic else None))

    q_bytes, kv_bytes = q_elems * e, kv_elems * e
    tensor_bytes = {"Q": q_bytes, "O": q_bytes, "dO": q_bytes, "dQ": q_bytes,
                    "lse": q_rows * STAT_BYTES, "delta": q_rows * STAT_BYTES,
                    "K": kv_bytes, "V": kv_bytes, "dK": kv_bytes, "dV": kv_bytes}
    kernels = (dq_kernel, kv_kernel)
    if dq_atomic:
        kernels = _atomic_dq_kernels(w, names, kv_kernel)
        tensor_bytes["dQ_acc"] = q_elems * STAT_BYTES
    # the CSR schedules of the distinct slices: offsets per program and one index per tile (dQ
    # by atomics: the dK/dV kernel's alone; no dQ kernel reads the other)
    schedules = ((kv_stats, n_blocks_k),) if dq_atomic else ((dq_stats, n_blocks_q),
                                                            (kv_stats, n_blocks_k))
    tensor_bytes["schedule"] = SCHEDULE_ENTRY_BYTES * sum(
        n_blocks + 1 + int(st.T) for stats, n_blocks in schedules for _m, st, _bi in stats)
    if mask_shape is not None:
        tensor_bytes["mask"] = int(np.prod(mask_shape))
    config = dict(extra_config, dq_tile=tuple(dq_tile), kv_tile=tuple(kv_tile),
                  launch_order=launch_order, mask_shape=mask_shape, block_mask_tiles=mask_tiles,
                  dynamic_shared_bytes={k.name: dynamic[key] for k, key in
                                        zip(kernels, ("pre", "dkdv", "convert") if dq_atomic
                                            else ("dq", "dkdv"))})
    return Plan(family, "bwd", w, kernels, config, tensor_bytes)


#: The atomic-dQ backward's pre-pass, per element of a row inside the problem:
#: ``acc += o2[0] * g2[0] + o2[1] * g2[1]`` (FMUL + FFMA + FADD per two elements), and per row
#: per lane of its warp the five-step shuffle reduction (one FADD each).
PREPASS_FLOPS_PER_ELEMENT = 2
PREPASS_SHUFFLE_FLOPS_PER_ROW_LANE = 5
#: The conversion, per element: ``dq_acc[...] * scale`` (one FMUL).
CONVERT_FLOPS_PER_ELEMENT = 1
#: ... and the bytes of each 32-byte sector one of its accumulator loads uses (lane l reads the
#: floats 2 l and 2 l + 1 in two instructions).
CONVERT_SEGMENT_BYTES = 16


def _atomic_dq_kernels(w: Workload, names: dict, kv_kernel: KernelPlan) -> tuple:
    """(pre-pass, dK/dV, conversion) of the atomic-dQ backward: a warp per query row, lanes
    along the head dim. The pre-pass reads O and dO (a 32-bit word of two halves, or a float, a
    lane: whole rows), writes the zeroed float32 accumulator (one float a lane: whole rows) and
    delta (lane 0 alone: a 4-byte store, a whole sector for the L1 counters); the half
    conversion reads the accumulator as ``dq_acc[..., col]`` and ``dq_acc[..., col + 1]``, two
    4-byte loads a lane at an 8-byte stride (16 bytes of each 32-byte sector an instruction
    touches) and writes dQ (a word of two halves a lane: whole rows); the float32 one reads and
    writes a float a lane (whole rows)."""
    d, e = w.head_dim, w.dtype_bytes
    q_rows = w.batch * w.heads * w.seq_len_q
    q_elems = q_rows * d
    grid = (cdiv(w.seq_len_q, ROW_KERNEL_WARPS), w.batch * w.heads)
    threads = 32 * ROW_KERNEL_WARPS
    pre = KernelPlan(
        name=names["pre"], phase="bwd.pre", grid=grid, threads=threads, shared_bytes=0,
        accesses=(Access("O", "load", q_elems * e, "ld"), Access("dO", "load", q_elems * e, "ld"),
                  Access("delta", "store", q_rows * STAT_BYTES, "fragment", STAT_BYTES),
                  Access("dQ_acc", "store", q_elems * STAT_BYTES, "st")),
        matmuls=(), fp32_flops=int(q_elems * PREPASS_FLOPS_PER_ELEMENT
                                   + q_rows * 32 * PREPASS_SHUFFLE_FLOPS_PER_ROW_LANE),
        mufu_ops=0, registers=None, programs_per_slice=grid[0])
    # float32 (3xTF32): a float a lane a pass, whole rows
    acc_load = (Access("dQ_acc", "load", q_elems * STAT_BYTES, "ld") if w.dtype == "fp32" else
                Access("dQ_acc", "load", q_elems * STAT_BYTES, "fragment", CONVERT_SEGMENT_BYTES))
    convert = KernelPlan(
        name=names["convert"], phase="bwd.post", grid=grid, threads=threads, shared_bytes=0,
        accesses=(acc_load, Access("dQ", "store", q_elems * e, "st")),
        matmuls=(), fp32_flops=int(q_elems * CONVERT_FLOPS_PER_ELEMENT), mufu_ops=0,
        registers=None, programs_per_slice=grid[0])
    return pre, kv_kernel, convert


def dq_shared_moved(visits: int, keys: int, block_q: int, block_k: int, d: int, e: int) -> int:
    """Shared-memory bytes a dQ kernel moves (the forward's convention: bytes landed by
    ``cp.async`` and bytes each warp reads; ``e`` bytes an element: 2 mma, 4 tf32): per visited
    tile K and V land (the ``keys`` copied, summed over tiles), and every warp reads K and V
    whole for S and dP (``ldmatrix``; tf32: 32-bit B-fragment loads) and K again for dQ += dS K."""
    warps = block_q // ROWS_PER_WARP
    return 2 * keys * d * e + visits * warps * 3 * block_k * d * e


def dkdv_shared_moved(visits: int, rows: int, kv_elems: int, block_q: int, block_k: int, d: int,
                      e: int, k_tile: bool, k_reread: bool, dq_atomic_layout=None) -> int:
    """Shared-memory bytes a dK/dV kernel moves (``e`` bytes an element): per visited tile Q and
    dO land (the ``rows`` copied) with their lse and delta (8 bytes a row); every warp reads Q
    twice (S^T, dK) and dO twice (dP^T, dV), whole tiles, its own 16 K rows at every 16-query
    step where the mma kernel re-reads K's fragments from shared memory (``k_reread``), and lse
    and delta once per score (``rowv``); the block's K tile lands once (``k_tile``). With dQ by
    atomics (``dq_atomic_layout``: `mma_dq_atomic_layout` or `tf32_dq_atomic_layout`), each
    warp stores its dS (the block's ``block_q`` x ``block_k`` per tile) and, once per tile,
    reads its rows of dS (``block_q`` x ``block_k`` over the block's warps, once per column pass
    and per column of warps) and its columns of K (once per row of warps)."""
    warps = block_k // ROWS_PER_WARP
    tile = block_q * d * e
    moved = 2 * rows * d * e + rows * 8 + visits * (warps * (4 * tile + (tile if k_reread else 0))
                                                      + block_q * block_k * 8)
    if k_tile:
        moved += kv_elems * e
    if dq_atomic_layout is not None:
        warps_q, warps_d, passes = dq_atomic_layout(d, block_q, block_k)
        moved += visits * (block_q * block_k * e + warps_d * passes * block_q * block_k * e
                           + warps_q * block_k * d * e)
    return int(moved)


def _check_registers(registers):
    if registers is None:
        return None
    if len(registers) != 2 or any(r is not None and int(r) < 1 for r in registers):
        raise ValueError(f"registers must be (dQ kernel, dK/dV kernel) registers per thread, got "
                         f"{registers!r}")
    return tuple(None if r is None else int(r) for r in registers)


#: How a tensor-core backward computes dQ: "kernel" (its own dQ kernel, no atomics) or "atomic"
#: (FlashAttention-2's structure: the dK/dV kernel adds dS K into a float32 accumulator).
DQ_MODES = ("kernel", "atomic")
#: The compute capability from which dQ by atomics is the default (`mma_default_dq_mode`):
#: where ``red.global.add.v2.f32`` adds two floats per instruction. With one float per
#: instruction (before sm_90) it was slower than the dQ kernel (docs/kernels.md).
ATOMIC_DQ_FROM_CC = (9, 0)
#: The head dims at which dQ by atomics is the default there. At d = 64 the dQ kernel's structure
#: was faster at 13 of 16 benchmark shapes on an H100 (its dQ kernel holds 164 registers, three
#: blocks an SM; the atomic dK/dV kernel 241-251, two), at d = 128 the atomic one at all 16
#: (``python -m benchmarks tune --show-backward-dq results/tune_backward_dq_h100_2026-11-25.json``;
#: docs/kernels.md).
ATOMIC_DQ_HEAD_DIMS = (128,)


def mma_default_dq_mode(compute_capability, deterministic: bool = False, *,
                        head_dim: int) -> str:
    """The dQ mode the mma backward runs by default on a GPU of ``compute_capability``
    ((major, minor); None: unknown) at ``head_dim``: "atomic" from `ATOMIC_DQ_FROM_CC` on at the
    head dims of `ATOMIC_DQ_HEAD_DIMS` (measured faster: ``python -m benchmarks tune
    --backward-dq``), "kernel" at other head dims, before it, where it is unknown, and under
    ``deterministic`` algorithms (atomics add in a varying order). The launcher
    (`kernels.mma_bwd.dq_mode`) and ``python -m sim plan`` both ask this rule."""
    if deterministic or head_dim not in ATOMIC_DQ_HEAD_DIMS:
        return "kernel"
    return "atomic" if red_adds_pairs(compute_capability) else "kernel"


#: The head dims at which the 3xTF32 backward adds dQ by atomics by default (from
#: `ATOMIC_DQ_FROM_CC` on): `tf32_default_dq_mode`. On an H100 atomics were faster at all 12
#: shapes measured, 1.30-1.41x at d = 128 and 1.15-1.28x at d = 64 (the backward alone; ``python
#: -m benchmarks tune --backward-dq --dtype fp32``; its printout of 2026-11-28 is in
#: ``results/gpu_checks_h100_2026-11-25.log``).
TF32_ATOMIC_DQ_HEAD_DIMS = (64, 128)


def tf32_default_dq_mode(compute_capability, deterministic: bool = False, *,
                         head_dim: int) -> str:
    """The dQ mode the 3xTF32 backward runs by default, as `mma_default_dq_mode` rules with
    `TF32_ATOMIC_DQ_HEAD_DIMS`; the launcher (`kernels.tf32_bwd.dq_mode`) asks this rule."""
    if deterministic or head_dim not in TF32_ATOMIC_DQ_HEAD_DIMS:
        return "kernel"
    return "atomic" if red_adds_pairs(compute_capability) else "kernel"


def red_adds_pairs(compute_capability) -> bool:
    """Whether a GPU of ``compute_capability`` ((major, minor); None: unknown) adds two floats
    per ``red`` (``red.global.add.v2.f32``: `ATOMIC_DQ_FROM_CC` on), the width the atomic dK/dV
    kernel's dQ additions take there, and the reason its dQ mode is the default there."""
    return compute_capability is not None and tuple(compute_capability) >= ATOMIC_DQ_FROM_CC


def mma_backward_plan(workload: Workload, *, dq_tile=None, kv_tile=None, launch_order=None,
                      mask_shape=None, block_mask_tiles=None, registers=None,
                      dq_mode="kernel") -> Plan:
    """The plan of `kernels.mma_bwd` for ``workload`` (float16 or bfloat16, d 64 or 128).

    ``dq_tile`` = (query rows per program, keys per stage) of the dQ kernel, ``kv_tile`` =
    (queries per stage, key rows per program) of the dK/dV kernel, sizes of `TILE_SIZES` within
    48 KiB of static shared memory (None: `mma_default_tiles`). ``mask_shape``: the boolean
    mask's ``(Bm, Hm, Mq, Nk)`` (None: none, or the key-padding mask of ``workload.key_lengths``);
    ``block_mask_tiles``: the (queries, keys) tiles ``workload.block_mask`` / ``block_density``
    is laid out on (None: ``dq_tile``); ``registers``: (dQ, dK/dV) registers per thread (None:
    the shipped ptxas table's, where it has the configuration). ``launch_order`` is recorded in
    the plan's config (it changes the order programs run, not what they do). ``dq_mode``: one of
    `DQ_MODES`; "atomic" launches a pre-pass (delta, zeroed float32 dQ accumulator), the dK/dV
    kernel with dQ += dS K by ``red.global.add.f32`` (its K tile in shared memory, dynamic
    shared memory; ``kv_tile`` default `mma_default_tiles`' ``dkdv_atomic``) and a conversion;
    ``dq_tile`` is then unused. Raises ValueError naming the argument for what the family
    cannot launch."""
    w = workload
    _check_workload("mma", w, ("fp16", "bf16"), MMA_HEAD_DIMS)
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    atomic = dq_mode == "atomic"
    d = w.head_dim
    defaults = mma_default_tiles(d)
    dq_tile = _check_tile("dq_tile", defaults["dq"] if dq_tile is None else dq_tile)
    kv_default = defaults["dkdv_atomic" if atomic else "dkdv"][::-1]
    kv_tile = _check_tile("kv_tile", kv_default if kv_tile is None else kv_tile,
                          ATOMIC_TILE_SIZES if atomic else TILE_SIZES)
    if atomic:
        shared, dynamic = _atomic_shared("mma", d, kv_tile, mma_dq_atomic_layout,
                                         mma_dkdv_atomic_dynamic_smem_bytes)
    else:
        shared = {"dq": mma_dq_smem_bytes(d, dq_tile[1]),
                  "dkdv": mma_dkdv_smem_bytes(d, kv_tile[0], kv_tile[1])}
        _check_smem("mma", "dq_tile", dq_tile, shared["dq"], STATIC_SMEM_LIMIT_BYTES, d, "static")
        _check_smem("mma", "kv_tile", kv_tile, shared["dkdv"], STATIC_SMEM_LIMIT_BYTES, d,
                    "static")
        dynamic = {"dq": 0, "dkdv": 0}                       # static shared memory only
    names = {k: KERNEL_NAMES[("mma", k)] for k in ("dq", "dkdv", "pre", "convert")}
    return _backward("mma", w, dq_tile=dq_tile, kv_tile=kv_tile, names=names, shared=shared,
                     dynamic=dynamic,
                     unit="mma.bf16" if w.dtype == "bf16" else "mma.f16", passes=1, tf32=False,
                     k_in_shared=mma_k_in_shared(d),
                     operands_in_registers={"dq": (True, True),
                                            "dkdv": (not mma_k_in_shared(d), True)},
                     registers=_check_registers(registers), launch_order=launch_order,
                     mask_shape=mask_shape, block_mask_tiles=block_mask_tiles,
                     extra_config={"dq_mode": dq_mode} if atomic else {}, dq_atomic=atomic)


def tf32_backward_plan(workload: Workload, *, dq_tile=None, kv_tile=None, launch_order=None,
                       mask_shape=None, block_mask_tiles=None, registers=None,
                       dq_mode="kernel") -> Plan:
    """The plan of `kernels.tf32_bwd` (3xTF32) for ``workload`` (float32, d 64 or 128); the
    arguments as `mma_backward_plan`'s (defaults `tf32_default_tiles`; up to 227 KiB of shared
    memory, dynamic above 48 KiB). With dropout at d=128 the dK/dV kernel runs 16-query stages
    whatever ``kv_tile`` asks (`tf32_dkdv_dropout_config`, as the launcher does); the plan's
    config holds the tiles and k-loop unrolling it launches. ``dq_mode`` "atomic": a pre-pass,
    the dK/dV kernel with dQ += dS K once per stage by ``red`` atomics (its K tile and dS in
    dynamic shared memory: `tf32_dkdv_atomic_dynamic_smem_bytes`, `tf32_dq_atomic_layout`) and
    a conversion; ``dq_tile`` is then unused."""
    w = workload
    _check_workload("tf32", w, ("fp32",), TF32_HEAD_DIMS)
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    atomic = dq_mode == "atomic"
    d = w.head_dim
    cfg = tf32_default_config(d)
    dq_tile = _check_tile("dq_tile", cfg["dq"] if dq_tile is None else dq_tile)
    kv_tile = _check_tile("kv_tile", cfg["dkdv"][::-1] if kv_tile is None else kv_tile)
    override = tf32_dkdv_dropout_config(d, kv_tile[0], w.dropout)
    kv_tile = (override.get("block_q", kv_tile[0]), kv_tile[1])
    k_steps = d // 8
    unroll = {"dq": cfg["unroll"], "dkdv": override.get("unroll", cfg["unroll"])}
    unroll = {k: u if k_steps % u == 0 else 1 for k, u in unroll.items()}   # as the kernels take it
    if atomic:
        shared, dynamic = _atomic_shared("tf32", d, kv_tile, tf32_dq_atomic_layout,
                                         tf32_dkdv_atomic_dynamic_smem_bytes)
        unroll = {"dkdv": unroll["dkdv"]}
    else:
        shared = {"dq": tf32_dq_smem_bytes(d, dq_tile[1]),
                  "dkdv": tf32_dkdv_smem_bytes(d, kv_tile[0])}
        _check_smem("tf32", "dq_tile", dq_tile, shared["dq"], DYNAMIC_SMEM_LIMIT_BYTES, d,
                    "dynamic")
        _check_smem("tf32", "kv_tile", kv_tile, shared["dkdv"], DYNAMIC_SMEM_LIMIT_BYTES, d,
                    "dynamic")
        dynamic = {"dq": tf32_dq_dynamic_smem_bytes(d, dq_tile[1]),
                   "dkdv": tf32_dkdv_dynamic_smem_bytes(d, kv_tile[0])}
    names = {k: KERNEL_NAMES[("tf32", k)] for k in ("dq", "dkdv", "pre", "convert")}
    extra = {"unroll": unroll, **({"dq_mode": dq_mode} if atomic else {})}
    return _backward("tf32", w, dq_tile=dq_tile, kv_tile=kv_tile, names=names, shared=shared,
                     dynamic=dynamic, unit="mma.tf32", passes=TF32_PASSES, tf32=True,
                     k_in_shared=False,
                     operands_in_registers={k: tf32_operands_in_registers(k, d)
                                            for k in ("dq", "dkdv")},
                     registers=_check_registers(registers), launch_order=launch_order,
                     mask_shape=mask_shape, block_mask_tiles=block_mask_tiles,
                     extra_config=extra, dq_atomic=atomic)


def launch_of(plan: Plan, kernel: str) -> tuple[tuple, int, int]:
    """``(grid, threads, dynamic shared bytes)`` a launcher passes for kernel ``"dq"``,
    ``"dkdv"`` (or, dQ by atomics, ``"pre"`` and ``"convert"``) of a backward plan (static
    shared memory is the kernel's own declaration)."""
    name = KERNEL_NAMES[(plan.family, kernel)]
    k = plan.kernel(name)
    return k.grid, k.threads, plan.config["dynamic_shared_bytes"][name]
