"""PyTorch's SDPA backends on an H100 (sm_90) as the plans of the kernels they launch.

Owns the plans (`sim.plan.Plan`) of what ``torch.nn.functional.scaled_dot_product_attention``
runs under each CUDA backend, with the tile choices of each backend's dispatch:

* :func:`flash_forward_plan`, :func:`flash_backward_plan`: FLASH, FlashAttention-2 as PyTorch
  builds it (``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`` calling the
  kernels of the ``third_party/flash-attention`` submodule, ``csrc/flash_attn/src/``);
* :func:`efficient_forward_plan`, :func:`efficient_backward_plan`: EFFICIENT, the CUTLASS
  memory-efficient attention of xFormers (``mem_eff_attention/``), whose sm80 kernels run on
  sm_90;
* :func:`cudnn_forward_plan`: CUDNN, closed source, modelled as FlashAttention-3's forward
  (`sim.plans.flash3`) at FlashAttention-3's tiles. cuDNN's backward is not modelled.

Which records they price: :func:`sdpa_record_config` (the options a results record implies) and
:func:`record_on_sm90` (the plans hold for compute capability 9.0 only), read by
`sim.plans.plans_for_record`. Nothing here is fitted on measurements, and none of it has been
held against Nsight Compute counters yet: the shipped results files time the SDPA backends but
carry no counters of them.

Sources (line numbers of the versions named):

* ``FA2`` = Dao-AILab/flash-attention at commit 0251105a (the commit `sim.plans.flash3` reads),
  ``csrc/flash_attn/`` (the kernels' files under ``src/``). The non-split forward tiles and the
  backward tiles of head dims 64 and 128 are unchanged there since commit 65f723bb
  (2024-07-23), so they hold for whichever submodule commit PyTorch 2.11 pins after its move
  to ``FLASH_NAMESPACE``.
* ``PT`` = pytorch/pytorch, the stored versions read: ``flash_attn/flash_api.cpp`` at commit
  03b7c19d and ``attention_backward.cu`` at commit 00afd8f2 (both under
  ``aten/src/ATen/native/transformers/cuda/``). The PyTorch 2.11 tag itself could not be read.
* ``ME`` = ``mem_eff_attention/`` as shipped in the torch 2.13.0 wheel's headers (git cf30153c;
  the 2.11 headers could not be read): ``kernel_forward.h``, ``kernel_backward.h``,
  ``kernels/cutlassF.h``, ``kernels/cutlassB.h``, ``gemm_kernel_utils.h``.
* ``CUTLASS`` = NVIDIA/cutlass ``include/cutlass/gemm/device/default_gemm_configuration.h``
  (``DefaultGemmConfiguration<OpClassTensorOp, Sm80, ...>::kStages = 3``) and
  ``gemm/warp/mma_tensor_op_fast_f32.h`` (``FastF32``: 3xTF32 by default).

FLASH (FlashAttention-2; float16/bfloat16 only, head dims 64 and 128 modelled):

* **Forward tiles** (FA2 ``flash_fwd_launch_template.h``; sm_90 is not ``is_sm8x``, no
  dropout): d = 64: ``Flash_fwd_kernel_traits<64, 128, 128, 4, false, false>`` (line 210),
  d = 128: ``<128, 128, 64, 4, false, false>`` (line 262): kBlockM x kBlockN, 4 warps,
  ``Is_Q_in_regs = Share_Q_K_smem = false``; grid (cdiv(Nq, kBlockM), B, H) (line 64); shared
  memory ``kBlockM d + 2 kBlockN d`` elements (``kernel_traits.h`` lines 107-109).
* **Split-KV**: PyTorch's ``mha_fwd`` asks the split heuristic (``set_params_splitkv(...,
  /*num_splits*/0, ...)`` and ``num_splits_heuristic`` in PT ``flash_api.cpp``, the code of FA2
  ``flash_api.cpp`` lines 281-335), which keeps one split when ``B H cdiv(Nq, 64) >= 0.8 * 2 *
  SMs``: true for training shapes. A problem that would split is refused (the split kernel
  is not modelled).
* **Forward bytes**: Q by ``cp.async`` once per program (rows inside the problem), K and V by
  ``cp.async`` once per visited tile (`sim.counts.workload_tile_stats`), O (through shared
  memory, 16-byte stores) and the float32 logsumexp once per row.
* **Backward tiles** (FA2 ``flash_bwd_launch_template.h``; the sm_90 opt-in of 227 KiB passes
  ``max_smem_per_block >= 144 * 1024``): d = 64: ``Flash_bwd_kernel_traits<64, 128, 128, 8,
  4, 4, 4, false, false>`` (line 179), d = 128: ``<128, 64, 128, 8, 2, 4, 2, false, false>``
  (line 248): kBlockM x kBlockN, 8 warps, AtomLayoutMSdP, AtomLayoutNdKV, AtomLayoutMdQ,
  ``Is_V_in_regs = No_double_buffer = false``; shared memory ``kSmemSize1colblock`` = 3 kBlockM d
  + 2 kBlockN d + 2 kBlockM kBlockN elements (``kernel_traits.h`` lines 278-290).
* **Backward kernels**, in launch order (``run_flash_bwd_seqk_parallel``, lines 73-125), after
  the two copies PyTorch makes (PT ``attention_backward.cu``, ``_flash_attention_backward``:
  ``grad_out.contiguous()`` and ``out.contiguous()`` of the (B, N, H, d) views of (B, H, N, d)
  tensors): ``flash_bwd_dot_do_o_kernel`` (grid (cdiv(Nq, kBlockM), B, H): dO and O rows read,
  dP_sum = rowsum(dO O) stored for every row of the tile, the tile of the float32 dq_accum
  zeroed, ``Clear_dQaccum``; ``flash_bwd_preprocess_kernel.h`` lines 51-120; PyTorch allocates
  dq_accum with ``at::empty``, PT ``flash_api.cpp`` ``mha_bwd``);
  ``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel`` (grid (cdiv(Nk, kBlockN), B, H): K and V
  once per program, per visited Q tile Q by ``cp.async`` and dO by 16-byte loads
  (``GmemTiledCopydO``, ``kernel_traits.h`` line 312), lse and dP_sum read by every
  warp along the tile's key direction (``flash_bwd_kernel.h`` lines 411, 465), dQ added to
  dq_accum by float32 ``atomicAdd`` on the whole kBlockM x d tile (line 678), dK and dV stored
  once); ``flash_bwd_convert_dq_kernel`` (the dq_accum tile read, dQ stored).

EFFICIENT (CUTLASS; float16/bfloat16 on ``mma.sync`` f16/bf16, float32 on 3xTF32 whatever
``allow_tf32`` says: ``DefaultGemmType<Sm80, float>`` uses ``OpMultiplyAddFastF32``, ME
``gemm_kernel_utils.h`` line 128, which CUTLASS runs as three TF32 products; head dims 64, 128):

* **Forward tiles**: the first kernel of ``dispatch_cutlassF_<dtype>_sm80`` whose kMaxK holds
  the head dim (ME ``cutlassF.h`` lines 27-31, 152-156, 277-281; cc 90 takes the sm80 lists,
  lines 287-313): d <= 64: ``AttentionKernel<_, Sm80, true, 64, 64, 64>``, d <= 128:
  ``<_, Sm80, true, 64, 128, 128>`` (kQueriesPerBlock x kKeysPerBlock); warps kQ kK / 1024
  (``kernel_forward.h`` line 124); grid (cdiv(Nq, kQ), H, B) (line 336).
* **Forward bytes**: Q is loaded again for every key tile (the Q K^T ``Mma`` is built inside
  the key loop and runs its own prologue, line 757), K and V per visited tile, all by 16-byte
  ``cp.async``; O once per row; the logsumexp only when autograd needs it (``compute_log_sumexp``:
  records of pass "fwd+bwd"), padded to a multiple of 32 rows (line 1173).
* **Backward tiles**: the first kernel of ``dispatch_cutlassB_<dtype>_sm80`` that passes the
  launcher's checks (kMaxK, alignment of Nq, Nk to the tile for the ``seqaligned`` ones; PT
  ``attention_backward.cu`` ``launchKernel``; ME ``cutlassB.h`` lines 228-246, 318-336,
  853-866): float16/bfloat16 d = 64: ``AttentionBackwardKernel<Sm80, _, true, false, true, 64,
  64, 64>``, d = 128: ``<..., true, 128, 128, 128>`` (kPreload, kBlockSizeI x kBlockSizeJ,
  kMaxK); float32 d = 64: ``<Sm80, float, true, false, false, 64, 64, 64>``, d = 128:
  ``<..., false, 128, 64, 128>``. The 128 x 128 kernel is assumed to fit the 227 KiB opt-in
  (its ``SharedStorage`` size is not derived here). Warps kI kJ / 1024, grid
  (num_splits_key, H, B) (``kernel_backward.h`` lines 262, 851), num_splits_key =
  cdiv(Nk, kJ) unless B H >= 256 and Nk <= 2 kJ (PT ``attention_backward.cu``).
* **Backward structure** (``kernel_backward.h``): dK and dV stay in registers for the half
  kernels (``kOutputInRF``, line 251) and are stored once per key tile; the float32 kernels
  accumulate them in the output in global memory (read, add, store per visited tile but the
  first). dQ is accumulated in a float32 workspace (``kNeedsAccumGradQ``, line 616): each
  visit of a Q tile loads its workspace tile (zero-filled by ``workspace.zero_()`` when there
  are several splits) and stores it back, except the last visit, which stores dQ in the input
  dtype. The half kernels compute delta = rowsum(dO O) themselves: every program for every
  query row (line 1322: the loop does not depend on the split); the float32 ones get it from
  PyTorch (``(grad_out.to(float) * out.to(float)).sum(-1).transpose(-2, -1).contiguous()``:
  three kernels). Per visited tile: Q twice (Q K^T and dK += dS^T Q), dO twice (dV += P^T dO
  and dP = dO V^T), V once, K once (dQ += dS K) plus the Q K^T operand, which the kPreload half
  kernels keep in shared memory across a key tile's Q tiles when kMaxK fits their stages
  (``kReloadK``, line 2388: d = 64, not d = 128), lse and delta once. The workspace's locks and
  counters (a few 4-byte atomics per tile) are not counted. ``grad_out.contiguous()`` copies dO
  first.

Element-wise FP32 FLOPs and MUFU operations follow `sim.plans.flash3`'s conventions for the
same online softmax (`sim.counts.flop_costs` with ``exp_flops=0``: ``ex2`` on the MUFU) on whole
tiles; they are not held against SASS. Shared memory: the ``cp.async`` destinations and the
operand reads of each product by its warp grid (an operand row is read by every warp along the
other output dimension; FA2 ``kernel_traits.h`` TiledMma layouts, lines 74-77, 195-208; the
CUTLASS kernels' 32 x 32 warp tiles), P and dS written once: approximate for the CUTLASS
kernels. EFFICIENT's per-block shared memory is not derived (0 here); its occupancy comes from
its launch bounds (``__launch_bounds__(kNumThreads, kMinBlocksPerSm)``, ``kMinBlocksPerSm`` =
16 (half) or 12 (float32) forward warps per SM, 12 or 8 backward, over the block's warps:
``kernel_forward.h`` lines 60-66, 130; ``kernel_backward.h`` lines 194-201, 277) as the register
budget they grant. FLASH's registers are not known (None). PyTorch's own copy and reduction
kernels are priced by their bytes, with 128 threads of 4 (2-byte) or 2 (4-byte) elements per
block (the generic launch, ATen ``CUDALoops.cuh`` ``launch_legacy_kernel<128, unroll>``; their
real launch may differ).
"""
from __future__ import annotations

