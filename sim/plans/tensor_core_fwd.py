"""The plans of the tensor-core forwards (`kernels.mma_fwd`, `kernels.tf32_fwd`), and the layout
facts their launchers read: tile choices and defaults, threads, shared memory.

Both are FlashAttention-2 forwards with one kernel: one program per (Q tile, batch * head), each
warp owning 16 query rows (two m-tiles for the mma forward at d=64 with 128-row tiles) held in
mma fragments; K/V tiles stream through shared memory by ``cp.async``; the visited tiles are
`ioaware.block_info.BlockInfo`'s, summed here through `sim.counts.workload_tile_stats`.

What the plans count, from the kernels' code (line references are to the kernel bodies):

* **Products** on whole tiles: a tail Q tile's missing rows and a tail K tile's zero-filled keys
  are multiplied too, so the executed FLOPs are ``4 d block_q block_k`` per visited tile (S = Q
  K^T and O += P V). The mma forward issues ``mma.sync.m16n8k16`` (f16 or bf16); the tf32
  forward three ``mma.sync.m16n8k8`` tf32 per product tile (3xTF32: ``mma3``), ``passes=3``.
* **Element-wise FP32** (FFMA = 2, FADD = FMUL = 1, as Nsight Compute counts FLOPs; max, compare,
  select and conversions are not FLOPs) and **MUFU** operations, per score of a visited tile
  (padding included: masked scores go through ex2 as -inf), per row of a visited tile (each row
  is held by the 4 threads of a quad, which all do its bookkeeping) and per row at the end.
* **Shared memory**: the ``cp.async`` destinations, and what every warp reads of each tile
  (``ldmatrix`` of K and V; the tf32 forward's split stages and Q's split fragments).
* **Overlap** (``KernelPlan.serial``): each warp's ``ldmatrix`` reads, products and softmax
  follow one another (`sim.plan.SYNC_WARP_CHAIN`), and the programs resident on an SM overlap
  their chains (``serial_per_program``); the ``cp.async`` loads are issued a tile ahead.
* **Bytes**: the tile schedule's CSR entries, read by every warp (4 bytes each, a sector per
  load as the counters count it); Q loaded once per row and O stored once per row as 4-byte words of mma fragments
  (a warp instruction touches 16 bytes of a row: 4 threads x 4 bytes, so the L1 counters count
  a 32-byte sector per 16 bytes); K and V by 16-byte ``cp.async`` per visited tile (keys past the
  end are zero-filled with no global read); the float32 logsumexp once per row.
"""
from __future__ import annotations

from typing import NamedTuple

from ..counts import workload_tile_stats
from ..plan import SYNC_WARP_CHAIN, Access, KernelPlan, Matmul, Plan
from ..resources import shipped_registers
from ..workload import STAT_BYTES, Workload

__all__ = ["mma_forward_plan", "tf32_forward_plan", "mma_forward_configs", "tf32_forward_configs", "MMA_HEAD_DIMS", "MMA_BLOCK_Q_CHOICES",
           "MMA_BLOCK_K_CHOICES", "mma_default_blocks", "mma_smem_bytes", "mma_warp_m_tiles",
           "mma_threads", "TF32_HEAD_DIMS", "TF32_BLOCK_Q_CHOICES", "TF32_BLOCK_K_CHOICES",
           "TF32_DEFAULT_BLOCKS", "tf32_smem_bytes", "tf32_presplit_ok", "tf32_threads",
           "SMEM_LIMIT_BYTES", "FRAGMENT_ROW_BYTES", "TileCounts", "tile_counts",
           "softmax_work", "forward_tensor_bytes"]

#: Dynamic shared memory a block may use with the opt-in on sm_90 (227 KiB).
SMEM_LIMIT_BYTES = 227 * 1024
#: Bytes of a Q or O row one warp instruction touches: 4 threads of a quad x 4 bytes.
FRAGMENT_ROW_BYTES = 16
#: Bytes of one entry of the tile schedule's CSR arrays (int32), read by a warp-uniform load
#: (one 32-byte sector counted per warp and load).
SCHEDULE_ENTRY_BYTES = 4

