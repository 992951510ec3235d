"""The plan of the Hopper forward (`kernels.wgmma_fwd`, family ``wgmma``), and the layout facts its
launcher reads: tile choices and defaults, threads, dynamic shared memory, the registers ptxas
gives each configuration.

Owns :func:`wgmma_forward_plan`, :func:`wgmma_forward_configs` and the layout functions
(:func:`wgmma_default_blocks`, :func:`wgmma_threads`, :func:`wgmma_smem_bytes`,
:func:`wgmma_consumer_warpgroups`). The kernel is FlashAttention-3's structure, kept simple: a
work item per (Q tile of ``block_q`` = 64, 128 or 192 rows, batch * head), one program per item
or, persistent (``KernelPlan.persistent``), one per SM walking its items; one consumer
warpgroup (128 threads) per 64 query rows and one producer warp (a producer warpgroup with
``overlap`` and two or three consumer warpgroups); the producer loads Q once per item and
streams K and V tiles of ``block_k`` keys
through two (``overlap``: three) shared-memory stages by TMA (full/empty mbarriers); each
consumer warpgroup computes S = Q K^T with ``wgmma`` from shared memory, the online softmax in
registers, and O += P V with P from registers and V from shared memory (MN-major).

What the plan counts, from the kernel's code (`kernels.wgmma_fwd`):

* **Which tiles**: `tile_counts`, i.e. `BlockInfo`'s (causal and sliding-window skipping).
* **Products** on whole tiles, ``4 d block_q block_k`` FLOPs per visited tile (rows past the
  problem and zero-filled keys are multiplied too), on the unit ``wgmma.f16`` / ``wgmma.bf16``.
* **Element-wise FP32 and MUFU**: the same softmax as the ``mma`` forward (the constants of
  `sim.plans.tensor_core_fwd`): per score one FFMA, one ``ex2`` and one FADD; per row per
  visited tile, on each of the 4 threads of a quad, FMUL + FADD + FFMA and one ``ex2``, and
  ``d`` FMUL to rescale O; per row at the end the quad's two FADD shuffles and ``1 / l``
  (each of its 4 threads), then ``d`` FMUL and the logsumexp for rows inside the problem.
* **Bytes**, all by TMA boxes (whole rows, counted as moved, ``Access.how = "tma"``) except
  the output: Q once per program (boxes of 64 rows; a box starting past the last query is not
  issued, rows past it inside a box are zero-filled without a read); K and V once per visited
  tile, the keys of the tile inside the problem; O stored once per row as 4-byte words of the
  accumulator fragment (a warp instruction touches 16 bytes of a row: ``"fragment"``, as the
  ``mma`` forward); the float32 logsumexp once per row; the tile schedule's CSR entries, read
  warp-uniformly by every warp (start and stop once, the tile index once per visited tile).
  The three 128-byte tensor maps, read by the TMA unit, are not counted. Nsight Compute's LSU
  counters (``l1tex__t_bytes_pipe_lsu_mem_global_op_ld``) do not see the TMA loads, so
  `sim.compare` scores the LSU counters against the other accesses only (schedule, O, lse).
* **Shared memory moved**: the TMA destinations (Q boxes, K and V tiles). The ``wgmma``
  operand reads are not priced, as in `sim.plans.flash3` (the "smem" level prices load/store
  traffic).
* **Overlap** (``KernelPlan.serial``): the overlap model of `sim.plans.flash3`
  (:func:`~sim.plans.flash3.overlap_serial`) for this kernel's structure: a producer warp
  loading ahead through its stages (the loads overlap the compute), and consumer warpgroups
  that each run S = Q K^T, the softmax and O += P V in turn: the products and the softmax add,
  ``t = M + S`` per program; the programs resident on an SM (when shared memory and registers
  let more than one in) run their chains independently (``serial_per_program``: ``max(M, S,
  (M + S) / R)``).
* **Schedules** (both the defaults with two consumer warpgroups, :data:`WGMMA_PINGPONG_DEFAULT`,
  :data:`WGMMA_OVERLAP_DEFAULT` and the FP8 ones): ``pingpong``, the warpgroups take turns
  issuing their products (named barriers); ``overlap``, a warpgroup issues tile i's S = Q K^T
  and tile i - 1's O += P V together and runs tile i's softmax while the second is on the tensor
  cores (three stages; with two or three consumer warpgroups a producer warpgroup whose
  registers go to the consumers by ``setmaxnreg``, :func:`overlap_registers`); ``persistent``
  (:data:`WGMMA_PERSISTENT_DEFAULT`), one program per SM. The plan declares them
  (``config["pingpong"]``, ``config["overlap"]``, ``config["stages"]``, ``config["persistent"]``;
  threads and shared memory follow), which the launcher builds the kernel and its grid from, and
  prices none: the overlap
  model's (`overlap_serial`) are FlashAttention-3's, each softmax hidden whole under products,
  which prices far more than what was measured (docs/model.md, *FlashAttention-3 on
  Hopper*).
"""
from __future__ import annotations

