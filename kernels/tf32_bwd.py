"""Tensor-core FlashAttention-2 backward for float32 CUDA inputs with 3xTF32 (Numba + inline PTX).

This is the ``tf32`` family's backward, in the two structures of `kernels.mma_bwd`
(``KernelConfig.backward_dq``, default `dq_mode`: "atomic" on sm_90 at d 64 and 128, "kernel"
elsewhere and under deterministic algorithms); the arithmetic is that of `kernels.tf32_fwd`: every float32 operand x is
split (`kernels.ptx.split_tf32`) into ``big`` (x truncated to TF32) and ``small`` (x - big, read
by the tensor core rounded to TF32) and every product is
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
  (`operands_in_registers`). It loops over the query heads of the GQA group and, for each,
  over the Q tiles of `BlockInfo.q_schedule()`; Q and dO tiles (double-buffered, ``cp.async``) give S^T = K Q^T,
  dP^T = V dO^T, P^T (lse and delta per query column, staged in shared memory),
  dV += (P^T Z) dO, dS^T = P^T * (dP^T Z - delta), dK += dS^T Q; dK = scale * dK at the end.

**"kernel"** (two kernels, operands in registers or L1, no shared-memory round trip of P or dS,
no atomics) launches the two kernels above. **"atomic"** (FlashAttention-2's structure, five
products per tile) launches the float32 pre-pass of `kernels.mma_bwd` (delta, the zeroed float32
dQ accumulator), the dK/dV kernel built with ``dq_atomic`` -- its K tile also in shared memory
(``cp.async``, once), each stage's dS written to shared memory (queries x keys), and after one
barrier dQ += dS K of the stage's queries (`sim.plans.tensor_core_bwd.tf32_dq_atomic_layout`,
`_shared_a_times_shared_b`) added to the accumulator with ``red.global.add.v2.f32`` -- and the
conversion dQ = scale * accumulator.

Both grids are (tiles, batch*heads); which block works on which (tile, head) is the launch order
of `kernels.tile_scheduler`: tiles first, or, under a causal mask, heads first within groups of
four heads (`tile_scheduler.DEFAULT_HEAD_GROUP`, measured with ``python -m benchmarks tune``).

Fragment maps (`kernels.fragments_tf32`): in S = Q K^T and dP = dO V^T (and their transposes)
the k index is a head dim and is *not* permuted (``dim_a_elem`` / ``dim_b_elem``): a thread's B
elements are K[key g][dims t, t + 4], two 32-bit loads, conflict-free with rows padded by 4
floats. In dQ += dS K, dV += (P^T Z) dO and dK += dS^T Q the A operand is a C fragment of the
score tile, used in place under `k_perm` (``p_a_from_c``: a0, a1, a2, a3 = c0, c2, c1, c3), and
the B operand is loaded in the same permuted order, B[k][n] = X[row k_perm(k)][dim n]
(``v_b_elem``: rows 2t and 2t + 1 of column g, conflict-free with the same padding). The
operands that live in registers stay float32 and are split at each use (Q, dO, K and V
fragments split once would need twice their registers, which the dQ / dK / dV accumulators and
the score tiles leave no room for: see docs/kernels.md).

Configurations (`default_config`): four warps of 16 rows, 32-row stages. At d=64 the stages
live in static shared memory (34816 / 35328 bytes). At d=128 they take dynamic shared memory
(67584 / 68096 bytes, opt-in above 48 KiB through `kernels.host.launch`; on an H100 three dQ
blocks per SM at 165 registers, two dK/dV blocks at 241-243, by `ptxas -v` for sm_90)
and the S / dP k-loops are written two k-steps per iteration (``unroll``), which NVVM keeps
as such (240 / 432 HMMA in the SASS instead of the 108 / 204 of the 16-row, not unrolled
kernels). With dropout at d=128 the dK/dV kernel keeps 16-query stages
(`dkdv_dropout_config`: the 32-query kernel spilled when it was measured). A variant that split
each stage's B operands once into big/small TF32 planes was exact but slower (docs/kernels.md).
The dK/dV kernel that adds dQ by atomics runs the same tiles with 111,104 bytes of dynamic
shared memory at d = 128 (61,952 at d = 64: the K tile and dS added; lse / delta stay static)
and, by `ptxas -v` for sm_90, 252 / 254 registers at d = 128 and 214 / 219 at d = 64 without
spills; with dropout (16-query stages) or a boolean mask 248-255 and no spills, except the
d = 128 causal kernel with both, which spills 8 bytes (`python -m benchmarks check --families
tf32 --kernels dkdv_atomic` lists them; that case is not timed).

Here Z = keep / (1 - p) is the dropout factor regenerated from the `ioaware.dropout` hash
(Z = 1 without dropout) and delta = rowsum(dO * O), with O the dropped-out output. Supported:
head_dim 64 and 128, float32 (torch CUDA tensors; NumPy arrays are copied), causal, boolean
masks (a fully masked row gets zero gradients), block-sparse masks whose tiles are multiples of
16, dropout, GQA/MQA (dK/dV summed over the group), Nq != Nk, any lengths, on a real GPU of
compute capability 8.0 or later. `supports` says why it refuses anything else, and the registry
then runs the CUDA-core family.
"""
from __future__ import annotations

