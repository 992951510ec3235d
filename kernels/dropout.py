"""Dropout inside the kernels: the keep bits of `ioaware.dropout`, regenerated on the device.

No mask is stored: element (bh, row, col) is kept iff ``fmix(fmix(fmix(seed_hash ^ bh) ^ row) ^
col) >= threshold``, where ``seed_hash`` (the seed-only prefix of the hash chain) and the 32-bit
``threshold`` are computed once on the host (`dropout_constants`) and the kernels finish the
chain per row and column. The 32-bit arithmetic is carried in uint64 and masked with
0xFFFFFFFF after every multiply (products of two values below 2**32 never overflow 64 bits), so
it reproduces `ioaware.dropout` bit for bit.

* `fmix32_u64`, `row_hash`, `keep_bit`: device functions of the CUDA-core kernels;
* `fmix_device`: the same finaliser as an inlined device function for the tensor-core kernels;
* `dropout_constants`: the host side, shared by every family.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda

from ioaware.dropout import SEED_SALT, fmix32, keep_threshold, split_seed

__all__ = ["DropoutConstants", "dropout_constants", "fmix32_u64", "row_hash", "keep_bit",
           "fmix_device"]

_C1 = np.uint64(0x85EBCA6B)
_C2 = np.uint64(0xC2B2AE35)
_MASK32 = np.uint64(0xFFFFFFFF)
_S16 = np.uint64(16)
_S13 = np.uint64(13)


class DropoutConstants(NamedTuple):
    """What a kernel needs to regenerate `ioaware.dropout.keep_mask(seed, p, ...)`."""

    enabled: bool       # p > 0 (the kernels are compiled with or without dropout)
    seed_hash: int      # fmix32(fmix32(seed_lo ^ SALT) ^ seed_hi), below 2**32
    threshold: int      # keep iff hash >= threshold, below 2**32
    inv_keep: float     # 1 / (1 - p), the scale of kept values


def dropout_constants(seed: int, dropout_p: float) -> DropoutConstants:
    """The host side of the keep-bit hash for ``seed`` and ``dropout_p`` (memoised)."""
    return _dropout_constants(int(seed), float(dropout_p))


@functools.lru_cache(maxsize=1024)
def _dropout_constants(seed: int, dropout_p: float) -> DropoutConstants:
    lo, hi = split_seed(seed)
    seed_hash = int(fmix32(fmix32(np.uint32(lo) ^ np.uint32(SEED_SALT)) ^ np.uint32(hi)))
    enabled = dropout_p > 0.0
    threshold = keep_threshold(dropout_p) if enabled else 0
    return DropoutConstants(enabled, seed_hash, int(threshold), 1.0 / (1.0 - dropout_p))


# -- CUDA-core kernels ---------------------------------------------------------------------------
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


# -- tensor-core kernels -------------------------------------------------------------------------
def fmix_device():
    """``fmix``: the 32-bit finaliser on a uint64 holding 32 bits, as an inlined device function
    (built per kernel, so that it compiles into the kernel's own code)."""
    from numba import uint64
    C1, C2, M32 = uint64(0x85EBCA6B), uint64(0xC2B2AE35), uint64(0xFFFFFFFF)

    @cuda.jit(device=True, inline=True)
    def fmix(x):
        x = uint64(x) & M32
        x ^= x >> uint64(16)
        x = (x * C1) & M32
        x ^= x >> uint64(13)
        x = (x * C2) & M32
        x ^= x >> uint64(16)
        return x

    return fmix
