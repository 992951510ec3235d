"""The counter-based dropout hash: deterministic, well mixed, at the requested keep rate."""
import numpy as np
import pytest

from ioaware.dropout import dropout_hash, fmix32, keep_mask, keep_threshold


def _grid(n=256):
    return np.arange(4)[:, None, None], np.arange(n)[None, :, None], np.arange(n)[None, None, :]


def test_fmix32_matches_a_pure_python_implementation():
    def py_fmix(x):
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & 0xFFFFFFFF
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & 0xFFFFFFFF
        x ^= x >> 16
        return x
    xs = np.random.default_rng(1).integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32)
    assert [int(y) for y in fmix32(xs)] == [py_fmix(int(x)) for x in xs]


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_within_statistical_bounds(p):
    keep = keep_mask(12345, p, *_grid())
    n = keep.size
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(keep.mean() - (1 - p)) < 5 * sigma


def test_same_seed_same_mask_different_seed_different_mask():
    a = keep_mask(7, 0.5, *_grid(64))
    assert np.array_equal(a, keep_mask(7, 0.5, *_grid(64)))
    b = keep_mask(8, 0.5, *_grid(64))
    assert 0.4 < (a != b).mean() < 0.6          # independent masks disagree about half the time
    c = keep_mask(7 + 2**32, 0.5, *_grid(64))   # the high seed word matters too
    assert 0.4 < (a != c).mean() < 0.6


def test_neighbouring_counters_are_uncorrelated():
    h = dropout_hash(3, 0, np.arange(512)[:, None], np.arange(512)[None, :]).astype(np.float64)
    x = (h - h.mean()) / h.std()
    for shifted in (x[1:, :], x[:, 1:]):
        base = x[:-1, :] if shifted.shape[0] < x.shape[0] else x[:, :-1]
        assert abs((base * shifted).mean()) < 0.02


def test_threshold_edges():
    assert keep_threshold(0.0) == 0
    assert keep_threshold(0.5) == 2**31
    assert keep_threshold(1 - 1e-12) <= 2**32 - 1
    with pytest.raises(ValueError):
        keep_mask(-1, 0.5, 0, 0, 0)
