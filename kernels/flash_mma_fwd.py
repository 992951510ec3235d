"""Tensor-core FlashAttention-2 forward for float16/bfloat16 CUDA inputs (Numba + inline PTX).

This module owns the half-precision forward kernel and its host entry point `forward`, which
has the signature of the package's `kernels.forward` contract. The algorithm is FlashAttention-2:

* one thread block per (Q tile of ``block_q = 16 * num_warps`` rows, batch * head), longest
  causal tiles first (of all heads: `kernels.tile_order`); each warp
  owns 16 query rows and keeps its Q fragments, running max ``m_i``, running sum ``l_i`` and
  output accumulator in registers for the whole K/V sweep;
* K/V tiles of ``block_k`` keys stream through shared memory with ``cp.async`` into two
  buffers (tile j + 1 loads while tile j computes); rows padded by 16 bytes so that ``ldmatrix``
  reads are free of bank conflicts; the tail tile is zero-filled by the copy itself;
* S = Q K^T and O += P V on the tensor cores (``mma.sync.m16n8k16``, float32 accumulation);
  the softmax is exp2-based with ``log2(e)`` folded into the scale; P is rounded to half in
  registers and used directly as the A operand of the second mma (the C fragments of two
  16x8 score tiles are the A fragment of a 16x16 tile, see `kernels.fragments`);
* the visited K/V tiles come from `ioaware.block_info.BlockInfo.kv_schedule()` (causal and
  block-sparse skipping), elementwise masks only on tiles that need them; dropout regenerates the
  keep bits of `ioaware.dropout` on the fly; GQA/MQA through ``h // (Hq // Hkv)``;
* O is normalised once at the end and written as packed halves, with the float32 natural-log
  logsumexp.

Supported: head_dim 64 and 128, float16 (NumPy, Numba or torch arrays) and bfloat16 (torch).
Other head dims are refused with a ValueError (the float32 CUDA-core kernel covers them).
The CUDA simulator cannot run inline PTX: under it `forward` raises RuntimeError.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np

from ioaware.block_info import BlockInfo, cdiv
from ioaware.dropout import SEED_SALT, fmix32, keep_threshold, split_seed

from . import fastlaunch, tile_order

__all__ = ["forward", "accepts", "SUPPORTED_HEAD_DIMS", "default_blocks", "smem_bytes", "get_kernel"]

SUPPORTED_HEAD_DIMS = (64, 128)
#: Shared memory a block may use: the K/V buffers are dynamic shared memory, opted in above the
#: 48 KiB default by `kernels.fastlaunch` (227 KiB per block on sm_90; a device with less is
#: refused at launch with an error naming its limit).
SMEM_LIMIT_BYTES = 227 * 1024
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def default_blocks(head_dim: int, causal: bool = False) -> tuple[int, int]:
    """Default (block_q, block_k), the fastest H100 tiling without local memory in the inner
    loop (`python -m kernels.tune_tc`, results/tune_mma_fwd_h100_2026-11-22.json): d=64
    128 x 64 (4 warps of 2 m-tiles), but 128 x 32 when causal (128 x 64 causal needs 255
    registers and spills inside the K/V loop); d=128 64 x 64 (69,632 bytes of dynamic shared
    memory)."""
    if head_dim <= 64:
        return (128, 32) if causal else (128, 64)
    return (64, 64)


def smem_bytes(head_dim: int, block_k: int) -> int:
    """Shared memory of one block in bytes: K and V, two buffers each, rows padded by 8 halves."""
    return 4 * block_k * (head_dim + 8) * 2


_KERNELS: dict = {}


def warp_m_tiles(head_dim: int, block_q: int) -> int:
    """16-row m-tiles per warp: 2 for d=64 with block_q=128 (each K/V fragment feeds two
    mma, halving shared-memory reads per flop), else 1 (d=128 has no registers to spare)."""
    return 2 if head_dim <= 64 and block_q == 128 else 1


def get_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
               head_group=None):
    """The compiled-on-first-launch kernel for one configuration (cached); ``head_group``
    (the launch order, `kernels.tile_order`) defaults to `tile_order.head_group`."""
    if head_group is None:
        head_group = tile_order.head_group(causal, "fwd")
    key = (head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout, int(head_group))
    if key not in _KERNELS:
        _KERNELS[key] = _build_kernel(*key)
    return _KERNELS[key]


def _device_helpers():
    """The device function every tensor-core kernel's dropout uses: ``fmix``, the 32-bit
    finaliser of `ioaware.dropout`'s counter-based hash, on a uint64 holding 32 bits."""
    from numba import cuda, uint64
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

    return fmix


