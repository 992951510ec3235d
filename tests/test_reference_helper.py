"""The float64 reference the GPU kernel tests trust (`tests.helpers.dense_attention_reference`)
agrees with torch's float64 SDPA and autograd, GQA, masks and fully masked rows included."""
from __future__ import annotations

import numpy as np
import pytest

from .helpers import dense_attention_reference

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("heads_kv,causal", [(4, False), (2, True), (1, True)])
def test_reference_matches_torch_autograd(heads_kv, causal):
    g = torch.Generator().manual_seed(heads_kv)
    q = torch.randn(2, 4, 23, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, heads_kv, 31, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, heads_kv, 31, 8, generator=g, dtype=torch.float64, requires_grad=True)
    do = torch.randn(2, 4, 23, 8, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 1, 23, 31, generator=g) > 0.3
    mask[..., 0] = True            # every row keeps key 0 (torch's SDPA gives NaN for empty rows)
    group = 4 // heads_kv
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    allowed = mask & torch.ones(23, 31, dtype=torch.bool).tril() if causal else mask
    out = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=allowed, scale=0.3)
    out.backward(do)
    got = dense_attention_reference(q, k, v, do, scale=0.3, causal=causal, mask=mask)
    np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        np.testing.assert_allclose(got[name], t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    lse = torch.logsumexp((q @ kr.transpose(-1, -2) * 0.3).masked_fill(~allowed, -np.inf), -1)
    np.testing.assert_allclose(got["lse"], lse.detach().numpy(), rtol=1e-12)


def test_reference_fully_masked_row_is_zero_with_lse_minus_inf():
    q = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    mask = torch.ones(1, 1, 4, 6, dtype=torch.bool)
    mask[0, 0, 2] = False
    got = dense_attention_reference(q, q[:, :, :3].repeat(1, 1, 2, 1), q[:, :, :3].repeat(1, 1, 2, 1),
                                    torch.ones_like(q), scale=1.0, mask=mask)
    assert np.all(got["out"][0, 0, 2] == 0) and got["lse"][0, 0, 2] == -np.inf
    assert np.all(got["dq"][0, 0, 2] == 0) and np.isfinite(got["dk"]).all()
