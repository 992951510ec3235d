"""How a kernel call is configured: `KernelConfig`, and the CUDA-core kernels' tiles.

`KernelConfig` is the one place where a caller (the benchmarks, a user tuning a workload)
chooses what the registry and the families would otherwise choose: the family, the tile sizes,
the CUDA-core kernels' per-thread micro-tile, the launch order of the tensor-core kernels and
the launch path. ``KernelConfig()`` (all defaults) is what `ioaware.attention` runs.

A `TileConfig` (`sim.tiles`: the model chooses the split, the kernels run it) describes one
CUDA-core thread block's 2-D tile of a score matrix: ``block_m`` rows by ``block_n`` columns,
computed by ``(block_m // tm) x (block_n // tn)`` threads, each owning a ``tm x tn`` register
micro-tile. The forward kernel puts Q rows on ``m`` and K rows on
``n``; the dK/dV kernel puts K rows on ``m`` and Q rows on ``n`` (it computes S^T).
"""
from __future__ import annotations

from dataclasses import dataclass

# The CUDA-core family's layout facts (default tiles and micro-tiles, static shared memory) are
# its plan's (`sim.plans.simt`); they stay importable from here.
from sim.plans.simt import (FLOAT32_BYTES, FWD_TILES, STATIC_SMEM_LIMIT_BYTES, default_blocks,
                            dkdv_smem_bytes, fwd_smem_bytes)
from sim.decode import MAX_SPLITS, MMA_WARP_CHOICES
from sim.tiles import TileConfig, choose_tiles

__all__ = ["KernelConfig", "TileConfig", "choose_tiles", "default_blocks", "fwd_smem_bytes",
           "dkdv_smem_bytes", "tile_dividing", "requested_tiles", "backward_tiles", "FAMILY_NAMES",
           "FORWARD_ONLY_NAMES", "FWD_TILES", "STATIC_SMEM_LIMIT_BYTES", "FLOAT32_BYTES"]

#: The kernel families, in the order the registry tries them (`kernels.family_for`).
FAMILY_NAMES = ("mma", "tf32", "simt")
#: Forward-only kernels, tried before the families for a forward (`kernels.family_for`).
FORWARD_ONLY_NAMES = ("split_kv", "wgmma")


