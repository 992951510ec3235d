"""sim — an IO cost model of naive and tiled (Flash) attention schedules.

Workload, hardware and schedule are data (:class:`Workload`, :class:`GPUProfile`,
:class:`Schedule`); the cost functions are small and pure:

* :func:`predict` — exact global-memory ("HBM") bytes and FLOPs (closed form), DRAM bytes after
  an L2 model, shared-memory footprint, occupancy, intra-SM warp-split traffic, the
  shared-memory traffic of our CUDA-core kernels from their register micro-tiles
  (:mod:`sim.smem`) and a roofline time (raw; calibrated when the caller passes the measured
  records or results files to fit on, ``calibration=``).
* :func:`trace` — the same schedule walked tile by tile (every load/store with bytes, level and
  address); equal to the closed form by test.
* :func:`search_blocks` — feasible block sizes, best, frontier. :func:`sweep` — vectorised
  closed-form sweeps.
* :func:`choose_tiles` / :class:`TileConfig` (:mod:`sim.tiles`) — the CUDA-core kernels'
  per-thread micro-tiles; :mod:`sim.resources` reads their registers table.
* :func:`predict_ring` (:mod:`sim.ring`) — context-parallel ring attention over P GPUs, step by
  step: each pair's attention by :func:`predict`, each K/V transfer over the profile's
  interconnect; total time, scaling efficiency, the shard length where communication dominates.

Command line: ``python -m sim predict ...`` / ``python -m sim sweep ...`` / ``python -m sim ring ...``; benchmark:
``python -m sim.bench``.
"""
from .counts import closed_form, tile_stats_blockinfo, tile_stats_closed
from .l2 import L2Result, simulate_l2
from .model import Efficiency, Prediction, calibrate, predict, schedule_for_record, smem_traffic
from .profiles import PROFILES, GPUProfile, load_profile
from .ring import RingPrediction, predict_ring
from .search import SearchResult, search_blocks, sweep
from .tiles import TileConfig, choose_tiles
from .trace import Event, Trace, trace
from .workload import Schedule, Workload, density_block_mask, occupancy, resolve_blocks, sram_bytes_per_block

__all__ = ["PROFILES", "GPUProfile", "load_profile", "Workload", "Schedule", "predict", "Prediction",
           "trace", "Trace", "Event", "search_blocks", "SearchResult", "sweep", "closed_form",
           "simulate_l2", "L2Result", "Efficiency", "calibrate", "schedule_for_record",
           "smem_traffic", "density_block_mask", "resolve_blocks", "sram_bytes_per_block", "occupancy",
           "tile_stats_blockinfo", "tile_stats_closed", "TileConfig", "choose_tiles", "predict_ring",
           "RingPrediction"]