from ..plan import Access, KernelPlan, Matmul, Plan
from ..workload import STAT_BYTES, Workload
from .flash3 import REGISTERS_PER_SM, overlap_serial
from .tensor_core_fwd import (FRAGMENT_ROW_BYTES, SCHEDULE_ENTRY_BYTES, SMEM_LIMIT_BYTES,
                              forward_tensor_bytes, softmax_work, tile_counts)

__all__ = ["wgmma_forward_plan", "wgmma_forward_configs", "wgmma_fp8_forward_plan",
           "FP8_KERNEL_NAME", "FP8_TRANSPOSE_NAME", "FP8_HEAD_DIM", "FP8_BLOCK_K",
           "FP8_DEFAULT_BLOCK_Q", "FP8_TRANSPOSE_TILE", "FP8_TRANSPOSE_THREADS",
           "fp8_transpose_keys", "fp8_transpose_grid", "wgmma_default_blocks",
           "wgmma_threads", "wgmma_smem_bytes", "wgmma_consumer_warpgroups", "WGMMA_HEAD_DIMS",
           "WGMMA_BLOCK_Q_CHOICES", "WGMMA_BLOCK_K_CHOICES", "WGMMA_REGISTERS", "WGMMA_SPILLING",
           "WGMMA_FWD_WAITS_PER_TILE", "WGMMA_PRODUCER_SPILL_BYTES",
           "ROWS_PER_WARPGROUP", "WARPGROUP_THREADS", "PRODUCER_THREADS", "ALIGN_SLACK_BYTES",
           "BARRIER_BYTES", "BOX_COLUMNS", "KERNEL_NAME", "WGMMA_PINGPONG_DEFAULT",
           "FP8_PINGPONG_DEFAULT", "WGMMA_THREE_WARPGROUPS_FROM", "schedule_default_blocks", "schedule_refusal", "smem_refusal", "producer_warpgroup", "OVERLAP_REGISTERS",
           "OVERLAP_REGISTERS_BY_CONSUMERS", "overlap_registers", "FP8_BLOCK_Q_CHOICES",
           "WGMMA_OVERLAP_DEFAULT", "FP8_OVERLAP_DEFAULT", "WGMMA_PERSISTENT_DEFAULT", "SERIAL_SCHEDULE", "record_schedule",
           "SCHEDULES", "schedule_name"]

KERNEL_NAME = "flash_wgmma_fwd"
#: The FP8 forward (`kernels.wgmma_fwd.forward_fp8`): V transposed and key-permuted first, then
#: the attention kernel on e4m3 operands.
FP8_KERNEL_NAME = "flash_wgmma_fp8_fwd"
FP8_TRANSPOSE_NAME = "fp8_v_transpose"
FP8_HEAD_DIM = 128          # a 128-byte swizzled row is 128 e4m3 elements
FP8_BLOCK_K = 128           # a V^T row of block_k keys is one 128-byte swizzle row
FP8_DEFAULT_BLOCK_Q = 128   # two consumer warpgroups
FP8_TRANSPOSE_TILE = 32     # keys per program of the transpose (all d columns)
FP8_TRANSPOSE_THREADS = 256
WGMMA_HEAD_DIMS = (64, 128)
WGMMA_BLOCK_Q_CHOICES = (128, 64, 192)   # two, one or three consumer warpgroups
#: The FP8 forward's choices: two or one consumer warpgroups.
FP8_BLOCK_Q_CHOICES = (128, 64)
WGMMA_BLOCK_K_CHOICES = (128, 64)     # keys per K/V stage: two or one n64 score blocks
#: Query rows of one consumer warpgroup (the M of ``wgmma.m64nNk16``), its threads.
ROWS_PER_WARPGROUP = 64
WARPGROUP_THREADS = 128
#: The producer: one warp (its lane 0 issues every TMA copy).
PRODUCER_THREADS = 32
#: Dynamic shared memory is re-aligned in the kernel to 1024 bytes (the 128-byte swizzle's
#: repeat), which may skip up to this many bytes; then Q, two K/V stages and the mbarriers.
ALIGN_SLACK_BYTES = 1024
BARRIER_BYTES = 64      # q_full, full[stages], empty[stages], q_empty: 8 bytes each (3 stages)
#: Columns of one TMA box (64 16-bit elements = the 128-byte swizzle width): a d = 128 row is
#: two boxes.
BOX_COLUMNS = 64
#: Bytes of one row of a TMA box: the 128-byte swizzle width.
SWIZZLE_ROW = 128
#: ``wgmma`` commit groups a consumer warpgroup waits for per visited tile: S = Q K^T's and
#: O += P V's, in every schedule (with ``overlap`` the first tile's S and the last tile's
#: O += P V are peeled off the loop; tests/test_wgmma_fwd.py counts them in the PTX). The
#: "wait" level of `sim.plan` (0 without a measured wait latency).
WGMMA_FWD_WAITS_PER_TILE = 2
#: Registers per thread that ptxas 13.0 (``-arch=sm_90a``) gives each configuration
#: (head_dim, block_q, block_k) of the serial kernel (float16; bfloat16 within a few), with
#: ``launch_bounds=(threads, 1)``; checked against ptxas by tests/test_wgmma_fwd.py where
#: ptxas is found. None: not measured. (These kernels walk one work item each: built without
#: the persistent loop, as they were before it, within 6 registers.)
WGMMA_REGISTERS: dict = {(64, 128, 128): 165, (64, 128, 64): 114, (64, 64, 128): 168,
                         (64, 64, 64): 114, (128, 128, 128): 166, (128, 128, 64): 157,
                         (128, 64, 128): 205, (128, 64, 64): 159}
