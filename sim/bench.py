"""Benchmark of the cost model's own speed: ``python -m sim.bench``.

Targets (on a 2-core machine): a 10,000-configuration closed-form sweep < 1 s; the trace of
one N=4096, d=64, 64x64-block forward < 2 s; the L2 model on that trace < 10 s; building and
pricing one kernel family's plan without the L2 replay < 50 ms (the slowest of every family's
plans, `sim.plans.PLANNERS`, at B=4, H=16, N=16384, d=128, causal and not, with the plan and
closed-form caches emptied first); the trace and L2 replay of an N=16384 forward + backward
(64x64 blocks) < 5 s. The trace workloads are B=1, H=16 (the README's H100 example), so a
trace is 16 heads deep. Prints each timing (best of ``--repeat``) beside its target and the
ratio.
"""
from __future__ import annotations

import argparse
import time

import sim
from sim.l2 import simulate_l2
from sim.workload import occupancy, sram_bytes_per_block


def _best(fn, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _slowest_plan(repeat):
    """``(seconds, "family pass")``: the slowest of every family's plans (`sim.plans.PLANNERS`)
    to build and price (`sim.plan.price`, analytic L2) at B=4, H=16, N=16384, d=128, causal and
    not, each timed with the plan and closed-form caches emptied (best of ``repeat``)."""
    from sim.plan import price
    from sim.plans import PLANNERS, _cached_plan, _resolve
    worst, name = 0.0, ""
    for (family, pass_) in PLANNERS:
        dtype = {"tf32": "fp32", "wgmma_fp8": "bf16"}.get(family, "fp16")
        for causal in (False, True):
            w = sim.Workload(batch=4, heads=16, seq_len_q=16384, head_dim=128, dtype=dtype,
                             causal=causal, pass_="fwd" if pass_ == "fwd" else "fwd+bwd")

            def build_and_price():
                _cached_plan.cache_clear()
                sim.counts.tile_stats_closed.cache_clear()
                return price(_resolve(PLANNERS, (family, pass_))(w), "h100")

            t, _cost = _best(build_and_price, repeat)
            if t > worst:
                worst, name = t, f"{family} {pass_}{' causal' if causal else ''}"
    return worst, name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--heads", type=int, default=16)
    a = ap.parse_args(argv)

    kw = dict(schedule="flash2", seq_len=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
              head_dim=[32, 64, 96, 128, 256], block_q=[16, 32, 64, 128, 256], block_k=[16, 32, 64, 128, 256],
              batch=[1, 2, 4, 8], heads=[8, 16], causal=True, profile="h100")
    t_sweep, cols = _best(lambda: (sim.counts.tile_stats_closed.cache_clear(), sim.sweep(**kw))[1], a.repeat)
    n = len(cols["flops"])

    w = sim.Workload(batch=1, heads=a.heads, seq_len_q=4096, head_dim=64, dtype="fp16")
    s = sim.Schedule("flash2", 64, 64)
    t_trace, tr = _best(lambda: sim.trace(w, s), a.repeat)
    prof = sim.PROFILES["h100"]
    bps = occupancy(prof, sram_bytes_per_block("flash2", "fwd", 64, 64, 64, 2), s.num_warps)
    t_l2, res = _best(lambda: simulate_l2(tr, prof.l2_bytes, {"fwd": prof.num_sms * bps}), a.repeat)

    t_plan, slowest = _slowest_plan(a.repeat)

    w16 = sim.Workload(batch=1, heads=a.heads, seq_len_q=16384, head_dim=64, dtype="fp16",
                       pass_="fwd+bwd")
    slots16 = {p: prof.num_sms * 2 for p in ("fwd", "bwd.pre", "bwd.main", "bwd.dq", "bwd.post")}
    t_fb, res16 = _best(lambda: simulate_l2(sim.trace(w16, s), prof.l2_bytes, slots16), a.repeat)

    rows = [(f"closed-form sweep, {n} configs (causal flash2)", t_sweep, 1.0),
            (f"trace, B=1 H={a.heads} N=4096 d=64 64x64 fwd ({len(tr)} events)", t_trace, 2.0),
            (f"L2 model on that trace (H100, {prof.num_sms}x{bps} slots)", t_l2, 10.0),
            (f"plan built and priced, no L2 replay (slowest: {slowest})", t_plan, 0.05),
            (f"trace + L2 replay, B=1 H={a.heads} N=16384 d=64 64x64 fwd+bwd (H100, 2 programs/SM)",
             t_fb, 5.0)]
    width = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{width}}  {'seconds':>8}  {'target':>6}  {'time/target':>11}")
    for name, t, target in rows:
        print(f"{name:<{width}}  {t:8.3f}  {target:6.2f}  {t / target:11.3f}")
    print(f"L2 model: DRAM read {res.dram_read_bytes:,} B of {sum(tr.columns['bytes'][tr.columns['op'] == 0]):,} "
          f"B global loads (hit rate {res.hit_rate:.3f}); N=16384 fwd+bwd: DRAM read "
          f"{res16.dram_read_bytes:,} B, written {res16.dram_write_bytes:,} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
