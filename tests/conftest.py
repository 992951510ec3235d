"""Shared test setup.

* Numba's CUDA simulator is switched on (``NUMBA_ENABLE_CUDASIM=1``) before anything imports
  ``numba.cuda`` unless a real CUDA driver is present, so the kernel tests run on any CPU.
  Set ``NUMBA_ENABLE_CUDASIM`` yourself to override either way.
* Tests marked ``gpu`` need a real GPU: they are skipped under the simulator, and
  ``pytest -m gpu`` on a GPU machine runs exactly them.
* Under the simulator the interpreter's thread switch interval is cut from 5 ms to 0.1 ms
  (see ``SIMULATOR_SWITCH_INTERVAL_S``): the simulator runs each CUDA thread of a block as a
  Python thread, and its block manager busy-polls them in pure Python until all reach
  ``syncthreads()``, so every hand-over of the GIL to a simulated thread can wait a whole
  switch interval. Only the interleaving changes, not what runs or what a test checks; kernels
  with barriers in loops (split-KV decoding, the tiled forwards and backwards) run 2-8x faster.
* Under the simulator its shared-array allocation is made atomic (`_atomic_shared_arrays`):
  numba-cuda's ``FakeCUDAShared.array`` (0.30.4) looks the block's array up and, if absent,
  creates and stores it, unlocked, from every simulated thread; a thread switch between the
  two lets two threads create an array each, and one thread then reads and writes a private
  copy that its block never sees. At the 0.1 ms switch interval below this gave a rare wrong
  result (tests/test_simulator.py holds the race, and that the patch closes it).
* Hypothesis profiles: ``ci`` (default, bounded for a 2-core machine) and ``thorough``
  (``HYPOTHESIS_PROFILE=thorough``).
"""
from __future__ import annotations

import ctypes
import os
import sys


def _has_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _has_cuda_driver():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

REAL_GPU = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1"

#: Switch interval under the simulator (CPython's default is 5 ms). 0.1 ms was the fastest of
#: 0.03, 0.1, 0.2 and 1 ms on tests/test_decode.py on 2 cores (42 s, against 172 s at 5 ms).
SIMULATOR_SWITCH_INTERVAL_S = 1e-4


def _atomic_shared_arrays() -> None:
    """Replace the simulator's ``FakeCUDAShared.array`` by one whose look-up-or-create runs
    under a lock, so every thread of a block gets the same array. Same keying as numba-cuda's
    (the calling kernel line), read from the caller's frame instead of a whole stack
    extraction."""
    import threading

    import numpy as np
    from numba.cuda.simulator import kernelapi

    original = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:   # refusals and dynamic shared memory: as before
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                res = self._allocations[key] = np.empty(shape, dtype)
        return res

    array.original = original
    kernelapi.FakeCUDAShared.array = array


if not REAL_GPU:
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)
    _atomic_shared_arrays()

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=False, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=300, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    if REAL_GPU:
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (running under NUMBA_ENABLE_CUDASIM)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
