"""Numba CUDA fused attention kernels (FlashAttention-2 order), float32 accumulation.

``forward`` and ``backward`` follow the kernel entry-point contract (see `kernels.launch`):
NumPy host arrays, Numba device arrays or torch CUDA tensors in, the same kind out. The
kernels run on a GPU or, unchanged, under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).
"""
from .launch import backward, forward

__all__ = ["forward", "backward"]