import dataclasses
import math

from ..counts import flop_costs, workload_tile_stats
from ..plan import Access, KernelPlan, Matmul, Plan
from ..workload import STAT_BYTES, Workload

__all__ = ["flash_forward_plan", "flash_backward_plan", "efficient_forward_plan",
           "efficient_backward_plan", "cudnn_forward_plan", "flash_forward_tiles",
           "flash_backward_tiles", "flash_num_splits", "efficient_forward_tiles",
           "efficient_backward_kernel", "efficient_num_splits_key", "sdpa_record_config",
           "record_on_sm90", "SDPA_FAMILIES", "SOURCES", "H100_SMS", "HEAD_DIMS"]

#: The sources the constants below come from (module docstring).
SOURCES = {
    "FA2": "Dao-AILab/flash-attention csrc/flash_attn/ at commit "
           "0251105a2fb19d2957484b7f023cd8c115286ced",
    "PT": "pytorch/pytorch aten/src/ATen/native/transformers/cuda/: flash_attn/flash_api.cpp at "
          "03b7c19dbe228c9febd503755f723240945f8067, attention_backward.cu at "
          "00afd8f2c6576adb7dbe25e4763523ae43fef70e",
    "ME": "aten/src/ATen/native/transformers/cuda/mem_eff_attention/ as shipped in the torch "
          "2.13.0 wheel (git cf30153c4c131c8164ee7798e5022d810682e2cb)",
    "CUTLASS": "NVIDIA/cutlass include/cutlass/gemm/device/default_gemm_configuration.h, "
               "gemm/warp/mma_tensor_op_fast_f32.h",
    "CUDNN": "closed source: modelled as FlashAttention-3's forward (sim.plans.flash3)",
}
#: The results files' kernel names of the three backends (the plans' families).
SDPA_FAMILIES = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
#: Head dims whose kernels the plans follow.
HEAD_DIMS = (64, 128)
#: SMs of the H100 SXM (and H200) the split-KV heuristic counts.
H100_SMS = 132
#: GPU names of compute capability 9.0 (for records whose provenance has no compute capability).
SM90_GPU_NAMES = ("H100", "H200", "H800", "H20", "GH200")