#: Configurations ptxas makes spill (the serial kernel; the default schedule's consumers get
#: 232 or 160 registers, `overlap_registers`): none since the products are issued as wide as
#: their tiles (`kernels.hopper.product_blocks`; before, d = 128 with 128 x 128 tiles spilled
#: about 108 bytes, with 288 threads held to 168 registers). Checked by tests/test_wgmma_fwd.py
#: where ptxas is found.
WGMMA_SPILLING: tuple = ()
#: Bytes the producer of three consumer warpgroups may spill (its 32 registers, `overlap_registers`,
#: hold the loop over work items and the TMA coordinates; ptxas 13.0: 8-28 bytes): one thread's
#: stores to L1, off the consumers' path. Checked by tests/test_wgmma_fwd.py where ptxas is found.
WGMMA_PRODUCER_SPILL_BYTES = 32
#: Whether two consumer warpgroups take turns issuing their products by default (both forwards;
#: with one consumer warpgroup there is no turn): alone it buys little (0.98-1.03x for float16,
#: 1.03-1.12x for FP8), with the intra-warpgroup overlap below it is the fastest schedule
#: (``python -m benchmarks fp8 --schedules``, results/fp8_h200_2026-11-28.json; docs/kernels.md,
#: *Schedules* and the design note *Hopper forward: FlashAttention-3's schedule*).
WGMMA_PINGPONG_DEFAULT = True
FP8_PINGPONG_DEFAULT = True
#: Registers per thread with a producer warpgroup: ``setmaxnreg`` lowers the producer's to the
#: first and raises the consumers' to the second (FlashAttention-3's 24 / 240 for two consumer
#: warpgroups: 128 x 24 + 256 x 240 <= 65,536). The Hopper backward's split
#: (`sim.plans.wgmma_bwd.WGMMA_BWD_REGISTERS`); the forward's is `overlap_registers`.
OVERLAP_REGISTERS = (24, 240)
#: The forward's split per number of consumer warpgroups (`overlap_registers`): with two,
#: 40 / 232 (128 x 40 + 256 x 232 <= 65,536: the persistent producer's loop over work items
#: spills at 24, the consumers need no more than 232); with three, FlashAttention-3's 32 / 160
#: (128 x 32 + 384 x 160 = 65,536).
OVERLAP_REGISTERS_BY_CONSUMERS = {2: (40, 232), 3: (32, 160)}
#: Whether a consumer warpgroup runs tile i's softmax while its O += P V of tile i - 1 is on the
#: tensor cores (FlashAttention-3's intra-warpgroup overlap: three K/V stages, a producer
#: warpgroup with two consumer warpgroups) by default, where there are two consumer warpgroups
#: (with one, measured slower than the serial kernel).
WGMMA_OVERLAP_DEFAULT = True
FP8_OVERLAP_DEFAULT = True
#: Whether the kernel is launched persistent (`KernelPlan.persistent`: one program per SM
#: walking the work items) by default, where one program fills an SM (a producer warpgroup:
#: `producer_warpgroup`), so that a work item's Q and first K/V tiles load while the item
#: before finishes its products and stores (FlashAttention-3's persistent scheduler, static).
WGMMA_PERSISTENT_DEFAULT = True


#: At d = 64, from this many queries on the default tile is 192 x 128 (three consumer
#: warpgroups, persistent), below it 128 x 128 (`wgmma_default_blocks`).
WGMMA_THREE_WARPGROUPS_FROM = 2048