import functools

from sim.plans.tensor_core_bwd import STATIC_SMEM_LIMIT_BYTES as SMEM_LIMIT_BYTES
from sim.plans.tensor_core_bwd import TF32_HEAD_DIMS as SUPPORTED_HEAD_DIMS
from sim.plans.tensor_core_bwd import TF32_PAD_FLOATS as PAD_FLOATS
from sim.plans.tensor_core_bwd import TF32_DS_PAD_FLOATS as DS_PAD_FLOATS
from sim.plans.tensor_core_bwd import TF32_K_TILE_PAD_FLOATS as K_TILE_PAD_FLOATS
from sim.plans.tensor_core_bwd import launch_of
from sim.plans.tensor_core_bwd import tf32_dkdv_atomic_dynamic_smem_bytes as dkdv_atomic_smem_bytes
from sim.plans.tensor_core_bwd import tf32_dq_atomic_layout as dq_atomic_layout
from sim.plans.tensor_core_bwd import tf32_default_config as default_config
from sim.plans.tensor_core_bwd import tf32_default_tiles as default_tiles
from sim.plans.tensor_core_bwd import tf32_dkdv_dropout_config as dkdv_dropout_config
from sim.plans.tensor_core_bwd import tf32_dkdv_smem_bytes as dkdv_smem_bytes
from sim.plans.tensor_core_bwd import tf32_dq_smem_bytes as dq_smem_bytes
from sim.plans.tensor_core_bwd import tf32_default_dq_mode as default_dq_mode
from sim.plans.tensor_core_bwd import tf32_operands_in_registers as operands_in_registers

from . import compile_cache, host, softmax, tile_scheduler
from .config import backward_tiles
from .copy import tile_loader
from .dropout import dropout_constants, fmix_device
from .mask import band_arguments, score_mask, tile_needs_mask, transposed_score_mask
from .mma_bwd import (_red_width, backward_plan, dq_mode_by, dq_red_adder, dq_warp_tiles,
                      get_convert_kernel, get_prepass_kernel)

__all__ = ["backward", "prepare", "plan", "supports", "tiles", "dq_mode", "default_config",
           "default_tiles",
           "dq_smem_bytes", "dkdv_smem_bytes", "operands_in_registers", "dkdv_dropout_config",
           "get_dq_kernel", "get_dkdv_kernel", "SUPPORTED_HEAD_DIMS", "SMEM_LIMIT_BYTES",
           "PAD_FLOATS"]

#: The layout facts imported above (default configuration, shared memory, which operands stay
#: in registers, the dropout override) are the plan's (`sim.plans.tensor_core_bwd`): the
#: launcher and the cost model read the same ones. ``SMEM_LIMIT_BYTES`` is the static shared
#: memory a block declares without the opt-in; above it the K/V (Q/dO) buffers are dynamic.
DTYPES = ("float32",)
LOG2E = softmax.LOG2E

#: These kernels take a sliding window (the band in `kernels.mask`).
TAKES_WINDOW = True


def get_dq_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, head_group,
                  window=False, unroll=None):
    """The compiled-on-first-launch dQ kernel for one configuration (cached); ``unroll``
    defaults to `default_config`'s, ``head_group`` is the launch order
    (`kernels.tile_scheduler`). ``kernel.smem_bytes`` is its dynamic shared memory (0 when its
    shared memory is static)."""
    unroll = default_config(head_dim)["unroll"] if unroll is None else int(unroll)
    key = ("dq", head_dim, block_q, block_k, bool(causal), bool(has_mask), bool(has_dropout),
           unroll, int(head_group), bool(window))
    return compile_cache.built(_build_dq_kernel, *key[1:])


