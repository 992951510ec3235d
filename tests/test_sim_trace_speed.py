"""The fast trace and L2 replay are the slow ones, event for event and byte for byte.

* `sim.trace` walks one slice of each (BlockInfo, key length) group and copies its events to
  the group's other (b, h) slices (`_Builder.slices`); ``_replicate=False`` walks every slice,
  as the trace was built before. The two traces must be identical, column by column.
* `sim.l2.simulate_l2` replays through a Numba-compiled LRU; `_reference_replay` below is the
  pure-Python ``OrderedDict`` replay it replaced. DRAM bytes per phase and the hit rate must be
  identical.
* `sim.l2.interleave` of a subset of events is the whole order restricted to that subset.
"""
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.l2 import L2Result, interleave, simulate_l2
from sim.trace import _INT_COLS, OPS, Trace

SCHEDULES = [sim.Schedule("flash2", 32, 16), sim.Schedule("flash2", 16, 32, dq_mode="kernel"),
             sim.Schedule("flash1", 16, 32), sim.Schedule("flash2", 16, 16, launch_head_group=2),
             sim.Schedule("flash2", 32, 16, matmul_unit="cuda", micro_tile=(2, 2), micro_tile_kv=(2, 2)),
             sim.Schedule("naive")]


def _workload(draw_kind, seq, heads, group, pass_):
    kw = dict(batch=2, heads=heads * group, heads_kv=heads, seq_len_q=seq, head_dim=16, dtype="fp16",
              pass_=pass_)
    extra = {"plain": {}, "causal": {"causal": True}, "lengths": {"key_lengths": (seq, seq // 3 + 1)},
             "window": {"window_size": (seq // 4, 3)}, "sparse": {"block_density": 0.5},
             "dropout": {"dropout": True}, "nk": {"seq_len_k": seq + 13, "causal": True}}[draw_kind]
    return sim.Workload(**kw, **extra)


def _same_trace(a, b):
    assert a.phases == b.phases and a.tensors == b.tensors and a.meta == b.meta
    for k in _INT_COLS:
        assert a.columns[k].dtype == b.columns[k].dtype, k
        np.testing.assert_array_equal(a.columns[k], b.columns[k], err_msg=k)


@settings(max_examples=20, deadline=None)
@given(schedule=st.sampled_from(SCHEDULES),
       kind=st.sampled_from(["plain", "causal", "lengths", "window", "sparse", "dropout", "nk"]),
       seq=st.integers(20, 90), heads=st.integers(1, 3), group=st.sampled_from([1, 2]),
       pass_=st.sampled_from(["fwd", "fwd+bwd"]))
def test_copied_slices_are_the_walked_slices(schedule, kind, seq, heads, group, pass_):
    try:
        w = _workload(kind, seq, heads, group, pass_)
        walked = sim.trace(w, schedule, _replicate=False)
    except ValueError:          # a combination the model refuses by name
        return
    _same_trace(sim.trace(w, schedule), walked)


def _reference_replay(tr, l2_bytes, slots, granularity):
    """The replay as it was written before it was compiled: an OrderedDict LRU of granules."""
    G = int(granularity)
    capacity = max(1, int(l2_bytes) // G)
    order = interleave(tr, slots)
    c = tr.columns
    order = order[c["op"][order] != OPS.index("compute")]
    ops, addrs = c["op"][order].tolist(), c["addr"][order].tolist()
    sizes, phases = c["footprint"][order].tolist(), c["phase"][order].tolist()
    rd, wr = [0] * len(tr.phases), [0] * len(tr.phases)
    cache = OrderedDict()
    hits = accesses = 0
    for op, a, sz, ph in zip(ops, addrs, sizes, phases):
        if sz <= 0:
            continue
        end = a + sz
        for g in range(a // G, (end - 1) // G + 1):
            ov = min(end, (g + 1) * G) - max(a, g * G)
            accesses += 1
            dirty = cache.get(g)
            if dirty is not None:
                hits += 1
                cache.move_to_end(g)
                if op != 0:
                    cache[g] = min(G, dirty + ov)
            else:
                if op != 1:
                    rd[ph] += ov
                cache[g] = ov if op != 0 else 0
                if len(cache) > capacity:
                    wr[ph] += cache.popitem(last=False)[1]
    for db in cache.values():
        wr[phases[-1] if phases else 0] += db
    per = {tr.phases[i]: {"dram_read_bytes": rd[i], "dram_write_bytes": wr[i]}
           for i in range(len(tr.phases))}
    return L2Result(sum(rd), sum(wr), per, "trace", G, int(l2_bytes), {}, hits / accesses if accesses else None)


@settings(max_examples=20, deadline=None)
@given(schedule=st.sampled_from(SCHEDULES),
       kind=st.sampled_from(["plain", "causal", "lengths", "window", "sparse", "nk"]),
       seq=st.integers(20, 120), heads=st.integers(1, 3), group=st.sampled_from([1, 2]),
       pass_=st.sampled_from(["fwd", "fwd+bwd"]),
       l2_kib=st.sampled_from([4, 16, 64, 1024]), granularity=st.sampled_from([32, 128, 4096]),
       slots=st.integers(1, 6))
def test_compiled_replay_is_the_ordered_dict_replay(schedule, kind, seq, heads, group, pass_, l2_kib,
                                                    granularity, slots):
    try:
        tr = sim.trace(_workload(kind, seq, heads, group, pass_), schedule)
    except ValueError:
        return
    got = simulate_l2(tr, l2_kib << 10, slots, granularity)
    want = _reference_replay(tr, l2_kib << 10, slots, granularity)
    assert (got.dram_read_bytes, got.dram_write_bytes, got.phases, got.hit_rate) == (
        want.dram_read_bytes, want.dram_write_bytes, want.phases, want.hit_rate)


def test_replay_with_per_phase_slots_and_of_an_empty_trace():
    w = sim.Workload(batch=1, heads=2, seq_len_q=40, head_dim=16, pass_="fwd+bwd", causal=True)
    tr = sim.trace(w, sim.Schedule("flash2", 16, 16))
    slots = {"fwd": 2, "bwd.main": 3}
    got, want = simulate_l2(tr, 8 << 10, slots, 256), _reference_replay(tr, 8 << 10, slots, 256)
    assert got.phases == want.phases and got.hit_rate == want.hit_rate and got.slots == slots
    empty = Trace({k: np.zeros(0, dtype=tr.columns[k].dtype) for k in _INT_COLS},
                  ["fwd"], [], {})
    res = simulate_l2(empty, 8 << 10, 4)
    assert (res.dram_read_bytes, res.dram_write_bytes, res.hit_rate) == (0, 0, None)
    assert len(interleave(empty, 4)) == 0


@pytest.mark.parametrize("slots", [1, 3, {"fwd": 2, "bwd.pre": 5, "bwd.main": 1}])
def test_interleave_of_a_subset_is_the_whole_order_restricted(slots):
    w = sim.Workload(batch=2, heads=2, seq_len_q=70, head_dim=16, pass_="fwd+bwd", causal=True)
    tr = sim.trace(w, sim.Schedule("flash2", 16, 16))
    whole = interleave(tr, slots)
    subset = np.flatnonzero(tr.columns["op"] != OPS.index("compute"))
    keep = np.zeros(len(tr), bool)
    keep[subset] = True
    np.testing.assert_array_equal(subset[interleave(tr, slots, subset)], whole[keep[whole]])
