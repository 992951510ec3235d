"""The plans of the kernel families (`sim.plan.Plan`), built from a workload and a configuration.

Each module here holds what one kind of kernel does, as data, and the layout facts its launcher
needs (tile choices, threads, shared memory): `kernels` imports them and launches exactly the
plan; `sim` prices it (:func:`sim.plan.price`). :func:`plan_for` is the one entry point:

    plan_for("mma", "fwd", workload, block_q=128, block_k=64) -> sim.plan.Plan

Families: ``mma`` (tensor-core float16/bfloat16), ``tf32`` (3xTF32 tensor-core float32),
``simt`` (CUDA-core, every float dtype: `sim.plans.simt`); ``wgmma`` (our Hopper kernels,
TMA + ``wgmma``, float16/bfloat16: the forward `sim.plans.wgmma_fwd`, the two-kernel backward
`sim.plans.wgmma_bwd`).
``flash3`` is FlashAttention-3's forward on Hopper (`sim.plans.flash3`: no launcher here, a
model of another library's kernel) and ``flash3-baseline`` the same kernel with its three
asynchrony ideas off. ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn`` are PyTorch's SDPA
backends as the kernels they launch on sm_90 (`sim.plans.sdpa`; cuDNN's forward only, as
FlashAttention-3's plan). ``naive``, ``flash1``, ``flash2`` are the papers' algorithms, built by
the model itself from its closed forms (`sim.plans.textbook`).
"""
from __future__ import annotations

import functools
import importlib

__all__ = ["plan_for", "plans_for_record", "choose", "PLANNERS", "CONFIGS"]

#: (family, pass) -> "module:function" building its plan (workload, **config) -> Plan.
PLANNERS = {
    ("mma", "fwd"): "sim.plans.tensor_core_fwd:mma_forward_plan",
    ("tf32", "fwd"): "sim.plans.tensor_core_fwd:tf32_forward_plan",
    ("wgmma", "fwd"): "sim.plans.wgmma_fwd:wgmma_forward_plan",
    ("wgmma_fp8", "fwd"): "sim.plans.wgmma_fwd:wgmma_fp8_forward_plan",
    ("wgmma", "bwd"): "sim.plans.wgmma_bwd:wgmma_backward_plan",
    ("mma", "bwd"): "sim.plans.tensor_core_bwd:mma_backward_plan",
    ("tf32", "bwd"): "sim.plans.tensor_core_bwd:tf32_backward_plan",
    ("flash3", "fwd"): "sim.plans.flash3:flash3_forward_plan",
    ("flash3-baseline", "fwd"): "sim.plans.flash3:flash2_hopper_baseline_plan",
    ("sdpa-flash", "fwd"): "sim.plans.sdpa:flash_forward_plan",
    ("sdpa-flash", "bwd"): "sim.plans.sdpa:flash_backward_plan",
    ("sdpa-efficient", "fwd"): "sim.plans.sdpa:efficient_forward_plan",
    ("sdpa-efficient", "bwd"): "sim.plans.sdpa:efficient_backward_plan",
    ("sdpa-cudnn", "fwd"): "sim.plans.sdpa:cudnn_forward_plan",
    ("simt", "fwd"): "sim.plans.simt:simt_forward_plan",
    ("simt", "bwd"): "sim.plans.simt:simt_backward_plan",
    # the papers' algorithms, built by the model itself (sim.plans.textbook)
    ("naive", "fwd"): "sim.plans.textbook:naive_fwd_plan",
    ("naive", "bwd"): "sim.plans.textbook:naive_bwd_plan",
    ("flash1", "fwd"): "sim.plans.textbook:flash1_fwd_plan",
    ("flash1", "bwd"): "sim.plans.textbook:flash1_bwd_plan",
    ("flash2", "fwd"): "sim.plans.textbook:flash2_fwd_plan",
    ("flash2", "bwd"): "sim.plans.textbook:flash2_bwd_plan",
    # PyTorch's unfused attention: the MATH backend and eager (sim.plans.textbook)
    ("sdpa-math", "fwd"): "sim.plans.textbook:sdpa_math_fwd_plan",
    ("sdpa-math", "bwd"): "sim.plans.textbook:sdpa_math_bwd_plan",
    ("eager", "fwd"): "sim.plans.textbook:eager_fwd_plan",
    ("eager", "bwd"): "sim.plans.textbook:eager_bwd_plan",
}

