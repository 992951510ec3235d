"""ioaware: design, run and predict IO-aware GPU algorithms — fused tiled (Flash) attention first.

``from ioaware import attention`` gives the exact tiled attention (NumPy on the CPU, Numba CUDA
kernels on a GPU); ``scaled_dot_product_attention`` is a drop-in for PyTorch's (docs/sdpa.md),
and :mod:`ioaware.integrations.transformers` puts it into Hugging Face models;
:mod:`ioaware.distributed` splits a long sequence over processes (ring attention on
``torch.distributed``, planned by :mod:`ioaware.ring_plan`; imported on its own, it needs torch);
:mod:`ioaware.fp8` runs FlashAttention-3's FP8 forward (e4m3 inputs with descales);
:mod:`ioaware.block_info` says which tiles a schedule visits; :mod:`ioaware.kernel_cache` keeps
compiled kernels between processes; the ``sim`` package predicts the
bytes, FLOPs and time of a schedule on a named GPU.
"""
from ._cost import PerformanceWarning
from ._inputs import BlockMask
from .attention import attention, attention_backward, scaled_dot_product_attention
from .block_info import BlockInfo
from .kernel_cache import set_kernel_cache_dir

__all__ = ["attention", "attention_backward", "scaled_dot_product_attention", "BlockMask", "BlockInfo",
           "PerformanceWarning", "set_kernel_cache_dir"]
__version__ = "0.1.0"
