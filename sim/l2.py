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

import functools
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


def interleave(tr: Trace, slots: dict | int, subset: np.ndarray | None = None) -> np.ndarray:
    """Event indices in the order concurrently resident programs would issue them (see module
    doc). With ``subset`` (event indices, ascending), the order of those events alone, as
    positions in ``subset``: the same relative order as in the whole trace's."""
    c = tr.columns
    n = len(tr)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    phase, prog, step = c["phase"], c["program"], c["step"]
    n_phases = len(tr.phases)
    program_lengths, event_times = _interleave_loops()
    # -- each program's length (its last step + 1), per phase --
    offsets, lengths = program_lengths(phase, prog, step, n_phases)
    n_programs = np.diff(offsets)
    # -- greedy list scheduling of each phase's programs onto its slots, in launch order --
    start = np.zeros(int(offsets[-1]), dtype=np.int64)
    for pid, pname in enumerate(tr.phases):
        nprog = int(n_programs[pid])
        s = slots if isinstance(slots, int) else slots.get(pname, 1)
        s = max(1, int(s))
        if nprog > s:
            length = lengths[offsets[pid]:offsets[pid + 1]].tolist()
            first = start[offsets[pid]:offsets[pid + 1]]
            heap = [(0, i) for i in range(s)]
            for p in range(nprog):
                t, slot = heapq.heappop(heap)
                first[p] = t
                heapq.heappush(heap, (t + length[p], slot))
    index = np.arange(n) if subset is None else np.asarray(subset, dtype=np.int64)
    ph, pr = phase[index].astype(np.int64), prog[index].astype(np.int64)
    time = event_times(ph, pr, step[index], offsets, start)
    # -- sort by (phase, time, program), ties in trace order: one stable sort of a packed key
    #    where the three fit 63 bits, else a lexsort --
    bits = [max(1, int(x.max()).bit_length()) for x in (ph, time, pr)] if len(index) else [1, 1, 1]
    if sum(bits) <= 63 and len(index) and min(ph.min(), time.min(), pr.min()) >= 0:
        return np.argsort((ph << (bits[1] + bits[2])) | (time << bits[2]) | pr, kind="stable")
    return np.lexsort((index, pr, time, ph))


def _compiled(fn):
    """``fn`` compiled by Numba for the CPU on its first call, cached on disk where Numba finds
    a writable place for it (beside this file, else the user's cache directory), else compiled
    in each process."""
    from numba import njit
    try:
        return njit(cache=True)(fn)
    except RuntimeError:        # no cache locator (a read-only install without a user cache)
        return njit(fn)


@functools.cache
def _interleave_loops():
    """The two passes of :func:`interleave` over every event, compiled by Numba (CPU):
    ``program_lengths(phase, program, step, n_phases) -> (offsets, lengths)``: where each
    phase's programs start in ``lengths`` (and after the last, the count), and each program's
    last step + 1, phase by phase; and ``event_times(phase, program, step, offsets, start) ->
    start of the event's program + its step``."""
    @_compiled
    def program_lengths(phase, prog, step, n_phases):
        n_programs = np.zeros(n_phases, np.int64)
        for i in range(len(phase)):
            if prog[i] + 1 > n_programs[phase[i]]:
                n_programs[phase[i]] = prog[i] + 1
        offsets = np.zeros(n_phases + 1, np.int64)
        for p in range(n_phases):
            offsets[p + 1] = offsets[p] + n_programs[p]
        lengths = np.zeros(offsets[n_phases], np.int64)
        for i in range(len(phase)):
            j = offsets[phase[i]] + prog[i]
            if step[i] + 1 > lengths[j]:
                lengths[j] = step[i] + 1
        return offsets, lengths

    @_compiled
    def event_times(phase, prog, step, offsets, start):
        time = np.empty(len(phase), np.int64)
        for i in range(len(phase)):
            time[i] = start[offsets[phase[i]] + prog[i]] + step[i]
        return time

    return program_lengths, event_times


