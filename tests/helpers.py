"""Shared test helpers: random problems, tolerances, a float64 reference in the user's layout."""
from __future__ import annotations

import numpy as np

# Tolerances, by input dtype. The reference is float64 on the same (already rounded) inputs, so
# the error is the tiled path's own: float32 accumulation over at most a few hundred terms
# (~1e-6 relative) for float32; for float16 the output's final rounding to float16
# (2**-11 ~ 4.9e-4 relative) dominates.
ATOL = {np.float32: 2e-5, np.float16: 4e-3}
RTOL = {np.float32: 1e-4, np.float16: 4e-3}
# Gradients sum Nq or Nk products: compare by relative Frobenius norm.
GRAD_REL = {np.float32: 2e-4, np.float16: 1e-2}


def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    denom = max(np.linalg.norm(b), 1e-30)
    return float(np.linalg.norm(a - b) / denom)


def random_qkv(rng, batch, heads_q, heads_kv, nq, nk, d, dtype=np.float32, scale=1.0):
    def mk(h, n):
        shape = ((batch,) if batch else ()) + (h, n, d)
        return (rng.standard_normal(shape) * scale).astype(dtype)
    return mk(heads_q, nq), mk(heads_kv, nk), mk(heads_kv, nk)


def grads_close(got, want, dtype=np.float32) -> bool:
    """Relative Frobenius-norm agreement, with an absolute floor for gradients that are ~0
    (e.g. dq with a single key, where the exact value is 0 and float32 leaves ~1e-7)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    err = np.linalg.norm(got - want)
    return bool(err <= GRAD_REL[dtype] * np.linalg.norm(want) + ATOL[dtype] * np.sqrt(want.size))
