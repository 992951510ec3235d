"""Tensor-core FlashAttention-2 backward for float32 CUDA inputs with 3xTF32 (Numba + inline PTX).

This module owns the float32 tensor-core backward kernels and their host entry point `backward`,
which has the signature of the package's `kernels.backward` contract. The structure is that of
`kernels.flash_mma_bwd` (two kernels, operands in registers or L1, no shared-memory round trip of
P or dS, no atomics); the arithmetic is that of `kernels.flash_tf32_fwd`: every float32 operand x is
split into ``big = tf32(x)`` and ``small = tf32(x - big)`` and every product is
``A_small B_big + A_big B_small + A_big B_big`` with ``mma.sync.m16n8k8`` tf32 and float32
accumulation, so all five matmuls have float32-level accuracy.

* **dQ kernel** (runs first), grid (n_blocks_q, B * Hq): each warp owns 16 query rows and keeps
  (at d=64) its Q and dO fragments (at d=128 they are re-read from global memory, where they
  stay in L1, at every k-step), A operands in float32, and its dQ
  accumulator in registers; its prologue
  computes delta_i = sum_c dO_ic O_ic for its rows (fused pre-pass) and writes it for the second
  kernel. K/V tiles of `BlockInfo.kv_schedule()` stream through double-buffered shared memory
  (``cp.async``); per tile: S = Q K^T, dP = dO V^T, P = exp2(S * scale * log2(e) - lse *
  log2(e)), dS = P * (dP * Z - delta), dQ += dS K. dQ = scale * dQ at the end.
* **dK/dV kernel**, grid (n_blocks_k, B * Hkv), transposed orientation: each warp owns 16 key
  rows and keeps its dK and dV accumulators in registers; its K and V fragments (A operands)
  are re-read from global memory, where the block's rows stay in L1, at every k-step
  (`operands_in_registers`). It loops over the query heads of the GQA group and, for each, over the Q tiles of
  `BlockInfo.q_schedule()`; Q and dO tiles (double-buffered, ``cp.async``) give S^T = K Q^T,
  dP^T = V dO^T, P^T (lse and delta per query column, staged in shared memory),
  dV += (P^T Z) dO, dS^T = P^T * (dP^T Z - delta), dK += dS^T Q; dK = scale * dK at the end.

Both grids are (tiles, batch*heads); which block works on which (tile, head) is the launch order
of `kernels.tile_order`: tiles first, or, under a causal mask, heads first within groups of
four heads (`tile_order.DEFAULT_HEAD_GROUP`, measured by `python -m kernels.tune_order`).

Fragment maps (`kernels.fragments_tf32`): in S = Q K^T and dP = dO V^T (and their transposes)
the k index is a head dim and is *not* permuted (``dim_a_elem`` / ``dim_b_elem``): a thread's B
elements are K[key g][dims t, t + 4], two 32-bit loads, conflict-free with rows padded by 4
floats. In dQ += dS K, dV += (P^T Z) dO and dK += dS^T Q the A operand is a C fragment of the
score tile, used in place under `k_perm` (``p_a_from_c``: a0, a1, a2, a3 = c0, c2, c1, c3), and
the B operand is loaded in the same permuted order, B[k][n] = X[row k_perm(k)][dim n]
(``v_b_elem``: rows 2t and 2t + 1 of column g, conflict-free with the same padding). The
operands that live in registers stay float32 and are split at each use (Q, dO, K and V
fragments split once would need twice their registers, which the dQ / dK / dV accumulators and
the score tiles leave no room for: see kernels/NOTES.md).

Configurations (`default_config`): four warps of 16 rows, 32-row stages. At d=64 the stages
live in static shared memory (34816 / 35328 bytes). At d=128 they take dynamic shared memory
(67584 / 68096 bytes, opt-in above 48 KiB through `kernels.fastlaunch`; on an H100 three dQ
blocks per SM at 165 registers, two dK/dV blocks at 241-243, by `ptxas -v` for sm_90)
and the S / dP k-loops are written two k-steps per iteration (``unroll``), which NVVM keeps
as such (240 / 432 HMMA in the SASS instead of the 108 / 204 of the 16-row, not unrolled
kernels). A ``presplit`` variant (each stage's B operands split once into big/small TF32
planes by the threads that copied them) is kept behind `VARIANT_ENV`; it was exact but slower
on the H100 (kernels/NOTES_TF32_BWD.md). With dropout at d=128 the dK/dV kernel keeps 16-query
stages (`dkdv_dropout_config`: the 32-query kernel spills).

Here Z = keep / (1 - p) is the dropout factor regenerated from the `ioaware.dropout` hash
(Z = 1 without dropout) and delta = rowsum(dO * O), with O the dropped-out output. Supported:
head_dim 64 and 128, float32 (torch CUDA tensors, Numba device arrays; NumPy arrays are copied),
causal, boolean masks (a fully masked row gets zero gradients), block-sparse masks whose tiles
are multiples of 16, dropout, GQA/MQA (dK/dV summed over the group), Nq != Nk, any lengths.
`accepts` says False for everything else and under the CUDA simulator (which runs no inline
PTX), so `kernels.backward` keeps those on the float32 CUDA-core kernels.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np

from ioaware.block_info import cdiv

from kernels import fastlaunch, tile_order
from kernels.flash_mma_bwd import (_dkdv_row_helpers, _dq_row_stats, _transposed_score_mask,
                                   device_schedules, refine_block_mask, tiles_for_block_mask)
from kernels.flash_mma_fwd import (_device_helpers, _kind, _score_mask, check_problem,
                                   dropout_constants, mask_on_device)

__all__ = ["backward", "accepts", "SUPPORTED_HEAD_DIMS", "default_config", "default_tiles",
           "kernel_tiles", "dq_smem_bytes", "dkdv_smem_bytes", "operands_in_registers", "get_dq_kernel",
           "get_dkdv_kernel", "refine_block_mask", "dkdv_dropout_config"]

SUPPORTED_HEAD_DIMS = (64, 128)
SMEM_LIMIT_BYTES = 48 * 1024         # static shared memory per block without opt-in
DYNAMIC_SMEM_LIMIT_BYTES = 227 * 1024  # dynamic shared memory per block with the opt-in (H100)
PAD_FLOATS = 4                       # per shared row: both access patterns conflict-free
LOG2E = 1.4426950408889634


#: Per head dim: ``dq`` = (query rows per block, keys per stage) of the dQ kernel, ``dkdv`` =
#: (key rows per block, queries per stage) of the dK/dV kernel, ``presplit`` (stage operands
#: split once per stage into big/small TF32 planes in dynamic shared memory) and ``unroll``
#: (k-steps per iteration of the S / dP k-loops as written). See `default_config`.
_DEFAULT_CONFIG = {
    64: {"dq": (64, 32), "dkdv": (64, 32), "presplit": False, "unroll": 1},
    128: {"dq": (64, 32), "dkdv": (64, 32), "presplit": False, "unroll": 2},
}
VARIANT_ENV = "KERNELS_TF32_BWD_VARIANT"


def default_config(head_dim: int) -> dict:
    """The kernel configuration for ``head_dim`` (a copy of `_DEFAULT_CONFIG`'s entry).

    * ``dq`` / ``dkdv``: the kernels' tiles (16 rows per warp, four warps).
    * ``presplit``: each stage's two B-operand tiles (K and V in the dQ kernel, Q and dO in the
      dK/dV kernel) are copied (``cp.async``) into one raw buffer; every thread splits the
      chunks it copied itself into big and small TF32 planes (rows padded by 4 floats, the same
      fragment offsets as the raw layout), one barrier, then the warps read pre-split B
      operands (four 32-bit loads per ``mma3`` instead of two loads and two splits) while the
      next stage streams into the raw buffer. Dynamic shared memory (opt-in above 48 KiB).
      Without it: two buffers of two padded float32 tiles, split by every warp at each use
      (static shared memory where it fits in 48 KiB, dynamic above).
    * ``unroll``: the S = Q K^T and dP = dO V^T k-loops (and their transposes) are written as
      an outer loop over ``head_dim / 8 / unroll`` iterations of ``unroll`` k-steps each.

    For head_dim 128, the environment variable ``KERNELS_TF32_BWD_VARIANT`` (comma-separated
    ``name=value``: ``dq_bk``, ``kv_bq``, ``presplit``, ``unroll``) overrides the default, for
    timing variants against each other."""
    env = os.environ.get(VARIANT_ENV, "") if head_dim == 128 else ""
    return dict(_config(64 if head_dim <= 64 else 128, env))


@functools.lru_cache(maxsize=64)
def _config(head_dim: int, env: str) -> dict:
    """`default_config` for one value of its environment variable (parsed once; callers copy)."""
    cfg = dict(_DEFAULT_CONFIG[head_dim])
    for item in filter(None, (x.strip() for x in env.split(","))):
        name, val = (x.strip() for x in item.split("="))
        if name == "dq_bk":
            cfg["dq"] = (cfg["dq"][0], int(val))
        elif name == "kv_bq":
            cfg["dkdv"] = (cfg["dkdv"][0], int(val))
        elif name == "presplit":
            cfg["presplit"] = val.lower() in ("1", "true", "yes")
        elif name == "unroll":
            cfg["unroll"] = int(val)
        else:
            raise ValueError(f"{VARIANT_ENV}: unknown name {name!r}")
    return cfg


def default_tiles(head_dim: int) -> dict:
    """Default kernel tiles (`default_config`): ``dq`` = (query rows per block, keys per
    stage) of the dQ kernel, ``dkdv`` = (key rows per block, queries per stage) of the dK/dV
    kernel. 16 rows per warp, four warps; 32-row stages (d=64: static shared memory, 34816 /
    35328 bytes; d=128: dynamic shared memory, 67584 / 68096 bytes)."""
    cfg = default_config(head_dim)
    return {"dq": cfg["dq"], "dkdv": cfg["dkdv"]}


def dq_smem_bytes(head_dim: int, block_k: int, presplit: bool | None = None) -> int:
    """Shared memory of one dQ block. Without ``presplit``: K and V, two buffers each, rows
    padded by 4 floats. With it: one raw K | V stage (unpadded) and the big and small planes of
    K and V (padded rows). ``presplit`` defaults to `default_config`'s."""
    if presplit is None:
        presplit = default_config(head_dim)["presplit"]
    if presplit:
        return (2 * block_k * head_dim + 4 * block_k * (head_dim + PAD_FLOATS)) * 4
    return 4 * block_k * (head_dim + PAD_FLOATS) * 4