def get_dkdv_kernel(head_dim, block_k, block_q, causal, has_mask, has_dropout, head_group,
                    window=False, unroll=None, dq_atomic=False):
    """The compiled-on-first-launch dK/dV kernel (``block_k`` key rows per block, ``block_q``
    queries per stage) for one configuration (cached); as `get_dq_kernel`; ``dq_atomic``: it
    also adds dQ = dS K into a float32 accumulator, "v2" two floats per ``red`` (sm_90 on),
    "scalar" one."""
    unroll = default_config(head_dim)["unroll"] if unroll is None else int(unroll)
    if dq_atomic not in (False, "v2", "scalar"):
        raise ValueError(f"dq_atomic must be False, 'v2' or 'scalar', got {dq_atomic!r}")
    key = ("dkdv", head_dim, block_k, block_q, bool(causal), bool(has_mask), bool(has_dropout),
           unroll, int(head_group), bool(window), dq_atomic)
    return compile_cache.built(_build_dkdv_kernel, *key[1:])


def _tf32_helpers(threads, chunks, rows, stride):
    """Device helpers shared by both kernels: the 3xTF32 product and the cp.async tile copy
    (`kernels.copy.tile_loader`) of ``rows`` float32 rows of ``chunks`` 16-byte chunks by
    ``threads`` threads into shared rows of ``stride`` floats."""
    from numba import cuda

    from . import ptx

    assert rows * chunks % threads == 0 and threads % chunks == 0

    @cuda.jit(device=True, inline=True)
    def mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, bb0, bb1, bs0, bs1, c0, c1, c2, c3):
        # 3xTF32: small * big, big * small, then big * big, all accumulated in float32
        d = ptx.mma_tf32(as0, as1, as2, as3, bb0, bb1, c0, c1, c2, c3)
        d = ptx.mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, d[0], d[1], d[2], d[3])
        return ptx.mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, d[0], d[1], d[2], d[3])

    return mma3, tile_loader(rows, chunks, threads, 4 * stride)


def _rows_times_shared_rows(nt_n, kc_steps, unroll, stride, a_in_registers, mma3):
    """``product(acc, a_reg, x, b, h, r0, r1, tig, b_addr)``: acc (``nt_n`` 16x8 float32 C
    fragments) += A B^T over ``kc_steps`` k-steps of 8 dims, written as ``kc_steps / unroll``
    iterations of ``unroll`` steps: the S = Q K^T / dP = dO V^T products of the dQ kernel and
    S^T = K Q^T / dP^T = V dO^T of the dK/dV kernel. A is the warp's 16 rows
    (rows r0 and r1 = r0 + 8 of this lane), dims not permuted: from the float32 fragments
    ``a_reg`` when ``a_in_registers``, else re-read from global ``x[b, h, r, :]``; split into
    big/small here. B^T is ``nt_n`` groups of 8 shared float32 rows at ``b_addr`` (``stride``
    floats apart), split here."""
    from numba import cuda

    from . import ptx
    NT_N, STRIDE, A_REGS = nt_n, stride, a_in_registers
    KC, SU = kc_steps, unroll

    @cuda.jit(device=True, inline=True)
    def step(acc, kc, a_reg, x, b, h, r0, r1, tig, b_addr):
        a = kc * 4
        if A_REGS:
            a0 = ptx.split_tf32(a_reg[a])
            a1 = ptx.split_tf32(a_reg[a + 1])
            a2 = ptx.split_tf32(a_reg[a + 2])
            a3 = ptx.split_tf32(a_reg[a + 3])
        else:
            a0 = ptx.split_tf32(x[b, h, r0, kc * 8 + tig])
            a1 = ptx.split_tf32(x[b, h, r1, kc * 8 + tig])
            a2 = ptx.split_tf32(x[b, h, r0, kc * 8 + tig + 4])
            a3 = ptx.split_tf32(x[b, h, r1, kc * 8 + tig + 4])
        for nt in range(NT_N):
            off = 4 * (nt * 8 * STRIDE + kc * 8)
            b0 = ptx.split_tf32(ptx.ld_shared_f32(b_addr + off))
            b1 = ptx.split_tf32(ptx.ld_shared_f32(b_addr + off + 16))
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


def _chained(make_step, n_steps):
    """One inlined device function ``steps(x, y, z)`` that calls ``make_step(0)(x, y, z)``, then
    ``make_step(1)(x, y, z)``, ... up to ``make_step(n_steps - 1)``: k-steps unrolled in the
    source, in order (a loop over them, left to the compiler, stayed a loop at d = 128 and put
    the operand array it indexes in local memory)."""
    from numba import cuda

    def steps_from(i):
        step = make_step(i)
        if i == n_steps - 1:
            return step
        rest = steps_from(i + 1)

        @cuda.jit(device=True, inline=True)
        def steps(x, y, z):
            step(x, y, z)
            rest(x, y, z)

        return steps

    return steps_from(0)


