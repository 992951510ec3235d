"""The plans of the CUDA-core ("simt") family (`kernels.simt_fwd`, `kernels.simt_bwd`), and the
layout facts their launchers read: default tiles and micro-tiles, threads, static shared memory.

Both passes stage every operand as float32 in static shared memory (rows padded to d + 1
floats) and compute with FFMA on the CUDA cores; each thread owns a ``tm x tn`` register
micro-tile of a ``block_m x block_n`` score tile (`sim.tiles.TileConfig`): the forward puts Q
rows on m and keys on n, the dK/dV kernel keys on m and Q rows on n. ``ntn = block_n / tn``
threads share a score row (its row group).

What each pass launches, in order (with torch arrays, as `ioaware.attention` and the benchmarks
run them; ``arrays="numpy"``: NumPy arrays copied to the device):

* forward: ``flash_fwd_v2``, grid (cdiv(Nq, block_q), B * Hq), heaviest causal tiles first,
  the K/V tiles of `BlockInfo.kv_schedule()`;
* backward: ``flash_bwd_delta_v2`` (delta = rowsum(dO * O), a warp per row, grid
  (cdiv(Nq, 8), B * Hq), 256 threads); the zero fill of the float32 dQ accumulator
  (``torch.zeros``: PyTorch's fill kernel; NumPy: a host copy, no kernel); ``flash_bwd_dkdv_v2``
  (grid (cdiv(Nk, block_k), B * Hkv): one program per K tile of a KV head, looping over the
  query heads of its GQA group and the Q tiles of `BlockInfo.q_schedule()`, dK and dV summed over
  the group in registers and written once: no reduction kernel; dQ added to the accumulator by
  float32 atomics); for float16 the accumulator's conversion to dQ (torch ``.to``: PyTorch's copy
  kernel; NumPy: ``cast4``); float32 returns the accumulator itself.
* bfloat16 (torch only; Numba has no bfloat16 arrays): every bfloat16 input is converted to
  float32 first (``.float()``) and every output back (``.to(bfloat16)``), by PyTorch's copy
  kernel: 3 + 1 launches around the forward, 5 + 3 around the backward.

What the plans count, read from the kernels' code (``kernels/simt_fwd.py``,
``kernels/simt_bwd.py``; the constants below name their lines):

* **Products** (`sim.plan.Matmul` ``"ffma"``): S = Q K^T and O += P V on whole tiles (threads
  past the sequence end multiply the zero padding): 2 d block_q block_k FLOPs each per visited
  tile; the dK/dV kernel's S^T, dP^T, dV and dK likewise (four products), and dQ += dS K only
  for the tile's rows inside the problem (the atomic loop's ``row0 + r < seqlen_q``).
* **Element-wise FP32 FLOPs** as Nsight Compute counts them (FFMA 2, FADD and FMUL 1; max,
  compares, selects, conversions and integer work 0) and **MUFU** operations. ``math.exp`` is
  libdevice ``__nv_expf``: four FFMA, one FADD, one FMUL around ``ex2.approx.ftz`` (10 FLOPs,
  one MUFU.EX2); ``math.log`` is libdevice ``__nv_logf``, a polynomial (11 FFMA, one FADD, two
  FMUL = 25 FLOPs, no MUFU); ``1.0 / x`` is ``rcp.rn.f32`` (MUFU.RCP refined by two FFMA and an
  FADD = 5 FLOPs, as ptxas expands it; the tensor-core plans count it so) -- read from the PTX
  NVVM makes of them (``numba.cuda.compile_ptx``, cc 9.0; ``expf``'s ``cvt.sat`` folds into its
  first FFMA). An accumulator started at 0.0 costs an FFMA/FADD per step like the others
  (0.0 + x is not folded without fast-math).
* **Bytes**: every load and store of a tile is one element per thread, consecutive threads on
  consecutive columns (whole rows: ``"ld"``/``"st"``), except the stores of a thread's own
  output columns (``tx + ntn c``): a warp instruction writes ``ntn`` elements of a row
  (``"fragment"`` with ``segment_bytes = ntn x element bytes``, a whole 32-byte sector counted
  below 32); the logsumexp (one thread per row group) and delta (lane 0 of a row's warp) stores
  likewise; the tile schedules (int32 CSR: two offsets per program and head, one index per
  visited tile) are read by every warp at one address (a sector each); dQ's float32 atomics
  are one 4-byte element per thread. PyTorch's vectorized copy reads a float32 source 8
  elements a thread (a 32-byte vector, issued as two 16-byte loads: each warp instruction
  touches 16 bytes of every sector) and writes 16 bytes a thread.
* **Shared memory** moved: `sim.smem.tile_smem_elems` (the thread-level loads and stores of the
  loops, warp-shuffle reductions not counted).

Which tiles are visited is `ioaware.block_info.BlockInfo`'s answer (`sim.counts.workload_tile_stats`);
the dK/dV kernel's ``exp`` runs only on the scores its mask allows (the bounds, the causal
rule, the band of a window: `BlockInfo.band`), counted per row by interval arithmetic.
Not modelled: a boolean mask's loads (`kernels.host.plan_workload` leaves the mask out of
the workload), and dropout's FLOPs are counted as if every score were kept (the kernels scale only
the kept ones).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..counts import workload_tile_stats
from ..plan import Access, KernelPlan, Matmul, Plan
from ..resources import shipped_registers
from ..smem import tile_smem_elems
from ..tiles import TileConfig, choose_tiles
from ..workload import SECTOR_BYTES, SMEM_ELEM_BYTES, STAT_BYTES, Workload, block_infos

__all__ = ["simt_forward_plan", "simt_backward_plan", "simt_forward_configs",
           "simt_backward_configs", "default_blocks", "default_micro_tile", "forward_tile_config",
           "dkdv_tile_config", "fwd_smem_bytes", "fwd_kernel_smem_bytes", "dkdv_smem_bytes",
           "FWD_TILES", "STATIC_SMEM_LIMIT_BYTES", "FLOAT32_BYTES", "MAX_HEAD_DIM", "GPU_TARGET_THREADS", "SIMULATOR_TARGET_THREADS",
           "DELTA_ROWS", "DELTA_THREADS", "CAST_THREADS", "BLOCK_CHOICES", "record_is_current",
           "record_config", "FWD_KERNEL", "DELTA_KERNEL", "DKDV_KERNEL", "CAST_KERNEL"]

# -- layout facts (the launchers import these) ----------------------------------------------------
FLOAT32_BYTES = 4
#: Static shared memory a block may use (``cuda.shared.array``), bytes.
STATIC_SMEM_LIMIT_BYTES = 48 * 1024
#: Largest head dim the CUDA-core kernels take.
MAX_HEAD_DIM = 256
#: Threads per block the tile split aims at on a GPU and under Numba's CUDA simulator.
GPU_TARGET_THREADS = 128
SIMULATOR_TARGET_THREADS = 16
#: The delta pre-pass: rows (one warp each) per program (``DELTA_ROWS`` in kernels/simt_bwd.py).
DELTA_ROWS = 8
DELTA_THREADS = 32 * DELTA_ROWS
#: ``cast4`` (NumPy float16 dQ): threads per program, one element each.
CAST_THREADS = 256
#: Tile sizes the configuration lists offer (`simt_forward_configs`, `simt_backward_configs`).
BLOCK_CHOICES = (128, 64, 32, 16, 8)

#: Kernel names as the launchers compile them and Nsight Compute lists them.
FWD_KERNEL = "flash_fwd_v2"
DELTA_KERNEL = "flash_bwd_delta_v2"
DKDV_KERNEL = "flash_bwd_dkdv_v2"
CAST_KERNEL = "cast4"

# Default (block_q, block_k) of the CUDA-core kernels per head dim, chosen to fit 48 KiB of
# static shared memory and, for d = 64 and 128, by a block-size sweep (docs/kernels.md).
_FWD_DEFAULT = ((32, (64, 64)), (64, (64, 32)), (128, (32, 16)), (256, (16, 8)))
#: Per-thread micro-tile (tm, tn) of the forward where the sweep picked one, keyed by
#: (head_dim, block_q, block_k) (else `choose_tiles`).
FWD_TILES = {(64, 64, 32): (8, 4), (128, 32, 16): (4, 2)}
_BWD_DEFAULT = ((32, (32, 32)), (64, (32, 32)), (128, (16, 16)), (256, (8, 8)))
_SIM_DEFAULT = (16, 16)


def default_blocks(head_dim: int, backward: bool, simulator: bool = False) -> tuple[int, int]:
    """Default (block_q, block_k) of the CUDA-core kernels for a head dim (float32 arithmetic,
    so independent of the dtype); 16 x 16 under the CUDA simulator."""
    if simulator:
        return _SIM_DEFAULT
    for dmax, blocks in (_BWD_DEFAULT if backward else _FWD_DEFAULT):
        if head_dim <= dmax:
            return blocks
    raise ValueError(f"head_dim must be <= {MAX_HEAD_DIM}, got {head_dim}")


def default_micro_tile(head_dim: int, block_q: int, block_k: int,
                       target_threads: int = GPU_TARGET_THREADS) -> tuple[int, int]:
    """The forward's micro-tile (tm, tn): the tuned one of `FWD_TILES` on a GPU, else
    `choose_tiles` over ``target_threads``."""
    if target_threads == GPU_TARGET_THREADS and (head_dim, block_q, block_k) in FWD_TILES:
        return FWD_TILES[(head_dim, block_q, block_k)]
    c = choose_tiles(block_q, block_k, head_dim, target_threads)
    return c.tm, c.tn


def fwd_smem_bytes(cfg: TileConfig, head_dim: int) -> int:
    """Static shared memory of the forward kernel: Q, K, V tiles (rows padded to d+1), P, and
    the row-reduction scratch (``q_s``, ``k_s``, ``v_s``, ``p_s``, ``red_s``)."""
    d1 = head_dim + 1
    floats = (cfg.block_m * d1 + 2 * cfg.block_n * d1 + cfg.block_m * (cfg.block_n + cfg.ntn)
              + cfg.block_m * cfg.ntn)
    return FLOAT32_BYTES * floats


def fwd_kernel_smem_bytes(cfg: TileConfig, head_dim: int, shuffle: bool) -> int:
    """Static shared memory the compiled forward holds: `fwd_smem_bytes` less the
    row-reduction scratch ``red_s`` when it reduces rows by warp shuffles (``shuffle``: on a GPU
    with a multiple of 32 threads), where ptxas drops the unused array (the ptxas table's
    ``static_smem_bytes`` agree)."""
    return fwd_smem_bytes(cfg, head_dim) - (FLOAT32_BYTES * cfg.block_m * cfg.ntn if shuffle else 0)


def dkdv_smem_bytes(cfg: TileConfig, head_dim: int) -> int:
    """dK/dV kernel (m = K rows, n = Q rows): K, V, Q, dO tiles, P^T, dS^T, lse and delta."""
    d1 = head_dim + 1
    return FLOAT32_BYTES * (2 * cfg.block_m * d1 + 2 * cfg.block_n * d1
                            + 2 * cfg.block_m * (cfg.block_n + cfg.ntn) + 2 * cfg.block_n)


# -- element-wise work, per the kernels' code ------------------------------------------------------
#: ``math.exp`` (libdevice expf): 4 FFMA + FADD + FMUL, one MUFU.EX2.
EXP_FLOPS = 10
EXP_MUFU = 1
#: ``math.log`` (libdevice logf): 11 FFMA + FADD + 2 FMUL, no MUFU.
LOG_FLOPS = 25
#: ``float32(1.0) / x`` (rcp.rn.f32): MUFU.RCP, 2 FFMA + FADD.
RCP_FLOPS = 5
RCP_MUFU = 1

# forward (kernels/simt_fwd.py, make_forward_kernel)
#: "load the Q tile, pre-multiplied by the softmax scale": ``float32(qh[..]) * sm_scale``, one
#: FMUL per element of a row inside the problem.
FWD_Q_SCALE_FLOPS_PER_ELEMENT = 1
#: "update m_i and l_i": per score ``p = math.exp(s[i, j] - m_use)`` (FADD + exp) and
#: ``rs += p`` (FADD).
FWD_FLOPS_PER_SCORE = 1 + EXP_FLOPS + 1
FWD_MUFU_PER_SCORE = EXP_MUFU
#: ... per row per thread of its row group: ``alpha = math.exp(m_i[i] - m_use)`` (FADD + exp),
#: ``l_i[i] = l_i[i] * alpha + rs`` (FFMA); beside it ``acc[i, c] *= alpha``, d FMUL per row.
FWD_FLOPS_PER_ROW_THREAD_TILE = 1 + EXP_FLOPS + 2
FWD_MUFU_PER_ROW_THREAD_TILE = EXP_MUFU
FWD_RESCALE_FLOPS_PER_ELEMENT = 1
#: "dropout on P": ``s[i, j] *= keep_scale`` per kept score (counted for every score).
FWD_DROPOUT_FLOPS_PER_SCORE = 1
#: "reduce the partial row sums": ``ls += shfl_xor`` log2(ntn) FADD per row and thread (the
#: shuffle path, threads a multiple of 32); else through shared memory, ntn FADD
#: (``ls += red_s[..]`` from 0.0).
#: Per row inside the problem, per thread of its row group, when it has an allowed key:
#: ``inv = 1.0 / ls`` (rcp) and ``row_lse = m_i[i] + math.log(ls)`` (FADD + log);
#: per row inside the problem ``acc[i, c] * inv``, d FMUL.
FWD_FLOPS_PER_ROW_THREAD_END = RCP_FLOPS + 1 + LOG_FLOPS
FWD_MUFU_PER_ROW_THREAD_END = RCP_MUFU
FWD_NORMALISE_FLOPS_PER_ELEMENT = 1
#: "sched = ...; t0 = kv_off[..]; t1 = kv_off[..]" per program, ``kv_idx[t]`` per tile; each a
#: load of one int32 by every warp.
SCHEDULE_INDEX_BYTES = 4
SCHEDULE_LOADS_PER_PROGRAM_HEAD = 2
SCHEDULE_LOADS_PER_TILE = 1

# backward: delta pre-pass (kernels/simt_bwd.py, make_delta_kernel)
#: ``acc += float32(out[..]) * float32(dout[..])``: one FFMA per element of a row inside the
#: problem; then ``acc += shfl_xor_sync`` for off = 16, 8, 4, 2, 1: 5 FADD per lane of every
#: row of a program (rows past the end too).
DELTA_FLOPS_PER_ELEMENT = 2
DELTA_SHUFFLE_FADDS_PER_LANE = 5

# backward: dK/dV kernel (kernels/simt_bwd.py, make_dkdv_kernel)
#: "p, dropout, ds": for an allowed score ``p = math.exp(s[i, j] * sm_scale - lse_j)`` (FFMA +
#: exp); for every score of the tile ``p * (dpz - delta_j)`` (FADD + FMUL).
DKDV_FLOPS_PER_ALLOWED_SCORE = 2 + EXP_FLOPS
DKDV_MUFU_PER_ALLOWED_SCORE = EXP_MUFU
DKDV_FLOPS_PER_SCORE = 2
#: dropout: ``dpz *= keep_scale``, ``pz *= keep_scale`` per kept score (counted for every score).
DKDV_DROPOUT_FLOPS_PER_SCORE = 2
#: "dq += scale * dS K (atomics)": per element of a tile row inside the problem, block_k FFMA
#: (a product, `Matmul`) and ``acc * sm_scale`` (FMUL).
DKDV_DQ_SCALE_FLOPS_PER_ELEMENT = 1
#: "write dK, dV once": ``dk_acc[i, c] * sm_scale`` per element of a key row inside the problem.
DKDV_DK_SCALE_FLOPS_PER_ELEMENT = 1

# PyTorch's vectorized elementwise kernels (ATen/native/cuda/CUDALoops.cuh, thread_constants.h):
# 128 threads, 8 elements per thread, grid cdiv(numel, 1024); a float32 source is read as one
# 32-byte vector per thread (two 16-byte loads).
TORCH_THREADS = 128
TORCH_ELEMENTS_PER_THREAD = 8
TORCH_WIDEST_LOAD_BYTES = 16

_DTYPES = ("fp16", "bf16", "fp32")
_ARRAYS = ("torch", "numpy")


def record_is_current(rec: dict) -> bool:
    """Whether a results record of the simt family ran today's kernels: False when it names an
    earlier configuration (``dq_mode`` "kernel", ``delta_kernel`` "thread") or its
    ``ncu_kernels`` name an earlier kernel (forward ``flash_fwd`` before ``flash_fwd_v2``;
    ``flash_bwd_delta``, ``flash_bwd_dkdv`` or a separate ``flash_bwd_dq`` kernel), else True
    (also when it names no kernel: no counters)."""
    from ..model import (SIMT_DKDV_KERNEL, SIMT_FWD_KERNEL, _ncu_names, kernel_version,
                         record_delta_kernel, record_dq_mode)
    if record_dq_mode(rec) not in (None, "atomic") or record_delta_kernel(rec) not in (None, "warp"):
        return False
    if not _ncu_names(rec):
        return True
    if rec.get("pass") == "fwd":
        return kernel_version(rec, "flash_fwd", SIMT_FWD_KERNEL) == SIMT_FWD_KERNEL
    return kernel_version(rec, "flash_bwd_dkdv", SIMT_DKDV_KERNEL) == SIMT_DKDV_KERNEL


def record_config(rec: dict, pass_: str) -> dict:
    """The configuration a simt record names for its pass ``pass_``: ``block_q`` / ``block_k``
    and the micro-tile as `sim.model.record_micro_tiles` reads it (the record's ``micro_tile``
    for the forward, else `choose_tiles` over 128 threads, what the launches of records made
    before the micro-tile was recorded used; the dK/dV kernel's likewise). Nothing is read from
    its measurements."""
    from ..model import record_micro_tiles
    tile, tile_kv = record_micro_tiles(dict(rec, variant="simt", **{"pass": pass_}))
    config = {"block_q": rec.get("block_q"), "block_k": rec.get("block_k")}
    if pass_ == "fwd":
        return dict(config, micro_tile=tile)
    return dict(config, micro_tile_kv=tile_kv)


def _check_workload(w: Workload, what: str) -> None:
    if not isinstance(w, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(w).__name__}")
    if w.dtype not in _DTYPES:
        raise ValueError(f"the simt {what} runs dtype in {_DTYPES}, got workload.dtype={w.dtype!r}")
    if w.head_dim > MAX_HEAD_DIM:
        raise ValueError(f"the simt {what} runs head_dim <= {MAX_HEAD_DIM}, got "
                         f"workload.head_dim={w.head_dim}")


def _check_block(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    return int(value)


def _tile_config(name: str, tile, block_m: int, block_n: int, head_dim: int) -> TileConfig:
    """``TileConfig(block_m, block_n, *tile)``, validated; errors name ``name``."""
    try:
        tm, tn = (int(t) for t in tile)
        cfg = TileConfig(block_m, block_n, tm, tn)
        cfg.validate(head_dim)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}={tile!r} does not split the {block_m} x {block_n} tile at "
                         f"head_dim={head_dim}: {exc}") from None
    return cfg


def forward_tile_config(w: Workload, block_q=None, block_k=None, micro_tile=None) -> TileConfig:
    """The forward's `TileConfig` (Q rows x keys) for ``w``: the given tiles, else the family's
    defaults (`default_blocks`, `default_micro_tile`); ValueError naming the argument when they
    cannot run (a split the kernel refuses, static shared memory over 48 KiB)."""
    _check_workload(w, "forward")
    dq, dk = default_blocks(w.head_dim, False)
    bq = _check_block("block_q", dq if block_q is None else block_q)
    bk = _check_block("block_k", dk if block_k is None else block_k)
    tile = default_micro_tile(w.head_dim, bq, bk) if micro_tile is None else micro_tile
    cfg = _tile_config("micro_tile", tile, bq, bk, w.head_dim)
    smem = fwd_smem_bytes(cfg, w.head_dim)
    if smem > STATIC_SMEM_LIMIT_BYTES:
        raise ValueError(f"block_q={bq}, block_k={bk} at head_dim={w.head_dim} need {smem} bytes of "
                         f"static shared memory, over {STATIC_SMEM_LIMIT_BYTES}")
    return cfg


def dkdv_tile_config(w: Workload, block_q=None, block_k=None, micro_tile_kv=None) -> TileConfig:
    """The dK/dV kernel's `TileConfig` (keys x Q rows) for ``w``: the given tiles, else the
    family's defaults (`default_blocks`; the micro-tile `choose_tiles` over 128 threads)."""
    _check_workload(w, "backward")
    dq, dk = default_blocks(w.head_dim, True)
    bq = _check_block("block_q", dq if block_q is None else block_q)
    bk = _check_block("block_k", dk if block_k is None else block_k)
    if micro_tile_kv is None:
        c = choose_tiles(bk, bq, w.head_dim, GPU_TARGET_THREADS)
        micro_tile_kv = (c.tm, c.tn)
    cfg = _tile_config("micro_tile_kv", micro_tile_kv, bk, bq, w.head_dim)
    smem = dkdv_smem_bytes(cfg, w.head_dim)
    if smem > STATIC_SMEM_LIMIT_BYTES:
        raise ValueError(f"block_q={bq}, block_k={bk} at head_dim={w.head_dim} need {smem} bytes of "
                         f"static shared memory in the dK/dV kernel, over {STATIC_SMEM_LIMIT_BYTES}")
    return cfg


def _kernel_dtype(w: Workload) -> str:
    """The dtype the Numba kernels are compiled for: bfloat16 is staged as float32."""
    return "fp16" if w.dtype == "fp16" else "fp32"


def _segment(nbytes: int) -> tuple[str, int | None]:
    """``(how, segment_bytes)`` of a store whose warp instruction writes ``nbytes`` of a row."""
    return ("fragment", nbytes) if nbytes < SECTOR_BYTES else ("st", None)


def _runs(blocks) -> list:
    """Contiguous runs ``[(first, stop)]`` of sorted block indices."""
    out = []
    for n in blocks:
        if out and out[-1][1] == n:
            out[-1][1] = n + 1
        else:
            out.append([n, n + 1])
    return out


@lru_cache(maxsize=256)
def _band_counts(bi, key_len) -> tuple[int, int]:
    """``(allowed scores on whole Q tiles, rows with an allowed key)`` of one slice: the scores
    of the visited tiles whose key is inside the problem and inside `BlockInfo.band` (the
    kernels' ``ok``), every row of a Q tile counted (the padding rows too: the kernels test no
    row bound there); a key-padding length limits the keys of the rows inside the problem (the
    mask is read only for them)."""
    bq, bk, nq_rows, nk = bi.block_q, bi.block_k, bi.seqlen_q, bi.seqlen_k
    lo, hi = bi.band
    nq = bi.n_blocks_q
    if bi.block_mask is None:
        m = np.arange(nq)
        r0 = m * bq
        r1 = np.minimum(r0 + bq, nq_rows)
        first = np.zeros(nq, np.int64) if lo is None else np.maximum(0, r0 + lo)
        last = np.full(nq, nk - 1, np.int64) if hi is None else np.minimum(nk - 1, r1 - 1 + hi)
        empty = last < first
        c0 = np.where(empty, 0, (first // bk) * bk)
        c1 = np.where(empty, 0, np.minimum((last // bk + 1) * bk, nk))
        runs = [(c0[:, None], c1[:, None])]
        rows = r0[:, None] + np.arange(bq)[None, :]
    else:
        rows_list, c0s, c1s = [], [], []
        for mm in range(nq):
            for a, b in _runs(bi.k_blocks(mm)):
                rows_list.append(mm * bq + np.arange(bq))
                c0s.append(a * bk)
                c1s.append(min(b * bk, nk))
        if not rows_list:
            return 0, 0
        rows = np.stack(rows_list)
        runs = [(np.array(c0s)[:, None], np.array(c1s)[:, None])]
    allowed = np.zeros(rows.shape, np.int64)
    for c0, c1 in runs:
        c1 = np.broadcast_to(c1, rows.shape)
        if key_len is not None:
            c1 = np.where(rows < nq_rows, np.minimum(c1, key_len), c1)
        a = np.broadcast_to(c0, rows.shape) if lo is None else np.maximum(c0, rows + lo)
        b = c1 if hi is None else np.minimum(c1, rows + hi + 1)
        allowed += np.maximum(b - a, 0)
    inside = rows < nq_rows
    if bi.block_mask is None:
        return int(allowed.sum()), int(((allowed > 0) & inside).sum())
    per_row: dict = {}
    for r, n in zip(rows[inside].ravel(), allowed[inside].ravel()):
        per_row[int(r)] = per_row.get(int(r), 0) + int(n)
    return int(allowed.sum()), sum(1 for n in per_row.values() if n > 0)


def _band_totals(w: Workload, block_q: int, block_k: int) -> tuple[int, int]:
    """`_band_counts` summed over every (batch, head) slice."""
    allowed = rows = 0
    for mult, bi, key_len, _slices in block_infos(w, block_q, block_k):
        a, r = _band_counts(bi, key_len)
        allowed += mult * a
        rows += mult * r
    return allowed, rows


def _tile_sums(w: Workload, block_q: int, block_k: int) -> tuple[int, int, int]:
    """``(visited tiles, their query rows inside the problem, their keys inside it)``, summed
    over every (batch, query head) slice."""
    groups = workload_tile_stats(w, block_q, block_k)
    return (sum(m * int(st.T) for m, st in groups), sum(m * int(st.R) for m, st in groups),
            sum(m * int(st.C) for m, st in groups))


def _torch_copy(name: str, phase: str, numel: int, src_bytes: int, dst_bytes: int,
                src: str, dst: str) -> KernelPlan:
    """PyTorch's vectorized copy (a dtype conversion) of ``numel`` elements, ``src`` -> ``dst``."""
    load_seg = min(TORCH_ELEMENTS_PER_THREAD * src_bytes, TORCH_WIDEST_LOAD_BYTES)
    how = "fragment" if TORCH_ELEMENTS_PER_THREAD * src_bytes > TORCH_WIDEST_LOAD_BYTES else "ld"
    grid = (-(-numel // (TORCH_THREADS * TORCH_ELEMENTS_PER_THREAD)),)
    return KernelPlan(name=name, phase=phase, grid=grid, threads=TORCH_THREADS, shared_bytes=0,
                      accesses=(Access(src, "load", numel * src_bytes, how,
                                       load_seg if how == "fragment" else None),
                                Access(dst, "store", numel * dst_bytes, "st")))


def simt_forward_plan(workload: Workload, *, block_q: int | None = None, block_k: int | None = None,
                      micro_tile=None, registers: int | None = None, arrays: str = "torch") -> Plan:
    """The plan of `kernels.simt_fwd` for ``workload`` (float16, bfloat16 or float32, d <= 256)
    at ``block_q x block_k`` with the per-thread ``micro_tile`` (tm, tn) (None: the family's
    defaults, `default_blocks` and `default_micro_tile`). ``registers``: of the forward kernel
    per thread (None: the shipped ptxas table's, if it has the configuration). ``arrays``:
    "torch" or "numpy" (which kernels surround it: bfloat16 conversions, torch only)."""
    w = workload
    if arrays not in _ARRAYS:
        raise ValueError(f"arrays must be one of {_ARRAYS}, got arrays={arrays!r}")
    if w.dtype == "bf16" and arrays != "torch":
        raise ValueError("bfloat16 runs with torch arrays only (arrays='torch')")
    cfg = forward_tile_config(w, block_q, block_k, micro_tile)
    bq, bk, d, ntn = cfg.block_m, cfg.block_n, w.head_dim, cfg.ntn
    e = w.dtype_bytes
    e_k = 4 if w.dtype == "bf16" else e              # what the kernel reads and writes
    threads = cfg.threads
    warps = -(-threads // 32)
    slices = w.batch * w.heads
    n_blocks_q = -(-w.seq_len_q // bq)
    programs = n_blocks_q * slices
    rows = slices * w.seq_len_q
    padded_rows = programs * bq
    tiles, _tile_rows, keys = _tile_sums(w, bq, bk)
    scores = tiles * bq * bk
    _allowed, rows_with_keys = _band_totals(w, bq, bk)
    use_shfl = threads % 32 == 0
    reduce_fadds = ntn.bit_length() - 1 if use_shfl else ntn

    fp32 = (rows * d * FWD_Q_SCALE_FLOPS_PER_ELEMENT
            + scores * (FWD_FLOPS_PER_SCORE + (FWD_DROPOUT_FLOPS_PER_SCORE if w.dropout else 0))
            + tiles * bq * (ntn * FWD_FLOPS_PER_ROW_THREAD_TILE + d * FWD_RESCALE_FLOPS_PER_ELEMENT)
            + padded_rows * ntn * reduce_fadds
            + rows_with_keys * ntn * FWD_FLOPS_PER_ROW_THREAD_END
            + rows * d * FWD_NORMALISE_FLOPS_PER_ELEMENT)
    mufu = (scores * FWD_MUFU_PER_SCORE + tiles * bq * ntn * FWD_MUFU_PER_ROW_THREAD_TILE
            + rows_with_keys * ntn * FWD_MUFU_PER_ROW_THREAD_END)
    o_how, o_seg = _segment(ntn * e_k)
    lse_how, lse_seg = _segment(STAT_BYTES * (min(32, threads) // ntn))
    schedule_loads = (programs * SCHEDULE_LOADS_PER_PROGRAM_HEAD + tiles * SCHEDULE_LOADS_PER_TILE) * warps
    accesses = (
        Access("Q", "load", rows * d * e_k),
        Access("K", "load", keys * d * e_k),
        Access("V", "load", keys * d * e_k),
        Access("O", "store", rows * d * e_k, o_how, o_seg),
        Access("lse", "store", rows * STAT_BYTES, lse_how, lse_seg),
        Access("schedule", "load", schedule_loads * SCHEDULE_INDEX_BYTES, "fragment",
               SCHEDULE_INDEX_BYTES),
    )
    smem = tile_smem_elems("fwd", bq, bk, d, (cfg.tm, cfg.tn))
    shared_moved = SMEM_ELEM_BYTES * (tiles * (smem["tile_loads"] + smem["tile_stores"])
                                      + programs * smem["program_stores"])
    if registers is None:
        registers = shipped_registers(FWD_KERNEL, d, _kernel_dtype(w), bool(w.causal),
                                      block_m=bq, block_n=bk, tile=(cfg.tm, cfg.tn))
    kernel = KernelPlan(
        name=FWD_KERNEL, phase="fwd", grid=(n_blocks_q, slices), threads=threads,
        shared_bytes=fwd_kernel_smem_bytes(cfg, d, use_shfl), accesses=accesses,
        matmuls=(Matmul("ffma", tiles * 4 * d * bq * bk),), fp32_flops=int(fp32),
        mufu_ops=int(mufu), shared_bytes_moved=int(shared_moved), registers=registers,
        programs_per_slice=n_blocks_q,
        lockstep=not (w.window_size is not None or w.block_sparse))
    kv_elems = w.batch * w.heads_kv * w.seq_len_k * d
    kernels = [kernel]
    tensor_bytes = {"Q": rows * d * e_k, "O": rows * d * e_k, "lse": rows * STAT_BYTES,
                    "K": kv_elems * e_k, "V": kv_elems * e_k,
                    "schedule": (n_blocks_q + 1 + tiles // max(1, slices)) * SCHEDULE_INDEX_BYTES}
    if w.dtype == "bf16":   # staged: inputs to float32 first, O back to bfloat16 after
        staged = {t: t + "32" for t in ("Q", "K", "V", "O")}
        pre = [_torch_copy(f"torch copy bf16->fp32 ({t})", "fwd.pre", n, 2, 4, t, t + "32")
               for t, n in (("Q", rows * d), ("K", kv_elems), ("V", kv_elems))]
        post = [_torch_copy("torch copy fp32->bf16 (O)", "fwd.post", rows * d, 4, 2, "O32", "O")]
        kernels = pre + [_rename(kernel, staged)] + post
        for t in staged:
            tensor_bytes[t + "32"] = tensor_bytes[t]
            tensor_bytes[t] = tensor_bytes[t] // 2
    return Plan("simt", "fwd", w, tuple(kernels),
                {"block_q": bq, "block_k": bk, "micro_tile": (cfg.tm, cfg.tn), "arrays": arrays},
                tensor_bytes)


def _rename(kernel: KernelPlan, names: dict) -> KernelPlan:
    """``kernel`` with its accesses' tensors renamed (the staged float32 copies)."""
    import dataclasses
    return dataclasses.replace(kernel, accesses=tuple(
        dataclasses.replace(a, tensor=names.get(a.tensor, a.tensor)) for a in kernel.accesses))


def simt_backward_plan(workload: Workload, *, block_q: int | None = None, block_k: int | None = None,
                       micro_tile_kv=None, registers: int | None = None,
                       arrays: str = "torch") -> Plan:
    """The plan of `kernels.simt_bwd` for ``workload`` (float16, bfloat16 or float32, d <= 256):
    the delta pre-pass, the zero fill of the float32 dQ accumulator (torch), the dK/dV kernel
    at ``block_k x block_q`` (keys x Q rows) with the micro-tile ``micro_tile_kv`` (tk, tq) and
    dQ by float32 atomics, and for float16 dQ's conversion (None: the family's defaults,
    `default_blocks` and `choose_tiles` over 128 threads). ``registers``: of the dK/dV kernel
    per thread (None: the shipped ptxas table's). ``arrays``: "torch" or "numpy"."""
    w = workload
    if arrays not in _ARRAYS:
        raise ValueError(f"arrays must be one of {_ARRAYS}, got arrays={arrays!r}")
    if w.dtype == "bf16" and arrays != "torch":
        raise ValueError("bfloat16 runs with torch arrays only (arrays='torch')")
    cfg = dkdv_tile_config(w, block_q, block_k, micro_tile_kv)
    bk, bq, d = cfg.block_m, cfg.block_n, w.head_dim
    ntq = cfg.ntn
    e = w.dtype_bytes
    e_k = 4 if w.dtype == "bf16" else e
    threads = cfg.threads
    warps = -(-threads // 32)
    slices = w.batch * w.heads
    kv_slices = w.batch * w.heads_kv
    rows = slices * w.seq_len_q
    q_elems = rows * d
    kv_elems = kv_slices * w.seq_len_k * d
    n_blocks_k = -(-w.seq_len_k // bk)
    programs = n_blocks_k * kv_slices
    tiles, tile_rows, _keys = _tile_sums(w, bq, bk)
    scores = tiles * bq * bk
    allowed, _rows_with_keys = _band_totals(w, bq, bk)
    kernel_dtype = _kernel_dtype(w)

    # 1. delta = rowsum(dO * O): a warp per row, DELTA_ROWS rows per program
    delta_programs = -(-w.seq_len_q // DELTA_ROWS)
    delta_seg = min(32, d) * e_k
    delta = KernelPlan(
        name=DELTA_KERNEL, phase="bwd.pre", grid=(delta_programs, slices), threads=DELTA_THREADS,
        shared_bytes=0,
        accesses=(Access("O", "load", q_elems * e_k, *(("ld", None) if delta_seg >= SECTOR_BYTES
                                                      else ("fragment", delta_seg))),
                  Access("dO", "load", q_elems * e_k, *(("ld", None) if delta_seg >= SECTOR_BYTES
                                                       else ("fragment", delta_seg))),
                  Access("delta", "store", rows * STAT_BYTES, "fragment", STAT_BYTES)),
        fp32_flops=int(q_elems * DELTA_FLOPS_PER_ELEMENT
                       + delta_programs * slices * DELTA_THREADS * DELTA_SHUFFLE_FADDS_PER_LANE),
        registers=shipped_registers(DELTA_KERNEL, d, kernel_dtype, False))
    kernels = [delta]
    # 2. the float32 dQ accumulator, zeroed (torch.zeros: PyTorch's fill kernel)
    if arrays == "torch":
        kernels.append(KernelPlan(
            name="torch fill (dQ_acc)", phase="bwd.pre",
            grid=(-(-q_elems // (TORCH_THREADS * TORCH_ELEMENTS_PER_THREAD)),),
            threads=TORCH_THREADS, shared_bytes=0,
            accesses=(Access("dQ_acc", "store", q_elems * STAT_BYTES, "st"),)))
    # 3. dK/dV with dQ by atomics
    dkv_how, dkv_seg = _segment(ntq * e_k)
    schedule_loads = (programs * (w.heads // w.heads_kv) * SCHEDULE_LOADS_PER_PROGRAM_HEAD
                      + tiles * SCHEDULE_LOADS_PER_TILE) * warps
    fp32 = (allowed * DKDV_FLOPS_PER_ALLOWED_SCORE
            + scores * (DKDV_FLOPS_PER_SCORE + (DKDV_DROPOUT_FLOPS_PER_SCORE if w.dropout else 0))
            + tile_rows * d * DKDV_DQ_SCALE_FLOPS_PER_ELEMENT
            + kv_elems * DKDV_DK_SCALE_FLOPS_PER_ELEMENT)
    smem = tile_smem_elems("bwd.main", bq, bk, d, (cfg.tm, cfg.tn), dq_atomic=True)
    shared_moved = SMEM_ELEM_BYTES * (tiles * (smem["tile_loads"] + smem["tile_stores"])
                                      + programs * smem["program_stores"])
    if registers is None:
        registers = shipped_registers(DKDV_KERNEL, d, kernel_dtype, bool(w.causal),
                                      block_m=bk, block_n=bq, tile=(cfg.tm, cfg.tn), dq_atomic=True)
    dkdv = KernelPlan(
        name=DKDV_KERNEL, phase="bwd.main", grid=(n_blocks_k, kv_slices), threads=threads,
        shared_bytes=dkdv_smem_bytes(cfg, d),
        accesses=(Access("K", "load", kv_elems * e_k), Access("V", "load", kv_elems * e_k),
                  Access("Q", "load", tile_rows * d * e_k), Access("dO", "load", tile_rows * d * e_k),
                  Access("lse", "load", tile_rows * STAT_BYTES),
                  Access("delta", "load", tile_rows * STAT_BYTES),
                  Access("schedule", "load", schedule_loads * SCHEDULE_INDEX_BYTES, "fragment",
                         SCHEDULE_INDEX_BYTES),
                  Access("dQ_acc", "atomic", tile_rows * d * STAT_BYTES, "atomic"),
                  Access("dK", "store", kv_elems * e_k, dkv_how, dkv_seg),
                  Access("dV", "store", kv_elems * e_k, dkv_how, dkv_seg)),
        matmuls=(Matmul("ffma", tiles * 8 * d * bq * bk + tile_rows * 2 * d * bk),),
        fp32_flops=int(fp32), mufu_ops=int(allowed * DKDV_MUFU_PER_ALLOWED_SCORE),
        shared_bytes_moved=int(shared_moved), registers=registers,
        programs_per_slice=n_blocks_k,
        lockstep=not (w.causal or w.window_size is not None or w.block_sparse))
    kernels.append(dkdv)
    # 4. dQ in the output dtype
    if w.dtype != "fp32":
        if arrays == "torch":
            kernels.append(_torch_copy(f"torch copy fp32->{w.dtype} (dQ)", "bwd.post", q_elems,
                                       4, e, "dQ_acc", "dQ"))
        else:
            kernels.append(KernelPlan(
                name=CAST_KERNEL, phase="bwd.post",
                grid=(-(-(w.seq_len_q * d) // CAST_THREADS), slices), threads=CAST_THREADS,
                shared_bytes=0, accesses=(Access("dQ_acc", "load", q_elems * 4),
                                          Access("dQ", "store", q_elems * e))))
    tensor_bytes = {"Q": q_elems * e_k, "O": q_elems * e_k, "dO": q_elems * e_k,
                    "lse": rows * STAT_BYTES, "delta": rows * STAT_BYTES,
                    "K": kv_elems * e_k, "V": kv_elems * e_k, "dK": kv_elems * e_k,
                    "dV": kv_elems * e_k, "dQ_acc": q_elems * STAT_BYTES, "dQ": q_elems * e,
                    "schedule": (n_blocks_k + 1 + tiles // max(1, slices)) * SCHEDULE_INDEX_BYTES}
    if w.dtype == "bf16":   # staged: inputs to float32 first, dK, dV back to bfloat16 after
        staged = {t: t + "32" for t in ("Q", "K", "V", "O", "dO", "dK", "dV")}
        kernels = [_rename(k, staged) if k.name in (DELTA_KERNEL, DKDV_KERNEL) else k for k in kernels]
        pre = [_torch_copy(f"torch copy bf16->fp32 ({t})", "bwd.pre", n, 2, 4, t, t + "32")
               for t, n in (("Q", q_elems), ("K", kv_elems), ("V", kv_elems), ("O", q_elems),
                            ("dO", q_elems))]
        post = [_torch_copy(f"torch copy fp32->bf16 ({t})", "bwd.post", kv_elems, 4, 2, t + "32", t)
                for t in ("dK", "dV")]
        kernels = pre + kernels + post
        for t in staged:
            tensor_bytes[t + "32"] = tensor_bytes[t]
            tensor_bytes[t] = tensor_bytes[t] // 2
    return Plan("simt", "bwd", w, tuple(kernels),
                {"block_q": bq, "block_k": bk, "micro_tile_kv": (cfg.tm, cfg.tn), "arrays": arrays,
                 "dq_mode": "atomic"},
                tensor_bytes)


def simt_forward_configs(workload: Workload) -> list:
    """Every legal (block_q, block_k) of the forward for ``workload`` from `BLOCK_CHOICES`,
    with the default micro-tile: ``[{block_q, block_k}]``."""
    out = []
    for q in BLOCK_CHOICES:
        for k in BLOCK_CHOICES:
            try:
                forward_tile_config(workload, q, k)
            except ValueError:
                continue
            out.append({"block_q": q, "block_k": k})
    return out


def simt_backward_configs(workload: Workload) -> list:
    """Every legal (block_q, block_k) of the backward's dK/dV kernel for ``workload`` from
    `BLOCK_CHOICES`, with the default micro-tile: ``[{block_q, block_k}]``."""
    out = []
    for q in BLOCK_CHOICES:
        for k in BLOCK_CHOICES:
            try:
                dkdv_tile_config(workload, q, k)
            except ValueError:
                continue
            out.append({"block_q": q, "block_k": k})
    return out