# -- the mma forward (float16 / bfloat16) ---------------------------------------------------------
MMA_HEAD_DIMS = (64, 128)
MMA_BLOCK_Q_CHOICES = (128, 64)      # 8 or 4 warps (d=64 with 128 rows: 4 warps of 2 m-tiles)
MMA_BLOCK_K_CHOICES = (64, 32)


def mma_default_blocks(head_dim: int, causal: bool = False) -> tuple[int, int]:
    """Default (block_q, block_k), the fastest H100 tiling without local memory in the inner
    loop (``python -m benchmarks tune --family mma``; docs/kernels.md): d=64 128 x 64 (4 warps
    of 2 m-tiles), but 128 x 32 when causal (128 x 64 causal needs 255 registers and spills
    inside the K/V loop); d=128 64 x 64 (69,632 bytes of dynamic shared memory)."""
    if head_dim <= 64:
        return (128, 32) if causal else (128, 64)
    return (64, 64)


def mma_smem_bytes(head_dim: int, block_k: int) -> int:
    """Shared memory of one block in bytes: K and V, two buffers each, rows padded by 8 halves."""
    return 4 * block_k * (head_dim + 8) * 2


def mma_warp_m_tiles(head_dim: int, block_q: int) -> int:
    """16-row m-tiles per warp: 2 for d=64 with block_q=128 (each K/V fragment feeds two
    mma, halving shared-memory reads per flop), else 1 (d=128 has no registers to spare)."""
    return 2 if head_dim <= 64 and block_q == 128 else 1