def _c_times_shared_b(nt_k, nt_o, stride, mma3):
    """``acc_c_times_b(c_reg, acc, t_addr)``: acc (``nt_o`` 16x8 float32 C fragments) += C x B,
    where C is a warp's ``nt_k`` 16x8 score tiles ``c_reg`` used as A fragments (the C layout is
    the A layout under the k permutation: a0..a3 = c0, c2, c1, c3) and B is read from shared
    memory at ``t_addr`` (float32 rows ``stride`` floats apart, split here). The dQ += dS K,
    dV += (P^T Z) dO and dK += dS^T Q products of the 3xTF32 backward.

    The k-steps are unrolled here, one inlined device function per k-step chained in order
    (`_chained`; the same products in the same order as a loop over them): left to the compiler, the loop
    over the k-steps at d = 128 stayed a loop, and ``c_reg``, indexed by its counter, went to
    local memory (``python -m benchmarks check``: a 64-byte stack frame in the dQ kernel, 128
    in the dK/dV kernel)."""
    from numba import cuda

    from . import ptx
    NT_O, STRIDE = nt_o, stride

    def k_step(kp):
        J = kp * 4
        ROW = kp * 8 * STRIDE

        @cuda.jit(device=True, inline=True)
        def step(c_reg, acc, t_addr):
            p0 = ptx.split_tf32(c_reg[J])
            p1 = ptx.split_tf32(c_reg[J + 2])
            p2 = ptx.split_tf32(c_reg[J + 1])
            p3 = ptx.split_tf32(c_reg[J + 3])
            for nt in range(NT_O):
                xa = t_addr + 4 * (ROW + nt * 8)
                b0 = ptx.split_tf32(ptx.ld_shared_f32(xa))
                b1 = ptx.split_tf32(ptx.ld_shared_f32(xa + 4 * STRIDE))
                bb0, bb1, bs0, bs1 = b0[0], b1[0], b0[1], b1[1]
                o = nt * 4
                d = mma3(p0[0], p1[0], p2[0], p3[0], p0[1], p1[1], p2[1], p3[1],
                         bb0, bb1, bs0, bs1,
                         acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                for i in range(4):
                    acc[o + i] = d[i]

        return step

    return _chained(k_step, nt_k)


def _shared_a_times_shared_b(k_steps, m_tiles, n_tiles, a_stride, b_stride, mma3):
    """``product(acc, a_addr, b_addr)``: acc (``m_tiles`` x ``n_tiles`` 16x8 float32 C
    fragments, m-tile major) += A B over ``k_steps`` k-steps of 8, both operands float32 in
    shared memory and split here, dims not permuted: A (rows ``a_stride`` floats apart) at
    ``a_addr`` = this lane's A[row gid][k tig] of the warp's first row, B (rows ``b_stride``
    floats apart) at ``b_addr`` = this lane's B[k tig][column gid] of the warp's first column.
    The atomic dK/dV kernel's dQ += dS K. Each k-step loads and splits its A fragments once for
    all n-tiles and each B fragment once for all m-tiles; the k-steps are unrolled by
    `_chained`."""
    from numba import cuda, uint32

    from . import ptx
    MT, NT, AS, BS = m_tiles, n_tiles, a_stride, b_stride
    A_FRAGS = 4 * MT

    def k_step(kc):
        A0 = 4 * kc * 8                 # bytes: this k-step's first column of A
        B0 = 4 * kc * 8 * BS            # ... and first row of B

        @cuda.jit(device=True, inline=True)
        def step(acc, a_addr, b_addr):
            ab = cuda.local.array(A_FRAGS, dtype=uint32)
            asm = cuda.local.array(A_FRAGS, dtype=uint32)
            for mt in range(MT):
                ao = a_addr + uint32(A0 + 4 * 16 * AS * mt)
                for r in range(4):       # a0..a3 = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]
                    x = ptx.split_tf32(ptx.ld_shared_f32(
                        ao + uint32(4 * (8 * AS * (r & 1) + 4 * (r >> 1)))))
                    ab[4 * mt + r] = x[0]
                    asm[4 * mt + r] = x[1]
            for nt in range(NT):
                bo = b_addr + uint32(B0 + 4 * 8 * nt)
                b0 = ptx.split_tf32(ptx.ld_shared_f32(bo))
                b1 = ptx.split_tf32(ptx.ld_shared_f32(bo + uint32(4 * 4 * BS)))
                for mt in range(MT):
                    j = 4 * (mt * NT + nt)
                    a = 4 * mt
                    d = mma3(ab[a], ab[a + 1], ab[a + 2], ab[a + 3],
                             asm[a], asm[a + 1], asm[a + 2], asm[a + 3],
                             b0[0], b1[0], b0[1], b1[1],
                             acc[j], acc[j + 1], acc[j + 2], acc[j + 3])
                    for i in range(4):
                        acc[j + i] = d[i]

        return step

    return _chained(k_step, k_steps)


def _build_dq_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, unroll,
                     head_group, window=False):
    from numba import cuda, float32, uint32, uint64

    from . import ptx

    D = head_dim
    BQ = block_q
    BK = block_k
    NUM_WARPS = BQ // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + PAD_FLOATS             # floats per shared K or V row (split planes too)
    TILE = BK * STRIDE                  # floats per K or V buffer
    STAGE = 2 * TILE                    # K | V, two buffers
    K_OFF = 0
    V_OFF = TILE
    SMEM_FLOATS = 2 * STAGE
    assert 4 * SMEM_FLOATS == dq_smem_bytes(D, BK)
    DYNAMIC = 4 * SMEM_FLOATS > SMEM_LIMIT_BYTES
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
    fmix = fmix_device()
    mask_scores = score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK, window)
    dq_row_stats = softmax.dq_row_stats(HAS_DROPOUT)
    mma3, load_tile = _tf32_helpers(THREADS, CHUNKS, BK, STRIDE)
    acc_c_times_b = _c_times_shared_b(NT_S, NT_O, STRIDE, mma3)
    rows_x_rows = functools.partial(_rows_times_shared_rows, NT_S, KC, SU, STRIDE)
    qk_product = rows_x_rows(Q_REGS, mma3)                # S = Q K^T
    dov_product = rows_x_rows(DO_REGS, mma3)              # dP = dO V^T

    tile_and_head = tile_scheduler.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, dout, lse, delta, dq, offsets, kv_index, sched_b, sched_h, group,
               n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash, threshold,
               inv_keep, band_lo, band_hi):
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
        k_head = ptx.global_addr(k, b, hk, 0, ch * 4)
        v_head = ptx.global_addr(v, b, hk, 0, ch * 4)
        k_row_bytes = uint64(k.strides[2])
        v_row_bytes = uint64(v.strides[2])
        smem0 = ptx.shared_addr(smem, 0)
        k_copy = smem0 + uint32(4 * (r0 * STRIDE + ch * 4))
        v_copy = smem0 + uint32(4 * (BK * STRIDE + r0 * STRIDE + ch * 4))

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if start < stop:
            n0 = kv_index[start]
            load_tile(k_head, k_row_bytes, n0 * BK + r0, n_k, k_copy, r0)
            load_tile(v_head, v_row_bytes, n0 * BK + r0, n_k, v_copy, r0)
            ptx.cp_async_commit()

        for it in range(start, stop):
            n_blk = kv_index[it]
            buf = ((it - start) & 1) * STAGE
            if it + 1 < stop:
                nxt = kv_index[it + 1]
                nbuf = uint32(4 * (STAGE - buf))
                load_tile(k_head, k_row_bytes, nxt * BK + r0, n_k, k_copy + nbuf, r0)
                load_tile(v_head, v_row_bytes, nxt * BK + r0, n_k, v_copy + nbuf, r0)
                ptx.cp_async_commit()
                ptx.cp_async_wait_1()
            else:
                ptx.cp_async_wait_all()
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
                        mask_h, mask_q, band_lo, band_hi)

            # -- P = exp2(S * scale * log2e - lse2), dS = P * (dP * Z - delta) --
            for nt in range(NT_S):
                for i in range(4):
                    e = nt * 4 + i
                    r = i >> 1
                    p = ptx.ex2(s_reg[e] * scale_log2 - lse2_r[r])
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
    kernel.config = {"block_q": BQ, "block_k": BK, "unroll": SU}
    return kernel