@dataclass(frozen=True)
class KernelConfig:
    """Choices a call may pin instead of leaving them to the registry and the families.

    * ``family``: "mma" (tensor-core float16/bfloat16), "tf32" (3xTF32 tensor-core float32) or
      "simt" (CUDA-core, any float dtype); the forward-only "split_kv" or "wgmma"; None = the
      first family that takes the problem (for a forward: "split_kv", "wgmma", then the
      families).
    * ``block_q``, ``block_k``: the kernel's tiles (query rows and keys per tile; for the
      CUDA-core backward the dK/dV kernel's tile is (block_k, block_q)); None = the family's
      default (with a block mask: the largest legal tiles that divide the mask's tiles). The
      tensor-core backwards choose their own tiles and take none.
    * ``micro_tile``: (tm, tn) per thread of the CUDA-core forward; None = its default.
    * ``launch_order``: dispatch order of the tensor-core kernels' programs
      (`kernels.tile_scheduler`): "tiles", "heads" or a head-group size; None = the measured
      default per pass (the Hopper backward's kernels take heads first where greedy dispatch
      says the default would leave SMs idle: `sim.plan.launch_group`).
    * ``fast_launch``: launch through `kernels.host.launch`'s cached path (False: Numba's own).
    * ``num_splits``: key splits of the split-KV decoding forward (``family="split_kv"``,
      `kernels.decode_fwd`); None = the plan's (`sim.decode.split_kv_plan`: priced by the GPU
      profile's measured decode figures where it has them, else `sim.decode.choose_splits`).
    * ``decode_unit``: the split-KV forward's kernel, "mma" (tensor cores: float16/bfloat16 at
      head dims 64 and 128 on a GPU of compute capability 8.0 or later) or "ffma" (CUDA cores:
      any of its inputs, and the only one under the CUDA simulator); None = "mma" where it
      takes the problem (`sim.decode.uses_tensor_cores`).
    * ``decode_warps``: warps a program of the tensor-core split-KV kernel, 4 or 8; None = the
      plan's (`sim.decode.split_kv_plan`: 8 where the programs are fewer than the SMs, else 4).
    * ``pingpong``: the ``wgmma`` forward's two consumer warpgroups take turns issuing their
      products (FlashAttention-3's scheduler barrier; ``block_q`` = 128 only); None = the
      plan's default (`sim.plans.wgmma_fwd.WGMMA_PINGPONG_DEFAULT`: on at ``block_q`` = 128,
      where with ``overlap`` it is the fastest schedule measured). Only the ``wgmma`` family
      reads it.
    * ``overlap``: the ``wgmma`` forward's consumer warpgroups run a tile's softmax while the
      O += P V of the tile before is on the tensor cores (FlashAttention-3's intra-warpgroup
      overlap: three K/V stages and, at ``block_q`` = 128 or 192, a producer warpgroup whose
      registers go to the consumers); None = the plan's default
      (`sim.plans.wgmma_fwd.WGMMA_OVERLAP_DEFAULT`). Only the ``wgmma`` family reads it.
    * ``persistent``: the ``wgmma`` forward runs one program per SM, each walking its share
      of the work items (Q tile, batch * head) in launch order, so that an item's loads start
      under the item before's last products and stores (`sim.plan.KernelPlan.persistent`);
      only where a program fills its SM (the overlap with ``block_q`` 128 or 192); None = the
      plan's default (`sim.plans.wgmma_fwd.WGMMA_PERSISTENT_DEFAULT`). Only the ``wgmma``
      family reads it.
    * ``dq_tile``, ``kv_tile``: the ``wgmma`` backward's tiles, each (queries, keys): the dQ
      kernel's (query rows a program, keys a stage) and the dK/dV kernel's (queries a stage, key
      rows a program), as `sim.plans.wgmma_bwd.wgmma_backward_plan` takes them (rows 64 or
      128, stages 64 or 128; `sim.plans.wgmma_bwd.wgmma_backward_configs` lists the legal
      pairs); None = the plan's default (`sim.plans.wgmma_bwd.wgmma_bwd_default_tiles`). A
      backward that pins either runs only on the ``wgmma`` backward (`kernels.family_for`
      refuses another family), so a pinned tile is never silently dropped.
    * ``backward_dq``: how the tensor-core backwards (``mma``, ``tf32``, ``wgmma``) compute dQ:
      "kernel" (a dQ kernel that recomputes S and dP, deterministic) or "atomic"
      (FlashAttention-2's structure: the dK/dV kernel adds dS K into a float32 accumulator with
      atomics; the summation order varies from run to run); None = the family's measured
      default (`kernels.mma_bwd.dq_mode`, `kernels.tf32_bwd.dq_mode`,
      `kernels.wgmma_bwd.dq_mode`).

    ``family="split_kv"`` is a forward only (decoding: few queries, a long KV cache);
    ``family="wgmma"`` is a forward only too (Hopper: TMA and ``wgmma``, `kernels.wgmma_fwd`),
    the default forward on compute capability 9.0 where it takes the problem.
    """

    family: str | None = None
    block_q: int | None = None
    block_k: int | None = None
    micro_tile: tuple[int, int] | None = None
    launch_order: str | int | None = None
    fast_launch: bool = True
    num_splits: int | None = None
    backward_dq: str | None = None
    decode_unit: str | None = None
    decode_warps: int | None = None
    pingpong: bool | None = None
    overlap: bool | None = None
    persistent: bool | None = None
    dq_tile: tuple[int, int] | None = None
    kv_tile: tuple[int, int] | None = None

    def __post_init__(self):
        if self.decode_warps is not None and (isinstance(self.decode_warps, bool)
                                              or not isinstance(self.decode_warps, int)
                                              or self.decode_warps not in MMA_WARP_CHOICES):
            raise ValueError(f"KernelConfig.decode_warps must be one of {MMA_WARP_CHOICES} or "
                             f"None, got {self.decode_warps!r}")
        if self.decode_unit not in (None, "mma", "ffma"):
            raise ValueError(f"KernelConfig.decode_unit must be 'mma', 'ffma' or None, got "
                             f"{self.decode_unit!r}")
        for name in ("pingpong", "overlap", "persistent"):   # the wgmma forward's schedule
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"KernelConfig.{name} must be True, False or None, got "
                                 f"{value!r}")
        for name in ("dq_tile", "kv_tile"):        # the wgmma backward's tiles
            value = getattr(self, name)
            if value is None:
                continue
            if not (isinstance(value, (tuple, list)) and len(value) == 2
                    and all(isinstance(t, int) and not isinstance(t, bool) and t > 0
                            for t in value)):
                raise ValueError(f"KernelConfig.{name} must be a pair (queries, keys) of "
                                 f"positive ints or None, got {value!r}")
            object.__setattr__(self, name, (int(value[0]), int(value[1])))
        if self.backward_dq not in (None, "kernel", "atomic"):
            raise ValueError(f"KernelConfig.backward_dq must be 'kernel', 'atomic' or None, got "
                             f"{self.backward_dq!r}")
        names = FORWARD_ONLY_NAMES + FAMILY_NAMES
        if self.family is not None and self.family not in names:
            raise ValueError(f"KernelConfig.family must be one of {names} or None, got "
                             f"{self.family!r}")
        if self.num_splits is not None and (isinstance(self.num_splits, bool) or not isinstance(
                self.num_splits, int) or not 1 <= self.num_splits <= MAX_SPLITS):
            raise ValueError(f"KernelConfig.num_splits must be an int in [1, {MAX_SPLITS}] or "
                             f"None, got "
                             f"{self.num_splits!r}")
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"KernelConfig.{name} must be a positive int or None, got "
                                 f"{value!r}")
        if self.micro_tile is not None and (len(self.micro_tile) != 2
                                            or min(self.micro_tile) < 1):
            raise ValueError(f"KernelConfig.micro_tile must be (tm, tn) with tm, tn >= 1, got "
                             f"{self.micro_tile!r}")
        order = self.launch_order
        if order is not None and not (order in ("tiles", "heads") or (
                isinstance(order, int) and not isinstance(order, bool) and order >= 0)):
            raise ValueError(f"KernelConfig.launch_order must be 'tiles', 'heads', a head-group "
                             f"size >= 0 or None, got {order!r}")


