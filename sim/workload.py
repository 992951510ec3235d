"""Workload and schedule descriptions (data), block-size defaults, SRAM footprints, occupancy.

* :class:`Workload` — what is computed: batch, query/KV heads, sequence lengths, head dim,
  dtype, causal, a sliding window, masks (key-padding lengths, a block mask or a block
  density), dropout, pass.
* :class:`Schedule` — how: ``naive`` (the FlashAttention paper's Algorithm 0 as unfused
  PyTorch runs it), ``flash1`` (Algorithm 1/2 and its backward with recomputation),
  ``flash2`` (FlashAttention-2), with block sizes and warps per thread block.

Which tiles a tiled schedule visits is always answered by :class:`ioaware.block_info.BlockInfo`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ioaware.block_info import BlockInfo, cdiv, check_window_size

__all__ = ["Workload", "Schedule", "DTYPE_BYTES", "STAT_BYTES", "SCHEDULES", "PASSES", "EXP_FLOPS", "DQ_MODES", "NAIVE_VARIANTS",
           "DELTA_KERNELS", "SECTOR_BYTES", "SMEM_ELEM_BYTES", "RESERVED_SMEM_PER_BLOCK",
           "density_block_mask", "resolve_blocks", "sram_bytes_per_block", "occupancy",
           "register_limited_blocks",
           "block_infos"]

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
STAT_BYTES = 4  # row statistics (m, l, lse, D) and the fp32 dQ accumulator are float32
#: FLOPs one ``exp`` executes (default of ``Schedule.exp_flops``), as Nsight Compute counts them
#: (FFMA = 2, FADD = FMUL = 1). The libdevice ``__nv_expf`` our kernels call (``math.exp`` on a
#: float32) is, in the PTX nvcc 13.0 emits for sm_90: ``fma.rn`` (x log2e / 256 + 0.5), ``cvt.sat``
#: (folded into that FFMA as .SAT), ``fma.rm`` (round to the exponent), ``add`` (undo the
#: shift), two ``fma.rn`` (x log2e split in two parts), ``ex2.approx`` (MUFU, not counted) and a
#: ``mul`` by 2^i: 4 FFMA + 1 FADD + 1 FMUL = 10. (The earlier default, 5, counted 2 FFMA;
#: docs/model.md shows the per-score residual it left.)
EXP_FLOPS = 10
#: FLOPs of the per-row epilogue functions of our kernels (libdevice, same PTX source as exp):
#: ``logf`` = 11 FFMA + 1 FADD + 2 FMUL = 25; ``1 / x`` (``rcp.rn.f32``: MUFU.RCP, two FFMA
#: refinement steps and an FADD) = 5.
LOG_FLOPS = 25
RCP_FLOPS = 5
DQ_MODES = ("atomic", "kernel")
#: The backward's delta pre-pass D = rowsum(dO * O): "warp" (one warp per row, lanes along d,
#: coalesced: O and dO read once; ``kernels.flash_bwd.make_delta_kernel_v2``, the default) or
#: "thread" (one thread per row: neighbouring threads read addresses d elements apart, so every
#: element read fetches its own ``SECTOR_BYTES`` sector; ``make_delta_kernel``).
DELTA_KERNELS = ("warp", "thread")
#: Bytes of the L1/L2 sector a global load request fetches at least (NVIDIA since Volta).
SECTOR_BYTES = 32
#: Shared memory the system reserves per resident thread block, bytes (compute capability 8.0
#: on: CUDA C++ Programming Guide, shared memory of compute capability 8.x / 9.0).
RESERVED_SMEM_PER_BLOCK = 1024
#: Our CUDA-core kernels stage every tile in shared memory as float32, whatever the input dtype.
SMEM_ELEM_BYTES = 4
NAIVE_VARIANTS = ("math", "eager")
SCHEDULES = ("naive", "flash1", "flash2")
PASSES = ("fwd", "bwd", "fwd+bwd")


def _posint(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


@dataclass(frozen=True, eq=False)
class Workload:
    """One attention problem.

    Parameters
    ----------
    batch, heads : batch size and number of query heads.
    seq_len_q : query length Nq. ``seq_len_k`` (key length Nk) defaults to ``seq_len_q``.
    head_dim : d.
    dtype : "fp16", "bf16" or "fp32" (Q, K, V, O and gradients; row statistics are fp32).
    causal : top-left causal mask (as SDPA ``is_causal``).
    heads_kv : KV heads (GQA/MQA); defaults to ``heads``; must divide ``heads``.
    key_lengths : key-padding mask as one valid key length per batch element (0..Nk). Tiled
        schedules skip K blocks wholly past the length (the tile mask a block-sparse kernel would
        be given) and mask the boundary tile in registers; the naive schedule reads a
        materialised boolean mask.
    block_mask : explicit block-sparse mask, bool ``[n_blocks_q, n_blocks_k]`` or
        ``[Bb, Hb, n_blocks_q, n_blocks_k]`` (Bb in {1, batch}, Hb in {1, heads}); its block shape
        is the schedule's (block_q, block_k).
    block_density : alternatively a density in (0, 1]: see :func:`density_block_mask`.
    block_mask_seed : seed of the density mask.
    dropout : dropout on (counter-based RNG in the tiled kernels: no mask in memory; the naive
        schedule writes and reads a 1-byte keep mask).
    pass_ : "fwd", "bwd" or "fwd+bwd".
    window_size : FlashAttention-2's sliding window ``(left, right)`` (`ioaware.block_info`:
        bottom-right aligned, -1 = unbounded side; None or ``(-1, -1)``: none). Tiled schedules
        visit only the K/V tiles the band meets and mask the tiles it cuts in registers; the
        naive schedule reads a materialised boolean mask. With ``causal`` (top-left) it needs
        ``seq_len_q == seq_len_k``; otherwise ``window_size=(left, 0)`` without ``causal`` is
        the bottom-right causal band.
    """

    batch: int = 1
    heads: int = 1
    seq_len_q: int = 1024
    head_dim: int = 64
    dtype: str = "fp16"
    causal: bool = False
    seq_len_k: int | None = None
    heads_kv: int | None = None
    key_lengths: tuple | None = None
    block_mask: object = None
    block_density: float | None = None
    block_mask_seed: int = 0
    dropout: bool = False
    pass_: str = "fwd"
    window_size: tuple | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq_len_q", "head_dim"):
            object.__setattr__(self, name, _posint(f"Workload.{name}", getattr(self, name)))
        if self.seq_len_k is None:
            object.__setattr__(self, "seq_len_k", self.seq_len_q)
        object.__setattr__(self, "seq_len_k", _posint("Workload.seq_len_k", self.seq_len_k))
        if self.heads_kv is None:
            object.__setattr__(self, "heads_kv", self.heads)
        object.__setattr__(self, "heads_kv", _posint("Workload.heads_kv", self.heads_kv))
        if self.heads % self.heads_kv:
            raise ValueError(f"Workload.heads ({self.heads}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"Workload.dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.pass_ not in PASSES:
            raise ValueError(f"Workload.pass_ must be one of {PASSES}, got {self.pass_!r}")
        if self.key_lengths is not None:
            kl = tuple(int(x) for x in self.key_lengths)
            if len(kl) != self.batch or any(x < 0 or x > self.seq_len_k for x in kl):
                raise ValueError(f"Workload.key_lengths must hold {self.batch} lengths in "
                                 f"[0, seq_len_k={self.seq_len_k}], got {self.key_lengths!r}")
            object.__setattr__(self, "key_lengths", kl)
        if self.block_mask is not None and self.block_density is not None:
            raise ValueError("give Workload.block_mask or Workload.block_density, not both")
        if self.block_mask is not None:
            bm = np.asarray(self.block_mask, dtype=bool)
            if bm.ndim == 2:
                bm = bm[None, None]
            if bm.ndim != 4 or bm.shape[0] not in (1, self.batch) or bm.shape[1] not in (1, self.heads):
                raise ValueError("Workload.block_mask must be [nq, nk] or [Bb, Hb, nq, nk] with "
                                 f"Bb in {{1, batch}}, Hb in {{1, heads}}; got shape {np.shape(self.block_mask)}")
            bm.setflags(write=False)
            object.__setattr__(self, "block_mask", bm)
        window = check_window_size(self.window_size, "Workload.window_size")
        object.__setattr__(self, "window_size", window)
        if window is not None and self.causal and self.seq_len_q != self.seq_len_k:
            raise ValueError(
                f"Workload.window_size={window} with causal=True and seq_len_q={self.seq_len_q} != "
                f"seq_len_k={self.seq_len_k} would mix two alignments (Workload.causal is top-left, the "
                f"window bottom-right); window_size=({window[0]}, 0) without causal is the bottom-right "
                f"causal band")
        if self.block_density is not None:
            dens = float(self.block_density)
            if not 0.0 < dens <= 1.0:
                raise ValueError(f"Workload.block_density must be in (0, 1], got {self.block_density!r}")
            object.__setattr__(self, "block_density", dens)

    # -- derived --------------------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.heads_kv

    @property
    def masked(self) -> bool:
        """Whether any elementwise mask applies (causal, a window, key padding or block-sparse)."""
        return (self.causal or self.window_size is not None or self.key_lengths is not None
                or self.block_mask is not None or self.block_density is not None)

    @property
    def block_sparse(self) -> bool:
        return self.block_mask is not None or self.block_density is not None

    @property
    def passes(self) -> tuple[str, ...]:
        return ("fwd", "bwd") if self.pass_ == "fwd+bwd" else (self.pass_,)

    def replace(self, **changes) -> "Workload":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return {"batch": self.batch, "heads": self.heads, "heads_kv": self.heads_kv,
                "seq_len_q": self.seq_len_q, "seq_len_k": self.seq_len_k, "head_dim": self.head_dim,
                "dtype": self.dtype, "causal": self.causal, "dropout": self.dropout,
                "pass": self.pass_, "key_lengths": list(self.key_lengths) if self.key_lengths else None,
                "window_size": list(self.window_size) if self.window_size else None,
                "block_density": self.block_density,
                "block_mask_shape": list(self.block_mask.shape) if self.block_mask is not None else None}

    @classmethod
    def from_record(cls, rec: dict) -> "Workload":
        """The workload of a results record (see :mod:`sim.results`)."""
        return cls(batch=rec["batch"], heads=rec["heads"], heads_kv=rec.get("heads_kv") or rec["heads"],
                   seq_len_q=rec["seq_len_q"], seq_len_k=rec.get("seq_len_k") or rec["seq_len_q"],
                   head_dim=rec["head_dim"], dtype=rec["dtype"], causal=bool(rec.get("causal", False)),
                   dropout=bool(rec.get("dropout", False)), pass_=rec["pass"],
                   window_size=tuple(rec["window_size"]) if rec.get("window_size") else None)


@dataclass(frozen=True)
class Schedule:
    """How attention is executed.

    name : "naive", "flash1" or "flash2".
    block_q, block_k : tile rows (Br) and columns (Bc); None = the schedule's default
        (:func:`resolve_blocks`). Ignored by "naive".
    num_warps : warps per thread block (occupancy model and the intra-SM warp-split count).
    fused_softmax : naive only — scale, mask and softmax in one elementwise pass (forward and
        backward) instead of separate ones.
    matmul_unit : "tensor" (tensor cores for fp16/bf16; fp32 on CUDA cores), "tf32" or "cuda"
        (everything on CUDA cores, as a kernel without MMA instructions runs).
    exp_flops : FLOPs counted per ``exp`` (default :data:`EXP_FLOPS` = 10, libdevice ``expf``
        on sm_90 as Nsight Compute counts it; 1 gives the textbook count).
    dq_mode : flash2 backward only. "atomic" (FlashAttention-2's): one dK/dV program per K
        block, dQ accumulated with float32 atomics into a zero-filled accumulator, then
        converted by a ``bwd.post`` pass — except for float32 inputs, where the float32
        accumulator *is* dQ and no post pass runs. "kernel": a dK/dV kernel parallel over K
        tiles (``bwd.main``: S, dP, dV, dK = 8 d FLOPs per score) and a dQ kernel parallel over Q
        tiles (``bwd.dq``: S, dP, dQ = 6 d per score) that re-reads K and V once per visited
        tile; no atomics, no accumulator.
    variant : naive only. None: the FlashAttention paper's Algorithm 0 (one scale/mask pass,
        softmax, optional dropout). "math": PyTorch's MATH SDPA backend as torch 2.11 runs it
        (everything in float32: half inputs upcast and outputs downcast; Q and K scaled by
        sqrt(scale) before the GEMM; causal as a float additive mask; ``_safe_softmax``'s three
        fully-masked-row passes). "eager": ``softmax(q @ k.T * scale).masked_fill(...) @ v`` in
        the input dtype (separate scale and ``masked_fill`` passes). The kernel lists are in
        :func:`sim.counts.naive_variant_kernels`; dense or causal workloads, no dropout, no GQA.
    micro_tile : flash2 only, our CUDA-core kernels (:class:`sim.tiles.TileConfig`): the
        per-thread register micro-tile ``(tm, tn)`` of the block_q x block_k tile of the forward
        and of the dQ kernel — ``(block_q // tm) x (block_k // tn)`` threads, each computing
        tm x tn scores. None (default): no micro-tile (tensor-core or textbook kernels).
    micro_tile_kv : the dK/dV kernel's ``(tk, tq)`` over its block_k x block_q tile (K rows
        first, as it computes S^T).
        With a micro-tile the FLOP terms are those the CUDA-core kernels execute
        (:func:`sim.counts.flop_costs`, ``simt_*``) and the shared-memory level is priced
        (:mod:`sim.smem`).
    delta_kernel : the flash2 backward's delta pre-pass, one of :data:`DELTA_KERNELS`.
    qo_segment_bytes : flash2 forward: bytes of one Q or O row that a warp's load or store
        instruction touches, when the kernel moves them in register fragments rather than
        whole rows (our tensor-core forward: 4 threads x 4 bytes = 16, see
        ``kernels/mma_fwd.py``); below a 32-byte sector the requests count whole
        sectors (a dQ kernel's dQ stores likewise). None (default): whole rows.
    registers_per_thread : registers per thread of the kernel (as ``ptxas -v`` reports them:
        `kernels.resources`) — with a micro-tile, of the forward and of the dQ kernel; without,
        of every tiled kernel of the schedule. Their register-file limit enters the occupancy
        model (:func:`occupancy`). None (default): registers not modelled.
    registers_per_thread_kv : likewise for the dK/dV kernel (phase ``bwd.main``); None: not
        modelled (without a micro-tile, ``registers_per_thread`` applies to it too).
    launch_head_group : flash2 only, the tensor-core kernels' launch order
        (`ioaware.launch_order`: 1 tiles first, 0 heads first, g > 1 heads first in groups of
        g heads; the forward and dQ kernels take their longest Q tiles first). The trace numbers
        the programs of ``fwd``, ``bwd.dq`` and ``bwd.main`` in that dispatch order, which only
        the L2 model's interleaving sees (byte counts and FLOPs do not depend on it). None
        (default): the trace's own order, (b, h, tile) with tile ascending.
    """

    name: str = "flash2"
    block_q: int | None = None
    block_k: int | None = None
    num_warps: int = 4
    fused_softmax: bool = False
    matmul_unit: str = "tensor"
    exp_flops: int = EXP_FLOPS
    dq_mode: str = "atomic"
    variant: str | None = None
    micro_tile: tuple | None = None
    micro_tile_kv: tuple | None = None
    delta_kernel: str = "warp"
    qo_segment_bytes: int | None = None
    registers_per_thread: int | None = None
    registers_per_thread_kv: int | None = None
    launch_head_group: int | None = None

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ValueError(f"Schedule.name must be one of {SCHEDULES}, got {self.name!r}")
        for nm in ("block_q", "block_k"):
            v = getattr(self, nm)
            if v is not None:
                object.__setattr__(self, nm, _posint(f"Schedule.{nm}", v))
        _posint("Schedule.num_warps", self.num_warps)
        if self.matmul_unit not in ("tensor", "tf32", "cuda"):
            raise ValueError(f"Schedule.matmul_unit must be 'tensor', 'tf32' or 'cuda', got {self.matmul_unit!r}")
        if isinstance(self.exp_flops, bool) or not isinstance(self.exp_flops, (int, np.integer)) or self.exp_flops < 0:
            raise ValueError(f"Schedule.exp_flops must be a non-negative integer, got {self.exp_flops!r}")
        object.__setattr__(self, "exp_flops", int(self.exp_flops))
        if self.dq_mode not in DQ_MODES:
            raise ValueError(f"Schedule.dq_mode must be one of {DQ_MODES}, got {self.dq_mode!r}")
        if self.variant is not None and (self.variant not in NAIVE_VARIANTS or self.name != "naive"):
            raise ValueError(f"Schedule.variant must be None or one of {NAIVE_VARIANTS} (schedule "
                             f"'naive' only), got {self.variant!r} for {self.name!r}")
        for nm in ("micro_tile", "micro_tile_kv"):
            v = getattr(self, nm)
            if v is None:
                continue
            if self.name != "flash2":
                raise ValueError(f"Schedule.{nm} applies to schedule 'flash2' only, got {self.name!r}")
            if (not isinstance(v, (tuple, list)) or len(v) != 2
                    or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in v)):
                raise ValueError(f"Schedule.{nm} must be a pair of positive integers (tm, tn), got {v!r}")
            object.__setattr__(self, nm, (int(v[0]), int(v[1])))
        if self.qo_segment_bytes is not None:
            object.__setattr__(self, "qo_segment_bytes", _posint("Schedule.qo_segment_bytes",
                                                                 self.qo_segment_bytes))
        for nm in ("registers_per_thread", "registers_per_thread_kv"):
            if getattr(self, nm) is not None:
                object.__setattr__(self, nm, _posint(f"Schedule.{nm}", getattr(self, nm)))
        if self.launch_head_group is not None:
            v = self.launch_head_group
            if (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0
                    or self.name != "flash2"):
                raise ValueError(f"Schedule.launch_head_group must be None or an integer >= 0 "
                                 f"(schedule 'flash2' only), got {v!r} for {self.name!r}")
            object.__setattr__(self, "launch_head_group", int(v))
        if self.delta_kernel not in DELTA_KERNELS:
            raise ValueError(f"Schedule.delta_kernel must be one of {DELTA_KERNELS}, got {self.delta_kernel!r}")

    @property
    def tiled(self) -> bool:
        return self.name != "naive"

    @property
    def simt(self) -> bool:
        """Whether the schedule describes our CUDA-core kernels (a register micro-tile is given):
        then the FLOP terms are those the kernels execute and the shared-memory level is priced."""
        return self.micro_tile is not None or self.micro_tile_kv is not None

    def threads_per_row(self, block_k) -> int:
        """Threads sharing one query row of the block_q x block_k tile (``block_k // tn``; 1
        without a micro-tile): each recomputes that row's softmax bookkeeping."""
        if self.micro_tile is None or block_k is None:
            return 1
        return max(1, int(block_k) // self.micro_tile[1])

    def kv_threads_per_row(self, block_q) -> int:
        """Threads sharing one key row of the dK/dV kernel's block_k x block_q tile
        (``block_q // tq``; 1 without ``micro_tile_kv``)."""
        if self.micro_tile_kv is None or block_q is None:
            return 1
        return max(1, int(block_q) // self.micro_tile_kv[1])

    def to_dict(self) -> dict:
        return {"name": self.name, "block_q": self.block_q, "block_k": self.block_k,
                "num_warps": self.num_warps, "fused_softmax": self.fused_softmax,
                "matmul_unit": self.matmul_unit, "exp_flops": self.exp_flops,
                "dq_mode": self.dq_mode, "variant": self.variant,
                "micro_tile": list(self.micro_tile) if self.micro_tile else None,
                "micro_tile_kv": list(self.micro_tile_kv) if self.micro_tile_kv else None,
                "delta_kernel": self.delta_kernel, "qo_segment_bytes": self.qo_segment_bytes,
                "launch_head_group": self.launch_head_group}


# -- block masks --------------------------------------------------------------------------------
def density_block_mask(n_blocks_q: int, n_blocks_k: int, density: float, seed: int = 0) -> np.ndarray:
    """The deterministic block mask of a given density.

    Exactly ``round(density * n_blocks_q * n_blocks_k)`` tiles (at least 1) are kept, chosen as
    the first ones of ``numpy.random.default_rng(seed).permutation`` of the flattened tile grid.
    The same mask is used for every batch element and head. Block shape: the schedule's
    (block_q, block_k), so the mask depends on the block sizes.
    """
    total = n_blocks_q * n_blocks_k
    keep = max(1, int(round(density * total)))
    flat = np.zeros(total, dtype=bool)
    flat[np.random.default_rng(seed).permutation(total)[:keep]] = True
    return flat.reshape(n_blocks_q, n_blocks_k)


def block_infos(w: Workload, block_q: int, block_k: int) -> list[tuple[int, BlockInfo, int | None, list]]:
    """The distinct per-(batch, head) tile schedules of ``w``.

    Returns ``[(multiplicity, BlockInfo, key_len, [(b, h), ...]), ...]`` covering every
    (b, h) once. ``key_len`` is the key-padding length (None when no padding applies).
    """
    nq, nk = cdiv(w.seq_len_q, block_q), cdiv(w.seq_len_k, block_k)
    bm = None
    if w.block_mask is not None:
        bm = w.block_mask
        if bm.shape[2:] != (nq, nk):
            raise ValueError(f"Workload.block_mask has {bm.shape[2:]} blocks but block_q={block_q}, "
                             f"block_k={block_k} give (n_blocks_q, n_blocks_k) = ({nq}, {nk})")
    elif w.block_density is not None:
        bm = density_block_mask(nq, nk, w.block_density, w.block_mask_seed)[None, None]
    groups: dict = {}
    for b in range(w.batch):
        key_len = None
        if w.key_lengths is not None and w.key_lengths[b] < w.seq_len_k:
            key_len = w.key_lengths[b]
        for h in range(w.heads):
            tile_mask = None
            if bm is not None:
                tile_mask = bm[b if bm.shape[0] > 1 else 0, h if bm.shape[1] > 1 else 0]
            if key_len is not None:
                kmask = (np.arange(nk) * block_k < key_len)[None, :]
                tile_mask = kmask.repeat(nq, 0) if tile_mask is None else tile_mask & kmask
            key = (key_len, None if tile_mask is None else tile_mask.tobytes())
            if key not in groups:
                bi = BlockInfo.with_block_mask(w.seq_len_q, w.seq_len_k, block_q, block_k,
                                               w.causal, tile_mask, window_size=w.window_size)
                groups[key] = [0, bi, key_len, []]
            groups[key][0] += 1
            groups[key][3].append((b, h))
    return [tuple(g) for g in groups.values()]


# -- block sizes and on-chip footprint ---------------------------------------------------------
def sram_bytes_per_block(schedule_name: str, pass_name: str, block_q, block_k, head_dim, dtype_bytes):
    """Shared-memory footprint (bytes) of one thread block; works on numpy arrays.

    flash1 fwd: Q_i, O_i, K_j, V_j tiles and (l_i, m_i) — the four blocks of the paper's
    ``Bc = ceil(M / 4d)`` argument. flash2 fwd: Q, K, V tiles (O accumulates in registers).
    flash1 bwd: Q, O, dO, dQ, K, V tiles, l, m, fp32 dK/dV accumulators (on SRAM as in
    Algorithm 4) and one (Br x Bc) P/dS tile for the transposed matmuls. flash2 bwd: Q, dO, K, V
    tiles, lse and D, and the P/dS tile (dK/dV accumulate in registers). S/P of the forward live
    in registers. naive: 0 (library GEMMs; not modelled).
    """
    bq, bk, d, e, f = block_q, block_k, head_dim, dtype_bytes, STAT_BYTES
    if schedule_name == "naive":
        return 0 * d
    if schedule_name == "flash1":
        if pass_name == "fwd":
            return e * d * (2 * bq + 2 * bk) + 2 * bq * f
        return e * d * (4 * bq + 2 * bk) + 2 * bq * f + 2 * bk * d * f + bq * bk * e
    if pass_name == "fwd":
        return e * d * (bq + 2 * bk)
    return e * d * (2 * bq + 2 * bk) + 2 * bq * f + bq * bk * e


def _footprint(schedule: str, passes, bq, bk, d, e):
    return max(sram_bytes_per_block(schedule, p, bq, bk, d, e) for p in passes)


def resolve_blocks(w: Workload, schedule: Schedule, profile) -> tuple[int | None, int | None]:
    """The (block_q, block_k) a schedule uses on a profile.

    naive: (None, None). flash1: the paper's ``Bc = ceil(M / 4d)``, ``Br = min(Bc, d)`` with M
    the shared memory per block in elements of the dtype; when the footprint of a requested pass
    (the backward's is larger than the paper's four blocks) does not fit, M is shrunk by 1/8
    steps until it does. flash2: (128, 128) for d <= 64; for d > 64 (128, 64) forward and
    (64, 128) when the backward is requested (FlashAttention-2's defaults) — halved (block_k first) until the
    footprint of every requested pass fits ``smem_bytes_per_block``. Explicit values win.
    """
    if schedule.name == "naive":
        return None, None
    d, e = w.head_dim, w.dtype_bytes
    if schedule.name == "flash1":
        m_elems = profile.smem_bytes_per_block // e
        while True:
            bc = cdiv(m_elems, 4 * d)
            br = min(bc, d)
            bq, bk = schedule.block_q or br, schedule.block_k or bc
            # the backward needs more than the paper's four blocks: shrink M until it fits
            if (_footprint("flash1", w.passes, bq, bk, d, e) <= profile.smem_bytes_per_block
                    or m_elems <= 4 * d or (schedule.block_q and schedule.block_k)):
                return bq, bk
            m_elems = m_elems * 7 // 8
    if d <= 64:
        bq, bk = 128, 128
    else:
        bq, bk = (128, 64) if w.pass_ == "fwd" else (64, 128)
    bq, bk = schedule.block_q or bq, schedule.block_k or bk
    while _footprint("flash2", w.passes, bq, bk, d, e) > profile.smem_bytes_per_block:
        if schedule.block_k is None and bk > 16 and bk >= bq:
            bk //= 2
        elif schedule.block_q is None and bq > 16:
            bq //= 2
        elif schedule.block_k is None and bk > 16:
            bk //= 2
        else:
            break
    return bq, bk


def register_limited_blocks(profile, registers_per_thread: int, num_warps: int) -> int | None:
    """Resident thread blocks per SM that the register file allows, as CUDA's occupancy
    calculator computes it (``cuda_occupancy.h``, ``cudaOccMaxBlocksPerSMRegsLimit``): a warp
    is allocated ``registers_per_thread x 32`` registers rounded up to the profile's
    ``register_alloc_unit``; each of the ``register_sub_partitions`` holds
    ``floor(registers_per_sm / sub_partitions / per-warp)`` warps; a block of ``num_warps``
    warps must fit the per-block file (``registers_per_sm``, its warps rounded up to the
    sub-partitions) and at most ``max_registers_per_thread``. None when the profile has no
    register figures (not modelled); 0 = does not fit."""
    if isinstance(registers_per_thread, bool) or not isinstance(registers_per_thread, (int, np.integer)) \
            or registers_per_thread < 1:
        raise ValueError(f"registers_per_thread must be a positive integer, got {registers_per_thread!r}")
    if isinstance(num_warps, bool) or not isinstance(num_warps, (int, np.integer)) or num_warps < 1:
        raise ValueError(f"num_warps must be a positive integer, got {num_warps!r}")
    if not getattr(profile, "models_registers", False):
        return None
    regs, warps = int(registers_per_thread), int(num_warps)
    unit, parts = profile.register_alloc_unit, profile.register_sub_partitions
    per_warp = -(-regs * 32 // unit) * unit
    per_block_assumed = per_warp * (-(-warps // parts) * parts)
    if regs > profile.max_registers_per_thread or per_block_assumed > profile.registers_per_sm:
        return 0
    warps_per_sm = (profile.registers_per_sm // parts // per_warp) * parts
    return int(warps_per_sm // warps)


def occupancy(profile, sram_bytes: int, num_warps: int, registers_per_thread: int | None = None) -> int:
    """Resident thread blocks per SM: the occupancy model.

    ``min(max_blocks_per_sm, smem_bytes_per_sm // (sram_bytes + 1 KiB reserved per block),
    max_threads_per_sm // (32 * num_warps), register limit)``; the register limit
    (:func:`register_limited_blocks`) applies when ``registers_per_thread`` is given and the
    profile has its register-file figures (None: registers not modelled). 0 = does not fit.
    """
    if sram_bytes > profile.smem_bytes_per_block:
        return 0
    by_smem = profile.smem_bytes_per_sm // (int(sram_bytes) + RESERVED_SMEM_PER_BLOCK)
    by_threads = profile.max_threads_per_sm // (32 * num_warps)
    blocks = int(max(0, min(profile.max_blocks_per_sm, by_smem, by_threads)))
    if registers_per_thread is not None:
        by_regs = register_limited_blocks(profile, registers_per_thread, num_warps)
        if by_regs is not None:
            blocks = min(blocks, by_regs)
    return blocks
