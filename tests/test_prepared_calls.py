"""Prepared calls (`ioaware._backends.prepared_key`, `kernels.prepare_forward`,
`kernels.prepare_backward`): a torch CUDA call without mask, bias, block mask or dropout is
checked and prepared once per key (shapes, strides, dtypes, devices, flags), and later calls
run the prepared kernels directly.

CPU: which calls have a key. GPU (``-m gpu``): a repeated call skips the checks (they are made
to fail) and computes bitwise what the full path computes; from its third run a prepared call
repeats the launches its second run recorded with new data pointers (`kernels.host.Repeat`: `kernels.host.Call`
is made to fail), except for operands it cannot take (misaligned, other strides); for each family that prepares
(``mma``, ``tf32``, ``split_kv``), strided inputs included, in inference and through autograd
(forward and backward; on sm_90 dQ is summed by float32 atomics in a varying order, in half
precision and in the float32 3xTF32 backward, so it is held to a tolerance there, `_same_grad`); a family that prepares nothing (``simt``) takes the full path every
time, and a prepared forward whose backward is not prepared checks the problem for it; keys
differ where the call differs.
"""
from __future__ import annotations

from types import SimpleNamespace

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


def test_only_decoding_calls_with_lengths_on_the_gpu_have_a_cache_key():
    """`ioaware._backends.cache_key`: a decoding call is prepared only where its cache lengths
    are a tensor on q's GPU (which no check reads); lengths as an int, a list, NumPy or a CPU
    tensor are read and checked by every call."""
    q = torch.zeros(1, 2, 1, 16)
    assert _backends.cache_key(q, q, q, None, None, 0.0, torch.tensor([3]), FLAGS) is None
    if torch.cuda.is_available():
        c = q.cuda()
        lens = torch.tensor([3], device="cuda")
        key = _backends.cache_key(c, c, c, None, None, 0.0, lens, FLAGS)
        assert key is not None and key != _backends.prepared_key(c, c, c, None, None, None, 0.0,
                                                                 FLAGS)
        assert key != _backends.cache_key(c, c, c, None, None, 0.0, lens.int(), FLAGS)
        for other in (3, [3], np.array([3]), lens.cpu()):
            assert _backends.cache_key(c, c, c, None, None, 0.0, other, FLAGS) is None
        mask = torch.ones(1, 8, dtype=torch.bool, device="cuda")
        assert _backends.cache_key(c, c, c, mask, None, 0.0, lens, FLAGS) is None


def test_repeat_records_on_the_second_full_run_and_guards_the_layout(monkeypatch):
    """`kernels.host.Repeat` (CPU tensors stand in for the device's): nothing is recorded by a
    first full run (a one-shot forward), the second records; recorded launches are offered only
    to operands of the recorded shapes, strides, dtypes and device with 16-byte aligned starts
    (only the alignment checked where the caller matched the layout already), and never where
    the kernels were given copies, a mask, or Numba's launch path."""
    from types import SimpleNamespace

    from kernels import KernelConfig, host
    monkeypatch.setattr(host, "real_gpu", lambda: True)
    template = SimpleNamespace(kind="torch", mask=None, cache_seqlens=None)
    ops = [torch.zeros(2, 3, 8, 16) for _ in range(2)]
    repeat = host.Repeat(template, KernelConfig())
    launches = [object()]
    repeat.record(ops, ops, lambda: launches)
    assert repeat.launches is None and repeat.pointers(ops) is None
    repeat.record(ops, ops, lambda: launches)
    assert repeat.launches is launches
    fresh = [torch.ones(2, 3, 8, 16) for _ in range(2)]
    assert repeat.pointers(fresh) == [x.data_ptr() for x in fresh]
    flat = torch.zeros(2 * 3 * 8 * 16 + 4)
    for other in (torch.zeros(2, 3, 8, 16, dtype=torch.float64), torch.zeros(2, 3, 16, 8),
                  torch.zeros(2, 8, 3, 16).transpose(1, 2), flat[1:1 + 768].view(2, 3, 8, 16)):
        assert repeat.pointers([other, fresh[1]]) is None
    # a caller that matched the layout already (a prepared call's key) has only the alignment
    # checked: the pointers, or None for a start off 16 bytes
    assert repeat.pointers(fresh, layout_known=True) == [x.data_ptr() for x in fresh]
    assert repeat.pointers([flat[1:1 + 768].view(2, 3, 8, 16), fresh[1]], layout_known=True) is None
    assert host.Repeat(template, KernelConfig()).pointers(fresh, layout_known=True) is None
    copied = host.Repeat(template, KernelConfig())
    for _ in range(2):
        copied.record(ops, [ops[0], ops[1].clone()], lambda: launches)
    assert copied.launches is None
    for tmpl, cfg in ((SimpleNamespace(kind="torch", mask=ops[0], cache_seqlens=None), KernelConfig()),
                      (template, KernelConfig(fast_launch=False)),
                      (SimpleNamespace(kind="numpy", mask=None, cache_seqlens=None), KernelConfig())):
        assert not host.Repeat(tmpl, cfg).enabled


