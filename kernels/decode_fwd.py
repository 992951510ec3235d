"""Split-KV decoding forward (the ``split_kv`` forward): few query rows, a long KV cache.

The plan is `sim.decode.SplitKVPlan` (kernel, grid, threads, rows per program, splits: see
there for why); this module launches it. Two kernels of one signature, program (batch, KV head,
row chunk, split): ``decode_split_kv_mma`` on the tensor cores (float16/bfloat16 at head dims 64
and 128 on a GPU of compute capability 8.0 or later: `make_decode_mma_kernel`, the ``mma``
forward's inner loop with each warp streaming its own key blocks), and ``decode_split_kv`` on the
CUDA cores (any input; the only one under the CUDA simulator), which this describes:

* Its rows are the KV group's query heads times the ``seqlen_q`` queries, so one load of K and V
  serves them all. Each warp takes `KEYS_PER_STEP` keys per step (keys interleaved across the
  warps); the lanes split the head dimension (lane l holds elements ``32 c + l``, or for 16-bit
  inputs the 32-bit words ``32 c + l`` of two elements each, so a warp's load of a key row is
  contiguous). Per step: load K and V, partial dot products per lane, a butterfly reduction
  across the warp (shared memory under Numba's CUDA simulator, which has no shuffles), then the
  online softmax (running max and sum per row, in base 2 with the scale folded into Q). At the
  end the warps' states are merged through shared memory.
* With one split the program writes the output (in the input dtype: the cast is fused, two
  16-bit elements per 32-bit store) and its logsumexp. With more, it writes its split's
  normalised partial output and logsumexp (float32), takes a ticket from its group's arrival
  counter, and the group's last program merges the splits (`make_merge_rows`): ``lse =
  logsumexp_s(lse_s)``, ``out = sum_s exp(lse_s - lse) out_s`` — the online-softmax merge the
  forward does between tiles, with no second kernel launch. The counters (one int32 per
  group and stream) are zero between calls: the merging program sets its counter back.

Per-sequence cache lengths (``problem.cache_seqlens``, int32 ``[B]``): keys at or beyond a
row's length are never read; causal and sliding-window bands are bottom-right aligned to that
length (the queries are the last ``seqlen_q`` positions of the sequence). Without them every
length is ``seqlen_k``. Each length is checked here: a row whose length lies outside
``[0, seqlen_k]`` reads no key and comes out NaN (output and logsumexp; the merge keeps the NaN),
so lengths that live on the device need no host read. Inputs: float32 as float32 arrays; float16 and bfloat16 as 32-bit words
(two elements each, unpacked with ``cvt``; the simulator runs a NumPy twin), so a lane loads
four bytes per access and bfloat16 is never staged to float32.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32, int32, int64, uint16, uint32, uint64

from ioaware.block_info import band_offsets
from sim.decode import (MAX_SEQLEN_Q, MMA_HEAD_DIMS, SMEM_BYTES_PER_SM, WARPS,
                        SplitKVPlan, split_kv_plan, uses_tensor_cores)

from . import compile_cache, host, ptx
from .copy import tile_loader
from .mask import UNBOUNDED

__all__ = ["forward", "prepare", "supports", "plan", "mma_available", "TAKES_WINDOW",
           "TAKES_CACHE_SEQLENS", "make_decode_kernel", "make_decode_mma_kernel", "make_finish",
           "make_merge_rows", "make_split_keys", "MIN_SEQLEN_K"]

#: This forward takes a sliding window and per-sequence cache lengths (`kernels.family_for`).
TAKES_WINDOW = True
TAKES_CACHE_SEQLENS = True
#: The registry picks this forward by itself only from this many keys on (shorter caches run
#: the tiled forwards); a `KernelConfig(family="split_kv")` takes any length.
MIN_SEQLEN_K = 256
MAX_HEAD_DIM = 256
#: Splits whose partial outputs (of one unit) and logsumexps one merge thread loads at once,
#: before it adds them: a bound on the merge's registers (which are the kernel's).
MERGE_LOADS = 16
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_INF = float32(-np.inf)
#: What a row whose cache length lies outside [0, seqlen_k] gets (output and logsumexp): lengths
#: on the device are checked here, not on the host (`ioaware._inputs.check_cache_seqlens`).
NAN = float32(np.nan)


def _unpack_f16_twin(word):
    """NumPy twin of `ptx.unpack_f16x2` (the simulator runs device code as Python)."""
    h = np.array([int(word) & 0xFFFFFFFF], np.uint32).view(np.float16)
    return float32(h[0]), float32(h[1])


def _unpack_bf16_twin(word):
    """NumPy twin of `ptx.unpack_bf16x2`."""
    w = int(word) & 0xFFFFFFFF
    lo = np.array([(w & 0xFFFF) << 16], np.uint32).view(np.float32)[0]
    hi = np.array([w & 0xFFFF0000], np.uint32).view(np.float32)[0]
    return float32(lo), float32(hi)


def make_decode_kernel(head_dim: int, rows: int, seqlen_q: int, group: int, operand: str,
                       banded: bool, warps: int, keys_per_step: int, lanes_per_key: int,
                       use_shfl: bool, lengths: bool = True):
    """The split-KV kernel for one configuration (compiled on first launch).

    ``operand``: "float32" (arrays of float32), "float16" or "bfloat16" (arrays of uint32
    words, two elements each). ``banded``: compile the per-element band test (causal or
    window). Signature::

        kernel(q, k, v, o_part, lse_part, out, lse, counters, seqlens, scale_log2, band_lo,
               band_hi, shift_to_len, seqlen_k, heads_kv, row_chunks)

    ``out``: float32 [B, Hq, Nq, d], or for 16-bit inputs int32 words [B, Hq, Nq, d / 2] of two
    elements each (the cast fused: rounded to nearest as torch's cast rounds); ``lse`` float32
    [B, Hq, Nq]. With one split a program writes them directly. With more, each writes its
    split's partial output and logsumexp (``o_part``, ``lse_part``, float32 ``[splits, B * Hq *
    Nq * d]`` and ``[splits, B * Hq * Nq]``: each split's rows flat, so a row's place is one
    product), and the last
    program of each (batch, KV head, row chunk) to finish — counted in ``counters`` (int32,
    one per ``blockIdx.x``, zero before the call and left zero after it) — merges them
    (`make_merge_rows`).

    ``lanes_per_key`` lanes share one key row (each holds ``head_dim / lanes_per_key``
    elements), so a warp works on ``32 / lanes_per_key`` keys at once, ``keys_per_step`` keys
    per lane group per step.

    grid = (B * Hkv * row_chunks, splits), block = warps * 32. Key ``j`` is allowed for query
    ``i`` of a sequence of length ``L`` iff ``j < L`` and, when banded,
    ``band_lo <= j - i - shift <= band_hi`` with ``shift = (L - seqlen_k) * shift_to_len``.
    ``lengths``: read each sequence's ``L`` from ``seqlens``; without, every ``L`` is
    ``seqlen_k`` and ``seqlens`` is not read (a call with no cache lengths: the programs'
    first copies then wait on no load of a length).
    """
    D, ROWS, NQ, G, NW, KB = head_dim, rows, seqlen_q, group, warps, keys_per_step
    WORDS = operand != "float32"
    EPU = 2 if WORDS else 1                  # elements per loaded unit
    U = D // EPU                             # units per key row
    LPK = lanes_per_key
    GW = 32 // LPK                           # lane groups (keys at once) per warp
    KW = GW * KB                             # keys per warp per step
    NU = -(-U // LPK)                        # units per lane
    NE = NU * EPU                            # elements per lane
    R_TOTAL = G * NQ
    ACC_ELEMS = ROWS * D                     # the warps' summed accumulators (shared memory)
    BANDED, SHFL = banded, use_shfl
    # the simulator's reductions (no shuffles there) go through shared memory
    RED_SHAPE = (1, 1, 1) if use_shfl else (NW, max(ROWS * KB, ROWS * (NE + 1)), 32)
    unpack = _half_op("unpack", operand)
    finish = make_finish(head_dim, rows, seqlen_q, group, warps, operand, slots=1,
                         slot_stride=0, row_stride=D)
    to_common_max = make_to_common_max(warps, math.exp2)
    row_stats = make_row_stats(warps, math.exp2)
    split_keys = make_split_keys(seqlen_q, banded)
    LENGTHS = lengths

    RAW = uint32 if WORDS else float32
    FULL = U % LPK == 0                      # every lane holds a unit of every row

    @cuda.jit(device=True)
    def load_step(kh, vh, kn, vn, base, last, sub):
        """K and V rows ``base .. base + KB - 1`` of one KV head into registers, as loaded. A
        key past the split loads the split's last key instead (no branch around the loads);
        its score is masked."""
        for kk in range(KB):
            j = uint64(min(base + kk, last))
            for u in range(NU):
                idx = uint64(u * LPK + sub)
                if FULL or idx < U:
                    kn[kk, u] = RAW(kh[j, idx])
                    vn[kk, u] = RAW(vh[j, idx])
                else:
                    kn[kk, u] = RAW(0)
                    vn[kk, u] = RAW(0)

    @cuda.jit
    def decode_split_kv(q, k, v, o_part, lse_part, out, lse, counters, seqlens, scale_log2,
                        band_lo, band_hi, shift_to_len, seqlen_k, heads_kv, row_chunks):
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        sub = lane % LPK
        grp = lane // LPK
        pid, split, splits, chunk, b, hkv = program_of(row_chunks, heads_kv)
        red = cuda.shared.array(RED_SHAPE, float32)
        sm_m = cuda.shared.array((NW, ROWS), float32)
        sm_l = cuda.shared.array((NW, ROWS), float32)
        sm_stat = cuda.shared.array((2, ROWS), float32)
        sm_acc = cuda.shared.array(ACC_ELEMS, float32)

        # -- the program's keys: the rows' bands within the sequence, then this split of them --
        length = int64(seqlens[b]) if LENGTHS else seqlen_k
        bad_length, shift, s0, s1 = split_keys(length, split, splits, seqlen_k, shift_to_len,
                                               band_lo, band_hi)
        steps = max(s1 - s0 + NW * KW - 1, int64(0)) // (NW * KW)

        # -- Q rows of the group in registers, scaled by scale * log2(e) --
        qr = cuda.local.array((ROWS, NE), float32)
        acc = cuda.local.array((ROWS, NE), float32)
        m_i = cuda.local.array(ROWS, float32)
        l_i = cuda.local.array(ROWS, float32)
        for r in range(ROWS):
            row = chunk * ROWS + r
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)
            for e in range(NE):
                qr[r, e] = float32(0.0)
                acc[r, e] = float32(0.0)
            if row < R_TOTAL:
                h = hkv * G + row // NQ
                i = row % NQ
                for u in range(NU):
                    idx = u * LPK + sub
                    if idx < U:
                        if WORDS:
                            lo, hi = unpack(uint32(q[b, h, i, idx]))
                            qr[r, 2 * u] = lo * scale_log2
                            qr[r, 2 * u + 1] = hi * scale_log2
                        else:
                            qr[r, u] = float32(q[b, h, i, idx]) * scale_log2

        kr = cuda.local.array((KB, NE), float32)
        vr = cuda.local.array((KB, NE), float32)
        kn = cuda.local.array((KB, NU), RAW)    # the next step's K and V, as loaded
        vn = cuda.local.array((KB, NU), RAW)
        s = cuda.local.array((ROWS, KB), float32)
        kh = k[b, hkv]
        vh = v[b, hkv]
        last = s1 - 1
        if steps > 0:
            load_step(kh, vh, kn, vn, s0 + warp * KW + grp * KB, last, sub)
        for t in range(steps):
            base = s0 + (t * NW + warp) * KW + grp * KB     # this lane group's first key
            # -- this step's K and V as float32, then the next step's loads in flight --
            for kk in range(KB):
                for u in range(NU):
                    if WORDS:
                        lo, hi = unpack(kn[kk, u])
                        kr[kk, 2 * u] = lo
                        kr[kk, 2 * u + 1] = hi
                        lo, hi = unpack(vn[kk, u])
                        vr[kk, 2 * u] = lo
                        vr[kk, 2 * u + 1] = hi
                    else:
                        kr[kk, u] = kn[kk, u]
                        vr[kk, u] = vn[kk, u]
            if t + 1 < steps:
                load_step(kh, vh, kn, vn, base + NW * KW, last, sub)
            # -- compute qk: partial dot products, then the sum across the lane group --
            for r in range(ROWS):
                for kk in range(KB):
                    x = float32(0.0)
                    for e in range(NE):
                        x += qr[r, e] * kr[kk, e]
                    if SHFL:
                        off = LPK // 2
                        while off > 0:
                            x += cuda.shfl_xor_sync(0xFFFFFFFF, x, off)
                            off //= 2
                        s[r, kk] = x
                    else:
                        red[warp, r * KB + kk, lane] = x
            if not SHFL:
                cuda.syncthreads()
                for r in range(ROWS):
                    for kk in range(KB):
                        x = float32(0.0)
                        for w in range(LPK):
                            x += red[warp, r * KB + kk, grp * LPK + w]
                        s[r, kk] = x
                cuda.syncthreads()
            # -- mask: keys past the split, outside a row's band, rows past the group --
            for r in range(ROWS):
                row = chunk * ROWS + r
                i = row % NQ
                for kk in range(KB):
                    j = base + kk
                    ok = j < s1 and row < R_TOTAL
                    if BANDED:
                        delta = j - i - shift
                        ok = ok and delta >= band_lo and delta <= band_hi
                    if not ok:
                        s[r, kk] = NEG_INF
            # -- update m_i (the warp's, over every lane group) and l_i (this group's keys) --
            for r in range(ROWS):
                m_new = m_i[r]
                for kk in range(KB):
                    m_new = max(m_new, s[r, kk])
                if SHFL:
                    off = LPK
                    while off < 32:
                        m_new = max(m_new, cuda.shfl_xor_sync(0xFFFFFFFF, m_new, off))
                        off *= 2
                else:
                    red[warp, r, lane] = m_new
                    cuda.syncthreads()
                    for g in range(GW):
                        m_new = max(m_new, red[warp, r, g * LPK])
                    cuda.syncthreads()
                if m_new != NEG_INF:
                    alpha = math.exp2(m_i[r] - m_new)
                    p_sum = float32(0.0)
                    for kk in range(KB):
                        p = math.exp2(s[r, kk] - m_new)
                        s[r, kk] = p
                        p_sum += p
                    l_i[r] = l_i[r] * alpha + p_sum
                    m_i[r] = m_new
                    for e in range(NE):
                        a = acc[r, e] * alpha
                        for kk in range(KB):
                            a += s[r, kk] * vr[kk, e]
                        acc[r, e] = a

        # -- sum the lane groups' sums and accumulators (they share the warp's max) --
        for r in range(ROWS):
            if SHFL:
                off = LPK
                while off < 32:
                    l_i[r] += cuda.shfl_xor_sync(0xFFFFFFFF, l_i[r], off)
                    for e in range(NE):
                        acc[r, e] += cuda.shfl_xor_sync(0xFFFFFFFF, acc[r, e], off)
                    off *= 2
            else:
                red[warp, r * (NE + 1), lane] = l_i[r]
                for e in range(NE):
                    red[warp, r * (NE + 1) + 1 + e, lane] = acc[r, e]
                cuda.syncthreads()
                x = float32(0.0)
                for g in range(GW):
                    x += red[warp, r * (NE + 1), g * LPK + sub]
                l_i[r] = x
                for e in range(NE):
                    x = float32(0.0)
                    for g in range(GW):
                        x += red[warp, r * (NE + 1) + 1 + e, g * LPK + sub]
                    acc[r, e] = x
                cuda.syncthreads()

        # -- merge the warps: each warp's max and sum; the rows' 1 / sum and logsumexp (a thread
        #    a row); the accumulators at the common max, summed in shared memory --
        if lane == 0:
            for r in range(ROWS):
                sm_m[warp, r] = m_i[r]
                sm_l[warp, r] = l_i[r]
        cuda.syncthreads()
        if tid < ROWS:
            row_stats(sm_m, sm_l, sm_stat, tid)
        for r in range(ROWS):
            f = to_common_max(sm_m, r, m_i[r])
            for e in range(NE):
                acc[r, e] = acc[r, e] * f
        for w in range(NW):
            if warp == w and grp == 0:
                for r in range(ROWS):
                    for u in range(NU):
                        idx = u * LPK + sub
                        if idx < U:
                            for c in range(EPU):
                                col = idx * EPU + c
                                prev = float32(0.0) if w == 0 else sm_acc[r * D + col]
                                sm_acc[r * D + col] = prev + acc[r, u * EPU + c]
            cuda.syncthreads()

        finish(o_part, lse_part, out, lse, counters, b, hkv, heads_kv, chunk, pid, split, splits,
               bad_length, sm_stat, sm_acc)

    return decode_split_kv


def make_decode_mma_kernel(head_dim: int, seqlen_q: int, group: int, operand: str, banded: bool,
                           warps: int, block_k: int, stages: int, resident_per_sm: int = 0,
                           lengths: bool = True):
    """The split-KV kernel on the tensor cores (float16/bfloat16, a real GPU of compute
    capability 8.0 or later; compiled on first launch). Same signature, grid and result as
    `make_decode_kernel`'s, with 16 rows per program (``rows_per_program`` of the plan: the KV
    group's rows, padded to one 16-row ``mma`` tile; rows past the group are computed and never
    written).

    Each warp streams its own key blocks of ``block_k`` keys (block ``t * warps + warp`` of the
    program's split at step ``t``, so the warps read neighbouring memory together) through its
    own ``stages``-deep ring of shared-memory buffers, filled by ``cp.async.ca`` (16-byte copies,
    zero-filled past the split; no barrier across warps in the loop). Per block, as the ``mma``
    forward (`kernels.mma_fwd`): S = Q K^T with ``mma.sync.m16n8k16`` (Q fragments in registers
    for the whole sweep, K by ``ldmatrix``), the mask where the block is partial or banded, the
    online softmax in base 2 (the accumulators rescaled only when a row's max moved: a warp
    vote), P rounded to 16 bits in registers as the A operand of O += P V (V by
    ``ldmatrix.trans``). A full block is copied from addresses kept out of the loop with no
    per-row test; only the split's last block tests its rows. The warps' states then meet in
    shared memory: each warp's max and sum, then (one barrier on) each row's 1 / sum and
    logsumexp (`make_row_stats`, a thread a row) and each warp's accumulators at the warps'
    common max (the group's rows only, 64-bit stores) into its own slot of the idle rings;
    `make_finish` sums the slots as it writes the output or the partials.

    ``resident_per_sm``: the programs an SM is to hold (the plan's), kept on the kernel for the
    launch (`kernels.host` asks for the shared-memory carveout that fits just that many; 0:
    the driver's choice). ``lengths``: as `make_decode_kernel`'s."""
    from . import ptx as _ptx
    D, NQ, G, NW, BK, ST = head_dim, seqlen_q, group, warps, block_k, stages
    ROWS = 16
    R_TOTAL = G * NQ
    BANDED = banded
    is_bf16 = operand == "bfloat16"
    mma_op = _ptx.mma_bf16 if is_bf16 else _ptx.mma_f16
    mma_x2 = _ptx.mma_pair(mma_op)                 # two products of one A fragment
    pack = _ptx.pack_bf16x2 if is_bf16 else _ptx.pack_f16x2
    STRIDE = D + 8                      # halves per shared row (16-byte pad: no ldmatrix conflicts)
    TILE = BK * STRIDE                  # halves per K or V buffer
    WARP_HALVES = ST * 2 * TILE         # a warp's ring: K | V per stage
    CHUNKS = D // 8                     # 16-byte chunks per row
    KC = D // 16                        # k-steps of S = Q K^T
    NT_S = BK // 8                      # 16x8 score tiles per block
    KC_P = BK // 16                     # k-steps of O += P V
    NT_O = D // 8                       # 16x8 output tiles
    Q_REGS, S_REGS, O_REGS = KC * 4, NT_S * 4, NT_O * 4     # register arrays
    assert BK * CHUNKS % 32 == 0 and BK % 16 == 0 and D % 16 == 0 and ST in (2, 3, 4)
    ACC_STRIDE = D + 8                  # floats per row of a warp's accumulators in shared memory
    ACC_SLOT = ROWS * ACC_STRIDE        # floats per warp (the rings, idle by then, hold them)
    assert NW * ACC_SLOT * 4 <= NW * WARP_HALVES * 2
    # the lane's rows are gid and gid + 8; a group of 8 rows or fewer has none of the latter
    LANE_ROWS = 2 if R_TOTAL > 8 else 1
    finish = make_finish(head_dim, ROWS, seqlen_q, group, warps, operand, slots=NW,
                         slot_stride=ACC_SLOT, row_stride=ACC_STRIDE)
    to_common_max = make_to_common_max(warps, _ptx.ex2)
    row_stats = make_row_stats(warps, _ptx.ex2)
    split_keys = make_split_keys(seqlen_q, banded)
    LENGTHS = lengths
    load_rows = tile_loader(BK, CHUNKS, 32, 2 * STRIDE, through_l1=True)   # a warp's BK rows
    ROW_STEP = 32 // CHUNKS             # rows apart of a lane's successive copies
    COPIES = BK // ROW_STEP             # a lane's copies per K (or V) block
    FULL = 0xFFFFFFFF

    @cuda.jit(device=True, inline=True)
    def load_block(k_head, v_head, k_row_bytes, v_row_bytes, key0, s1, s_addr, r_lane):
        # -- cp.async one block of K and V: BK rows x D halves, 16 bytes a lane a copy, through
        #    L1 (.ca: a warp's 512 bytes reach L2 as whole lines; .cg fragments them) --
        if key0 + BK <= s1:             # every row in range (the warp agrees): no checks
            row = uint64(key0 + r_lane)
            gk = k_head + row * k_row_bytes
            gv = v_head + row * v_row_bytes
            k_step = uint64(ROW_STEP) * k_row_bytes
            v_step = uint64(ROW_STEP) * v_row_bytes
            for i in range(COPIES):
                s_i = s_addr + uint32(i * ROW_STEP * 2 * STRIDE)
                _ptx.cp_async_16_ca(s_i, gk, uint32(16))
                _ptx.cp_async_16_ca(s_i + uint32(2 * TILE), gv, uint32(16))
                gk += k_step
                gv += v_step
        else:                           # the split's last, partial block: rows past s1 zeroed
            load_rows(k_head, k_row_bytes, key0 + r_lane, s1, s_addr, r_lane)
            load_rows(v_head, v_row_bytes, key0 + r_lane, s1, s_addr + uint32(2 * TILE), r_lane)

    @cuda.jit(device=True, inline=True)
    def wait_stage():
        # -- at most ST - 2 groups in flight: the oldest block has landed --
        if ST == 2:
            _ptx.cp_async_wait_1()
        elif ST == 3:
            _ptx.cp_async_wait_2()
        else:
            _ptx.cp_async_wait_3()

    @cuda.jit
    def decode_split_kv_mma(q, k, v, o_part, lse_part, out, lse, counters, seqlens, scale_log2,
                            band_lo, band_hi, shift_to_len, seqlen_k, heads_kv, row_chunks):
        smem = cuda.shared.array(0, dtype=uint16)        # the warps' rings (dynamic)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        pid, split, splits, chunk, b, hkv = program_of(row_chunks, heads_kv)
        sm_m = cuda.shared.array((NW, ROWS), float32)
        sm_l = cuda.shared.array((NW, ROWS), float32)
        sm_stat = cuda.shared.array((2, ROWS), float32)

        # -- the program's keys: the rows' bands within the sequence, then this split of them --
        length = int64(seqlens[b]) if LENGTHS else seqlen_k
        bad_length, shift, s0, s1 = split_keys(length, split, splits, seqlen_k, shift_to_len,
                                               band_lo, band_hi)
        n_blocks = max(s1 - s0 + BK - 1, int64(0)) // BK
        steps = (n_blocks - warp + NW - 1) // NW if n_blocks > warp else int64(0)

        # -- this lane's copies: its chunk of K and V rows, its place in the warp's ring --
        r_lane = lane // CHUNKS
        ch = lane % CHUNKS
        k_head = _ptx.global_addr(k, b, hkv, 0, ch * 4)
        v_head = _ptx.global_addr(v, b, hkv, 0, ch * 4)
        k_row_bytes = uint64(k.strides[2])
        v_row_bytes = uint64(v.strides[2])
        ring = warp * WARP_HALVES
        s_lane = _ptx.shared_addr(smem, ring + r_lane * STRIDE + ch * 8)

        # -- prologue: the first ST - 1 blocks in flight (an empty group where there is none) --
        for t in range(ST - 1):
            if t < steps:
                load_block(k_head, v_head, k_row_bytes, v_row_bytes, s0 + (t * NW + warp) * BK,
                           s1, s_lane + uint32(t * 4 * TILE), r_lane)
            _ptx.cp_async_commit()

        # -- Q fragments (A operand) of the chunk's 16 rows, straight from global memory --
        qf = cuda.local.array(Q_REGS, dtype=uint32)
        q_i = cuda.local.array(2, dtype=int64)          # each of the lane's rows' query index
        for rr in range(2):
            row = chunk * ROWS + gid + 8 * rr
            q_i[rr] = row % NQ
            q_row = uint64(0)
            if row < R_TOTAL:
                q_row = _ptx.global_addr(q, b, hkv * G + row // NQ, row % NQ, tig)
            for kc in range(KC):
                for half in range(2):
                    val = uint32(0)
                    if row < R_TOTAL:
                        val = _ptx.ld_global_u32(q_row + 4 * (kc * 8 + 4 * half))
                    qf[kc * 4 + rr + 2 * half] = val

        acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        pa = cuda.local.array(4, dtype=uint32)
        m_i = cuda.local.array(2, dtype=float32)
        l_i = cuda.local.array(2, dtype=float32)
        alpha = cuda.local.array(2, dtype=float32)
        for rr in range(2):
            m_i[rr] = NEG_INF
            l_i[rr] = float32(0.0)

        # per-lane ldmatrix offsets (halves) inside a K / V buffer (see kernels.fragments)
        k_lane = (lane % 8 + 8 * (lane // 16)) * STRIDE + 8 * ((lane // 8) % 2)
        v_lane = (lane % 8 + 8 * ((lane // 8) % 2)) * STRIDE + 8 * (lane // 16)

        for t in range(steps):
            nxt = t + ST - 1
            if nxt < steps:
                load_block(k_head, v_head, k_row_bytes, v_row_bytes, s0 + (nxt * NW + warp) * BK,
                           s1, s_lane + uint32((nxt % ST) * 4 * TILE), r_lane)
            _ptx.cp_async_commit()
            wait_stage()                    # block t has landed (this lane's copies) ...
            cuda.syncwarp(FULL)             # ... and every lane's
            buf = ring + (t % ST) * 2 * TILE
            key0 = s0 + (t * NW + warp) * BK

            # -- compute qk: one ldmatrix of K feeds two mma --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
            k_addr = _ptx.shared_addr(smem, buf + k_lane)
            for kc in range(KC):
                for ntp in range(NT_S // 2):
                    bk = _ptx.ldmatrix_x4(k_addr + 2 * (16 * ntp * STRIDE + 16 * kc))
                    j = 8 * ntp
                    a = kc * 4
                    mma_x2(qf[a], qf[a + 1], qf[a + 2], qf[a + 3], bk, s_reg, j)

            # -- mask: keys past the split (a partial block), outside a row's band --
            if BANDED or key0 + BK > s1:
                for nt in range(NT_S):
                    for i in range(4):
                        key = key0 + nt * 8 + 2 * tig + (i & 1)
                        ok = key < s1
                        if BANDED:
                            delta = key - q_i[i >> 1] - shift
                            ok = ok and delta >= band_lo and delta <= band_hi
                        if not ok:
                            s_reg[nt * 4 + i] = NEG_INF

            # -- update m_i and l_i (the lane's rows gid, gid + 8: registers 0-1, 2-3) --
            moved = False
            for rr in range(2):
                mx = NEG_INF
                for nt in range(NT_S):
                    mx = max(mx, max(s_reg[nt * 4 + 2 * rr], s_reg[nt * 4 + 2 * rr + 1]))
                mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 1))
                mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 2))
                m_new = max(m_i[rr], mx * scale_log2)
                m_use = m_new if m_new != NEG_INF else float32(0.0)
                a_r = _ptx.ex2(m_i[rr] - m_use)
                row_sum = float32(0.0)
                for nt in range(NT_S):
                    for c in range(2):
                        e = nt * 4 + 2 * rr + c
                        p = _ptx.ex2(s_reg[e] * scale_log2 - m_use)
                        row_sum += p
                        s_reg[e] = p
                l_i[rr] = l_i[rr] * a_r + row_sum
                m_i[rr] = m_new
                alpha[rr] = a_r
                moved = moved or a_r != float32(1.0)
            # -- rescale O where some row's max moved (rare once the max settles) --
            if cuda.any_sync(FULL, moved):
                for nt in range(NT_O):
                    for i in range(4):
                        acc[nt * 4 + i] *= alpha[i >> 1]

            # -- P to 16 bits in registers, O += P V: one ldmatrix of V feeds two mma --
            v_addr = _ptx.shared_addr(smem, buf + TILE + v_lane)
            for kcp in range(KC_P):
                j = 8 * kcp
                for i in range(4):
                    pa[i] = pack(s_reg[j + 2 * i], s_reg[j + 2 * i + 1])
                for ntp in range(NT_O // 2):
                    bv = _ptx.ldmatrix_x4_trans(v_addr + 2 * (16 * kcp * STRIDE + 16 * ntp))
                    o = 8 * ntp
                    mma_x2(pa[0], pa[1], pa[2], pa[3], bv, acc, o)
            cuda.syncwarp(FULL)             # this buffer is refilled ST - 1 blocks on
        _ptx.cp_async_wait_all()

        # -- the lane's row sums over its four lanes; each warp's max and sum to shared memory --
        for rr in range(2):
            x = l_i[rr]
            x += cuda.shfl_xor_sync(FULL, x, 1)
            x += cuda.shfl_xor_sync(FULL, x, 2)
            l_i[rr] = x
        if tig == 0:
            for rr in range(2):
                sm_m[warp, gid + 8 * rr] = m_i[rr]
                sm_l[warp, gid + 8 * rr] = l_i[rr]
        cuda.syncthreads()
        # -- the rows' 1 / sum and logsumexp (a thread a row); each warp's accumulators, at the
        #    warps' common max, into its slot of the idle rings (the group's rows only) --
        n_rows = chunk_rows(chunk, ROWS, R_TOTAL)
        if tid < n_rows:
            row_stats(sm_m, sm_l, sm_stat, tid)
        s_acc = _ptx.shared_addr(smem, 2 * (warp * ACC_SLOT + gid * ACC_STRIDE + 2 * tig))
        for rr in range(LANE_ROWS):
            if gid + 8 * rr < n_rows:
                f = to_common_max(sm_m, gid + 8 * rr, m_i[rr])
                for nt in range(NT_O):
                    _ptx.st_shared_v2_f32(s_acc + uint32(4 * (8 * rr * ACC_STRIDE + nt * 8)),
                                          acc[nt * 4 + 2 * rr] * f, acc[nt * 4 + 2 * rr + 1] * f)
        cuda.syncthreads()

        finish(o_part, lse_part, out, lse, counters, b, hkv, heads_kv, chunk, pid, split, splits,
               bad_length, sm_stat, cuda.shared.array(0, dtype=float32))

    decode_split_kv_mma.threads = NW * 32
    decode_split_kv_mma.smem_bytes = NW * WARP_HALVES * 2
    # the programs an SM holds, as the plan has them (`kernels.host` fits the carveout to them)
    decode_split_kv_mma.resident_per_sm = resident_per_sm
    return decode_split_kv_mma


@cuda.jit(device=True, inline=True)
def program_of(row_chunks, heads_kv):
    """``(pid, split, splits, chunk, b, hkv)`` of this split-KV program: grid x is (batch, KV
    head, row chunk) as ``pid``, grid y the key split (both decoding kernels)."""
    pid = cuda.blockIdx.x
    # unsigned 32-bit quotients (a 64-bit division is a long subroutine on the GPU)
    bh = uint32(pid) // uint32(row_chunks)
    b = bh // uint32(heads_kv)
    return (pid, cuda.blockIdx.y, cuda.gridDim.y, pid - bh * row_chunks, int64(b),
            bh - b * heads_kv)


@cuda.jit(device=True, inline=True)
def chunk_rows(chunk, rows, rows_total):
    """Rows of row chunk ``chunk`` (``rows`` a program) that belong to the KV group's
    ``rows_total``: the rest of the chunk's padded rows are computed and never written."""
    return min(int64(rows), rows_total - chunk * rows)


@cuda.jit(device=True, inline=True)
def partial_row(b, hkv, heads_kv, rows_total, row):
    """Row ``row`` of KV group (b, hkv) as a row of ``[B, Hq, Nq]`` flat: its place in each
    split's partials (``lse_part[split, .]``, ``o_part[split, . * d + col]``), where the
    finishing programs write it and the merge reads it."""
    return uint64((b * heads_kv + hkv) * rows_total + row)


def make_split_keys(seqlen_q: int, banded: bool):
    """The device function with which a split-KV program finds its keys, shared by both
    decoding kernels::

        bad_length, shift, s0, s1 = split_keys(length, split, splits, seqlen_k, shift_to_len,
                                               band_lo, band_hi)

    ``length``: the sequence's cache length; outside ``[0, seqlen_k]`` it is ``bad_length``
    (the program reads no key and its rows come out NaN). The keys any row of the sequence may
    see (below the length and, when ``banded``, within the rows' bands, shifted by ``shift`` to
    the length when bottom-right aligned) are cut into ``splits`` equal runs; split ``split``
    takes keys ``s0 .. s1 - 1`` (none where ``s0 >= s1``)."""
    NQ, BANDED = seqlen_q, banded

    @cuda.jit(device=True, inline=True)
    def split_keys(length, split, splits, seqlen_k, shift_to_len, band_lo, band_hi):
        length = int64(length)
        bad_length = length < 0 or length > seqlen_k
        if bad_length:
            length = int64(0)
        shift = (length - seqlen_k) * shift_to_len
        k_begin = int64(0)
        k_end = length
        if BANDED:
            k_begin = max(k_begin, band_lo + shift)
            k_end = min(k_end, NQ - 1 + band_hi + shift + 1)
        n_keys = max(k_end - k_begin, int64(0))
        # an unsigned 32-bit quotient (keys fit: lengths are int32); a 64-bit one is a subroutine
        per_split = int64(uint32(n_keys + splits - 1) // uint32(splits))
        s0 = k_begin + split * per_split
        s1 = min(k_end, s0 + per_split)
        return bad_length, shift, s0, s1

    return split_keys


def make_common_max(warps: int):
    """``m_all = common_max(sm_m, r)``: the warps' common max of row r, ``max_w sm_m[w, r]``
    (-inf where no warp saw a key of the row)."""
    NW = warps

    @cuda.jit(device=True, inline=True)
    def common_max(sm_m, r):
        m_all = NEG_INF
        for w in range(NW):
            m_all = max(m_all, sm_m[w, r])
        return m_all

    return common_max


def make_to_common_max(warps: int, exp2):
    """The device function with which a warp of either decoding kernel scales row r to the
    warps' common max once every warp has put its own max in ``sm_m[w, r]``::

        f = to_common_max(sm_m, r, m_own)

    ``f = exp2(m_own - max_w sm_m[w, r])`` (base 2), 0 where either max is -inf (the warp, or
    every warp, saw no key of the row): the factor of the warp's sum and accumulators of the
    row. ``exp2``: ``ptx.ex2`` (the tensor-core kernel) or ``math.exp2`` (the CUDA-core one, which
    the simulator runs)."""
    EXP2 = exp2
    common_max = make_common_max(warps)

    @cuda.jit(device=True, inline=True)
    def to_common_max(sm_m, r, m_own):
        m_all = common_max(sm_m, r)
        f = float32(0.0)
        if m_all != NEG_INF and m_own != NEG_INF:
            f = EXP2(m_own - m_all)
        return f

    return to_common_max


def make_row_stats(warps: int, exp2):
    """The device function with which one thread of either decoding kernel ends row r once
    every warp has put its running max (base 2) in ``sm_m[w, r]`` and its sum at that max in
    ``sm_l[w, r]``::

        row_stats(sm_m, sm_l, sm_stat, r)

    writes ``sm_stat[0, r] = 1 / l`` and ``sm_stat[1, r] = ln 2 (m + log2 l)``, the row's
    logsumexp (natural log), where ``m`` is the warps' common max and ``l = sum_w sm_l[w, r]
    exp2(sm_m[w, r] - m)``; 0 and -inf where the row saw no key. ``exp2`` as in
    `make_to_common_max`."""
    NW, EXP2 = warps, exp2
    common_max = make_common_max(warps)

    @cuda.jit(device=True, inline=True)
    def row_stats(sm_m, sm_l, sm_stat, r):
        m_all = common_max(sm_m, r)
        l_all = float32(0.0)
        if m_all != NEG_INF:
            for w in range(NW):
                m_w = sm_m[w, r]
                if m_w != NEG_INF:
                    l_all += sm_l[w, r] * EXP2(m_w - m_all)
        inv = float32(0.0)
        x = NEG_INF
        if l_all > float32(0.0):
            inv = float32(1.0) / l_all
            x = (m_all + math.log2(l_all)) * float32(LN2)
        sm_stat[0, r] = inv
        sm_stat[1, r] = x

    return row_stats


def make_finish(head_dim: int, rows: int, seqlen_q: int, group: int, warps: int, operand: str,
                slots: int, slot_stride: int, row_stride: int):
    """The end of a split-KV program, shared by both decoding kernels, run by every thread::

        finish(o_part, lse_part, out, lse, counters, b, hkv, heads_kv, chunk, pid, split,
               splits, bad_length, sm_stat, acc_sm)

    from the program's rows as its warps left them in shared memory: ``sm_stat[0, r]`` the
    row's 1 / sum and ``sm_stat[1, r]`` its logsumexp (`make_row_stats`), and in the float32
    array ``acc_sm`` ``slots`` partial accumulators of the row, at the warps' common max, which
    it sums: column ``c`` of row ``r`` in slot ``w`` at ``w * slot_stride + r * row_stride +
    c``. With one split it writes the output (cast to the input dtype) and logsumexp; with
    more, this split's normalised partial output and logsumexp, then takes a ticket from the
    group's arrival counter, and the last program of the group merges the splits
    (`make_merge_rows`)."""
    D, ROWS, NQ, G, NW = head_dim, rows, seqlen_q, group, warps
    WORDS = operand != "float32"
    EPU = 2 if WORDS else 1
    UO = D // EPU
    R_TOTAL = G * NQ
    NT = NW * 32
    SLOTS, SLOT_STRIDE, ROW_STRIDE = slots, slot_stride, row_stride
    pack = _half_op("pack", operand)
    merge_rows = make_merge_rows(head_dim, rows, seqlen_q, group, warps, operand)
    take_ticket = _ticket_op()

    @cuda.jit(device=True, inline=True)
    def acc_of(acc_sm, r, col):
        # -- column col of row r: the slots' sum --
        at = uint32(r) * uint32(ROW_STRIDE) + uint32(col)
        total = float32(0.0)
        for w in range(SLOTS):
            total += acc_sm[at + uint32(w * SLOT_STRIDE)]
        return total

    @cuda.jit(device=True)
    def finish(o_part, lse_part, out, lse, counters, b, hkv, heads_kv, chunk, pid, split,
               splits, bad_length, sm_stat, acc_sm):
        tid = cuda.threadIdx.x
        sm_last = cuda.shared.array(1, int32)
        n_rows = chunk_rows(chunk, ROWS, R_TOTAL)               # the chunk's rows in the group
        # -- one split: the output and logsumexp (natural log), written directly --
        if splits == 1:
            for flat in range(tid, n_rows * UO, NT):
                r = flat // UO
                u = flat % UO
                row = chunk * ROWS + r
                h = hkv * G + row // NQ
                i = row % NQ
                inv = sm_stat[0, r]
                if WORDS:
                    o0 = acc_of(acc_sm, r, 2 * u) * inv
                    o1 = acc_of(acc_sm, r, 2 * u + 1) * inv
                    if bad_length:
                        o0 = NAN
                        o1 = NAN
                    out[b, h, i, u] = int32(pack(o0, o1))
                else:
                    o0 = acc_of(acc_sm, r, u) * inv
                    out[b, h, i, u] = NAN if bad_length else o0
                if u == 0:
                    lse[b, h, i] = NAN if bad_length else sm_stat[1, r]
            return

        # -- more: this split's normalised partial output and logsumexp (natural log) --
        for flat in range(tid, n_rows * D, NT):
            r = flat // D
            col = flat % D
            row = chunk * ROWS + r
            o = acc_of(acc_sm, r, col) * sm_stat[0, r]
            if bad_length:
                o = NAN
            prow = partial_row(b, hkv, heads_kv, R_TOTAL, row)
            o_part[split, prow * D + col] = o
            if col == 0:
                lse_part[split, prow] = NAN if bad_length else sm_stat[1, r]

        # -- the last of the group's programs to finish merges the splits: the ticket releases
        #    this program's partials (written before the barrier) and acquires the others' --
        cuda.syncthreads()
        if tid == 0:
            ticket = take_ticket(counters, pid, 1)
            sm_last[0] = int32(1) if ticket == splits - 1 else int32(0)
        cuda.syncthreads()
        if sm_last[0] == 1:
            merge_rows(o_part, lse_part, out, lse, b, hkv, heads_kv, chunk, splits)
            if tid == 0:
                counters[pid] = 0           # zero again for the next call on this stream

    return finish


def _pack_f16_twin(lo, hi):
    """NumPy twin of `ptx.pack_f16x2` as the int32 word the merge stores (round to nearest)."""
    h = np.array([lo, hi], np.float32).astype(np.float16)
    return int(h.view(np.int32)[0])


def _pack_bf16_twin(lo, hi):
    """NumPy twin of `ptx.pack_bf16x2` as the int32 word the merge stores (round to nearest
    even; NaN stays NaN)."""
    bits = np.array([lo, hi], np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.array([lo, hi], np.float32))
    rounded[nan] = 0x7FC0
    return int(np.array([rounded[0] | (rounded[1] << 16)], np.uint64).astype(np.uint32)
               .view(np.int32)[0])


def _half_op(kind: str, dtype: str):
    """The conversion between float32 and two 16-bit elements in a 32-bit word the kernels call
    (``kind`` "pack" or "unpack", ``dtype`` "float16" or "bfloat16"): the inline-PTX intrinsic
    on a GPU, its NumPy twin under the simulator; None for "float32" (no words)."""
    if dtype == "float32":
        return None
    f16 = dtype == "float16"
    if host.simulator():
        twins = {"pack": (_pack_f16_twin, _pack_bf16_twin),
                 "unpack": (_unpack_f16_twin, _unpack_bf16_twin)}[kind]
    else:
        twins = {"pack": (ptx.pack_f16x2, ptx.pack_bf16x2),
                 "unpack": (ptx.unpack_f16x2, ptx.unpack_bf16x2)}[kind]
    return twins[0] if f16 else twins[1]


@cuda.jit(device=True)
def _ticket_fenced(counters, index, value):
    """The simulator's ticket: fences around a plain atomic add (what `ptx.atom_add_acq_rel`
    is on a GPU)."""
    cuda.threadfence()
    old = cuda.atomic.add(counters, index, value)
    cuda.threadfence()
    return old


def _ticket_op():
    """The ticket the split-KV programs take (``old = take(counters, pid, 1)``): one
    ``atom.acq_rel.gpu`` on a GPU (`ptx.atom_add_acq_rel`), fenced atomics under the
    simulator."""
    return _ticket_fenced if host.simulator() else ptx.atom_add_acq_rel


def _exp2_op():
    """``exp2`` as the merge calls it: ``ex2.approx`` on a GPU (`ptx.ex2`), ``math.exp2`` under
    the simulator (which runs no inline PTX)."""
    return math.exp2 if host.simulator() else ptx.ex2


def make_merge_rows(head_dim: int, rows: int, seqlen_q: int, group: int, warps: int,
                    output: str):
    """The device function with which the last program of a (batch, KV head, row chunk) group
    merges the group's splits, run by every thread of the program (``warps`` warps)::

        merge_rows(o_part, lse_part, out, lse, b, hkv, heads_kv, chunk, splits)

    For each of the chunk's query rows (at most ``rows``, those of the group) it writes ``lse =
    logsumexp_s(lse_s)`` and ``out = sum_s exp(lse_s - lse) out_s`` (``out`` as the split-KV
    kernel takes it: float32, or for ``output`` "float16" / "bfloat16" int32 words of two
    elements each). It needs no shared memory and no barrier.

    Each thread takes units (32-bit words of two elements, or float32 elements) of the rows in
    turn; for each it loads the logsumexps and partial outputs of `MERGE_LOADS` splits at once
    (a row's logsumexps are one address for all its threads; past the last split it loads the
    last split again and gives it no weight, so the loads need no branch), then folds them into
    a running max, sum and weighted sum in base 2 (the online softmax over the splits; the
    weights' exponentials independent of each other): one round trip to memory per
    `MERGE_LOADS` splits. A row whose splits all have a -inf logsumexp (every key masked) gets 0
    and -inf; a NaN logsumexp (a refused cache length) makes the row NaN."""
    D, ROWS, NQ, G, NT = head_dim, rows, seqlen_q, group, warps * 32
    R_TOTAL = G * NQ
    WORDS = output != "float32"
    EPU = 2 if WORDS else 1                  # output elements per unit
    UO = D // EPU                            # units per row
    LOADS = MERGE_LOADS
    pack = _half_op("pack", output)
    exp2 = _exp2_op()

    @cuda.jit(device=True)
    def merge_rows(o_part, lse_part, out, lse, b, hkv, heads_kv, chunk, splits):
        x_lse = cuda.local.array(LOADS, float32)    # base 2
        x_out = cuda.local.array((LOADS, EPU), float32)
        acc = cuda.local.array(EPU, float32)        # sum of exp2(lse_s - m) out_s
        n_units = chunk_rows(chunk, ROWS, R_TOTAL) * UO      # the group's rows only
        for g in range(cuda.threadIdx.x, n_units, NT):
            row = chunk * ROWS + g // UO
            h = hkv * G + row // NQ
            i = row % NQ
            prow = partial_row(b, hkv, heads_kv, R_TOTAL, row)
            col = prow * D + uint64((g % UO) * EPU)
            m = NEG_INF                     # running max of the splits' lse (base 2)
            l_sum = float32(0.0)            # sum of exp2(lse_s - m)
            nan = False                     # a NaN logsumexp seen
            for c in range(EPU):
                acc[c] = float32(0.0)
            for sp in range(0, splits, LOADS):
                # -- load LOADS splits' logsumexps and partial outputs at once --
                for s in range(LOADS):
                    s_at = uint64(min(sp + s, splits - 1))
                    x = lse_part[s_at, prow] * float32(LOG2E)
                    for c in range(EPU):
                        x_out[s, c] = o_part[s_at, col + uint64(c)]
                    bad = x != x
                    nan = nan or bad
                    x_lse[s] = NEG_INF if bad or sp + s >= splits else x
                # -- fold them in: the new max, the old sums rescaled, the new terms added --
                m_new = m
                for s in range(LOADS):
                    m_new = max(m_new, x_lse[s])
                if m_new != NEG_INF:
                    f = exp2(m - m_new)
                    l_sum *= f
                    for c in range(EPU):
                        acc[c] *= f
                    for s in range(LOADS):
                        w = exp2(x_lse[s] - m_new)      # 0 for a -inf logsumexp
                        l_sum += w
                        for c in range(EPU):
                            acc[c] += w * x_out[s, c]
                    m = m_new

            # -- the output, cast and stored, and the logsumexp --
            inv = float32(0.0)
            if l_sum > float32(0.0):
                inv = float32(1.0) / l_sum
            if WORDS:
                o0 = NAN if nan else acc[0] * inv
                o1 = NAN if nan else acc[1] * inv
                out[b, h, i, g % UO] = int32(pack(o0, o1))
            else:
                out[b, h, i, g % UO] = NAN if nan else acc[0] * inv
            if g % UO == 0:
                x0 = m
                if nan:
                    x0 = NAN
                elif m != NEG_INF:
                    x0 = (m + math.log2(l_sum)) * float32(LN2)
                lse[b, h, i] = x0

    return merge_rows


# -- host side -----------------------------------------------------------------------------------

def _warps() -> int:
    """Warps per program: `sim.decode.WARPS` on a GPU, 2 under the simulator (shorter tests)."""
    return 2 if host.simulator() else WARPS


def plan(problem, config=None) -> SplitKVPlan:
    """The `sim.decode.SplitKVPlan` this forward launches for ``problem`` (``config.num_splits``
    overrides the split count, ``config.decode_unit`` the kernel, ``config.decode_warps`` the
    tensor-core kernel's warps): the tensor-core kernel where
    `sim.decode.uses_tensor_cores` and the GPU has tensor-core ``mma`` (compute capability 8.0
    on; never under the CUDA simulator), else the CUDA-core one."""
    pb = problem
    splits = getattr(config, "num_splits", None) if config is not None else None
    unit = getattr(config, "decode_unit", None) if config is not None else None
    element = 4 if pb.dtype_name == "float32" else 2
    tensor_cores = uses_tensor_cores(pb.head_dim, element) and mma_available()
    if unit == "mma" and not tensor_cores:
        raise ValueError(f"KernelConfig(decode_unit='mma') takes float16/bfloat16 at head_dim in "
                         f"{MMA_HEAD_DIMS} on a GPU of compute capability 8.0 or later; this call "
                         f"is {pb.dtype_name} at head_dim={pb.head_dim}"
                         + ("" if mma_available() else " on a device without tensor-core mma"))
    if unit == "ffma":
        tensor_cores = False
    mma_warps = getattr(config, "decode_warps", None) if config is not None else None
    if mma_warps is not None and not tensor_cores:
        raise ValueError(f"KernelConfig(decode_warps={mma_warps}) sets the tensor-core kernel's "
                         f"warps; this call runs the CUDA-core kernel ({pb.dtype_name}, "
                         f"head_dim={pb.head_dim}"
                         + (", decode_unit='ffma')" if unit == "ffma" else ")"))
    return _plan(pb.batch, pb.heads_q, pb.heads_kv, pb.seqlen_q, pb.seqlen_k, pb.head_dim,
                 element, host.sm_count(), splits, _warps(), tensor_cores, _smem_per_sm(), mma_warps,
                 _profile_name())


_plan = functools.lru_cache(maxsize=1024)(split_kv_plan)    # a pure function of its sizes


def mma_available() -> bool:
    """Whether the current device runs the tensor-core kernel (a real GPU of compute
    capability 8.0 or later)."""
    return host.real_gpu() and host.compute_capability(host.current_device_id()) >= (8, 0)


def _smem_per_sm() -> int:
    """Shared memory per SM of the current device (`sim.decode.SMEM_BYTES_PER_SM` under the
    simulator)."""
    if not host.real_gpu():
        return SMEM_BYTES_PER_SM
    per_sm = host.smem_per_sm(host.current_device_id())
    return SMEM_BYTES_PER_SM if per_sm is None else per_sm


def _profile_name() -> str | None:
    """The shipped `sim.profiles` profile of the current device (by its name: the one whose
    measured decode figures price the split count, `sim.decode.split_kv_plan`), or None (the
    simulator, a GPU no profile matches)."""
    if not host.real_gpu():
        return None
    return _profile_of(host.current_device_id())


@functools.lru_cache(maxsize=None)
def _profile_of(device_id: int) -> str | None:
    from sim.profiles import profile_for_gpu_name
    name = cuda.gpus[device_id].name
    found = profile_for_gpu_name(name.decode() if isinstance(name, bytes) else str(name))
    return None if found is None else found.name


def supports(problem, config=None):
    """Why this forward cannot run ``problem`` (None if it can)."""
    pb = problem
    if pb.dtype_name not in ("float16", "bfloat16", "float32"):
        return f"dtype {pb.dtype_name} (float16, bfloat16, float32 only)"
    if pb.seqlen_q > MAX_SEQLEN_Q:
        return f"seqlen_q={pb.seqlen_q} > {MAX_SEQLEN_Q} (a decoding step's few queries only)"
    if pb.head_dim > MAX_HEAD_DIM or (pb.dtype_name != "float32" and pb.head_dim % 2):
        return f"head_dim={pb.head_dim} (even and at most {MAX_HEAD_DIM})"
    for name, what in (("mask", "a mask"), ("bias", "a bias"), ("block_mask", "a block mask")):
        if getattr(pb, name, None) is not None:
            return f"{what} (the decoding kernel takes causal, window and cache lengths only)"
    if pb.dropout_p > 0:
        return "dropout (the decoding kernel is for inference)"
    if config is None or getattr(config, "family", None) != "split_kv":
        if pb.seqlen_k < MIN_SEQLEN_K and getattr(pb, "cache_seqlens", None) is None:
            return f"seqlen_k={pb.seqlen_k} < {MIN_SEQLEN_K} (the tiled forwards take short caches)"
    return None


def _band(pb):
    """``(banded, lo, hi, shift_to_len)``: the band of `ioaware.block_info.band_offsets` for the
    full ``seqlen_k``, shifted per sequence to its cache length when bottom-right aligned."""
    lo, hi = band_offsets(pb.seqlen_q, pb.seqlen_k, pb.causal, pb.causal_alignment,
                          pb.window_size)
    banded = lo is not None or hi is not None
    bottom_right = pb.window_size is not None or (pb.causal and pb.causal_alignment == "bottom_right")
    return (banded, -UNBOUNDED if lo is None else lo, UNBOUNDED if hi is None else hi,
            1 if bottom_right else 0)


def forward(problem, config=None):
    """``(out, lse)`` of a decoding problem (see `kernels.forward`), in the problem's kind."""
    return prepare(problem, config)(problem.q, problem.k, problem.v)


def prepare(problem, config=None):
    """The decoding forward of ``problem`` with its plan, kernels and constants chosen once:
    ``run(q, k, v, layout_known=False, cache_seqlens=None) -> (out, lse)`` for operands of its
    shapes, dtype and device. ``cache_seqlens``: this call's cache lengths, a contiguous int32
    torch tensor ``[B]`` on q's device (its values not read by the host: the kernel checks each
    length; its dtype, shape and device checked here unless ``layout_known``), in place of the
    problem's (kept where a call gives none). ``run`` keeps none of the problem's operands: a
    prepared call outlives them (`ioaware` keeps one per shape)."""
    pb = problem
    p = plan(pb, config)
    group, dtype_name = pb.group, pb.dtype_name
    template = host._without_operands(pb)
    words = dtype_name != "float32"
    B, Hq, Nq, D = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim
    banded, lo, hi, shift = _band(pb)
    use_shfl = host.real_gpu()
    own_lengths = getattr(pb, "cache_seqlens", None) is not None

    def build(lengths: bool):
        # -- the kernel, its launch cache and its fast path, for calls with or without lengths --
        if p.unit == "mma":
            kern = compile_cache.built(make_decode_mma_kernel, D, Nq, group, dtype_name,
                                       banded, p.warps, p.keys_per_step, p.stages,
                                       p.resident_per_sm, lengths)
            host.check_launch("decode_split_kv_mma", (p.threads, p.dynamic_shared_bytes),
                              (kern.threads, kern.smem_bytes))
        else:
            kern = compile_cache.built(make_decode_kernel, D, p.rows_per_program, Nq, group,
                                       dtype_name, banded, p.warps, p.keys_per_step,
                                       p.lanes_per_key, use_shfl, lengths)
        # own: the lengths array this kind of call passes where it gives none (the problem's
        # own on the device, or the constant the kernel without lengths never reads), as
        # (address, array) for the fast path: set by a full call
        return SimpleNamespace(kern=kern, plans={}, own=[],
                               repeat=host.Repeat(template, config, lengths_per_call=True))

    modes = {}
    smem = p.dynamic_shared_bytes
    fast = getattr(config, "fast_launch", True)
    consts = (np.float32(pb.scale * LOG2E), np.int64(lo), np.int64(hi), np.int64(shift),
              np.int64(pb.seqlen_k), np.int64(pb.heads_kv), np.int64(p.row_chunks))

    def run(q, k, v, layout_known=False, cache_seqlens=None):
        given = None
        if cache_seqlens is not None:       # checked here unless the caller has (layout_known)
            given = (cache_seqlens.data_ptr() if layout_known
                     else _lengths_ptr(cache_seqlens, q, B))
        lengths = given is not None or own_lengths
        mode = modes.get(lengths)
        if mode is None:
            mode = modes[lengths] = build(lengths)
        repeat, own = mode.repeat, mode.own
        ptrs = repeat.pointers((q, k, v), layout_known)
        if ptrs is not None and (given is not None or own):
            # -- the operands' layout of the recorded call: repeat it --
            # the logsumexp and the splits' partial (o, lse) in one float32 allocation
            rows = B * Hq * Nq
            work, (p_lse_out, p_o, p_lse) = repeat.scratch(q, rows, p.splits * rows * D,
                                                           p.splits * rows)
            out = repeat.like(q)                    # [B, Hq, Nq, D], as q
            stream = host.stream_handle(q)
            counters = _torch_counters(q, stream, p.programs).data_ptr()
            repeat.launches[0](stream, *ptrs, p_o, p_lse, out.data_ptr(), p_lse_out, counters,
                               own[0] if given is None else given)
            return out, work[:rows].view(B, Hq, Nq)
        call = host.Call(template, q=q)
        qi, ki, vi = (call.input(x, words=words, aligned=True, word_bytes=4) for x in (q, k, v))
        o_part = call.output((p.splits, B * Hq * Nq * D), float32=True)   # rows [B, Hq, Nq]
        lse_part = call.output((p.splits, B * Hq * Nq), float32=True)
        out = call.output((B, Hq, Nq, D), words=words)     # the kernel writes the dtype
        out_arg = out.arg
        if words:       # two elements per int32 word
            out_arg = out_arg.view(call._torch.int32 if call.torch else np.int32)
        lse = call.output((B, Hq, Nq), float32=True)
        seqlens = cache_seqlens
        if seqlens is None:
            seqlens = _seqlens(call, template)
            if call.torch and host.real_gpu() and not own:
                own.extend([_device_address(seqlens), seqlens])
        if call.torch and host.real_gpu():
            counters = _torch_counters(call.q, host.stream_handle(call.q), p.programs)
        else:
            counters = _array_counters(p.programs)
        args = (qi, ki, vi, o_part.arg, lse_part.arg, out_arg, lse.arg, counters, seqlens, *consts)
        host.relaunch(mode.plans, (qi, ki, vi, seqlens), mode.kern, p.grid, p.threads,
                      call.stream, args, sharedmem=smem, fast=fast)
        repeat.record((q, k, v), (qi, ki, vi), lambda: [
            host.pointer_launch(mode.kern, p.grid, p.threads, smem, args, range(9))])
        return out.value(), lse.value()
    return run


def _lengths_ptr(lengths, q, batch: int) -> int:
    """The device address of a call's cache lengths: an int32 torch tensor ``[batch]``,
    contiguous, on q's device (`ioaware` passes them so), else ValueError naming them."""
    import torch
    if not (torch.is_tensor(lengths) and lengths.dtype == torch.int32 and lengths.device == q.device
            and tuple(lengths.shape) == (batch,) and lengths.is_contiguous()):
        raise ValueError(f"cache_seqlens must be a contiguous int32 tensor of shape ({batch},) on "
                         f"{q.device}, got {type(lengths).__name__} "
                         f"{getattr(lengths, 'dtype', '')} {tuple(getattr(lengths, 'shape', ()))}")
    return lengths.data_ptr()


def _device_address(array) -> int:
    """The device address of a torch CUDA tensor or a Numba device array."""
    if hasattr(array, "data_ptr"):
        return array.data_ptr()
    return array.__cuda_array_interface__["data"][0]


#: The split-KV programs' arrival counters (int32, one per program group) by (device, stream):
#: zero between calls, since the last program of each group sets its counter back to zero, so
#: no call zeroes them; a call that needs more gets a new zeroed buffer (stream-ordered, as
#: torch's allocator reuses memory).
_COUNTERS: dict = {}
#: Counters of the calls captured in CUDA graphs: each capture takes its own, kept for the life
#: of the process, as the graph may replay it. They are cut from a per-device arena of
#: `CAPTURE_ARENA_COUNTERS` int32 zeroed by a call outside capture (a capture's warm-up), so a
#: captured step holds one kernel and nothing that zeroes; a capture with no arena left (or none
#: yet) zeroes its own counters in the graph.
_CAPTURED_COUNTERS: list = []
_CAPTURE_ARENAS: dict = {}
CAPTURE_ARENA_COUNTERS = 1 << 16


def _torch_counters(q, stream: int, n: int):
    """Zeroed int32 counters for ``n`` program groups on ``stream`` (q's device), as a torch
    tensor."""
    import torch
    dev = q.get_device()
    if torch.cuda.is_current_stream_capturing():
        arena = _CAPTURE_ARENAS.get(dev)
        if arena is not None and arena[1] + n <= arena[0].numel():
            buf = arena[0][arena[1]:arena[1] + n]
            arena[1] += n
        else:
            buf = torch.zeros(n, dtype=torch.int32, device=q.device)
        _CAPTURED_COUNTERS.append(buf)
        return buf
    if dev not in _CAPTURE_ARENAS:
        _CAPTURE_ARENAS[dev] = [torch.zeros(CAPTURE_ARENA_COUNTERS, dtype=torch.int32,
                                            device=q.device), 0]
    key = (dev, stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=q.device)
    return buf


def _array_counters(n: int):
    """Zeroed int32 counters for ``n`` program groups for a call on NumPy or Numba arrays (the
    default stream); under the simulator a new array each call (a kernel that raised there may
    have left its counters set)."""
    if not host.real_gpu():
        return cuda.to_device(np.zeros(n, np.int32))
    key = (host.current_device_id(), "arrays")
    buf = _COUNTERS.get(key)
    if buf is None or buf.size < n:
        buf = _COUNTERS[key] = cuda.to_device(np.zeros(max(n, 1024), np.int32))
    return buf


def _seqlens(call, pb):
    """The cache lengths as int32 ``[B]`` on the device (every length ``seqlen_k`` without)."""
    lengths = getattr(pb, "cache_seqlens", None)
    if lengths is None:                  # every sequence full: a constant kept on the device
        return host.device_const(("decode-seqlens", pb.batch, pb.seqlen_k),
                                 lambda: np.full(pb.batch, pb.seqlen_k, dtype=np.int32))
    if call.torch:
        return call._torch.as_tensor(lengths).to(device=call.q.device, dtype=call._torch.int32)
    return cuda.to_device(np.ascontiguousarray(lengths, dtype=np.int32))
