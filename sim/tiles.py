"""Per-thread register micro-tiles of the CUDA-core kernels: :class:`TileConfig`, :func:`choose_tiles`.

A `TileConfig` describes one thread block's 2-D tile of a score matrix: ``block_m`` rows by
``block_n`` columns, computed by ``(block_m // tm) x (block_n // tn)`` threads, each owning a
``tm x tn`` register micro-tile. The forward puts Q rows on ``m`` and K rows on ``n``; the dK/dV
kernel puts K rows on ``m`` and Q rows on ``n`` (it computes S^T).

The model chooses the tiles (this module is pure Python, no Numba): the CUDA-core kernels take
their launch shape from :func:`choose_tiles`, and the model prices the shared-memory level
(:mod:`sim.smem`) and the occupancy with the same split.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TileConfig", "choose_tiles"]


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tiling: ``block_m x block_n`` tile, ``tm x tn`` elements per thread."""

    block_m: int
    block_n: int
    tm: int
    tn: int

    @property
    def ntm(self) -> int:
        """Threads along the tile's rows."""
        return self.block_m // self.tm

    @property
    def ntn(self) -> int:
        """Threads along the tile's columns (one row group; a power of two <= 32)."""
        return self.block_n // self.tn

    @property
    def threads(self) -> int:
        return self.ntm * self.ntn

    def validate(self, head_dim: int) -> None:
        for name in ("block_m", "block_n", "tm", "tn"):
            if getattr(self, name) < 1:
                raise ValueError(f"TileConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.block_m % self.tm or self.block_n % self.tn:
            raise ValueError(f"{self}: tm must divide block_m and tn must divide block_n")
        ntn = self.ntn
        if ntn & (ntn - 1) or ntn > 32:
            raise ValueError(f"{self}: block_n // tn = {ntn} must be a power of two <= 32")
        if head_dim % ntn:
            raise ValueError(f"{self}: head_dim={head_dim} must be a multiple of block_n // tn = {ntn}")
        if self.threads > 1024:
            raise ValueError(f"{self}: {self.threads} threads per block exceeds 1024")


def _pow2_divisor_at_most(n: int, cap: int) -> int:
    best = 1
    p = 1
    while p <= cap:
        if n % p == 0:
            best = p
        p *= 2
    return best


def choose_tiles(block_m: int, block_n: int, head_dim: int, target_threads: int,
                 max_ntn: int = 8) -> TileConfig:
    """Split a ``block_m x block_n`` tile over about ``target_threads`` threads."""
    ntn = _pow2_divisor_at_most(block_n, max_ntn)
    while head_dim % ntn:
        ntn //= 2
    ntm = _pow2_divisor_at_most(block_m, max(1, target_threads // ntn))
    return TileConfig(block_m, block_n, block_m // ntm, block_n // ntn)
