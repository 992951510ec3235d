"""A small configuration exercising every kernel path once, for compute-sanitizer:

    compute-sanitizer --tool memcheck python -m kernels.sanitize_case
"""
import numpy as np

import kernels


def main():
    rng = np.random.default_rng(0)
    for d, causal, kw in ((64, True, {}), (64, False, {"dropout_p": 0.25, "seed": 3}),
                          (32, False, {"mask": rng.random((2, 1, 70, 45)) < 0.7})):
        q = rng.standard_normal((2, 2, 70, d)).astype(np.float32)
        k = rng.standard_normal((2, 1, 45, d)).astype(np.float32)
        v = rng.standard_normal((2, 1, 45, d)).astype(np.float32)
        out, lse = kernels.forward(q, k, v, scale=d ** -0.5, causal=causal, **kw)
        for mode in ("kernel", "atomic"):
            dq, dk, dv = kernels.backward(q, k, v, out, lse, out, scale=d ** -0.5, causal=causal,
                                          dq_mode=mode, **kw)
            assert np.isfinite(dq).all() and np.isfinite(dk).all()
    print("sanitize_case done")


if __name__ == "__main__":
    main()
