"""The plans of the kernel families (`sim.plan.Plan`), built from a workload and a configuration.

Each module here holds what one kind of kernel does, as data, and the layout facts its launcher
needs (tile choices, threads, shared memory): `kernels` imports them and launches exactly the
plan; `sim` prices it (:func:`sim.plan.price`). :func:`plan_for` is the one entry point:

    plan_for("mma", "fwd", workload, block_q=128, block_k=64) -> sim.plan.Plan

Families: ``mma`` (tensor-core float16/bfloat16), ``tf32`` (3xTF32 tensor-core float32).
"""
from __future__ import annotations

import importlib

__all__ = ["plan_for", "choose", "PLANNERS", "CONFIGS"]

#: (family, pass) -> "module:function" building its plan (workload, **config) -> Plan.
PLANNERS = {
    ("mma", "fwd"): "sim.plans.tensor_core_fwd:mma_forward_plan",
    ("tf32", "fwd"): "sim.plans.tensor_core_fwd:tf32_forward_plan",
}

#: (family, pass) -> "module:function" listing its legal configurations for a workload.
CONFIGS = {
    ("mma", "fwd"): "sim.plans.tensor_core_fwd:mma_forward_configs",
    ("tf32", "fwd"): "sim.plans.tensor_core_fwd:tf32_forward_configs",
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
    return _resolve(PLANNERS, key)(workload, **config)


def choose(family: str, pass_: str, workload, profile="h100", **fixed):
    """``(config, cost, ranked)``: the configuration of ``family`` the model prices fastest for
    ``workload`` on ``profile`` (ties: the larger tiles), its `sim.plan.PlanCost`, and every legal
    configuration as ``[(time_s, config)]`` fastest first. ``fixed``: options passed to every
    plan (e.g. ``registers``)."""
    from ..plan import price
    key = (family, pass_)
    if key not in CONFIGS:
        raise ValueError(f"no configurations listed for family={family!r}, pass_={pass_!r} "
                         f"(listed: {sorted(CONFIGS)})")
    ranked = []
    for cfg in _resolve(CONFIGS, key)(workload):
        cost = price(plan_for(family, pass_, workload, **cfg, **fixed), profile)
        ranked.append((cost.time_s, tuple(-v for v in cfg.values()), cfg, cost))
    if not ranked:
        raise ValueError(f"family={family!r} has no legal configuration for this workload")
    ranked.sort(key=lambda r: r[:2])
    return ranked[0][2], ranked[0][3], [(t, c) for t, _k, c, _p in ranked]
