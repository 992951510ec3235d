"""BlockInfo against brute force: the tiles it visits are exactly those with an allowed entry
(causal in either alignment, sliding windows, block masks)."""
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
    window = None
    if draw(st.booleans()):
        side = st.one_of(st.just(-1), st.integers(0, 5), st.integers(0, 80))
        window = (draw(side), draw(side))
        if causal and nq != nk:
            alignment = "bottom_right"      # top-left causal with a window is refused (tested below)
    bm = None
    if draw(st.booleans()):
        shape = (-(-nq // bq), -(-nk // bk))
        bits = draw(st.lists(st.booleans(), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
        bm = np.array(bits, dtype=bool).reshape(shape)
    return BlockInfo.with_block_mask(nq, nk, bq, bk, causal, bm, alignment, window)


def _allowed(info):
    """The rules written out: causal top-left j <= i, bottom-right j <= i + Nk - Nq
    (FlashAttention-2); a window (left, right) i + Nk - Nq - left <= j <= i + Nk - Nq + right,
    -1 = unbounded side."""
    a = np.ones((info.seqlen_q, info.seqlen_k), dtype=bool)
    off = info.seqlen_k - info.seqlen_q
    for i in range(info.seqlen_q):
        for j in range(info.seqlen_k):
            if info.causal:
                shift = off if info.causal_alignment == "bottom_right" else 0
                a[i, j] &= j <= i + shift
            if info.window_size is not None:
                left, right = info.window_size
                if left >= 0:
                    a[i, j] &= j >= i + off - left
                if right >= 0:
                    a[i, j] &= j <= i + off + right
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
def test_tile_needs_mask_iff_the_band_cuts_the_tile(info):
    allowed = _allowed(info)
    for m, n in info.tiles():
        r0, r1 = info.q_range(m)
        c0, c1 = info.k_range(n)
        assert info.tile_needs_mask(m, n) == (not allowed[r0:r1, c0:c1].all())


@given(infos())
def test_tile_masks_and_the_patterns_are_the_rule(info):
    allowed = _allowed(info)
    assert np.array_equal(info.position_pattern(), allowed)
    causal_only = _allowed(BlockInfo(info.seqlen_q, info.seqlen_k, 1, 1, info.causal,
                                     causal_alignment=info.causal_alignment))
    assert np.array_equal(info.causal_pattern(), causal_only)
    for m, n in info.tiles():
        r0, r1 = info.q_range(m)
        c0, c1 = info.k_range(n)
        full = np.ones((r1 - r0, c1 - c0), bool)
        tile = info.tile_position_mask(m, n)
        assert np.array_equal(allowed[r0:r1, c0:c1], full if tile is None else tile)
        tile = info.tile_causal_mask(m, n)
        assert np.array_equal(causal_only[r0:r1, c0:c1], full if tile is None else tile)


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


@pytest.mark.parametrize("window, keys_per_row", [((0, 0), [[3], [4], [5], [6]]),
                                                   ((1, -1), [[2, 3, 4, 5, 6], [3, 4, 5, 6], [4, 5, 6], [5, 6]]),
                                                   ((-1, 0), [[0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5],
                                                              [0, 1, 2, 3, 4, 5, 6]])])
def test_window_is_bottom_right_aligned(window, keys_per_row):
    """4 queries, 7 keys: off = 3, so query i sits at key position i + 3 (FlashAttention-2)."""
    info = BlockInfo(4, 7, 2, 2, window_size=window)
    assert [list(np.flatnonzero(row)) for row in info.position_pattern()] == keys_per_row


def test_window_combined_with_causal():
    """Causal adds j <= i + off: right is effectively 0; top-left causal agrees when Nq == Nk."""
    for alignment in ("top_left", "bottom_right"):
        info = BlockInfo(6, 6, 2, 2, True, causal_alignment=alignment, window_size=(2, 3))
        assert info.band == (-2, 0)
    info = BlockInfo(3, 8, 2, 2, True, causal_alignment="bottom_right", window_size=(1, -1))
    assert [list(np.flatnonzero(row)) for row in info.position_pattern()] == [[4, 5], [5, 6], [6, 7]]
    assert BlockInfo(3, 8, 2, 2, window_size=(-1, -1)).window_size is None
    assert BlockInfo(3, 8, 2, 2, window_size=[2, 5]).window_size == (2, 5)


def test_rows_whose_window_holds_no_key_visit_no_tile():
    """Nq > Nk: off = -6, so with right = 1 the first 5 queries see nothing."""
    info = BlockInfo(10, 4, 2, 2, window_size=(2, 1))
    pattern = info.position_pattern()
    assert not pattern[:5].any() and pattern[5:].any(axis=1).all()
    assert info.k_blocks(0) == () and info.k_blocks(1) == ()


def test_bad_windows_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"BlockInfo.window_size=\(2, 0\) with top-left causal .* mix two alignments"):
        BlockInfo(5, 9, 4, 4, True, window_size=(2, 0))
    with pytest.raises(ValueError, match="window_size must be a pair .* its left entry is -2"):
        BlockInfo(5, 5, 4, 4, window_size=(-2, 0))
    for bad in (3, (1, 2, 3), (1.0, 2), (True, 2), "1,2"):
        with pytest.raises(TypeError, match="window_size"):
            BlockInfo(5, 5, 4, 4, window_size=bad)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="block_q"):
        BlockInfo(10, 10, 0, 4)
    with pytest.raises(ValueError, match="block_mask"):
        BlockInfo.with_block_mask(10, 10, 4, 4, block_mask=np.ones((2, 3), dtype=bool))
    with pytest.raises(ValueError, match="causal_alignment"):
        BlockInfo(10, 10, 4, 4, True, causal_alignment="lower_right")
