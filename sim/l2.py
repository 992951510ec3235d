"""The L2 model: global-memory traffic (SM <-> L2) turned into DRAM traffic.

Assumptions (all visible here, none hidden in constants elsewhere):

* **Interleaving.** Each phase (kernel) launches its programs in launch order onto
  ``slots = num_sms * blocks_per_sm`` concurrent slots (greedy list scheduling: a program starts
  when the earliest slot frees). Every program advances one ``step`` per time unit, so events
  are replayed ordered by (phase, start + step, program). Phases run one after another; the L2
  keeps its contents across phases.
* **Cache.** One unified, fully associative LRU of ``l2_bytes`` (the two partitions of A100/H100
  L2 and their duplication are not modelled) at a granularity of ``granularity`` bytes
  (default 4 KiB). A load or atomic that misses a granule reads from DRAM the bytes it touches in
  that granule (sector-like fetch); a store miss allocates without fetching (whole-sector
  writes). Dirty bytes are written to DRAM on eviction and at the end (everything written
  reaches DRAM eventually).
* **Analytic fallback.** Traces above ``max_events`` are not replayed: :func:`l2_analytic`
  estimates DRAM bytes from tensor footprints (approximate; reported as ``l2_model =
  "analytic"``).
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .trace import OPS, Trace

__all__ = ["L2Result", "simulate_l2", "interleave", "l2_analytic", "DEFAULT_GRANULARITY"]

DEFAULT_GRANULARITY = 4096


@dataclass
class L2Result:
    """DRAM traffic predicted by the L2 model (bytes), in total and per phase."""

    dram_read_bytes: int
    dram_write_bytes: int
    phases: dict = field(default_factory=dict)  # phase -> {"dram_read_bytes", "dram_write_bytes"}
    model: str = "trace"
    granularity: int = DEFAULT_GRANULARITY
    l2_bytes: int = 0
    slots: dict = field(default_factory=dict)
    hit_rate: float | None = None


def interleave(tr: Trace, slots: dict | int) -> np.ndarray:
    """Event indices in the order concurrently resident programs would issue them (see module doc)."""
    c = tr.columns
    n = len(tr)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    phase, prog, step = c["phase"], c["program"], c["step"]
    time = np.zeros(n, dtype=np.int64)
    for pid, pname in enumerate(tr.phases):
        sel = np.flatnonzero(phase == pid)
        if not len(sel):
            continue
        nprog = int(prog[sel].max()) + 1
        length = np.zeros(nprog, dtype=np.int64)
        np.maximum.at(length, prog[sel], step[sel] + 1)
        s = slots if isinstance(slots, int) else slots.get(pname, 1)
        s = max(1, int(s))
        start = np.zeros(nprog, dtype=np.int64)
        if nprog > s:
            heap = [(0, i) for i in range(s)]
            for p in range(nprog):
                t, slot = heapq.heappop(heap)
                start[p] = t
                heapq.heappush(heap, (t + int(length[p]), slot))
        time[sel] = start[prog[sel]] + step[sel]
    return np.lexsort((np.arange(n), prog, time, phase))


def simulate_l2(tr: Trace, l2_bytes: int, slots: dict | int, granularity: int = DEFAULT_GRANULARITY) -> L2Result:
    """Replay the interleaved trace through an LRU L2 and count DRAM bytes (see module doc)."""
    G = int(granularity)
    capacity = max(1, int(l2_bytes) // G)
    order = interleave(tr, slots)
    c = tr.columns
    compute = OPS.index("compute")
    order = order[c["op"][order] != compute]
    ops = c["op"][order].tolist()
    addrs = c["addr"][order].tolist()
    sizes = c["bytes"][order].tolist()
    phases = c["phase"][order].tolist()
    n_ph = len(tr.phases)
    rd = [0] * n_ph
    wr = [0] * n_ph
    cache: OrderedDict = OrderedDict()
    move = cache.move_to_end
    pop = cache.popitem
    hits = accesses = 0
    for op, a, sz, ph in zip(ops, addrs, sizes, phases):
        if sz <= 0:
            continue
        end = a + sz
        g0, g1 = a // G, (end - 1) // G
        writes = op != 0
        reads = op != 1
        for g in range(g0, g1 + 1):
            lo = a if g == g0 else g * G
            hi = end if g == g1 else (g + 1) * G
            ov = hi - lo
            accesses += 1
            dirty = cache.get(g)
            if dirty is not None:
                hits += 1
                move(g)
                if writes:
                    cache[g] = min(G, dirty + ov)
            else:
                if reads:
                    rd[ph] += ov
                cache[g] = ov if writes else 0
                if len(cache) > capacity:
                    _, db = pop(last=False)
                    wr[ph] += db
    last = phases[-1] if phases else 0
    for db in cache.values():
        wr[last] += db
    per = {tr.phases[i]: {"dram_read_bytes": rd[i], "dram_write_bytes": wr[i]} for i in range(n_ph)}
    return L2Result(sum(rd), sum(wr), per, "trace", G, int(l2_bytes),
                    slots if isinstance(slots, dict) else {"*": slots},
                    hits / accesses if accesses else None)


def l2_analytic(bytes_by_key: dict, tensor_bytes: dict, programs_per_slice: dict, n_slices: int,
                slots: dict, l2_bytes: int) -> L2Result:
    """Footprint estimate of DRAM bytes, per phase, for traces too large to replay.

    For each phase, the *compulsory* traffic of a tensor is ``min(global bytes, tensor size)``.
    If the data of the slices concurrently in flight (``ceil(slots / programs per slice) + 1``
    slices, each ``phase footprint / n_slices`` bytes) fits in L2, DRAM traffic is compulsory;
    otherwise it equals the global traffic. Approximate by design.
    """
    per: dict = {}
    by_phase: dict = {}
    for (phase, tensor, op), v in bytes_by_key.items():
        by_phase.setdefault(phase, []).append((tensor, op, v))
    for phase, items in by_phase.items():
        touched = {t for t, _o, _v in items}
        footprint = sum(tensor_bytes.get(t, 0) for t in touched)
        pps = max(1, programs_per_slice.get(phase, 1))
        in_flight = -(-max(1, slots.get(phase, 1)) // pps) + 1
        fits = footprint / max(1, n_slices) * min(in_flight, n_slices) <= l2_bytes
        rd = wr = 0
        for t, op, v in items:
            comp = min(v, tensor_bytes.get(t, v))
            val = comp if fits else v
            if op == "load":
                rd += val
            elif op == "store":
                wr += val
            else:
                rd += comp if fits else v
                wr += comp if fits else v
        per[phase] = {"dram_read_bytes": rd, "dram_write_bytes": wr}
    return L2Result(sum(p["dram_read_bytes"] for p in per.values()),
                    sum(p["dram_write_bytes"] for p in per.values()), per, "analytic", 0,
                    int(l2_bytes), dict(slots), None)
