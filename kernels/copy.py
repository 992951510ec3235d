"""Tile copies from global to shared memory (``cp.async``) for the tensor-core kernels.

A tile is ``rows`` rows of ``chunks`` 16-byte chunks. Thread ``tid`` copies column chunk
``tid % chunks`` of the rows ``tid // chunks + i * (threads // chunks)``, ``i < cdiv(rows *
chunks, threads)``, into shared rows ``row_stride_bytes`` apart. The caller computes, once per
tensor slice, the address of that slice's row 0 at this thread's chunk and the slice's row pitch
in bytes; a chunk then costs one 64-bit multiply-add for its address. Rows at or past ``n_rows``
are zero-filled: the copy's source size is 0 (its address is row 0's, which exists).
"""
from __future__ import annotations

from ioaware.block_info import cdiv

__all__ = ["tile_loader"]


def tile_loader(rows: int, chunks: int, threads: int, row_stride_bytes: int,
                through_l1: bool = False):
    """``load_tile(head_addr, row_bytes, row0, n_rows, s_addr, r_thread)``: issue this thread's
    ``cp.async`` of one tile (no commit). ``head_addr``: 64-bit address of row 0, this thread's
    chunk; ``row_bytes``: the row pitch (uint64); ``row0``: the tile's first row plus
    ``r_thread`` (= ``tid // chunks``); ``s_addr``: 32-bit shared address of this thread's first
    chunk in the tile. When ``rows * chunks`` is not a multiple of ``threads`` the threads past
    the tile's last row copy nothing. ``through_l1``: copy with ``cp.async.ca``
    (`kernels.ptx.cp_async_16_ca`, for a stream read once) rather than ``cp.async.cg``."""
    from numba import cuda, uint32, uint64

    from . import ptx

    if threads % chunks:
        raise ValueError(f"threads={threads} must be a multiple of chunks={chunks}")
    copy = ptx.cp_async_16_ca if through_l1 else ptx.cp_async_16
    loads = cdiv(rows * chunks, threads)
    row_step = threads // chunks
    partial = rows * chunks % threads != 0

    @cuda.jit(device=True, inline=True)
    def load_tile(head_addr, row_bytes, row0, n_rows, s_addr, r_thread):
        for i in range(loads):
            if not partial or r_thread + i * row_step < rows:
                row = row0 + i * row_step
                ok = row < n_rows
                g = head_addr + uint64(row if ok else 0) * row_bytes
                copy(s_addr + uint32(i * row_step * row_stride_bytes), g,
                     uint32(16) if ok else uint32(0))

    return load_tile