def _build_dkdv_kernel(head_dim, block_k, block_q, causal, has_mask, has_dropout, unroll,
                       head_group, window=False, dq_atomic=False):
    from numba import cuda, float32, uint32, uint64

    from . import ptx

    D = head_dim
    BK = block_k                        # key rows per block (16 per warp)
    BQ = block_q                        # queries per shared stage
    NUM_WARPS = BK // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + PAD_FLOATS             # floats per shared Q or dO row (split planes too)
    TILE = BQ * STRIDE                  # floats per Q or dO buffer
    STAGE = 2 * TILE                    # Q | dO, two buffers
    Q_OFF = 0
    DO_OFF = TILE
    ATOMIC = bool(dq_atomic)            # dQ += dS K here, by float32 atomics
    RED_V2 = dq_atomic == "v2"          # ... two floats per red instruction (sm_90)
    K_STRIDE = D + K_TILE_PAD_FLOATS    # atomic: floats per row of the block's K tile
    DS_STRIDE = BK + DS_PAD_FLOATS      # atomic: floats per row of dS (queries x keys)
    K_BASE = 2 * STAGE                  # Q0|dO0|Q1|dO1 (|K tile|dS)
    DS_BASE = K_BASE + BK * K_STRIDE
    SMEM_FLOATS = 2 * STAGE + ((BK * K_STRIDE + BQ * DS_STRIDE) if ATOMIC else 0)
    ROWV = 4 * BQ                       # floats: lse2 | delta, two buffers (static)
    if ATOMIC:
        assert 4 * SMEM_FLOATS == dkdv_atomic_smem_bytes(D, BQ, BK)
    else:
        assert 4 * (SMEM_FLOATS + ROWV) == dkdv_smem_bytes(D, BQ)
    DYNAMIC = ATOMIC or 4 * (SMEM_FLOATS + ROWV) > SMEM_LIMIT_BYTES
    SMEM_DECL = 0 if DYNAMIC else SMEM_FLOATS
    # atomic: dQ = dS K once per stage, warps in a WQ x WD grid, each QW rows x DW columns in
    # DQ_PASSES passes of DC columns (the plan's layout)
    WQ, WD, DQ_PASSES = dq_atomic_layout(D, BQ, BK) if ATOMIC else (1, 1, 1)
    QW, DW, DC, MT_Q, NT_Q, DQ_REGS = dq_warp_tiles(D, BQ, WQ, WD, DQ_PASSES)
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
    fmix = fmix_device()
    mma3, load_tile = _tf32_helpers(THREADS, CHUNKS, BQ, STRIDE)
    acc_c_times_b = _c_times_shared_b(NT_S, NT_O, STRIDE, mma3)
    rows_x_rows = functools.partial(_rows_times_shared_rows, NT_S, KC, SU, STRIDE)
    kq_product = rows_x_rows(K_REGS, mma3)                # S^T = K Q^T
    vdo_product = rows_x_rows(V_REGS, mma3)               # dP^T = V dO^T
    ds_k_product = _shared_a_times_shared_b(BK // 8, MT_Q, NT_Q, DS_STRIDE, K_STRIDE, mma3)
    add_dq = dq_red_adder(MT_Q, NT_Q, RED_V2)
    load_k_tile = tile_loader(BK, CHUNKS, THREADS, 4 * K_STRIDE)

    stage_rows = softmax.stage_rows(BQ, THREADS)
    cursor_start, cursor_advance = tile_scheduler.gqa_cursor()
    mask_scores_t = transposed_score_mask(NT_S, CAUSAL, HAS_MASK, window)
    needs_mask_at = tile_needs_mask(BQ, BK, CAUSAL, HAS_MASK, window)

    tile_and_head = tile_scheduler.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, dout, lse, delta, dk, dv, dq_acc, offsets, q_index, sched_b, sched_h,
               group, n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash,
               threshold, inv_keep, band_lo, band_hi):
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
        smem0 = ptx.shared_addr(smem, 0)
        q_copy = smem0 + uint32(4 * (r0 * STRIDE + ch * 4))
        do_copy = smem0 + uint32(4 * (BQ * STRIDE + r0 * STRIDE + ch * 4))
        if ATOMIC:
            # -- the block's K tile into shared memory (its own cp.async group, the first) --
            load_k_tile(ptx.global_addr(k, b, hk, 0, ch * 4), uint64(k.strides[2]),
                        n_blk * BK + r0, n_k, smem0 + uint32(4 * (K_BASE + r0 * K_STRIDE + ch * 4)),
                        r0)
            ptx.cp_async_commit()
        # atomic: this lane's A element dS[query gid][key tig] of the warp's rows, its B element
        # K[key tig][dim gid] of the warp's columns, and where its dS^T elements (keys
        # warp*16 + gid (+ 8), queries 2 tig (+ 1) (+ 8 nt)) go in dS
        wq = warp // WD
        wd = warp % WD
        ds_a_addr = smem0 + uint32(4 * (DS_BASE + (wq * QW + gid) * DS_STRIDE + tig))
        k_b_addr = smem0 + uint32(4 * (K_BASE + tig * K_STRIDE + wd * DW + gid))
        ds_st = DS_BASE + 2 * tig * DS_STRIDE + warp * 16 + gid
        dq_part = cuda.local.array(DQ_REGS, dtype=float32)
        dq_row_bytes = uint64(dq_acc.strides[2])

        # the sweep over (query head of the group, Q tile): a cursor (head g_c, its schedule
        # entries lo_c .. lo_c + cnt_c, entry j_c) at the item being prefetched
        n_items, g_c, lo_c, cnt_c = cursor_start(offsets, b, hk, group, sched_b, sched_h, n_blk)
        j_c = 0
        h_n = hk * group + g_c
        m_n = 0
        if n_items > 0:
            m_n = q_index[lo_c]
            load_tile(ptx.global_addr(q, b, h_n, 0, ch * 4), q_row_bytes, m_n * BQ + r0, n_q,
                      q_copy, r0)
            load_tile(ptx.global_addr(dout, b, h_n, 0, ch * 4), do_row_bytes, m_n * BQ + r0, n_q,
                      do_copy, r0)
            ptx.cp_async_commit()
            stage_rows(lse, delta, b, h_n, m_n * BQ, n_q, rowv, 0, tid)

        for t in range(n_items):
            buf = (t & 1) * STAGE
            rbuf = (t & 1) * 2 * BQ
            h = h_n
            m_blk = m_n
            if t + 1 < n_items:
                # -- advance the cursor to item t + 1 and prefetch its Q, dO, lse and delta --
                g_c, lo_c, cnt_c, j_c = cursor_advance(g_c, lo_c, cnt_c, j_c, offsets, b, hk,
                                                       group, sched_b, sched_h, n_blk)
                h_n = hk * group + g_c
                m_n = q_index[lo_c + j_c]
                nbuf = uint32(4 * (STAGE - buf))
                load_tile(ptx.global_addr(q, b, h_n, 0, ch * 4), q_row_bytes, m_n * BQ + r0, n_q,
                          q_copy + nbuf, r0)
                load_tile(ptx.global_addr(dout, b, h_n, 0, ch * 4), do_row_bytes, m_n * BQ + r0,
                          n_q, do_copy + nbuf, r0)
                ptx.cp_async_commit()
                stage_rows(lse, delta, b, h_n, m_n * BQ, n_q, rowv, 2 * BQ - rbuf, tid)
                ptx.cp_async_wait_1()
                cuda.syncthreads()
            else:
                ptx.cp_async_wait_all()
                cuda.syncthreads()

            bh = b * n_heads + h
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            needs_mask = needs_mask_at(m_blk, n_blk, band_lo, band_hi)
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
                mask_scores_t(st, qc0, key0, b, h, n_q, n_k, mask, mask_b, mask_h, mask_q,
                              band_lo, band_hi)

            # -- P^T = exp2(S^T * scale * log2e - lse2), Z from the dropout hash,
            #    dS^T = P^T * (dP^T * Z - delta) --
            for nt in range(NT_S):
                for i in range(4):
                    e = nt * 4 + i
                    col = rbuf + 8 * nt + 2 * tig + (i & 1)
                    p = ptx.ex2(st[e] * scale_log2 - rowv[col])
                    z = float32(1.0)
                    if HAS_DROPOUT:
                        key = key0 + 8 * (i >> 1)
                        keep = fmix(hash_c[2 * nt + (i & 1)] ^ uint64(key)) >= uint64(threshold)
                        z = inv_keep if keep else float32(0.0)
                    st[e] = p * z
                    dpt[e] = p * (dpt[e] * z - rowv[col + BQ])

            if ATOMIC:
                # -- dS (BQ queries x 16 keys of this warp) to shared memory, queries as rows;
                #    keys past n_k add nothing to dQ (their K tile rows are zero-filled too) --
                for nt in range(NT_S):
                    for i in range(4):
                        x = dpt[nt * 4 + i]
                        if key0 + 8 * (i >> 1) >= n_k:
                            x = float32(0.0)
                        smem[ds_st + (8 * nt + (i & 1)) * DS_STRIDE + 8 * (i >> 1)] = x

            # -- dV += (P^T Z) dO: P^T's A fragment is its C fragment (a0, a1, a2, a3 = c0, c2,
            #    c1, c3 under the query permutation); dO's B = dO[query 2t][g], dO[2t+1][g] --
            dot_addr = smem0 + uint32(4 * (buf + DO_OFF + t_lane))
            acc_c_times_b(st, dv_acc, dot_addr)

            # -- dK += dS^T Q: the same with dS^T and Q[query 2t][g], Q[2t+1][g] --
            qt_addr = smem0 + uint32(4 * (buf + Q_OFF + t_lane))
            acc_c_times_b(dpt, dk_acc, qt_addr)

            if ATOMIC:
                # -- dQ of the stage's queries += dS K (dS of every warp, hence the barrier):
                #    this warp's QW rows x DW columns, DC columns a pass, over the BK keys --
                cuda.syncthreads()
                for cp in range(DQ_PASSES):
                    for i in range(DQ_REGS):
                        dq_part[i] = float32(0.0)
                    ds_k_product(dq_part, ds_a_addr, k_b_addr + uint32(4 * cp * DC))
                    # -- red.global.add of the float32 partial dQ (scaled in the conversion) --
                    row_first = m_blk * BQ + wq * QW + gid
                    add_dq(dq_part, ptx.global_addr(dq_acc, b, h, row_first,
                                                    wd * DW + cp * DC + 2 * tig),
                           row_first, n_q, dq_row_bytes)
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

        if ATOMIC:
            ptx.cp_async_wait_all()    # (a block with no Q tile to visit still issued its K copy)

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
    kernel.config = {"block_k": BK, "block_q": BQ, "unroll": SU, "dq_atomic": dq_atomic}
    return kernel


