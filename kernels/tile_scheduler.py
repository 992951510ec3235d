"""Which tiles each program of a kernel visits, and in which order the programs are dispatched.

*Which tiles*: `ioaware.block_info.BlockInfo` alone answers it (causal, sliding-window and
block-sparse skipping), for the NumPy path, the kernels and the cost model alike. `device_schedule` turns its
answer into the CSR arrays the kernels read — for every K/V tile a Q tile visits (``"kv"``) or
every Q tile a K/V tile visits (``"q"``) — one schedule per distinct (batch, head) slice of the
block mask, cached on the device. A block mask is laid out on its own tiles; a kernel whose
tiles divide them reads it refined to its own tiles (`refine_block_mask`).

*Which order*: every tensor-core kernel is launched on the grid (n_tiles, B*H), which the GPU
hands out x-fastest; the kernel turns its block's place in that order into (tile, batch*head)
with `device_tile_and_head`, compiled for a *head group* of ``g`` heads (the host twin of the
map, which the tests and the cost model's trace use, is `ioaware.launch_order`):

* ``g = 1`` (*tiles first*): every head's tiles are dispatched together, heads one after
  another -- the blocks that run at the same time share a head's K/V (or Q/dO) in L2;
* ``g = 0`` (*heads first*): tile 0 of every head, then tile 1 of every head, and so on;
* ``g > 1``: heads first within groups of ``g`` heads, the groups one after another.

Under a causal mask the tiles of a head differ in work (the last Q tile visits every K/V tile,
the first one only; in the dK/dV kernels the other way round), and the kernels number tiles so
that the longest comes first. With heads first (or groups) the longest tiles of several heads
start early and the last blocks to start are short ones, so fewer SMs idle at the end. What
each order costs in L2 traffic is measured, not modelled: `DEFAULT_HEAD_GROUP` holds the
measured choice per pass (``python -m benchmarks tune --orders``; docs/kernels.md, "Launch
order"); `KernelConfig.launch_order` overrides it.
"""
from __future__ import annotations

import numpy as np
from numba import cuda   # a global (not a closure variable), which the CUDA simulator replaces

from ioaware.block_info import BlockInfo, cdiv
from ioaware.launch_order import DEFAULT_HEAD_GROUP, head_group

from .host import device_const

__all__ = ["DEFAULT_HEAD_GROUP", "head_group", "device_tile_and_head", "device_work_item",
           "gqa_cursor",
           "csr_schedule", "device_schedule", "refine_block_mask"]


def device_work_item(group: int):
    """A device function ``(lin, n_tiles, n_bh) -> (tile, bh)``: the work item at dispatch
    position ``lin`` of the grid (n_tiles, n_bh) in head group ``group``'s order (see the module
    docstring), as int32, in 32-bit arithmetic (a 64-bit division is a call); its host twin is
    `ioaware.launch_order.block_work`. A persistent program walks positions ``p, p + P,
    p + 2 P, ...``; `device_tile_and_head` asks it for the program's own position."""
    from numba import int32, uint32
    G = uint32(group)

    @cuda.jit(device=True, inline=True)
    def work_item(lin, n_tiles, n_bh):
        lin, n_tiles, n_bh = uint32(lin), uint32(n_tiles), uint32(n_bh)
        if G == uint32(1):
            bh = lin // n_tiles
            return int32(lin - bh * n_tiles), int32(bh)
        g = G if G > uint32(0) else n_bh
        per_group = g * n_tiles
        grp = lin // per_group
        r = lin - grp * per_group
        gg = min(g, n_bh - grp * g)                            # the last group may be smaller
        tile = r // gg
        return int32(tile), int32(grp * g + r - tile * gg)
    return work_item


def device_tile_and_head(group: int):
    """A device function ``() -> (tile, bh, n_tiles)`` for kernels compiled for head group
    ``group`` (see the module docstring), launched on the grid (n_tiles, n_bh): the work item
    (`device_work_item`) at the program's dispatch position."""
    if group == 1:
        @cuda.jit(device=True, inline=True)
        def tile_and_head():
            return cuda.blockIdx.x, cuda.blockIdx.y, cuda.gridDim.x
        return tile_and_head
    work_item = device_work_item(group)

    @cuda.jit(device=True, inline=True)
    def tile_and_head():
        n_tiles = cuda.gridDim.x
        tile, bh = work_item(cuda.blockIdx.x + n_tiles * cuda.blockIdx.y, n_tiles,
                             cuda.gridDim.y)
        return tile, bh, n_tiles
    return tile_and_head


