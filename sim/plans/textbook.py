"""The textbook schedules as plans: the FlashAttention papers' algorithms, built by `sim` itself.

``naive`` (the papers' Algorithm 0: S, P in global memory, one kernel per step), ``flash1``
(FlashAttention's Algorithm 1 and its backward) and ``flash2`` (FlashAttention-2) are not
kernels of this project: they are the algorithms the papers count. Their counts are the closed
forms of `sim.counts` (held equal to the tile-by-tile trace by the tests); this module only
lays them out as a `sim.plan.Plan`, one `KernelPlan` per phase (``fwd``, ``bwd.pre``,
``bwd.main``, ...) with the programs of `sim.model.phase_programs` (the unfused kernels of
``naive`` and the GQA reduction: one full wave), the warps of the schedule
and the shared memory of `sim.workload.sram_bytes_per_block`, so that `sim.plan.price` prices
them as it prices the kernels' own plans. The textbook counts every ``exp`` as
`sim.workload.EXP_FLOPS` FP32 FLOPs (no MUFU level) and every access as whole rows.
"""
from __future__ import annotations

from ..counts import closed_form
from ..plan import Access, KernelPlan, Matmul, Plan
from ..profiles import load_profile
from ..workload import SCHEDULES, Schedule, Workload, resolve_blocks, sram_bytes_per_block

__all__ = ["textbook_plan", "naive_plan", "flash1_plan", "flash2_plan", "PASS_PLANNERS",
           "UNFUSED_SCHEDULES"]


def _matmul_unit(w: Workload, schedule: Schedule) -> str:
    """The `sim.plan.MATMUL_UNITS` key of a schedule's products."""
    if schedule.matmul_unit == "cuda" or (w.dtype == "fp32" and schedule.matmul_unit == "tensor"):
        return "ffma"
    if schedule.matmul_unit == "tf32" or w.dtype == "fp32":
        return "mma.tf32"
    return "mma.bf16" if w.dtype == "bf16" else "mma.f16"


