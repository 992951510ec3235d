"""Context-parallel ring attention (ioaware.ring_plan, ioaware.distributed).

* The plan, in one process: every layout's shards partition the sequence; every (Q rank, K/V
  rank) pair's blocks cover exactly the entries the global causal mask allows, once; zigzag's
  steps are balanced; shard/unshard orders; the online-softmax merge with empty rows.
* The ring, on 2 and 4 gloo processes (tests/ring_worker.py, one spawn per world size): output,
  logsumexp and the gradients of q, k, v (through out, and through lse) equal single-process
  ``ioaware.attention`` on the full sequence (float32 against float64), for every layout, causal
  or not, GQA, on the world, on halves of it and on single ranks (``group=``); unequal shards,
  odd zigzag shards and disagreeing arguments refused on every rank; the docs' recipe as
  written. The same check with NCCL on 2 GPUs is marked ``gpu``.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from ioaware.ring_plan import LAYOUTS, kv_source, pair_blocks, shard_length, shard_positions
from tests import ring_worker

#: float32 ring against the float64 reference: relative Frobenius errors (measured ~1e-7..3e-7).
OUT_REL, GRAD_REL = 1e-5, 1e-4


# -- the plan ---------------------------------------------------------------------------------------
def _positions(layout, rank, world, seq_len):
    return [p for r in shard_positions(layout, rank, world, seq_len) for p in r]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shards_partition_the_sequence(layout):
    for world in range(1, 7):
        seq_len = 2 * world * 3
        held = [_positions(layout, r, world, seq_len) for r in range(world)]
        assert all(len(h) == seq_len // world for h in held)
        assert sorted(itertools.chain(*held)) == list(range(seq_len))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_pair_blocks_cover_exactly_the_mask(layout, causal):
    """For every P <= 6 and every (Q rank, K/V rank) pair: the union of the blocks is the set of
    (query, key) entries the global mask allows, and no entry is computed twice."""
    for world in range(1, 7):
        for n in ((2, 4, 6) if layout == "zigzag" else (1, 2, 3, 5)):
            seq_len = n * world
            pos = [_positions(layout, r, world, seq_len) for r in range(world)]
            for qr, kr in itertools.product(range(world), repeat=2):
                want = {(i, j) for i in range(n) for j in range(n) if not causal or pos[kr][j] <= pos[qr][i]}
                got = []
                for b in pair_blocks(layout, qr, kr, world, n, causal):
                    if b.causal:
                        assert b.q_len == b.k_len
                    got += [(b.q_start + i, b.k_start + j) for i in range(b.q_len) for j in range(b.k_len)
                            if not b.causal or j <= i]
                assert len(got) == len(set(got)), (layout, world, n, qr, kr)
                assert set(got) == want, (layout, world, n, qr, kr)


def _work(layout, world, n, rank, step):
    """Scores one rank computes at one step (causal)."""
    return sum(b.q_len * b.k_len // (2 if b.causal else 1)
               for b in pair_blocks(layout, rank, kv_source(rank, step, world), world, n, True))


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    world, n = 4, 64
    for step in range(1, world):
        assert len({_work("zigzag", world, n, r, step) for r in range(world)}) == 1
    per_rank = [sum(_work("contiguous", world, n, r, s) for s in range(world)) for r in range(world)]
    assert per_rank == sorted(per_rank) and per_rank[-1] > 3 * per_rank[0]
    assert [kv_source(2, s, 4) for s in range(4)] == [2, 1, 0, 3]


def test_layout_lengths_are_refused_naming_the_argument():
    assert shard_length(12, 3, "zigzag") == 4
    with pytest.raises(ValueError, match=r"seq_len = 10 .*zigzag.*divisible by 8"):
        shard_length(10, 4, "zigzag")
    with pytest.raises(ValueError, match=r"divisible by 3"):
        shard_length(10, 3, "striped")
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_length(8, 2, "ring")
    with pytest.raises(ValueError, match="world_size"):
        shard_length(8, 0, "contiguous")
    with pytest.raises(ValueError, match="shard_len .* even"):
        pair_blocks("zigzag", 0, 1, 2, 3, True)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shard_takes_the_layouts_positions(layout):
    from ioaware.distributed import shard
    world, seq_len = 3, 12
    x = np.arange(2 * seq_len * 5).reshape(2, seq_len, 5)
    for rank in range(world):
        want = x[:, _positions(layout, rank, world, seq_len)]
        np.testing.assert_array_equal(shard(x, rank, world, layout, dim=1), want)
        got = shard(torch.from_numpy(x), rank, world, layout, dim=-2)
        assert got.is_contiguous() and torch.equal(got, torch.from_numpy(want))
    with pytest.raises(ValueError, match=r"x.shape\[1\] = 12 .*divisible by 8"):
        shard(x, 0, 4, "zigzag", dim=1)
    with pytest.raises(ValueError, match="dim"):
        shard(x, 0, 3, layout, dim=3)
    with pytest.raises(TypeError, match="x must be"):
        shard([1, 2, 3], 0, 3, layout)


def test_merge_is_the_online_softmax_and_keeps_empty_rows_finite():
    from ioaware.distributed import _merge
    torch.manual_seed(0)
    s = torch.randn(3, 10, dtype=torch.float64)
    v = torch.randn(10, 4, dtype=torch.float64)
    s[1, :6] = -math.inf                     # row 1 sees no key in the first block
    s[2, :] = -math.inf                      # row 2 sees no key at all

    def part(cols):
        ss = s[:, cols]
        lse = torch.logsumexp(ss, -1)
        p = torch.where(torch.isneginf(lse)[:, None], torch.zeros_like(ss), torch.exp(ss - lse[:, None]))
        return p @ v[cols], lse

    out, lse = torch.zeros(3, 4, dtype=torch.float64), torch.full((3,), -math.inf, dtype=torch.float64)
    for cols in (slice(0, 6), slice(6, 10)):
        _merge(out, lse, *part(cols))
    want_out, want_lse = part(slice(0, 10))
    assert torch.isfinite(out).all() and torch.equal(out[2], torch.zeros(4)) and lse[2] == -math.inf
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse[:2], want_lse[:2], rtol=1e-12, atol=1e-12)


def test_ring_attention_needs_an_initialised_process_group():
    from ioaware.distributed import ring_attention
    x = torch.zeros(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(x, x, x)


# -- the ring on gloo processes ---------------------------------------------------------------------
@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}ranks")
def ranks(request, tmp_path_factory):
    world = request.param
    return world, ring_worker.spawn(world, tmp_path_factory.mktemp(f"ring{world}"))


def _check_cases(results, groups, dtype, out_rel, grad_rel):
    for rank, res in enumerate(results):
        assert "fatal" not in res, res.get("fatal")
        for group in groups:
            for name in ring_worker.CASES:
                r = res[f"{group}/{dtype}/{name}"]
                assert "error" not in r, f"rank {rank} {group} {name}:\n{r.get('error')}"
                where = f"rank {rank}, {group}, {name}: {r}"
                assert r["out"] < out_rel and r["lse"] < out_rel and r["unshard"] < out_rel, where
                assert max(r["dq"], r["dk"], r["dv"]) < grad_rel, where
                assert r["finite"] and r["lse_dtype"] == "torch.float32", where
                assert r["out_dtype"] == f"torch.{dtype}", where
                if "materialised_out_error" in r:      # the lse-gradient reference is the same attention
                    assert r["materialised_out_error"] < 1e-12, where


def test_ring_equals_single_process_attention(ranks):
    world, results = ranks
    groups = ("world", "half", "single") if world == 4 else ("world",)
    _check_cases(results, groups, "float32", OUT_REL, GRAD_REL)


def test_ring_refuses_on_every_rank(ranks):
    world, results = ranks
    for rank, res in enumerate(results):
        ref = res["refusals"]
        kind, msg = ref["unequal"]
        assert kind == "ValueError" and "equal shard" in msg and str([8] + [6] * (world - 1)) in msg
        kind, msg = ref["odd_zigzag"]
        assert kind == "ValueError" and "zigzag" in msg and f"2P = {2 * world}" in msg
        kind, msg = ref["one_rank_bad_heads"]
        if rank == world - 1:
            assert kind == "ValueError" and "key/value heads" in msg
        else:
            assert kind == "ValueError" and f"rank(s) [{world - 1}]" in msg
        kind, msg = ref["causal_differs"]
        assert kind == "ValueError" and msg.startswith("causal must be the same on every rank")
        kind, msg = ref["shard_odd"]
        assert kind == "ValueError" and "x.shape[2] = 10" in msg
        kind, msg = ref["unshard_grad"]
        assert kind == "ValueError" and msg.startswith("local requires grad")


def test_docs_recipe_runs_as_written(ranks):
    world, results = ranks
    for res in results:
        r = res["recipe"]
        assert r["x_local_tokens"] == 32
        assert r["y"] < OUT_REL and r["max_grad"] < GRAD_REL, r


@pytest.mark.gpu
def test_ring_on_two_gpus_with_nccl(tmp_path):
    """The same cases with NCCL on cuda:0 and cuda:1 (our Numba kernels per pair): float32 and
    bfloat16 (bfloat16 inputs are rounded once; the error is the kernels' and the merge's)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    results = ring_worker.spawn(2, tmp_path, device_kind="cuda")
    _check_cases(results, ("world",), "float32", 1e-4, 1e-3)
    _check_cases(results, ("world",), "bfloat16", 2e-2, 5e-2)
    for res in results:
        assert res["refusals"]["unequal"][0] == "ValueError"
