"""Which (batch*head, tile) each block of a tensor-core kernel's grid works on: the launch order.

Every tensor-core kernel is launched on the grid (n_tiles, B*H), which the GPU hands out
x-fastest; the kernel turns its block's place in that order into (tile, batch*head) with
`device_tile_and_head`, compiled for a *head group* of ``g`` heads (the host side of the same
map, which tests and the cost model's trace use, is `ioaware.launch_order`):

* ``g = 1`` (*tiles first*): every head's tiles are dispatched together, heads one after
  another -- the blocks that run at the same time share a head's K/V (or Q/dO) in L2;
* ``g = 0`` (*heads first*): tile 0 of every head, then tile 1 of every head, and so on;
* ``g > 1``: heads first within groups of ``g`` heads, the groups one after another.

Under a causal mask the tiles of a head differ in work (the last Q tile visits every K/V tile,
the first one only; in the dK/dV kernels the other way round), and the kernels number tiles so
that the longest comes first. With heads first (or groups) the longest tiles of several heads
start early and the last blocks to start are short ones, so fewer SMs idle at the end
(longest-processing-time-first); tiles first ends with a head's longest tiles still running.
What each order costs in L2 traffic is measured, not modelled: `head_group` holds the measured
choice per pass (kernels/NOTES_TF32_BWD.md, "Launch order"). The environment variable
``KERNELS_TILE_ORDER`` (``tiles``, ``heads`` or a group size) overrides it, for timing orders
against each other.
"""
from __future__ import annotations

import os

from numba import cuda   # a global (not a closure variable), which the CUDA simulator replaces

from ioaware.launch_order import parse_head_group

__all__ = ["ENV", "DEFAULT_HEAD_GROUP", "head_group", "device_tile_and_head"]

ENV = "KERNELS_TILE_ORDER"
#: Head group per (pass, causal) (see the module docstring; 0 = all heads, 1 = tiles first).
DEFAULT_HEAD_GROUP = {("fwd", False): 1, ("fwd", True): 0, ("bwd", False): 1, ("bwd", True): 4}


def head_group(causal: bool, pass_: str = "fwd") -> int:
    """The head group (0 = heads first, 1 = tiles first, g > 1 = groups of g heads) of a launch
    of the ``pass_`` ("fwd" or "bwd") kernels: `DEFAULT_HEAD_GROUP`, unless
    ``KERNELS_TILE_ORDER`` says ``tiles``, ``heads`` or a group size."""
    forced = os.environ.get(ENV)
    if forced:
        return parse_head_group(forced, ENV)
    return DEFAULT_HEAD_GROUP[(pass_, bool(causal))]


def device_tile_and_head(group: int):
    """A device function ``() -> (tile, bh, n_tiles)`` for kernels compiled for head group
    ``group`` (see the module docstring), launched on the grid (n_tiles, n_bh); its host twin
    is `ioaware.launch_order.block_work`."""
    if group == 1:
        @cuda.jit(device=True, inline=True)
        def tile_and_head():
            return cuda.blockIdx.x, cuda.blockIdx.y, cuda.gridDim.x
        return tile_and_head
    G = group

    @cuda.jit(device=True, inline=True)
    def tile_and_head():
        n_tiles = cuda.gridDim.x
        n_bh = cuda.gridDim.y
        lin = cuda.blockIdx.x + n_tiles * cuda.blockIdx.y      # dispatch position
        g = G if G > 0 else n_bh
        per_group = g * n_tiles
        grp = lin // per_group
        r = lin - grp * per_group
        gg = min(g, n_bh - grp * g)                            # the last group may be smaller
        tile = r // gg
        return tile, grp * g + r - tile * gg, n_tiles
    return tile_and_head