def wgmma_default_blocks(head_dim: int, causal: bool = False,
                         seq_len_q: int | None = None) -> tuple[int, int]:
    """Default (block_q, block_k), run with the default schedule (:data:`WGMMA_PINGPONG_DEFAULT`,
    :data:`WGMMA_OVERLAP_DEFAULT`, :data:`WGMMA_PERSISTENT_DEFAULT`): 128 x 128 (two consumer
    warpgroups taking turns, each overlapping its softmax with its O += P V), except at d = 64
    from :data:`WGMMA_THREE_WARPGROUPS_FROM` queries on (``seq_len_q`` None: below it), where
    192 x 128 (three consumer warpgroups, each overlapping) is faster: on an H200, persistent
    both, 4-15 % at N 2048-8192 on the benchmark's shapes, 8 % slower at N = 1024 causal
    (``python -m benchmarks fp8 --schedules --head-dims 64,128 --timing device``; docs/kernels.md,
    design notes). Before three warpgroups: 128 x 128 at every N and head dim
    (results/fp8_h200_2026-11-28.json: the fastest serial or overlapped tile at every N at d =
    128 and from N = 2048 at d = 64); before the overlap, serial kernels: 128 x 64 at d = 128,
    64 x 128 at d = 64 (128 x 128 causal), from the H100's ``pick --family wgmma``
    (results/pick_wgmma_h100_2026-11-24.json)."""
    if head_dim == 64 and seq_len_q is not None and seq_len_q >= WGMMA_THREE_WARPGROUPS_FROM:
        return (192, 128)
    return (128, 128)


def schedule_default_blocks(head_dim: int, causal: bool = False, seq_len_q: int | None = None,
                            pingpong=None, overlap=None) -> tuple[int, int]:
    """`wgmma_default_blocks`, unless a schedule asked for (``pingpong`` True, ``overlap``
    False) cannot run at its ``block_q`` (`schedule_refusal`: three consumer warpgroups take
    neither): then 128 x 128, the default tile of two consumer warpgroups. What the plan and
    the kernel's `tiles` take when no tile is given."""
    tiles = wgmma_default_blocks(head_dim, causal, seq_len_q)
    if schedule_refusal(pingpong, overlap, tiles[0]):
        return (128, 128)
    return tiles


def wgmma_consumer_warpgroups(block_q: int) -> int:
    """Consumer warpgroups of one program: one per 64 query rows."""
    return block_q // ROWS_PER_WARPGROUP


def wgmma_threads(block_q: int, overlap: bool = False) -> int:
    """Threads of one program: the consumer warpgroups, then the producer warp (with
    ``overlap`` and two or three consumer warpgroups, a producer warpgroup, whose registers go
    to the consumers: :func:`overlap_registers`)."""
    producer = WARPGROUP_THREADS if producer_warpgroup(block_q, overlap) else PRODUCER_THREADS
    return WARPGROUP_THREADS * wgmma_consumer_warpgroups(block_q) + producer


def producer_warpgroup(block_q: int, overlap: bool) -> bool:
    """Whether the producer is a whole warpgroup that hands its registers to the consumers
    (``setmaxnreg``): with ``overlap`` and two or three consumer warpgroups, whose softmax of
    one tile and O += P V of the one before need more than the 168 registers a thread of 288
    gets (152 of 416)."""
    return bool(overlap) and wgmma_consumer_warpgroups(block_q) >= 2


def overlap_registers(block_q: int) -> tuple[int, int]:
    """``(producer, consumer)`` registers per thread after ``setmaxnreg`` with a producer
    warpgroup (`producer_warpgroup`): :data:`OVERLAP_REGISTERS_BY_CONSUMERS` for ``block_q``'s
    consumer warpgroups."""
    return OVERLAP_REGISTERS_BY_CONSUMERS[wgmma_consumer_warpgroups(block_q)]


def wgmma_smem_bytes(head_dim: int, block_q: int, block_k: int, dtype_bytes: int = 2,
                     stages: int = 2) -> int:
    """Dynamic shared memory of one program in bytes: the alignment slack, Q (block_q x d),
    ``stages`` stages of K and V (block_k x d each) and the mbarriers."""
    return (ALIGN_SLACK_BYTES + block_q * head_dim * dtype_bytes
            + 2 * stages * block_k * head_dim * dtype_bytes + BARRIER_BYTES)


#: The wgmma forwards' schedules by name: (pingpong, overlap). ``python -m benchmarks fp8
#: --schedules`` times them all; ``python -m sim plan --schedule NAME`` prices one.
SCHEDULES = {"serial": (False, False), "pingpong": (True, False), "overlap": (False, True),
             "pingpong+overlap": (True, True)}