def test_repeat_allocates_outputs_and_work_space():
    """`kernels.host.Repeat.like` gives a contiguous tensor of the operand's shape and dtype
    (also for a strided operand); `Repeat.scratch` one float32 allocation whose parts start
    16-byte aligned and do not overlap (CPU tensors stand in for the device's)."""
    from kernels import host
    repeat = host.Repeat(SimpleNamespace(kind="torch", mask=None, cache_seqlens=None), None)
    repeat.float32, repeat._empty_like = torch.float32, torch.empty_like
    for x in (torch.zeros(2, 3, 5, 16, dtype=torch.float16),
              torch.zeros(2, 5, 3, 16, dtype=torch.bfloat16).transpose(1, 2)):
        y = repeat.like(x)
        assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    sizes = (3, 1, 130, 0, 7)
    buf, ptrs = repeat.scratch(torch.zeros(1), *sizes)
    assert buf.dtype == torch.float32 and buf.is_contiguous()
    assert all((p - buf.data_ptr()) % 16 == 0 for p in ptrs)
    ends = [p + 4 * n for p, n in zip(ptrs, sizes)]
    assert all(e <= s for e, s in zip(ends, ptrs[1:])) and ends[-1] <= buf.data_ptr() + 4 * buf.numel()


def _weak_operands(make, prepare):
    """``(prepared, weak references to the problem's q, k, v)``: ``prepare`` of the problem of
    ``make()``'s operands, every other reference to them dropped."""
    import weakref
    from ioaware._inputs import check_inputs
    q, k, v = make()
    pb = check_inputs(q, k, v)
    return prepare(pb), [weakref.ref(x) for x in (q, k, v)]


def test_a_prepared_decoding_call_keeps_none_of_its_problems_operands():
    """`kernels.decode_fwd.prepare` keeps nothing of the problem it was made from but its sizes
    (`ioaware` keeps a prepared call per shape: one that held its first call's KV cache would
    hold a cache a shape, as a decoding loop whose cache grows makes one a step). The CUDA
    simulator's NumPy operands stand in for the GPU's (the same closure)."""
    import gc
    from kernels import decode_fwd

    def make():
        rng = np.random.default_rng(0)
        return (rng.standard_normal((1, 4, 1, 64)).astype(np.float32),
                *(rng.standard_normal((1, 2, 512, 64)).astype(np.float32) for _ in range(2)))
    run, refs = _weak_operands(make, decode_fwd.prepare)
    gc.collect()
    assert callable(run) and all(r() is None for r in refs)


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
@pytest.mark.parametrize("name", list(CASES))
def test_prepared_calls_keep_none_of_their_operands(cuda, name):
    """What `ioaware` keeps of a call per shape (its prepared forward and, after a backward, its
    prepared backward) holds none of the call's tensors: once the caller drops them, their
    memory is free, for every family that prepares (a decoding loop whose cache grows makes a
    new shape every step)."""
    import gc
    import weakref
    dtype, sq, skv, kw, transposed = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    _backends._PREPARED.clear()
    train = not name.startswith("split_kv")

    def step():
        q, k, v = (x.detach().requires_grad_(train) for x in _inputs(g, sq, skv, dtype, transposed))
        for _ in range(3):                                    # full, recorded, repeated
            out = attention(q, k, v, backend="numba", **kw)
            if train:
                out.float().sum().backward()
        return [weakref.ref(x) for x in (q, k, v)]
    refs = step()
    torch.cuda.synchronize()
    gc.collect()
    assert len(_backends._PREPARED) == 1 and next(iter(_backends._PREPARED.values())) is not None
    assert all(r() is None for r in refs)
    _backends._PREPARED.clear()


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
    """Bitwise equal; dQ summed by float32 atomics (`kernels.mma_bwd.dq_mode`,
    `kernels.tf32_bwd.dq_mode`) in an order that varies from run to run: for half precision,
    which may then round the other way, within one unit of the dtype's last place of the larger;
    for float32 (the 3xTF32 backward), within 1e-5 absolute and relative (a float32 sum of a
    few hundred terms in another order)."""
    if name != "dq":
        return torch.equal(a, b)
    if a.dtype == torch.float32:
        return torch.equal(a, b) or torch.allclose(a, b, rtol=1e-5, atol=1e-5)
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