# -- host side -----------------------------------------------------------------------------------
def dq_mode(problem, config, head_dim=None) -> str:
    """How this backward computes dQ for ``problem`` (of which only the head dim is read; or
    None and ``head_dim`` given): ``config.backward_dq``; else "kernel" while torch's
    deterministic algorithms are on; else the plan's rule for this GPU and head dim
    (`sim.plans.tensor_core_bwd.tf32_default_dq_mode`), as `kernels.mma_bwd.dq_mode` does."""
    return dq_mode_by(default_dq_mode, problem, config, head_dim)


def tiles(problem, config=None, mode=None):
    """``(dq, dkdv)`` kernel tiles for a problem (`kernels.config.backward_tiles` of
    `default_tiles`), or None when the block mask's tiles admit none (``config`` and ``mode``
    are taken for the mma family's signature: both dQ modes run the same tiles)."""
    return backward_tiles(default_tiles(problem.head_dim), problem)


def supports(problem, config):
    """Why this backward cannot run ``problem`` (a string), or None."""
    return host.tensor_core_backward_refusal(problem, config, "the tf32 family", DTYPES,
                                             SUPPORTED_HEAD_DIMS, tiles(problem))


def backward(problem, out, lse, dout, config):
    """Float32 3xTF32 tensor-core backward: ``(dq, dk, dv)`` in the problem's kind of array
    (see `kernels.backward`)."""
    return prepare(problem, config)(problem.q, problem.k, problem.v, out, lse, dout)