# -- FLASH (FlashAttention-2) ---------------------------------------------------------------------
#: head dim -> (kBlockM, kBlockN, kNWarps) of the forward without dropout on sm_90
#: (FA2 flash_fwd_launch_template.h lines 210 and 262).
FLASH_FWD_TILES = {64: (128, 128, 4), 128: (128, 64, 4)}
#: head dim -> (kBlockM, kBlockN, kNWarps, AtomLayoutMSdP, AtomLayoutNdKV, AtomLayoutMdQ) of the
#: backward with >= 144 KiB of shared memory per block (FA2 flash_bwd_launch_template.h lines
#: 179 and 248).
FLASH_BWD_TILES = {64: (128, 128, 8, 4, 4, 4), 128: (64, 128, 8, 2, 4, 2)}
#: kBlockM the split-KV heuristic counts Q blocks with (FA2 flash_api.cpp set_params_splitkv).
FLASH_SPLIT_BLOCK_M = 64

# -- EFFICIENT (CUTLASS memory-efficient attention) -----------------------------------------------
#: kMaxK -> (kQueriesPerBlock, kKeysPerBlock) of the sm80 forward kernels, in dispatch order
#: (ME cutlassF.h lines 152-156; the bf16 and f32 lists, lines 27-31 and 277-281, are the same).
EFFICIENT_FWD_TILES = ((64, (64, 64)), (128, (64, 128)))
#: Warps per SM the launch bounds ask for: forward (half, float32), backward (half, float32)
#: (ME kernel_forward.h lines 60-66, kernel_backward.h lines 194-201).
EFFICIENT_FWD_WARPS_PER_SM = {"half": 16, "fp32": 12}
EFFICIENT_BWD_WARPS_PER_SM = {"half": 12, "fp32": 8}
#: The backward kernel chosen on sm_90 without dropout: (dtype class, head dim) -> (kBlockSizeI,
#: kBlockSizeJ, kMaxK, kPreload, has a seqaligned variant) (ME cutlassB.h lines 318-336 for
#: f16, 228-246 for bf16, 853-866 for f32; the first entry that passes the launcher's checks).
EFFICIENT_BWD_KERNELS = {("half", 64): (64, 64, 64, True, True),
                         ("half", 128): (128, 128, 128, True, True),
                         ("fp32", 64): (64, 64, 64, False, False),
                         ("fp32", 128): (128, 64, 128, False, False)}
#: CUTLASS's warp tile of these kernels (WarpShape 32 x 32) and the k-step of their products.
CUTLASS_WARP_TILE = 32
#: Stages of the Q K^T product of the backward: DefaultGemmConfiguration<OpClassTensorOp, Sm80>
#: kStages (CUTLASS), reduced to cdiv(kMaxK, 32) by MakeCustomMma (ME gemm/custom_mma.h).
CUTLASS_SM80_STAGES = 3
#: Rows the forward pads its logsumexp to (ME kernel_forward.h line 114, kAlignLSE).
EFFICIENT_LSE_ALIGN = 32
#: The dtype as the CUTLASS kernels' names spell it (fmha_cutlassF_f16_..., ..._bf16_..., ..._f32_...).
CUTLASS_DTYPE_TAGS = {"fp16": "f16", "bf16": "bf16", "fp32": "f32"}
#: Bytes of a GradQTempStorage header: lock, counter, 2 ints of padding (kernel_backward.h 623).
GRADQ_STORAGE_HEADER_BYTES = 16

# -- PyTorch's own element-wise kernels ------------------------------------------------------------
#: Threads per block and elements per thread of the generic element-wise launch
#: (ATen CUDALoops.cuh launch_legacy_kernel<128, unroll>; unroll 4 for 2-byte, 2 for 4-byte).
ELEMENTWISE_THREADS = 128
ELEMENTWISE_UNROLL = {2: 4, 4: 2}

#: Registers per SM (65,536 32-bit registers on sm_90) and the largest per thread.
REGISTERS_PER_SM = 65536
MAX_REGISTERS_PER_THREAD = 255


