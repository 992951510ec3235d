"""kernels.bench without a GPU: the two timing methods drive the CUDA stream as documented
(a stand-in for torch.cuda records the calls), and the table prints what a file holds."""
from __future__ import annotations

import pytest

from kernels import bench


class _FakeCuda:
    """Records the order of stream operations; events are 1 ms apart."""

    def __init__(self):
        self.log = []
        self.clock = 0.0
        cuda = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                cuda.clock += 1.0
                self.t = cuda.clock
                cuda.log.append("record")

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        self.Event = Event

    def _sleep(self, cycles):
        self.log.append(("sleep", cycles))

    def synchronize(self):
        self.log.append("sync")


class _FakeTorch:
    def __init__(self):
        self.cuda = _FakeCuda()


@pytest.mark.parametrize("timing,sleeps", [("sync", False), ("device", True)])
def test_time_cuda_sleeps_before_each_timed_call_only_in_device_timing(timing, sleeps):
    torch = _FakeTorch()
    calls = []
    med, p10, p90 = bench.time_cuda(torch, lambda: calls.append(1), warmup=1, min_reps=3,
                                    max_reps=3, budget_s=0.0, timing=timing)
    assert med == p10 == p90 == 1.0
    n_sleep = sum(1 for e in torch.cuda.log if isinstance(e, tuple))
    n_timed = 1 + 3                      # the probe call and three timed calls
    assert n_sleep == (n_timed if sleeps else 0)
    if sleeps:   # every first event of a timed call follows a sleep
        for i, e in enumerate(torch.cuda.log):
            if isinstance(e, tuple):
                assert torch.cuda.log[i + 1] == "record"
                assert e[1] == bench.SLEEP_CYCLES


def test_time_cuda_refuses_unknown_timing():
    with pytest.raises(ValueError, match="timing"):
        bench.time_cuda(_FakeTorch(), lambda: None, timing="wall")


def test_host_call_ms_measures_the_call_while_the_gpu_sleeps():
    torch = _FakeTorch()
    ms = bench.host_call_ms(torch, lambda: sum(range(20000)), reps=5)
    assert ms > 0
    assert torch.cuda.log.count(("sleep", bench.SLEEP_CYCLES)) == 5


def test_table_shows_timing_and_host_column_only_when_recorded():
    rec = {"pass": "fwd", "dtype": "fp16", "head_dim": 64, "causal": False, "seq_len_q": 1024,
           "time_ms": 2.0, "tflops": 1.0, "peak_extra_bytes": 2**20}
    old = bench.format_table([dict(rec, kernel="ioaware-numba"), dict(rec, kernel="sdpa-flash",
                                                                      time_ms=1.0)])
    assert "host ms" not in old and "timing" not in old and "0.50" in old
    new = bench.format_table([dict(rec, kernel="ioaware-numba", timing="device", host_ms=0.25),
                              dict(rec, kernel="sdpa-flash", time_ms=1.0, timing="device")])
    assert "host ms" in new and "0.250" in new and "timing: device" in new
