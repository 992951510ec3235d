"""Which (tile, batch*head) the blocks of a tiled kernel's grid work on, in dispatch order.

The GPU hands out a grid's blocks x-fastest. The tensor-core kernels are launched on the grid
(n_tiles, B*H) and map a block's dispatch position to its work under a *head group* ``g``
(`kernels.tile_order` compiles this map into the kernels):

* ``g = 1`` (tiles first): head 0's tiles, then head 1's, ...;
* ``g = 0`` (heads first): tile 0 of every head, then tile 1 of every head, ...;
* ``g > 1``: heads first within groups of ``g`` heads, the groups one after another.

This module is the answer for the host side: the kernels' tests and the cost model's trace
(`sim.trace`, which replays programs in this order through its L2 model) use it, so that the
model follows the order that runs.
"""
from __future__ import annotations

import functools
import heapq

import numpy as np

__all__ = ["DEFAULT_HEAD_GROUP", "block_work", "dispatch_positions", "parse_head_group",
           "head_group", "dispatch_makespan", "slice_makespan", "balanced_head_group",
           "launch_head_group", "BALANCE_TOLERANCE"]

#: The measured default head group per (pass, causal) (0 = all heads, 1 = tiles first;
#: `kernels.tile_scheduler` compiles it into the kernels; ``python -m benchmarks tune --orders``
#: measures the orders).
DEFAULT_HEAD_GROUP = {("fwd", False): 1, ("fwd", True): 0, ("bwd", False): 1, ("bwd", True): 4}


def parse_head_group(value: str, what: str = "launch order") -> int:
    """A head group from its name: ``tiles`` (1), ``heads`` (0) or a group size."""
    if value in ("tiles", "heads"):
        return 1 if value == "tiles" else 0
    if not value.isdigit():
        raise ValueError(f"{what} must be 'tiles', 'heads' or a group size, got {value!r}")
    return int(value)


def head_group(launch_order, causal: bool, pass_: str = "fwd") -> int:
    """The head group of a launch of the ``pass_`` ("fwd" or "bwd") kernels: ``launch_order``
    ("tiles", "heads", a group size g >= 0, or None for `DEFAULT_HEAD_GROUP`)."""
    if launch_order is None:
        return DEFAULT_HEAD_GROUP[(pass_, bool(causal))]
    if isinstance(launch_order, str):
        return parse_head_group(launch_order, "launch_order")
    if isinstance(launch_order, bool) or not isinstance(launch_order, (int, np.integer)) \
            or launch_order < 0:
        raise ValueError(f"launch_order must be 'tiles', 'heads' or a group size >= 0, got "
                         f"{launch_order!r}")
    return int(launch_order)


def block_work(block_x: int, block_y: int, n_tiles: int, n_bh: int, group: int):
    """The (tile, bh) of block (block_x, block_y) of the grid (n_tiles, n_bh) under head group
    ``group``."""
    if group == 1:
        return block_x, block_y
    lin = block_x + n_tiles * block_y
    g = group if group > 0 else n_bh
    per_group = g * n_tiles
    grp = lin // per_group
    r = lin - grp * per_group
    gg = min(g, n_bh - grp * g)
    tile = r // gg
    return tile, grp * g + r - tile * gg


def dispatch_positions(n_tiles: int, n_bh: int, group: int) -> np.ndarray:
    """``pos[bh, tile]``: the dispatch position (0 = first) of the block that works on
    (tile, bh) under head group ``group``."""
    if group < 0:
        raise ValueError(f"head group must be >= 0, got {group}")
    pos = np.empty((n_bh, n_tiles), dtype=np.int64)
    if group == 1:
        pos[:] = np.arange(n_bh * n_tiles).reshape(n_bh, n_tiles)
        return pos
    g = group if group > 0 else n_bh
    for g0 in range(0, n_bh, g):              # group by group: tile-major inside the group
        gg = min(g, n_bh - g0)
        base = g0 * n_tiles
        pos[g0:g0 + gg, :] = base + np.arange(n_tiles)[None, :] * gg + np.arange(gg)[:, None]
    return pos


def dispatch_makespan(lengths, group: int, slots: int) -> float:
    """When the last program of the grid (n_tiles, n_bh) ends, its programs dispatched in head
    group ``group``'s order onto ``slots`` servers, each taking the next program when its last
    ends (greedy list scheduling, as the GPU's block dispatcher hands out blocks; the kernels
    take a server per SM, whose resident programs share its pipes); ``lengths[bh, tile]``:
    each program's work, in any unit (the result is in that unit)."""
    work = np.asarray(lengths, dtype=np.float64)
    if work.ndim != 2:
        raise ValueError(f"lengths must be [n_bh, n_tiles], got shape {work.shape}")
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    n_bh, n_tiles = work.shape
    order = np.argsort(dispatch_positions(n_tiles, n_bh, group), axis=None, kind="stable")
    ends = [0.0] * min(int(slots), work.size)
    for length in work.reshape(-1)[order]:
        heapq.heappush(ends, heapq.heappop(ends) + float(length))
    return max(ends) if ends else 0.0


@functools.lru_cache(maxsize=1024)
def slice_makespan(tile_work: tuple, n_bh: int, group: int, slots: int) -> float:
    """`dispatch_makespan` of ``n_bh`` (batch, head) slices whose programs all have the work
    ``tile_work[tile]`` (no block mask), cached: the launchers and the cost model ask it for
    the same kernels."""
    work = np.broadcast_to(np.asarray(tile_work, dtype=np.float64), (n_bh, len(tile_work)))
    return dispatch_makespan(work, group, slots)


#: `balanced_head_group` leaves the measured default order unless it ends this much later
#: (as a fraction) than heads first.
BALANCE_TOLERANCE = 0.10


def balanced_head_group(tile_work: tuple, n_bh: int, slots: int, default: int,
                        tolerance: float = BALANCE_TOLERANCE) -> int:
    """``default`` (the measured choice, which keeps the blocks that run together on fewer
    heads' data in L2), unless its dispatch of ``n_bh`` slices of programs of work
    ``tile_work`` onto ``slots`` SMs ends more than ``tolerance`` later than heads first (group
    0: the longest tiles of every head start first) by `slice_makespan`; then 0. A few long
    programs behind many short ones (a causal GQA backward whose grid is about two waves) is
    what makes the difference."""
    if default == 0:
        return 0
    if max(tile_work, default=0) <= tolerance * n_bh * sum(tile_work) / slots:
        return int(default)     # greedy dispatch ends within (sum / slots + longest) anyway
    ours = slice_makespan(tuple(tile_work), n_bh, default, slots)
    heads_first = slice_makespan(tuple(tile_work), n_bh, 0, slots)
    return 0 if ours > (1.0 + tolerance) * heads_first else int(default)


def launch_head_group(tile_work, n_bh: int, pinned, default: int, slots: int) -> int:
    """The head group a kernel's programs are dispatched in: ``pinned`` where not None, else
    ``default``, balanced (`balanced_head_group` onto ``slots`` SMs) where its programs' work
    differs: ``tile_work[tile]``, the work of each of the ``n_bh`` (batch, head) slices'
    programs, in the order of the grid's x index (empty: equal programs). `sim.plan.launch_group`
    asks it for a plan's kernel; the launchers ask it with the same fields."""
    if pinned is not None:
        return int(pinned)
    if len(tile_work) == 0:
        return int(default)
    return balanced_head_group(tuple(tile_work), n_bh, slots, default)