# -- the recorded launches repeated with new data pointers (kernels.host.Repeat) --
def _no_call(monkeypatch):
    """Make `kernels.host.Call` (the full host path of a prepared run) fail if constructed."""
    from kernels import host

    def boom(*a, **k):
        raise AssertionError("the repeated call went through kernels.host.Call")
    monkeypatch.setattr(host, "Call", boom)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_a_prepared_call_repeats_the_recorded_launches(cuda, name, monkeypatch):
    """Call 1 checks and prepares, calls 2 and 3 run the prepared kernels in full (the second
    of them records their launches), call 4 (new tensors) only writes its pointers into them:
    bitwise the full path."""
    dtype, sq, skv, kw, transposed = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(3)
    _backends._PREPARED.clear()
    with torch.inference_mode():
        for _ in range(3):
            attention(*_inputs(g, sq, skv, dtype, transposed), backend="numba", **kw)
        q, k, v = _inputs(g, sq, skv, dtype, transposed)
        _no_call(monkeypatch)
        out, lse = attention(q, k, v, backend="numba", return_lse=True, **kw)
        monkeypatch.undo()
        _backends._PREPARED.clear()
        want, want_lse = attention(q, k, v, backend="numba", return_lse=True, **kw)
    assert out.shape == want.shape and out.dtype == want.dtype and lse.dtype == want_lse.dtype
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths_dtype", [torch.int32, torch.int64])
def test_a_decoding_step_with_lengths_on_the_gpu_repeats_its_launch(cuda, lengths_dtype,
                                                                     monkeypatch):
    """``attention(..., cache_seqlens=lengths)`` with the lengths on q's GPU: call 1 checks and
    prepares (a `PreparedDecode`), calls 2 and 3 run the prepared split-KV forward in full, and
    later calls repeat the recorded launch with their own operands and lengths (the checks and
    `kernels.host.Call` made to fail): bitwise the full path, for lengths that change call
    after call, a length past the cache included (its row comes out NaN, as the kernel checks
    each length)."""
    g = torch.Generator(device="cuda").manual_seed(5)
    sq, skv = (3, 8, 1, 128), (3, 2, 2000, 128)
    kw = dict(backend="numba", causal="bottom_right", return_lse=True)
    _backends._PREPARED.clear()
    with torch.inference_mode():
        for step in range(3):
            lens = torch.tensor([2000, 1000 + step, 7], device="cuda", dtype=lengths_dtype)
            attention(*_inputs(g, sq, skv, torch.bfloat16, False), cache_seqlens=lens, **kw)
        (entry,) = _backends._PREPARED.values()
        assert isinstance(entry, _backends.PreparedDecode)
        for lengths in ([2000, 1, 0], [17, 2001, 1999]):
            lens = torch.tensor(lengths, device="cuda", dtype=lengths_dtype)
            q, k, v = _inputs(g, sq, skv, torch.bfloat16, False)

            def no_checks(*a, **k_):
                raise AssertionError("the prepared call ran the checks")
            monkeypatch.setattr(_backends, "check_inputs", no_checks)
            _no_call(monkeypatch)
            out, lse = attention(q, k, v, cache_seqlens=lens, **kw)
            monkeypatch.undo()
            kept = dict(_backends._PREPARED)
            _backends._PREPARED.clear()
            want, want_lse = attention(q, k, v, cache_seqlens=lens, **kw)     # the full path
            _backends._PREPARED.clear()
            _backends._PREPARED.update(kept)
            torch.cuda.synchronize()
            for a, b in ((out, want), (lse, want_lse)):
                assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
            assert torch.isnan(out[1]).all() == (lengths[1] > 2000)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("split_kv")])
