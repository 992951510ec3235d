"""Host helpers shared by the tensor-core kernels (`kernels.flash_mma_fwd.mask_on_device`,
`dropout_constants`), on the CPU: the device mask under Numba's CUDA simulator, the dropout
constants against `ioaware.dropout`'s own hash; and the SASS loop scan of `kernels.mma_check`."""
from __future__ import annotations

import numpy as np
import pytest

from ioaware.dropout import fmix32, keep_mask
from kernels.flash_mma_fwd import dropout_constants, mask_on_device


@pytest.mark.parametrize("seed,p", [(0, 0.1), (3, 0.25), (2**40 + 7, 0.5), (5, 0.0)])
def test_dropout_constants_regenerate_the_keep_mask(seed, p):
    has_dropout, seed_hash, threshold, inv_keep = dropout_constants(seed, p)
    assert has_dropout == (p > 0) and inv_keep == pytest.approx(1 / (1 - p))
    if not has_dropout:
        assert threshold == 0
        return
    bh, rows, cols = 3, np.arange(40)[:, None], np.arange(50)[None, :]
    # what the kernels compute from the constants: three more fmix32 rounds, then >= threshold
    h = fmix32(fmix32(fmix32(np.uint32(seed_hash) ^ np.uint32(bh)) ^ rows.astype(np.uint32))
               ^ cols.astype(np.uint32))
    np.testing.assert_array_equal(h >= np.uint32(threshold), keep_mask(seed, p, bh, rows, cols))


def test_mask_on_device_broadcast_flags_values_and_errors():
    mask = np.random.default_rng(0).random((2, 1, 5, 7)) < 0.5
    maskd, mb, mh, mq = mask_on_device(mask, "numpy", 2, 4, 5, 7)
    assert (mb, mh, mq) == (1, 0, 1)
    np.testing.assert_array_equal(maskd.copy_to_host(), mask.astype(np.uint8))
    key_pad = mask[:, :, :1]                       # [B, 1, 1, Nk]: a key-padding mask
    assert mask_on_device(key_pad, "numpy", 2, 4, 5, 7)[1:] == (1, 0, 0)
    dummy, *flags = mask_on_device(None, "numpy", 2, 4, 5, 7)
    assert flags == [0, 0, 0] and dummy.copy_to_host().shape == (1, 1, 1, 1)
    with pytest.raises(ValueError, match="mask must be boolean"):
        mask_on_device(mask[..., :6], "numpy", 2, 4, 5, 7)


def test_local_memory_inside_loops_of_a_sass_listing():
    """`kernels.mma_check.local_in_loops` counts LDL/STL between a label and a later branch back
    to it, and not those before the loop or after a forward branch."""
    from kernels.mma_check import local_in_loops
    sass = "\n".join([
        "        /*0000*/   STL [R1], R2 ;",            # before any loop
        ".L_x_1:",
        "        /*0010*/   LDL R3, [R1] ;",            # inside loop 1
        "        /*0020*/   HMMA.16816.F32 R4, R8, R10, R4 ;",
        "        /*0030*/   @P0 BRA `(.L_x_1) ;",       # back edge of loop 1
        "        /*0040*/   BRA `(.L_x_2) ;",           # forward branch: no loop
        "        /*0050*/   STL [R1+0x4], R5 ;",
        ".L_x_2:",
        "        /*0060*/   LDL.LU R6, [R1+0x4] ;",
        "        /*0070*/   EXIT ;",
    ])
    assert local_in_loops(sass) == 1
    # a back edge at the end makes everything after .L_x_1 one loop
    assert local_in_loops(sass.replace("EXIT ;", "BRA `(.L_x_1) ;")) == 3


@pytest.fixture
def as_if_on_gpu(monkeypatch):
    """The entry points' checks run before any GPU work: pretend the GPU check passed, so
    that every later check is reached on the CPU (each case below raises before a launch)."""
    from kernels import fastlaunch
    monkeypatch.setattr(fastlaunch, "real_gpu", lambda: True)


def _bwd_args(q, k, v):
    return dict(out=np.zeros_like(q), lse=np.zeros(q.shape[:-1], np.float32),
                dout=np.zeros_like(q))


@pytest.mark.parametrize("module,dtype,name", [("flash_mma_fwd", np.float16, "tensor-core"),
                                               ("flash_tf32_fwd", np.float32, "3xTF32"),
                                               ("flash_mma_bwd", np.float16, "tensor-core"),
                                               ("flash_tf32_bwd", np.float32, "3xTF32")])
def test_tensor_core_entry_points_refuse_bad_problems(as_if_on_gpu, module, dtype, name):
    import importlib
    mod = importlib.import_module(f"kernels.{module}")
    backward = module.endswith("bwd")

    def call(q, k, v, **kw):
        extra = _bwd_args(q, k, v) if backward else {}
        extra.update(kw)
        if backward:
            return mod.backward(q, k, v, extra.pop("out"), extra.pop("lse"), extra.pop("dout"),
                                **extra)
        return mod.forward(q, k, v, **extra)

    z = lambda *shape: np.zeros(shape, dtype)  # noqa: E731
    q, kv = z(1, 4, 8, 64), z(1, 2, 8, 64)
    with pytest.raises(ValueError, match="4-D"):
        call(z(4, 8, 64), z(4, 8, 64), z(4, 8, 64), scale=0.1)
    with pytest.raises(ValueError, match="k and v must be"):
        call(q, kv, z(1, 2, 9, 64), scale=0.1)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        call(z(1, 3, 8, 64), kv, kv, scale=0.1)
    with pytest.raises(ValueError, match=f"for the {name} kernel"):
        call(z(1, 4, 8, 80), z(1, 2, 8, 80), z(1, 2, 8, 80), scale=0.1)
    with pytest.raises(ValueError, match="scale must be a positive"):
        call(q, kv, kv, scale=0.0)
    with pytest.raises(ValueError, match="dropout_p"):
        call(q, kv, kv, scale=0.1, dropout_p=1.0)
    with pytest.raises(TypeError):
        call(q, kv, kv.tolist(), scale=0.1)
    if backward:
        with pytest.raises(ValueError, match="lse must have shape"):
            call(q, kv, kv, scale=0.1, lse=np.zeros((1, 4, 9), np.float32))
        with pytest.raises(ValueError, match="dout must have q's shape"):
            call(q, kv, kv, scale=0.1, dout=z(1, 4, 8, 32))


@pytest.mark.parametrize("causal", [False, True])
def test_device_schedules_are_the_kernels_csr_schedules(causal):
    """`kernels.flash_mma_bwd.device_schedules` (both backwards' schedules on the device, under
    the simulator here) holds `_schedules`' arrays for the dQ and the dK/dV tiles, with and
    without a block mask."""
    from kernels.flash_mma_bwd import _schedules, device_schedules
    rng = np.random.default_rng(1)
    block_mask = rng.random((1, 2, 3, 4)) > 0.3
    for bm, bq, bk in ((None, None, None), (block_mask, 64, 32)):
        kv, q = device_schedules(bm, bq, bk, 150, 120, (64, 32), (32, 16), causal, 1, 2)
        for got, which, tile in ((kv, "kv", (64, 32)), (q, "q", (32, 16))):
            want = _schedules(bm, bq, bk, 150, 120, tile[0], tile[1], causal, 1, 2, which)
            assert np.array_equal(got[0].copy_to_host(), want[0])
            assert np.array_equal(got[1].copy_to_host(), want[1])
            assert got[2:] == want[2:]
