"""GPU tests of the TF32 PTX intrinsics in `kernels.ptx` (marked ``gpu``: the CUDA simulator runs
no PTX).

* one warp's ``mma_tf32`` against the float64 product of tf32-exact matrices placed through
  `kernels.fragments_tf32` (exact products, float32 accumulation of 9 terms: a few ulp);
* ``cvt_tf32`` bit-exact against the NumPy model (round to nearest, ties away); ``split_tf32``
  against it as the tensor core reads the operands (big truncated to TF32, small rounded to
  nearest, ties away), NaN kept in big and infinities as infinite bigs;
* 3xTF32 (``split_tf32`` + three ``mma_tf32``) on arbitrary float32 matrices against float64:
  relative error of float32 order (<= 2**-19 of sum |a| |b|: the dropped small * small is
  < 2**-20 and each rounded small < 2**-21 of |a| |b|), where one plain TF32 product is
  ~2**-11;
* ``ld_shared_f32`` / ``ld_shared_f32x2`` bit-exact.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernels import fragments_tf32 as fr

pytestmark = pytest.mark.gpu


def _build():
    from numba import cuda, float32

    from kernels import ptx

    @cuda.jit
    def warp_mma(a_regs, b_regs, c_regs, d_regs):
        lane = cuda.threadIdx.x
        a = a_regs[lane]
        b = b_regs[lane]
        c = c_regs[lane]
        d = ptx.mma_tf32(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3])
        for i in range(4):
            d_regs[lane, i] = d[i]

    @cuda.jit
    def warp_mma3(a_vals, b_vals, d_regs):
        # float32 fragments in, 3xTF32 product out (small*big + big*small + big*big)
        lane = cuda.threadIdx.x
        a0 = ptx.split_tf32(a_vals[lane, 0])
        a1 = ptx.split_tf32(a_vals[lane, 1])
        a2 = ptx.split_tf32(a_vals[lane, 2])
        a3 = ptx.split_tf32(a_vals[lane, 3])
        b0 = ptx.split_tf32(b_vals[lane, 0])
        b1 = ptx.split_tf32(b_vals[lane, 1])
        z = float32(0.0)
        d = ptx.mma_tf32(a0[1], a1[1], a2[1], a3[1], b0[0], b1[0], z, z, z, z)
        d = ptx.mma_tf32(a0[0], a1[0], a2[0], a3[0], b0[1], b1[1], d[0], d[1], d[2], d[3])
        d = ptx.mma_tf32(a0[0], a1[0], a2[0], a3[0], b0[0], b1[0], d[0], d[1], d[2], d[3])
        for i in range(4):
            d_regs[lane, i] = d[i]

    @cuda.jit
    def conv(x, big, big2, small):
        i = cuda.grid(1)
        if i < x.size:
            big[i] = ptx.cvt_tf32(x[i])
            sp = ptx.split_tf32(x[i])
            big2[i] = sp[0]
            small[i] = sp[1]

    @cuda.jit
    def lds(src, one, two):
        sm = cuda.shared.array(128, dtype=float32)
        t = cuda.threadIdx.x
        sm[t] = src[t]
        sm[t + 64] = src[t + 64]
        cuda.syncthreads()
        base = ptx.shared_addr(sm, 0)
        one[t] = ptx.ld_shared_f32(base + 4 * t)
        p = ptx.ld_shared_f32x2(base + 8 * t)
        two[2 * t] = p[0]
        two[2 * t + 1] = p[1]

    return warp_mma, warp_mma3, conv, lds


def test_warp_mma_tf32_matches_float64():
    from numba import cuda
    warp_mma = _build()[0]
    rng = np.random.default_rng(5)
    for _ in range(3):
        a = fr.tf32_round(rng.standard_normal((16, 8)).astype(np.float32))
        b = fr.tf32_round(rng.standard_normal((8, 8)).astype(np.float32))
        c = rng.standard_normal((16, 8)).astype(np.float32)
        a_regs = np.zeros((32, 4), np.uint32)
        b_regs = np.zeros((32, 2), np.uint32)
        c_regs = np.zeros((32, 4), np.float32)
        for lane, reg in itertools.product(range(32), range(4)):
            a_regs[lane, reg] = a.view(np.uint32)[fr.a_elem(lane, reg)]
            c_regs[lane, reg] = c[fr.c_elem(lane, reg)]
        for lane, reg in itertools.product(range(32), range(2)):
            b_regs[lane, reg] = b.view(np.uint32)[fr.b_elem(lane, reg)]
        d_regs = cuda.to_device(np.zeros((32, 4), np.float32))
        warp_mma[1, 32](cuda.to_device(a_regs), cuda.to_device(b_regs), cuda.to_device(c_regs),
                        d_regs)
        got = d_regs.copy_to_host()
        d = np.zeros((16, 8))
        for lane, reg in itertools.product(range(32), range(4)):
            d[fr.c_elem(lane, reg)] = got[lane, reg]
        want = a.astype(np.float64) @ b.astype(np.float64) + c
        np.testing.assert_allclose(d, want, rtol=0, atol=16 * 9 * 2.0**-23)


def test_3xtf32_product_is_float32_accurate():
    from numba import cuda
    warp_mma3 = _build()[1]
    rng = np.random.default_rng(6)
    a = (rng.standard_normal((16, 8)) * np.exp(rng.uniform(-3, 3, (16, 8)))).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    a_vals = np.array([[a[fr.a_elem(l, r)] for r in range(4)] for l in range(32)], np.float32)
    b_vals = np.array([[b[fr.b_elem(l, r)] for r in range(2)] for l in range(32)], np.float32)
    d_regs = cuda.to_device(np.zeros((32, 4), np.float32))
    warp_mma3[1, 32](cuda.to_device(a_vals), cuda.to_device(b_vals), d_regs)
    got = d_regs.copy_to_host()
    d = np.zeros((16, 8))
    for lane, reg in itertools.product(range(32), range(4)):
        d[fr.c_elem(lane, reg)] = got[lane, reg]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = np.abs(a64) @ np.abs(b64)
    err = np.abs(d - a64 @ b64)
    assert (err <= bound * 2.0**-19).all(), float((err / bound).max())
    # one plain TF32 product is ~2**-11 off: the split is what makes the difference
    plain = fr.tf32_round(a).astype(np.float64) @ fr.tf32_round(b).astype(np.float64)
    assert np.abs(plain - a64 @ b64).max() > 100 * err.max()


def test_cvt_and_split_match_numpy_rounding():
    from numba import cuda
    conv = _build()[2]
    rng = np.random.default_rng(1)
    n = 4096
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-10, 10, n))).astype(np.float32)
    x[:4] = [1 + 2.0**-11, -(1 + 2.0**-11), 0.0, 3.0]      # ties, zero, exact
    x[4:8] = [1 + 2.0**-10 - 2.0**-23, -(1 + 2.0**-12 + 2.0**-13), 2.0**-130, -2.0**-149]
    big, big2, small = (cuda.to_device(np.zeros(n, np.uint32)) for _ in range(3))
    conv[n // 128, 128](cuda.to_device(x), big, big2, small)
    np.testing.assert_array_equal(big.copy_to_host(), fr.tf32_round(x).view(np.uint32))
    want_big, want_small = fr.tf32_split(x)
    np.testing.assert_array_equal(big2.copy_to_host(), want_big.view(np.uint32))
    # the tensor core reads small's bits above the low 13: the added half ulp rounds it
    got_small = fr.tf32_truncate(small.copy_to_host().view(np.float32))
    np.testing.assert_array_equal(got_small.view(np.uint32), want_small.view(np.uint32))
    # big + small is x but for the rounding of small (TF32's denormals, below 2**-136, aside)
    normal = np.abs(x) >= 2.0**-100
    err = np.abs(want_big.astype(np.float64) + want_small - x)
    assert normal.sum() > n // 2 and (err <= 2.0**-21 * np.abs(x))[normal].all()


def test_split_keeps_nan_and_infinity_in_big():
    from numba import cuda
    conv = _build()[2]
    bits = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800001, 0x7F800000, 0xFF800000,
                     0x7F7FFFFF, 0x00000001] * 16, np.uint32)
    x = bits.view(np.float32)
    big, big2, small = (cuda.to_device(np.zeros(x.size, np.uint32)) for _ in range(3))
    conv[1, x.size](cuda.to_device(x), big, big2, small)
    got = fr.tf32_truncate(big2.copy_to_host().view(np.float32)).reshape(16, 8)
    assert np.isnan(got[:, :3]).all()                       # a NaN stays a NaN
    assert not np.isfinite(got[:, 3:6]).any()               # NaN with low bits only, +-inf
    assert np.isfinite(got[:, 6:]).all() and (got[:, 6] == fr.tf32_truncate(x[6])).all()


def test_shared_loads():
    from numba import cuda
    lds = _build()[3]
    src = np.random.default_rng(2).standard_normal(128).astype(np.float32)
    one = cuda.to_device(np.zeros(64, np.float32))
    two = cuda.to_device(np.zeros(128, np.float32))
    lds[1, 64](cuda.to_device(src), one, two)
    np.testing.assert_array_equal(one.copy_to_host(), src[:64])
    np.testing.assert_array_equal(two.copy_to_host(), src)