def test_a_prepared_training_call_repeats_the_recorded_launches(cuda, name, monkeypatch):
    dtype, sq, skv, kw, transposed = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(4)
    _backends._PREPARED.clear()
    dout = torch.randn(sq, device="cuda", dtype=dtype, generator=g)
    for _ in range(3):
        _fwd_bwd(*_inputs(g, sq, skv, dtype, transposed), dout, **kw)
    q, k, v = _inputs(g, sq, skv, dtype, transposed)
    _no_call(monkeypatch)
    got = _fwd_bwd(q, k, v, dout, **kw)
    monkeypatch.undo()
    _backends._PREPARED.clear()
    want = _fwd_bwd(q, k, v, dout, **kw)
    for name_, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and _same_grad(name_, a, b), name_


def _misaligned_like(x):
    """A tensor equal to ``x``, of its shape and strides, whose start is not 16-byte aligned."""
    flat = torch.empty(x.numel() + 16, device=x.device, dtype=x.dtype)
    y = flat[1:1 + x.numel()].view(x.shape)
    y.copy_(x)
    assert y.data_ptr() % 16 and y.stride() == x.stride()
    return y


@pytest.mark.gpu
def test_a_call_the_recorded_launches_cannot_take_runs_in_full(cuda, monkeypatch):
    """Operands of the recorded shapes but a misaligned start, or other strides, are never
    given to the recorded launches: they take the full path (which copies them)."""
    from kernels import host
    g = torch.Generator(device="cuda").manual_seed(5)
    shape = (2, 4, 256, 64)
    _backends._PREPARED.clear()
    with torch.inference_mode():
        for _ in range(3):
            attention(*(torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
                        for _ in range(3)), backend="numba")
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
                   for _ in range(3))
        full = []
        real_call = host.Call
        monkeypatch.setattr(host, "Call", lambda *a, **kw: full.append(1) or real_call(*a, **kw))
        got = attention(_misaligned_like(q), k, v, backend="numba")
        assert full, "a misaligned operand was given to the recorded launch"
        monkeypatch.undo()
        _backends._PREPARED.clear()
        want = attention(q, k, v, backend="numba")
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("family,dtype,dq", [("mma", torch.float16, "kernel"),
                                             ("mma", torch.bfloat16, "atomic"),
                                             ("tf32", torch.float32, None)])
def test_prepared_kernels_repeat_bitwise(cuda, family, dtype, dq, monkeypatch):
    """`kernels.prepare_forward` / `prepare_backward` of each tensor-core family (both dQ modes
    of the mma backward): the third run (the launches the second recorded) computes bitwise what
    `kernels.forward` / `kernels.backward` compute on the same operands."""
    import kernels
    from ioaware._inputs import check_inputs
    g = torch.Generator(device="cuda").manual_seed(6)

    def fresh():
        return [torch.randn(2, 4, 200, 64, device="cuda", dtype=dtype, generator=g)
                for _ in range(4)]
    q, k, v, dout = fresh()
    pb = check_inputs(q, k, v, causal=True)
    cfg = kernels.KernelConfig(family=family, backward_dq=dq)
    fwd, bwd = kernels.prepare_forward(pb, cfg), kernels.prepare_backward(pb, cfg)
    for _ in range(2):
        q_, k_, v_, do_ = fresh()
        o_, l_ = fwd(q_, k_, v_)
        grads_ = bwd(q_, k_, v_, o_, l_, do_)
    # the recorded launches keep their fixed arguments alive, not the recording run's tensors
    import gc
    import weakref
    recorded = [weakref.ref(t) for t in (q_, k_, v_, do_, o_, l_, *grads_)]
    del q_, k_, v_, do_, o_, l_, grads_
    gc.collect()
    assert all(r() is None for r in recorded)
    q, k, v, dout = fresh()
    _no_call(monkeypatch)
    out, lse = fwd(q, k, v)
    grads = bwd(q, k, v, out, lse, dout)
    monkeypatch.undo()
    pb = check_inputs(q, k, v, causal=True)
    want_out, want_lse = kernels.forward(pb, cfg)
    want = kernels.backward(pb, want_out, want_lse, dout, cfg)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    for name_, a, b in zip(("dq", "dk", "dv"), grads, want):
        assert a.dtype == b.dtype and _same_grad(name_ if dq == "atomic" else "", a, b), name_
    # a misaligned operand is copied by the full path, never given to the recorded launches
    out_m, lse_m = fwd(_misaligned_like(q), k, v)
    grads_m = bwd(q, _misaligned_like(k), v, out, lse, _misaligned_like(dout))
    assert torch.equal(out_m, want_out) and torch.equal(lse_m, want_lse)
    for name_, a, b in zip(("dq", "dk", "dv"), grads_m, want):
        assert _same_grad(name_ if dq == "atomic" else "", a, b), name_