def dkdv_smem_bytes(head_dim: int, block_q: int, presplit: bool | None = None) -> int:
    """Shared memory of one dK/dV block: Q and dO as `dq_smem_bytes` lays out K and V, plus
    lse / delta of two stages (static)."""
    return dq_smem_bytes(head_dim, block_q, presplit) + 16 * block_q


def smem_limit_bytes(presplit: bool) -> int:
    """The per-block shared memory a configuration may use: 48 KiB static, or (dynamic,
    opt-in) the ~227 KiB of an H100 block; `kernel_tiles` keeps tiles within it."""
    return DYNAMIC_SMEM_LIMIT_BYTES if presplit else SMEM_LIMIT_BYTES


def operands_in_registers(kernel: str, head_dim: int) -> tuple[bool, bool]:
    """Which of a kernel's two A operands (Q and dO for ``kernel="dq"``, K and V for
    ``"dkdv"``) it keeps in registers as float32 fragments; the others are re-read from global
    memory, where the block's rows stay in L1, at every k-step. Chosen so that ptxas needs no
    local memory (``python -m kernels.tf32_check``): the dQ kernel at d=64 holds both
    (accumulator 32 registers), the dK/dV kernel (dK and dV accumulators, 64 registers at d=64)
    and the dQ kernel at d=128 neither."""
    return (head_dim <= 64 and kernel == "dq",) * 2


def dkdv_dropout_config(head_dim: int, block_q: int, has_dropout: bool) -> dict:
    """Overrides of the dK/dV kernel's configuration for a call: with dropout at d=128 the
    default 32-query stages spill (the per-column dropout hashes, 16 more registers: 20-44
    bytes of spill loads from ``ptxas -v``), so 16-query stages without unrolling (the
    previous default dK/dV kernel, spill-free) are used; {} otherwise."""
    cfg = default_config(head_dim)
    if has_dropout and head_dim == 128 and block_q > 16 and not cfg["presplit"]:
        return {"block_q": 16, "unroll": 1, "presplit": False}
    return {}


def kernel_tiles(head_dim: int, block_q=None, block_k=None, has_block_mask=False):
    """The (dq, dkdv) tiles for a call, or None when no tiling fits.

    Without a block mask, ``block_q``/``block_k`` do not change the result and the defaults are
    used. With one, every kernel tile must divide the mask's tile (block_q, block_k) so that a
    kernel tile lies inside one mask tile: the largest of 64 / 32 / 16 (no larger than the
    default) that divides it is taken.
    """
    return tiles_for_block_mask(default_tiles, SUPPORTED_HEAD_DIMS, head_dim, block_q, block_k,
                                has_block_mask)


_KERNELS: dict = {}


def get_dq_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, presplit=None,
                  unroll=None, head_group=None):
    """The compiled-on-first-launch dQ kernel for one configuration (cached); ``presplit`` and
    ``unroll`` default to `default_config`'s, ``head_group`` (the launch order,
    `kernels.tile_order`) to `tile_order.head_group`. ``kernel.smem_bytes`` is its dynamic
    shared memory (0 when its shared memory is static)."""
    cfg = default_config(head_dim)
    presplit = cfg["presplit"] if presplit is None else bool(presplit)
    unroll = cfg["unroll"] if unroll is None else int(unroll)
    if head_group is None:
        head_group = tile_order.head_group(causal, "bwd")
    key = ("dq", head_dim, block_q, block_k, causal, has_mask, has_dropout, presplit, unroll,
           int(head_group))
    if key not in _KERNELS:
        _KERNELS[key] = _build_dq_kernel(*key[1:])
    return _KERNELS[key]


