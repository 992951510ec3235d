"""CPU tests of the m16n8k16 / ldmatrix fragment maps (`kernels.fragments`), exhaustive.

The tensor-core kernel cannot run in the CUDA simulator, so its register bookkeeping is checked
here: every (lane, register, half) <-> (row, col) pair, both directions, against entries copied
from the PTX ISA's fragment figures, and the three address patterns the kernel gives ldmatrix,
by emulating ldmatrix on a random tile.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernels import fragments as fr

LANES = range(32)


def test_a_bijective_and_inverse():
    seen = {}
    for lane, reg, half in itertools.product(LANES, range(4), range(2)):
        rc = fr.a_elem(lane, reg, half)
        assert rc not in seen, f"A element {rc} held twice"
        seen[rc] = (lane, reg, half)
        assert fr.a_owner(*rc) == (lane, reg, half)
    assert set(seen) == {(r, c) for r in range(16) for c in range(16)}


def test_b_bijective_and_inverse():
    seen = set()
    for lane, reg, half in itertools.product(LANES, range(2), range(2)):
        kn = fr.b_elem(lane, reg, half)
        assert kn not in seen
        seen.add(kn)
        assert fr.b_owner(*kn) == (lane, reg, half)
    assert seen == {(k, n) for k in range(16) for n in range(8)}


def test_c_bijective_and_inverse():
    seen = set()
    for lane, reg in itertools.product(LANES, range(4)):
        rc = fr.c_elem(lane, reg)
        assert rc not in seen
        seen.add(rc)
        assert fr.c_owner(*rc) == (lane, reg)
    assert seen == {(r, c) for r in range(16) for c in range(8)}


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_bijective_and_inverse(trans):
    seen = set()
    for lane, reg, half in itertools.product(LANES, range(4), range(2)):
        mrc = fr.ldmatrix_elem(lane, reg, half, trans)
        assert mrc not in seen
        seen.add(mrc)
        assert fr.ldmatrix_owner(*mrc, trans=trans) == (lane, reg, half)
    assert len(seen) == 4 * 64


# Entries read off the PTX ISA figures (m16n8k16 .f16 A/B, .f32 C/D), written out literally.
ISA_A = {  # (lane, element a_i) -> (row, col)
    (0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 3): (8, 1),
    (0, 4): (0, 8), (0, 5): (0, 9), (0, 6): (8, 8), (0, 7): (8, 9),
    (1, 0): (0, 2), (3, 1): (0, 7), (4, 0): (1, 0), (31, 7): (15, 15), (30, 2): (15, 4),
    (13, 5): (3, 11),
}
ISA_B = {  # (lane, element b_i) -> (k, n)
    (0, 0): (0, 0), (0, 1): (1, 0), (0, 2): (8, 0), (0, 3): (9, 0), (1, 0): (2, 0),
    (4, 0): (0, 1), (31, 3): (15, 7), (6, 2): (12, 1),
}
ISA_C = {  # (lane, c_i) -> (row, col)
    (0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 3): (8, 1), (3, 1): (0, 7),
    (4, 0): (1, 0), (31, 3): (15, 7), (9, 2): (10, 2),
}


def test_against_isa_entries():
    for (lane, e), rc in ISA_A.items():
        assert fr.a_elem(lane, e // 2, e % 2) == rc
    for (lane, e), kn in ISA_B.items():
        assert fr.b_elem(lane, e // 2, e % 2) == kn
    for (lane, i), rc in ISA_C.items():
        assert fr.c_elem(lane, i) == rc


def test_bad_arguments_raise():
    for call in (lambda: fr.a_elem(32, 0, 0), lambda: fr.a_elem(0, 4, 0),
                 lambda: fr.b_owner(16, 0), lambda: fr.c_elem(0, 4),
                 lambda: fr.ldmatrix_owner(4, 0, 0)):
        with pytest.raises(ValueError):
            call()


def _emulate_mma(a, b, c):
    """A warp's mma computed register by register through the fragment maps only."""
    a_regs = np.zeros((32, 4, 2)); b_regs = np.zeros((32, 2, 2)); d_regs = np.zeros((32, 4))
    for lane, reg, half in itertools.product(LANES, range(4), range(2)):
        a_regs[lane, reg, half] = a[fr.a_elem(lane, reg, half)]
    for lane, reg, half in itertools.product(LANES, range(2), range(2)):
        b_regs[lane, reg, half] = b[fr.b_elem(lane, reg, half)]
    # the hardware's view: element (i, j) of D = sum_k A[i, k] B[k, j], gathered via owners
    for lane, reg in itertools.product(LANES, range(4)):
        i, j = fr.c_elem(lane, reg)
        acc = c[i, j]
        for k in range(16):
            la, ra, ha = fr.a_owner(i, k)
            lb, rb, hb = fr.b_owner(k, j)
            acc += a_regs[la, ra, ha] * b_regs[lb, rb, hb]
        d_regs[lane, reg] = acc
    d = np.zeros((16, 8))
    for lane, reg in itertools.product(LANES, range(4)):
        d[fr.c_elem(lane, reg)] = d_regs[lane, reg]
    return d


def test_emulated_mma_is_matmul():
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((16, 16)), rng.standard_normal((16, 8)), rng.standard_normal((16, 8))
    np.testing.assert_allclose(_emulate_mma(a, b, c), a @ b + c, rtol=1e-12, atol=1e-12)