def simulate_l2(tr: Trace, l2_bytes: int, slots: dict | int, granularity: int = DEFAULT_GRANULARITY) -> L2Result:
    """Replay the interleaved trace through an LRU L2 and count DRAM bytes (see module doc)."""
    G = int(granularity)
    capacity = max(1, int(l2_bytes) // G)
    c = tr.columns
    n_ph = len(tr.phases)
    mem = np.flatnonzero(c["op"] != OPS.index("compute"))
    order = mem[interleave(tr, slots, mem)]
    ops = c["op"][order]
    addrs = c["addr"][order]
    sizes = c.get("footprint", c["bytes"])[order]      # rows touched, not request bytes
    phases = c["phase"][order]
    n_granules = int(((addrs + np.maximum(sizes, 1) - 1) // G).max()) + 1 if len(order) else 1
    rd, wr, hits, accesses = _lru_replay()(ops, addrs, sizes, phases, G, capacity, n_ph, n_granules)
    rd, wr = rd.tolist(), wr.tolist()
    per = {tr.phases[i]: {"dram_read_bytes": rd[i], "dram_write_bytes": wr[i]} for i in range(n_ph)}
    return L2Result(sum(rd), sum(wr), per, "trace", G, int(l2_bytes),
                    slots if isinstance(slots, dict) else {"*": slots},
                    int(hits) / int(accesses) if accesses else None)


@functools.cache
def _lru_replay():
    """The replay loop of :func:`simulate_l2`, compiled by Numba (CPU) on first use.

    ``(rd, wr, hits, accesses) = replay(ops, addrs, sizes, phases, G, capacity, n_phases,
    n_granules)`` over the events in replay order: each event touches the granules of
    ``[addr, addr + size)`` in turn. An LRU of ``capacity`` granules as a doubly linked list
    over granule numbers (head: least recently used): a hit moves the granule to the tail (a
    write adds the bytes it writes to the granule's dirty bytes, at most ``G``); a miss reads
    the bytes it touches from DRAM unless it is a store, appends the granule (dirty with the
    bytes a write touches) and, over capacity, evicts the head, whose dirty bytes are written
    in the current event's phase. At the end every resident granule's dirty bytes are written
    in the last event's phase."""
    @_compiled
    def replay(ops, addrs, sizes, phases, G, capacity, n_phases, n_granules):
        prev = np.full(n_granules, -1, np.int64)
        nxt = np.full(n_granules, -1, np.int64)
        dirty = np.zeros(n_granules, np.int64)
        present = np.zeros(n_granules, np.bool_)
        rd = np.zeros(n_phases, np.int64)
        wr = np.zeros(n_phases, np.int64)
        head = -1
        tail = -1
        count = 0
        hits = 0
        accesses = 0
        for i in range(len(ops)):
            sz = sizes[i]
            if sz <= 0:
                continue
            a = addrs[i]
            end = a + sz
            g0 = a // G
            g1 = (end - 1) // G
            writes = ops[i] != 0
            reads = ops[i] != 1
            ph = phases[i]
            for g in range(g0, g1 + 1):
                lo = a if g == g0 else g * G
                hi = end if g == g1 else (g + 1) * G
                ov = hi - lo
                accesses += 1
                if present[g]:
                    hits += 1
                    if g != tail:                      # unlink, then append at the tail
                        p = prev[g]
                        q = nxt[g]
                        if p == -1:
                            head = q
                        else:
                            nxt[p] = q
                        prev[q] = p
                        prev[g] = tail
                        nxt[g] = -1
                        nxt[tail] = g
                        tail = g
                    if writes:
                        dirty[g] = min(G, dirty[g] + ov)
                else:
                    if reads:
                        rd[ph] += ov
                    dirty[g] = ov if writes else 0
                    present[g] = True
                    prev[g] = tail
                    nxt[g] = -1
                    if tail == -1:
                        head = g
                    else:
                        nxt[tail] = g
                    tail = g
                    count += 1
                    if count > capacity:                # evict the least recently used
                        v = head
                        head = nxt[v]
                        prev[head] = -1
                        nxt[v] = -1
                        present[v] = False
                        wr[ph] += dirty[v]
                        dirty[v] = 0
                        count -= 1
        if len(phases):
            last = phases[len(phases) - 1]
            g = head
            while g != -1:
                wr[last] += dirty[g]
                g = nxt[g]
        return rd, wr, hits, accesses

    return replay


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
