"""Tensor-core FlashAttention-2 forward for float32 CUDA inputs with 3xTF32 (Numba + inline PTX).

This module owns the float32 tensor-core forward kernel and its host entry point `forward`, which
has the signature of the package's `kernels.forward` contract. Every float32 operand x is split
into ``big = tf32(x)`` and ``small = tf32(x - big)`` and each product is computed as
``A_small B_big + A_big B_small + A_big B_big`` on the TF32 tensor cores with float32
accumulation (what CUTLASS calls ``OpMultiplyAddFastF32``): the dropped ``A_small B_small`` and
the rounding of ``small`` are ~2**-22 of each product, so the result has float32-level accuracy.

The algorithm is FlashAttention-2, structured as `kernels.flash_mma_fwd`:

* one thread block per (Q tile of ``block_q = 16 * num_warps`` rows, batch * head), longest
  causal tiles first (of all heads: `kernels.tile_order`); each warp owns 16 query rows, with
  the running max ``m_i``, running sum ``l_i`` and O accumulator in registers; Q's fragments
  are split into big/small once;
* the default (``presplit``, `default_config`; both head dims: 8 warps, 32-key stages, dynamic
  shared memory through `kernels.fastlaunch`, 224 KiB at d=128): each K/V tile lands raw by
  ``cp.async`` in one stage (V copied so a thread holds key pairs 2p, 2p + 1); each thread
  splits the 16-byte chunks it copied (visible to it after its own wait) into a big/small
  shared stage laid out as the B fragments (K: per key and (k-step, t) 16 bytes big2|small2; V:
  per key pair and dim 16 bytes big2|small2; XOR-swizzled, conflict-free 128-bit loads), one
  ``__syncthreads``, then the next tile's copy is issued and the warps run both products with
  one 128-bit load per B fragment and no conversion. Q's big/small fragments sit in shared
  memory too, 32 bytes per thread and k-step that only that thread reads back, which keeps the
  kernel at 178 registers (d=128; 134 at d=64) without spills. With 32-key stages there is one
  split stage (a second barrier after the products); with 16-key stages two, used alternately;
* the register-split path (``presplit=0``; the previous defaults 64 x 16 at d=128 and 64 x 32 at
  d=64): two padded raw K/V buffers (tile j + 1 loads while tile j computes), Q's fragments in
  registers, every warp splitting each B element it loads (K rows padded by 8 floats, 64-bit
  loads; V rows by 4 floats, two 32-bit loads of rows 2t and 2t + 1, conflict-free);
* the tail tile is zero-filled by the copy itself;
* S = Q K^T and O += P V with ``mma.sync.m16n8k8`` tf32, three mma per product tile; the k index
  of both products is permuted (`kernels.fragments_tf32.k_perm`) so that K's fragment is one
  64-bit load per register pair and the C fragment of the scores *is* P's A fragment (no shared
  memory round trip for P);
* online softmax with exp2 and ``log2(e)`` folded into the scale; one rescale at the end; O and
  the float32 natural-log logsumexp written once;
* the visited K/V tiles come from `ioaware.block_info.BlockInfo.kv_schedule()` (causal and
  block-sparse skipping), elementwise masks only on tiles that need them; dropout regenerates the
  keep bits of `ioaware.dropout` on the fly; GQA/MQA through ``h // (Hq // Hkv)``.

H100 timings of both paths and of the variants: kernels/NOTES.md, "3xTF32 forward at d=128 with
dynamic shared memory"; ``python -m kernels.flash_tf32_fwd --d 128 --variants "" "unroll=1"``
times variants (`default_config`'s environment override) against SDPA EFFICIENT.

Supported: head_dim 64 and 128, float32 (torch CUDA tensors, Numba device arrays; NumPy arrays
are copied). Other head dims are refused here with a ValueError; `kernels.forward` sends them
(and every input `accepts` refuses) to the float32 CUDA-core kernel. The CUDA simulator cannot
run inline PTX: under it `forward` raises RuntimeError.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np

from ioaware.block_info import cdiv

from kernels import fastlaunch, tile_order
from kernels.flash_mma_fwd import (_device_const, _device_helpers, _kind, _schedule, _score_mask,
                                   check_problem, dropout_constants, mask_on_device)

__all__ = ["forward", "accepts", "SUPPORTED_HEAD_DIMS", "BLOCK_Q_CHOICES", "BLOCK_K_CHOICES",
           "default_blocks", "smem_bytes", "get_kernel", "q_split_once"]

SUPPORTED_HEAD_DIMS = (64, 128)
BLOCK_Q_CHOICES = (32, 64, 128)      # 2, 4 or 8 warps of 16 query rows
BLOCK_K_CHOICES = (16, 32)
SMEM_LIMIT_BYTES = 227 * 1024        # dynamic shared memory per block with the opt-in (sm_90)
K_PAD_FLOATS = 8
V_PAD_FLOATS = 4
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

#: Per head dim: (block_q, block_k, presplit, split_once, s_dual, s_unroll); see
#: `default_config`.
_DEFAULT_CONFIG = {64: (128, 32, True, True, False, 2), 128: (128, 32, True, True, False, 2)}
_CONFIG_ENV = "KERNELS_TF32_FWD_D{}"


def default_config(head_dim: int) -> dict:
    """The compile-time configuration `forward` uses for ``head_dim``:

    * ``block_q`` x ``block_k``: query rows per block (16 per warp) and keys per K/V stage;
    * ``presplit``: K/V stages land raw by cp.async and are split once into big/small TF32
      shared tiles (each thread splits the chunks it copied, then one __syncthreads), so the
      warps read ready B operands with one 128-bit load and no cvt; else every warp splits
      the raw float32 B elements it loads (4x (8 warps: 8x) redundant cvt work per block);
    * ``split_once``: Q's big/small fragments made once and kept in registers (else Q raw in
      registers, split at every k-step);
    * ``s_dual``: S = Q K^T accumulates the two small-term products and the big*big product in
      two separate accumulators (two mma dependency chains per score tile instead of one);
    * ``s_unroll``: k-steps of S per iteration of its loop as written (presplit only: with Q in
      shared memory nothing forces NVVM to unroll that loop, and it does not; 2 measured faster
      than 1 on the H100 at both head dims).

    The defaults are the fastest variants measured on an H100 (kernels/NOTES.md, "3xTF32 forward
    at d=128 with dynamic shared memory"). A block size whose copy assignment the pre-split
    layout cannot use (`_presplit_ok`; e.g. 32-row blocks at d=128, as `kernels.config`'s
    block-mask tiles) takes the register-split path.

    The environment variable ``KERNELS_TF32_FWD_D64`` / ``KERNELS_TF32_FWD_D128`` (e.g.
    ``bq=128,bk=32,presplit=1,split_once=0,dual=1``) overrides fields, for measurement.
    """
    return dict(_config(head_dim, os.environ.get(_CONFIG_ENV.format(head_dim), "").strip()))


@functools.lru_cache(maxsize=64)
def _config(head_dim: int, env: str) -> dict:
    """`default_config` for one value of its environment variable (parsed once; callers copy)."""
    bq, bk, ps, so, dual, unroll = _DEFAULT_CONFIG.get(head_dim, _DEFAULT_CONFIG[128])
    cfg = {"block_q": bq, "block_k": bk, "presplit": ps, "split_once": so, "s_dual": dual,
           "s_unroll": unroll}
    if env:
        names = {"bq": "block_q", "bk": "block_k", "presplit": "presplit",
                 "split_once": "split_once", "dual": "s_dual", "unroll": "s_unroll"}
        for item in env.split(","):
            key, val = item.split("=")
            name = names[key.strip()]
            cfg[name] = (int(val) if name.startswith("block") or name == "s_unroll"
                         else bool(int(val)))
    return cfg


def default_blocks(head_dim: int) -> tuple[int, int]:
    """Default (block_q, block_k) (`default_config`): 128 x 32 for d=64 and d=128."""
    cfg = default_config(head_dim)
    return cfg["block_q"], cfg["block_k"]


def smem_bytes(head_dim: int, block_k: int, presplit: bool | None = None,
               block_q: int | None = None) -> int:
    """Dynamic shared memory of one block in bytes. Without ``presplit``: K and V, two buffers
    each, padded float32 rows. With it: one raw K/V stage (the cp.async destination), two
    pre-split stages (big/small pairs, twice the raw size) and Q's small halves (block_q rows)."""
    cfg = default_config(head_dim)
    if presplit is None:
        presplit = cfg["presplit"]
    if block_q is None:
        block_q = cfg["block_q"]
    d = head_dim
    if not presplit:
        return 2 * block_k * (2 * d + K_PAD_FLOATS + V_PAD_FLOATS) * 4
    nsplit = 2 if block_k <= 16 else 1
    return d * (2 * block_k + nsplit * 4 * block_k + 2 * block_q) * 4


def _presplit_ok(head_dim: int, block_q: int, block_k: int) -> bool:
    """Whether the pre-split layout works for these tiles: the copy assignment must give a
    thread keys of one parity (K swizzle) and key pairs of one residue mod 4 (V swizzle), i.e.
    rows between a thread's chunks (threads / (d / 4)) a multiple of 4, and an even number of
    chunks per thread and tile; and the shared memory must fit."""
    row_step = 32 * (block_q // 16) // (head_dim // 4)
    loads = block_k // row_step if row_step else 0
    return (row_step >= 4 and row_step % 4 == 0 and block_k % row_step == 0 and loads % 2 == 0
            and smem_bytes(head_dim, block_k, True, block_q) <= SMEM_LIMIT_BYTES)


def q_split_once(head_dim: int) -> bool:
    """Whether Q's big/small fragments are made once (the default for both head dims: in
    shared memory on the presplit path, in registers on the register-split path) or, on the
    register-split path only, Q is kept as float32 and split again at every k-step (a compile
    switch kept for measurement)."""
    return default_config(head_dim)["split_once"] if head_dim in SUPPORTED_HEAD_DIMS else False


_KERNELS: dict = {}


def get_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, split_once=None,
               presplit=None, s_dual=None, s_unroll=None, head_group=None):
    """The compiled-on-first-launch kernel for one configuration (cached); None fields take
    `default_config`'s, and ``head_group`` (the launch order, `kernels.tile_order`) takes
    `tile_order.head_group`. ``kernel.smem_bytes`` is its dynamic shared memory."""
    if head_group is None:
        head_group = tile_order.head_group(causal, "fwd")
    cfg = default_config(head_dim)
    split_once = cfg["split_once"] if split_once is None else bool(split_once)
    presplit = cfg["presplit"] if presplit is None else bool(presplit)
    presplit = presplit and split_once and _presplit_ok(head_dim, block_q, block_k)
    s_dual = cfg["s_dual"] if s_dual is None else bool(s_dual)
    s_unroll = cfg["s_unroll"] if s_unroll is None else int(s_unroll)
    key = (head_dim, block_q, block_k, causal, has_mask, has_dropout, split_once, presplit,
           s_dual, s_unroll, int(head_group))
    if key not in _KERNELS:
        _KERNELS[key] = _build_kernel(*key)
    return _KERNELS[key]


def _build_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, split_once,
                  presplit, s_dual, s_unroll, head_group):
    from numba import cuda, float32, uint32, uint64
    from numba import types as nbt
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from kernels import mma as X
    from kernels import mma_tf32 as T

    D = head_dim
    BQ = block_q
    BK = block_k
    NUM_WARPS = BQ // 16
    THREADS = 32 * NUM_WARPS
    PRESPLIT, S_DUAL = presplit, s_dual
    SU = s_unroll if presplit and (head_dim // 8) % s_unroll == 0 else 1
    NSPLIT = 2 if block_k <= 16 else 1  # split stages (presplit): 2 need one barrier a tile
    CHUNKS = D // 4                     # 16-byte chunks per row
    LOADS = BK * CHUNKS // THREADS      # cp.async per thread per K (or V) tile
    ROW_STEP = THREADS // CHUNKS        # rows between a thread's successive chunks
    if PRESPLIT:
        K_STRIDE = D                    # raw rows, unpadded (each thread reads its own chunks)
        V_STRIDE = D
        KS_STRIDE = 2 * D               # split K row: per (k-step, t) 16 bytes big2 | small2,
        VS_STRIDE = 4 * D               # split V key pair: per dim 16 bytes big2 | small2
        K_TILE = BK * D                 # (both XOR-swizzled, see _presplit_ok)
        STAGE = 2 * BK * D              # the one raw stage: K | V
        KS_TILE = BK * KS_STRIDE
        SSTAGE = KS_TILE + BK // 2 * VS_STRIDE
        SPLIT0 = STAGE                  # NSPLIT split stages follow the raw stage,
        QS0 = STAGE + NSPLIT * SSTAGE   # then Q's big and small halves, per thread and
                                        # k-step 4 + 4 (only that thread reads them back)
    else:
        K_STRIDE = D + K_PAD_FLOATS     # floats per shared K row
        V_STRIDE = D + V_PAD_FLOATS     # floats per shared V row
        K_TILE = BK * K_STRIDE
        STAGE = BK * (K_STRIDE + V_STRIDE)  # floats per buffer: K | V
        KS_STRIDE = VS_STRIDE = KS_TILE = SSTAGE = SPLIT0 = QS0 = 0
    KC = D // 8                         # k-steps of S = Q K^T
    NT_S = BK // 8                      # 16x8 score tiles per warp (= k-steps of P V)
    NT_O = D // 8                       # 16x8 output tiles per warp
    Q_REGS, S_REGS, O_REGS = KC * 4, NT_S * 4, NT_O * 4
    assert BK * CHUNKS % THREADS == 0 and THREADS % CHUNKS == 0 and BQ % 16 == 0 and BK % 8 == 0
    assert not PRESPLIT or (_presplit_ok(D, BQ, BK) and LOADS % 2 == 0)
    assert smem_bytes(D, BK, PRESPLIT, BQ) == 4 * (QS0 + 2 * BQ * D if PRESPLIT else 2 * STAGE)
    NEG_INF = float32(-math.inf)
    SPLIT_ONCE = split_once
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    _I32 = ir.IntType(32)
    _F32 = ir.FloatType()

    ld_shared_v4_f32, ld_shared_v4_b32 = T.ld_shared_v4_f32, T.ld_shared_v4_b32
    st_shared_v4_b32 = T.st_shared_v4_b32

    @intrinsic
    def split_tf32_v(typingctx, x):
        # T.split_tf32 as a volatile asm: LLVM may not hoist Q's per-k-step split out of the
        # tile loop (which would turn the raw-Q variant back into split-once Q, 64 more registers)
        sig = nbt.UniTuple(nbt.uint32, 2)(nbt.float32)

        def codegen(context, builder, sig, args):
            xv = context.cast(builder, args[0], sig.args[0], nbt.float32)
            res = X._asm(builder, ir.LiteralStructType([_I32, _I32]), [_F32],
                         "{ .reg .b32 tb; .reg .f32 tr; cvt.rna.tf32.f32 tb, $2; "
                         "sub.f32 tr, $2, tb; cvt.rna.tf32.f32 $1, tr; mov.b32 $0, tb; }",
                         "=r,=r,f", [xv], side_effect=True)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(res, i) for i in range(2)])
        return sig, codegen

    fmix = _device_helpers()
    mask_scores = _score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK)

    @cuda.jit(device=True, inline=True)
    def load_tile(head_addr, row_bytes, key0, nk, s_addr, stride):
        # -- cp.async one K or V tile: BK rows x D floats, 16 bytes a thread a step; this
        #    thread's chunks are rows r0 + i * ROW_STEP, one column chunk (see the caller) --
        for i in range(LOADS):
            key = key0 + i * ROW_STEP
            ok = key < nk
            g = head_addr + uint64(uint32(key if ok else 0) * uint64(row_bytes))
            X.cp_async_16(s_addr + uint32(4 * i * ROW_STEP * stride), g,
                          uint32(16) if ok else uint32(0))

    @cuda.jit(device=True, inline=True)
    def load_tile_pairs(head_addr, row_bytes, pair0, nk, s_addr):
        # -- presplit V: this thread's chunks are rows 2 p and 2 p + 1 of the key pairs
        #    p = pair0 + i * ROW_STEP, so that it holds both keys of a B register pair --
        for i in range(LOADS // 2):
            for e in range(2):
                key = 2 * (pair0 + i * ROW_STEP) + e
                ok = key < nk
                g = head_addr + uint64(uint32(key if ok else 0) * uint64(row_bytes))
                X.cp_async_16(s_addr + uint32(4 * (2 * i * ROW_STEP + e) * D), g,
                              uint32(16) if ok else uint32(0))

    @cuda.jit(device=True, inline=True)
    def mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, bb0, bb1, bs0, bs1, c0, c1, c2, c3):
        # 3xTF32: small * big, big * small, then big * big, all accumulated in float32
        d = T.mma_tf32(as0, as1, as2, as3, bb0, bb1, c0, c1, c2, c3)
        d = T.mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, d[0], d[1], d[2], d[3])
        return T.mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, d[0], d[1], d[2], d[3])

    tile_and_head = tile_order.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               mask, mask_b, mask_h, mask_q, scale_log2, seed_hash, threshold, inv_keep):
        smem = cuda.shared.array(0, dtype=float32, alignment=16)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        tile, bh, n_blocks_q = tile_and_head()
        m_blk = n_blocks_q - 1 - tile                       # longest (causal) tiles first
        n_heads = out.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        s = (b * sched_b + h * sched_h)
        # thread owns rows row0 and row0 + 8 of its warp's 16
        row0 = m_blk * BQ + warp * 16 + gid

        # -- Q fragments (A operand, dims permuted: a0/a2 = dims 2t/2t+1) into registers --
        qraw = cuda.local.array(Q_REGS, dtype=float32)
        qb = cuda.local.array(Q_REGS, dtype=uint32)
        qs = cuda.local.array(Q_REGS, dtype=uint32)
        smem0 = X.shared_addr(smem, 0)
        # presplit: Q's big and small fragments go to shared memory, 16 + 16 bytes per thread
        # and k-step that only this thread reads back (conflict-free 128-bit loads, no
        # barrier), which leaves the registers to O, two S accumulators and the operands
        q_frag = smem0 + uint32(4 * (QS0 + (warp * KC * 64 + lane) * 4))
        if PRESPLIT:
            for kc in range(KC):
                sp0 = T.split_tf32(q[b, h, min(row0, n_q - 1), kc * 8 + 2 * tig])
                sp1 = T.split_tf32(q[b, h, min(row0 + 8, n_q - 1), kc * 8 + 2 * tig])
                sp2 = T.split_tf32(q[b, h, min(row0, n_q - 1), kc * 8 + 2 * tig + 1])
                sp3 = T.split_tf32(q[b, h, min(row0 + 8, n_q - 1), kc * 8 + 2 * tig + 1])
                st_shared_v4_b32(q_frag + uint32(kc * 1024), sp0[0], sp1[0], sp2[0], sp3[0])
                st_shared_v4_b32(q_frag + uint32(kc * 1024 + 512), sp0[1], sp1[1], sp2[1],
                                 sp3[1])
        for kc in range(KC if not PRESPLIT else 0):
            for r in range(4):
                row = row0 + 8 * (r & 1)
                col = kc * 8 + 2 * tig + (r >> 1)
                val = float32(0.0)
                if row < n_q:
                    val = q[b, h, row, col]
                if SPLIT_ONCE:
                    sp = T.split_tf32(val)
                    qb[kc * 4 + r] = sp[0]
                    qs[kc * 4 + r] = sp[1]
                else:
                    qraw[kc * 4 + r] = val

        acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        s_sm = cuda.local.array(S_REGS, dtype=float32)
        m_i = cuda.local.array(2, dtype=float32)
        l_i = cuda.local.array(2, dtype=float32)
        h_row = cuda.local.array(2, dtype=uint64)
        for r in range(2):
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)
            h_row[r] = uint64(0)
        if HAS_DROPOUT:
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            for r in range(2):
                h_row[r] = fmix(h_bh ^ uint64(row0 + 8 * r))

        # per-lane float offsets inside a buffer (see kernels.fragments_tf32)
        if PRESPLIT:
            # split K[key g][16-byte unit 4 kc + t], units XOR 4 on odd keys: one base for
            # even kc (+16 floats on odd g) and one for odd kc (-16 floats on odd g)
            k_lane = gid * KS_STRIDE + 4 * tig + 16 * (gid & 1)
            k_lane_o = gid * KS_STRIDE + 4 * tig - 16 * (gid & 1)
            # split V[pair t][dim g XOR 2t]: b2 | s2
            v_lane = KS_TILE + tig * VS_STRIDE + 4 * (gid ^ (2 * tig))
        else:
            k_lane = gid * K_STRIDE + 2 * tig              # K[key g][dims 2t, 2t+1]
            k_lane_o = k_lane
            v_lane = K_TILE + 2 * tig * V_STRIDE + gid     # V[key 2t][dim g], V[2t+1][g]
        # this thread's cp.async chunk: rows r0 + i * ROW_STEP, floats 4 ch .. 4 ch + 3
        r0 = tid // CHUNKS
        ch = tid % CHUNKS
        k_head = X.global_addr(k, b, hk, 0, ch * 4)
        v_head = X.global_addr(v, b, hk, 0, ch * 4)
        k_row_bytes = uint32(k.strides[2])
        v_row_bytes = uint32(v.strides[2])
        k_copy = smem0 + uint32(4 * (r0 * K_STRIDE + ch * 4))
        if PRESPLIT:
            v_copy = smem0 + uint32(4 * (K_TILE + 2 * r0 * D + ch * 4))
        else:
            v_copy = smem0 + uint32(4 * (K_TILE + r0 * V_STRIDE + ch * 4))

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if PRESPLIT:
            # one raw stage: refilled with tile j + 1 once every thread has split its own
            # chunks of tile j (the barrier below), while tile j is computed
            if start < stop:
                n0 = kv_index[start]
                load_tile(k_head, k_row_bytes, n0 * BK + r0, n_k, k_copy, K_STRIDE)
                load_tile_pairs(v_head, v_row_bytes, n0 * (BK // 2) + r0, n_k, v_copy)
                X.cp_async_commit()
        else:
            if start < stop:
                n0 = kv_index[start]
                load_tile(k_head, k_row_bytes, n0 * BK + r0, n_k, k_copy, K_STRIDE)
                load_tile(v_head, v_row_bytes, n0 * BK + r0, n_k, v_copy, V_STRIDE)
                X.cp_async_commit()

        for it in range(start, stop):
            n_blk = kv_index[it]
            if PRESPLIT:
                buf = SPLIT0 + ((it - start) & (NSPLIT - 1)) * SSTAGE
                X.cp_async_wait_all()
                # -- split this thread's own chunks (visible to it after the wait) --
                kr = smem0 + uint32(4 * (r0 * D + ch * 4))
                ks = smem0 + uint32(4 * (buf + r0 * KS_STRIDE + 4 * ((2 * ch) ^ (4 * (r0 & 1)))))
                for i in range(LOADS):
                    x = ld_shared_v4_f32(kr + uint32(4 * i * ROW_STEP * D))
                    e0 = T.split_tf32(x[0])
                    e1 = T.split_tf32(x[1])
                    e2 = T.split_tf32(x[2])
                    e3 = T.split_tf32(x[3])
                    ka = ks + uint32(4 * i * ROW_STEP * KS_STRIDE)
                    st_shared_v4_b32(ka, e0[0], e1[0], e0[1], e1[1])
                    st_shared_v4_b32(ka + uint32(16), e2[0], e3[0], e2[1], e3[1])
                vr = smem0 + uint32(4 * (K_TILE + 2 * r0 * D + ch * 4))
                vs = smem0 + uint32(4 * (buf + KS_TILE + r0 * VS_STRIDE))
                sw = 2 * (r0 & 3)
                for i in range(LOADS // 2):
                    x = ld_shared_v4_f32(vr + uint32(4 * 2 * i * ROW_STEP * D))
                    y = ld_shared_v4_f32(vr + uint32(4 * (2 * i * ROW_STEP + 1) * D))
                    va = vs + uint32(4 * i * ROW_STEP * VS_STRIDE)
                    for e in range(4):
                        ex = T.split_tf32(x[e])
                        ey = T.split_tf32(y[e])
                        st_shared_v4_b32(va + uint32(16 * ((4 * ch + e) ^ sw)),
                                         ex[0], ey[0], ex[1], ey[1])
                cuda.syncthreads()
                if it + 1 < stop:
                    nxt = kv_index[it + 1]
                    load_tile(k_head, k_row_bytes, nxt * BK + r0, n_k, k_copy, K_STRIDE)
                    load_tile_pairs(v_head, v_row_bytes, nxt * (BK // 2) + r0, n_k, v_copy)
                    X.cp_async_commit()
            else:
                buf = ((it - start) & 1) * STAGE
                if it + 1 < stop:
                    nxt = kv_index[it + 1]
                    nbuf = uint32(4 * (STAGE - buf))
                    load_tile(k_head, k_row_bytes, nxt * BK + r0, n_k, k_copy + nbuf, K_STRIDE)
                    load_tile(v_head, v_row_bytes, nxt * BK + r0, n_k, v_copy + nbuf, V_STRIDE)
                    X.cp_async_commit()
                    X.cp_async_wait_1()
                else:
                    X.cp_async_wait_all()
                cuda.syncthreads()

            # -- compute qk: S = Q K^T, three tf32 mma per 16x8x8 step --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
                s_sm[i] = float32(0.0)
            k_addr = smem0 + uint32(4 * (buf + k_lane))
            k_addr_o = smem0 + uint32(4 * (buf + k_lane_o))
            for kc_o in range(KC // SU):
              for kc_i in range(SU):  # noqa: E111 (the k-step loop, SU steps per iteration)
                kc = kc_o * SU + kc_i
                a = kc * 4
                if PRESPLIT:
                    qbg = ld_shared_v4_b32(q_frag + uint32(kc * 1024))
                    qsm = ld_shared_v4_b32(q_frag + uint32(kc * 1024 + 512))
                    ab0, ab1, ab2, ab3 = qbg[0], qbg[1], qbg[2], qbg[3]
                    as0, as1, as2, as3 = qsm[0], qsm[1], qsm[2], qsm[3]
                elif SPLIT_ONCE:
                    ab0, ab1, ab2, ab3 = qb[a], qb[a + 1], qb[a + 2], qb[a + 3]
                    as0, as1, as2, as3 = qs[a], qs[a + 1], qs[a + 2], qs[a + 3]
                else:
                    sp0 = split_tf32_v(qraw[a])
                    sp1 = split_tf32_v(qraw[a + 1])
                    sp2 = split_tf32_v(qraw[a + 2])
                    sp3 = split_tf32_v(qraw[a + 3])
                    ab0, ab1, ab2, ab3 = sp0[0], sp1[0], sp2[0], sp3[0]
                    as0, as1, as2, as3 = sp0[1], sp1[1], sp2[1], sp3[1]
                for nt in range(NT_S):
                    if PRESPLIT:
                        kb = ld_shared_v4_b32((k_addr if kc % 2 == 0 else k_addr_o)
                                              + 4 * (nt * 8 * KS_STRIDE + kc * 16))
                        bb0, bb1, bs0, bs1 = kb[0], kb[1], kb[2], kb[3]
                    else:
                        kx = T.ld_shared_f32x2(k_addr + 4 * (nt * 8 * K_STRIDE + kc * 8))
                        b0 = T.split_tf32(kx[0])
                        b1 = T.split_tf32(kx[1])
                        bb0, bb1, bs0, bs1 = b0[0], b1[0], b0[1], b1[1]
                    j = nt * 4
                    if S_DUAL:
                        d = T.mma_tf32(as0, as1, as2, as3, bb0, bb1,
                                       s_sm[j], s_sm[j + 1], s_sm[j + 2], s_sm[j + 3])
                        d = T.mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, d[0], d[1], d[2], d[3])
                        for i in range(4):
                            s_sm[j + i] = d[i]
                        d = T.mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1,
                                       s_reg[j], s_reg[j + 1], s_reg[j + 2], s_reg[j + 3])
                    else:
                        d = mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, bb0, bb1, bs0, bs1,
                                 s_reg[j], s_reg[j + 1], s_reg[j + 2], s_reg[j + 3])
                    for i in range(4):
                        s_reg[j + i] = d[i]
            if S_DUAL:
                for i in range(S_REGS):
                    s_reg[i] = s_sm[i] + s_reg[i]

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            mask_scores(s_reg, 0, row0, n_blk, m_blk, col_base, b, h, n_q, n_k, mask, mask_b,
                        mask_h, mask_q)

            # -- update m_i and l_i (row r: registers 2r, 2r + 1 of every score tile) --
            for r in range(2):
                mx = NEG_INF
                for nt in range(NT_S):
                    mx = max(mx, max(s_reg[nt * 4 + 2 * r], s_reg[nt * 4 + 2 * r + 1]))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                m_new = max(m_i[r], mx * scale_log2)
                m_use = m_new if m_new != NEG_INF else float32(0.0)
                alpha = X.ex2(m_i[r] - m_use)
                row_sum = float32(0.0)
                for nt in range(NT_S):
                    for c in range(2):
                        p = X.ex2(s_reg[nt * 4 + 2 * r + c] * scale_log2 - m_use)
                        row_sum += p
                        s_reg[nt * 4 + 2 * r + c] = p
                l_i[r] = l_i[r] * alpha + row_sum
                m_i[r] = m_new
                for nt in range(NT_O):
                    acc[nt * 4 + 2 * r] *= alpha
                    acc[nt * 4 + 2 * r + 1] *= alpha

            if HAS_DROPOUT:
                for nt in range(NT_S):
                    for i in range(4):
                        col = col_base + nt * 8 + (i & 1)
                        keep = fmix(h_row[i >> 1] ^ uint64(col)) >= uint64(threshold)
                        e = nt * 4 + i
                        s_reg[e] = s_reg[e] * inv_keep if keep else float32(0.0)

            # -- O += P V: P's A fragment is the score C fragment (a0, a1, a2, a3 = c0, c2, c1,
            #    c3 under the key permutation); V's B fragment = V[key 2t][g], V[key 2t+1][g] --
            v_addr = smem0 + uint32(4 * (buf + v_lane))
            for kp in range(NT_S):
                j = kp * 4
                p0 = T.split_tf32(s_reg[j])
                p1 = T.split_tf32(s_reg[j + 2])
                p2 = T.split_tf32(s_reg[j + 1])
                p3 = T.split_tf32(s_reg[j + 3])
                for nt in range(NT_O):
                    if PRESPLIT:
                        vb = ld_shared_v4_b32(v_addr + 4 * (kp * 4 * VS_STRIDE + nt * 32))
                        bb0, bb1, bs0, bs1 = vb[0], vb[1], vb[2], vb[3]
                    else:
                        va = v_addr + 4 * (kp * 8 * V_STRIDE + nt * 8)
                        b0 = T.split_tf32(T.ld_shared_f32(va))
                        b1 = T.split_tf32(T.ld_shared_f32(va + 4 * V_STRIDE))
                        bb0, bb1, bs0, bs1 = b0[0], b1[0], b0[1], b1[1]
                    o = nt * 4
                    d = mma3(p0[0], p1[0], p2[0], p3[0], p0[1], p1[1], p2[1], p3[1],
                             bb0, bb1, bs0, bs1, acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                    for i in range(4):
                        acc[o + i] = d[i]
            if not PRESPLIT or NSPLIT == 1:
                cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch
                #                      (presplit, one split stage: re-split next iteration)

        # -- epilogue: one rescale, O, logsumexp (natural log) --
        for r in range(2):
            l_tot = l_i[r]
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 1)
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 2)
            row = row0 + 8 * r
            inv = float32(1.0) / l_tot if l_tot > float32(0.0) else float32(0.0)
            if row < n_q:
                for nt in range(NT_O):
                    out[b, h, row, nt * 8 + 2 * tig] = acc[nt * 4 + 2 * r] * inv
                    out[b, h, row, nt * 8 + 2 * tig + 1] = acc[nt * 4 + 2 * r + 1] * inv
                if tig == 0:
                    if l_tot > float32(0.0):
                        lse[b, h, row] = m_i[r] * float32(LN2) + math.log(l_tot)
                    else:
                        lse[b, h, row] = NEG_INF

    kernel.threads = THREADS
    kernel.smem_bytes = smem_bytes(D, BK, PRESPLIT, BQ)
    kernel.config = {"block_q": BQ, "block_k": BK, "presplit": PRESPLIT,
                     "split_once": SPLIT_ONCE, "s_dual": S_DUAL, "s_unroll": SU}
    return kernel


# -- host side -----------------------------------------------------------------------------------
def _resolve_blocks(d, block_q, block_k, block_mask):
    """Block sizes: the caller's, else (with a block mask, whose tiles must be the ones of
    `kernels.forward`'s defaults) `kernels.config.default_blocks`, else `default_blocks`."""
    if block_mask is not None and (block_q is None or block_k is None):
        from kernels.config import default_blocks as cfg_blocks
        bq_def, bk_def = cfg_blocks(d, False, False)
    else:
        bq_def, bk_def = default_blocks(d)
    return (bq_def if block_q is None else int(block_q),
            bk_def if block_k is None else int(block_k))


def accepts(q, k, v, block_q=None, block_k=None, block_mask=None) -> bool:
    """Whether `forward` takes these inputs: float32 arrays on a real GPU (torch CUDA tensors or
    Numba device arrays), head_dim in SUPPORTED_HEAD_DIMS, block sizes None or ones this kernel
    has. For dispatching; False under the CUDA simulator and for NumPy arrays."""
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
    if d not in SUPPORTED_HEAD_DIMS:
        return False
    bq, bk = _resolve_blocks(d, block_q, block_k, block_mask)
    return bq in BLOCK_Q_CHOICES and bk in BLOCK_K_CHOICES


def forward(q, k, v, *, scale, causal=False, mask=None, block_mask=None, dropout_p=0.0, seed=0,
            block_q=None, block_k=None):
    """Float32 3xTF32 tensor-core attention forward: returns ``(out, lse)``.

    Same contract as `kernels.forward`: q [B, Hq, Nq, d], k/v [B, Hkv, Nk, d] (Hq % Hkv == 0),
    float32 (torch CUDA tensors, Numba device arrays or NumPy arrays) with d in {64, 128}; out
    has q's kind of memory, lse is float32 [B, Hq, Nq] (natural log, -inf for a fully masked
    row, whose out row is 0). ``block_q`` in {32, 64, 128} (2, 4 or 8 warps), ``block_k`` in
    {16, 32}; None picks `default_blocks` (with a block mask: `kernels.forward`'s default tiles,
    which the mask is laid out for). The other compile-time choices (pre-split K/V stages, Q
    split once, two S accumulators) are `default_config`'s for the head dim.
    """
    from numba import cuda

    kind, batch, heads, n_q, d, heads_kv, n_k, scale = check_problem(
        q, k, v, scale=scale, dropout_p=dropout_p, head_dims=SUPPORTED_HEAD_DIMS,
        kernel_name="3xTF32")
    block_q, block_k = _resolve_blocks(d, block_q, block_k, block_mask)
    if block_q not in BLOCK_Q_CHOICES:
        raise ValueError(f"block_q must be one of {BLOCK_Q_CHOICES} for the 3xTF32 kernel, "
                         f"got {block_q}")
    if block_k not in BLOCK_K_CHOICES:
        raise ValueError(f"block_k must be one of {BLOCK_K_CHOICES} for the 3xTF32 kernel, "
                         f"got {block_k}")

    # -- the operands as float32 device arrays (rows contiguous and 16-byte aligned) --
    stream = fastlaunch.launch_stream()
    if kind == "torch":
        import torch
        if q.dtype != torch.float32 or k.dtype != torch.float32 or v.dtype != torch.float32:
            raise TypeError(f"q, k, v must all be float32, got {q.dtype}, {k.dtype}, {v.dtype}")
        if not q.is_cuda:
            raise TypeError("torch tensors must be on a CUDA device")

        def prep(t):
            if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 4 for s in t.stride()[:-1]):
                t = t.contiguous()
            return t                       # launched in place (kernels.fastlaunch)

        qd, kd, vd = prep(q), prep(k), prep(v)
        out_t = torch.empty((batch, heads, n_q, d), dtype=torch.float32, device=q.device)
        lse_t = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
        outd, lsed = out_t, lse_t
        stream = fastlaunch.launch_stream(q)      # torch's current stream on q's device
    else:
        dts = {str(np.dtype(x.dtype)) for x in (q, k, v)}
        if dts != {"float32"}:
            raise TypeError(f"q, k, v must be float32, got {dts}")

        def prep(a):
            if kind == "numpy":
                return cuda.to_device(np.ascontiguousarray(a))
            st = a.strides
            if st[-1] != 4 or any(s % 16 for s in st[:-1]):
                a = cuda.to_device(np.ascontiguousarray(a.copy_to_host()))
            return a

        qd, kd, vd = prep(q), prep(k), prep(v)
        outd = cuda.device_array((batch, heads, n_q, d), dtype=np.float32)
        lsed = cuda.device_array((batch, heads, n_q), dtype=np.float32)

    # -- mask, schedule, dropout constants --
    has_mask = mask is not None
    maskd, mb, mh, mq = mask_on_device(mask, kind, batch, heads, n_q, n_k)
    bm_key = None if block_mask is None else (np.shape(block_mask),
                                              np.asarray(block_mask, bool).tobytes())
    offs_d, idx_d, sb, sh = _device_const(
        ("schedule", n_q, n_k, block_q, block_k, bool(causal), batch, heads, bm_key),
        lambda: _schedule(block_mask, n_q, n_k, block_q, block_k, causal, batch, heads))
    has_dropout, seed_hash, threshold, inv_keep = dropout_constants(seed, dropout_p)

    head_group = tile_order.head_group(causal, "fwd")
    kern = get_kernel(d, block_q, block_k, bool(causal), has_mask, has_dropout,
                      head_group=head_group)
    grid = (cdiv(n_q, block_q), batch * heads)
    fastlaunch.launch(kern, grid, kern.threads, stream, (
        qd, kd, vd, outd, lsed, offs_d, idx_d, sb, sh, heads // heads_kv, n_q, n_k,
        maskd, mb, mh, mq, np.float32(scale * LOG2E), np.uint32(seed_hash), np.uint32(threshold),
        np.float32(inv_keep)), sharedmem=kern.smem_bytes)

    if kind == "torch":
        return out_t, lse_t
    if kind == "numpy":
        return outd.copy_to_host(), lsed.copy_to_host()
    return outd, lsed


# -- variant timing (GPU) ------------------------------------------------------------------------
def _time_variants(ns, ds, causals, variants, reps=20):
    """Times `forward` under each variant (a ``KERNELS_TF32_FWD_D{d}`` string; "" = the
    default) against SDPA EFFICIENT, in one process, shapes as `kernels.bench` (B*N = 16384,
    H*d = 2048); checks each variant's output against SDPA first. Prints one line per case."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.bench import event_ms

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        ts = [event_ms(torch, fn) for _ in range(reps)]
        return sorted(ts)[len(ts) // 2]

    for d in ds:
        env = _CONFIG_ENV.format(d)
        for n in ns:
            b, h = max(1, 16384 // n), max(1, 2048 // d)
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=g) for _ in range(3))
            for causal in causals:
                with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    t_eff = timed(lambda: F.scaled_dot_product_attention(q, k, v,
                                                                         is_causal=causal))
                for var in variants:
                    os.environ[env] = var
                    try:
                        out, _ = forward(q, k, v, scale=d ** -0.5, causal=causal)
                        err = float((out - ref).abs().max())
                        t = timed(lambda: forward(q, k, v, scale=d ** -0.5, causal=causal))
                        kern = get_kernel(d, *default_blocks(d), bool(causal), False, False)
                        print(f"d={d} N={n} causal={causal} variant='{var}' "
                              f"config={kern.config} smem={kern.smem_bytes}: {t:.3f} ms, "
                              f"EFFICIENT {t_eff:.3f} ms, ratio {t_eff / t:.2f}x, "
                              f"max|out - EFFICIENT| {err:.2e}", flush=True)
                    except Exception as exc:  # report and go on to the next variant
                        print(f"d={d} N={n} causal={causal} variant='{var}': "
                              f"{type(exc).__name__}: {exc}", flush=True)
                    finally:
                        os.environ.pop(env, None)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="time variants of the 3xTF32 forward (GPU)")
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[128])
    ap.add_argument("--causal", choices=["false", "true"], nargs="+", default=["false", "true"])
    ap.add_argument("--variants", nargs="+", default=[""])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    _time_variants(a.n, a.d, [c == "true" for c in a.causal], a.variants, a.reps)
