"""`sim.Schedule.launch_head_group`: the trace numbers the tiled kernels' programs in the
tensor-core kernels' dispatch order (`ioaware.launch_order`), which only the L2 model sees."""
from __future__ import annotations

import numpy as np
import pytest

from sim.l2 import simulate_l2
from sim.trace import trace
from sim.workload import Schedule, Workload


def _trace(group, pass_="fwd", causal=True):
    w = Workload(batch=2, heads=3, seq_len_q=200, head_dim=32, dtype="fp16", causal=causal,
                 pass_=pass_)
    s = Schedule("flash2", 64, 32, dq_mode="kernel", launch_head_group=group)
    return trace(w, s)


def test_bad_values_are_refused():
    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="launch_head_group"):
            Schedule("flash2", launch_head_group=bad)
    with pytest.raises(ValueError, match="launch_head_group"):
        Schedule("naive", launch_head_group=1)
    assert Schedule("flash2", launch_head_group=4).to_dict()["launch_head_group"] == 4


@pytest.mark.parametrize("group", [1, 0, 2, 4])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_programs_are_renumbered_not_changed(group, pass_):
    base, tr = _trace(None, pass_), _trace(group, pass_)
    assert tr.totals() == base.totals()                  # the same events, the same bytes
    cb, ct = base.columns, tr.columns
    for col in ("phase", "step", "op", "tensor", "b", "h", "m", "n", "bytes"):
        assert (cb[col] == ct[col]).all()
    for pid, name in enumerate(tr.phases):
        sel = cb["phase"] == pid
        old, new = cb["program"][sel], ct["program"][sel]
        # a bijection of the phase's program ids
        pairs = set(zip(old.tolist(), new.tolist()))
        assert len({o for o, _ in pairs}) == len(pairs) == len({n for _, n in pairs})
        assert sorted({n for _, n in pairs}) == list(range(tr.meta["n_programs"][name]))


def test_forward_longest_tile_of_every_head_first():
    tr = _trace(0)
    c = tr.columns
    first = {}
    for p, b, h, m in zip(c["program"], c["b"], c["h"], c["m"]):
        first.setdefault(int(p), (int(b), int(h), int(m)))
    n_bh = 6
    n_tiles = len(first) // n_bh
    # the first n_bh programs are the last (longest causal) Q block of each head
    assert [first[p][2] for p in range(n_bh)] == [n_tiles - 1] * n_bh
    assert {first[p][:2] for p in range(n_bh)} == {(b, h) for b in range(2) for h in range(3)}


def test_l2_model_sees_the_order():
    # one SM's worth of slots and an L2 that holds one head's K/V: heads first evicts it
    w = Workload(batch=2, heads=4, seq_len_q=512, head_dim=64, dtype="fp16", causal=False)
    kv_bytes = 2 * 512 * 64 * 2
    dram = {}
    for g in (1, 0):
        tr = trace(w, Schedule("flash2", 64, 64, launch_head_group=g))
        dram[g] = simulate_l2(tr, l2_bytes=2 * kv_bytes, slots={"fwd": 8}).dram_read_bytes
    assert dram[0] > 1.5 * dram[1]
    assert np.isfinite(list(dram.values())).all()


def test_measured_tensor_core_records_carry_their_order():
    from benchmarks import measure
    from kernels import tile_scheduler
    from sim.model import schedule_for_record
    base = dict(kernel="ioaware-numba", schedule="flash2", dtype="fp16", batch=1, heads=2,
                heads_kv=2, seq_len_q=256, seq_len_k=256, head_dim=64, block_q=None,
                block_k=None)
    for pas, causal, variant in (("fwd", True, "mma"), ("bwd", True, "mma"),
                                 ("bwd", False, "tf32"), ("fwd", True, "simt")):
        rec = measure.empty_record(dict(base, **{"pass": pas}, causal=causal, variant=variant))
        sched = schedule_for_record(rec)
        if variant == "simt":
            assert "launch_head_group" not in rec and sched.launch_head_group is None
        else:
            want = tile_scheduler.head_group(None, causal, pas)
            assert rec["launch_head_group"] == want == sched.launch_head_group
