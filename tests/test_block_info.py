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
    bm = None
    if draw(st.booleans()):
        shape = (-(-nq // bq), -(-nk // bk))
        bits = draw(st.lists(st.booleans(), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
        bm = np.array(bits, dtype=bool).reshape(shape)
    return BlockInfo.with_block_mask(nq, nk, bq, bk, causal, bm)


def _allowed(info):
    a = np.ones((info.seqlen_q, info.seqlen_k), dtype=bool)
    if info.causal:
        a &= np.arange(info.seqlen_k)[None, :] <= np.arange(info.seqlen_q)[:, None]
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


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="block_q"):
        BlockInfo(10, 10, 0, 4)
    with pytest.raises(ValueError, match="block_mask"):
        BlockInfo.with_block_mask(10, 10, 4, 4, block_mask=np.ones((2, 3), dtype=bool))