#: (family, pass) -> "module:function" listing its legal configurations for a workload.
CONFIGS = {
    ("mma", "fwd"): "sim.plans.tensor_core_fwd:mma_forward_configs",
    ("tf32", "fwd"): "sim.plans.tensor_core_fwd:tf32_forward_configs",
    ("wgmma", "fwd"): "sim.plans.wgmma_fwd:wgmma_forward_configs",
    ("wgmma", "bwd"): "sim.plans.wgmma_bwd:wgmma_backward_configs",
    ("simt", "fwd"): "sim.plans.simt:simt_forward_configs",
    ("simt", "bwd"): "sim.plans.simt:simt_backward_configs",
}


def _resolve(table: dict, key):
    module, function = table[key].split(":")
    return getattr(importlib.import_module(module), function)


def plan_for(family: str, pass_: str, workload, **config):
    """The `sim.plan.Plan` family ``family`` launches for ``workload``'s pass ``pass_`` ("fwd"
    or "bwd") with ``config`` (the family's tiles and options; missing ones take its defaults).
    Raises ValueError naming the argument for a family or pass without a plan."""
    key = (family, pass_)
    if key not in PLANNERS:
        known = sorted({f for f, _p in PLANNERS})
        raise ValueError(f"no plan for family={family!r}, pass_={pass_!r} (families with plans: "
                         f"{known}; passes 'fwd', 'bwd')")
    items = tuple(sorted(config.items()))
    try:
        by_value = _ByValue(workload, items)
    except TypeError:   # an array in the workload (a block mask) or the config: built each time
        return _resolve(PLANNERS, key)(workload, **config)
    return _cached_plan(family, pass_, by_value)


class _ByValue:
    """A workload and a config compared and hashed by their values (`sim.Workload` compares by
    identity, as it may hold a block-mask array); TypeError where a value is unhashable."""

    __slots__ = ("workload", "items", "_key")

    def __init__(self, workload, items: tuple):
        fields = getattr(workload, "__dataclass_fields__", None)
        if fields is None or getattr(workload, "block_mask", None) is not None:
            raise TypeError("not hashable by value")
        self.workload, self.items = workload, items
        self._key = (type(workload), tuple(getattr(workload, f) for f in fields), items)
        hash(self._key)

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _ByValue) and self._key == other._key


@functools.lru_cache(maxsize=1024)
def _cached_plan(family: str, pass_: str, by_value: _ByValue):
    """:func:`plan_for`'s plans, built once per (family, pass, workload values, config): a plan
    is frozen data, and a launcher asks for the same one at every call."""
    return _resolve(PLANNERS, (family, pass_))(by_value.workload, **dict(by_value.items))


def choose(family: str, pass_: str, workload, profile="h100", **fixed):
    """``(config, cost, ranked)``: the configuration of ``family`` the model prices fastest for
    ``workload`` on ``profile`` (ties: the larger tiles, compared value by value in the
    configuration's order, a tile pair element by element), its `sim.plan.PlanCost`, and every
    legal configuration as ``[(time_s, config)]`` fastest first. ``fixed``: options passed to
    every plan (e.g. ``registers``, or the wgmma forward's schedule); a configuration whose plan
    refuses them (a ValueError: e.g. three consumer warpgroups with the serial schedule) is not
    legal under them and is left out."""
    from ..plan import price
    key = (family, pass_)
    if key not in CONFIGS:
        raise ValueError(f"no configurations listed for family={family!r}, pass_={pass_!r} "
                         f"(listed: {sorted(CONFIGS)})")
    ranked = []
    for cfg in _resolve(CONFIGS, key)(workload):
        try:
            plan = plan_for(family, pass_, workload, **cfg, **fixed)
        except ValueError:
            if not fixed:
                raise
            continue
        cost = price(plan, profile)
        ranked.append((cost.time_s, _larger_first(cfg), cfg, cost))
    if not ranked:
        raise ValueError(f"family={family!r} has no legal configuration for this workload")
    ranked.sort(key=lambda r: r[:2])
    return ranked[0][2], ranked[0][3], [(t, c) for t, _k, c, _p in ranked]


def _larger_first(cfg: dict) -> tuple:
    """A sort key that puts larger configuration values first: each value negated, a tuple
    value (a tile pair) element by element."""
    return tuple(-x for v in cfg.values() for x in (v if isinstance(v, tuple) else (v,)))


