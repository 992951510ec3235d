"""Launching compiled Numba kernels on torch tensors with little host work, and dynamic shared
memory above 48 KiB.

``kern[grid, block, stream](*args)`` types every argument (``typeof``), looks the overload up and
builds a `DeviceNDArray` for each torch tensor through ``__cuda_array_interface__``
(``cuda.as_cuda_array``) on every call. For the tensor-core kernels' ~20 arguments that host
work is a large part of a short kernel's time. `launch` pays it once per *argument signature*
(each array's dtype, rank and layout, each scalar's type): the first call compiles (or finds)
the overload as Numba would and launches through it; later calls with the same signature reuse
that overload and hand each tensor's pointer, shape and strides straight to the driver, in the
order Numba itself marshals an array (meminfo, parent, size, itemsize, data, shape..., strides...).

``KERNELS_FAST_LAUNCH=0`` sends every call through Numba's own launch (for comparison).

Dynamic shared memory: a kernel that declares ``cuda.shared.array(0, dtype)`` gets
``sharedmem`` bytes; above the 48 KiB default, `launch` first raises the kernel's
``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` (the opt-in that ``kern[...]`` has no
parameter for), once per (kernel, device).
"""
from __future__ import annotations

import functools
import os
import sys

#: Whether `launch` reuses compiled overloads (environment ``KERNELS_FAST_LAUNCH``, default on).
FAST_LAUNCH = os.environ.get("KERNELS_FAST_LAUNCH", "1") != "0"
#: Dynamic shared memory a block gets without the opt-in, bytes.
DEFAULT_DYNAMIC_SMEM_BYTES = 48 * 1024

_OVERLOADS: dict = {}      # (dispatcher id, signature key) -> _Plan
_OPTED_IN: dict = {}       # (compiled id, device id) -> bytes allowed
_STREAMS: dict = {}        # torch stream handle -> Numba external stream


_TORCH_TYPES: set = set()


def _is_torch(x) -> bool:
    t = type(x)
    if t in _TORCH_TYPES:
        return True
    if t.__module__.startswith("torch"):
        _TORCH_TYPES.add(t)
        return True
    return False


@functools.lru_cache(maxsize=None)
def real_gpu() -> bool:
    """Whether a real CUDA GPU runs the kernels (not the simulator); checked once."""
    from numba import cuda
    return os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" and bool(cuda.is_available())


def current_device_id() -> int:
    """The current CUDA device's ordinal, cheaply: torch's current device once torch has
    initialised CUDA (torch and Numba share the device's primary context, so it is the device
    Numba launches on), else Numba's current device."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    from numba import cuda
    return getattr(cuda.get_current_device(), "id", 0)   # (the simulator's device has no id)


def _layout(shape, strides_bytes, itemsize) -> str:
    """Numba's layout letter for an array ('C', 'F' or 'A'), as `DeviceNDArray` derives it."""
    size = 1
    for n in shape:
        size *= n
    if size == 0 or not shape:
        return "C"
    if 0 in strides_bytes:
        return "A"
    sd, c_contig = itemsize, True
    for n, s in zip(reversed(shape), reversed(strides_bytes)):
        if n != 1:
            if s != sd:
                c_contig = False
                break
            sd *= n
    if c_contig:
        return "C"
    sd = itemsize
    for n, s in zip(shape, strides_bytes):
        if n != 1:
            if s != sd:
                return "A"
            sd *= n
    return "F"


def _arg_key(a):
    """What decides the Numba type of argument ``a`` (cheap to compute)."""
    if _is_torch(a):
        if a.is_contiguous() and 0 not in a.stride():
            return ("t", a.dtype, a.dim(), "C")
        item = a.element_size()
        return ("t", a.dtype, a.dim(), _layout(tuple(a.shape), tuple(s * item for s in a.stride()),
                                                item))
    nt = getattr(a, "_numba_type_", None)       # Numba device arrays
    if nt is not None:
        return ("n", nt)
    return ("s", type(a))


def _to_numba(a):
    if _is_torch(a):
        from numba import cuda
        # sync=False: launches go on torch's current stream, which orders them after producers
        return cuda.as_cuda_array(a.detach(), sync=False)
    return a


def launch_stream(on=None):
    """The stream object `launch` takes. ``on`` is a torch CUDA tensor (torch's current stream
    on its device), a torch stream, or None (the default stream). Cached by stream handle."""
    if on is None:
        handle = 0
    elif hasattr(on, "cuda_stream"):
        handle = int(on.cuda_stream)
    else:
        import torch
        get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        handle = (get_raw(on.get_device()) if get_raw is not None
                  else torch.cuda.current_stream(on.device).cuda_stream)
    s = _STREAMS.get(handle)
    if s is None:
        from numba import cuda
        from numba.cuda.cudadrv.driver import _to_core_stream
        if len(_STREAMS) > 64:
            _STREAMS.clear()
        s = _STREAMS[handle] = _to_core_stream(cuda.external_stream(handle) if handle else 0)
    return s


