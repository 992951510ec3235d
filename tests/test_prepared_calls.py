"""Prepared calls (`ioaware._backends.prepared_key`, `kernels.prepare_forward`,
`kernels.prepare_backward`): a torch CUDA call without mask, bias, block mask or dropout is
checked and prepared once per key (shapes, strides, dtypes, devices, flags), and later calls
run the prepared kernels directly.

CPU: which calls have a key. GPU (``-m gpu``): a repeated call skips the checks (they are made
to fail) and computes bitwise what the full path computes, for each family that prepares
(``mma``, ``tf32``, ``split_kv``), strided inputs included, in inference and through autograd
(forward and backward; on sm_90 the half-precision dQ is summed by float32 atomics in a varying
order, so it is held to the dtype's rounding there, `_same_grad`); a family that prepares nothing (``simt``) takes the full path every
time, and a prepared forward whose backward is not prepared checks the problem for it; keys
differ where the call differs.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ioaware import _backends, attention  # noqa: E402

FLAGS = (None, True, "top_left", -1, -1, None, None, "numba")


def test_only_plain_cuda_calls_have_a_key():
    q = torch.zeros(1, 2, 8, 16)
    assert _backends.prepared_key(q, q, q, None, None, None, 0.0, FLAGS) is None     # CPU
    a = np.zeros((1, 2, 8, 16), np.float32)
    assert _backends.prepared_key(a, a, a, None, None, None, 0.0, FLAGS) is None     # NumPy
    if torch.cuda.is_available():
        c = q.cuda()
        assert _backends.prepared_key(c, c, c, None, None, None, 0.0, FLAGS) is not None
        assert _backends.prepared_key(c, c, c, None, None, None, 0.1, FLAGS) is None
        assert _backends.prepared_key(c, c, c, torch.ones(8, 8, dtype=torch.bool, device="cuda"),
                                      None, None, 0.0, FLAGS) is None


@pytest.fixture
def cuda():
    from kernels import host
    if not torch.cuda.is_available() or not host.real_gpu():
        pytest.skip("needs a real CUDA GPU")


def _inputs(g, shape_q, shape_kv, dtype, transposed):
    def one(shape):
        if transposed:        # [B, N, H, d] viewed as [B, H, N, d]: a strided layout
            b, h, n, d = shape
            return torch.randn(b, n, h, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        return torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    return one(shape_q), one(shape_kv), one(shape_kv)


CASES = {
    "mma fp16 d64 causal": (torch.float16, (2, 4, 300, 64), (2, 2, 300, 64), dict(causal=True), False),
    "mma bf16 d128 window strided": (torch.bfloat16, (1, 4, 257, 128), (1, 4, 257, 128),
                                     dict(window_size=(64, 0), causal=True), True),
    "tf32 fp32 d64 Nq != Nk": (torch.float32, (2, 2, 100, 64), (2, 2, 333, 64), dict(), False),
    "split_kv bf16 decode GQA": (torch.bfloat16, (3, 8, 1, 128), (3, 2, 2000, 128), dict(), False),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_repeated_call_skips_the_checks_and_matches_the_full_path(cuda, name, monkeypatch):
    dtype, sq, skv, kw, transposed = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    _backends._PREPARED.clear()
    with torch.inference_mode():
        q, k, v = _inputs(g, sq, skv, dtype, transposed)
        attention(q, k, v, backend="numba", **kw)                # full path, then prepared
        assert len(_backends._PREPARED) == 1
        assert next(iter(_backends._PREPARED.values())) is not None
        q2, k2, v2 = _inputs(g, sq, skv, dtype, transposed)

        def no_checks(*a, **k):
            raise AssertionError("the prepared call ran the checks")
        monkeypatch.setattr(_backends, "check_inputs", no_checks)
        out, lse = attention(q2, k2, v2, backend="numba", return_lse=True, **kw)
        monkeypatch.undo()
        _backends._PREPARED.clear()
        want, want_lse = attention(q2, k2, v2, backend="numba", return_lse=True, **kw)
        torch.cuda.synchronize()
    assert out.shape == want.shape and out.dtype == want.dtype
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.gpu
def test_family_that_prepares_nothing_takes_the_full_path(cuda):
    _backends._PREPARED.clear()
    q, k, v = (torch.randn(1, 2, 64, 32, device="cuda") for _ in range(3))   # d=32: simt
    with torch.inference_mode():
        a = attention(q, k, v, backend="numba")
        b = attention(q, k, v, backend="numba")
    assert list(_backends._PREPARED.values()) == [None]
    assert torch.equal(a, b)


@pytest.mark.gpu
def test_keys_differ_where_calls_differ(cuda):
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    base = _backends.prepared_key(q, q, q, None, None, None, 0.0, FLAGS)
    others = [_backends.prepared_key(q[:, :, :32], q, q, None, None, None, 0.0, FLAGS),
              _backends.prepared_key(q.transpose(1, 2), q, q, None, None, None, 0.0, FLAGS),
              _backends.prepared_key(q.float(), q, q, None, None, None, 0.0, FLAGS),
              _backends.prepared_key(q, q, q, None, None, None, 0.0, FLAGS[:1] + (False,) + FLAGS[2:]),
              _backends.prepared_key(q, q, q, None, None, None, 0.0, (0.5,) + FLAGS[1:])]
    assert len({base, *others}) == 6


def _fwd_bwd(q, k, v, dout, **kw):
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    out = attention(q, k, v, backend="numba", **kw)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("split_kv")])
def test_repeated_training_call_skips_the_checks_and_matches_the_full_path(cuda, name,
                                                                           monkeypatch):
    """Forward and backward through autograd: the second call of a key runs the prepared
    forward and backward (the checks fail if called) and computes bitwise what the full path
    computes."""
    dtype, sq, skv, kw, transposed = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(1)
    _backends._PREPARED.clear()
    q, k, v = _inputs(g, sq, skv, dtype, transposed)
    dout = torch.randn(q.shape, device="cuda", dtype=dtype, generator=g)
    _fwd_bwd(q, k, v, dout, **kw)                                  # full path, then prepared
    q2, k2, v2 = _inputs(g, sq, skv, dtype, transposed)

    def no_checks(*a, **k):
        raise AssertionError("the prepared call ran the checks")
    monkeypatch.setattr(_backends, "check_inputs", no_checks)
    got = _fwd_bwd(q2, k2, v2, dout, **kw)
    monkeypatch.undo()
    _backends._PREPARED.clear()
    want = _fwd_bwd(q2, k2, v2, dout, **kw)
    for name_, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and _same_grad(name_, a, b), name_


def _same_grad(name, a, b) -> bool:
    """Bitwise equal; dQ of a half-precision backward summed by float32 atomics
    (`kernels.mma_bwd.dq_mode`), which may round the other way: within one unit of the dtype's
    last place of the larger."""
    if name != "dq" or a.dtype not in (torch.float16, torch.bfloat16):
        return torch.equal(a, b)
    ulp = torch.finfo(a.dtype).eps
    return bool(((a.float() - b.float()).abs()
                 <= ulp * torch.maximum(a.float().abs(), b.float().abs()) + 1e-6).all())


@pytest.mark.gpu
def test_prepared_forward_with_a_backward_that_is_not_prepared(cuda):
    """Pinned tiles: the tensor-core forward takes them and is prepared, the backward family
    that takes the problem may prepare nothing; the second call's gradients still match."""
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v, dout = (torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.float16, generator=g)
                     for _ in range(4))
    _backends._PREPARED.clear()
    _fwd_bwd(q, k, v, dout, block_q=64, block_k=64)
    got = _fwd_bwd(q, k, v, dout, block_q=64, block_k=64)
    _backends._PREPARED.clear()
    want = _fwd_bwd(q, k, v, dout, block_q=64, block_k=64)
    for name_, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert _same_grad(name_, a, b), name_
