"""Tile configurations of the kernels: block sizes, per-thread micro-tiles, shared-memory bytes.

A `TileConfig` describes one thread block's 2-D tile of a score matrix: ``block_m`` rows by
``block_n`` columns, computed by ``(block_m // tm) x (block_n // tn)`` threads, each owning a
``tm x tn`` register micro-tile. The forward and dQ kernels put Q rows on ``m`` and K rows on
``n``; the dK/dV kernel puts K rows on ``m`` and Q rows on ``n`` (it computes S^T).
"""
from __future__ import annotations

from dataclasses import dataclass

FLOAT32_BYTES = 4
STATIC_SMEM_LIMIT_BYTES = 48 * 1024   # static shared memory per block (cuda.shared.array)


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


def fwd_smem_bytes(cfg: TileConfig, head_dim: int) -> int:
    """Static shared memory of the forward kernel: Q, K, V tiles (rows padded to d+1), P, and
    the row-reduction scratch."""
    d1 = head_dim + 1
    floats = (cfg.block_m * d1 + 2 * cfg.block_n * d1 + cfg.block_m * (cfg.block_n + cfg.ntn)
              + cfg.block_m * cfg.ntn)
    return FLOAT32_BYTES * floats


def dq_smem_bytes(cfg: TileConfig, head_dim: int) -> int:
    """dQ kernel: Q, dO, K, V tiles and dS."""
    d1 = head_dim + 1
    return FLOAT32_BYTES * (2 * cfg.block_m * d1 + 2 * cfg.block_n * d1
                            + cfg.block_m * (cfg.block_n + cfg.ntn))


def dkdv_smem_bytes(cfg: TileConfig, head_dim: int) -> int:
    """dK/dV kernel (m = K rows, n = Q rows): K, V, Q, dO tiles, P^T, dS^T, lse and delta."""
    d1 = head_dim + 1
    return FLOAT32_BYTES * (2 * cfg.block_m * d1 + 2 * cfg.block_n * d1
                            + 2 * cfg.block_m * (cfg.block_n + cfg.ntn) + 2 * cfg.block_n)


# Default (block_q, block_k) per head dim, chosen to fit 48 KiB of static shared memory and, for
# d = 64 and 128, by the sweep `python -m kernels.tune` (kernels/NOTES.md, v1 sweep).
# Forward; backward (dK/dV and dQ share the same tile shape so one BlockInfo serves both).
_FWD_DEFAULT = ((32, (64, 64)), (64, (64, 32)), (128, (32, 16)), (256, (16, 8)))
# Per-thread micro-tile (tm, tn) of the forward where the sweep picked one (else choose_tiles).
FWD_TILES = {(64, 64, 32): (8, 4), (128, 32, 16): (4, 2)}
_BWD_DEFAULT = ((32, (32, 32)), (64, (32, 32)), (128, (16, 16)), (256, (8, 8)))
_SIM_DEFAULT = (16, 16)


def default_blocks(head_dim: int, backward: bool, simulator: bool) -> tuple[int, int]:
    """Default (block_q, block_k) for a head dim (float32 staging, so independent of dtype)."""
    if simulator:
        return _SIM_DEFAULT
    for dmax, blocks in (_BWD_DEFAULT if backward else _FWD_DEFAULT):
        if head_dim <= dmax:
            return blocks
    raise ValueError(f"head_dim must be <= 256, got {head_dim}")