def get_dkdv_kernel(head_dim, block_k, block_q, causal, has_mask, has_dropout, presplit=None,
                    unroll=None, head_group=None):
    """The compiled-on-first-launch dK/dV kernel (``block_k`` key rows per block, ``block_q``
    queries per stage) for one configuration (cached); as `get_dq_kernel`."""
    cfg = default_config(head_dim)
    presplit = cfg["presplit"] if presplit is None else bool(presplit)
    unroll = cfg["unroll"] if unroll is None else int(unroll)
    if head_group is None:
        head_group = tile_order.head_group(causal, "bwd")
    key = ("dkdv", head_dim, block_k, block_q, causal, has_mask, has_dropout, presplit, unroll,
           int(head_group))
    if key not in _KERNELS:
        _KERNELS[key] = _build_dkdv_kernel(*key[1:])
    return _KERNELS[key]


def _smem_intrinsics():
    """128-bit shared loads/stores and a 32-bit shared load of TF32 bits (`kernels.mma_tf32`)."""
    from kernels import mma_tf32 as T
    return T.ld_shared_v4_f32, T.st_shared_v4_b32, T.ld_shared_b32


def _tf32_helpers(threads, chunks, rows):
    """Device helpers shared by both kernels: the 3xTF32 product and the cp.async tile copy of
    ``rows`` float32 rows of ``chunks`` 16-byte chunks by ``threads`` threads."""
    from numba import cuda, uint32, uint64

    from kernels import mma as X
    from kernels import mma_tf32 as T

    loads = rows * chunks // threads        # cp.async per thread per tile
    row_step = threads // chunks            # rows between a thread's successive chunks
    assert rows * chunks % threads == 0 and threads % chunks == 0

    @cuda.jit(device=True, inline=True)
    def mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, bb0, bb1, bs0, bs1, c0, c1, c2, c3):
        # 3xTF32: small * big, big * small, then big * big, all accumulated in float32
        d = T.mma_tf32(as0, as1, as2, as3, bb0, bb1, c0, c1, c2, c3)
        d = T.mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, d[0], d[1], d[2], d[3])
        return T.mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, d[0], d[1], d[2], d[3])

    @cuda.jit(device=True, inline=True)
    def load_tile(head_addr, row_bytes, row0, n_rows, s_addr, stride):
        # -- cp.async one tile: this thread's chunks are rows row0 + i * row_step (zero-filled
        #    past n_rows), one 16-byte column chunk (see the caller) --
        for i in range(loads):
            row = row0 + i * row_step
            ok = row < n_rows
            g = head_addr + uint64(row if ok else 0) * row_bytes
            X.cp_async_16(s_addr + uint32(4 * i * row_step * stride), g,
                          uint32(16) if ok else uint32(0))

    ld_v4, st_v4, _ = _smem_intrinsics()
    d = 4 * chunks
    stride = d + PAD_FLOATS

    @cuda.jit(device=True, inline=True)
    def split_chunks(raw_addr, big_addr, small_addr):
        # -- presplit: this thread's own cp.async chunks of one raw tile (unpadded rows) into
        #    the big and small planes (padded rows, same chunk positions) --
        for i in range(loads):
            x = ld_v4(raw_addr + uint32(4 * i * row_step * d))
            e0 = T.split_tf32(x[0])
            e1 = T.split_tf32(x[1])
            e2 = T.split_tf32(x[2])
            e3 = T.split_tf32(x[3])
            o = uint32(4 * i * row_step * stride)
            st_v4(big_addr + o, e0[0], e1[0], e2[0], e3[0])
            st_v4(small_addr + o, e0[1], e1[1], e2[1], e3[1])

    return mma3, load_tile, split_chunks