#: The schedule a results record of the wgmma forward ran when it names none: every record
#: measured before the schedules existed (before 20d3364) ran the serial kernel, and every
#: record before the persistent launch a program per work item.
SERIAL_SCHEDULE = {"pingpong": False, "overlap": False, "persistent": False}


def record_schedule(rec: dict) -> dict:
    """``{"pingpong", "overlap", "persistent"}`` a wgmma forward record ran: its own keys, else
    :data:`SERIAL_SCHEDULE`'s (a record that names none predates them). Also the schedule of a
    plan's config (which names them all): what a measuring command records."""
    return {k: bool(rec.get(k, v)) for k, v in SERIAL_SCHEDULE.items()}


def schedule_name(config: dict) -> str:
    """The name in :data:`SCHEDULES` of a plan config's (or record's) schedule."""
    s = record_schedule(config)
    return next(n for n, v in SCHEDULES.items() if v == (s["pingpong"], s["overlap"]))


def schedule_refusal(pingpong, overlap, block_q: int) -> str | None:
    """Why the kernel cannot run a schedule at ``block_q``, naming the argument, or None:
    ping-pong needs two consumer warpgroups (``block_q`` = 128); three (``block_q`` = 192) run
    only with ``overlap`` (its producer warpgroup hands them registers: 160 each; without it
    416 threads get 128 and d = 128 spills). ``None`` flags are the defaults, which are legal.
    The one rule of the plan, the family's ``supports`` and the kernel builder."""
    consumers = wgmma_consumer_warpgroups(block_q)
    if pingpong and consumers != 2:
        return f"pingpong needs two consumer warpgroups (block_q=128), got block_q={block_q}"
    if overlap is not None and not overlap and consumers == 3:
        return ("block_q=192 (three consumer warpgroups) runs only with overlap=True (or None), "
                "got overlap=False")
    return None


def smem_refusal(head_dim: int, block_q: int, block_k: int, overlap=None) -> str | None:
    """Why a configuration's shared memory does not fit (`SMEM_LIMIT_BYTES`), naming the
    tiles, or None; ``overlap`` None is the default schedule (three stages where it overlaps,
    else two). The one rule of `wgmma_forward_configs`, the plan and the family's
    ``supports``."""
    overlap = _schedule_flag("overlap", overlap, block_q, WGMMA_OVERLAP_DEFAULT)
    stages = 3 if overlap else 2
    need = wgmma_smem_bytes(head_dim, block_q, block_k, 2, stages)
    if need > SMEM_LIMIT_BYTES:
        return (f"block_q={block_q}, block_k={block_k} at head_dim={head_dim} needs {need} bytes "
                f"of shared memory with {stages} stages, over {SMEM_LIMIT_BYTES}")
    return None


def _schedule_flag(name: str, value, block_q: int, default: bool) -> bool:
    """A schedule flag a plan declares (``pingpong``, ``overlap``): ``value`` (None: ``default``
    where there are two consumer warpgroups, for ``overlap`` also three); anything but a bool
    or None is a ValueError naming ``name``."""
    if value is None:
        w = wgmma_consumer_warpgroups(block_q)
        return default and (w == 2 or (name == "overlap" and w == 3))
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None, got {value!r}")
    return value


def _pingpong(pingpong, overlap: bool, block_q: int, default: bool) -> bool:
    """The ping-pong flag a plan declares (`_schedule_flag`); a schedule `schedule_refusal`
    refuses (with the resolved ``overlap``) is a ValueError naming the argument."""
    pingpong = _schedule_flag("pingpong", pingpong, block_q, default)
    why = schedule_refusal(pingpong, overlap, block_q)
    if why:
        raise ValueError(why)
    return pingpong


def _persistent(persistent, block_q: int, overlap: bool) -> bool:
    """The persistent flag a plan declares: ``persistent`` (None: :data:`WGMMA_PERSISTENT_DEFAULT`
    where a program fills its SM, a producer warpgroup's schedule); True elsewhere, or anything
    but a bool or None, is a ValueError naming the argument."""
    fills = producer_warpgroup(block_q, overlap)
    if persistent is None:
        return WGMMA_PERSISTENT_DEFAULT and fills
    if not isinstance(persistent, bool):
        raise ValueError(f"persistent must be True, False or None, got {persistent!r}")
    if persistent and not fills:
        raise ValueError(f"persistent=True needs one program per SM: the overlap with two or three "
                         f"consumer warpgroups (block_q 128 or 192), got block_q={block_q}, "
                         f"overlap={overlap}")
    return persistent


