"""``ioaware.attention`` under CUDA graph capture (``torch.cuda.graph``), which removes the host
cost of a call: a training step (forward, backward, optimizer) of a small GQA attention model
captured after a warm-up, replayed on new inputs, against the same step run eagerly (at the
dtype's default tolerances: cuBLAS may choose other algorithms while capturing); a decoding
forward captured and replayed on a cache that changes between replays; two captured decoding
calls taking disjoint arrival counters from the zeroed arena (or zeroing their own in the graph
without one); and dropout without a seed refused while capturing (every replay would drop the
same elements). GPU only (``-m gpu``).
"""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import ioaware  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda():
    from kernels import host
    if not torch.cuda.is_available() or not host.real_gpu():
        pytest.skip("needs a real CUDA GPU")


class Attention(torch.nn.Module):
    def __init__(self, dim=256, heads=4, kv_heads=2, causal=True):
        super().__init__()
        self.heads, self.kv_heads, self.causal = heads, kv_heads, causal
        self.e = dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * self.e * kv_heads)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.e).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.e).permute(2, 0, 3, 1, 4)
        a = ioaware.attention(q, k, v, causal=self.causal, backend="numba")
        return x + self.out(a.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_training_step_replays_like_eager(dtype):
    torch.manual_seed(0)
    model = Attention().cuda().to(dtype)
    eager = Attention().cuda().to(dtype)
    eager.load_state_dict(model.state_dict())

    def step(m, x):
        loss = m(x).float().square().mean()
        loss.backward()
        return loss

    static_x = torch.randn(2, 192, 256, device="cuda", dtype=dtype)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                       # warm-up: compile, load, device constants
        for _ in range(2):
            model.zero_grad(set_to_none=False)
            step(model, static_x)
    torch.cuda.current_stream().wait_stream(s)
    model.zero_grad(set_to_none=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(model, static_x)
    for seed in (1, 2):
        x = torch.randn(2, 192, 256, device="cuda", dtype=dtype,
                        generator=torch.Generator(device="cuda").manual_seed(seed))
        static_x.copy_(x)
        model.zero_grad(set_to_none=False)
        graph.replay()
        eager.zero_grad(set_to_none=True)
        want = step(eager, x)
        torch.cuda.synchronize()
        # the same kernels in the same order (cuBLAS may pick other algorithms when capturing)
        torch.testing.assert_close(static_loss, want)
        for (name, p), pe in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, pe.grad, msg=name)


def test_decode_replays_on_a_changing_cache():
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    with torch.inference_mode():
        ioaware.attention(q, k, v, backend="numba")             # warm-up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ioaware.attention(q, k, v, backend="numba")
        for _ in range(2):
            k.normal_(generator=g)
            q.normal_(generator=g)
            graph.replay()
            want = ioaware.attention(q, k, v, backend="numba")
            torch.cuda.synchronize()
            assert torch.equal(out, want)


@pytest.mark.parametrize("arena", [True, False])
def test_decode_capture_takes_its_arrival_counters_from_a_zeroed_arena(monkeypatch, arena):
    """A captured split-KV call takes its programs' arrival counters from the device's arena,
    zeroed by a call outside capture, so the graph holds no zeroing; two captures get disjoint
    counters and replay exactly, interleaved, leaving them zero. With no arena (or none left) a
    capture zeroes its own counters in the graph, and replays as exactly."""
    from kernels import decode_fwd
    monkeypatch.setattr(decode_fwd, "_CAPTURE_ARENAS", {})
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    q2 = torch.randn_like(q)
    with torch.inference_mode():
        ioaware.attention(q, k, v, backend="numba")             # warm-up: the arena
        torch.cuda.synchronize()
        if not arena:
            decode_fwd._CAPTURE_ARENAS.clear()
        taken = len(decode_fwd._CAPTURED_COUNTERS)
        graphs, outs = [], []
        for query in (q, q2):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs.append(ioaware.attention(query, k, v, backend="numba"))
            graphs.append(graph)
        counters = decode_fwd._CAPTURED_COUNTERS[taken:]
        assert len(counters) == 2 and min(c.numel() for c in counters) > 1
        ptrs = sorted((c.data_ptr(), c.data_ptr() + 4 * c.numel()) for c in counters)
        assert ptrs[0][1] <= ptrs[1][0]                         # disjoint
        if arena:
            base = decode_fwd._CAPTURE_ARENAS[q.get_device()][0]
            lo, hi = base.data_ptr(), base.data_ptr() + 4 * base.numel()
            assert all(lo <= a and b <= hi for a, b in ptrs)
        else:
            assert q.get_device() not in decode_fwd._CAPTURE_ARENAS
        for _ in range(3):
            k.normal_(generator=g)
            for graph in graphs:
                graph.replay()
            want = [ioaware.attention(x, k, v, backend="numba") for x in (q, q2)]
            torch.cuda.synchronize()
            assert all(torch.equal(o, w) for o, w in zip(outs, want))
            assert all(int(c.abs().sum()) == 0 for c in counters)


def test_decode_with_cache_lengths_replays_on_changing_lengths(monkeypatch):
    """A decoding step with its cache lengths on the GPU (the prepared path, its launch
    repeated: `kernels.host.Call` made to fail while capturing) captured in a graph: replays
    read the lengths and the cache as they are then."""
    from ioaware import _backends
    from kernels import host
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.tensor([4096, 100, 1, 3000], device="cuda", dtype=torch.int32)
    kw = dict(backend="numba", cache_seqlens=lens, causal="bottom_right")
    with torch.inference_mode():
        _backends._PREPARED.clear()
        for _ in range(3):                                       # prepared, then recorded
            ioaware.attention(q, k, v, **kw)
        torch.cuda.synchronize()
        (entry,) = _backends._PREPARED.values()
        assert isinstance(entry, _backends.PreparedDecode)

        def no_call(*a, **k_):
            raise AssertionError("the captured call went through kernels.host.Call")
        monkeypatch.setattr(host, "Call", no_call)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ioaware.attention(q, k, v, **kw)
        monkeypatch.undo()
        for new in ([17, 4096, 2048, 0], [4000, 4001, 5, 64]):       # 4001: past the cache
            lens.copy_(torch.tensor(new))
            k.normal_(generator=g)
            graph.replay()
            want = ioaware.attention(q, k, v, backend="numba",
                                     cache_seqlens=lens.clone(), causal="bottom_right")
            torch.cuda.synchronize()
            assert torch.equal(out.isnan(), want.isnan())
            assert torch.equal(out.nan_to_num(), want.nan_to_num())
            assert torch.isnan(out[1]).all() == (new[1] > 4096)


def test_dropout_without_seed_is_refused_while_capturing():
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda") for _ in range(3))
    ioaware.attention(q, k, v, dropout_p=0.1, seed=3, backend="numba")   # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")   # nothing enqueued
        with pytest.raises(ValueError, match="dropout_p"):
            with torch.cuda.graph(graph):
                ioaware.attention(q, k, v, dropout_p=0.1, backend="numba")