def tile_dividing(default: int, mask_tile: int | None, legal=None) -> int | None:
    """A kernel tile size for one dimension: ``default`` without a block mask; with one (of
    tile ``mask_tile``), the largest size of ``legal`` (sizes, largest first; None = any size)
    no larger than ``default`` that divides ``mask_tile`` (with ``legal=None``: ``default``
    if it divides, else ``mask_tile`` itself). None when no legal size divides it."""
    if mask_tile is None:
        return default
    if legal is None:
        return default if mask_tile % default == 0 else mask_tile
    for t in legal:
        if t <= default and mask_tile % t == 0:
            return t
    return None


def requested_tiles(problem, config, default, legal_q=None, legal_k=None):
    """``(block_q, block_k)`` a family runs ``problem`` with: ``config``'s, else the problem's
    requested tiles, else ``default``; with a block mask, per dimension the largest of
    ``legal_q`` / ``legal_k`` (None: any size) no larger than the default that divides the
    mask's tile (`tile_dividing`; None where none does)."""
    masked = problem.block_mask is not None
    bq = config.block_q or (None if masked else problem.block_q)
    bk = config.block_k or (None if masked else problem.block_k)
    if bq is None:
        bq = tile_dividing(default[0], problem.block_q if masked else None, legal_q)
    if bk is None:
        bk = tile_dividing(default[1], problem.block_k if masked else None, legal_k)
    return bq, bk


def backward_tiles(default_tiles: dict, problem):
    """The tensor-core backwards' kernel tiles for a problem: ``(dq, dkdv)`` = ((query rows per
    block, keys per stage), (key rows per block, queries per stage)), ``default_tiles``'s
    without a block mask; with one, every tile must divide the mask's tile so that a kernel
    tile lies inside one mask tile: the largest of 64 / 32 / 16 (no larger than the default)
    that divides it. None when no tiling fits."""
    if problem.block_mask is None:
        return default_tiles["dq"], default_tiles["dkdv"]
    block_q, block_k = problem.block_q, problem.block_k
    legal = (64, 32, 16)
    dq = (tile_dividing(default_tiles["dq"][0], block_q, legal),
          tile_dividing(default_tiles["dq"][1], block_k, legal))
    kv = (tile_dividing(default_tiles["dkdv"][0], block_k, legal),
          tile_dividing(default_tiles["dkdv"][1], block_q, legal))
    if None in dq or None in kv:
        return None
    return dq, kv