def _registers(d: int, bq: int, bk: int, overlap: bool, registers):
    """Registers per thread at launch: ``registers`` if given; with a producer warpgroup the
    launch's even share (``setmaxnreg`` moves them after), else :data:`WGMMA_REGISTERS`'."""
    if registers is not None:
        return registers
    if producer_warpgroup(bq, overlap):
        return REGISTERS_PER_SM // wgmma_threads(bq, overlap) // 8 * 8
    return None if overlap else WGMMA_REGISTERS.get((d, bq, bk))


def _check(w: Workload, block_q, block_k):
    if not isinstance(w, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(w).__name__}")
    if w.dtype not in ("fp16", "bf16"):
        raise ValueError(f"the wgmma forward runs dtype fp16 or bf16, got workload.dtype={w.dtype!r}")
    if w.head_dim not in WGMMA_HEAD_DIMS:
        raise ValueError(f"the wgmma forward runs head_dim in {WGMMA_HEAD_DIMS}, got "
                         f"workload.head_dim={w.head_dim}")
    if w.dropout:
        raise ValueError("the wgmma forward has no dropout (workload.dropout=True)")
    if w.block_sparse:
        raise ValueError("the wgmma forward takes no block mask (workload.block_sparse)")
    if block_q not in WGMMA_BLOCK_Q_CHOICES:
        raise ValueError(f"the wgmma forward takes block_q in {WGMMA_BLOCK_Q_CHOICES}, got "
                         f"block_q={block_q!r}")
    if block_k not in WGMMA_BLOCK_K_CHOICES:
        raise ValueError(f"the wgmma forward takes block_k in {WGMMA_BLOCK_K_CHOICES}, got "
                         f"block_k={block_k!r}")


