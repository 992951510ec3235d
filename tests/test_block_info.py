"""BlockInfo against brute force: the tiles it visits are exactly those with an allowed entry."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ioaware.block_info import BlockInfo


@st.composite
def infos(draw):
    nq, nk = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    bq, bk = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    causal = draw(st.booleans())
    alignment = draw(st.sampled_from(["top_left", "bottom_right"]))
    bm = None
    if draw(st.booleans()):
        shape = (-(-nq // bq), -(-nk // bk))
        bits = draw(st.lists(st.booleans(), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
        bm = np.array(bits, dtype=bool).reshape(shape)
    return BlockInfo.with_block_mask(nq, nk, bq, bk, causal, bm, alignment)


def _allowed(info):
    """The causal rule written out: top-left j <= i; bottom-right j <= i + Nk - Nq (FlashAttention-2)."""
    a = np.ones((info.seqlen_q, info.seqlen_k), dtype=bool)
    if info.causal:
        shift = info.seqlen_k - info.seqlen_q if info.causal_alignment == "bottom_right" else 0
        for i in range(info.seqlen_q):
            a[i, max(0, i + shift + 1):] = False
    return a


@given(infos())
def test_visited_tiles_are_exactly_the_tiles_with_allowed_entries(info):
    allowed = _allowed(info)
    expected = set()
    for m in range(info.n_blocks_q):
        for n in range(info.n_blocks_k):
            r0, r1 = info.q_range(m)
            c0, c1 = info.k_range(n)
            if allowed[r0:r1, c0:c1].any() and (info.block_mask is None or info.block_mask[m][n]):
                expected.add((m, n))
    assert set(info.tiles()) == expected
    assert info.n_tiles == len(expected)
    # Q-outer and K-outer views of the same set agree, and the CSR forms encode them.
    assert {(m, n) for n in range(info.n_blocks_k) for m in info.q_blocks(n)} == expected
    off, idx = info.kv_schedule()
    assert {(m, int(n)) for m in range(info.n_blocks_q) for n in idx[off[m]:off[m + 1]]} == expected
    off, idx = info.q_schedule()
    assert {(int(m), n) for n in range(info.n_blocks_k) for m in idx[off[n]:off[n + 1]]} == expected


@given(infos())
def test_tile_needs_mask_iff_the_causal_mask_cuts_the_tile(info):
    allowed = _allowed(info)
    for m, n in info.tiles():
        r0, r1 = info.q_range(m)
        c0, c1 = info.k_range(n)
        assert info.tile_needs_mask(m, n) == (not allowed[r0:r1, c0:c1].all())


@given(infos())
def test_tile_causal_masks_and_the_causal_pattern_are_the_rule(info):
    allowed = _allowed(info)
    assert np.array_equal(info.causal_pattern(), allowed)
    for m, n in info.tiles():
        r0, r1 = info.q_range(m)
        c0, c1 = info.k_range(n)
        tile = info.tile_causal_mask(m, n)
        assert np.array_equal(allowed[r0:r1, c0:c1], np.ones((r1 - r0, c1 - c0), bool) if tile is None else tile)


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")
@pytest.mark.parametrize("nq, nk", [(5, 9), (9, 5), (7, 7), (1, 6)])
def test_bottom_right_aligns_the_last_query_with_the_last_key(nq, nk):
    """As torch.nn.attention.bias.causal_lower_right: the last query row sees every key."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
    for alignment, bias in (("bottom_right", causal_lower_right), ("top_left", causal_upper_left)):
        info = BlockInfo(nq, nk, 4, 4, True, causal_alignment=alignment)
        want = bias(nq, nk)._materialize(torch.device("cpu")).numpy()
        assert np.array_equal(info.causal_pattern(), want)
    assert BlockInfo(nq, nk, 4, 4, True, causal_alignment="bottom_right").causal_pattern()[-1].all()


def test_existing_positional_construction_is_top_left():
    assert BlockInfo(10, 7, 4, 3, True).causal_alignment == "top_left"
    assert BlockInfo(10, 7, 4, 3, True).tiles() == BlockInfo(10, 7, 4, 3, True, None, "top_left").tiles()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="block_q"):
        BlockInfo(10, 10, 0, 4)
    with pytest.raises(ValueError, match="block_mask"):
        BlockInfo.with_block_mask(10, 10, 4, 4, block_mask=np.ones((2, 3), dtype=bool))
    with pytest.raises(ValueError, match="causal_alignment"):
        BlockInfo(10, 10, 4, 4, True, causal_alignment="lower_right")
