"""The L2 model: global-memory traffic (SM <-> L2) turned into DRAM traffic.

Assumptions (all visible here, none hidden in constants elsewhere):

* **Interleaving.** Each phase (kernel) launches its programs in launch order onto
  ``slots = num_sms * blocks_per_sm`` concurrent slots (greedy list scheduling: a program starts
  when the earliest slot frees). Every program advances one ``step`` per time unit, so events
  are replayed ordered by (phase, start + step, program). Phases run one after another; the L2
  keeps its contents across phases. Launch order is the trace's program order: (b, h, tile),
  tile fastest, or with ``Schedule.launch_head_group`` the tensor-core kernels' dispatch order
  (`ioaware.launch_order`). The analytic fallback below has no notion of order
  (docs/model.md, "Launch order and the L2 model").
* **Cache.** One unified, fully associative LRU of ``l2_bytes`` (the two partitions of A100/H100
  L2 and their duplication are not modelled) at a granularity of ``granularity`` bytes
  (default 4 KiB). A load or atomic that misses a granule reads from DRAM the bytes it touches in
  that granule (sector-like fetch); a store miss allocates without fetching (whole-sector
  writes). Dirty bytes are written to DRAM on eviction and at the end (everything written
  reaches DRAM eventually).
* **Analytic fallback.** Traces above ``max_events`` are not replayed: :func:`l2_analytic`
  estimates DRAM bytes from the working set of each phase's reuse (a slice's K/V held for its
  concurrently resident Q-block programs, and so on) and a tensor-granular LRU between phases
  (approximate; reported as ``l2_model = "analytic"``).
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
    sizes = c.get("footprint", c["bytes"])[order].tolist()   # rows touched, not request bytes
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
                slots: dict, l2_bytes: int, steps_per_program: dict | None = None,
                lockstep: dict | None = None, stagger: dict | None = None) -> L2Result:
    """Working-set estimate of DRAM bytes, per phase, for traces too large to replay.

    Phases are taken in order (the order of ``bytes_by_key``). Within a phase, a tensor whose
    global traffic ``v`` exceeds its size is *reused* (K/V of a slice by its Q-block programs,
    Q/dO/lse/D/dQ by the K-block programs of the backward, FlashAttention-1's Q, O, l, m by the
    steps of one program); the others are *streamed* (each byte once). With ``concurrent =
    min(programs, slots)`` resident programs, the working set ``ws`` of one reuse cycle is:

    * all programs of a slice resident together (``1 < programs_per_slice <= concurrent``) and
      walking its tiles in the same order (``lockstep[phase]``, default True): 0 — a tile is
      shared as it is loaded;
    * resident together, staggered (``stagger[phase] = (s, tiles)``: the causal backward, whose
      K-block program n starts at its first visiting Q block, ``s = block_k / block_q`` Q blocks
      after program n - 1's, so program n reads a Q tile s steps before program n - 1 does):
      what the ``concurrent`` programs read in those s steps, ``concurrent * s * reused bytes /
      tiles`` (``tiles`` = all (program, step) pairs of the phase);
    * resident together but not in step otherwise (``lockstep`` False, no ``stagger``:
      block-sparse): half the reused data of the ``ceil(concurrent / programs_per_slice) + 1``
      slices in flight, plus the streamed bytes of ``concurrent`` programs when there is more
      than one wave;
    * a slice's programs spread over several waves: the reused data of the slices of one wave,
      plus the streamed bytes of ``concurrent`` programs;
    * one program per slice (FlashAttention-1): reuse from one step to the next — the distinct
      bytes per step of the ``concurrent`` programs (``steps_per_program``).

    Reuse across programs hits in full while ``ws <= L2`` and not at all from ``ws >= 2 L2``,
    linearly in between (the programs' reuse distances are spread); reuse within a program
    (cyclic) hits only while ``ws <= L2``. A reused tensor costs its footprint ``min(v, size)``
    plus the missed share of its re-reads (and re-writes). Between phases the L2 is an LRU of
    whole tensors: a tensor's bytes touched last stay resident (up to ``l2_bytes``) and a later
    phase reads them from the L2 (all of them when its own footprint fits, none when it is
    twice the L2 or more, linearly in between); stores are dirty and reach DRAM once, on
    eviction or at the end (as in :func:`simulate_l2`). Approximate by design; the tests hold it
    to the trace-driven model on a grid of small workloads (FlashAttention-2 and naive: >= 85 %
    within 20 %).
    """
    L2 = max(1, int(l2_bytes))
    steps_per_program = steps_per_program or {}
    lockstep = lockstep or {}
    stagger = stagger or {}
    by_phase: dict = {}
    for (phase, tensor, op), v in bytes_by_key.items():
        if v:
            by_phase.setdefault(phase, []).append((tensor, op, int(v)))
    resident: OrderedDict = OrderedDict()   # tensor -> [resident bytes, dirty bytes]
    per: dict = {}

    def evict(phase_wr):
        total = sum(r for r, _d in resident.values())
        while total > L2 and resident:
            t, (r, dty) = next(iter(resident.items()))
            drop = min(r, total - L2)
            frac = drop / r if r else 1.0
            wdrop = int(round(dty * frac))
            phase_wr[0] += wdrop
            if drop >= r:
                del resident[t]
            else:
                resident[t] = [r - drop, dty - wdrop]
            total -= drop

    for phase, items in by_phase.items():
        pps = max(1, int(programs_per_slice.get(phase, 1)))
        programs = pps * max(1, n_slices)
        concurrent = min(programs, max(1, int(slots.get(phase, 1))))
        in_flight = min(n_slices, -(-concurrent // pps) + 1)
        cycles = 1 if pps > 1 else max(1, int(steps_per_program.get(phase, 1)))
        size = {t: tensor_bytes.get(t, v) for t, _o, v in items}
        touched: dict = {}
        for t, _o, v in items:
            touched[t] = touched.get(t, 0) + v
        reused = {t for t, v in touched.items() if v > size[t] * (2 if _rw(items, t) else 1)}
        streamed = sum(v for t, _o, v in items if t not in reused)
        together = 1 < pps <= concurrent            # all programs of a slice resident at once
        streamed_ws = concurrent * streamed / programs if programs > concurrent else 0.0
        if together and lockstep.get(phase, True):
            ws = 0.0      # they walk the slice's tiles in step: a tile is shared as it is loaded
        elif together and phase in stagger:
            # staggered starts (causal backward): a tile is re-read s steps later by the program
            # next door; in between, the resident programs read s steps' worth of reused tiles
            s_steps, tiles = stagger[phase]
            ws = concurrent * s_steps * sum(touched[t] for t in reused) / max(1, tiles)
        elif together:
            # programs start at different tiles (block-sparse): a tile's reuse spans about
            # half of the slice's reused data on average
            ws = 0.5 * sum(size[t] for t in reused) * min(1.0, in_flight / max(1, n_slices)) + streamed_ws
        elif pps > 1:  # a slice's programs span several waves: reuse from one wave to the next,
            # within the slices of one wave
            wave_slices = -(-concurrent // pps)
            ws = sum(size[t] for t in reused) * min(1.0, wave_slices / max(1, n_slices)) + streamed_ws
        else:          # one program per slice: reuse from one step to the next
            distinct = {}
            for t, _o, v in items:
                distinct[t] = max(distinct.get(t, 0), v)
            ws = concurrent * sum(distinct.values()) / programs / cycles
        if pps > 1:
            # reuse distances spread over the cycle (programs start and end at different
            # times): the share that hits falls linearly from 1 at ws = L2 to 0 at 2 L2
            hit = min(1.0, max(0.0, 2.0 - ws / L2))
        else:
            hit = 1.0 if ws <= L2 else 0.0   # LRU: a cyclic reuse that does not fit misses
        fits = hit >= 1.0
        footprint = sum(min(touched[t], size[t]) for t in touched)
        # share of what an earlier phase left resident that is still there when first touched
        keep = min(1.0, max(0.0, 2.0 - footprint / L2))
        rd = 0
        wr = [0]
        seen: set = set()
        for t, op, v in items:
            foot = min(v, size[t])
            if op in ("load", "atomic"):
                # resident from an earlier phase (all of it if this phase's footprint fits, else
                # in proportion) or written earlier in this phase (if its working set fits)
                r0 = resident.get(t, [0, 0])[0]
                credit = int(r0 * keep) if t not in seen else (r0 if fits else 0)
                need = foot if t not in reused else foot + (1.0 - hit) * (v - foot)
                rd += max(0, int(round(need)) - credit)
            if op in ("store", "atomic"):
                if t in reused:
                    wr[0] += int(round((1.0 - hit) * (v - foot)))  # rewritten tiles evicted between stores
                r, dty = resident.get(t, [0, 0])
                resident[t] = [max(r, foot), min(max(r, foot), dty + foot)]
            else:
                r, dty = resident.get(t, [0, 0])
                resident[t] = [max(r, foot), dty]
            resident.move_to_end(t)
            seen.add(t)
            evict(wr)
        per[phase] = {"dram_read_bytes": rd, "dram_write_bytes": wr[0]}
    if per:
        last = list(per)[-1]
        per[last]["dram_write_bytes"] += sum(dty for _r, dty in resident.values())
    return L2Result(sum(p["dram_read_bytes"] for p in per.values()),
                    sum(p["dram_write_bytes"] for p in per.values()), per, "analytic", 0,
                    int(l2_bytes), dict(slots), None)


def _rw(items, t) -> bool:
    """Whether a phase both reads and writes tensor ``t`` (a read-modify-write counts twice)."""
    ops = {op for tt, op, _v in items if tt == t}
    return ("load" in ops and "store" in ops) or "atomic" in ops