# -- checks and small helpers ---------------------------------------------------------------------
def _check(backend: str, w, dtypes, pass_: str):
    if not isinstance(w, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(w).__name__}")
    if w.dtype not in dtypes:
        raise ValueError(f"SDPA {backend} {pass_} runs dtype {' or '.join(dtypes)}, got "
                         f"workload.dtype={w.dtype!r}")
    if w.head_dim not in HEAD_DIMS:
        raise ValueError(f"workload.head_dim={w.head_dim}: the SDPA {backend} plans follow the "
                         f"kernels of head dims {HEAD_DIMS} only")
    if w.dropout:
        raise ValueError(f"workload.dropout: SDPA {backend}'s dropout kernels are not modelled")
    if w.window_size is not None or w.block_sparse or w.key_lengths is not None:
        raise ValueError(f"workload: SDPA {backend} is modelled for dense and causal problems only "
                         f"(no window_size, block mask or key_lengths)")
    if w.causal and w.seq_len_q != w.seq_len_k:
        raise ValueError(f"workload.causal with seq_len_q={w.seq_len_q} != seq_len_k={w.seq_len_k}: "
                         f"SDPA's top-left mask against the kernels' alignment is not modelled")


def _sums(w: Workload, block_q: int, block_k: int) -> dict:
    """Totals over all (batch, head) slices of the tiles a (block_q x block_k) schedule visits."""
    groups = workload_tile_stats(w, block_q, block_k)
    st0 = groups[0][1]
    return {"nq": int(st0.nq), "nk": int(st0.nk),
            **{f: sum(m * int(getattr(st, f)) for m, st in groups) for f in ("T", "A", "R", "C", "Am")}}


def _half_unit(w: Workload) -> str:
    return "mma.bf16" if w.dtype == "bf16" else "mma.f16"


def _product_smem_reads(m: int, n: int, k: int, e: int, warps_m: int, warps_n: int,
                        a_in_smem: bool = True, b_in_smem: bool = True) -> int:
    """Bytes the warps of an (warps_m x warps_n) grid read from shared memory for one product
    C[m x n] += A[m x k] B[k x n]: each row of A by the warps along n, each column of B by the
    warps along m."""
    return (m * k * e * warps_n if a_in_smem else 0) + (k * n * e * warps_m if b_in_smem else 0)


def _elementwise_kernel(name: str, phase: str, elements: int, element_bytes: int, accesses,
                        fp32_flops: int = 0) -> KernelPlan:
    """One of PyTorch's element-wise or reduction kernels over ``elements`` elements, priced by
    its bytes at the generic launch geometry (128 threads of ``unroll`` elements per block)."""
    per_block = ELEMENTWISE_THREADS * ELEMENTWISE_UNROLL.get(element_bytes, 2)
    return KernelPlan(name=name, phase=phase, grid=(max(1, math.ceil(elements / per_block)),),
                      threads=ELEMENTWISE_THREADS, shared_bytes=0, accesses=tuple(accesses),
                      fp32_flops=int(fp32_flops))


def _copy_kernel(name: str, phase: str, src: str, dst: str, elements: int, element_bytes: int) -> KernelPlan:
    """A copy of ``elements`` elements from ``src`` to ``dst`` (``contiguous()``)."""
    n = elements * element_bytes
    return _elementwise_kernel(name, phase, elements, element_bytes,
                               (Access(src, "load", n), Access(dst, "store", n)))


