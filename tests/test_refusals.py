"""Refusing early and clearly: the cost is estimated from shapes before anything is allocated or
scanned, an unavailable backend is named, what a backend cannot compute exactly is refused
before dispatch, and the NaN/Inf policy (CPU inputs refused) holds."""
import importlib
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ioaware
from ioaware import PerformanceWarning, attention, scaled_dot_product_attention
from ioaware._cost import allowed_pairs, available_host_memory

from .conftest import _has_cuda_driver

attention_module = importlib.import_module("ioaware._backends")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def sixteen_gb(monkeypatch):
    """A machine with 16 GB available, whatever this one has, so that the figures are fixed."""
    monkeypatch.setattr("ioaware._cost.available_host_memory", lambda: 16 * 10**9)


@pytest.fixture
def no_scans(monkeypatch):
    """Fail if anything scans values (the NaN check) or runs a backend."""
    def refuse(*args, **kwargs):
        raise AssertionError("values were read or a backend ran before the refusal")
    monkeypatch.setattr(np, "isfinite", refuse)
    monkeypatch.setattr(attention_module, "_forward", refuse)


def test_a_stride_0_input_of_1e10_elements_is_refused_before_any_scan(sixteen_gb, no_scans):
    q = np.broadcast_to(np.float32(1), (1, 1, 156_250_000, 64))      # 1e10 elements, 4 bytes stored
    k = v = np.ones((1, 1, 64, 64), np.float32)
    start = time.perf_counter()
    with pytest.raises(MemoryError, match=r"q \(1, 1, 156250000, 64\) with k \(1, 1, 64, 64\).*"
                                          r"the output alone is 40.0 GB.*16.0 GB are available"):
        attention(q, k, v)
    assert time.perf_counter() - start < 1.0


def test_the_reference_backend_is_refused_when_its_score_matrices_do_not_fit(sixteen_gb, no_scans):
    q = np.broadcast_to(np.float32(1), (1, 1, 100_000, 16))
    with pytest.raises(MemoryError, match="backend 'reference' needs an estimated 320.0 GB"):
        attention(q, q, q, backend="reference")


def test_a_huge_cpu_problem_warns_with_an_estimated_time_before_running(monkeypatch, no_scans):
    monkeypatch.setattr("ioaware._cost.available_host_memory", lambda: 10**15)
    q = np.broadcast_to(np.float32(1), (1, 1, 2_000_000, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        with pytest.raises(PerformanceWarning, match=r"estimated to take about [0-9.]+ (hours|days) for the forward"):
            attention(q, q, q)
    t = torch.zeros(1, 1, 2_000_000, 64).expand(2, 4, -1, -1)            # the same through the torch operator
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        with pytest.raises(PerformanceWarning, match="CUDA tensors run on the fused kernels"):
            scaled_dot_product_attention(t, t, t, is_causal=True)


def test_small_problems_do_not_warn():
    q = np.ones((2, 4, 256, 64), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        attention(q, q, q, causal=True)


@given(st.integers(0, 60), st.integers(0, 60), st.booleans(), st.sampled_from(["top_left", "bottom_right"]))
def test_allowed_pairs_counts_the_causal_rule(nq, nk, causal, alignment):
    offset = nk - nq if alignment == "bottom_right" else 0
    want = sum(1 for i in range(nq) for j in range(nk) if not causal or j <= i + offset)
    assert allowed_pairs(nq, nk, causal, offset) == want


def test_available_host_memory_is_read():
    available = available_host_memory()
    assert available is None or available > 0


# ---- backends ----------------------------------------------------------------------------
@pytest.mark.skipif(_has_cuda_driver(), reason="this machine has a CUDA driver")
def test_numba_backend_without_cuda_raises_an_ioaware_error():
    """In a fresh interpreter with Numba's simulator off and no CUDA driver."""
    code = ("import numpy as np, torch, ioaware\n"
            "q = np.zeros((1, 1, 4, 8), np.float32)\n"
            "for x in (q, torch.from_numpy(q)):\n"
            "    try:\n"
            "        ioaware.attention(x, x, x, backend='numba')\n"
            "    except RuntimeError as e:\n"
            "        print(type(e).__name__, e)\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": ROOT}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout + res.stderr
    for line in lines:
        assert line.startswith("RuntimeError backend='numba' needs a CUDA GPU, and Numba finds none")
        assert "backend='numpy'" in line and "CudaSupportError" not in line


def test_numba_refuses_what_its_kernels_cannot_do_before_dispatch(monkeypatch):
    """Under the simulator (or on a GPU): refused with the argument named, no kernel called."""
    import kernels

    def refuse(*args, **kwargs):
        raise AssertionError("dispatched to the kernels")
    monkeypatch.setattr(kernels, "forward", refuse)
    monkeypatch.setattr(kernels, "backward", refuse)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 5, 8), np.float32), rng.standard_normal((1, 2, 9, 8), np.float32)
    with pytest.raises(ValueError, match=r"causal='bottom_right' .* Nq=5 != Nk=9 .* backend 'numba'"):
        attention(q, k, k, causal="bottom_right", backend="numba")
    with pytest.raises(TypeError, match="dtype float64; backend 'numba' takes float16, bfloat16, float32"):
        attention(q.astype(np.float64), k.astype(np.float64), k.astype(np.float64), backend="numba")
    with pytest.raises(ValueError, match="v has head dimension 3 but q and k have 8; backend 'numba'"):
        attention(q, k, k[..., :3], backend="numba")
    with pytest.raises(ValueError, match="head dimension 0"):
        attention(q[..., :0], k[..., :0], k[..., :0], backend="numba")
    # nothing to compute: no kernel needed, none called
    out = attention(q, k[..., :0, :], k[..., :0, :], backend="numba")
    assert out.shape == q.shape and not out.any()


def test_numba_bottom_right_with_equal_lengths_is_top_left_and_runs():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 12, 8)).astype(np.float32) for _ in range(3))
    got = attention(q, k, v, causal="bottom_right", backend="numba", block_q=8, block_k=8)
    want = attention(q, k, v, causal=True, backend="reference")
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


# ---- NaN / Inf policy ------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_cpu_inputs_are_refused(bad):
    q = np.ones((1, 2, 4, 8), np.float32)
    k = q.copy()
    k[0, 1, 2, 3] = bad
    with pytest.raises(ValueError, match="k contains NaN or infinite values"):
        attention(q, k, q)
    with pytest.raises(ValueError, match="k contains NaN or infinite values"):
        scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(q))


def test_the_nan_scan_reads_each_stored_element_once(monkeypatch):
    sizes = []
    isfinite = np.isfinite

    def counting(x, *args, **kwargs):
        sizes.append(np.asarray(x).size)
        return isfinite(x, *args, **kwargs)
    monkeypatch.setattr(np, "isfinite", counting)
    row = np.ones((1, 1, 1, 8), np.float32)
    q = np.broadcast_to(row, (1, 1, 4096, 8))                 # 32768 elements, 8 stored
    attention(q, row, row)
    assert sizes == [8, 8, 8]
    bad = row.copy()
    bad[..., 3] = np.nan
    with pytest.raises(ValueError, match="q contains NaN"):
        attention(np.broadcast_to(bad, (1, 1, 4096, 8)), row, row)


@pytest.mark.gpu
def test_cuda_inputs_are_not_scanned():
    """Scanning would synchronise the device: a NaN in a CUDA input raises nothing."""
    q = torch.randn(1, 2, 64, 64, device="cuda")
    q[0, 0, 0, 0] = float("nan")
    out = ioaware.attention(q, q, q)
    assert out.shape == q.shape and out.device == q.device