def _rows_times_shared_rows(nt_n, kc_steps, unroll, stride, tile, presplit, a_in_registers, mma3,
                            ld_b32):
    """``product(acc, a_reg, x, b, h, r0, r1, tig, b_addr)``: acc (``nt_n`` 16x8 float32 C
    fragments) += A B^T over ``kc_steps`` k-steps of 8 dims, written as ``kc_steps / unroll``
    iterations of ``unroll`` steps: the S = Q K^T / dP = dO V^T products of the dQ kernel and
    S^T = K Q^T / dP^T = V dO^T of the dK/dV kernel. A is the warp's 16 rows
    (rows r0 and r1 = r0 + 8 of this lane), dims not permuted: from the float32 fragments
    ``a_reg`` when ``a_in_registers``, else re-read from global ``x[b, h, r, :]``; split into
    big/small here. B^T is ``nt_n`` groups of 8 shared rows at ``b_addr`` (``stride`` floats
    apart; with ``presplit``, TF32 big/small planes ``tile`` floats apart, else raw float32
    split here)."""
    from numba import cuda

    from kernels import mma_tf32 as T
    NT_N, STRIDE, TILE, PRESPLIT, A_REGS = nt_n, stride, tile, presplit, a_in_registers
    KC, SU = kc_steps, unroll

    @cuda.jit(device=True, inline=True)
    def step(acc, kc, a_reg, x, b, h, r0, r1, tig, b_addr):
        a = kc * 4
        if A_REGS:
            a0 = T.split_tf32(a_reg[a])
            a1 = T.split_tf32(a_reg[a + 1])
            a2 = T.split_tf32(a_reg[a + 2])
            a3 = T.split_tf32(a_reg[a + 3])
        else:
            a0 = T.split_tf32(x[b, h, r0, kc * 8 + tig])
            a1 = T.split_tf32(x[b, h, r1, kc * 8 + tig])
            a2 = T.split_tf32(x[b, h, r0, kc * 8 + tig + 4])
            a3 = T.split_tf32(x[b, h, r1, kc * 8 + tig + 4])
        for nt in range(NT_N):
            off = 4 * (nt * 8 * STRIDE + kc * 8)
            if PRESPLIT:
                bb0 = ld_b32(b_addr + off)
                bb1 = ld_b32(b_addr + off + 16)
                bs0 = ld_b32(b_addr + off + 4 * TILE)
                bs1 = ld_b32(b_addr + off + 4 * TILE + 16)
            else:
                b0 = T.split_tf32(T.ld_shared_f32(b_addr + off))
                b1 = T.split_tf32(T.ld_shared_f32(b_addr + off + 16))
                bb0, bb1, bs0, bs1 = b0[0], b1[0], b0[1], b1[1]
            j = nt * 4
            d = mma3(a0[0], a1[0], a2[0], a3[0], a0[1], a1[1], a2[1], a3[1],
                     bb0, bb1, bs0, bs1,
                     acc[j], acc[j + 1], acc[j + 2], acc[j + 3])
            for i in range(4):
                acc[j + i] = d[i]

    @cuda.jit(device=True, inline=True)
    def product(acc, a_reg, x, b, h, r0, r1, tig, b_addr):
        for kc_o in range(KC // SU):
          for kc_i in range(SU):  # noqa: E111 (the k-step loop, SU steps per iteration)
            step(acc, kc_o * SU + kc_i, a_reg, x, b, h, r0, r1, tig, b_addr)

    return product


def _c_times_shared_b(nt_k, nt_o, stride, tile, presplit, mma3, ld_b32):
    """``acc_c_times_b(c_reg, acc, t_addr)``: acc (``nt_o`` 16x8 float32 C fragments) += C x B,
    where C is a warp's ``nt_k`` 16x8 score tiles ``c_reg`` used as A fragments (the C layout is
    the A layout under the k permutation: a0..a3 = c0, c2, c1, c3) and B is read from shared
    memory at ``t_addr`` (rows ``stride`` floats apart; with ``presplit``, TF32 big/small planes
    ``tile`` floats apart, else raw float32 split here). The dQ += dS K, dV += (P^T Z) dO and
    dK += dS^T Q products of the 3xTF32 backward."""
    from numba import cuda

    from kernels import mma_tf32 as T
    NT_S, NT_O, STRIDE, TILE, PRESPLIT = nt_k, nt_o, stride, tile, presplit

    @cuda.jit(device=True, inline=True)
    def acc_c_times_b(c_reg, acc, t_addr):
        for kp in range(NT_S):
            j = kp * 4
            p0 = T.split_tf32(c_reg[j])
            p1 = T.split_tf32(c_reg[j + 2])
            p2 = T.split_tf32(c_reg[j + 1])
            p3 = T.split_tf32(c_reg[j + 3])
            for nt in range(NT_O):
                xa = t_addr + 4 * (kp * 8 * STRIDE + nt * 8)
                if PRESPLIT:
                    bb0 = ld_b32(xa)
                    bb1 = ld_b32(xa + 4 * STRIDE)
                    bs0 = ld_b32(xa + 4 * TILE)
                    bs1 = ld_b32(xa + 4 * (TILE + STRIDE))
                else:
                    b0 = T.split_tf32(T.ld_shared_f32(xa))
                    b1 = T.split_tf32(T.ld_shared_f32(xa + 4 * STRIDE))
                    bb0, bb1, bs0, bs1 = b0[0], b1[0], b0[1], b1[1]
                o = nt * 4
                d = mma3(p0[0], p1[0], p2[0], p3[0], p0[1], p1[1], p2[1], p3[1],
                         bb0, bb1, bs0, bs1,
                         acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                for i in range(4):
                    acc[o + i] = d[i]

    return acc_c_times_b


def _build_dq_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, presplit,
                     unroll, head_group):
    from numba import cuda, float32, uint32, uint64

    from kernels import mma as X

    D = head_dim
    BQ = block_q
    BK = block_k
    NUM_WARPS = BQ // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + PAD_FLOATS             # floats per shared K or V row (split planes too)
    TILE = BK * STRIDE                  # floats per K or V buffer (or plane)
    PRESPLIT = presplit
    if PRESPLIT:
        RAW_STRIDE = D                  # raw rows unpadded: only the copying thread reads them
        STAGE = 0                       # one raw stage K | V, then planes K big, K small,
        K_OFF = 2 * BK * D              # V big, V small
        V_OFF = K_OFF + 2 * TILE
        SMEM_FLOATS = K_OFF + 4 * TILE
    else:
        RAW_STRIDE = STRIDE
        STAGE = 2 * TILE                # K | V, two buffers
        K_OFF = 0
        V_OFF = TILE
        SMEM_FLOATS = 2 * STAGE
    assert 4 * SMEM_FLOATS == dq_smem_bytes(D, BK, PRESPLIT)
    DYNAMIC = PRESPLIT or 4 * SMEM_FLOATS > SMEM_LIMIT_BYTES
    SMEM_DECL = 0 if DYNAMIC else SMEM_FLOATS
    CHUNKS = D // 4                     # 16-byte chunks per row
    KC = D // 8                         # k-steps of S = Q K^T and dP = dO V^T
    SU = unroll if KC % unroll == 0 else 1
    NT_S = BK // 8                      # 16x8 score tiles per warp (= k-steps of dQ += dS K)
    NT_O = D // 8                       # 16x8 dQ tiles per warp
    A_REGS, S_REGS, O_REGS = KC * 4, NT_S * 4, NT_O * 4
    Q_REGS, DO_REGS = operands_in_registers("dq", D)
    QF_REGS = A_REGS if Q_REGS else 4
    DF_REGS = A_REGS if DO_REGS else 4
    assert BQ % 16 == 0 and BK % 8 == 0 and D % 8 == 0
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    fmix = _device_helpers()
    mask_scores = _score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK)
    dq_row_stats = _dq_row_stats(HAS_DROPOUT)
    mma3, load_tile, split_chunks = _tf32_helpers(THREADS, CHUNKS, BK)
    _, _, ld_b32 = _smem_intrinsics()
    acc_c_times_b = _c_times_shared_b(NT_S, NT_O, STRIDE, TILE, PRESPLIT, mma3, ld_b32)
    rows_x_rows = functools.partial(_rows_times_shared_rows, NT_S, KC, SU, STRIDE, TILE, PRESPLIT)
    qk_product = rows_x_rows(Q_REGS, mma3, ld_b32)        # S = Q K^T
    dov_product = rows_x_rows(DO_REGS, mma3, ld_b32)      # dP = dO V^T

    tile_and_head = tile_order.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, dout, lse, delta, dq, offsets, kv_index, sched_b, sched_h, group,
               n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash, threshold,
               inv_keep):
        smem = cuda.shared.array(SMEM_DECL, dtype=float32, alignment=16)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        tile, bh, n_blocks_q = tile_and_head()
        m_blk = n_blocks_q - 1 - tile                       # longest (causal) tiles first
        n_heads = dq.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        s = (b * sched_b + h * sched_h)
        row0 = m_blk * BQ + warp * 16 + gid                  # rows row0 and row0 + 8
        # Q rows re-read from global memory (d=128) are clamped into [0, n_q): rows past n_q
        # have P = 0 and are never written
        qr0 = min(row0, n_q - 1)
        qr1 = min(row0 + 8, n_q - 1)

        # -- Q (at d=64) and dO fragments (A operands, dims not permuted: a0/a2 = dims t/t+4)
        #    into registers as float32; delta = rowsum(dO * O) --
        qf = cuda.local.array(QF_REGS, dtype=float32)
        dof = cuda.local.array(DF_REGS, dtype=float32)
        dsum = cuda.local.array(2, dtype=float32)
        dsum[0] = float32(0.0)
        dsum[1] = float32(0.0)
        for kc in range(KC):
            for r in range(4):
                row = row0 + 8 * (r & 1)
                col = kc * 8 + tig + 4 * (r >> 1)
                qv = float32(0.0)
                dv = float32(0.0)
                if row < n_q:
                    if Q_REGS:
                        qv = q[b, h, row, col]
                    dv = dout[b, h, row, col]
                    dsum[r & 1] += dv * out[b, h, row, col]
                if Q_REGS:
                    qf[kc * 4 + r] = qv
                if DO_REGS:
                    dof[kc * 4 + r] = dv
        delta_r = cuda.local.array(2, dtype=float32)
        lse2_r = cuda.local.array(2, dtype=float32)
        h_row = cuda.local.array(2, dtype=uint64)
        dq_row_stats(dsum, delta_r, lse2_r, h_row, row0, tig, b, h, bh, n_q, lse, delta,
                     seed_hash)

        acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        dp_reg = cuda.local.array(S_REGS, dtype=float32)

        # per-lane float offsets inside a buffer (see kernels.fragments_tf32)
        b_lane = gid * STRIDE + tig                         # X[key g][dims t, t+4]
        t_lane = 2 * tig * STRIDE + gid                     # K[key 2t][dim g], K[2t+1][g]
        # this thread's cp.async chunk: rows r0 + i * ROW_STEP, floats 4 ch .. 4 ch + 3
        r0 = tid // CHUNKS
        ch = tid % CHUNKS
        k_head = X.global_addr(k, b, hk, 0, ch * 4)
        v_head = X.global_addr(v, b, hk, 0, ch * 4)
        k_row_bytes = uint64(k.strides[2])
        v_row_bytes = uint64(v.strides[2])
        smem0 = X.shared_addr(smem, 0)
        k_copy = smem0 + uint32(4 * (r0 * RAW_STRIDE + ch * 4))
        v_copy = smem0 + uint32(4 * (BK * RAW_STRIDE + r0 * RAW_STRIDE + ch * 4))
        # presplit: this thread's chunk positions in the planes (big; small one TILE further)
        k_plane = smem0 + uint32(4 * (K_OFF + r0 * STRIDE + ch * 4))
        v_plane = smem0 + uint32(4 * (V_OFF + r0 * STRIDE + ch * 4))

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if start < stop:
            n0 = kv_index[start]
            load_tile(k_head, k_row_bytes, n0 * BK + r0, n_k, k_copy, RAW_STRIDE)
            load_tile(v_head, v_row_bytes, n0 * BK + r0, n_k, v_copy, RAW_STRIDE)
            X.cp_async_commit()

        for it in range(start, stop):
            n_blk = kv_index[it]
            if PRESPLIT:
                buf = 0
                X.cp_async_wait_all()
                split_chunks(k_copy, k_plane, k_plane + uint32(4 * TILE))
                split_chunks(v_copy, v_plane, v_plane + uint32(4 * TILE))
                cuda.syncthreads()
                if it + 1 < stop:       # the raw stage is free: every thread split its chunks
                    nxt = kv_index[it + 1]
                    load_tile(k_head, k_row_bytes, nxt * BK + r0, n_k, k_copy, RAW_STRIDE)
                    load_tile(v_head, v_row_bytes, nxt * BK + r0, n_k, v_copy, RAW_STRIDE)
                    X.cp_async_commit()
            else:
                buf = ((it - start) & 1) * STAGE
                if it + 1 < stop:
                    nxt = kv_index[it + 1]
                    nbuf = uint32(4 * (STAGE - buf))
                    load_tile(k_head, k_row_bytes, nxt * BK + r0, n_k, k_copy + nbuf, STRIDE)
                    load_tile(v_head, v_row_bytes, nxt * BK + r0, n_k, v_copy + nbuf, STRIDE)
                    X.cp_async_commit()
                    X.cp_async_wait_1()
                else:
                    X.cp_async_wait_all()
                cuda.syncthreads()

            # -- compute qk and dO V^T: S = Q K^T, dP = dO V^T, three tf32 mma per step --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
                dp_reg[i] = float32(0.0)
            k_addr = smem0 + uint32(4 * (buf + K_OFF + b_lane))
            v_addr = smem0 + uint32(4 * (buf + V_OFF + b_lane))
            qk_product(s_reg, qf, q, b, h, qr0, qr1, tig, k_addr)
            # (a separate loop: one loop over both products is too large to be unrolled)
            dov_product(dp_reg, dof, dout, b, h, qr0, qr1, tig, v_addr)

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            mask_scores(s_reg, 0, row0, n_blk, m_blk, col_base, b, h, n_q, n_k, mask, mask_b,
                        mask_h, mask_q)

            # -- P = exp2(S * scale * log2e - lse2), dS = P * (dP * Z - delta) --
            for nt in range(NT_S):
                for i in range(4):
                    e = nt * 4 + i
                    r = i >> 1
                    p = X.ex2(s_reg[e] * scale_log2 - lse2_r[r])
                    dpv = dp_reg[e]
                    if HAS_DROPOUT:
                        col = col_base + nt * 8 + (i & 1)
                        keep = fmix(h_row[r] ^ uint64(col)) >= uint64(threshold)
                        dpv = dpv * inv_keep if keep else float32(0.0)
                    s_reg[e] = p * (dpv - delta_r[r])

            # -- dQ += dS K: dS's A fragment is its C fragment (a0, a1, a2, a3 = c0, c2, c1, c3
            #    under the key permutation); K's B fragment = K[key 2t][g], K[key 2t+1][g] --
            kt_addr = smem0 + uint32(4 * (buf + K_OFF + t_lane))
            acc_c_times_b(s_reg, acc, kt_addr)
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

        # -- epilogue: dQ = scale * acc --
        for r in range(2):
            row = row0 + 8 * r
            if row < n_q:
                for nt in range(NT_O):
                    dq[b, h, row, nt * 8 + 2 * tig] = acc[nt * 4 + 2 * r] * scale
                    dq[b, h, row, nt * 8 + 2 * tig + 1] = acc[nt * 4 + 2 * r + 1] * scale

    kernel.threads = THREADS
    kernel.smem_bytes = 4 * SMEM_FLOATS if DYNAMIC else 0
    kernel.config = {"block_q": BQ, "block_k": BK, "presplit": PRESPLIT, "unroll": SU}
    return kernel


