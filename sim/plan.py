"""Plans: what a family of kernels does for one problem, as data, and the one function that prices it.

Three descriptions, as in Timeloop: the *workload* (:class:`sim.workload.Workload`: the
problem), the *hardware* (:class:`sim.profiles.GPUProfile`) and the *mapping*, a :class:`Plan`:
the kernels a family launches, in launch order, each a :class:`KernelPlan` with its grid,
threads, shared memory, registers and, summed over its programs, what it moves
(:class:`Access`: tensor, load/store/atomic, bytes, and how: plain loads, mma fragments,
``cp.async``) and what it computes (:class:`Matmul` products per unit, element-wise FP32
FLOPs, MUFU operations). A kernel family builds its plan from the same tile choices and
`ioaware.block_info.BlockInfo` its launcher uses (`sim.plans`), and its launcher reads its
grid, threads and shared memory from that plan: one description, two readers.

:func:`price` is small and pure: ``price(plan, profile) -> PlanCost``: per kernel the global
(L1 <-> L2) bytes as the hardware counters count them, DRAM bytes after the analytic L2 model
(`sim.l2.l2_analytic`), executed FLOPs, and a time from the profile's rates:

    t_kernel = launch_s + max(dram_bytes / dram_rate, global_bytes / l2_rate,
                              shared_bytes_moved / smem_rate,
                              executed_matmul_flops / unit_rate, fp32_flops / ffma_rate,
                              mufu_ops / mufu_rate, wgmma group waits x wait latency / waiters)
               / wave_utilisation

(the levels of a ``KernelPlan.serial`` group add instead of overlapping; the "wait" level is 0
unless the profile has a measured wait latency, `KernelPlan.group_waits`)

with ``wave_utilisation = programs / (waves * resident_slots)``, resident programs per SM from
threads, shared memory and registers (`sim.workload.occupancy`). The rates are the profile's
measured ones (``GPUProfile.measured_rates``, written by ``python -m benchmarks rates``) where it
has them, else its datasheet figures; :attr:`PlanCost.rate_sources` says which each level used.
Nothing is fitted on measured records here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .l2 import l2_analytic
from .profiles import GPUProfile, load_profile
from .workload import SECTOR_BYTES, Workload, occupancy

__all__ = ["Access", "Matmul", "KernelPlan", "Plan", "KernelCost", "PlanCost", "price", "ACCESS_HOWS",
           "MATMUL_UNITS", "RATE_NAMES", "rates_of", "serial_parts", "SYNC_WARP_CHAIN",
           "dispatch_utilisation", "launch_group"]

#: How an access reaches global memory: "ld"/"st" whole rows (coalesced, counted as moved);
#: "fragment": a warp instruction touches ``segment_bytes`` of a row (an mma fragment), so the
#: L1 counters count whole 32-byte sectors per request; "cp.async": 16-byte asynchronous copies
#: to shared memory (counted per the profile's ``async_copy_counted_sectors_per_512b``);
#: "atomic": float32 reductions in L2 (``red.global.add``); "tma": bulk tensor copies by the
#: tensor memory accelerator (``cp.async.bulk.tensor``: whole boxes, counted as moved in L2;
#: Nsight Compute's LSU counters do not see them, so `sim.compare` leaves them out of
#: ``lsu_bytes``).
ACCESS_HOWS = ("ld", "st", "fragment", "cp.async", "atomic", "tma")

#: The ``KernelPlan.serial`` chain of a FlashAttention-2-style kernel on ``mma.sync``: each warp
#: reads its operands from shared memory (``ldmatrix``), multiplies (``mma.sync``, which waits for
#: its fragments) and runs the softmax or the gradients' element-wise work on the results, in
#: program order, with no warp specialised to any of it, so within a program these add up; only
#: the ``cp.async`` loads, issued a tile ahead, stay off the chain. With
#: ``serial_per_program=True`` the programs resident on an SM overlap their chains.
SYNC_WARP_CHAIN = (("matmul", "smem", "fp32", "mufu"),)

#: Matmul units and the rate each is priced at (:data:`RATE_NAMES`).
MATMUL_UNITS = {"mma.f16": "mma_f16_flops_per_s", "mma.bf16": "mma_bf16_flops_per_s",
                "mma.tf32": "mma_tf32_flops_per_s", "ffma": "ffma_flops_per_s",
                # float8 (e4m3) products of ``mma.sync``, and Hopper's warpgroup ``wgmma``
                # (FlashAttention-3): priced apart, as a measured rate of one instruction does
                # not carry to the other
                "mma.fp8": "mma_fp8_flops_per_s", "wgmma.f16": "wgmma_f16_flops_per_s",
                "wgmma.bf16": "wgmma_bf16_flops_per_s", "wgmma.fp8": "wgmma_fp8_flops_per_s"}

#: The rates :func:`price` reads: name -> (the measured rate of ``python -m benchmarks rates``
#: that gives it (`GPUProfile.measured_rates`), its factor to this unit, and the datasheet figure
#: it falls back to (a function of the profile; None where there is none)).
RATE_NAMES = {
    "dram_bytes_per_s": ("dram_copy_bytes_per_s", lambda p: 1.0, lambda p: p.hbm_bandwidth_bytes_per_s),
    # a read stream's rate (the split-KV decoding kernel, `sim.decode`: its cache read once)
    "dram_read_bytes_per_s": ("dram_read_bytes_per_s", lambda p: 1.0,
                              lambda p: p.hbm_bandwidth_bytes_per_s),
    "l2_bytes_per_s": ("l2_read_bytes_per_s", lambda p: 1.0, lambda p: p.l2_bandwidth_bytes_per_s),
    "smem_bytes_per_s": ("smem_read_bytes_per_s_per_sm", lambda p: p.num_sms,
                         lambda p: p.smem_bandwidth_bytes_per_s),
    "mma_f16_flops_per_s": ("mma_fp16_flops_per_s", lambda p: 1.0,
                            lambda p: p.tensor_flops_per_s.get("fp16")),
    "mma_bf16_flops_per_s": ("mma_bf16_flops_per_s", lambda p: 1.0,
                             lambda p: p.tensor_flops_per_s.get("bf16")),
    "mma_tf32_flops_per_s": ("mma_tf32_flops_per_s", lambda p: 1.0,
                             lambda p: p.tensor_flops_per_s.get("tf32")),
    "ffma_flops_per_s": ("ffma_flops_per_s", lambda p: 1.0, lambda p: p.fp32_flops_per_s),
    # float8 mma.sync products: no microbenchmark measures them yet (datasheet figure)
    "mma_fp8_flops_per_s": ("mma_fp8_flops_per_s", lambda p: 1.0, lambda p: p.tensor_flops_per_s.get("fp8")),
    # Hopper wgmma products (A and B from shared memory): python -m benchmarks rates --only wgmma
    "wgmma_f16_flops_per_s": ("wgmma_fp16_flops_per_s", lambda p: 1.0,
                              lambda p: p.tensor_flops_per_s.get("fp16")),
    "wgmma_bf16_flops_per_s": ("wgmma_bf16_flops_per_s", lambda p: 1.0,
                               lambda p: p.tensor_flops_per_s.get("bf16")),
    "wgmma_fp8_flops_per_s": ("wgmma_fp8_flops_per_s", lambda p: 1.0,
                              lambda p: p.tensor_flops_per_s.get("fp8")),
    # CUDA Programming Guide, arithmetic instruction throughput, cc 8.x/9.0: 16 results per clock
    # per SM for exp2/log2/reciprocal (MUFU)
    "mufu_ops_per_s": ("ex2_ops_per_s", lambda p: 1.0,
                       lambda p: (16 * p.num_sms * p.sm_clock_hz) if p.sm_clock_hz else None),
    "launch_s": ("kernel_launch_s", lambda p: 1.0, lambda p: 0.0),
    # what a waited-for wgmma commit group costs beyond its products (python -m benchmarks
    # rates --only wgmma-wait); no datasheet figure: 0, the "wait" level not priced
    "wgmma_wait_s": ("wgmma_wait_latency_s", lambda p: 1.0, lambda p: 0.0),
}


@dataclass(frozen=True)
class Access:
    """One tensor's traffic of one kernel, summed over its programs.

    ``bytes``: bytes the programs move (each element once per time it is loaded or stored).
    ``how``: one of :data:`ACCESS_HOWS`; ``segment_bytes``: for "fragment", the bytes of one row
    one warp instruction touches (below a 32-byte sector the L1 counters count the sector).
    """

    tensor: str
    op: str            # "load", "store" or "atomic"
    bytes: int
    how: str = "ld"
    segment_bytes: int | None = None

    def __post_init__(self):
        if self.op not in ("load", "store", "atomic"):
            raise ValueError(f"Access.op must be 'load', 'store' or 'atomic', got {self.op!r}")
        if self.how not in ACCESS_HOWS:
            raise ValueError(f"Access.how must be one of {ACCESS_HOWS}, got {self.how!r}")
        if self.how == "fragment" and not self.segment_bytes:
            raise ValueError("a 'fragment' Access needs segment_bytes")

    def counted_bytes(self, profile: GPUProfile) -> float:
        """Bytes as Nsight Compute's L1 global load/store/atomic counters count them."""
        if self.how == "fragment" and self.segment_bytes < SECTOR_BYTES:
            return self.bytes * (SECTOR_BYTES / self.segment_bytes)
        if self.how == "cp.async" and profile.async_copy_counted_sectors_per_512b:
            return self.bytes * profile.async_copy_counted_sectors_per_512b * SECTOR_BYTES / 512
        return float(self.bytes)


