"""The plans of the kernel families (`sim.plan.Plan`), built from a workload and a configuration.

Each module here holds what one kind of kernel does, as data, and the layout facts its launcher
needs (tile choices, threads, shared memory): `kernels` imports them and launches exactly the
plan; `sim` prices it (:func:`sim.plan.price`). :func:`plan_for` is the one entry point:

    plan_for("mma", "fwd", workload, block_q=128, block_k=64) -> sim.plan.Plan

Families: ``mma`` (tensor-core float16/bfloat16), ``tf32`` (3xTF32 tensor-core float32).
"""
from __future__ import annotations

import importlib

__all__ = ["plan_for", "PLANNERS"]

#: (family, pass) -> "module:function" building its plan (workload, **config) -> Plan.
PLANNERS = {
    ("mma", "fwd"): "sim.plans.tensor_core_fwd:mma_forward_plan",
    ("tf32", "fwd"): "sim.plans.tensor_core_fwd:tf32_forward_plan",
}


def plan_for(family: str, pass_: str, workload, **config):
    """The `sim.plan.Plan` family ``family`` launches for ``workload``'s pass ``pass_`` ("fwd"
    or "bwd") with ``config`` (the family's tiles and options; missing ones take its defaults).
    Raises ValueError naming the argument for a family or pass without a plan."""
    key = (family, pass_)
    if key not in PLANNERS:
        known = sorted({f for f, _p in PLANNERS})
        raise ValueError(f"no plan for family={family!r}, pass_={pass_!r} (families with plans: "
                         f"{known}; passes 'fwd', 'bwd')")
    module, function = PLANNERS[key].split(":")
    return getattr(importlib.import_module(module), function)(workload, **config)