def _build_dkdv_kernel(head_dim, block_k, block_q, causal, has_mask, has_dropout, presplit,
                       unroll, head_group):
    from numba import cuda, float32, uint32, uint64

    from kernels import mma as X

    D = head_dim
    BK = block_k                        # key rows per block (16 per warp)
    BQ = block_q                        # queries per shared stage
    NUM_WARPS = BK // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + PAD_FLOATS             # floats per shared Q or dO row (split planes too)
    TILE = BQ * STRIDE                  # floats per Q or dO buffer (or plane)
    PRESPLIT = presplit
    if PRESPLIT:                        # as in the dQ kernel: raw Q | dO, then Q big, Q small,
        RAW_STRIDE = D                  # dO big, dO small
        STAGE = 0
        Q_OFF = 2 * BQ * D
        DO_OFF = Q_OFF + 2 * TILE
        SMEM_FLOATS = Q_OFF + 4 * TILE
    else:
        RAW_STRIDE = STRIDE
        STAGE = 2 * TILE                # Q | dO, two buffers
        Q_OFF = 0
        DO_OFF = TILE
        SMEM_FLOATS = 2 * STAGE
    ROWV = 4 * BQ                       # floats: lse2 | delta, two buffers (static)
    assert 4 * (SMEM_FLOATS + ROWV) == dkdv_smem_bytes(D, BQ, PRESPLIT)
    DYNAMIC = PRESPLIT or 4 * (SMEM_FLOATS + ROWV) > SMEM_LIMIT_BYTES
    SMEM_DECL = 0 if DYNAMIC else SMEM_FLOATS
    CHUNKS = D // 4
    KC = D // 8                         # k-steps of S^T = K Q^T and dP^T = V dO^T
    SU = unroll if KC % unroll == 0 else 1
    NT_S = BQ // 8                      # 16x8 score tiles per warp (= k-steps of dV, dK)
    NT_O = D // 8                       # 16x8 dK / dV tiles per warp
    A_REGS, S_REGS, O_REGS = KC * 4, NT_S * 4, NT_O * 4
    K_REGS, V_REGS = operands_in_registers("dkdv", D)
    KF_REGS = A_REGS if K_REGS else 4
    VF_REGS = A_REGS if V_REGS else 4
    HASHES = 2 * NT_S
    assert BQ % 8 == 0 and BK % 16 == 0 and D % 8 == 0
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    fmix = _device_helpers()
    mma3, load_tile, split_chunks = _tf32_helpers(THREADS, CHUNKS, BQ)
    _, _, ld_b32 = _smem_intrinsics()
    acc_c_times_b = _c_times_shared_b(NT_S, NT_O, STRIDE, TILE, PRESPLIT, mma3, ld_b32)
    rows_x_rows = functools.partial(_rows_times_shared_rows, NT_S, KC, SU, STRIDE, TILE, PRESPLIT)
    kq_product = rows_x_rows(K_REGS, mma3, ld_b32)        # S^T = K Q^T
    vdo_product = rows_x_rows(V_REGS, mma3, ld_b32)       # dP^T = V dO^T

    stage_rows, locate = _dkdv_row_helpers(BQ, THREADS)
    mask_scores_t = _transposed_score_mask(NT_S, CAUSAL, HAS_MASK)

    tile_and_head = tile_order.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, dout, lse, delta, dk, dv, offsets, q_index, sched_b, sched_h, group,
               n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash, threshold,
               inv_keep):
        smem = cuda.shared.array(SMEM_DECL, dtype=float32, alignment=16)
        # per stage: lse * log2(e) (+inf where P = 0) and delta of its BQ queries
        rowv = cuda.shared.array(ROWV, dtype=float32)   # buf 0: lse2 | delta, buf 1: same
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        n_blk, bhk, _ = tile_and_head()                     # K tile 0 (causal: longest) first
        n_heads_kv = dk.shape[1]
        n_heads = n_heads_kv * group
        b = bhk // n_heads_kv
        hk = bhk % n_heads_kv
        key0 = n_blk * BK + warp * 16 + gid                  # key rows key0 and key0 + 8
        # K and V rows re-read from global memory are clamped into [0, n_k): rows past n_k
        # only feed dK/dV rows that are never written
        kr0 = min(key0, n_k - 1)
        kr1 = min(key0 + 8, n_k - 1)

        # -- K and V fragments (A operands, dims not permuted) into registers, where
        #    `operands_in_registers` says so --
        kf = cuda.local.array(KF_REGS, dtype=float32)
        vf = cuda.local.array(VF_REGS, dtype=float32)
        for kc in range(KC):
            for r in range(4):
                key = key0 + 8 * (r & 1)
                col = kc * 8 + tig + 4 * (r >> 1)
                kv_ = float32(0.0)
                vv = float32(0.0)
                if key < n_k:
                    if K_REGS:
                        kv_ = k[b, hk, key, col]
                    if V_REGS:
                        vv = v[b, hk, key, col]
                if K_REGS:
                    kf[kc * 4 + r] = kv_
                if V_REGS:
                    vf[kc * 4 + r] = vv

        dk_acc = cuda.local.array(O_REGS, dtype=float32)
        dv_acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            dk_acc[i] = float32(0.0)
            dv_acc[i] = float32(0.0)
        st = cuda.local.array(S_REGS, dtype=float32)    # S^T, then P^T * Z: 16 keys x BQ queries
        dpt = cuda.local.array(S_REGS, dtype=float32)   # dP^T, then dS^T
        hash_c = cuda.local.array(HASHES, dtype=uint64)   # dropout row hash per query column

        # per-lane float offsets inside a buffer (see kernels.fragments_tf32)
        b_lane = gid * STRIDE + tig                         # X[query g][dims t, t+4]
        t_lane = 2 * tig * STRIDE + gid                     # X[query 2t][dim g], X[2t+1][g]
        r0 = tid // CHUNKS
        ch = tid % CHUNKS
        q_row_bytes = uint64(q.strides[2])
        do_row_bytes = uint64(dout.strides[2])
        smem0 = X.shared_addr(smem, 0)
        q_copy = smem0 + uint32(4 * (r0 * RAW_STRIDE + ch * 4))
        do_copy = smem0 + uint32(4 * (BQ * RAW_STRIDE + r0 * RAW_STRIDE + ch * 4))
        q_plane = smem0 + uint32(4 * (Q_OFF + r0 * STRIDE + ch * 4))
        do_plane = smem0 + uint32(4 * (DO_OFF + r0 * STRIDE + ch * 4))

        n_items = 0
        for g in range(group):
            s = b * sched_b + (hk * group + g) * sched_h
            n_items += offsets[s, n_blk + 1] - offsets[s, n_blk]
        if n_items > 0:
            h, m_blk = locate(0, offsets, q_index, b, hk, group, sched_b, sched_h, n_blk)
            load_tile(X.global_addr(q, b, h, 0, ch * 4), q_row_bytes, m_blk * BQ + r0, n_q,
                      q_copy, RAW_STRIDE)
            load_tile(X.global_addr(dout, b, h, 0, ch * 4), do_row_bytes, m_blk * BQ + r0, n_q,
                      do_copy, RAW_STRIDE)
            X.cp_async_commit()
            stage_rows(lse, delta, b, h, m_blk * BQ, n_q, rowv, 0, tid)

        for t in range(n_items):
            buf = (t & 1) * STAGE
            rbuf = (t & 1) * 2 * BQ
            h, m_blk = locate(t, offsets, q_index, b, hk, group, sched_b, sched_h, n_blk)
            if PRESPLIT:
                X.cp_async_wait_all()
                split_chunks(q_copy, q_plane, q_plane + uint32(4 * TILE))
                split_chunks(do_copy, do_plane, do_plane + uint32(4 * TILE))
                cuda.syncthreads()
                if t + 1 < n_items:     # the raw stage is free: every thread split its chunks
                    h_n, m_n = locate(t + 1, offsets, q_index, b, hk, group, sched_b, sched_h,
                                      n_blk)
                    load_tile(X.global_addr(q, b, h_n, 0, ch * 4), q_row_bytes, m_n * BQ + r0,
                              n_q, q_copy, RAW_STRIDE)
                    load_tile(X.global_addr(dout, b, h_n, 0, ch * 4), do_row_bytes,
                              m_n * BQ + r0, n_q, do_copy, RAW_STRIDE)
                    X.cp_async_commit()
                    stage_rows(lse, delta, b, h_n, m_n * BQ, n_q, rowv, 2 * BQ - rbuf, tid)
            elif t + 1 < n_items:
                h_n, m_n = locate(t + 1, offsets, q_index, b, hk, group, sched_b, sched_h, n_blk)
                nbuf = uint32(4 * (STAGE - buf))
                load_tile(X.global_addr(q, b, h_n, 0, ch * 4), q_row_bytes, m_n * BQ + r0, n_q,
                          q_copy + nbuf, STRIDE)
                load_tile(X.global_addr(dout, b, h_n, 0, ch * 4), do_row_bytes, m_n * BQ + r0,
                          n_q, do_copy + nbuf, STRIDE)
                X.cp_async_commit()
                stage_rows(lse, delta, b, h_n, m_n * BQ, n_q, rowv, 2 * BQ - rbuf, tid)
                X.cp_async_wait_1()
                cuda.syncthreads()
            else:
                X.cp_async_wait_all()
                cuda.syncthreads()

            bh = b * n_heads + h
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            needs_mask = HAS_MASK
            if CAUSAL:
                needs_mask = needs_mask or (n_blk * BK + BK - 1 > m_blk * BQ)
            qc0 = m_blk * BQ + 2 * tig                       # query column of (nt=0, i=0)
            if HAS_DROPOUT:
                for u in range(HASHES):
                    hash_c[u] = fmix(h_bh ^ uint64(qc0 + 8 * (u >> 1) + (u & 1)))

            # -- S^T = K Q^T and dP^T = V dO^T (16 keys x BQ queries each) --
            for i in range(S_REGS):
                st[i] = float32(0.0)
                dpt[i] = float32(0.0)
            q_addr = smem0 + uint32(4 * (buf + Q_OFF + b_lane))
            do_addr = smem0 + uint32(4 * (buf + DO_OFF + b_lane))
            kq_product(st, kf, k, b, hk, kr0, kr1, tig, q_addr)
            # (a separate loop: one loop over both products is too large to be unrolled)
            vdo_product(dpt, vf, v, b, hk, kr0, kr1, tig, do_addr)

            # -- masks (causal diagonal, boolean mask) on S^T --
            if needs_mask:
                mask_scores_t(st, qc0, key0, b, h, n_q, n_k, mask, mask_b, mask_h, mask_q)

            # -- P^T = exp2(S^T * scale * log2e - lse2), Z from the dropout hash,
            #    dS^T = P^T * (dP^T * Z - delta) --
            for nt in range(NT_S):
                for i in range(4):
                    e = nt * 4 + i
                    col = rbuf + 8 * nt + 2 * tig + (i & 1)
                    p = X.ex2(st[e] * scale_log2 - rowv[col])
                    z = float32(1.0)
                    if HAS_DROPOUT:
                        key = key0 + 8 * (i >> 1)
                        keep = fmix(hash_c[2 * nt + (i & 1)] ^ uint64(key)) >= uint64(threshold)
                        z = inv_keep if keep else float32(0.0)
                    st[e] = p * z
                    dpt[e] = p * (dpt[e] * z - rowv[col + BQ])

            # -- dV += (P^T Z) dO: P^T's A fragment is its C fragment (a0, a1, a2, a3 = c0, c2,
            #    c1, c3 under the query permutation); dO's B = dO[query 2t][g], dO[2t+1][g] --
            dot_addr = smem0 + uint32(4 * (buf + DO_OFF + t_lane))
            acc_c_times_b(st, dv_acc, dot_addr)

            # -- dK += dS^T Q: the same with dS^T and Q[query 2t][g], Q[2t+1][g] --
            qt_addr = smem0 + uint32(4 * (buf + Q_OFF + t_lane))
            acc_c_times_b(dpt, dk_acc, qt_addr)
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

        # -- epilogue: dK = scale * dK_acc, dV --
        for r in range(2):
            key = key0 + 8 * r
            if key < n_k:
                for nt in range(NT_O):
                    e = nt * 4 + 2 * r
                    col = nt * 8 + 2 * tig
                    dk[b, hk, key, col] = dk_acc[e] * scale
                    dk[b, hk, key, col + 1] = dk_acc[e + 1] * scale
                    dv[b, hk, key, col] = dv_acc[e]
                    dv[b, hk, key, col + 1] = dv_acc[e + 1]

    kernel.threads = THREADS
    kernel.smem_bytes = 4 * SMEM_FLOATS if DYNAMIC else 0
    kernel.config = {"block_k": BK, "block_q": BQ, "presplit": PRESPLIT, "unroll": SU}
    return kernel