def test_scores_c_fragments_are_probability_a_fragment():
    """P (16x16) from two 16x8 score tiles feeds the second mma as A without moving."""
    for lane, tile, reg in itertools.product(LANES, range(2), range(4)):
        row, col = fr.c_elem(lane, reg)
        a_reg, half = fr.c_pair_to_a(tile, reg)
        assert fr.a_elem(lane, a_reg, half) == (row, col + 8 * tile)


def _emulate_ldmatrix(tile, row_col_of_lane, trans):
    """Registers of ldmatrix.x4 when lane l gives the address of tile[row_col_of_lane(l)]."""
    rows = [row_col_of_lane(lane) for lane in LANES]
    out = np.zeros((32, 4, 2))
    for lane, reg, half in itertools.product(LANES, range(4), range(2)):
        m, r, c = fr.ldmatrix_elem(lane, reg, half, trans)
        r0, c0 = rows[8 * m + r]  # lane 8m + r gave row r of matrix m
        out[lane, reg, half] = tile[r0, c0 + c]
    return out


def test_q_pattern_gives_a_fragment():
    q = np.random.default_rng(1).standard_normal((16, 16))
    regs = _emulate_ldmatrix(q, fr.q_ldmatrix_row_col, trans=False)
    for lane, reg, half in itertools.product(LANES, range(4), range(2)):
        assert regs[lane, reg, half] == q[fr.a_elem(lane, reg, half)]


def test_k_pattern_gives_b_fragments_of_k_transposed():
    k = np.random.default_rng(2).standard_normal((16, 16))  # [key, dim]
    regs = _emulate_ldmatrix(k, fr.k_ldmatrix_row_col, trans=False)
    for lane, ntile, reg, half in itertools.product(LANES, range(2), range(2), range(2)):
        kk, n = fr.b_elem(lane, reg, half)  # B = K^T: (dim kk, key n)
        assert regs[lane, 2 * ntile + reg, half] == k[8 * ntile + n, kk]


def test_v_pattern_gives_b_fragments_of_v():
    v = np.random.default_rng(3).standard_normal((16, 16))  # [key, dim]
    regs = _emulate_ldmatrix(v, fr.v_ldmatrix_row_col, trans=True)
    for lane, ntile, reg, half in itertools.product(LANES, range(2), range(2), range(2)):
        kk, n = fr.b_elem(lane, reg, half)  # B = V: (key kk, dim n)
        assert regs[lane, 2 * ntile + reg, half] == v[kk, 8 * ntile + n]


def test_backward_transposed_warp_step():
    """The dK/dV kernel's orientation, emulated through the maps: K rows as A (the Q pattern on
    the K tile in shared memory), Q and dO as B (the K pattern, non-transposed) give S^T and
    dP^T; their C fragments feed dV += P^T dO and dK += dS^T Q as A, with dO and Q as B via the
    V pattern (transposed). Checked against NumPy matmuls."""
    rng = np.random.default_rng(5)
    k_t, v_t = rng.standard_normal((16, 16)), rng.standard_normal((16, 16))     # [key, dim]
    q_t, do_t = rng.standard_normal((16, 16)), rng.standard_normal((16, 16))    # [query, dim]

    def a_of(tile, pattern):
        regs = _emulate_ldmatrix(tile, pattern, trans=False)
        a = np.zeros((16, 16))
        for lane, reg, half in itertools.product(LANES, range(4), range(2)):
            a[fr.a_elem(lane, reg, half)] = regs[lane, reg, half]
        return a

    def b_of(tile, pattern, trans, ntile):
        regs = _emulate_ldmatrix(tile, pattern, trans=trans)
        b = np.zeros((16, 8))
        for lane, reg, half in itertools.product(LANES, range(2), range(2)):
            b[fr.b_elem(lane, reg, half)] = regs[lane, 2 * ntile + reg, half]
        return b

    def c_to_a(c0, c1):  # two 16x8 C tiles -> the 16x16 A tile, register by register
        a = np.zeros((16, 16))
        for lane, tile, reg in itertools.product(LANES, range(2), range(4)):
            a_reg, half = fr.c_pair_to_a(tile, reg)
            a[fr.a_elem(lane, a_reg, half)] = (c0, c1)[tile][fr.c_elem(lane, reg)]
        return a

    ka, va = a_of(k_t, fr.q_ldmatrix_row_col), a_of(v_t, fr.q_ldmatrix_row_col)
    st = [_emulate_mma(ka, b_of(q_t, fr.k_ldmatrix_row_col, False, n), np.zeros((16, 8)))
          for n in range(2)]
    dpt = [_emulate_mma(va, b_of(do_t, fr.k_ldmatrix_row_col, False, n), np.zeros((16, 8)))
           for n in range(2)]
    np.testing.assert_allclose(np.hstack(st), k_t @ q_t.T, atol=1e-12)
    np.testing.assert_allclose(np.hstack(dpt), v_t @ do_t.T, atol=1e-12)
    pt = c_to_a(*st)                     # stands for P^T (any elementwise map keeps the layout)
    dv = np.hstack([_emulate_mma(pt, b_of(do_t, fr.v_ldmatrix_row_col, True, n), np.zeros((16, 8)))
                    for n in range(2)])
    dk = np.hstack([_emulate_mma(c_to_a(*dpt), b_of(q_t, fr.v_ldmatrix_row_col, True, n),
                                 np.zeros((16, 8))) for n in range(2)])
    np.testing.assert_allclose(dv, (k_t @ q_t.T) @ do_t, atol=1e-10)
    np.testing.assert_allclose(dk, (v_t @ do_t.T) @ q_t, atol=1e-10)