@pytest.mark.gpu
def test_repeated_launches_through_either_driver_entry_agree(cuda):
    """A recorded launch calls ``cuLaunchKernel`` through ctypes (`kernels.host._driver_launch`)
    where the driver library loads that way, else through ``cuda.bindings``: both give bitwise
    the same forward and backward."""
    import kernels
    from kernels import host
    from ioaware._inputs import check_inputs
    g = torch.Generator(device="cuda").manual_seed(8)
    dtype = torch.float16

    def fresh():
        return [torch.randn(2, 4, 200, 64, device="cuda", dtype=dtype, generator=g) for _ in range(4)]
    q, k, v, dout = fresh()
    pb = check_inputs(q, k, v, causal=True)
    cfg = kernels.KernelConfig(family="mma", backward_dq="kernel")
    fwd, bwd = kernels.prepare_forward(pb, cfg), kernels.prepare_backward(pb, cfg)
    for _ in range(3):
        o, l_ = fwd(q, k, v)
        grads = bwd(q, k, v, o, l_, dout)
    assert host._driver_launch() is not None        # Linux: libcuda.so.1 loads through ctypes
    recorded = [L for run in (fwd, bwd) for repeat in _repeats(run) for L in repeat.launches]
    assert recorded and all(L.driver is not None for L in recorded)
    for L in recorded:
        L.driver = None
    o2, l2 = fwd(q, k, v)
    grads2 = bwd(q, k, v, o2, l2, dout)
    assert torch.equal(o, o2) and torch.equal(l_, l2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2))


@pytest.mark.gpu
def test_hopper_forward_repeats_with_its_tensor_maps_kept(cuda):
    """The Hopper forward's repeated call finds its operands' tensor maps by their data
    pointers and keeps them alive: operand sets taken in turn, and again after the module's
    map cache is emptied and the freed memory reused, compute bitwise what the full path does."""
    from kernels import host, wgmma_fwd
    if host.compute_capability(host.current_device_id()) != (9, 0):
        pytest.skip("the Hopper forward needs compute capability 9.0")
    import gc
    g = torch.Generator(device="cuda").manual_seed(9)
    shape = (2, 4, 300, 64)
    sets = [[torch.randn(shape, device="cuda", dtype=torch.float16, generator=g) for _ in range(3)]
            for _ in range(2)]
    _backends._PREPARED.clear()
    with torch.inference_mode():
        got = [attention(*sets[i % 2], backend="numba") for i in range(6)]
        wgmma_fwd._MAPS.clear()
        wgmma_fwd._MAP_BUFFERS.clear()
        gc.collect()
        junk = [torch.full((wgmma_fwd.MAP_WORDS,), -1, dtype=torch.int64, device="cuda")
                for _ in range(256)]      # what a freed map's memory would now hold
        got.append(attention(*sets[0], backend="numba"))
        del junk
        _backends._PREPARED.clear()
        want = [attention(*s, backend="numba") for s in sets]
    for i, out in enumerate(got):
        assert torch.equal(out, want[i % 2]), i


def _repeats(run):
    """The `kernels.host.Repeat` objects a prepared run closes over."""
    from kernels import host
    found = []
    for cell in run.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:            # a cell not filled yet
            continue
        if isinstance(value, host.Repeat):
            found.append(value)
    return found