# -- host side -----------------------------------------------------------------------------------
def accepts(q, k, v, block_q=None, block_k=None, block_mask=None) -> bool:
    """Whether `backward` takes these inputs: float32 arrays on a real GPU (torch CUDA tensors or
    Numba device arrays), head_dim in SUPPORTED_HEAD_DIMS, and, with a block mask, mask tiles
    that the kernel tiles divide. For dispatching; False under the CUDA simulator and for NumPy
    arrays."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        kind = _kind(q)
        if _kind(k) != kind or _kind(v) != kind:
            return False
    except TypeError:
        return False
    if kind == "torch":
        import torch
        if not (q.is_cuda and q.dtype == torch.float32 and k.dtype == q.dtype
                and v.dtype == q.dtype):
            return False
    elif kind == "numba":
        if {str(np.dtype(x.dtype)) for x in (q, k, v)} != {"float32"}:
            return False
    else:
        return False
    if len(q.shape) != 4:
        return False
    d = int(q.shape[-1])
    return kernel_tiles(d, block_q, block_k, block_mask is not None) is not None


def backward(q, k, v, out, lse, dout, *, scale, causal=False, mask=None, block_mask=None,
             dropout_p=0.0, seed=0, block_q=None, block_k=None):
    """Float32 3xTF32 tensor-core attention backward: returns ``(dq, dk, dv)``.

    Same contract as `kernels.backward`: q, out, dout [B, Hq, Nq, d], k/v [B, Hkv, Nk, d],
    lse float32 [B, Hq, Nq] from the forward (natural log, -inf for a fully masked row, whose
    gradients are 0); float32 (torch CUDA tensors, Numba device arrays or NumPy arrays), d in
    {64, 128}. dq, dk, dv are float32 with the inputs' kind of memory; dk and dv are summed over
    the query heads of each GQA group. ``block_q``/``block_k`` are the block mask's tile shape
    (ignored without one: the kernels use `default_tiles`); with a block mask they must be
    multiples of 16.
    """
    from numba import cuda

    kind, batch, heads, n_q, d, heads_kv, n_k, scale = check_problem(
        q, k, v, scale=scale, dropout_p=dropout_p, head_dims=SUPPORTED_HEAD_DIMS,
        kernel_name="3xTF32", out=out, dout=dout, lse=lse)
    if block_mask is not None and (block_q is None or block_k is None):
        raise ValueError("block_mask needs block_q and block_k (its tile shape)")
    tiles = kernel_tiles(d, None if block_q is None else int(block_q),
                         None if block_k is None else int(block_k), block_mask is not None)
    if tiles is None:
        raise ValueError(f"block_q={block_q}, block_k={block_k}: the block mask's tiles must be "
                         f"multiples of 16 for the 3xTF32 backward")
    (dq_bq, dq_bk), (kv_bk, kv_bq) = tiles
    has_dropout, seed_hash, threshold, inv_keep = dropout_constants(seed, dropout_p)
    kv_cfg = dkdv_dropout_config(d, kv_bq, has_dropout)
    kv_bq = kv_cfg.get("block_q", kv_bq)

    # -- the operands as float32 device arrays (rows contiguous and 16-byte aligned) --
    stream = fastlaunch.launch_stream()
    if kind == "torch":
        import torch
        for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
            if x.dtype != torch.float32:
                raise TypeError(f"{name} must be float32, got {x.dtype}")
        if not q.is_cuda:
            raise TypeError("torch tensors must be on a CUDA device")

        def prep(t):
            t = t.detach()
            if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 4 for s in t.stride()[:-1]):
                t = t.contiguous()
            return t                       # launched in place (kernels.fastlaunch)

        qd, kd, vd, od, dod = (prep(x) for x in (q, k, v, out, dout))
        lsed = lse.detach().to(torch.float32).contiguous()
        dq_t = torch.empty((batch, heads, n_q, d), dtype=torch.float32, device=q.device)
        dk_t = torch.empty((batch, heads_kv, n_k, d), dtype=torch.float32, device=q.device)
        dv_t = torch.empty((batch, heads_kv, n_k, d), dtype=torch.float32, device=q.device)
        delta_t = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
        dqd, dkd, dvd, deltad = dq_t, dk_t, dv_t, delta_t
        stream = fastlaunch.launch_stream(q)      # torch's current stream on q's device
    else:
        for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
            if str(np.dtype(x.dtype)) != "float32":
                raise TypeError(f"{name} must be float32, got {x.dtype}")

        def prep(a):
            if kind == "numpy":
                return cuda.to_device(np.ascontiguousarray(a))
            st = a.strides
            if st[-1] != 4 or any(s % 16 for s in st[:-1]):
                a = cuda.to_device(np.ascontiguousarray(a.copy_to_host()))
            return a

        qd, kd, vd, od, dod = (prep(x) for x in (q, k, v, out, dout))
        if kind == "numpy":
            lsed = cuda.to_device(np.ascontiguousarray(lse, dtype=np.float32))
        else:
            if str(np.dtype(lse.dtype)) != "float32":
                raise TypeError(f"lse must be float32, got {lse.dtype}")
            lsed = lse
        dqd = cuda.device_array((batch, heads, n_q, d), dtype=np.float32)
        dkd = cuda.device_array((batch, heads_kv, n_k, d), dtype=np.float32)
        dvd = cuda.device_array((batch, heads_kv, n_k, d), dtype=np.float32)
        deltad = cuda.device_array((batch, heads, n_q), dtype=np.float32)

    # -- mask, schedules, dropout constants --
    has_mask = mask is not None
    maskd, mb, mh, mq = mask_on_device(mask, kind, batch, heads, n_q, n_k)
    (kv_off, kv_idx, kv_sb, kv_sh), (q_off, q_idx, q_sb, q_sh) = device_schedules(
        block_mask, block_q, block_k, n_q, n_k, (dq_bq, dq_bk), (kv_bq, kv_bk), causal, batch,
        heads)
    group = heads // heads_kv
    consts = (maskd, mb, mh, mq, np.float32(scale * LOG2E), np.float32(scale),
              np.uint32(seed_hash), np.uint32(threshold), np.float32(inv_keep))

    # -- dQ (and delta) first, then dK/dV, which reads delta --
    head_group = tile_order.head_group(causal, "bwd")
    kern = get_dq_kernel(d, dq_bq, dq_bk, bool(causal), has_mask, has_dropout,
                         head_group=head_group)
    fastlaunch.launch(kern, (cdiv(n_q, dq_bq), batch * heads),
                      kern.threads, stream, (
        qd, kd, vd, od, dod, lsed, deltad, dqd, kv_off, kv_idx, kv_sb, kv_sh, group, n_q, n_k,
        *consts), sharedmem=kern.smem_bytes)
    kern = get_dkdv_kernel(d, kv_bk, kv_bq, bool(causal), has_mask, has_dropout,
                           kv_cfg.get("presplit"), kv_cfg.get("unroll"), head_group=head_group)
    fastlaunch.launch(kern, (cdiv(n_k, kv_bk), batch * heads_kv),
                      kern.threads, stream, (
        qd, kd, vd, dod, lsed, deltad, dkd, dvd, q_off, q_idx, q_sb, q_sh, group, n_q, n_k,
        *consts), sharedmem=kern.smem_bytes)

    if kind == "torch":
        return dq_t, dk_t, dv_t
    if kind == "numpy":
        return tuple(x.copy_to_host() for x in (dqd, dkd, dvd))
    return dqd, dkd, dvd


def _time_main(argv=None):
    """``python -m kernels.flash_tf32_bwd [--n N] [--d D ...] [--causal]``: times (CUDA events,
    median of a few runs) this backward, the float32 CUDA-core backward of `kernels.launch`
    (KERNELS_FP32_TENSOR_CORES=0) and PyTorch SDPA EFFICIENT float32 forward+backward at
    B=4, H=32 on the current GPU, and prints one line per head dim."""
    import argparse

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import launch
    from kernels.flash_tf32_fwd import forward

    ap = argparse.ArgumentParser(description=_time_main.__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=None,
                    help=f"time only this backward, once per value of {VARIANT_ENV} given "
                         f"(d=128; '' is the default configuration), causal and not")
    ap.add_argument("--pick", default=None,
                    help="with --variants: write the variant with the least total time to "
                         "this file")
    args = ap.parse_args(argv)

    from kernels.bench import event_ms

    def timed(fn):
        fn()
        times = [event_ms(torch, fn) for _ in range(args.reps)]
        return sorted(times)[len(times) // 2]

    print(torch.cuda.get_device_name(), flush=True)
    if args.variants is not None:
        totals = {}
        for d in args.d:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(4, 32, args.n, d, device="cuda", generator=g)
                           for _ in range(4))
            scale = 1 / math.sqrt(d)
            for causal in (False, True):
                out, lse = forward(q, k, v, scale=scale, causal=causal)
                for var in args.variants:
                    os.environ[VARIANT_ENV] = var
                    cfg = default_config(d)
                    t = timed(lambda: backward(q, k, v, out, lse, do, scale=scale,
                                               causal=causal))
                    print(f"N={args.n} d={d} causal={causal} variant={var!r} config={cfg}: "
                          f"bwd {t:.2f} ms", flush=True)
                    totals[var] = totals.get(var, 0.0) + t
                os.environ.pop(VARIANT_ENV, None)
        best = min(totals, key=totals.get)
        print(f"least total time: variant {best!r} ({totals[best]:.2f} ms)", flush=True)
        if args.pick:
            with open(args.pick, "w") as f:
                f.write(best)
        return
    for d in args.d:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(4, 32, args.n, d, device="cuda", generator=g)
                       for _ in range(4))
        scale = 1 / math.sqrt(d)
        out, lse = forward(q, k, v, scale=scale, causal=args.causal)
        kw = dict(scale=scale, causal=args.causal)
        t_fwd = timed(lambda: forward(q, k, v, **kw))
        t_bwd = timed(lambda: backward(q, k, v, out, lse, do, **kw))
        old = os.environ.get("KERNELS_FP32_TENSOR_CORES")
        os.environ["KERNELS_FP32_TENSOR_CORES"] = "0"
        try:
            t_core = timed(lambda: launch.backward(q, k, v, out, lse, do, **kw))
        finally:
            if old is None:
                del os.environ["KERNELS_FP32_TENSOR_CORES"]
            else:
                os.environ["KERNELS_FP32_TENSOR_CORES"] = old
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))

        def sdpa(bwd):
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg,
                                                                     is_causal=args.causal)
                if bwd:
                    o.backward(do)

        t_sdpa_f = timed(lambda: sdpa(False))
        t_sdpa_fb = timed(lambda: sdpa(True))
        print(f"N={args.n} d={d} causal={args.causal}: 3xTF32 fwd {t_fwd:.2f} ms, bwd "
              f"{t_bwd:.2f} ms, fwd+bwd {t_fwd + t_bwd:.2f} ms | CUDA-core bwd {t_core:.2f} ms "
              f"| SDPA EFFICIENT fwd {t_sdpa_f:.2f} ms, fwd+bwd {t_sdpa_fb:.2f} ms | fwd+bwd "
              f"ratio (EFFICIENT / ours) {t_sdpa_fb / (t_fwd + t_bwd):.2f}x", flush=True)


if __name__ == "__main__":
    _time_main()