def _attention_kernel(w: Workload, c, bq: int, bk: int, *, name: str, in_bytes: int,
                      v_access: Access, unit: str, extra_fp32: int, registers,
                      overlap: bool, persistent: bool) -> KernelPlan:
    """The attention kernel's plan, for both forwards (16-bit and e4m3 inputs of ``in_bytes``;
    O in the workload's dtype): Q boxes of 64 rows x 128 bytes, K (and V as ``v_access``
    says) per visited tile, the schedule's CSR entries read by every warp (start and stop once,
    the tile index per visited tile), O from the fragment, the logsumexp; ``extra_fp32`` beside
    the softmax's FP32 work; ``overlap``: three stages and, with two consumer warpgroups, a
    producer warpgroup."""
    d = w.head_dim
    threads = wgmma_threads(bq, overlap)
    stages = 3 if overlap else 2
    # every warp reads start and stop; the consumer warps and the producer's first warp read
    # the tile index per visited tile (a producer warpgroup's other three warps leave)
    working_warps = 4 * wgmma_consumer_warpgroups(bq) + 1
    schedule_loads = threads // 32 * 2 * c.programs + working_warps * c.tiles
    q_boxes = c.slices * -(-w.seq_len_q // ROWS_PER_WARPGROUP) * (d * in_bytes // SWIZZLE_ROW)
    accesses = (
        Access("schedule", "load", schedule_loads * SCHEDULE_ENTRY_BYTES, "fragment",
               SCHEDULE_ENTRY_BYTES),
        Access("Q", "load", c.rows * d * in_bytes, "tma"),
        Access("K", "load", c.keys * d * in_bytes, "tma"),
        v_access,
        Access("O", "store", c.rows * d * w.dtype_bytes, "fragment", FRAGMENT_ROW_BYTES),
        Access("lse", "store", c.rows * STAT_BYTES, "st"),
    )
    fp32, mufu = softmax_work(c, d)
    kv_tile = bk * d * in_bytes
    return KernelPlan(
        name=name, phase="fwd", grid=(c.n_blocks_q, c.slices), threads=threads,
        shared_bytes=wgmma_smem_bytes(d, bq, bk, in_bytes, stages), accesses=accesses,
        matmuls=(Matmul(unit, c.tiles * 4 * d * bq * bk),),
        fp32_flops=int(fp32 + extra_fp32), mufu_ops=int(mufu),
        shared_bytes_moved=int(c.tiles * 2 * kv_tile
                               + q_boxes * ROWS_PER_WARPGROUP * SWIZZLE_ROW),
        registers=registers, programs_per_slice=c.n_blocks_q,
        lockstep=w.window_size is None,     # a band: programs of one slice differ in tiles
        # the turn on S = Q K^T (``pingpong``) and the intra-warpgroup overlap (``overlap``)
        # are declared in the plan's config, not priced
        serial=overlap_serial(warp_specialised=True, stages=stages, pingpong=False,
                              intra_overlap=False,
                              consumer_warpgroups=wgmma_consumer_warpgroups(bq), waits=True),
        serial_per_program=True,
        group_waits=c.tiles * wgmma_consumer_warpgroups(bq) * WGMMA_FWD_WAITS_PER_TILE,
        waiters_per_program=wgmma_consumer_warpgroups(bq), persistent=persistent)


def wgmma_forward_plan(workload: Workload, *, block_q: int | None = None,
                       block_k: int | None = None, registers: int | None = None,
                       launch_order=None, pingpong: bool | None = None,
                       overlap: bool | None = None, persistent: bool | None = None) -> Plan:
    """The plan of `kernels.wgmma_fwd` for ``workload`` (float16 or bfloat16, d 64 or 128, a
    sliding window or none, no dropout or block mask) at ``block_q x block_k`` (None: :func:`wgmma_default_blocks`).
    ``pingpong``: the consumer warpgroups take turns issuing S = Q K^T (None:
    :data:`WGMMA_PINGPONG_DEFAULT`; True needs ``block_q`` = 128). ``overlap``: each
    warpgroup's softmax of a tile runs while its O += P V of the tile before is on the tensor
    cores (None: :data:`WGMMA_OVERLAP_DEFAULT`). ``persistent``: one program per SM walks the
    work items (`KernelPlan.persistent`; None: :data:`WGMMA_PERSISTENT_DEFAULT` where a program
    fills its SM).
    ``registers``: per thread at launch (None: :data:`WGMMA_REGISTERS`' figure, if measured;
    with a producer warpgroup, the launch's even share).
    ``launch_order`` is recorded in the config (it orders the programs, not what they do)."""
    w = workload
    dq, dk = schedule_default_blocks(w.head_dim, w.causal, w.seq_len_q, pingpong, overlap)
    bq, bk = block_q or dq, block_k or dk
    _check(w, bq, bk)
    e, d = w.dtype_bytes, w.head_dim
    c = tile_counts(w, bq, bk)
    overlap = _schedule_flag("overlap", overlap, bq, WGMMA_OVERLAP_DEFAULT)
    why = smem_refusal(d, bq, bk, overlap)
    if why:
        raise ValueError(why)
    kernel = _attention_kernel(w, c, bq, bk, name=KERNEL_NAME, in_bytes=e,
                               v_access=Access("V", "load", c.keys * d * e, "tma"),
                               unit="wgmma.bf16" if w.dtype == "bf16" else "wgmma.f16",
                               extra_fp32=0, registers=_registers(d, bq, bk, overlap, registers),
                               overlap=overlap,
                               persistent=_persistent(persistent, bq, overlap))
    config = {"block_q": bq, "block_k": bk, "launch_order": launch_order,
              "consumer_warpgroups": wgmma_consumer_warpgroups(bq),
              "stages": 3 if overlap else 2, "overlap": overlap,
              "pingpong": _pingpong(pingpong, overlap, bq, WGMMA_PINGPONG_DEFAULT),
              "persistent": kernel.persistent}
    return Plan("wgmma", "fwd", w, (kernel,), config, forward_tensor_bytes(w, c))


def wgmma_forward_configs(workload: Workload) -> list:
    """Every legal configuration of the wgmma forward for ``workload``: ``[{block_q, block_k}]``
    whose shared memory fits with its default schedule's stages (three with the overlap: 192 x
    128 at d = 128 does not fit)."""
    return [{"block_q": q, "block_k": k} for q in WGMMA_BLOCK_Q_CHOICES
            for k in WGMMA_BLOCK_K_CHOICES if not smem_refusal(workload.head_dim, q, k)]


def fp8_transpose_keys(seq_len_k: int) -> int:
    """Keys of the FP8 forward's transposed V: ``seq_len_k`` rounded up to whole tiles of
    `FP8_BLOCK_K` (zeros past the last key)."""
    return -(-seq_len_k // FP8_BLOCK_K) * FP8_BLOCK_K


def fp8_transpose_grid(batch: int, heads_kv: int, seq_len_k: int) -> tuple[int, int]:
    """The V transpose's grid: one program per `FP8_TRANSPOSE_TILE` keys of each (batch, KV
    head)."""
    return fp8_transpose_keys(seq_len_k) // FP8_TRANSPOSE_TILE, batch * heads_kv


def wgmma_fp8_forward_plan(workload: Workload, *, block_q: int | None = None,
                           block_k: int | None = None, registers: int | None = None,
                           launch_order=None, pingpong: bool | None = None,
                           overlap: bool | None = None, persistent: bool | None = None) -> Plan:
    """The plan of the FP8 forward (`kernels.wgmma_fwd.forward_fp8`, family ``wgmma_fp8``) for
    ``workload``, whose dtype ("bf16") is the output's: Q, K and V are float8 e4m3 (1 byte),
    O is bfloat16. Two launches:

    * ``fp8_v_transpose``: V [B, Hkv, Nk, d] into V^T [B, Hkv, d, Nk_pad] (Nk rounded up to
      whole ``block_k`` tiles, zeros past the last key), keys permuted within each 32
      (`kernels.hopper.fp8_key_order`); one program of 256 threads per 32 keys (all d
      columns, as 4-byte words), V's bytes loaded once for the keys in the problem and V^T's
      stored once for every padded key;
    * the attention kernel, as `wgmma_forward_plan` with 1-byte Q, K and V (V^T loaded as
      whole tiles of ``block_k`` padded keys), products on the unit ``wgmma.fp8`` (k32), P
      rounded to e4m3 in registers (one ``cvt`` per two scores, counted with the FP32 work).

    ``block_q`` 128 or 64 (None: 128); ``block_k`` must be 128; d must be 128. ``pingpong``: the
    two consumer warpgroups take turns issuing S = Q K^T (None: :data:`FP8_PINGPONG_DEFAULT`
    at ``block_q`` = 128). ``overlap``: as `wgmma_forward_plan`'s (None:
    :data:`FP8_OVERLAP_DEFAULT`); ``persistent`` as `wgmma_forward_plan`'s."""
    w = workload
    bq = block_q or FP8_DEFAULT_BLOCK_Q
    bk = block_k or FP8_BLOCK_K
    if not isinstance(w, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(w).__name__}")
    if w.dtype != "bf16":
        raise ValueError(f"the FP8 forward writes O in bfloat16: workload.dtype must be 'bf16', "
                         f"got {w.dtype!r}")
    if w.head_dim != FP8_HEAD_DIM:
        raise ValueError(f"the FP8 forward runs head_dim {FP8_HEAD_DIM}, got "
                         f"workload.head_dim={w.head_dim}")
    if bk != FP8_BLOCK_K:
        raise ValueError(f"the FP8 forward takes block_k={FP8_BLOCK_K}, got block_k={bk!r}")
    if w.window_size is not None:
        raise ValueError(f"the FP8 forward has no sliding window (workload.window_size="
                         f"{w.window_size})")
    if bq not in FP8_BLOCK_Q_CHOICES:
        raise ValueError(f"the FP8 forward takes block_q in {FP8_BLOCK_Q_CHOICES}, got "
                         f"block_q={bq!r}")
    _check(w, bq, bk)
    d = w.head_dim
    c = tile_counts(w, bq, bk)
    # -- the V transpose --
    kv_slices = w.batch * w.heads_kv
    keys_pad = fp8_transpose_keys(w.seq_len_k)
    transpose = KernelPlan(
        name=FP8_TRANSPOSE_NAME, phase="fwd.pre",
        grid=fp8_transpose_grid(w.batch, w.heads_kv, w.seq_len_k),
        threads=FP8_TRANSPOSE_THREADS, shared_bytes=0,
        accesses=(Access("V", "load", kv_slices * w.seq_len_k * d, "ld"),
                  Access("V^T", "store", kv_slices * keys_pad * d, "st")),
        shared_bytes_moved=2 * kv_slices * keys_pad * d)
    # -- the attention kernel: one cvt.rn.satfinite.e4m3x2 per two probabilities --
    overlap = _schedule_flag("overlap", overlap, bq, FP8_OVERLAP_DEFAULT)
    kernel = _attention_kernel(w, c, bq, bk, name=FP8_KERNEL_NAME, in_bytes=1,
                               v_access=Access("V^T", "load", c.tiles * bk * d, "tma"),
                               unit="wgmma.fp8", extra_fp32=c.scores // 2,
                               registers=_registers(d, bq, bk, overlap, registers),
                               overlap=overlap,
                               persistent=_persistent(persistent, bq, overlap))
    programs, slices, tiles, rows = c.programs, c.slices, c.tiles, c.rows
    config = {"block_q": bq, "block_k": bk, "launch_order": launch_order,
              "consumer_warpgroups": wgmma_consumer_warpgroups(bq),
              "stages": 3 if overlap else 2, "overlap": overlap,
              "input_dtype": "e4m3",
              "pingpong": _pingpong(pingpong, overlap, bq, FP8_PINGPONG_DEFAULT),
              "persistent": kernel.persistent}
    kv = kv_slices * w.seq_len_k * d
    tensor_bytes = {"schedule": (programs + slices + tiles) * SCHEDULE_ENTRY_BYTES,
                    "Q": rows * d, "O": rows * d * 2, "lse": rows * STAT_BYTES, "K": kv, "V": kv,
                    "V^T": kv_slices * keys_pad * d}
    return Plan("wgmma_fp8", "fwd", w, (transpose, kernel), config, tensor_bytes)