def gqa_cursor():
    """``(start, advance)``: the cursor of a dK/dV program's sweep over (query head of its GQA
    group, Q tile of that head's ``"q"`` schedule) on K/V tile ``n_blk``; the dK/dV kernels of
    both tensor-core families walk their work with it. The cursor is ``(g, lo, cnt, j)``: head
    ``g`` of the group (query head ``hk * group + g``), its schedule entries ``q_index[lo:lo +
    cnt]``, entry ``j``, i.e. Q tile ``q_index[lo + j]``.

    * ``start(offsets, b, hk, group, sched_b, sched_h, n_blk) -> (n_items, g, lo, cnt)``: the
      number of items over the group, and the cursor at item 0 (``j = 0``; ``g = group``,
      ``cnt = 0`` when there is none);
    * ``advance(g, lo, cnt, j, offsets, b, hk, group, sched_b, sched_h, n_blk) -> (g, lo, cnt,
      j)``: the cursor at the next item (valid while items remain): the next entry, else the
      first entry of the next head with Q tiles on this K/V tile (heads without any are
      skipped)."""
    from numba import int32

    @cuda.jit(device=True, inline=True)
    def seek(g, offsets, b, hk, group, sched_b, sched_h, n_blk):
        # -- the next head of the group (from g on) with work on K/V tile n_blk --
        g_out = int32(group)
        lo_out = int32(0)
        cnt_out = int32(0)
        for gg in range(g, group):
            if g_out == group:
                s = b * sched_b + (hk * group + gg) * sched_h
                lo = offsets[s, n_blk]
                cnt = offsets[s, n_blk + 1] - lo
                if cnt > 0:
                    g_out = int32(gg)
                    lo_out = int32(lo)
                    cnt_out = int32(cnt)
        return g_out, lo_out, cnt_out

    @cuda.jit(device=True, inline=True)
    def start(offsets, b, hk, group, sched_b, sched_h, n_blk):
        # -- the item count over the group's heads, and the cursor at item 0 --
        n_items = 0
        for g in range(group):
            s = b * sched_b + (hk * group + g) * sched_h
            n_items += offsets[s, n_blk + 1] - offsets[s, n_blk]
        g, lo, cnt = seek(0, offsets, b, hk, group, sched_b, sched_h, n_blk)
        return n_items, g, lo, cnt

    @cuda.jit(device=True, inline=True)
    def advance(g, lo, cnt, j, offsets, b, hk, group, sched_b, sched_h, n_blk):
        # -- the next entry of this head, else the next head with work --
        j += 1
        if j == cnt:
            g, lo, cnt = seek(g + 1, offsets, b, hk, group, sched_b, sched_h, n_blk)
            j = 0
        return g, lo, cnt, j

    return start, advance


# -- host side: CSR schedules --------------------------------------------------------------------
def refine_block_mask(block_mask, block_q, block_k, n_q, n_k, tile_q, tile_k):
    """The block mask [Bb, Hb, cdiv(n_q, block_q), cdiv(n_k, block_k)] at the finer tiles
    (tile_q, tile_k), which must divide (block_q, block_k): a fine tile is computed iff the
    coarse tile it lies in is."""
    bm = np.asarray(block_mask, dtype=bool)
    if block_q % tile_q or block_k % tile_k:
        raise ValueError(f"tiles ({tile_q}, {tile_k}) must divide the block mask's tiles "
                         f"({block_q}, {block_k})")
    iq = (np.arange(cdiv(n_q, tile_q)) * tile_q) // block_q
    ik = (np.arange(cdiv(n_k, tile_k)) * tile_k) // block_k
    return bm[:, :, iq][:, :, :, ik]


def csr_schedule(n_q, n_k, tile_q, tile_k, causal, which, block_mask=None, mask_tiles=None,
                 causal_alignment="top_left", window_size=None):
    """``(offsets [S, n + 1] int32, index int32, stride_b, stride_h)``: for ``which="kv"`` the
    K/V tiles every Q tile of (tile_q, tile_k) visits, for ``"q"`` the Q tiles every K/V tile
    visits, one CSR row block per (batch, head) slice of ``block_mask`` (NumPy bool
    [Bb, Hb, nbq, nbk] on the tiles ``mask_tiles``; S = Bb * Hb); slice s of (b, h) is
    ``b * stride_b + h * stride_h``. ``causal_alignment`` and ``window_size`` as
    `BlockInfo`'s (tiles outside the window are not listed)."""
    if block_mask is None:
        info = BlockInfo(n_q, n_k, tile_q, tile_k, bool(causal), None, causal_alignment,
                         window_size)
        offs, idx = info.kv_schedule() if which == "kv" else info.q_schedule()
        return offs[None, :].astype(np.int32), idx.astype(np.int32), 0, 0
    fine = refine_block_mask(block_mask, mask_tiles[0], mask_tiles[1], n_q, n_k, tile_q, tile_k)
    offs_all, idx_all, base = [], [], 0
    for bb in range(fine.shape[0]):
        for hb in range(fine.shape[1]):
            info = BlockInfo.with_block_mask(n_q, n_k, tile_q, tile_k, bool(causal), fine[bb, hb],
                                             causal_alignment, window_size)
            offs, idx = info.kv_schedule() if which == "kv" else info.q_schedule()
            offs_all.append(offs + base)
            idx_all.append(idx)
            base += len(idx)
    idx = np.concatenate(idx_all) if base else np.zeros(1, np.int32)
    return (np.stack(offs_all).astype(np.int32), idx.astype(np.int32),
            fine.shape[1] if fine.shape[0] > 1 else 0, 1 if fine.shape[1] > 1 else 0)


def device_schedule(problem, tile_q, tile_k, which):
    """`csr_schedule` of ``problem`` (an `ioaware` problem: lengths, causal and its alignment,
    sliding window, block mask on its tiles ``(block_q, block_k)``) at the kernel tiles
    (tile_q, tile_k), as device arrays, built once per configuration and device:
    ``(offsets, index, stride_b, stride_h)``."""
    bm = problem.block_mask
    mask_tiles = None if bm is None else (problem.block_q, problem.block_k)
    bm_key = None if bm is None else (bm.shape, mask_tiles, np.asarray(bm, bool).tobytes())
    alignment = getattr(problem, "causal_alignment", "top_left")
    window = getattr(problem, "window_size", None)
    key = ("schedule", which, problem.seqlen_q, problem.seqlen_k, tile_q, tile_k,
           bool(problem.causal), alignment, window, bm_key)
    return device_const(key, lambda: csr_schedule(problem.seqlen_q, problem.seqlen_k, tile_q,
                                                  tile_k, problem.causal, which, bm, mask_tiles,
                                                  alignment, window))
