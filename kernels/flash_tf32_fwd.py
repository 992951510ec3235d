"""Tensor-core FlashAttention-2 forward for float32 CUDA inputs with 3xTF32 (Numba + inline PTX).

This module owns the float32 tensor-core forward kernel and its host entry point `forward`, which
has the signature of the package's `kernels.forward` contract. Every float32 operand x is split
into ``big = tf32(x)`` and ``small = tf32(x - big)`` and each product is computed as
``A_small B_big + A_big B_small + A_big B_big`` on the TF32 tensor cores with float32
accumulation (what CUTLASS calls ``OpMultiplyAddFastF32``): the dropped ``A_small B_small`` and
the rounding of ``small`` are ~2**-22 of each product, so the result has float32-level accuracy.

The algorithm is FlashAttention-2, structured as `kernels.flash_mma_fwd`:

* one thread block per (Q tile of ``block_q = 16 * num_warps`` rows, batch * head), longest
  causal tiles first; each warp owns 16 query rows; their Q fragments are split into big/small
  once and stay in registers (`q_split_once`), with the running max ``m_i``, running sum
  ``l_i`` and O accumulator;
* K/V tiles of ``block_k`` keys stream through shared memory with ``cp.async`` into two buffers
  (tile j + 1 loads while tile j computes); K rows are padded by 8 floats (its B fragments are
  64-bit loads, conflict-free), V rows by 4 floats (two 32-bit loads of rows 2t and 2t + 1,
  conflict-free); the tail tile is zero-filled by the copy itself;
* S = Q K^T and O += P V with ``mma.sync.m16n8k8`` tf32, three mma per product tile; the k index
  of both products is permuted (`kernels.fragments_tf32.k_perm`) so that K's fragment is one
  64-bit load per register pair and the C fragment of the scores *is* P's A fragment (no shared
  memory round trip for P);
* online softmax with exp2 and ``log2(e)`` folded into the scale; one rescale at the end; O and
  the float32 natural-log logsumexp written once;
* the visited K/V tiles come from `ioaware.block_info.BlockInfo.kv_schedule()` (causal and
  block-sparse skipping), elementwise masks only on tiles that need them; dropout regenerates the
  keep bits of `ioaware.dropout` on the fly; GQA/MQA through ``h // (Hq // Hkv)``.

Supported: head_dim 64 and 128, float32 (torch CUDA tensors, Numba device arrays; NumPy arrays
are copied). Other head dims are refused here with a ValueError; `kernels.forward` sends them
(and every input `accepts` refuses) to the float32 CUDA-core kernel. The CUDA simulator cannot
run inline PTX: under it `forward` raises RuntimeError.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ioaware.block_info import cdiv

from kernels import fastlaunch
from kernels.flash_mma_fwd import (_device_const, _kind, _schedule, dropout_constants,
                                   mask_on_device)

__all__ = ["forward", "accepts", "SUPPORTED_HEAD_DIMS", "BLOCK_Q_CHOICES", "BLOCK_K_CHOICES",
           "default_blocks", "smem_bytes", "get_kernel", "q_split_once"]

SUPPORTED_HEAD_DIMS = (64, 128)
BLOCK_Q_CHOICES = (32, 64, 128)      # 2, 4 or 8 warps of 16 query rows
BLOCK_K_CHOICES = (16, 32)
SMEM_LIMIT_BYTES = 48 * 1024         # static shared memory per block without opt-in
K_PAD_FLOATS = 8
V_PAD_FLOATS = 4
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def default_blocks(head_dim: int) -> tuple[int, int]:
    """Default (block_q, block_k): 64 x 32 for d=64, 64 x 16 for d=128 (two K/V buffers of 16
    keys are what fits in 48 KiB at d=128)."""
    return (64, 32) if head_dim <= 64 else (64, 16)


def smem_bytes(head_dim: int, block_k: int) -> int:
    """Shared memory of one block in bytes: K and V, two buffers each, padded float32 rows."""
    return 2 * block_k * (2 * head_dim + K_PAD_FLOATS + V_PAD_FLOATS) * 4


def q_split_once(head_dim: int) -> bool:
    """Whether Q's big/small fragments are made once and kept in registers (the default, 64
    registers at d=64, 128 at d=128; ptxas fits both without spilling), or Q is kept as float32
    and split again at every k-step of every tile (half the registers, more conversions; a
    compile switch kept for measurement, see kernels/NOTES.md)."""
    return head_dim in SUPPORTED_HEAD_DIMS


_KERNELS: dict = {}


def get_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, split_once=None):
    """The compiled-on-first-launch kernel for one configuration (cached)."""
    if split_once is None:
        split_once = q_split_once(head_dim)
    key = (head_dim, block_q, block_k, causal, has_mask, has_dropout, bool(split_once))
    if key not in _KERNELS:
        _KERNELS[key] = _build_kernel(*key)
    return _KERNELS[key]


def _build_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, split_once):
    from numba import cuda, float32, uint32, uint64

    from kernels import mma as X
    from kernels import mma_tf32 as T

    D = head_dim
    BQ = block_q
    BK = block_k
    NUM_WARPS = BQ // 16
    THREADS = 32 * NUM_WARPS
    K_STRIDE = D + K_PAD_FLOATS         # floats per shared K row
    V_STRIDE = D + V_PAD_FLOATS         # floats per shared V row
    K_TILE = BK * K_STRIDE
    STAGE = BK * (K_STRIDE + V_STRIDE)  # floats per buffer: K | V
    SMEM_FLOATS = 2 * STAGE
    CHUNKS = D // 4                     # 16-byte chunks per row
    LOADS = BK * CHUNKS // THREADS      # cp.async per thread per K (or V) tile
    ROW_STEP = THREADS // CHUNKS        # rows between a thread's successive chunks
    KC = D // 8                         # k-steps of S = Q K^T
    NT_S = BK // 8                      # 16x8 score tiles per warp (= k-steps of P V)
    NT_O = D // 8                       # 16x8 output tiles per warp
    Q_REGS, S_REGS, O_REGS = KC * 4, NT_S * 4, NT_O * 4
    assert BK * CHUNKS % THREADS == 0 and THREADS % CHUNKS == 0 and BQ % 16 == 0 and BK % 8 == 0
    NEG_INF = float32(-math.inf)
    SPLIT_ONCE = split_once
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    C1, C2, M32 = uint64(0x85EBCA6B), uint64(0xC2B2AE35), uint64(0xFFFFFFFF)

    @cuda.jit(device=True, inline=True)
    def fmix(x):
        x = uint64(x) & M32
        x ^= x >> uint64(16)
        x = (x * C1) & M32
        x ^= x >> uint64(13)
        x = (x * C2) & M32
        x ^= x >> uint64(16)
        return x

    @cuda.jit(device=True, inline=True)
    def load_tile(head_addr, row_bytes, key0, nk, s_addr, stride):
        # -- cp.async one K or V tile: BK rows x D floats, 16 bytes a thread a step; this
        #    thread's chunks are rows r0 + i * ROW_STEP, one column chunk (see the caller) --
        for i in range(LOADS):
            key = key0 + i * ROW_STEP
            ok = key < nk
            g = head_addr + uint64(key if ok else 0) * row_bytes
            X.cp_async_16(s_addr + uint32(4 * i * ROW_STEP * stride), g,
                          uint32(16) if ok else uint32(0))

    @cuda.jit(device=True, inline=True)
    def mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, bb0, bb1, bs0, bs1, c0, c1, c2, c3):
        # 3xTF32: small * big, big * small, then big * big, all accumulated in float32
        d = T.mma_tf32(as0, as1, as2, as3, bb0, bb1, c0, c1, c2, c3)
        d = T.mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, d[0], d[1], d[2], d[3])
        return T.mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, d[0], d[1], d[2], d[3])

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               mask, mask_b, mask_h, mask_q, scale_log2, seed_hash, threshold, inv_keep):
        smem = cuda.shared.array(SMEM_FLOATS, dtype=float32, alignment=16)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        n_blocks_q = cuda.gridDim.x
        m_blk = n_blocks_q - 1 - cuda.blockIdx.x            # longest (causal) tiles first
        bh = cuda.blockIdx.y
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
        for kc in range(KC):
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
        k_lane = gid * K_STRIDE + 2 * tig                  # K[key g][dims 2t, 2t+1]
        v_lane = K_TILE + 2 * tig * V_STRIDE + gid         # V[key 2t][dim g], V[2t+1][g]
        # this thread's cp.async chunk: rows r0 + i * ROW_STEP, floats 4 ch .. 4 ch + 3
        r0 = tid // CHUNKS
        ch = tid % CHUNKS
        k_head = X.global_addr(k, b, hk, 0, ch * 4)
        v_head = X.global_addr(v, b, hk, 0, ch * 4)
        k_row_bytes = uint64(k.strides[2])
        v_row_bytes = uint64(v.strides[2])
        smem0 = X.shared_addr(smem, 0)
        k_copy = smem0 + uint32(4 * (r0 * K_STRIDE + ch * 4))
        v_copy = smem0 + uint32(4 * (K_TILE + r0 * V_STRIDE + ch * 4))

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if start < stop:
            n0 = kv_index[start]
            load_tile(k_head, k_row_bytes, n0 * BK + r0, n_k, k_copy, K_STRIDE)
            load_tile(v_head, v_row_bytes, n0 * BK + r0, n_k, v_copy, V_STRIDE)
            X.cp_async_commit()

        for it in range(start, stop):
            buf = ((it - start) & 1) * STAGE
            n_blk = kv_index[it]
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
            k_addr = smem0 + uint32(4 * (buf + k_lane))
            for kc in range(KC):
                a = kc * 4
                if SPLIT_ONCE:
                    ab0, ab1, ab2, ab3 = qb[a], qb[a + 1], qb[a + 2], qb[a + 3]
                    as0, as1, as2, as3 = qs[a], qs[a + 1], qs[a + 2], qs[a + 3]
                else:
                    sp0 = T.split_tf32(qraw[a])
                    sp1 = T.split_tf32(qraw[a + 1])
                    sp2 = T.split_tf32(qraw[a + 2])
                    sp3 = T.split_tf32(qraw[a + 3])
                    ab0, ab1, ab2, ab3 = sp0[0], sp1[0], sp2[0], sp3[0]
                    as0, as1, as2, as3 = sp0[1], sp1[1], sp2[1], sp3[1]
                for nt in range(NT_S):
                    kx = T.ld_shared_f32x2(k_addr + 4 * (nt * 8 * K_STRIDE + kc * 8))
                    b0 = T.split_tf32(kx[0])
                    b1 = T.split_tf32(kx[1])
                    j = nt * 4
                    d = mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, b0[0], b1[0], b0[1], b1[1],
                             s_reg[j], s_reg[j + 1], s_reg[j + 2], s_reg[j + 3])
                    for i in range(4):
                        s_reg[j + i] = d[i]

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            needs_mask = HAS_MASK or (n_blk * BK + BK > n_k)
            if CAUSAL:
                needs_mask = needs_mask or (n_blk * BK + BK - 1 > m_blk * BQ)
            if needs_mask:
                for nt in range(NT_S):
                    for i in range(4):
                        col = col_base + nt * 8 + (i & 1)
                        row = row0 + 8 * (i >> 1)
                        bad = col >= n_k
                        if CAUSAL:
                            bad = bad or col > row
                        if HAS_MASK:
                            if not bad and row < n_q:
                                bad = mask[b * mask_b, h * mask_h, row * mask_q, col] == 0
                        if bad:
                            s_reg[nt * 4 + i] = NEG_INF

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
                    va = v_addr + 4 * (kp * 8 * V_STRIDE + nt * 8)
                    b0 = T.split_tf32(T.ld_shared_f32(va))
                    b1 = T.split_tf32(T.ld_shared_f32(va + 4 * V_STRIDE))
                    o = nt * 4
                    d = mma3(p0[0], p1[0], p2[0], p3[0], p0[1], p1[1], p2[1], p3[1],
                             b0[0], b1[0], b0[1], b1[1],
                             acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                    for i in range(4):
                        acc[o + i] = d[i]
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

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
    return bq in BLOCK_Q_CHOICES and bk in BLOCK_K_CHOICES and smem_bytes(d, bk) <= SMEM_LIMIT_BYTES


def forward(q, k, v, *, scale, causal=False, mask=None, block_mask=None, dropout_p=0.0, seed=0,
            block_q=None, block_k=None):
    """Float32 3xTF32 tensor-core attention forward: returns ``(out, lse)``.

    Same contract as `kernels.forward`: q [B, Hq, Nq, d], k/v [B, Hkv, Nk, d] (Hq % Hkv == 0),
    float32 (torch CUDA tensors, Numba device arrays or NumPy arrays) with d in {64, 128}; out
    has q's kind of memory, lse is float32 [B, Hq, Nq] (natural log, -inf for a fully masked
    row, whose out row is 0). ``block_q`` in {32, 64, 128} (2, 4 or 8 warps), ``block_k`` in
    {16, 32} within 48 KiB of shared memory; None picks `default_blocks` (with a block mask:
    `kernels.forward`'s default tiles, which the mask is laid out for).
    """
    from numba import cuda

    kind = _kind(q)
    if _kind(k) != kind or _kind(v) != kind:
        raise TypeError("q, k and v must be the same kind of array")
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not cuda.is_available():
        raise RuntimeError("the tensor-core kernel needs a real CUDA GPU (the simulator runs no "
                           "inline PTX)")
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, N, d], got {q.shape}, {k.shape}, {v.shape}")
    batch, heads, n_q, d = (int(x) for x in q.shape)
    if tuple(k.shape) != tuple(v.shape) or int(k.shape[0]) != batch or int(k.shape[3]) != d:
        raise ValueError(f"k and v must be [B={batch}, Hkv, Nk, d={d}], got {k.shape}, {v.shape}")
    heads_kv, n_k = int(k.shape[1]), int(k.shape[2])
    if heads % heads_kv:
        raise ValueError(f"query heads {heads} must be a multiple of key/value heads {heads_kv}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS} for the 3xTF32 kernel, "
                         f"got {d}")
    scale = float(scale)
    if not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    block_q, block_k = _resolve_blocks(d, block_q, block_k, block_mask)
    if block_q not in BLOCK_Q_CHOICES:
        raise ValueError(f"block_q must be one of {BLOCK_Q_CHOICES} for the 3xTF32 kernel, "
                         f"got {block_q}")
    if block_k not in BLOCK_K_CHOICES:
        raise ValueError(f"block_k must be one of {BLOCK_K_CHOICES} for the 3xTF32 kernel, "
                         f"got {block_k}")
    if smem_bytes(d, block_k) > SMEM_LIMIT_BYTES:
        raise ValueError(f"block_k={block_k} with head_dim={d} needs {smem_bytes(d, block_k)} "
                         f"bytes of shared memory, over the {SMEM_LIMIT_BYTES}-byte limit")

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
        stream = fastlaunch.launch_stream(torch.cuda.current_stream(q.device))
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

    kern = get_kernel(d, block_q, block_k, bool(causal), has_mask, has_dropout)
    grid = (cdiv(n_q, block_q), batch * heads)
    fastlaunch.launch(kern, grid, kern.threads, stream, (
        qd, kd, vd, outd, lsed, offs_d, idx_d, sb, sh, heads // heads_kv, n_q, n_k,
        maskd, mb, mh, mq, np.float32(scale * LOG2E), np.uint32(seed_hash), np.uint32(threshold),
        np.float32(inv_keep)))

    if kind == "torch":
        return out_t, lse_t
    if kind == "numpy":
        return outd.copy_to_host(), lsed.copy_to_host()
    return outd, lsed