def mma_threads(head_dim: int, block_q: int) -> int:
    """Threads of one block: a warp per ``16 * mma_warp_m_tiles`` query rows."""
    return 32 * (block_q // (16 * mma_warp_m_tiles(head_dim, block_q)))


# -- the tf32 forward (3xTF32, float32) -----------------------------------------------------------
TF32_HEAD_DIMS = (64, 128)
TF32_BLOCK_Q_CHOICES = (128, 64, 32)      # 8, 4 or 2 warps of 16 query rows
TF32_BLOCK_K_CHOICES = (32, 16)
TF32_DEFAULT_BLOCKS = (128, 32)


def tf32_smem_bytes(head_dim: int, block_k: int, block_q: int = TF32_DEFAULT_BLOCKS[0]) -> int:
    """Dynamic shared memory of one block in bytes: one raw K/V stage (the cp.async
    destination), one or two split stages (big/small pairs, twice the raw size) and Q's big and
    small halves (block_q rows)."""
    d = head_dim
    nsplit = 2 if block_k <= 16 else 1
    return d * (2 * block_k + nsplit * 4 * block_k + 2 * block_q) * 4


def tf32_presplit_ok(head_dim: int, block_q: int, block_k: int) -> bool:
    """Whether the split layout works for these tiles: the copy assignment must give a thread
    keys of one parity (K swizzle) and key pairs of one residue mod 4 (V swizzle), i.e. rows
    between a thread's chunks (threads / (d / 4)) a multiple of 4, and an even number of chunks
    per thread and tile; and the shared memory must fit."""
    row_step = 32 * (block_q // 16) // (head_dim // 4)
    loads = block_k // row_step if row_step else 0
    return (row_step >= 4 and row_step % 4 == 0 and block_k % row_step == 0 and loads % 2 == 0
            and tf32_smem_bytes(head_dim, block_k, block_q) <= SMEM_LIMIT_BYTES)


def tf32_threads(block_q: int) -> int:
    """Threads of one block: a warp per 16 query rows."""
    return 32 * (block_q // 16)


# -- element-wise work, per the kernels' code -----------------------------------------------------
#: Per score: ``p = ex2(s * scale_log2 - m_use)`` (one FFMA, one MUFU) and ``row_sum += p``
#: (one FADD) -- "update m_i and l_i" in both kernels.
FLOPS_PER_SCORE = 3
MUFU_PER_SCORE = 1
#: The tf32 forward splits P into big and small before O += P V (``split_tf32``: one FADD).
TF32_SPLIT_FLOPS_PER_SCORE = 1
#: Per row per visited tile, per thread of the row's quad (4 threads): ``mx * scale_log2``
#: (FMUL), ``alpha = ex2(m_i - m_use)`` (FADD + MUFU), ``l_i = l_i * alpha + row_sum`` (FFMA);
#: beside it the output rescale ``acc *= alpha``, d FMUL per row.
THREADS_PER_ROW = 4
FLOPS_PER_ROW_THREAD_TILE = 4
MUFU_PER_ROW_THREAD_TILE = 1
#: Per row at the end, per thread of its quad: two shuffle FADDs of l, ``1 / l`` (``div.rn.f32``:
#: MUFU.RCP, two FFMA refinements and an FADD = 5 FLOPs); then for rows inside the problem
#: ``acc * inv`` (d FMUL per row) and, on one thread, ``m * ln2 + log(l)`` (FFMA + libdevice
#: logf: 25 FLOPs and one MUFU lg2).
FLOPS_PER_ROW_THREAD_END = 2 + 5
MUFU_PER_ROW_THREAD_END = 1
LSE_FLOPS_PER_ROW = 2 + 25
LSE_MUFU_PER_ROW = 1
#: Dropout: the kept scores scaled by 1 / (1 - p) (one FMUL per score; the hash is integer).
DROPOUT_FLOPS_PER_SCORE = 1


def _check(family: str, w: Workload, block_q, block_k, head_dims, q_choices, k_choices, dtypes):
    if not isinstance(w, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(w).__name__}")
    if w.dtype not in dtypes:
        raise ValueError(f"the {family} forward runs dtype {' or '.join(dtypes)}, got "
                         f"workload.dtype={w.dtype!r}")
    if w.head_dim not in head_dims:
        raise ValueError(f"the {family} forward runs head_dim in {head_dims}, got "
                         f"workload.head_dim={w.head_dim}")
    if block_q not in q_choices:
        raise ValueError(f"the {family} forward takes block_q in {q_choices}, got block_q={block_q!r}")
    if block_k not in k_choices:
        raise ValueError(f"the {family} forward takes block_k in {k_choices}, got block_k={block_k!r}")


def _registers(kernel: str, w: Workload, block_q: int, block_k: int, registers):
    """Registers per thread: given, else the shipped ptxas table's entry (None if absent)."""
    if registers is not None:
        return int(registers)
    return shipped_registers(kernel, w.head_dim, "fp16" if w.dtype == "bf16" else w.dtype,
                             bool(w.causal), block_m=block_q, block_n=block_k)


class TileCounts(NamedTuple):
    """What a one-kernel forward over ``block_q x block_k`` tiles visits, all slices together:
    ``tiles`` (visited), ``keys`` (of those tiles, inside the problem), ``n_blocks_q`` (Q tiles
    per slice), ``slices`` (batch x heads), ``programs``, ``rows`` (query rows of the problem),
    ``padded_rows`` (rows the programs hold), ``scores`` (on whole tiles), ``tile_rows``
    (query rows over visited tiles)."""
    tiles: int
    keys: int
    n_blocks_q: int
    slices: int
    programs: int
    rows: int
    padded_rows: int
    scores: int
    tile_rows: int


def tile_counts(w: Workload, block_q: int, block_k: int) -> TileCounts:
    """`TileCounts` of ``w`` at ``block_q x block_k`` (the tiles `BlockInfo` visits)."""
    groups = workload_tile_stats(w, block_q, block_k)
    tiles = sum(m * int(st.T) for m, st in groups)
    keys = sum(m * int(st.C) for m, st in groups)
    n_blocks_q = -(-w.seq_len_q // block_q)
    slices = w.batch * w.heads
    return TileCounts(tiles, keys, n_blocks_q, slices, n_blocks_q * slices, slices * w.seq_len_q,
                      slices * n_blocks_q * block_q, tiles * block_q * block_k, tiles * block_q)


def softmax_work(c: TileCounts, head_dim: int, dropout: bool = False) -> tuple[int, int]:
    """``(fp32_flops, mufu_ops)`` of the online softmax on the accumulator fragment (a quad of
    `THREADS_PER_ROW` threads per row): per score, per row and visited tile (with the ``d``
    rescale of O), per held row at the end, and per problem row (``d`` to normalise O and the
    logsumexp); ``dropout`` adds its per-score work."""
    fp32 = (c.scores * (FLOPS_PER_SCORE + (DROPOUT_FLOPS_PER_SCORE if dropout else 0))
            + c.tile_rows * (THREADS_PER_ROW * FLOPS_PER_ROW_THREAD_TILE + head_dim)
            + c.padded_rows * THREADS_PER_ROW * FLOPS_PER_ROW_THREAD_END
            + c.rows * (head_dim + LSE_FLOPS_PER_ROW))
    mufu = (c.scores * MUFU_PER_SCORE + c.tile_rows * THREADS_PER_ROW * MUFU_PER_ROW_THREAD_TILE
            + c.padded_rows * THREADS_PER_ROW * MUFU_PER_ROW_THREAD_END
            + c.rows * LSE_MUFU_PER_ROW)
    return fp32, mufu


def forward_tensor_bytes(w: Workload, c: TileCounts) -> dict:
    """Bytes of each tensor a forward reads or writes once (the plan's ``tensor_bytes``)."""
    e, d = w.dtype_bytes, w.head_dim
    kv = w.batch * w.heads_kv * w.seq_len_k * d * e
    return {"schedule": (c.programs + c.slices + c.tiles) * SCHEDULE_ENTRY_BYTES,
            "Q": c.rows * d * e, "O": c.rows * d * e, "lse": c.rows * STAT_BYTES, "K": kv, "V": kv}


def _forward(family: str, w: Workload, block_q: int, block_k: int, *, kernel_name: str,
             threads: int, shared_bytes: int, unit: str, passes: int, registers, split: bool,
             config: dict) -> Plan:
    """The one-kernel plan both forwards share; ``split``: the tf32 forward's operand splits."""
    e, d = w.dtype_bytes, w.head_dim
    c = tile_counts(w, block_q, block_k)
    tiles, keys, n_blocks_q, slices = c.tiles, c.keys, c.n_blocks_q, c.slices
    programs, rows, padded_rows, scores = c.programs, c.rows, c.padded_rows, c.scores
    q_rows = padded_rows if split else rows    # the tf32 forward clamps tail rows and loads them
    warps = threads // 32
    # the tile schedule (CSR of `kernels.tile_scheduler.device_schedule`), read warp-uniformly by
    # every warp: offsets[s, m], offsets[s, m + 1] and kv_index[start] once, kv_index[it] and
    # kv_index[it + 1] per visited tile but the last: 2 programs + 2 tiles 4-byte loads a warp
    schedule_loads = warps * (2 * programs + 2 * tiles)
    accesses = (
        Access("schedule", "load", schedule_loads * SCHEDULE_ENTRY_BYTES, "fragment",
               SCHEDULE_ENTRY_BYTES),
        Access("Q", "load", q_rows * d * e, "fragment", FRAGMENT_ROW_BYTES),
        Access("K", "load", keys * d * e, "cp.async"),
        Access("V", "load", keys * d * e, "cp.async"),
        Access("O", "store", rows * d * e, "fragment", FRAGMENT_ROW_BYTES),
        Access("lse", "store", rows * STAT_BYTES, "st"),
    )
    fp32, mufu = softmax_work(c, d, bool(w.dropout))
    kv_tile = block_k * d * e
    if split:   # Q once per program, K and V per visited tile (whole tiles), P per score
        fp32 += padded_rows * d + tiles * 2 * block_k * d + scores * TF32_SPLIT_FLOPS_PER_SCORE
        # raw K/V land (cp.async) and are read once, stored split (big | small), then every
        # warp reads both split tiles; Q's split fragments: stored once, read per tile
        shared = (tiles * (2 * kv_tile + 2 * kv_tile + 4 * kv_tile + warps * 4 * kv_tile)
                  + slices * n_blocks_q * block_q * d * 8 + tiles * block_q * d * 8)
    else:       # K/V land (cp.async); every warp reads both tiles by ldmatrix
        shared = tiles * (2 * kv_tile + warps * 2 * kv_tile)
    windowed = w.window_size is not None
    kernel = KernelPlan(
        name=kernel_name, phase="fwd", grid=(n_blocks_q, slices), threads=threads,
        shared_bytes=shared_bytes, accesses=accesses,
        matmuls=(Matmul(unit, tiles * 4 * d * block_q * block_k, passes),),
        fp32_flops=int(fp32), mufu_ops=int(mufu), shared_bytes_moved=int(shared),
        registers=_registers(kernel_name, w, block_q, block_k, registers),
        programs_per_slice=n_blocks_q, lockstep=not (windowed or w.block_sparse),
        serial=SYNC_WARP_CHAIN, serial_per_program=True)
    return Plan(family, "fwd", w, (kernel,), dict(config, block_q=block_q, block_k=block_k),
                forward_tensor_bytes(w, c))


def mma_forward_plan(workload: Workload, *, block_q: int | None = None, block_k: int | None = None,
                     registers: int | None = None, launch_order=None) -> Plan:
    """The plan of `kernels.mma_fwd` for ``workload`` (float16 or bfloat16, d 64 or 128) at
    ``block_q x block_k`` (None: :func:`mma_default_blocks`). ``registers``: per thread
    (None: the shipped ptxas table's, if it has this configuration). ``launch_order`` is
    recorded in the plan's config (it changes the order programs run, not what they do)."""
    w = workload
    dq, dk = mma_default_blocks(w.head_dim, w.causal)
    bq, bk = block_q or dq, block_k or dk
    _check("mma", w, bq, bk, MMA_HEAD_DIMS, MMA_BLOCK_Q_CHOICES, MMA_BLOCK_K_CHOICES,
           ("fp16", "bf16"))
    unit = "mma.bf16" if w.dtype == "bf16" else "mma.f16"
    return _forward("mma", w, bq, bk, kernel_name="flash_mma_fwd",
                    threads=mma_threads(w.head_dim, bq), shared_bytes=mma_smem_bytes(w.head_dim, bk),
                    unit=unit, passes=1, registers=registers, split=False,
                    config={"launch_order": launch_order,
                            "warp_m_tiles": mma_warp_m_tiles(w.head_dim, bq)})


def tf32_forward_plan(workload: Workload, *, block_q: int | None = None, block_k: int | None = None,
                      registers: int | None = None, launch_order=None) -> Plan:
    """The plan of `kernels.tf32_fwd` (3xTF32) for ``workload`` (float32, d 64 or 128) at
    ``block_q x block_k`` (None: :data:`TF32_DEFAULT_BLOCKS`); see :func:`mma_forward_plan`."""
    w = workload
    bq, bk = block_q or TF32_DEFAULT_BLOCKS[0], block_k or TF32_DEFAULT_BLOCKS[1]
    _check("tf32", w, bq, bk, TF32_HEAD_DIMS, TF32_BLOCK_Q_CHOICES, TF32_BLOCK_K_CHOICES, ("fp32",))
    if not tf32_presplit_ok(w.head_dim, bq, bk):
        raise ValueError(f"the tf32 forward's split layout cannot take block_q={bq}, block_k={bk} "
                         f"at head_dim={w.head_dim}")
    return _forward("tf32", w, bq, bk, kernel_name="flash_tf32_fwd", threads=tf32_threads(bq),
                    shared_bytes=tf32_smem_bytes(w.head_dim, bk, bq), unit="mma.tf32", passes=3,
                    registers=registers, split=True, config={"launch_order": launch_order})


def mma_forward_configs(workload: Workload) -> list:
    """Every legal configuration of the mma forward for ``workload``: ``[{block_q, block_k}]``."""
    return [{"block_q": q, "block_k": k} for q in MMA_BLOCK_Q_CHOICES for k in MMA_BLOCK_K_CHOICES
            if mma_smem_bytes(workload.head_dim, k) <= SMEM_LIMIT_BYTES]


def tf32_forward_configs(workload: Workload) -> list:
    """Every legal configuration of the tf32 forward for ``workload`` (its split layout's rule)."""
    return [{"block_q": q, "block_k": k} for q in TF32_BLOCK_Q_CHOICES for k in TF32_BLOCK_K_CHOICES
            if tf32_presplit_ok(workload.head_dim, q, k)]
