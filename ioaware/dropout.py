"""Counter-based dropout: the keep mask is a pure function of (seed, batch-head, row, column).

No mask is ever stored. The forward and the backward, and every backend (NumPy tiled path,
float64 reference, Numba CUDA kernels), regenerate the same bits from the same counters, as
the FlashAttention paper does by keeping only the RNG state.

The hash (all arithmetic modulo 2**32)::

    fmix32(x):  x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13; x *= 0xC2B2AE35; x ^= x >> 16
    h = fmix32(seed_lo ^ 0x9E3779B9)
    h = fmix32(h ^ seed_hi)
    h = fmix32(h ^ bh)          # flat index over the query's leading (batch, head) dims
    h = fmix32(h ^ row)         # query row
    h = fmix32(h ^ col)         # key column
    keep  <=>  h >= threshold(p) = min(floor(p * 2**32), 2**32 - 1)

fmix32 is MurmurHash3's finaliser; chaining it gives well-mixed 32-bit values, so the keep
rate is 1 - p to within sampling error. Kept probabilities are scaled by ``1 / (1 - p)``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["FMIX_C1", "FMIX_C2", "SEED_SALT", "fmix32", "keep_threshold", "keep_mask",
           "split_seed", "dropout_hash"]

FMIX_C1 = 0x85EBCA6B
FMIX_C2 = 0xC2B2AE35
SEED_SALT = 0x9E3779B9
_U32 = np.uint32


def fmix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3 finaliser on uint32 arrays (wrapping arithmetic)."""
    x = np.asarray(x, dtype=_U32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> _U32(16))
        x = x * _U32(FMIX_C1)
        x = x ^ (x >> _U32(13))
        x = x * _U32(FMIX_C2)
        x = x ^ (x >> _U32(16))
    return x


def split_seed(seed: int) -> tuple[int, int]:
    """Split a non-negative integer seed (< 2**64) into its low and high 32-bit words."""
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed}")
    return seed & 0xFFFFFFFF, seed >> 32


def keep_threshold(p: float) -> int:
    """The uint32 threshold: an element is kept iff its hash is >= this value."""
    return min(int(np.floor(float(p) * 2.0**32)), 2**32 - 1)


def dropout_hash(seed: int, bh, rows, cols) -> np.ndarray:
    """The 32-bit hash of (seed, bh, row, col); arguments broadcast against each other."""
    lo, hi = split_seed(seed)
    h = fmix32(_U32(lo) ^ _U32(SEED_SALT))
    h = fmix32(h ^ _U32(hi))
    h = fmix32(h ^ np.asarray(bh).astype(_U32))
    h = fmix32(h ^ np.asarray(rows).astype(_U32))
    h = fmix32(h ^ np.asarray(cols).astype(_U32))
    return h


def keep_mask(seed: int, p: float, bh, rows, cols) -> np.ndarray:
    """Boolean keep mask for dropout probability ``p``; arguments broadcast against each other.

    ``bh`` is the flat index over the query's leading dimensions, ``rows``/``cols`` are the
    absolute query row and key column (not the offsets inside a tile).
    """
    return dropout_hash(seed, bh, rows, cols) >= _U32(keep_threshold(p))