def plan(problem, config):
    """The `sim.plan.Plan` this backward launches for ``problem`` (`sim.plans.tensor_core_bwd`):
    its grids, threads, shared memory and k-loop unrolling are what `prepare` launches (the
    16-query dK/dV stages of `dkdv_dropout_config` included); its counts are what
    `sim.plan.price` prices."""
    mode = dq_mode(problem, config)
    return backward_plan("tf32", problem, config, tiles(problem), dq_mode=mode)


def prepare(problem, config):
    """The backward of ``problem`` with its plan, kernels, tile schedules and constants chosen
    once: ``run(q, k, v, out, lse, dout) -> (dq, dk, dv)``
    (`kernels.host.prepare_tensor_core_backward`), launched as `plan` says."""
    pb = problem
    the_plan = plan(pb, config)
    (dq_bq, dq_bk), (kv_bq, kv_bk) = the_plan.config["dq_tile"], the_plan.config["kv_tile"]
    drop = dropout_constants(pb.seed, pb.dropout_p)
    group = tile_scheduler.head_group(config.launch_order, pb.causal, "bwd")
    causal, window, band_lo, band_hi = band_arguments(pb)
    features = (causal, pb.mask is not None, drop.enabled, group, window)
    unroll = the_plan.config["unroll"]
    if the_plan.config.get("dq_mode") == "atomic":
        return host.prepare_tensor_core_backward(
            pb, config, None, None, None,
            get_dkdv_kernel(pb.head_dim, kv_bk, kv_bq, *features, unroll=unroll["dkdv"],
                            dq_atomic=_red_width()),
            launch_of(the_plan, "dkdv"), tile_scheduler.device_schedule(pb, kv_bq, kv_bk, "q"),
            drop, words=False, band=(band_lo, band_hi),
            dq_acc=((get_prepass_kernel(pb.head_dim, "float32"), launch_of(the_plan, "pre")),
                    (get_convert_kernel(pb.head_dim, "float32"),
                     launch_of(the_plan, "convert"))))
    return host.prepare_tensor_core_backward(
        pb, config,
        get_dq_kernel(pb.head_dim, dq_bq, dq_bk, *features, unroll=unroll["dq"]),
        launch_of(the_plan, "dq"), tile_scheduler.device_schedule(pb, dq_bq, dq_bk, "kv"),
        get_dkdv_kernel(pb.head_dim, kv_bk, kv_bq, *features, unroll=unroll["dkdv"]),
        launch_of(the_plan, "dkdv"), tile_scheduler.device_schedule(pb, kv_bq, kv_bk, "q"), drop,
        words=False, band=(band_lo, band_hi), dq_acc="unused")