def _launch_bound_registers(threads: int, warps_per_sm: int) -> int | None:
    """The registers per thread ``__launch_bounds__(threads, warps_per_sm / warps)`` grants:
    the register file over the blocks it asks for (None when it asks for none)."""
    blocks = warps_per_sm // (threads // 32)
    if blocks < 1:
        return None
    return min(MAX_REGISTERS_PER_THREAD, (REGISTERS_PER_SM // (blocks * threads)) // 8 * 8)


# -- FLASH ----------------------------------------------------------------------------------------
def flash_forward_tiles(head_dim: int) -> tuple[int, int, int]:
    """(kBlockM, kBlockN, kNWarps) of FlashAttention-2's forward on sm_90 without dropout."""
    if head_dim not in FLASH_FWD_TILES:
        raise ValueError(f"head_dim={head_dim}: FLASH's forward tiles are modelled for head dims "
                         f"{tuple(FLASH_FWD_TILES)}")
    return FLASH_FWD_TILES[head_dim]


def flash_backward_tiles(head_dim: int) -> tuple[int, int, int, int, int, int]:
    """(kBlockM, kBlockN, kNWarps, AtomLayoutMSdP, AtomLayoutNdKV, AtomLayoutMdQ) of
    FlashAttention-2's backward on sm_90 (>= 144 KiB of shared memory per block)."""
    if head_dim not in FLASH_BWD_TILES:
        raise ValueError(f"head_dim={head_dim}: FLASH's backward tiles are modelled for head dims "
                         f"{tuple(FLASH_BWD_TILES)}")
    return FLASH_BWD_TILES[head_dim]


def flash_num_splits(w: Workload, num_sms: int = H100_SMS) -> int:
    """The split count ``num_splits_heuristic`` gives PyTorch's ``mha_fwd`` (PT flash_api.cpp;
    FA2 flash_api.cpp lines 281-315 and 335: kBlockN 256/128 for d <= 64/128, 128 splits at
    most, the SMs counted twice), as written there."""
    block_n = 256 if w.head_dim <= 64 else 128 if w.head_dim <= 128 else 64
    n_blocks = -(-w.seq_len_k // block_n)
    work = w.batch * w.heads * -(-w.seq_len_q // FLASH_SPLIT_BLOCK_M)
    sms = 2 * num_sms
    if work >= 0.8 * sms:
        return 1
    max_splits = min(128, sms, n_blocks)
    eff = []
    for s in range(1, max_splits + 1):
        eligible = s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))
        waves = work * s / sms
        eff.append(waves / math.ceil(waves) if eligible else 0.0)
    best = max(eff) if eff else 0.0
    for s in range(1, max_splits + 1):
        if eff[s - 1] and eff[s - 1] >= 0.85 * best:
            return s
    return 1


def flash_forward_plan(workload: Workload, *, num_sms: int = H100_SMS) -> Plan:
    """The plan of SDPA FLASH's forward on sm_90: one ``flash_fwd_kernel`` (module docstring).
    ``num_sms``: the GPU's SMs, for the split-KV heuristic (a problem it would split is
    refused). Raises ValueError naming the argument."""
    w = workload
    _check("FLASH", w, ("fp16", "bf16"), "forward")
    splits = flash_num_splits(w, num_sms)
    if splits > 1:
        raise ValueError(f"workload: FlashAttention-2 would run its split-KV kernel with {splits} "
                         f"splits here (B H cdiv(Nq, 64) < 0.8 x 2 x {num_sms} SMs); not modelled")
    bq, bk, warps = flash_forward_tiles(w.head_dim)
    d, e = w.head_dim, w.dtype_bytes
    s = _sums(w, bq, bk)
    slices = w.batch * w.heads
    rows = slices * w.seq_len_q
    scores = s["T"] * bq * bk
    row_tiles = s["T"] * bq
    padded_rows = slices * s["nq"] * bq
    costs = flop_costs(exp_flops=0)
    fp32 = (costs["fwd_per_score"] * scores + costs["mask_per_score"] * s["Am"]
            + row_tiles * (d + costs["fwd_per_row_tile"]) + padded_rows * (d + 2))
    mufu = scores + row_tiles + 2 * padded_rows
    kv_tile = bk * d * e
    # per tile: K and V land; Q read once (warps split the rows), K and V by every warp (P stays
    # in registers); per program: Q lands, O goes through shared memory (written, read)
    shared = (s["T"] * (2 * kv_tile + bq * d * e + 2 * warps * kv_tile)
              + slices * s["nq"] * 3 * bq * d * e)
    kernel = KernelPlan(
        name="flash_fwd_kernel", phase="fwd", grid=(s["nq"], w.batch, w.heads), threads=32 * warps,
        shared_bytes=(bq + 2 * bk) * d * e,
        accesses=(Access("Q", "load", rows * d * e, "cp.async"),
                  Access("K", "load", s["C"] * d * e, "cp.async"),
                  Access("V", "load", s["C"] * d * e, "cp.async"),
                  Access("O", "store", rows * d * e),
                  Access("lse", "store", rows * STAT_BYTES)),
        matmuls=(Matmul(_half_unit(w), 4 * d * scores),), fp32_flops=int(fp32), mufu_ops=int(mufu),
        shared_bytes_moved=int(shared), registers=None, programs_per_slice=s["nq"],
        lockstep=not w.causal)   # causal programs start at their own last visible K tile
    kv = w.batch * w.heads_kv * w.seq_len_k * d * e
    tensor_bytes = {"Q": rows * d * e, "K": kv, "V": kv, "O": rows * d * e, "lse": rows * STAT_BYTES}
    config = {"block_q": bq, "block_k": bk, "warps": warps, "num_splits": 1,
              "kernel": f"flash_fwd_kernel<Flash_fwd_kernel_traits<{d}, {bq}, {bk}, {warps}, false, false>>",
              "source": SOURCES["FA2"]}
    return Plan("sdpa-flash", "fwd", w, (kernel,), config, tensor_bytes)


def flash_backward_plan(workload: Workload) -> Plan:
    """The plan of SDPA FLASH's backward on sm_90: PyTorch's two ``contiguous()`` copies (dO,
    O), then ``flash_bwd_dot_do_o_kernel``, ``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel``,
    ``flash_bwd_convert_dq_kernel`` (module docstring). Raises ValueError naming the argument."""
    w = workload
    _check("FLASH", w, ("fp16", "bf16"), "backward")
    if w.heads != w.heads_kv:
        raise ValueError(f"workload.heads_kv={w.heads_kv} != heads={w.heads}: FLASH's GQA backward "
                         f"(per-query-head dK/dV and their sum) is not modelled")
    bq, bk, warps, at_sdp, at_dkv, at_dq = flash_backward_tiles(w.head_dim)
    d, e = w.head_dim, w.dtype_bytes
    threads = 32 * warps
    s = _sums(w, bq, bk)
    B, H = w.batch, w.heads
    slices = B * H
    rows = slices * w.seq_len_q
    keys = slices * w.seq_len_k
    nq_pad_rows = slices * s["nq"] * bq           # rows of the tiles of the Q-block kernels
    scores = s["T"] * bq * bk
    costs = flop_costs(exp_flops=0)
    copies = (_copy_kernel("copy_dO_contiguous", "bwd.pre", "dO_grad", "dO", rows * d, e),
              _copy_kernel("copy_O_contiguous", "bwd.pre", "O", "O_contig", rows * d, e))
    dot = KernelPlan(
        name="flash_bwd_dot_do_o_kernel", phase="bwd.pre", grid=(s["nq"], B, H), threads=threads,
        shared_bytes=0,
        accesses=(Access("dO", "load", rows * d * e), Access("O_contig", "load", rows * d * e),
                  Access("dP_sum", "store", nq_pad_rows * STAT_BYTES),
                  Access("dQaccum", "store", nq_pad_rows * d * STAT_BYTES)),
        fp32_flops=int(rows * (2 * d + 1)), programs_per_slice=s["nq"])
    # the main kernel: lse and dP_sum read by every warp along the tile's keys
    warps_n_sdp = warps // at_sdp
    kv_tile, q_tile, s_tile = bk * d * e, bq * d * e, bq * bk * e
    per_tile_smem = (2 * q_tile                                                   # Q, dO land
                     + 2 * _product_smem_reads(bq, bk, d, e, at_sdp, warps // at_sdp)  # S, dP
                     + 2 * s_tile                                                 # P, dS written
                     + 2 * _product_smem_reads(bk, d, bq, e, at_dkv, warps // at_dkv)  # dV, dK
                     + _product_smem_reads(bq, d, bk, e, at_dq, warps // at_dq))  # dQ = dS K
    per_program_smem = 2 * kv_tile + 2 * 2 * kv_tile    # K, V land; dK, dV through shared memory
    main = KernelPlan(
        name="flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", phase="bwd.main",
        grid=(s["nk"], B, H), threads=threads, shared_bytes=(3 * bq + 2 * bk) * d * e + 2 * bq * bk * e,
        accesses=(Access("K", "load", keys * d * e, "cp.async"),
                  Access("V", "load", keys * d * e, "cp.async"),
                  Access("Q", "load", s["R"] * d * e, "cp.async"),
                  Access("dO", "load", s["R"] * d * e),   # GmemTiledCopydO: plain 16-byte loads
                  Access("lse", "load", s["R"] * STAT_BYTES * warps_n_sdp),
                  Access("dP_sum", "load", s["T"] * bq * STAT_BYTES * warps_n_sdp),
                  Access("dQaccum", "atomic", s["T"] * bq * d * STAT_BYTES, "atomic"),
                  Access("dK", "store", keys * d * e), Access("dV", "store", keys * d * e)),
        matmuls=(Matmul(_half_unit(w), 10 * d * scores),),
        fp32_flops=int(costs["bwd_per_score"] * scores + costs["mask_per_score"] * s["Am"] + keys * d),
        mufu_ops=int(scores), shared_bytes_moved=int(s["T"] * per_tile_smem + slices * s["nk"] * per_program_smem),
        registers=None, programs_per_slice=s["nk"], lockstep=True)   # all start at the last Q tile
    convert = KernelPlan(
        name="flash_bwd_convert_dq_kernel", phase="bwd.post", grid=(s["nq"], B, H), threads=threads,
        shared_bytes=bq * d * e,
        accesses=(Access("dQaccum", "load", nq_pad_rows * d * STAT_BYTES),
                  Access("dQ", "store", rows * d * e)),
        fp32_flops=int(nq_pad_rows * d), shared_bytes_moved=int(2 * nq_pad_rows * d * e),
        programs_per_slice=s["nq"])
    io = rows * d * e
    kv = keys * d * e
    tensor_bytes = {"dO_grad": io, "dO": io, "O": io, "O_contig": io, "Q": io, "K": kv, "V": kv,
                    "lse": rows * STAT_BYTES, "dP_sum": nq_pad_rows * STAT_BYTES,
                    "dQaccum": nq_pad_rows * d * STAT_BYTES, "dQ": io, "dK": kv, "dV": kv}
    config = {"block_q": bq, "block_k": bk, "warps": warps,
              "atom_layouts": {"MSdP": at_sdp, "NdKV": at_dkv, "MdQ": at_dq},
              "kernel": (f"flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<{d}, "
                         f"{bq}, {bk}, {warps}, {at_sdp}, {at_dkv}, {at_dq}, false, false>>"),
              "source": SOURCES["FA2"] + "; " + SOURCES["PT"]}
    return Plan("sdpa-flash", "bwd", w, copies + (dot, main, convert), config, tensor_bytes)


# -- EFFICIENT ------------------------------------------------------------------------------------
def _dtype_class(w: Workload) -> str:
    return "fp32" if w.dtype == "fp32" else "half"


def _efficient_unit(w: Workload) -> tuple[str, int]:
    """(Matmul unit, passes): float32 runs 3xTF32 (OpMultiplyAddFastF32), half mma.sync."""
    return ("mma.tf32", 3) if w.dtype == "fp32" else (_half_unit(w), 1)


def efficient_forward_tiles(head_dim: int) -> tuple[int, int]:
    """(kQueriesPerBlock, kKeysPerBlock) of the first sm80 forward kernel whose kMaxK holds
    ``head_dim`` (the same for float16, bfloat16 and float32)."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim}: EFFICIENT's tiles are modelled for head dims {HEAD_DIMS}")
    for max_k, tiles in EFFICIENT_FWD_TILES:
        if head_dim <= max_k:
            return tiles
    raise ValueError(f"head_dim={head_dim}: no register-file forward kernel holds it")


def efficient_backward_kernel(w: Workload) -> dict:
    """The sm80 backward kernel the launcher picks for ``w``: its tiles, kMaxK, kPreload,
    whether it is a ``seqaligned`` one, and its name."""
    key = (_dtype_class(w), w.head_dim)
    if key not in EFFICIENT_BWD_KERNELS:
        raise ValueError(f"head_dim={w.head_dim}: EFFICIENT's backward is modelled for head dims {HEAD_DIMS}")
    bi, bj, max_k, preload, has_aligned = EFFICIENT_BWD_KERNELS[key]
    aligned = has_aligned and w.seq_len_q % bi == 0 and w.seq_len_k % bj == 0
    tag = CUTLASS_DTYPE_TAGS[w.dtype]
    name = (f"fmha_cutlassB_{tag}_aligned_{bi}x{bj}_k{max_k}"
            + ("_seqaligned" if aligned else "") + "_sm80")
    return {"block_i": bi, "block_j": bj, "max_k": max_k, "preload": preload, "seqaligned": aligned,
            "name": name}


def efficient_num_splits_key(w: Workload, block_j: int) -> int:
    """num_splits_key of PyTorch's launcher (``attention_backward.cu``): cdiv(Nk, kBlockSizeJ),
    1 when B H >= 256 and Nk <= 2 kBlockSizeJ (the kernels here accumulate dK/dV without a
    workspace, so the workspace cap does not apply)."""
    splits = -(-w.seq_len_k // block_j)
    if w.batch * w.heads >= 256 and w.seq_len_k <= 2 * block_j:
        splits = 1
    return max(1, splits)


def efficient_forward_plan(workload: Workload, *, logsumexp: bool = False) -> Plan:
    """The plan of SDPA EFFICIENT's forward on sm_90: one ``fmha_cutlassF_*_sm80`` kernel
    (module docstring). ``logsumexp``: whether it writes the logsumexp (autograd needs it:
    records of pass "fwd+bwd"). Raises ValueError naming the argument."""
    w = workload
    _check("EFFICIENT", w, ("fp16", "bf16", "fp32"), "forward")
    if w.heads != w.heads_kv:
        raise ValueError(f"workload.heads_kv={w.heads_kv} != heads={w.heads}: EFFICIENT's GQA is not modelled")
    if not isinstance(logsumexp, bool):
        raise ValueError(f"logsumexp must be True or False, got {logsumexp!r}")
    bq, bk = efficient_forward_tiles(w.head_dim)
    d, e = w.head_dim, w.dtype_bytes
    warps = bq * bk // (CUTLASS_WARP_TILE * CUTLASS_WARP_TILE)
    threads = 32 * warps
    s = _sums(w, bq, bk)
    slices = w.batch * w.heads
    rows = slices * w.seq_len_q
    scores = s["T"] * bq * bk
    row_tiles = s["T"] * bq
    padded_rows = slices * s["nq"] * bq
    unit, passes = _efficient_unit(w)
    costs = flop_costs(exp_flops=0)
    fp32 = (costs["fwd_per_score"] * scores + costs["mask_per_score"] * s["Am"]
            + row_tiles * (d + costs["fwd_per_row_tile"]) + padded_rows * (d + 2))
    mufu = scores + row_tiles + 2 * padded_rows
    wm, wn = bq // CUTLASS_WARP_TILE, bk // CUTLASS_WARP_TILE      # Q K^T warp grid
    pv_wn = d // CUTLASS_WARP_TILE                                # P V: output columns d
    per_tile = ((bq + 2 * bk) * d * e                              # Q, K, V land
                + _product_smem_reads(bq, bk, d, e, wm, wn)        # S = Q K^T
                + bq * bk * e                                      # P written
                + _product_smem_reads(bq, d, bk, e, wm, pv_wn))    # O += P V
    lse_rows = slices * -(-w.seq_len_q // EFFICIENT_LSE_ALIGN) * EFFICIENT_LSE_ALIGN
    accesses = [Access("Q", "load", s["R"] * d * e, "cp.async"),
                Access("K", "load", s["C"] * d * e, "cp.async"),
                Access("V", "load", s["C"] * d * e, "cp.async"),
                Access("O", "store", rows * d * e)]
    if logsumexp:
        accesses.append(Access("lse", "store", lse_rows * STAT_BYTES))
    registers = _launch_bound_registers(threads, EFFICIENT_FWD_WARPS_PER_SM[_dtype_class(w)])
    tag = CUTLASS_DTYPE_TAGS[w.dtype]
    name = f"fmha_cutlassF_{tag}_aligned_{bq}x{bk}_rf_sm80"
    kernel = KernelPlan(
        name=name, phase="fwd", grid=(s["nq"], w.heads, w.batch), threads=threads, shared_bytes=0,
        accesses=tuple(accesses), matmuls=(Matmul(unit, 4 * d * scores, passes),),
        fp32_flops=int(fp32), mufu_ops=int(mufu), shared_bytes_moved=int(s["T"] * per_tile),
        registers=registers, programs_per_slice=s["nq"], lockstep=True)  # every program starts at key 0
    kv = w.batch * w.heads_kv * w.seq_len_k * d * e
    tensor_bytes = {"Q": rows * d * e, "K": kv, "V": kv, "O": rows * d * e,
                    "lse": lse_rows * STAT_BYTES}
    config = {"block_q": bq, "block_k": bk, "warps": warps, "logsumexp": logsumexp, "kernel": name,
              "matmul": f"{unit} x{passes}", "shared_bytes_modelled": False,
              "registers_from": "launch bounds", "source": SOURCES["ME"]}
    return Plan("sdpa-efficient", "fwd", w, (kernel,), config, tensor_bytes)


def efficient_backward_plan(workload: Workload) -> Plan:
    """The plan of SDPA EFFICIENT's backward on sm_90: the copy of dO, for float32 PyTorch's
    delta (multiply, sum, transpose), the workspace's zero fill (several splits), then one
    ``fmha_cutlassB_*_sm80`` kernel (module docstring). Raises ValueError naming the argument."""
    w = workload
    _check("EFFICIENT", w, ("fp16", "bf16", "fp32"), "backward")
    if w.heads != w.heads_kv:
        raise ValueError(f"workload.heads_kv={w.heads_kv} != heads={w.heads}: EFFICIENT's GQA is not modelled")
    kern = efficient_backward_kernel(w)
    bi, bj, max_k, preload = kern["block_i"], kern["block_j"], kern["max_k"], kern["preload"]
    d, e = w.head_dim, w.dtype_bytes
    half = w.dtype != "fp32"
    warps = bi * bj // (CUTLASS_WARP_TILE * CUTLASS_WARP_TILE)
    threads = 32 * warps
    splits = efficient_num_splits_key(w, bj)
    s = _sums(w, bi, bj)
    B, H = w.batch, w.heads
    slices = B * H
    rows = slices * w.seq_len_q
    keys = slices * w.seq_len_k
    programs = splits * slices
    scores = s["T"] * bi * bj
    io, kv = rows * d * e, keys * d * e
    kernels = [_copy_kernel("copy_dO_contiguous", "bwd.pre", "dO_grad", "dO", rows * d, e)]
    if not half:   # delta by PyTorch: (dO * O) in float32, its row sums, the transposed copy
        f = STAT_BYTES
        kernels += [_elementwise_kernel("delta_mul", "bwd.pre", rows * d, f,
                                        (Access("dO", "load", rows * d * f), Access("O", "load", rows * d * f),
                                         Access("dO_O", "store", rows * d * f)), rows * d),
                    _elementwise_kernel("delta_sum", "bwd.pre", rows * d, f,
                                        (Access("dO_O", "load", rows * d * f),
                                         Access("delta_t", "store", rows * f)), rows * d),
                    _copy_kernel("delta_transpose", "bwd.pre", "delta_t", "delta", rows, f)]
    # the float32 dQ workspace: a GradQTempStorage per (Q tile, column block)
    cols = 1 if max_k <= bj else -(-d // bj)
    tile_floats = bi * bj                                     # AccumTileGmem: the I x J tile
    storage_bytes = GRADQ_STORAGE_HEADER_BYTES + tile_floats * STAT_BYTES
    ws_per_slice = -(-(s["nq"] * cols * storage_bytes // STAT_BYTES) // 4) * 4 * STAT_BYTES
    workspace = slices * ws_per_slice
    if splits > 1:
        kernels.append(_elementwise_kernel("zero_workspace", "bwd.pre", workspace // STAT_BYTES,
                                           STAT_BYTES, (Access("workspace", "store", workspace),)))
    # Q K^T keeps K in shared memory across a key tile's Q tiles only with kPreload and stages
    # enough for kMaxK (kReloadK)
    stages = min(CUTLASS_SM80_STAGES, -(-max_k // CUTLASS_WARP_TILE))
    k_kept = preload and max_k <= CUTLASS_WARP_TILE * stages
    k_qk_bytes = (keys if k_kept else s["C"]) * d * e
    visits_last = slices * s["nq"]                              # the last visit of each Q tile
    ws_loads = (s["T"] - (visits_last if splits == 1 else 0)) * cols * tile_floats * STAT_BYTES
    ws_stores = (s["T"] - visits_last) * cols * tile_floats * STAT_BYTES
    accesses = []
    if half:   # every program computes delta for every query row
        accesses += [Access("dO", "load", programs * w.seq_len_q * d * e),
                     Access("O", "load", programs * w.seq_len_q * d * e),
                     Access("delta", "store", programs * w.seq_len_q * STAT_BYTES)]
    accesses += [Access("Q", "load", 2 * s["R"] * d * e, "cp.async"),
                 Access("dO", "load", 2 * s["R"] * d * e, "cp.async"),
                 Access("K", "load", s["C"] * d * e + k_qk_bytes, "cp.async"),
                 Access("V", "load", s["C"] * d * e, "cp.async"),
                 Access("lse", "load", s["R"] * STAT_BYTES),
                 Access("delta", "load", s["R"] * STAT_BYTES),
                 Access("workspace", "load", ws_loads),
                 Access("workspace", "store", ws_stores),
                 Access("dQ", "store", io)]
    if half:   # dK, dV in registers, stored once per key tile
        accesses += [Access("dK", "store", kv), Access("dV", "store", kv)]
    else:      # accumulated in the float32 output: stored every tile, read back but the first
        back = (s["C"] - keys) * d * e
        accesses += [Access("dK", "store", s["C"] * d * e), Access("dK", "load", back),
                     Access("dV", "store", s["C"] * d * e), Access("dV", "load", back)]
    unit, passes = _efficient_unit(w)
    costs = flop_costs(exp_flops=0)
    fp32 = costs["bwd_per_score"] * scores + costs["mask_per_score"] * s["Am"]
    if half:
        fp32 += programs * w.seq_len_q * 2 * d
    wt = CUTLASS_WARP_TILE
    per_tile_smem = (2 * (2 * bi * d * e) + 3 * bj * d * e        # Q, dO twice, K (x2), V land
                     + _product_smem_reads(bj, bi, d, e, bj // wt, bi // wt)   # K Q^T
                     + _product_smem_reads(bj, d, bi, e, bj // wt, d // wt)    # dV += P^T dO
                     + _product_smem_reads(bi, bj, d, e, bi // wt, bj // wt)   # dP = dO V^T
                     + cols * _product_smem_reads(bi, min(d, bj), bj, e, bi // wt, min(d, bj) // wt)  # dQ
                     + _product_smem_reads(bj, d, bi, e, bj // wt, d // wt)    # dK += dS^T Q
                     + 2 * bi * bj * e)                                        # P, dS written
    tag = CUTLASS_DTYPE_TAGS[w.dtype]
    main = KernelPlan(
        name=kern["name"], phase="bwd.main", grid=(splits, H, B), threads=threads, shared_bytes=0,
        accesses=tuple(accesses), matmuls=(Matmul(unit, 10 * d * scores, passes),),
        fp32_flops=int(fp32), mufu_ops=int(scores), shared_bytes_moved=int(s["T"] * per_tile_smem),
        registers=_launch_bound_registers(threads, EFFICIENT_BWD_WARPS_PER_SM[_dtype_class(w)]),
        programs_per_slice=splits, lockstep=not w.causal)   # causal: each key tile starts at its first Q tile
    kernels.append(main)
    tensor_bytes = {"dO_grad": io, "dO": io, "O": io, "Q": io, "K": kv, "V": kv,
                    "lse": rows * STAT_BYTES, "delta": rows * STAT_BYTES, "workspace": workspace,
                    "dQ": io, "dK": kv, "dV": kv}
    if not half:
        tensor_bytes.update(dO_O=rows * d * STAT_BYTES, delta_t=rows * STAT_BYTES)
    config = {"block_i": bi, "block_j": bj, "max_k": max_k, "preload": preload, "warps": warps,
              "num_splits_key": splits, "seqaligned": kern["seqaligned"], "kernel": kern["name"],
              "k_kept_in_shared": k_kept, "delta_in_kernel": half, "matmul": f"{unit} x{passes}",
              "dtype_tag": tag, "shared_bytes_modelled": False, "registers_from": "launch bounds",
              "source": SOURCES["ME"] + "; " + SOURCES["PT"] + "; " + SOURCES["CUTLASS"]}
    return Plan("sdpa-efficient", "bwd", w, tuple(kernels), config, tensor_bytes)


# -- cuDNN ----------------------------------------------------------------------------------------
def cudnn_forward_plan(workload: Workload) -> Plan:
    """SDPA CUDNN's forward, modelled as FlashAttention-3's forward (`sim.plans.flash3`) at
    FlashAttention-3's tiles: cuDNN's kernel is closed source, so this is a stand-in (TMA,
    ``wgmma``, warp specialisation), not its plan. Raises ValueError naming the argument."""
    from .flash3 import flash3_forward_plan
    w = workload
    _check("CUDNN", w, ("fp16", "bf16"), "forward")
    plan = flash3_forward_plan(w)
    config = dict(plan.config, modelled_as="FlashAttention-3's forward (sim.plans.flash3), "
                                           "cuDNN being closed source", cudnn_source=SOURCES["CUDNN"])
    return dataclasses.replace(plan, family="sdpa-cudnn", config=config)


# -- results records ------------------------------------------------------------------------------
def record_on_sm90(rec: dict) -> bool:
    """Whether a results record was measured on a GPU of compute capability 9.0 (its
    provenance's ``compute_capability``, else its GPU's name)."""
    prov = rec.get("provenance") or {}
    cc = prov.get("compute_capability")
    if cc is not None:
        return str(cc) == "9.0"
    gpu = str(prov.get("gpu") or "")
    return any(name in gpu for name in SM90_GPU_NAMES)


def sdpa_record_config(family: str, pass_: str, rec: dict) -> dict:
    """The plan options a results record of an SDPA backend implies for one of its passes: the
    EFFICIENT forward writes the logsumexp when the record ran the backward too."""
    if family == "sdpa-efficient" and pass_ == "fwd":
        return {"logsumexp": rec.get("pass") != "fwd"}
    return {}