def _opt_in(compiled, sharedmem, device_id=None):
    """Allow ``sharedmem`` bytes of dynamic shared memory for ``compiled`` on this device (a
    dictionary lookup once done for this kernel, device and size); ``device_id`` is
    `current_device_id` when the caller has it."""
    if sharedmem <= DEFAULT_DYNAMIC_SMEM_BYTES:
        return
    key = (id(compiled), current_device_id() if device_id is None else device_id)
    if _OPTED_IN.get(key, 0) >= sharedmem:
        return
    from numba import cuda
    from numba.cuda.cudadrv.driver import binding, driver
    dev = cuda.get_current_device()
    limit = int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    if sharedmem > limit:
        raise ValueError(f"{sharedmem} bytes of dynamic shared memory exceed this device's "
                         f"per-block limit of {limit} bytes")
    cufunc = compiled._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(sharedmem), cufunc.handle, dev.id)
    _OPTED_IN[key] = int(sharedmem)


class _Plan:
    """How to marshal one argument signature of one compiled overload: per argument, 't' (a torch
    tensor: pointer, shape, strides), 'n' (a Numba device array; the last one's marshalled
    values are kept, so a constant array costs nothing) or a ctypes constructor for a scalar
    (None: Numba's own `_prepare_args`)."""
    __slots__ = ("kern", "compiled", "kinds", "last", "configs", "handles")

    def __init__(self, kern, compiled, args):
        import ctypes

        from numba.cuda import types
        self.kern, self.compiled, self.configs, self.handles = kern, compiled, {}, {}
        kinds = []
        for ty, a in zip(compiled.argument_types, args):
            if _is_torch(a):
                kinds.append("t")
            elif isinstance(ty, types.Array):
                kinds.append("n")
            elif isinstance(ty, types.Integer):
                kinds.append(getattr(ctypes, "c_%s" % ty))
            elif ty == types.float32:
                kinds.append(ctypes.c_float)
            elif ty == types.float64:
                kinds.append(ctypes.c_double)
            else:
                kinds.append(None)
        self.kinds = tuple(kinds)
        self.last = [None] * len(kinds)

    def marshal(self, args, stream):
        out, compiled, last = [], self.compiled, self.last
        for i, (kind, a) in enumerate(zip(self.kinds, args)):
            if kind == "t":
                item = a.element_size()
                out += (0, 0, a.numel(), item, a.data_ptr())
                out += a.shape
                out += (s * item for s in a.stride())
            elif kind == "n":
                hit = last[i]
                if hit is None or hit[0] is not a:
                    vals = []
                    compiled._prepare_args(compiled.argument_types[i], a, stream, [], vals)
                    hit = last[i] = (a, vals)
                out += hit[1]
            elif kind is None:
                compiled._prepare_args(compiled.argument_types[i], a, stream, [], out)
            else:
                out.append(kind(a))
        return out

    def handle(self, dev):
        """The loaded kernel on device ``dev`` (the current one; cached per device ordinal)."""
        h = self.handles.get(dev)
        if h is None:
            h = self.handles[dev] = self.compiled._codelibrary.get_cufunc().kernel
        return h

    def config(self, grid, block, sharedmem):
        key = (grid, block, sharedmem)
        cfg = self.configs.get(key)
        if cfg is None:
            from cuda.core import LaunchConfig
            if len(self.configs) > 256:
                self.configs.clear()
            cfg = self.configs[key] = LaunchConfig(grid=grid, block=block, shmem_size=sharedmem)
        return cfg


def _slow(kern, key, grid, block, stream, args, sharedmem):
    """Numba's own typing and compilation, then a launch through the overload; caches a `_Plan`
    for the signature."""
    from numba.cuda.errors import normalize_kernel_dimensions
    grid, block = normalize_kernel_dimensions(grid, block)
    nargs = [_to_numba(a) for a in args]
    argtypes = tuple(kern.typeof_pyval(a) for a in nargs)
    compiled = kern.compile(argtypes)
    _opt_in(compiled, sharedmem)
    compiled.launch(nargs, grid, block, stream, sharedmem)
    if key is not None:
        if len(_OVERLOADS) > 512:
            _OVERLOADS.clear()
        _OVERLOADS[key] = _Plan(kern, compiled, args)


def signature_key(kern, args) -> tuple:
    """The cache key of a launch of ``kern`` with ``args``: the dispatcher and each argument's
    `_arg_key`."""
    return (id(kern),) + tuple(_arg_key(a) for a in args)


def plan_for(kern, args):
    """The cached `_Plan` of this launch's signature, or None before its first launch."""
    plan = _OVERLOADS.get(signature_key(kern, args))
    return plan if plan is not None and plan.kern is kern else None


def launch(kern, grid, block, stream, args, sharedmem=0):
    """Launch the Numba dispatcher ``kern`` as ``kern[grid, block, stream, sharedmem](*args)``.

    ``args`` may hold torch CUDA tensors (used in place; half-precision ones already viewed as
    the integer type the kernel takes), Numba device arrays and scalars; ``stream`` comes from
    `launch_stream`. See the module docstring for what is cached.
    """
    if not FAST_LAUNCH:
        _slow(kern, None, grid, block, stream, args, sharedmem)
        return
    key = signature_key(kern, args)
    plan = _OVERLOADS.get(key)
    if plan is None or plan.kern is not kern:
        _slow(kern, key, grid, block, stream, args, sharedmem)
        return
    compiled = plan.compiled
    dev = current_device_id()
    _opt_in(compiled, sharedmem, dev)
    from cuda.core import launch as core_launch
    core_launch(stream, plan.config(grid, block, sharedmem), plan.handle(dev),
                *plan.marshal(args, stream))
