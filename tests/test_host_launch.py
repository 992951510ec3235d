"""`kernels.host.launch`: the argument-signature key picks the overload Numba would pick, and
launches through the cached overload compute what Numba's own launch computes.

CPU: the layout letter of every strided view (transposes, slices, size-1 and zero strides)
against the rule Numba's device arrays follow (C if C-contiguous, else F if F-contiguous, else A;
A whenever a stride is 0), drawn by Hypothesis; under the simulator, `launch` on either path is
Numba's own launch. GPU (``-m gpu``): a kernel launched on torch tensors of each layout, cached,
uncached and through Numba's path (``fast=False``, what ``KernelConfig(fast_launch=False)``
selects), against the same kernel launched by Numba; and a kernel given 96 KiB of dynamic
shared memory (the opt-in above 48 KiB).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda   # a global, which the CUDA simulator replaces inside kernels

from kernels import host


def numba_device_layout(shape, strides, itemsize):
    """The layout DeviceNDArray._numba_type_ gives, from NumPy's contiguity flags."""
    a = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape, strides=strides)
    size = int(np.prod(shape))
    if size == 0:
        return "C"
    broadcast = 0 in strides
    # NumPy's flags for an itemsize-1 view with strides scaled by 1/itemsize say the same
    c = a.flags["C_CONTIGUOUS"] and not broadcast
    f = a.flags["F_CONTIGUOUS"] and not broadcast
    return "C" if c else ("F" if f else "A")


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_layout_matches_numba_rule(shape, data):
    # a permutation and a step per dim of a contiguous uint8 buffer, sometimes a zero stride
    nd = len(shape)
    perm = data.draw(st.permutations(range(nd)))
    steps = [data.draw(st.sampled_from([1, 1, 2])) for _ in range(nd)]
    full = [n * s for n, s in zip(shape, steps)]
    base = np.zeros(full, np.uint8)
    view = base[tuple(slice(None, None, s) for s in steps)].transpose(perm)
    strides = list(view.strides)
    if data.draw(st.booleans()):
        strides[data.draw(st.integers(0, nd - 1))] = 0
    got = host._layout(view.shape, tuple(strides), 1)
    assert got == numba_device_layout(view.shape, tuple(strides), 1)


def test_arg_key_torch_and_scalars():
    torch = pytest.importorskip("torch")
    t = torch.zeros(2, 3, 4)
    assert host._arg_key(t) == ("t", torch.float32, 3, "C")
    assert host._arg_key(t.transpose(0, 2))[3] == "F"
    assert host._arg_key(t[:, :, ::2])[3] == "A"
    assert host._arg_key(t.expand(2, 3, 4)[:, :1].expand(2, 3, 4))[3] == "A"
    assert host._arg_key(np.float32(1)) == ("s", np.float32)
    assert host._arg_key(3) == ("s", int)


def test_launch_under_the_simulator_is_numbas_launch():
    """Under Numba's CUDA simulator `launch` (cached path or not) is ``kern[grid, block,
    stream, sharedmem](*args)`` on the host arrays, and caches nothing."""
    if not host.simulator():
        pytest.skip("the CUDA simulator is not in use")

    @cuda.jit
    def axpy(x, y, out, a):              # out[i] = a * x[i] + y[i]
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = a * x[i] + y[i]

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    for fast in (True, False):
        out = cuda.to_device(np.full(40, np.nan, np.float32))
        host.launch(axpy, 2, 32, 0, (x, y, out, np.float32(2.5)), fast=fast)
        np.testing.assert_allclose(out.copy_to_host(), 2.5 * x + y, rtol=1e-6)
        assert host.plan_for(axpy, (x, y, out, np.float32(2.5))) is None


# -- GPU --