@dataclass(frozen=True)
class Matmul:
    """Matrix products of one kernel on one unit (a key of :data:`MATMUL_UNITS`).

    ``flops``: the FLOPs of the products as the kernel issues them (2 m n k each, on whole
    tiles: padding included); ``passes``: products executed per product of the algorithm (3 for
    3xTF32: big x big, big x small, small x big).
    """

    unit: str
    flops: int
    passes: int = 1

    def __post_init__(self):
        if self.unit not in MATMUL_UNITS:
            raise ValueError(f"Matmul.unit must be one of {tuple(MATMUL_UNITS)}, got {self.unit!r}")

    @property
    def executed_flops(self) -> int:
        return self.flops * self.passes


@dataclass(frozen=True)
class KernelPlan:
    """One kernel launch: ``name`` (as the family's launcher calls it), ``phase`` (the phase of
    `sim`'s reports: ``fwd``, ``bwd.pre``, ``bwd.dq``, ``bwd.main``, ...), ``grid`` (x, y[, z]),
    ``threads`` per program, dynamic + static ``shared_bytes`` per program, ``registers`` per
    thread (None: not known), ``programs_per_slice`` (programs that share one (batch, head)
    slice's K/V or Q/dO: the L2 model's reuse), what it moves and computes (summed over all
    programs), and ``lockstep``: whether the programs of a slice walk its tiles in the same
    order (False for the causal or windowed sweeps that start at each program's first visited
    tile; the L2 model's reuse).

    ``steps_per_program`` (one program per slice: the steps over which it reuses what it
    loaded) and ``stagger`` (``(s, tiles)``: programs of a slice starting ``s`` steps apart)
    refine the L2 model's reuse (`sim.l2.l2_analytic`).

    ``shared_bytes_moved``: bytes read from and written to shared memory by all programs
    (``ldmatrix``, ``ld.shared``/``st.shared``, the ``cp.async`` destinations), priced at the
    shared-memory bandwidth ("smem" level).

    ``group_waits``: ``wgmma`` commit groups the kernel's consumer warpgroups wait for, summed
    over them all, of which ``waiters_per_program`` (its consumer warpgroups) wait side by side
    in a program: the "wait" level, ``group_waits * wgmma_wait_s / (SMs * waiters_per_program)``
    (0 where the profile has no measured ``wgmma_wait_latency_s``), the latency each wait adds
    beyond its products, which only a ``serial`` group that names it puts on a chain.

    ``serial``: groups of levels (names of :attr:`KernelCost.level_s`: "dram", "l2", "smem",
    "matmul", "fp32", "mufu", "wait") whose times add up because the kernel does not overlap them (e.g.
    ``(("matmul", "fp32", "mufu"),)`` for a warp that waits for its products before its
    softmax, with too few warps resident to hide it); every other level overlaps, and the
    kernel's time is the largest of the groups' sums and the remaining levels. Default: all
    levels overlap. A group's member may also be a pair ``(level, weight)``: that share of the
    level's time is on the group's chain (e.g. ``(("matmul", 0.5), "mufu")`` for a softmax that
    hides under one of a tile's two products but not the other); every level's own time stays a
    lower bound of the kernel's (:func:`serial_parts`).

    ``serial_per_program``: the ``serial`` groups are the chain of one program (its warps in
    step), and the programs resident on an SM run their chains independently, so a group's sum
    is divided by the resident programs per SM (`sim.resources.occupancy`): ``max(M, S,
    (M + S) / R)`` for a chain ``M + S`` and ``R`` resident programs. Only where the kernel's
    ``registers`` are known: without them the resident count ignores the register file and
    would overstate ``R``, so the chains are not divided. Default False: the groups are the
    SM's (programs in step, or one per SM).

    ``tile_work``: the work of the programs of one (batch, head) slice (the grid's y index), in
    the order of the grid's x index, in any unit (e.g. visited tiles), where they differ (causal
    sweeps); with it :func:`price` dispatches the programs greedily onto the SMs in launch
    order (`ioaware.launch_order.slice_makespan`, each SM one server) and takes the
    utilisation that leaves where it is lower than the equal-programs wave estimate. The order:
    ``head_group`` where pinned, else ``default_head_group`` balanced as the launcher balances
    it (`ioaware.launch_order.balanced_head_group` on the profile's SMs). Empty (the default):
    programs of equal work.

    ``persistent``: the grid's programs are *work items*; the launch runs one program per SM
    (or fewer, one per item), program ``p`` of ``P`` taking the items at dispatch positions
    ``p, p + P, p + 2 P, ...`` (a program fills its SM: `kernels.host.launch_grid`), so that
    one item's loads start under the one before's last products and stores. Priced as the
    same work items (the waves of `price` and `tile_work`'s dispatch); default False."""

    name: str
    phase: str
    grid: tuple
    threads: int
    shared_bytes: int
    accesses: tuple
    matmuls: tuple = ()
    fp32_flops: int = 0
    mufu_ops: int = 0
    shared_bytes_moved: int = 0
    registers: int | None = None
    programs_per_slice: int = 1
    lockstep: bool = True
    serial: tuple = ()
    serial_per_program: bool = False
    steps_per_program: int = 1
    stagger: tuple | None = None
    group_waits: int = 0
    waiters_per_program: int = 1
    tile_work: tuple = ()
    head_group: int | None = None
    default_head_group: int = 1
    persistent: bool = False

    @property
    def programs(self) -> int:
        return math.prod(self.grid)

    @property
    def warps(self) -> int:
        return -(-self.threads // 32)


@dataclass(frozen=True)
class Plan:
    """What a kernel family launches for one workload: ``kernels`` in launch order, the family
    and pass, the configuration it chose (``config``: tiles, warps, launch order ...), and
    ``tensor_bytes``: the size of each tensor it touches (the L2 model's footprints)."""

    family: str
    pass_: str
    workload: Workload
    kernels: tuple
    config: dict = field(default_factory=dict)
    tensor_bytes: dict = field(default_factory=dict)

    def kernel(self, name: str) -> KernelPlan:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(f"{self.family} {self.pass_} plan has no kernel {name!r} "
                       f"(it has {[k.name for k in self.kernels]})")


@dataclass(frozen=True)
class KernelCost:
    """What :func:`price` says of one kernel (bytes, FLOPs, seconds)."""

    name: str
    phase: str
    programs: int
    resident_per_sm: int
    wave_utilisation: float
    global_bytes: float
    dram_bytes: float
    matmul_flops: int
    fp32_flops: int
    mufu_ops: int
    level_s: dict
    time_s: float

    @property
    def bound(self) -> str:
        return max(self.level_s, key=self.level_s.get)


@dataclass(frozen=True)
class PlanCost:
    """The priced plan: totals, per kernel (:class:`KernelCost`), and the rate each level used
    (``rate_sources``: "measured" or "datasheet")."""

    plan: Plan
    profile: str
    kernels: tuple
    rate_sources: dict

    @property
    def global_bytes(self) -> float:
        return sum(k.global_bytes for k in self.kernels)

    @property
    def dram_bytes(self) -> float:
        return sum(k.dram_bytes for k in self.kernels)

    @property
    def flops(self) -> int:
        return sum(k.matmul_flops + k.fp32_flops for k in self.kernels)

    @property
    def time_s(self) -> float:
        return sum(k.time_s for k in self.kernels)

    @property
    def time_ms(self) -> float:
        return self.time_s * 1e3

    def to_dict(self) -> dict:
        return {"family": self.plan.family, "pass": self.plan.pass_, "profile": self.profile,
                "config": dict(self.plan.config), "global_bytes": self.global_bytes,
                "dram_bytes": self.dram_bytes, "flops": self.flops, "time_ms": self.time_ms,
                "rate_sources": dict(self.rate_sources),
                "kernels": [{"name": k.name, "phase": k.phase, "programs": k.programs,
                             "resident_per_sm": k.resident_per_sm,
                             "wave_utilisation": k.wave_utilisation,
                             "global_bytes": k.global_bytes, "dram_bytes": k.dram_bytes,
                             "matmul_flops": k.matmul_flops, "fp32_flops": k.fp32_flops,
                             "mufu_ops": k.mufu_ops, "bound": k.bound,
                             "time_ms": k.time_s * 1e3} for k in self.kernels]}


def rates_of(profile: GPUProfile) -> tuple[dict, dict]:
    """``(rates, sources)``: each of :data:`RATE_NAMES` from the profile's measured rates
    (`GPUProfile.measured_rates`, loaded explicitly: ``sim.load_profile(name, rates=FILE)``)
    where it has the one it comes from, else its datasheet figure (None where neither exists);
    ``sources[name]`` is "measured" or "datasheet"."""
    measured = getattr(profile, "measured_rates", None) or {}
    rates, sources = {}, {}
    for name, (measured_name, factor, datasheet) in RATE_NAMES.items():
        m = measured.get(measured_name)
        value = m.get("value") if isinstance(m, dict) else m
        if value is not None:
            rates[name], sources[name] = float(value) * factor(profile), "measured"
        else:
            rates[name], sources[name] = datasheet(profile), "datasheet"
    return rates, sources


def _member(member, levels: dict) -> tuple[str, float]:
    """``(level, weight)`` of one member of a ``KernelPlan.serial`` group."""
    if isinstance(member, str):
        name, weight = member, 1.0
    elif (isinstance(member, (tuple, list)) and len(member) == 2 and isinstance(member[0], str)
          and isinstance(member[1], (int, float)) and not isinstance(member[1], bool)
          and math.isfinite(member[1]) and member[1] >= 0):
        name, weight = member[0], float(member[1])
    else:
        raise ValueError(f"KernelPlan.serial members are level names or (level, weight >= 0) pairs, "
                         f"got {member!r}")
    if name not in levels:
        raise ValueError(f"KernelPlan.serial names unknown level {name!r} (levels: {tuple(levels)})")
    return name, weight


def serial_parts(levels: dict, serial: tuple, programs: int = 1) -> list[tuple[str, float]]:
    """``[(label, seconds)]``: every level's own time, then each ``serial`` group's weighted sum
    (labelled as ``"0.5 matmul + mufu"``), divided by ``programs`` (the resident programs per SM
    that run such chains independently, `KernelPlan.serial_per_program`; labelled ``"(...) /
    2"``); the kernel's critical path is the largest of them. For groups of plain names and one
    program this is the same maximum as the groups' sums and the levels outside every group (a
    level's time never exceeds the sum of a group that holds it)."""
    if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
        raise ValueError(f"programs must be a positive integer, got {programs!r}")
    parts = [(name, float(v)) for name, v in levels.items()]
    for group in serial:
        members = [_member(m, levels) for m in group]
        label = " + ".join(n if w == 1 else f"{w:g} {n}" for n, w in members)
        if programs > 1:
            label = f"({label}) / {programs}"
        parts.append((label, sum(w * levels[n] for n, w in members) / programs))
    return parts


def _critical(levels: dict, serial: tuple, programs: int = 1) -> float:
    """The longest of the serial groups' (weighted) sums, each divided by ``programs``, and the
    levels' own times."""
    parts = serial_parts(levels, serial, programs)
    return max(v for _label, v in parts) if parts else 0.0


def _l2(plan: Plan, profile: GPUProfile, slots: dict) -> dict:
    """DRAM bytes per kernel from the analytic L2 model over the plan's accesses."""
    by_key: dict = {}
    for k in plan.kernels:
        for a in k.accesses:
            key = (k.name, a.tensor, "load" if a.op == "load" else a.op)
            by_key[key] = by_key.get(key, 0) + a.bytes
    w = plan.workload
    pps = {k.name: k.programs_per_slice for k in plan.kernels}
    lockstep = {k.name: k.lockstep for k in plan.kernels}
    steps = {k.name: k.steps_per_program for k in plan.kernels if k.steps_per_program != 1}
    stagger = {k.name: k.stagger for k in plan.kernels if k.stagger is not None}
    res = l2_analytic(by_key, plan.tensor_bytes, pps, w.batch * w.heads, slots, profile.l2_bytes,
                      steps, lockstep, stagger)
    return {name: v["dram_read_bytes"] + v["dram_write_bytes"] for name, v in res.phases.items()}


def _rate(rates: dict, name: str, unit: str, profile: GPUProfile) -> float:
    """The rate ``name`` of a matmul ``unit``; ValueError when the profile has neither a
    measurement nor a datasheet figure of it (float8 on a GPU without float8 tensor cores)."""
    if not rates.get(name):
        raise ValueError(f"profile {profile.name} has no rate {name!r} for matmul unit {unit!r} "
                         f"(neither measured nor in its tensor_flops_per_s)")
    return rates[name]


def launch_group(kernel: KernelPlan, num_sms: int) -> int:
    """The head group (`ioaware.launch_order`) ``kernel``'s programs are dispatched in on a GPU
    of ``num_sms`` SMs: ``head_group`` where pinned, else ``default_head_group``, turned to
    heads first where greedy dispatch of its ``tile_work`` says the default would end more than
    `ioaware.launch_order.BALANCE_TOLERANCE` later (`ioaware.launch_order.launch_head_group`,
    which the launchers of plans with ``tile_work`` ask with the same fields); :func:`price`
    prices it."""
    from ioaware.launch_order import launch_head_group
    n_bh = kernel.grid[1] if len(kernel.grid) > 1 else 1
    return launch_head_group(kernel.tile_work, n_bh, kernel.head_group,
                             kernel.default_head_group, num_sms)


def dispatch_utilisation(kernel: KernelPlan, num_sms: int) -> float:
    """The share of its SMs' time a kernel of unequal programs (``tile_work``) keeps them busy:
    the average SM's work over the last one's when its programs are dispatched greedily in the
    order of :func:`launch_group` (`ioaware.launch_order.slice_makespan`, each SM one server);
    1 without ``tile_work``, or where no program is longer than 1 % of an SM's share (greedy
    dispatch then ends within 1 % of even)."""
    if not kernel.tile_work:
        return 1.0
    from ioaware.launch_order import slice_makespan
    n_bh = kernel.grid[1] if len(kernel.grid) > 1 else 1
    share = n_bh * sum(kernel.tile_work) / num_sms
    if share <= 0 or max(kernel.tile_work) <= 0.01 * share:
        return 1.0
    group = launch_group(kernel, num_sms)
    return float(share / slice_makespan(tuple(kernel.tile_work), n_bh, group, num_sms))


def price(plan: Plan, profile="h100", *, l2: str = "analytic") -> PlanCost:
    """Price ``plan`` on ``profile`` (a `GPUProfile` or a name): see the module docstring.
    ``l2``: "analytic" (DRAM bytes from `sim.l2.l2_analytic`) or "none" (DRAM = global bytes)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a sim.plan.Plan, got {type(plan).__name__}")
    if l2 not in ("analytic", "none"):
        raise ValueError(f"l2 must be 'analytic' or 'none', got {l2!r}")
    prof = load_profile(profile)
    rates, sources = rates_of(prof)
    resident = {k.name: occupancy(prof, k.shared_bytes, k.warps, k.registers) for k in plan.kernels}
    for k in plan.kernels:
        if resident[k.name] == 0:
            raise ValueError(f"{plan.family} {k.name}: {k.shared_bytes} bytes of shared memory, "
                             f"{k.threads} threads, {k.registers} registers do not fit one SM "
                             f"of {prof.name}")
    slots = {name: prof.num_sms * r for name, r in resident.items()}
    dram = (_l2(plan, prof, slots) if l2 == "analytic"
            else {k.name: sum(a.bytes for a in k.accesses) for k in plan.kernels})
    costs = []
    for k in plan.kernels:
        counted = sum(a.counted_bytes(prof) for a in k.accesses)
        executed = {}
        for m in k.matmuls:
            executed[m.unit] = executed.get(m.unit, 0) + m.executed_flops
        ffma = executed.get("ffma", 0)     # CUDA-core products share the FP32 pipe
        levels = {"dram": dram.get(k.name, 0.0) / rates["dram_bytes_per_s"],
                  "l2": counted / rates["l2_bytes_per_s"] if rates["l2_bytes_per_s"] else 0.0,
                  "smem": (k.shared_bytes_moved / rates["smem_bytes_per_s"]
                           if rates["smem_bytes_per_s"] else 0.0),
                  "matmul": sum(f / _rate(rates, MATMUL_UNITS[u], u, prof) for u, f in executed.items()
                                if u != "ffma"),
                  "fp32": (k.fp32_flops + ffma) / rates["ffma_flops_per_s"],
                  "mufu": k.mufu_ops / rates["mufu_ops_per_s"] if rates["mufu_ops_per_s"] else 0.0,
                  "wait": (k.group_waits * rates["wgmma_wait_s"]
                           / (prof.num_sms * max(1, k.waiters_per_program)))}
        s = slots[k.name]
        waves = max(1, math.ceil(k.programs / s))
        util = min(k.programs / (waves * s), dispatch_utilisation(k, prof.num_sms))
        chains = resident[k.name] if k.serial_per_program and k.registers is not None else 1
        time_s = rates["launch_s"] + _critical(levels, k.serial, chains) / util
        costs.append(KernelCost(k.name, k.phase, k.programs, resident[k.name], util, counted,
                                float(dram.get(k.name, 0.0)), sum(executed.values()), k.fp32_flops,
                                k.mufu_ops, {n: v / util for n, v in levels.items()}, time_s))
    return PlanCost(plan, prof.name, tuple(costs), sources)
