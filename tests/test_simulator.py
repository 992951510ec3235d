"""The CUDA simulator the kernel tests run on: its shared arrays, made atomic in conftest.

numba-cuda's ``FakeCUDAShared.array`` looks a block's shared array up by the calling line and,
when absent, creates and stores it, with no lock, from each simulated thread. Two threads that
both look up before either stores get an array each; one of them then works on a private copy
that the rest of its block never sees (the simt forward's rows of a CI run came out wrong,
rarely). The two threads here meet inside the allocation, which
forces that interleaving wherever the look-up and the store are not one atomic step.
"""
import threading

import numpy as np
import pytest

from .conftest import REAL_GPU

pytestmark = pytest.mark.skipif(REAL_GPU, reason="the simulator's shared arrays (NUMBA_ENABLE_CUDASIM=1)")


def _two_threads_allocate(array_fn, monkeypatch):
    """The arrays two threads get from ``array_fn`` for the same kernel line, each thread held
    inside ``np.empty`` until the other arrives there too (or 0.5 s have passed)."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared(0)
    meet = threading.Barrier(2, timeout=0.5)
    real_empty = np.empty

    def empty_after_meeting(*args, **kwargs):
        try:
            meet.wait()
        except threading.BrokenBarrierError:    # the other thread never got here: no race
            pass
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", empty_after_meeting)
    got = [None, None]

    def allocate(i):
        got[i] = array_fn(shared, (4, 4), np.float32)     # one line: one shared array

    threads = [threading.Thread(target=allocate, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(a is not None for a in got)
    return got


def test_shared_arrays_are_one_array_per_line_under_concurrent_allocation(monkeypatch):
    from numba.cuda.simulator import kernelapi

    a, b = _two_threads_allocate(kernelapi.FakeCUDAShared.array, monkeypatch)
    assert a is b


def test_numba_cudas_own_allocation_races_so_the_patch_is_still_needed(monkeypatch):
    """When this fails, numba-cuda allocates atomically itself: drop `_atomic_shared_arrays`."""
    from numba.cuda.simulator import kernelapi

    original = kernelapi.FakeCUDAShared.array.original
    a, b = _two_threads_allocate(original, monkeypatch)
    assert a is not b


def test_the_patch_keeps_one_array_per_kernel_line():
    """Keyed as before: two lines, two arrays; the same line again, the same array."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared(0)
    first = [shared.array((2,), np.float32) for _ in range(2)]
    other = shared.array((3,), np.int32)
    assert first[0] is first[1] and other is not first[0] and other.dtype == np.int32
