"""``torch.compile(fullgraph=True)`` of a small transformer whose attention is
``ioaware.scaled_dot_product_attention``: no graph break, the ``ioaware::attention_fwd`` /
``attention_bwd`` operators in the traced forward and backward graphs, and the same outputs and
gradients as eager. Backends: ``aot_eager`` (dynamo + AOTAutograd, the operators' fake
implementations and autograd formula) and the default ``inductor`` (C++ codegen on this CPU)."""
import pytest
import torch
import torch._dynamo
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import ioaware


class Block(torch.nn.Module):
    """Pre-norm attention block with grouped-query attention (4 query heads, 2 key/value heads)."""

    def __init__(self, dim=32, heads=4, kv_heads=2, dropout=0.0):
        super().__init__()
        self.heads, self.kv_heads, self.dropout = heads, kv_heads, dropout
        self.norm = torch.nn.LayerNorm(dim)
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * dim * kv_heads // heads)
        self.out = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x, attn_mask=None):
        b, n, d = x.shape
        e = d // self.heads
        h = self.norm(x)
        q = self.q(h).view(b, n, self.heads, e).transpose(1, 2)
        k, v = self.kv(h).view(b, n, 2, self.kv_heads, e).permute(2, 0, 3, 1, 4)
        a = ioaware.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                                 enable_gqa=True,
                                                 dropout_p=self.dropout if self.training else 0.0)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(x)


class Model(torch.nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(dropout=dropout) for _ in range(2)])

    def forward(self, x, attn_mask=None):
        for block in self.blocks:
            x = block(x, attn_mask)
        return x


def _recording_backend(graphs):
    def record(name):
        def compiler(gm, example_inputs):
            graphs.append((name, {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
            return make_boxed_func(gm.forward)
        return compiler
    return aot_autograd(fw_compiler=record("forward"), bw_compiler=record("backward"))


def _loss_and_grads(model, x, attn_mask=None):
    out = model(x, attn_mask)
    loss = out.square().mean()
    return out, torch.autograd.grad(loss, [x] + list(model.parameters()))


@pytest.fixture
def model_and_input():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(2, 7, 32, requires_grad=True)
    return model, x


def test_fullgraph_compile_runs_the_ioaware_operators_forward_and_backward(model_and_input):
    model, x = model_and_input
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))
    mask = torch.rand(7, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    for attn_mask in (None, mask):
        want_out, want_grads = _loss_and_grads(model, x, attn_mask)
        got_out, got_grads = _loss_and_grads(compiled, x, attn_mask)
        torch.testing.assert_close(got_out, want_out, atol=1e-6, rtol=1e-6)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)
    kinds = {name for name, targets in graphs if "ioaware.attention_fwd.default" in targets}
    assert kinds == {"forward"}
    assert any("ioaware.attention_bwd.default" in targets for name, targets in graphs if name == "backward")
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0


def test_compiled_dropout_draws_its_seed_in_the_graph(model_and_input):
    """No .item() while tracing: the seed is a tensor from torch.randint; torch.manual_seed
    reproduces the compiled model's dropout, and it differs from no dropout."""
    _, x = model_and_input
    torch.manual_seed(0)
    model = Model(dropout=0.5).train()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.manual_seed(7)
    a = compiled(x)
    torch.manual_seed(7)
    b = compiled(x)
    torch.manual_seed(7)
    eager = model(x)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.testing.assert_close(a, eager, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(a, model.eval()(x))


def test_value_checks_run_inside_the_operator_of_a_compiled_graph(model_and_input):
    model, x = model_and_input
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(x)
    bad = x.detach().clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="q contains NaN or infinite values"):
        compiled(bad)


def test_inductor_compiles_and_matches_eager(model_and_input):
    model, x = model_and_input
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    want_out, want_grads = _loss_and_grads(model, x)
    got_out, got_grads = _loss_and_grads(compiled, x)
    # inductor fuses the layer norms and MLP differently: float32 rounding, not the attention
    torch.testing.assert_close(got_out, want_out, atol=1e-5, rtol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