@pytest.fixture
def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@pytest.mark.gpu
def test_launch_matches_numba_launch_every_layout(cuda_torch):
    torch = cuda_torch

    @cuda.jit
    def axpy(x, y, out, a, n):           # out[i, j] = a * x[i, j] + y[i, j]
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1] and n > 0:
            out[i, j] = a * x[i, j] + y[i, j]

    g = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(64, 48, device="cuda", generator=g)
    views = {"C": base, "F": base.t().contiguous().t(), "A": base[:, ::2]}
    stream = host.launch_stream(torch.cuda.current_stream())
    for name, x in views.items():
        y = torch.randn(x.shape, device="cuda", generator=g)
        want = 2.5 * x + y
        grid = ((x.shape[0] + 15) // 16, (x.shape[1] + 15) // 16)
        for rep in range(3):           # first call compiles / caches, the rest reuse
            out = torch.full(x.shape, float("nan"), device="cuda")
            key = host.signature_key(axpy, (x, y, out, np.float32(2.5), 7))
            host.launch(axpy, grid, (16, 16), stream, (x, y, out, np.float32(2.5), 7))
            torch.cuda.synchronize()
            assert torch.allclose(out, want, rtol=1e-6, atol=1e-6), (name, rep)
            assert key in host._OVERLOADS
            assert host.plan_for(axpy, (x, y, out, np.float32(2.5), 7)) is host._OVERLOADS[key]
        # Numba's own path (fast=False) computes the same
        out = torch.full(x.shape, float("nan"), device="cuda")
        host.launch(axpy, grid, (16, 16), stream, (x, y, out, np.float32(2.5), 7), fast=False)
        torch.cuda.synchronize()
        assert torch.allclose(out, want, rtol=1e-6, atol=1e-6), (name, "fast=False")
        # the overload is the one Numba picks for the wrapped arguments
        compiled = host._OVERLOADS[key].compiled
        wrapped = [cuda.as_cuda_array(a, sync=False) for a in (x, y, out)]
        assert compiled.argument_types[:3] == tuple(axpy.typeof_pyval(a) for a in wrapped)


@pytest.mark.gpu
def test_dynamic_shared_memory_above_48k(cuda_torch):
    torch = cuda_torch
    from numba import float32

    @cuda.jit
    def reverse_through_shared(x, out, n):   # one block: out = x[::-1] via dynamic smem
        buf = cuda.shared.array(0, dtype=float32)
        t = cuda.threadIdx.x
        for i in range(t, n, cuda.blockDim.x):
            buf[i] = x[i]
        cuda.syncthreads()
        for i in range(t, n, cuda.blockDim.x):
            out[i] = buf[n - 1 - i]

    n = 96 * 1024 // 4
    x = torch.arange(n, device="cuda", dtype=torch.float32)
    out = torch.zeros_like(x)
    stream = host.launch_stream(torch.cuda.current_stream())
    for _ in range(2):
        host.launch(reverse_through_shared, 1, 256, stream, (x, out, n), sharedmem=4 * n)
        torch.cuda.synchronize()
        assert torch.equal(out, x.flip(0))
    with pytest.raises(ValueError, match="per-block limit"):
        host.launch(reverse_through_shared, 1, 256, stream, (x, out, n), sharedmem=1 << 20)


def test_dynamic_shared_memory_opt_in_is_a_lookup_once_done(monkeypatch):
    """On the launch path the opt-in costs a dictionary lookup once made for this kernel
    function, device and size (nothing is asked of the function or the driver), and nothing
    at all without dynamic shared memory. Below the 48 KiB default it reads the function's
    static shared memory once: a block has 48 KiB in all without the opt-in, so a kernel whose
    static and dynamic shared memory exceed it is opted in too (the driver asked once), and one
    within it is not."""
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the opt-in touched the kernel function ({name})")

    class Plan:                      # what `_opt_in` reads of a `_Plan`: its loaded function
        fn = Untouchable()

        def function(self, dev):
            return self.fn

    monkeypatch.setattr(host, "current_device_id", lambda: 0)
    monkeypatch.setitem(host._OPTED_IN, (Plan.fn, 0), 96 * 1024)
    host._opt_in(Plan(), 48 * 1024)
    host._opt_in(Plan(), 96 * 1024)
    host._opt_in(Plan(), 64 * 1024)

    class NoFunction:
        def function(self, dev):
            raise AssertionError("asked for the function without dynamic shared memory")

    host._opt_in(NoFunction(), 0)

    asked = []

    class Static:                    # a loaded function with 13 KiB of static shared memory
        attrs = type("FuncAttr", (), {"shared": 13 * 1024})

    class WithStatic:
        fn = Static()

        def function(self, dev):
            return self.fn

    monkeypatch.setattr(host, "_driver_opt_in", lambda fn, size, dev: asked.append(size))
    plan = WithStatic()
    host._opt_in(plan, 32 * 1024)                  # 45 KiB in all: no opt-in
    assert asked == [] and host._OPTED_IN[(plan.fn, 0)] == 32 * 1024
    host._opt_in(plan, 36 * 1024)                  # 49 KiB in all: opted in, once
    host._opt_in(plan, 36 * 1024)
    assert asked == [36 * 1024]
    host._OPTED_IN.pop((plan.fn, 0))

    # a kernel that declares the programs an SM is to hold gets the carveout that fits them
    # (its dynamic and static shared memory and the system's 1 KiB each), asked once
    carved = []
    monkeypatch.setattr(host, "_driver_carveout", lambda fn, size, dev: carved.append(size))

    class Declares(WithStatic):
        fn = Static()
        kern = type("Kernel", (), {"resident_per_sm": 2})

    plan = Declares()
    host._opt_in(plan, 32 * 1024)
    host._opt_in(plan, 32 * 1024)
    assert carved == [2 * (32 * 1024 + 13 * 1024 + host.RESERVED_SMEM_PER_BLOCK)]
    host._OPTED_IN.pop((plan.fn, 0))


def test_data_slots_hold_each_array_arguments_data_pointer():
    """`kernels.host.PointerLaunch` rewrites only the parameter slots `_Plan.data_slots` names:
    for a mix of torch tensors (ranks 1-4), Numba-typed scalars of 4 and 8 bytes and a second
    tensor after them, each named slot of the packed parameters holds that argument's data
    pointer, and writing new pointers there gives the parameters of the new arguments."""
    import ctypes
    import struct
    torch = pytest.importorskip("torch")
    from numba.cuda import types
    a, b = torch.zeros(2, 3, 4, 5), torch.zeros(7, dtype=torch.int16)
    c = torch.zeros(3, 4)[:, ::2]
    args = (a, np.float32(1.5), np.int64(-3), b, np.uint32(7), c)
    argtypes = (types.Array(types.float32, 4, "C"), types.float32, types.int64,
                types.Array(types.int16, 1, "C"), types.uint32, types.Array(types.float32, 2, "A"))
    plan = host._Plan(object(), argtypes, args, compiled=object())
    assert plan.marshals_itself
    plan.pack(args)
    words = (ctypes.c_uint64 * (len(plan.packed.buffer) // 8)).from_buffer(plan.packed.buffer)
    slots = plan.data_slots((0, 3, 5))
    assert [words[s] for s in slots] == [a.data_ptr(), b.data_ptr(), c.data_ptr()]
    # a: 5 + 2 * 4 slots, two scalars, b: 5 + 2 * 1 slots, one scalar; data is an array's fifth
    assert slots == (4, 13 + 2 + 4, 13 + 2 + 7 + 1 + 4)
    a2, b2, c2 = torch.ones(2, 3, 4, 5), torch.ones(7, dtype=torch.int16), torch.ones(3, 4)[:, ::2]
    for s, t in zip(slots, (a2, b2, c2)):
        words[s] = t.data_ptr()
    repacked = plan.packed.struct.pack(*plan.values((a2, args[1], args[2], b2, args[4], c2)))
    assert bytes(plan.packed.buffer)[:len(repacked)] == repacked
    assert struct.unpack_from("<f", plan.packed.buffer, 8 * (plan.first_slots[1]))[0] == 1.5
    with pytest.raises(ValueError, match="not an array"):
        plan.data_slots((1,))
