"""Device helpers shared by the forward and backward kernels: the dropout hash and row reductions.

The dropout hash reproduces `ioaware.dropout` bit for bit: the 32-bit arithmetic is carried in
uint64 and masked with 0xFFFFFFFF after every multiply (products of two values below 2**32 never
overflow 64 bits). The seed-only prefix of the hash chain is computed on the host
(`seed_prefix`), the kernels finish it with (bh, row, col).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ioaware.dropout import SEED_SALT, fmix32, keep_threshold, split_seed

_C1 = np.uint64(0x85EBCA6B)
_C2 = np.uint64(0xC2B2AE35)
_MASK32 = np.uint64(0xFFFFFFFF)
_S16 = np.uint64(16)
_S13 = np.uint64(13)


@cuda.jit(device=True)
def fmix32_u64(x):
    """MurmurHash3's finaliser on a uint64 holding a 32-bit value; returns a uint64 < 2**32."""
    x = x ^ (x >> _S16)
    x = (x * _C1) & _MASK32
    x = x ^ (x >> _S13)
    x = (x * _C2) & _MASK32
    x = x ^ (x >> _S16)
    return x


@cuda.jit(device=True)
def row_hash(seed_prefix, bh, row):
    """The hash chain up to the query row: fmix(fmix(prefix ^ bh) ^ row)."""
    h = fmix32_u64(seed_prefix ^ np.uint64(bh))
    return fmix32_u64(h ^ np.uint64(row))


@cuda.jit(device=True)
def keep_bit(h_row, col, threshold):
    """True iff element (row, col) is kept: fmix(h_row ^ col) >= threshold."""
    return fmix32_u64(h_row ^ np.uint64(col)) >= threshold


def seed_prefix(seed: int) -> np.uint64:
    """Host side: fmix32(fmix32(seed_lo ^ SALT) ^ seed_hi), the part of the hash that depends on
    the seed alone."""
    lo, hi = split_seed(seed)
    h = fmix32(np.uint32(lo) ^ np.uint32(SEED_SALT))
    h = fmix32(h ^ np.uint32(hi))
    return np.uint64(int(h))


def dropout_args(dropout_p: float, seed: int):
    """(seed_prefix uint64, keep threshold uint64, keep scale float32) for the kernels."""
    p = float(dropout_p)
    return (seed_prefix(seed), np.uint64(keep_threshold(p)),
            np.float32(1.0 / (1.0 - p)) if p < 1.0 else np.float32(0.0))
