"""Tests of `kernels.tile_order`: the device-side map from a block to its (tile, batch*head)
for every head group (under Numba's CUDA simulator on a CPU machine, for real on a GPU),
its host twin, and the order choice."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda   # a global, which the CUDA simulator replaces inside kernels

from ioaware.launch_order import block_work
from kernels import tile_order


def test_default_and_forced_head_groups(monkeypatch):
    monkeypatch.delenv(tile_order.ENV, raising=False)
    for (pas, causal), g in tile_order.DEFAULT_HEAD_GROUP.items():
        assert tile_order.head_group(causal, pas) == g
    for value, want in (("tiles", 1), ("heads", 0), ("4", 4)):
        monkeypatch.setenv(tile_order.ENV, value)
        assert tile_order.head_group(True, "bwd") == want
        assert tile_order.head_group(False, "fwd") == want
    monkeypatch.setenv(tile_order.ENV, "rows")
    with pytest.raises(ValueError, match="KERNELS_TILE_ORDER"):
        tile_order.head_group(True)


def _dispatch_order(n_tiles, n_bh, group):
    """order[bh, tile] = dispatch position of the block working on (tile, bh)."""
    order = np.full((n_bh, n_tiles), -1)
    for by in range(n_bh):
        for bx in range(n_tiles):
            t, bh = block_work(bx, by, n_tiles, n_bh, group)
            assert order[bh, t] == -1, "two blocks on one (tile, head)"
            order[bh, t] = bx + n_tiles * by
    return order


@settings(max_examples=60, deadline=None)
@given(n_tiles=st.integers(1, 9), n_bh=st.integers(1, 11), group=st.integers(0, 12))
def test_host_map_is_a_bijection_in_the_stated_order(n_tiles, n_bh, group):
    order = _dispatch_order(n_tiles, n_bh, group)
    assert sorted(order.ravel()) == list(range(n_tiles * n_bh))
    g = n_bh if group == 0 else group
    for bh in range(n_bh):
        for t in range(n_tiles):
            # within a head, tiles in order; a group's heads interleaved tile by tile; the
            # groups one after another
            if t + 1 < n_tiles:
                assert order[bh, t] < order[bh, t + 1]
            if bh + 1 < n_bh and bh // g == (bh + 1) // g:
                assert order[bh, t] + 1 == order[bh + 1, t] or g == 1
            if bh + 1 < n_bh and bh // g != (bh + 1) // g:
                assert order[bh, -1] < order[bh + 1, 0]
    if group == 1:
        assert (order == np.arange(n_bh)[:, None] * n_tiles + np.arange(n_tiles)).all()
    if group == 0:
        assert (order == np.arange(n_tiles)[None, :] * n_bh + np.arange(n_bh)[:, None]).all()


@pytest.mark.parametrize("group", [1, 0, 2, 3])
def test_device_map_matches_the_host_twin(group):
    n_tiles, n_bh = 5, 7
    tile_and_head = tile_order.device_tile_and_head(group)

    @cuda.jit
    def record(seen, tiles_seen):
        tile, bh, n = tile_and_head()
        if cuda.threadIdx.x == 0:
            seen[bh, tile] = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y + 1
            tiles_seen[bh, tile] = n

    seen = np.zeros((n_bh, n_tiles), np.int64)
    tiles_seen = np.zeros((n_bh, n_tiles), np.int64)
    record[(n_tiles, n_bh), 1](seen, tiles_seen)
    assert (seen - 1 == _dispatch_order(n_tiles, n_bh, group)).all()
    assert (tiles_seen == n_tiles).all()


def test_tune_order_restores_the_environment(monkeypatch):
    from kernels import tune_order
    monkeypatch.setenv(tile_order.ENV, "8")
    seen = tune_order._with_order("heads", lambda: tile_order.head_group(True, "bwd"))
    assert seen == 0 and tile_order.head_group(True, "bwd") == 8
    monkeypatch.delenv(tile_order.ENV)
    assert tune_order._with_order("4", lambda: tile_order.head_group(False)) == 4
    assert tile_order.ENV not in os.environ
    for case in tune_order.CASES + tune_order.QUICK_CASES:
        dt, d, causal, n = case
        assert dt in ("fp32", "fp16") and d in (64, 128) and n >= 1024


def test_show_ncu_prints_the_shipped_profile(capsys):
    # the table kernels/NOTES_TF32_BWD.md quotes, from the shipped ncu CSV
    from pathlib import Path

    from kernels import tune_order
    path = (Path(__file__).resolve().parent.parent / "results"
            / "ncu_order_fp32_d128_causal_8192_h100_2026-11-23.csv")
    tune_order.show_ncu(str(path))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 9
    rows = [ln.split() for ln in lines[1:]]
    assert [r[0] for r in rows] == ["tiles"] * 3 + ["heads"] * 3 + ["4"] * 3
    assert [r[1] for r in rows] == ["forward", "dQ", "dK/dV"] * 3
    hit = {(r[0], r[1]): float(r[4]) for r in rows}
    # heads first loses the backward's L2 sharing; groups of four keep it
    assert hit[("heads", "dK/dV")] < 70 < 95 < hit[("4", "dK/dV")]
    notes = (Path(__file__).resolve().parent.parent / "kernels" / "NOTES_TF32_BWD.md").read_text()
    assert "\n".join(lines) in notes


@settings(max_examples=40, deadline=None)
@given(n_tiles=st.integers(1, 9), n_bh=st.integers(1, 11), group=st.integers(0, 12))
def test_dispatch_positions_invert_block_work(n_tiles, n_bh, group):
    from ioaware.launch_order import dispatch_positions
    assert (dispatch_positions(n_tiles, n_bh, group) == _dispatch_order(n_tiles, n_bh, group)).all()


def test_model_follows_the_launch_order_on_the_shipped_profile():
    # the cost model's DRAM reads against ncu's, per launch order (trace replay at this size):
    # tiles first and heads first differ by 3x in the forward, and the model follows
    from pathlib import Path

    from kernels import tune_order
    path = (Path(__file__).resolve().parent.parent / "results"
            / "ncu_order_fp32_128_causal_1024_h100_2026-11-23.json")
    rows = {(r["order"], r["kernel"]): r for r in tune_order.model_vs_ncu(str(path))}
    assert len(rows) == 9 and all(r["l2_model"] == "trace" for r in rows.values())
    for order in ("tiles", "heads"):
        r = rows[(order, "forward")]
        assert abs(r["predicted_dram_read_bytes"] / r["measured_dram_read_bytes"] - 1) < 0.05
    assert (rows[("heads", "forward")]["predicted_dram_read_bytes"]
            > 3 * rows[("tiles", "forward")]["predicted_dram_read_bytes"])