def plans_for_record(rec: dict) -> list | None:
    """The plans a results record ran (one per pass of its ``pass``: "fwd", "bwd" or
    "fwd+bwd"), from what it names: ``kernel`` "ioaware-numba", its ``variant`` (the family;
    none: ``simt``, or ``mma`` for ``implementation`` ``kernels.flash_mma_fwd``; the backward's
    ``variant_bwd`` where a forward + backward record names one), the problem,
    and the forward's ``block_q`` / ``block_k`` (the tensor-core backwards choose their own
    tiles; a tensor-core backward's ``dq_mode``, "kernel" when absent; the wgmma forward's
    ``pingpong`` and ``overlap``, serial when absent; the simt passes take the record's tiles and micro-tiles,
    `sim.plans.simt.record_config`); or ``kernel`` one of PyTorch's SDPA backends
    (`sim.plans.sdpa.SDPA_FAMILIES`: the family), measured on sm_90, with the tiles its dispatch
    picks. None for a record of another kernel, of a family/pass without a plan, of simt kernels
    that no longer exist (`sim.plans.simt.record_is_current`), or of a problem an SDPA plan does
    not model; or ``kernel`` ``sdpa-math`` / ``eager`` (PyTorch's unfused attention, as the
    kernel sequences `sim.plans.textbook` lays out).
    Nothing is read from the record's measurements."""
    from ..workload import Workload
    if rec.get("kernel") in _SDPA_FAMILIES:
        return _sdpa_plans(rec)
    if rec.get("kernel") in ("sdpa-math", "eager"):
        return _unfused_plans(rec)
    if rec.get("kernel") != "ioaware-numba":
        return None
    # no variant: the simt family, or mma for kernels.flash_mma_fwd (as sim.compare reads it)
    family = rec.get("variant") or ("mma" if rec.get("implementation") == "kernels.flash_mma_fwd"
                                    else "simt")
    passes = ("fwd", "bwd") if rec.get("pass") == "fwd+bwd" else (rec.get("pass"),)
    # a forward + backward record names its backward's family apart where it differs
    families = {p: (rec.get("variant_bwd") or family) if p == "bwd" else family for p in passes}
    if any((families[p], p) not in PLANNERS for p in passes):
        return None
    if "simt" in families.values():  # tiles and micro-tiles as the record names them; today's kernels only
        from .simt import record_config, record_is_current
        if not record_is_current(rec):
            return None
    plans = []
    for p in passes:
        w = Workload.from_record(dict(rec, **{"pass": p}))
        fam = families[p]
        if fam == "simt":
            tiles = record_config(rec, p)
        else:
            tiles = {"block_q": rec.get("block_q"), "block_k": rec.get("block_k")} if p == "fwd" else {}
            if fam in ("mma", "tf32") and p == "bwd" and rec.get("dq_mode") == "atomic":
                tiles["dq_mode"] = "atomic"     # a record without it ran the dQ kernel
            if fam == "wgmma" and p == "fwd":   # a record without a schedule ran the serial one
                from .wgmma_fwd import record_schedule
                tiles.update(record_schedule(rec))
            if fam == "wgmma" and p == "bwd":   # the tiles and launch order the record ran
                from .wgmma_bwd import record_config as wgmma_bwd_record_config
                tiles.update(wgmma_bwd_record_config(rec))
        plans.append(plan_for(fam, p, w, **tiles))
    return plans


#: The results records' kernel names of PyTorch's SDPA backends (`sim.plans.sdpa.SDPA_FAMILIES`).
_SDPA_FAMILIES = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")


def _sdpa_plans(rec: dict) -> list | None:
    """The plans of an SDPA backend's record (its kernel name is the family; the backend's
    dispatch picks the tiles), or None where a pass has no plan, the record was not measured on
    sm_90, or the plan refuses the problem (ValueError: not modelled)."""
    from ..workload import Workload
    from .sdpa import record_on_sm90, sdpa_record_config
    family = rec["kernel"]
    passes = ("fwd", "bwd") if rec.get("pass") == "fwd+bwd" else (rec.get("pass"),)
    if any((family, p) not in PLANNERS for p in passes) or not record_on_sm90(rec):
        return None
    plans = []
    for p in passes:
        try:
            w = Workload.from_record(dict(rec, **{"pass": p}))
            plans.append(plan_for(family, p, w, **sdpa_record_config(family, p, rec)))
        except ValueError:
            return None
    return plans


def _unfused_plans(rec: dict) -> list | None:
    """The plans of a record of PyTorch's unfused attention (``sdpa-math``, ``eager``: their
    kernel sequences, `sim.plans.textbook.UNFUSED_SCHEDULES`), or None where the sequence is
    not modelled (masks other than causal, dropout, GQA: `sim.counts.check_naive_variant`)."""
    from ..workload import Workload
    passes = ("fwd", "bwd") if rec.get("pass") == "fwd+bwd" else (rec.get("pass"),)
    plans = []
    for p in passes:
        try:
            w = Workload.from_record(dict(rec, **{"pass": p}))
            plans.append(plan_for(rec["kernel"], p, w))
        except ValueError:
            return None
    return plans