def textbook_plan(workload: Workload, schedule: Schedule | str = "flash2", *, profile="h100",
                  block_q: int | None = None, block_k: int | None = None,
                  pass_: str | None = None) -> Plan:
    """The plan of a textbook ``schedule`` (a `sim.Schedule` or its name, one of
    `sim.workload.SCHEDULES`) for ``workload``: every pass its workload asks for (or ``pass_``),
    one kernel per phase. ``block_q`` / ``block_k`` override the schedule's; unset, they are
    `sim.workload.resolve_blocks`' for ``profile`` (its shared memory)."""
    from ..model import _tensor_bytes, phase_programs
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(workload).__name__}")
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got schedule={schedule!r}")
        schedule = Schedule(schedule)
    if schedule.simt:
        raise ValueError("schedule: a micro-tile describes our CUDA-core kernels, whose plan is "
                         "sim.plans.simt's (plan_for('simt', ...))")
    if block_q is not None or block_k is not None:
        schedule = schedule.replace(block_q=block_q or schedule.block_q,
                                    block_k=block_k or schedule.block_k)
    w = workload if pass_ is None else workload.replace(pass_=pass_)
    prof = load_profile(profile)
    bq, bk = resolve_blocks(w, schedule, prof)
    by_key, flops = closed_form(w, schedule, bq, bk)
    programs = phase_programs(w, schedule.name, bq, bk)
    unit = _matmul_unit(w, schedule)
    phases: dict = {}
    for (phase, tensor, op), n in by_key.items():
        how = "atomic" if op == "atomic" else ("ld" if op == "load" else "st")
        phases.setdefault(phase, []).append(Access(tensor, op, int(n), how))
    # the L2 model's reuse, as sim.predict gives it: FlashAttention-1's one program per slice
    # reuses from one K block to the next; the causal or windowed FlashAttention-2 programs
    # start staggered (see sim.predict)
    windowed = w.window_size is not None
    stagger: dict = {}
    if schedule.name == "flash2" and (w.causal or windowed) and not w.block_sparse:
        from ..counts import workload_tile_stats
        tiles = sum(mult * int(st.T) for mult, st in workload_tile_stats(w, bq, bk))
        stagger["bwd.main"] = (bk / bq, tiles)
        if windowed:
            stagger["fwd"] = stagger["bwd.dq"] = (bq / bk, tiles)
    kernels = []
    for phase in dict.fromkeys([*phases, *flops]):
        total, per_slice = programs.get(phase, programs.get("*", (1, 1)))
        if not schedule.tiled or phase.endswith("reduce"):
            # the unfused kernels (GEMMs, elementwise passes, the GQA dK/dV reduction) fill the
            # GPU: one full wave of programs, as the textbook's roofline assumes
            total = prof.num_sms * (prof.max_threads_per_sm // (32 * schedule.num_warps))
        if schedule.tiled and not phase.endswith("reduce"):
            pass_name = "fwd" if phase.startswith("fwd") else "bwd"
            shared = int(sram_bytes_per_block(schedule.name, pass_name, bq, bk, w.head_dim,
                                              w.dtype_bytes))
        else:
            shared = 0
        mm, other = flops.get(phase, (0, 0))
        kernels.append(KernelPlan(
            name=phase, phase=phase, grid=(int(total),), threads=32 * schedule.num_warps,
            shared_bytes=shared, accesses=tuple(phases.get(phase, ())),
            matmuls=(Matmul(unit, int(mm)),) if mm else (), fp32_flops=int(other),
            programs_per_slice=int(per_slice),
            lockstep=not (w.block_sparse or ((w.causal or windowed) and phase == "bwd.main")
                          or (windowed and phase in ("fwd", "bwd.dq"))),
            steps_per_program=(-(-w.seq_len_k // bk) if schedule.name == "flash1"
                               and not phase.endswith("reduce") else 1),
            stagger=stagger.get(phase)))
    return Plan(schedule.name, w.pass_, w, tuple(kernels),
                {"block_q": bq, "block_k": bk, "num_warps": schedule.num_warps,
                 "matmul_unit": schedule.matmul_unit}, _tensor_bytes(w, schedule))


def naive_plan(workload: Workload, **options) -> Plan:
    """:func:`textbook_plan` of ``naive`` (the papers' Algorithm 0)."""
    return textbook_plan(workload, "naive", **options)


def flash1_plan(workload: Workload, **options) -> Plan:
    """:func:`textbook_plan` of ``flash1`` (FlashAttention's Algorithm 1 and its backward)."""
    return textbook_plan(workload, "flash1", **options)


def flash2_plan(workload: Workload, **options) -> Plan:
    """:func:`textbook_plan` of ``flash2`` (FlashAttention-2)."""
    return textbook_plan(workload, "flash2", **options)


def _for_pass(name: str, pass_: str):
    def planner(workload: Workload, **options) -> Plan:
        return textbook_plan(workload, name, pass_=pass_, **options)
    planner.__name__ = f"{name}_{pass_}_plan"
    planner.__doc__ = f":func:`textbook_plan` of ``{name}``, pass ``{pass_}`` (`sim.plans.plan_for`)."
    return planner


#: (schedule, pass) -> the planner `sim.plans.PLANNERS` names (``textbook:PASS_PLANNERS``).
PASS_PLANNERS = {(name, p): _for_pass(name, p) for name in SCHEDULES for p in ("fwd", "bwd")}
naive_fwd_plan, naive_bwd_plan = PASS_PLANNERS["naive", "fwd"], PASS_PLANNERS["naive", "bwd"]
flash1_fwd_plan, flash1_bwd_plan = PASS_PLANNERS["flash1", "fwd"], PASS_PLANNERS["flash1", "bwd"]
flash2_fwd_plan, flash2_bwd_plan = PASS_PLANNERS["flash2", "fwd"], PASS_PLANNERS["flash2", "bwd"]

#: PyTorch's unfused attention as the textbook's naive schedule with the kernel sequence it runs
#: (`sim.counts.naive_variant_kernels`): the MATH SDPA backend (everything in float32 on CUDA
#: cores) and eager attention (its GEMMs on the tensor cores). Results records name them
#: ``sdpa-math`` and ``eager``.
UNFUSED_SCHEDULES = {"sdpa-math": Schedule("naive", matmul_unit="cuda", variant="math"),
                     "eager": Schedule("naive", matmul_unit="tensor", variant="eager")}


def _unfused(name: str, pass_: str):
    def planner(workload: Workload, **options) -> Plan:
        plan = textbook_plan(workload, UNFUSED_SCHEDULES[name], pass_=pass_, **options)
        return Plan(name, plan.pass_, plan.workload, plan.kernels, plan.config, plan.tensor_bytes)
    planner.__name__ = f"{name.replace('-', '_')}_{pass_}_plan"
    planner.__doc__ = f"PyTorch's ``{name}`` attention, pass ``{pass_}``, as its kernel sequence."
    return planner


sdpa_math_fwd_plan, sdpa_math_bwd_plan = _unfused("sdpa-math", "fwd"), _unfused("sdpa-math", "bwd")
eager_fwd_plan, eager_bwd_plan = _unfused("eager", "fwd"), _unfused("eager", "bwd")