def _score_mask(block_q, block_k, nt_s, causal, has_mask):
    """``mask_scores``: -inf on the scores of one warp's 16 x block_k tile (C fragments from
    ``s_reg[off]``, rows ``row0`` and ``row0 + 8``) that fall past the keys, above the causal
    diagonal or on a False of the boolean mask — only on tiles that need it. Shared by the
    tensor-core forwards and dQ kernels."""
    from numba import cuda, float32
    BQ, BK, NT_S, CAUSAL, HAS_MASK = block_q, block_k, nt_s, causal, has_mask
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline=True)
    def mask_scores(s_reg, off, row0, n_blk, m_blk, col_base, b, h, n_q, n_k, mask, mask_b,
                    mask_h, mask_q):
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
                        s_reg[off + nt * 4 + i] = NEG_INF

    return mask_scores


def _build_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
                  head_group):
    from numba import cuda, float32, uint16, uint32, uint64

    from kernels import mma as X

    D = head_dim
    BQ = block_q
    BK = block_k
    MT = warp_m_tiles(D, BQ)             # 16-row m-tiles per warp
    WARP_ROWS = 16 * MT
    NUM_WARPS = BQ // WARP_ROWS
    THREADS = 32 * NUM_WARPS
    STRIDE = D + 8                      # halves per shared row (16-byte pad)
    TILE = BK * STRIDE                  # halves per K or V buffer
    SMEM_HALVES = 4 * TILE              # K0 | V0 | K1 | V1
    CHUNKS = D // 8                     # 16-byte chunks per row
    LOADS = BK * CHUNKS // THREADS      # cp.async per thread per K (or V) tile
    KC = D // 16                        # k-steps of S = Q K^T
    NT_S = BK // 8                      # 16x8 score tiles per warp
    KC_P = BK // 16                     # k-steps of O += P V
    NT_O = D // 8                       # 16x8 output tiles per warp
    Q_REGS, S_REGS, O_REGS = MT * KC * 4, MT * NT_S * 4, MT * NT_O * 4   # register arrays
    QS, SS, OS = KC * 4, NT_S * 4, NT_O * 4   # per m-tile strides in them
    ROWS = 2 * MT                       # rows a thread owns
    P_REGS = 4 * MT                     # A registers of P for one k-step
    assert BK * CHUNKS % THREADS == 0 and BQ % 16 == 0 and BK % 16 == 0
    NEG_INF = float32(-math.inf)
    mma_op = X.mma_bf16 if is_bf16 else X.mma_f16
    pack = X.pack_bf16x2 if is_bf16 else X.pack_f16x2
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout

    fmix = _device_helpers()
    mask_scores = _score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK)

    @cuda.jit(device=True, inline=True)
    def load_tile(src, b, hk, key0, nk, smem, base, tid):
        # -- cp.async one K or V tile: BK rows x D halves, 16 bytes a thread a step --
        for i in range(LOADS):
            c = tid + i * THREADS
            r = c // CHUNKS
            ch = c % CHUNKS
            key = key0 + r
            ok = key < nk
            g = X.global_addr(src, b, hk, key if ok else 0, ch * 8)
            X.cp_async_16(X.shared_addr(smem, base + r * STRIDE + ch * 8), g,
                          uint32(16) if ok else uint32(0))

    tile_and_head = tile_order.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               mask, mask_b, mask_h, mask_q, scale_log2, seed_hash, threshold, inv_keep):
        smem = cuda.shared.array(0, dtype=uint16)        # dynamic: kernel.smem_bytes
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
        # thread owns rows row0 + 8 * r, r < ROWS (m-tile mt = r // 2 covers rows +16 * mt)
        row0 = m_blk * BQ + warp * WARP_ROWS + gid

        # -- Q fragments (A operand) straight from global memory into registers --
        qf = cuda.local.array(Q_REGS, dtype=uint32)
        for mt in range(MT):
            for kc in range(KC):
                for r in range(4):
                    row = row0 + 16 * mt + 8 * (r & 1)
                    col = kc * 16 + 2 * tig + 8 * (r >> 1)
                    val = uint32(0)
                    if row < n_q:
                        val = X.ld_global_u32(X.global_addr(q, b, h, row, col))
                    qf[mt * QS + kc * 4 + r] = val

        acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        m_i = cuda.local.array(ROWS, dtype=float32)
        l_i = cuda.local.array(ROWS, dtype=float32)
        h_row = cuda.local.array(ROWS, dtype=uint64)
        for r in range(ROWS):
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)
            h_row[r] = uint64(0)
        if HAS_DROPOUT:
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            for r in range(ROWS):
                h_row[r] = fmix(h_bh ^ uint64(row0 + 8 * r))

        # per-lane ldmatrix offsets (halves) inside a K / V buffer (see kernels.fragments)
        k_lane = (lane % 8 + 8 * (lane // 16)) * STRIDE + 8 * ((lane // 8) % 2)
        v_lane = (lane % 8 + 8 * ((lane // 8) % 2)) * STRIDE + 8 * (lane // 16)

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if start < stop:
            n0 = kv_index[start]
            load_tile(k, b, hk, n0 * BK, n_k, smem, 0, tid)
            load_tile(v, b, hk, n0 * BK, n_k, smem, TILE, tid)
            X.cp_async_commit()

        for it in range(start, stop):
            buf = ((it - start) & 1) * 2 * TILE
            n_blk = kv_index[it]
            if it + 1 < stop:
                nxt = kv_index[it + 1]
                nbuf = 2 * TILE - buf
                load_tile(k, b, hk, nxt * BK, n_k, smem, nbuf, tid)
                load_tile(v, b, hk, nxt * BK, n_k, smem, nbuf + TILE, tid)
                X.cp_async_commit()
                X.cp_async_wait_1()
            else:
                X.cp_async_wait_all()
            cuda.syncthreads()

            # -- compute qk: one ldmatrix of K feeds 2 * MT mma --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
            k_addr = X.shared_addr(smem, buf + k_lane)
            for kc in range(KC):
                for ntp in range(NT_S // 2):
                    bk = X.ldmatrix_x4(k_addr + 2 * (16 * ntp * STRIDE + 16 * kc))
                    for mt in range(MT):
                        a = mt * QS + kc * 4
                        j = mt * SS + 8 * ntp
                        d0 = mma_op(qf[a], qf[a + 1], qf[a + 2], qf[a + 3], bk[0], bk[1],
                                    s_reg[j], s_reg[j + 1], s_reg[j + 2], s_reg[j + 3])
                        d1 = mma_op(qf[a], qf[a + 1], qf[a + 2], qf[a + 3], bk[2], bk[3],
                                    s_reg[j + 4], s_reg[j + 5], s_reg[j + 6], s_reg[j + 7])
                        for i in range(4):
                            s_reg[j + i] = d0[i]
                            s_reg[j + 4 + i] = d1[i]

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            for mt in range(MT):
                mask_scores(s_reg, mt * SS, row0 + 16 * mt, n_blk, m_blk, col_base, b, h, n_q,
                            n_k, mask, mask_b, mask_h, mask_q)

            # -- update m_i and l_i (row r: m-tile r // 2, half r % 2) --
            for r in range(ROWS):
                base = (r // 2) * SS + 2 * (r % 2)
                mx = NEG_INF
                for nt in range(NT_S):
                    mx = max(mx, max(s_reg[base + nt * 4], s_reg[base + nt * 4 + 1]))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                m_new = max(m_i[r], mx * scale_log2)
                m_use = m_new if m_new != NEG_INF else float32(0.0)
                alpha = X.ex2(m_i[r] - m_use)
                row_sum = float32(0.0)
                for nt in range(NT_S):
                    for c in range(2):
                        p = X.ex2(s_reg[base + nt * 4 + c] * scale_log2 - m_use)
                        row_sum += p
                        s_reg[base + nt * 4 + c] = p
                l_i[r] = l_i[r] * alpha + row_sum
                m_i[r] = m_new
                obase = (r // 2) * OS + 2 * (r % 2)
                for nt in range(NT_O):
                    acc[obase + nt * 4] *= alpha
                    acc[obase + nt * 4 + 1] *= alpha

            if HAS_DROPOUT:
                for mt in range(MT):
                    for nt in range(NT_S):
                        for i in range(4):
                            col = col_base + nt * 8 + (i & 1)
                            keep = fmix(h_row[2 * mt + (i >> 1)] ^ uint64(col)) >= uint64(threshold)
                            e = mt * SS + nt * 4 + i
                            s_reg[e] = s_reg[e] * inv_keep if keep else float32(0.0)

            # -- P to half in registers, O += P V: one ldmatrix of V feeds 2 * MT mma --
            v_addr = X.shared_addr(smem, buf + TILE + v_lane)
            pa = cuda.local.array(P_REGS, dtype=uint32)
            for kcp in range(KC_P):
                for mt in range(MT):
                    j = mt * SS + 8 * kcp
                    for i in range(4):
                        pa[4 * mt + i] = pack(s_reg[j + 2 * i], s_reg[j + 2 * i + 1])
                for ntp in range(NT_O // 2):
                    bv = X.ldmatrix_x4_trans(v_addr + 2 * (16 * kcp * STRIDE + 16 * ntp))
                    for mt in range(MT):
                        o = mt * OS + 8 * ntp
                        a = 4 * mt
                        d0 = mma_op(pa[a], pa[a + 1], pa[a + 2], pa[a + 3], bv[0], bv[1],
                                    acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                        d1 = mma_op(pa[a], pa[a + 1], pa[a + 2], pa[a + 3], bv[2], bv[3],
                                    acc[o + 4], acc[o + 5], acc[o + 6], acc[o + 7])
                        for i in range(4):
                            acc[o + i] = d0[i]
                            acc[o + 4 + i] = d1[i]
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

        # -- epilogue: one rescale, O as packed halves, logsumexp (natural log) --
        for r in range(ROWS):
            l_tot = l_i[r]
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 1)
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 2)
            row = row0 + 8 * r
            obase = (r // 2) * OS + 2 * (r % 2)
            inv = float32(1.0) / l_tot if l_tot > float32(0.0) else float32(0.0)
            if row < n_q:
                for nt in range(NT_O):
                    word = pack(acc[obase + nt * 4] * inv, acc[obase + nt * 4 + 1] * inv)
                    X.st_global_u32(X.global_addr(out, b, h, row, nt * 8 + 2 * tig), word)
                if tig == 0:
                    if l_tot > float32(0.0):
                        lse[b, h, row] = m_i[r] * float32(LN2) + math.log(l_tot)
                    else:
                        lse[b, h, row] = NEG_INF

    kernel.threads = THREADS
    kernel.smem_bytes = 2 * SMEM_HALVES
    return kernel


# -- host side -----------------------------------------------------------------------------------
def accepts(q, k, v, block_q=None, block_k=None, causal=False) -> bool:
    """Whether `forward` takes these inputs: half-precision arrays on a real GPU (torch CUDA
    float16/bfloat16 tensors or Numba float16 device arrays), head_dim in
    SUPPORTED_HEAD_DIMS, block sizes None or ones this kernel has. For dispatching."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        kind = _kind(q)
    except TypeError:
        return False
    if kind == "torch":
        import torch
        if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
                and k.dtype == q.dtype and v.dtype == q.dtype):
            return False
    elif kind == "numba":
        if {str(np.dtype(x.dtype)) for x in (q, k, v)} != {"float16"}:
            return False
    else:
        return False
    d = int(q.shape[-1])
    if d not in SUPPORTED_HEAD_DIMS:
        return False
    bq = default_blocks(d, causal)[0] if block_q is None else block_q
    bk = default_blocks(d, causal)[1] if block_k is None else block_k
    return bq in (64, 128) and bk in (32, 64) and smem_bytes(d, bk) <= SMEM_LIMIT_BYTES


def _kind(x):
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if isinstance(x, np.ndarray):
        return "numpy"
    if hasattr(x, "__cuda_array_interface__"):
        return "numba"
    raise TypeError(f"q, k, v must be NumPy arrays, Numba device arrays or torch CUDA tensors, "
                    f"got {type(x).__name__}")


_CONSTS: dict = {}


def _device_const(key, make):
    """Device copies of small host-built constants (schedules, the dummy mask), built once per
    (key, current device) so that a call does no synchronous host-to-device copy."""
    key = (fastlaunch.current_device_id(), key)
    if key not in _CONSTS:
        from numba import cuda
        if len(_CONSTS) > 256:
            _CONSTS.clear()
        val = make()
        if isinstance(val, tuple):
            _CONSTS[key] = tuple(cuda.to_device(x) if isinstance(x, np.ndarray) else x for x in val)
        else:
            _CONSTS[key] = cuda.to_device(val)
    return _CONSTS[key]


def check_problem(q, k, v, *, scale, dropout_p, head_dims, kernel_name, out=None, dout=None,
                  lse=None):
    """The checks every tensor-core entry point makes before it touches the GPU, in this order:
    one kind of array for all operands, a real GPU, q/k/v 4-D with k and v alike, GQA heads,
    (backward: out, dout and lse shapes), head dim in ``head_dims``, a positive scale, dropout_p
    in [0, 1). ``kernel_name`` ("tensor-core", "3xTF32") goes into the messages. Returns
    ``(kind, batch, heads, n_q, d, heads_kv, n_k, scale)``."""
    kind = _kind(q)
    if out is None:
        if _kind(k) != kind or _kind(v) != kind:
            raise TypeError("q, k and v must be the same kind of array")
    else:
        for name, x in (("k", k), ("v", v), ("out", out), ("dout", dout)):
            if _kind(x) != kind:
                raise TypeError(f"{name} must be the same kind of array as q")
    if not fastlaunch.real_gpu():
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
    if out is not None:
        for name, x in (("out", out), ("dout", dout)):
            if tuple(int(s) for s in x.shape) != (batch, heads, n_q, d):
                raise ValueError(f"{name} must have q's shape {(batch, heads, n_q, d)}, got "
                                 f"{tuple(x.shape)}")
        if tuple(int(s) for s in lse.shape) != (batch, heads, n_q):
            raise ValueError(f"lse must have shape {(batch, heads, n_q)}, got {tuple(lse.shape)}")
    if d not in head_dims:
        raise ValueError(f"head_dim must be one of {head_dims} for the {kernel_name} kernel, "
                         f"got {d}")
    scale = float(scale)
    if not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return kind, batch, heads, n_q, d, heads_kv, n_k, scale


def mask_on_device(mask, kind, batch, heads, n_q, n_k):
    """A boolean mask [1|B, 1|H, 1|Nq, Nk] as a uint8 device array, with its broadcast flags:
    returns ``(mask_d, mb, mh, mq)`` (flag 1 = that dimension is not broadcast). ``mask=None``
    gives a shared 1-element dummy and zero flags. ``kind`` is `_kind` of the operands; torch
    masks stay on the device as a uint8 tensor (zero-copy when already uint8 and contiguous),
    which `kernels.fastlaunch.launch` takes in place. Shared by the tensor-core kernels' host
    code."""
    from numba import cuda
    if mask is None:
        return _device_const("no-mask", lambda: np.ones((1, 1, 1, 1), np.uint8)), 0, 0, 0
    mshape = tuple(int(x) for x in mask.shape)
    if len(mshape) != 4 or mshape[0] not in (1, batch) or mshape[1] not in (1, heads) \
            or mshape[2] not in (1, n_q) or mshape[3] != n_k:
        raise ValueError(f"mask must be boolean [1|{batch}, 1|{heads}, 1|{n_q}, {n_k}], "
                         f"got {mshape}")
    if kind == "torch":
        import torch
        maskd = mask.detach().to(torch.uint8).contiguous()   # launched in place
    elif kind == "numpy":
        maskd = cuda.to_device(np.ascontiguousarray(mask, dtype=np.uint8))
    else:
        maskd = cuda.to_device(np.ascontiguousarray(mask.copy_to_host(), dtype=np.uint8))
    return maskd, int(mshape[0] > 1), int(mshape[1] > 1), int(mshape[2] > 1)


def dropout_constants(seed, dropout_p):
    """``(has_dropout, seed_hash, threshold, inv_keep)``: what the kernels need to regenerate
    `ioaware.dropout.keep_mask(seed, dropout_p, ...)` in-kernel (the salted, mixed seed, the
    32-bit keep threshold, and 1 / (1 - p)); memoised per (seed, p)."""
    try:
        return _dropout_constants_cached(seed, float(dropout_p))
    except TypeError:                     # an unhashable seed
        return _dropout_constants(seed, dropout_p)


@functools.lru_cache(maxsize=1024)
def _dropout_constants_cached(seed, dropout_p):
    return _dropout_constants(seed, dropout_p)


def _dropout_constants(seed, dropout_p):
    has_dropout = float(dropout_p) > 0.0
    lo, hi = split_seed(seed)
    seed_hash = int(fmix32(fmix32(np.uint32(lo) ^ np.uint32(SEED_SALT)) ^ np.uint32(hi)))
    threshold = keep_threshold(dropout_p) if has_dropout else 0
    return has_dropout, seed_hash, threshold, 1.0 / (1.0 - float(dropout_p))


def _schedule(block_mask, n_q, n_k, block_q, block_k, causal, batch, heads):
    """CSR schedules for every (batch, head) slice of the block mask, stacked."""
    if block_mask is None:
        offs, idx = BlockInfo(n_q, n_k, block_q, block_k, causal).kv_schedule()
        return offs[None, :], idx, 0, 0
    bm = np.asarray(block_mask, dtype=bool)
    nbq, nbk = cdiv(n_q, block_q), cdiv(n_k, block_k)
    if bm.ndim != 4 or bm.shape[0] not in (1, batch) or bm.shape[1] not in (1, heads) \
            or bm.shape[2:] != (nbq, nbk):
        raise ValueError(f"block_mask must have shape [1 or {batch}, 1 or {heads}, {nbq}, {nbk}] "
                         f"for block_q={block_q}, block_k={block_k}, got {bm.shape}")
    offs_all, idx_all, base = [], [], 0
    for bb in range(bm.shape[0]):
        for hb in range(bm.shape[1]):
            offs, idx = BlockInfo.with_block_mask(n_q, n_k, block_q, block_k, causal,
                                                  bm[bb, hb]).kv_schedule()
            offs_all.append(offs + base)
            idx_all.append(idx)
            base += len(idx)
    idx = np.concatenate(idx_all) if base else np.zeros(1, np.int32)
    return (np.stack(offs_all).astype(np.int32), idx.astype(np.int32),
            bm.shape[1] if bm.shape[0] > 1 else 0, 1 if bm.shape[1] > 1 else 0)


def forward(q, k, v, *, scale, causal=False, mask=None, block_mask=None, dropout_p=0.0, seed=0,
            block_q=None, block_k=None):
    """Half-precision tensor-core attention forward: returns ``(out, lse)``.

    Same contract as `kernels.forward`: q [B, Hq, Nq, d], k/v [B, Hkv, Nk, d] (Hq % Hkv == 0),
    float16 (NumPy / Numba / torch) or bfloat16 (torch) with d in {64, 128}; out has q's dtype
    and kind of memory, lse is float32 [B, Hq, Nq] (natural log, -inf for a fully masked row).
    ``block_q`` in {64, 128} (4 or 8 warps), ``block_k`` in {32, 64} (K/V buffers in dynamic
    shared memory, `smem_bytes`); None picks `default_blocks`.
    """
    from numba import cuda

    kind, batch, heads, n_q, d, heads_kv, n_k, scale = check_problem(
        q, k, v, scale=scale, dropout_p=dropout_p, head_dims=SUPPORTED_HEAD_DIMS,
        kernel_name="tensor-core")
    bq_def, bk_def = default_blocks(d, bool(causal))
    block_q = bq_def if block_q is None else int(block_q)
    block_k = bk_def if block_k is None else int(block_k)
    if block_q not in (64, 128):
        raise ValueError(f"block_q must be 64 or 128 for the tensor-core kernel, got {block_q}")
    if block_k not in (32, 64):
        raise ValueError(f"block_k must be 32 or 64 for the tensor-core kernel, got {block_k}")
    if smem_bytes(d, block_k) > SMEM_LIMIT_BYTES:
        raise ValueError(f"block_k={block_k} with head_dim={d} needs {smem_bytes(d, block_k)} "
                         f"bytes of shared memory, over the {SMEM_LIMIT_BYTES}-byte limit")

    # -- move / view the operands as 16-bit words on the device --
    stream = fastlaunch.launch_stream()
    if kind == "torch":
        import torch
        dt = q.dtype
        if dt not in (torch.float16, torch.bfloat16) or k.dtype != dt or v.dtype != dt:
            raise TypeError(f"q, k, v must all be float16 or bfloat16, got {q.dtype}, {k.dtype}, "
                            f"{v.dtype}")
        if not q.is_cuda:
            raise TypeError("torch tensors must be on a CUDA device")
        is_bf16 = dt == torch.bfloat16

        def prep(t):
            if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
                t = t.contiguous()
            return t.view(torch.int16)     # launched in place (kernels.fastlaunch)

        qd, kd, vd = prep(q), prep(k), prep(v)
        out_t = torch.empty((batch, heads, n_q, d), dtype=dt, device=q.device)
        lse_t = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
        outd, lsed = out_t.view(torch.int16), lse_t
        stream = fastlaunch.launch_stream(q)      # torch's current stream on q's device
    else:
        dts = {str(np.dtype(x.dtype)) for x in (q, k, v)}
        if dts != {"float16"}:
            raise TypeError(f"q, k, v must be float16 (bfloat16 only as torch tensors), got {dts}")
        is_bf16 = False

        def prep(a):
            if kind == "numpy":
                a = np.ascontiguousarray(a)
                return cuda.to_device(a.view(np.int16))
            st = a.strides
            if st[-1] != 2 or any(s % 16 for s in st[:-1]):
                a = cuda.to_device(np.ascontiguousarray(a.copy_to_host()))
            return a.view(np.int16) if hasattr(a, "view") else a

        qd, kd, vd = prep(q), prep(k), prep(v)
        outd = cuda.device_array((batch, heads, n_q, d), dtype=np.int16)
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
    kern = get_kernel(d, block_q, block_k, is_bf16, bool(causal), has_mask, has_dropout,
                      head_group)
    grid = (cdiv(n_q, block_q), batch * heads)
    fastlaunch.launch(kern, grid, kern.threads, stream, (
        qd, kd, vd, outd, lsed, offs_d, idx_d, sb, sh, heads // heads_kv, n_q, n_k,
        maskd, mb, mh, mq, np.float32(scale * LOG2E), np.uint32(seed_hash), np.uint32(threshold),
        np.float32(inv_keep)), sharedmem=kern.smem_bytes)

    if kind == "torch":
        return out_t, lse_t
    if kind == "numpy":
        return outd.copy_to_host().view(np.float16), lsed.copy_to_host()
    return outd.view(np.float16), lsed
