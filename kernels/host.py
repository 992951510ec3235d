"""The host side of every kernel family: the array kind, decided once, device memory, and launch.

* `Call` takes a validated `ioaware` problem and decides once whether its arrays are torch CUDA
  tensors (used in place, results come back as tensors on torch's current stream) or NumPy
  arrays (copied to the device, results copied back; this is how CI runs the kernels under
  Numba's CUDA simulator). It gives each family its operands (as 16-bit words for the
  half-precision tensor-core kernels, float32 copies of bfloat16 for the CUDA-core ones, rows
  16-byte aligned where ``cp.async`` reads them), allocates outputs and the boolean mask, and
  turns results back into the caller's kind.
* `device_const` keeps small host-built constants (tile schedules, the dummy mask) on the device,
  once per configuration and device, so that a call does no synchronous host-to-device copy.
* `launch` runs a compiled Numba kernel with little host work, with dynamic shared memory above
  48 KiB. ``kern[grid, block, stream](*args)`` types every argument (``typeof``), looks the
  overload up and builds a `DeviceNDArray` for each torch tensor through
  ``__cuda_array_interface__`` on every call; for the tensor-core kernels' ~20 arguments that
  host work is a large part of a short kernel's time. `launch` pays it once per *argument
  signature* (each array's dtype, rank and layout, each scalar's type): the first call finds
  the kernel's cubin in the on-disk cache (`kernels.compile_cache`, for kernels built through
  `kernels.compile_cache.built`) or has Numba compile the overload (and stores its cubin);
  every call, the first included, packs each tensor's pointer, shape and strides, in the order
  Numba itself marshals an array (meminfo, parent, size, itemsize, data, shape..., strides...),
  and each scalar into one parameter buffer per signature (one ``struct.pack_into``) and calls
  ``cuLaunchKernel`` on it. ``fast=False`` sends a call through Numba's own launch (for
  measuring what the fast path saves). A kernel that declares ``cuda.shared.array(0, dtype)``
  gets ``sharedmem`` bytes; above the 48 KiB default, `launch` first raises the kernel's
  ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` (the opt-in that ``kern[...]`` has no
  parameter for), once per (kernel, device).
"""
from __future__ import annotations

import functools
import sys

import numpy as np
from numba import config as numba_config

from sim.workload import RESERVED_SMEM_PER_BLOCK

from . import compile_cache
from .mask import UNBOUNDED

__all__ = ["plan_workload", "family_plan", "check_launch",
           "Call", "simulator", "real_gpu", "compute_capability", "current_device_id",
           "device_const", "tensor_core_refusal", "tensor_core_backward_refusal",
           "prepare_tensor_core_forward", "prepare_tensor_core_backward", "launch",
           "launch_stream", "stream_handle",
           "signature_key", "plan_for", "relaunch", "PointerLaunch", "pointer_launch",
           "Repeat", "aligned_copy"]

#: Dynamic shared memory a block gets without the opt-in, bytes.
DEFAULT_DYNAMIC_SMEM_BYTES = 48 * 1024

_OVERLOADS: dict = {}      # (dispatcher id, signature key) -> _Plan
_OPTED_IN: dict = {}       # (kernel function, device id) -> bytes allowed
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


def simulator() -> bool:
    """Whether Numba's CUDA simulator runs the kernels (``NUMBA_ENABLE_CUDASIM=1``)."""
    return bool(numba_config.ENABLE_CUDASIM)


@functools.lru_cache(maxsize=None)
def real_gpu() -> bool:
    """Whether a real CUDA GPU runs the kernels (not the simulator); checked once."""
    from numba import cuda
    return not simulator() and bool(cuda.is_available())


@functools.lru_cache(maxsize=None)
def compute_capability(device_id: int = 0) -> tuple[int, int]:
    """The compute capability of CUDA device ``device_id`` ((0, 0) without a real GPU)."""
    if not real_gpu():
        return (0, 0)
    from numba import cuda
    return tuple(cuda.gpus[device_id].compute_capability)


def tensor_core_refusal(problem, family, dtypes, head_dims, window=False):
    """Why a tensor-core family (``family``, e.g. "the mma family") cannot run ``problem``
    (a string), or None: it needs a real GPU of compute capability 8.0 or later (``mma.sync``,
    ``cp.async``; the CUDA simulator runs no inline PTX), a dtype of ``dtypes`` and a head dim
    of ``head_dims``, and a sliding window only where the caller takes one (``window``: the
    forwards do; the backwards not yet, the simt family runs those). The checks every
    tensor-core family makes first."""
    if not real_gpu():
        return f"{family} needs a real CUDA GPU (the CUDA simulator runs no inline PTX)"
    if problem.kind != "torch" and problem.kind != "numpy":
        return f"{family} takes NumPy arrays or torch CUDA tensors"
    cc = compute_capability(current_device_id())
    if cc < (8, 0):
        return f"{family} needs compute capability 8.0 or later, this GPU has {cc[0]}.{cc[1]}"
    dtype = str(problem.dtype).replace("torch.", "")
    if dtype not in dtypes:
        return f"{family} takes {' or '.join(dtypes)} inputs, got {dtype}"
    if problem.head_dim not in head_dims:
        return f"{family} takes head_dim in {head_dims}, got {problem.head_dim}"
    window_size = getattr(problem, "window_size", None)
    if window_size is not None and not window:
        return (f"{family} has no sliding window yet (window_size={tuple(window_size)}); the simt "
                f"family runs windowed problems")
    return None


def sm_count() -> int:
    """SMs of the current device (132, an H100's, under the simulator), read once per device."""
    if not real_gpu():
        return 132
    return _sm_count(current_device_id())


@functools.lru_cache(maxsize=None)
def _sm_count(device_id: int) -> int:
    from numba import cuda
    return int(cuda.gpus[device_id].MULTIPROCESSOR_COUNT)


def launch_grid(launch) -> tuple:
    """The grid a `sim.plan.KernelPlan` ``launch`` is launched on: its own, or with
    ``persistent`` one program per SM of the current device (fewer where there are fewer work
    items), each walking the work items of the plan's grid."""
    if not getattr(launch, "persistent", False):
        return launch.grid
    return (min(launch.programs, sm_count()),)


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
    on its device), a torch stream, a raw stream handle (an int, `stream_handle`), or None (the
    default stream). Cached by stream handle."""
    if on is None:
        handle = 0
    elif type(on) is int:
        handle = on
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


def stream_handle(on) -> int:
    """The raw handle (an int) of torch's current stream on the device of ``on`` (a torch CUDA
    tensor): what `PointerLaunch` takes on a repeated call, without `launch_stream`'s stream
    object."""
    get_raw = _RAW_STREAM[0]
    if get_raw is None:
        import torch
        get_raw = _RAW_STREAM[0] = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda dev: torch.cuda.current_stream(dev).cuda_stream)
    return get_raw(on.get_device())


_RAW_STREAM: list = [None]


@functools.cache
def _driver_launch():
    """``cuLaunchKernel`` of the CUDA driver library through ctypes (integer handles, no
    argument conversion), or None where the library cannot be loaded that way (the launch then
    goes through ``cuda.bindings``)."""
    import ctypes
    import ctypes.util
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).cuLaunchKernel
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        fn.restype = ctypes.c_int
        return fn
    return None


def _opt_in(plan, sharedmem, device_id=None):
    """Allow ``sharedmem`` bytes of dynamic shared memory for ``plan``'s kernel on this device
    where that and the kernel's static shared memory exceed the 48 KiB a block has without
    opting in, and, for a kernel that declares the programs an SM is to hold
    (``resident_per_sm``, its plan's), ask for the shared-memory carveout that fits just that
    many (`_driver_carveout`): the rest of the SM's on-chip memory stays L1. A dictionary lookup
    once done for this kernel function, device and size; ``device_id`` is `current_device_id`
    when the caller has it."""
    if sharedmem <= 0:
        return
    dev_id = current_device_id() if device_id is None else device_id
    fn = plan.function(dev_id)
    key = (fn, dev_id)          # the function itself: kept alive here, so no id is reused
    if _OPTED_IN.get(key, 0) >= sharedmem:
        return
    # without the opt-in a block has 48 KiB in all: its static shared memory and the dynamic
    static = int(getattr(getattr(fn, "attrs", None), "shared", 0) or 0)
    if sharedmem + static > DEFAULT_DYNAMIC_SMEM_BYTES:
        _driver_opt_in(fn, int(sharedmem), dev_id)
    programs = int(getattr(getattr(plan, "kern", None), "resident_per_sm", 0) or 0)
    if programs > 0:
        _driver_carveout(fn, programs * (int(sharedmem) + static + RESERVED_SMEM_PER_BLOCK),
                         dev_id)
    _OPTED_IN[key] = int(sharedmem)


def _driver_opt_in(fn, sharedmem: int, dev_id: int) -> None:
    """``cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`` of loaded function ``fn`` on the
    current device (refused above the device's per-block opt-in limit)."""
    from numba import cuda
    from numba.cuda.cudadrv.driver import binding, driver
    dev = cuda.get_current_device()
    limit = int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    if sharedmem > limit:
        raise ValueError(f"{sharedmem} bytes of dynamic shared memory exceed this device's "
                         f"per-block limit of {limit} bytes")
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, sharedmem, fn.handle, dev.id)


@functools.lru_cache(maxsize=None)
def smem_per_sm(device_id: int) -> int | None:
    """Shared memory of one SM of CUDA device ``device_id``, bytes (read once), or None where
    the driver binding does not give it."""
    from numba import cuda
    try:
        return int(cuda.gpus[device_id].MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
    except (AttributeError, KeyError):
        return None


def _driver_carveout(fn, shared_bytes: int, dev_id: int) -> None:
    """``cuKernelSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)`` of loaded function ``fn``: the
    percentage of the SM's shared memory that holds ``shared_bytes`` (rounded up; the driver
    takes the smallest carveout it has of at least that). A smaller carveout leaves a larger
    L1, through which the decoding kernel's ``cp.async.ca`` copies pass. Nothing is asked where
    the driver binding does not give the SM's shared memory."""
    from numba.cuda.cudadrv.driver import binding, driver
    per_sm = smem_per_sm(dev_id)
    if per_sm is None:
        return
    percent = min(100, -(-100 * int(shared_bytes) // per_sm))
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    driver.cuKernelSetAttribute(attr, percent, fn.handle, dev_id)


def _tensor_values(a):
    """What Numba's launch passes for a torch tensor (as for a device array viewing it)."""
    item = a.element_size()
    return [0, 0, a.numel(), item, a.data_ptr(), *a.shape, *[s * item for s in a.stride()]]


def _array_values(a):
    """What Numba's launch passes for a Numba device array: meminfo, parent, size, itemsize,
    data, shape..., strides... (as `_Kernel._prepare_args` does)."""
    from numba.cuda.cudadrv.driver import device_pointer
    return [0, 0, a.size, a.dtype.itemsize, device_pointer(a) or 0, *a.shape, *a.strides]


#: The scalar parameters a kernel can take, by Numba type name: (struct code in an 8-byte slot,
#: the ctypes type cuda.core's launch takes).
_SCALARS = {"int64": ("q", "c_int64"), "uint64": ("Q", "c_uint64"), "int32": ("i", "c_int32"),
            "uint32": ("I", "c_uint32"), "float32": ("f", "c_float"), "float64": ("d", "c_double")}
_SCALAR_CODES = {name: code for name, (code, _) in _SCALARS.items()}
_SCALAR_CTYPES = {name: ctype for name, (_, ctype) in _SCALARS.items()}
#: struct codes of one array parameter before its shape and strides: meminfo, parent, size,
#: itemsize, data (as Numba's ``_prepare_args`` lays an array out).
_ARRAY_HEAD = "QQqqQ"


class _Packed:
    """A kernel's parameters in one buffer, one 8-byte slot each (4-byte values padded), and the
    ``void*`` array of the slots' addresses that ``cuLaunchKernel`` reads them through. Packing
    is one ``struct.pack_into`` call; the lock keeps two threads from packing one buffer at once
    (the driver copies the parameters before ``cuLaunchKernel`` returns)."""
    __slots__ = ("struct", "buffer", "pointers", "address", "lock")

    def __init__(self, codes):
        import ctypes
        import struct
        import threading
        self.struct = struct.Struct("<" + "".join(c + ("4x" if c in "iIf" else "") for c in codes))
        self.buffer = ctypes.create_string_buffer(max(self.struct.size, 8))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(codes), 1))(*(base + 8 * i
                                                                 for i in range(len(codes))))
        self.address = ctypes.addressof(self.pointers)
        self.lock = threading.Lock()


class _Plan:
    """How to launch one argument signature of one compiled kernel: per argument, 't' (a torch
    tensor: pointer, shape, strides), 'n' (a Numba device array; the last one's values are kept,
    so a constant array costs nothing), 's' (a scalar, packed by its Numba type) or None (Numba's
    own ``_prepare_args``, which needs ``compiled``, and a launch through cuda.core). The kernel
    function comes from Numba's ``compiled`` overload or from a cached cubin
    (`kernels.compile_cache.Entry`), loaded once per device. Where every argument is marshalled
    here (`marshals_itself`) the parameters are packed into a `_Packed` buffer and launched with
    ``cuLaunchKernel``."""
    __slots__ = ("kern", "compiled", "entry", "argument_types", "kinds", "last", "configs",
                 "dims", "functions", "packed", "codes", "first_slots")

    def __init__(self, kern, argument_types, args, compiled=None, entry=None):
        from numba.cuda import types
        self.kern, self.compiled, self.entry = kern, compiled, entry
        self.argument_types = tuple(argument_types)
        self.configs, self.dims, self.functions = {}, {}, {}
        kinds, codes, first_slots, slot = [], [], [], 0
        for ty, a in zip(self.argument_types, args):
            first_slots.append(slot)
            if isinstance(ty, types.Array) and (_is_torch(a) or hasattr(a, "_numba_type_")):
                kinds.append("t" if _is_torch(a) else "n")
                codes.append(_ARRAY_HEAD + "q" * (2 * ty.ndim))
            elif str(ty) in _SCALAR_CODES:
                kinds.append("s")
                codes.append(_SCALAR_CODES[str(ty)])
            else:
                kinds.append(None)
            slot += len(codes[-1]) if kinds[-1] is not None else 0
        self.kinds = tuple(kinds)
        self.first_slots = tuple(first_slots)   # each argument's first 8-byte parameter slot
        self.last = [None] * len(kinds)
        self.codes = "".join(codes)
        self.packed = _Packed(self.codes) if None not in kinds else None

    def data_slots(self, positions) -> tuple:
        """The 8-byte parameter slots that hold the data pointers of the array arguments at
        ``positions`` (an array is laid out as meminfo, parent, size, itemsize, data, shape...,
        strides...)."""
        for i in positions:
            if self.kinds[i] not in ("t", "n"):
                raise ValueError(f"argument {i} is not an array (kind {self.kinds[i]!r})")
        return tuple(self.first_slots[i] + 4 for i in positions)

    @property
    def marshals_itself(self) -> bool:
        """Whether every argument is marshalled here, without Numba's ``_prepare_args`` (what a
        kernel loaded from a cubin needs)."""
        return self.packed is not None

    def values(self, args):
        """The parameter values of ``args`` in launch order (plain numbers)."""
        out, last = [], self.last
        for i, (kind, a) in enumerate(zip(self.kinds, args)):
            if kind == "t":
                out += _tensor_values(a)
            elif kind == "n":
                hit = last[i]
                if hit is None or hit[0] is not a:
                    hit = last[i] = (a, _array_values(a))
                out += hit[1]
            else:
                out.append(a)
        return out

    def marshal(self, args, stream):
        """The parameters as cuda.core's launch takes them (the path of a plan with an argument
        only Numba marshals)."""
        import ctypes
        out, compiled = [], self.compiled
        for i, (kind, a) in enumerate(zip(self.kinds, args)):
            if kind is None:
                compiled._prepare_args(self.argument_types[i], a, stream, [], out)
            elif kind == "s":
                out.append(getattr(ctypes, _SCALAR_CTYPES[str(self.argument_types[i])])(a))
            else:
                out += _array_values(a) if kind == "n" else _tensor_values(a)
        return out

    def function(self, dev):
        """The loaded kernel function on device ``dev`` (the current one; cached per device
        ordinal): ``.kernel`` is what cuda.core launches, ``.handle`` the driver's handle."""
        fn = self.functions.get(dev)
        if fn is None:
            if self.compiled is not None:
                fn = self.compiled._codelibrary.get_cufunc()
            else:
                from cuda.core import ObjectCode
                from numba.cuda.cudadrv import devices
                image = ObjectCode.from_cubin(self.entry.cubin)
                module = devices.get_context().create_module_image(image)   # kept by the context
                fn = module.get_function(self.entry.entry_name)
            self.functions[dev] = fn
        return fn

    def config(self, grid, block, sharedmem):
        """cuda.core's launch configuration (the path of a plan that is not packed)."""
        key = (grid, block, sharedmem)
        cfg = self.configs.get(key)
        if cfg is None:
            from cuda.core import LaunchConfig
            if len(self.configs) > 256:
                self.configs.clear()
            cfg = self.configs[key] = LaunchConfig(grid=grid, block=block, shmem_size=sharedmem)
        return cfg

    def grid_block(self, grid, block):
        """``(gx, gy, gz, bx, by, bz)`` of a launch's grid and block (cached)."""
        key = (grid, block)
        dims = self.dims.get(key)
        if dims is None:
            from numba.cuda.errors import normalize_kernel_dimensions
            g, b = normalize_kernel_dimensions(grid, block)
            if len(self.dims) > 256:
                self.dims.clear()
            dims = self.dims[key] = (*g, *b)
        return dims

    def pack(self, args):
        """Pack ``args`` into the parameter buffer (hold ``self.packed.lock`` around this and
        `enqueue`)."""
        p = self.packed
        p.struct.pack_into(p.buffer, 0, *self.values(args))

    def enqueue(self, grid, block, stream, sharedmem, dev):
        """``cuLaunchKernel`` on the packed buffer."""
        from numba.cuda.cudadrv.driver import CudaAPIError, binding
        err, = binding.cuLaunchKernel(self.function(dev).handle, *self.grid_block(grid, block),
                                      sharedmem, stream.handle, self.packed.address, 0)
        if err != binding.CUresult.CUDA_SUCCESS:
            raise CudaAPIError(err, f"cuLaunchKernel of {_label(self.kern) or self.kern}")

    def launch(self, grid, block, stream, args, sharedmem, dev):
        _opt_in(self, sharedmem, dev)
        if self.packed is not None:
            with self.packed.lock:
                self.pack(args)
                self.enqueue(grid, block, stream, sharedmem, dev)
            return
        from cuda.core import launch as core_launch
        core_launch(stream, self.config(grid, block, sharedmem), self.function(dev).kernel,
                    *self.marshal(args, stream))


class PointerLaunch:
    """One launch repeated with new data pointers: a kernel, grid, block, dynamic shared memory
    and every argument fixed at a first launch, except the data pointers of the array arguments
    at ``positions`` (the call's operands and outputs, whose shapes and strides stay those of
    the first launch: the caller checks that). A call writes those pointers into its own copy
    of the packed parameters (one 8-byte store each) and calls the driver's ``cuLaunchKernel``
    (through ctypes, `_driver_launch`, else ``cuda.bindings``): no argument typing, signature
    lookup or marshalling. The fixed arguments (tile schedules, constants) are referenced here,
    so their device memory outlives the launch; the first launch's operands and outputs are
    not (their memory is the caller's). Build it with `pointer_launch` after the first launch
    went through `launch` or `relaunch`."""
    __slots__ = ("handle", "handle_int", "dims", "sharedmem", "device", "slots", "words",
                 "address", "lock", "keep", "label", "driver")

    def __init__(self, plan, grid, block, sharedmem, args, positions, device):
        import ctypes
        import threading
        if plan.packed is None:
            raise ValueError("a PointerLaunch needs a plan that packs its own parameters")
        self.slots = plan.data_slots(positions)
        packed = _Packed(plan.codes)
        packed.struct.pack_into(packed.buffer, 0, *plan.values(args))
        self.words = (ctypes.c_uint64 * (len(packed.buffer) // 8)).from_buffer(packed.buffer)
        # the fixed arguments only: the first call's operands and outputs are not kept alive
        varying = set(positions)
        fixed = tuple(a for i, a in enumerate(args) if i not in varying)
        self.address, self.keep = packed.address, (packed, fixed)
        self.handle = plan.function(device).handle
        self.handle_int = int(self.handle)
        self.dims = plan.grid_block(grid, block)
        self.sharedmem, self.device, self.lock = int(sharedmem), device, threading.Lock()
        self.label = _label(plan.kern) or str(plan.kern)
        self.driver = _driver_launch()

    def __call__(self, stream, *pointers):
        """Launch on ``stream`` (a raw stream handle, `stream_handle`, or a `launch_stream`
        object) with the new data pointers, in the order of ``positions``."""
        words = self.words
        with self.lock:
            for slot, ptr in zip(self.slots, pointers):
                words[slot] = ptr
            if self.driver is not None:
                handle = stream if type(stream) is int else int(stream.handle)
                failed = self.driver(self.handle_int, *self.dims, self.sharedmem, handle,
                                     self.address, None)
            else:       # through cuda.bindings
                from numba.cuda.cudadrv.driver import binding
                if type(stream) is int:
                    stream = launch_stream(stream)
                err, = binding.cuLaunchKernel(self.handle, *self.dims, self.sharedmem,
                                              stream.handle, self.address, 0)
                failed = 0 if err == binding.CUresult.CUDA_SUCCESS else err
        if failed:
            from numba.cuda.cudadrv.driver import CudaAPIError
            raise CudaAPIError(failed, f"cuLaunchKernel of {self.label}")


class Repeat:
    """The fast path of a prepared call (`prepare_tensor_core_forward`, ...): once its second
    call ran in full with operands it used in place (no copy), later calls whose operands have
    that call's shapes, strides, dtypes and device, and 16-byte aligned starts, only allocate
    their outputs and repeat that call's launches (`PointerLaunch`) with the new data pointers:
    none of `Call`'s work, no signature lookup, no marshalling. The second call, not the first:
    a family's one-shot ``forward`` (prepare, then run once) records nothing. Recorded only for
    torch CUDA calls on the fast launch path without a mask, and without cache lengths (whose
    device copies are made per call) unless ``lengths_per_call``: the caller passes each call's
    lengths to the repeated launch itself (`kernels.decode_fwd.prepare`)."""
    __slots__ = ("enabled", "full_runs", "layout", "launches", "float32", "_empty_like")

    def __init__(self, template, config, lengths_per_call=False):
        self.enabled = (template.kind == "torch" and template.mask is None
                        and (lengths_per_call or getattr(template, "cache_seqlens", None) is None)
                        and bool(getattr(config, "fast_launch", True)) and real_gpu())
        self.full_runs = 0
        self.layout = self.launches = self.float32 = self._empty_like = None

    def pointers(self, operands, layout_known=False):
        """The operands' data pointers when they may repeat the recorded call, else None.
        ``layout_known``: the caller has matched the operands' shapes, strides, dtypes and
        device to the recorded call's already (`ioaware._backends.prepared_key`), so only their
        16-byte alignment is checked here."""
        if self.launches is None:
            return None
        if layout_known:
            ptrs = [x.data_ptr() for x in operands]
            return None if any(ptr % 16 for ptr in ptrs) else ptrs
        ptrs = []
        for x, (shape, stride, dtype, device) in zip(operands, self.layout):
            ptr = x.data_ptr()
            if (ptr % 16 or x.dtype is not dtype or x.shape != shape or x.stride() != stride
                    or x.get_device() != device):
                return None
            ptrs.append(ptr)
        return ptrs

    def record(self, operands, kernel_operands, make_launches) -> None:
        """After a full call (from the second on): keep ``make_launches()`` (its
        `pointer_launch` es) and the operands' layout, if the kernels took the operands in place
        (``kernel_operands``, what `Call.input` gave, start where ``operands`` start) and every
        launch can be repeated."""
        if not self.enabled or self.launches is not None:
            return
        self.full_runs += 1
        if self.full_runs < 2:
            return
        if any(a.data_ptr() != b.data_ptr() for a, b in zip(operands, kernel_operands)):
            return
        launches = make_launches()
        if any(p is None for p in launches):
            self.enabled = False
            return
        import torch
        self.float32, self._empty_like = torch.float32, torch.empty_like
        self.layout = tuple((tuple(x.shape), tuple(x.stride()), x.dtype, x.get_device())
                            for x in operands)
        self.launches = launches

    def like_layout(self, x):
        """A new torch tensor of ``x``'s shape, dtype and device in ``x``'s layout where ``x`` is
        dense, else contiguous (``empty_like``: what `Call.output` gives with ``like=x``)."""
        return self._empty_like(x)

    def empty(self, like, shape, dtype):
        """A new torch tensor of ``shape`` and ``dtype`` on ``like``'s device."""
        return like.new_empty(shape, dtype=dtype)

    def like(self, x):
        """A new contiguous torch tensor of ``x``'s shape, dtype and device (``empty_like``,
        the cheapest allocation, where ``x`` is contiguous and so is its result)."""
        return self._empty_like(x) if x.is_contiguous() else x.new_empty(x.shape)

    def scratch(self, like, *sizes):
        """Float32 work space of ``sizes`` elements each, in one allocation on ``like``'s
        device: ``(tensor, [data pointer of each part])``, every part 16-byte aligned."""
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += -(-int(n) // 4) * 4
        buf = like.new_empty((max(total, 1),), dtype=self.float32)
        base = buf.data_ptr()
        return buf, [base + 4 * o for o in offsets]


def pointer_launch(kern, grid, block, sharedmem, args, positions):
    """A `PointerLaunch` of ``kern`` with ``args`` (launched before with these arguments'
    signature, so its plan is cached) whose arrays at ``positions`` change call after call; None
    under the simulator, or where the signature has no cached plan that packs its own
    parameters."""
    if simulator():
        return None
    plan = plan_for(kern, args)
    if plan is None or plan.packed is None:
        return None
    return PointerLaunch(plan, grid, block, sharedmem, args, positions, current_device_id())


def _compile(kern, args):
    """Numba's typing and compilation of ``kern`` for ``args``: the overload (logged with its
    seconds on the ``ioaware.kernels`` logger when the kernel is one of ours and Numba had not
    compiled it yet)."""
    import time
    nargs = [_to_numba(a) for a in args]
    argtypes = tuple(kern.typeof_pyval(a) for a in nargs)
    label = _label(kern)
    fresh = bool(label) and argtypes not in kern.overloads
    t0 = time.perf_counter()
    compiled = kern.compile(argtypes)
    if fresh:
        compile_cache.log.info("compiled %s for sm_%d%d in %.1f s", label,
                               *compute_capability(current_device_id()),
                               time.perf_counter() - t0)
    return compiled, nargs


def _label(kern) -> str:
    """``module.builder(args)`` of a kernel built through `kernels.compile_cache.built`, else
    ''."""
    ident = getattr(kern, "build_key", None)
    if ident is None:
        return ""
    module, name, args = ident
    return f"{module.rsplit('.', 1)[-1]}.{name}{args!r}"


def _disk_key(kern, key):
    """The on-disk cache key of this launch signature, or None (no cache directory, or a kernel
    not built through `kernels.compile_cache.built`)."""
    ident = getattr(kern, "build_key", None)
    if ident is None or compile_cache.directory() is None:
        return None
    return compile_cache.entry_key(ident, key[1:], compute_capability(current_device_id()))


def _first_launch(kern, key, grid, block, stream, args, sharedmem):
    """The first launch of a signature in this process: the kernel from the on-disk cache, or
    compiled by Numba (and stored there); caches its `_Plan` under ``key`` and launches through
    it (through Numba's launch when some argument needs Numba's marshalling)."""
    from numba.cuda.errors import normalize_kernel_dimensions
    grid, block = normalize_kernel_dimensions(grid, block)
    disk = _disk_key(kern, key)
    entry = compile_cache.load(disk) if disk is not None else None
    plan = _Plan(kern, entry.argument_types, args, entry=entry) if entry is not None else None
    if plan is None:
        compiled, nargs = _compile(kern, args)
        plan = _Plan(kern, compiled.argument_types, args, compiled=compiled)
        if disk is not None and plan.marshals_itself and _storable(compiled):
            image = compiled._codelibrary.get_cubin()       # a cuda.core ObjectCode
            compile_cache.store(disk, compile_cache.Entry(
                cubin=bytes(getattr(image, "code", image)), entry_name=compiled.entry_name,
                argument_types=plan.argument_types, label=_label(kern)))
        if not plan.marshals_itself:
            _opt_in(plan, sharedmem)
            compiled.launch(nargs, grid, block, stream, sharedmem)
            _remember(key, plan)
            return
    _remember(key, plan)
    plan.launch(grid, block, stream, args, sharedmem, current_device_id())


def _storable(compiled) -> bool:
    """Whether the linked cubin is the whole kernel (no setup callbacks, linked files or
    referenced device arrays that loading the cubin alone would miss)."""
    lib = compiled._codelibrary
    return not (lib._setup_functions or lib._teardown_functions or lib._linking_files
                or getattr(lib, "referenced_objects", None))


def _remember(key, plan):
    if len(_OVERLOADS) > 512:
        _OVERLOADS.clear()
    _OVERLOADS[key] = plan


def signature_key(kern, args) -> tuple:
    """The cache key of a launch of ``kern`` with ``args``: the dispatcher and each argument's
    `_arg_key`."""
    return (id(kern),) + tuple(_arg_key(a) for a in args)


def plan_for(kern, args):
    """The cached `_Plan` of this launch's signature, or None before its first launch."""
    plan = _OVERLOADS.get(signature_key(kern, args))
    return plan if plan is not None and plan.kern is kern else None


def launch(kern, grid, block, stream, args, sharedmem=0, fast=True):
    """Launch the Numba dispatcher ``kern`` as ``kern[grid, block, stream, sharedmem](*args)``.

    ``args`` may hold torch CUDA tensors (used in place; half-precision ones already viewed as
    the integer type the kernel takes), Numba device arrays and scalars; ``stream`` is
    `Call.stream` (`launch_stream`). See the module docstring for what is cached; under the
    CUDA simulator this is Numba's own launch.
    """
    if simulator():
        kern[grid, block, stream, sharedmem](*args)
        return
    if not fast:
        from numba.cuda.errors import normalize_kernel_dimensions
        grid, block = normalize_kernel_dimensions(grid, block)
        compiled, nargs = _compile(kern, args)
        _opt_in(_Plan(kern, compiled.argument_types, args, compiled=compiled), sharedmem)
        compiled.launch(nargs, grid, block, stream, sharedmem)
        return
    key = signature_key(kern, args)
    plan = _OVERLOADS.get(key)
    if plan is None or plan.kern is not kern:
        _first_launch(kern, key, grid, block, stream, args, sharedmem)
        return
    plan.launch(grid, block, stream, args, sharedmem, current_device_id())


def relaunch(plans, varying, kern, grid, block, stream, args, sharedmem=0, fast=True):
    """`launch`, for a caller whose arguments keep their signature call after call except those
    in ``varying`` (e.g. the operands, whose layout may change with their alignment): the
    plan is looked up in ``plans`` (the caller's dict) by their `_arg_key` alone."""
    if simulator() or not fast:
        launch(kern, grid, block, stream, args, sharedmem, fast)
        return
    sig = tuple(_arg_key(a) for a in varying)
    plan = plans.get(sig)
    if plan is None:
        launch(kern, grid, block, stream, args, sharedmem, fast)
        plans[sig] = plan_for(kern, args)
        return
    plan.launch(grid, block, stream, args, sharedmem, current_device_id())


# -- the tensor-core families' launches ----------------------------------------------------------
LOG2E = 1.4426950408889634


def _dropout_args(drop):
    """The dropout constants as the tensor-core kernels take them."""
    return np.uint32(drop.seed_hash), np.uint32(drop.threshold), np.float32(drop.inv_keep)


def prepare_tensor_core_forward(problem, config, kern, launch, schedule, drop, words,
                                band=(-UNBOUNDED, UNBOUNDED)):
    """Prepare a tensor-core forward kernel (the mma and tf32 families share its arguments) for
    ``problem``: operands as 16-bit words (``words``) or float32, rows 16-byte aligned, the
    ``"kv"`` CSR ``schedule`` of its tiles, dropout constants ``drop``, the sliding window's
    ``band`` (lo, hi: `kernels.mask.band_arguments`; read only by a windowed kernel); grid,
    threads and shared memory from ``launch``, the plan's `sim.plan.KernelPlan` (checked
    against the compiled kernel's own). Returns ``run(q, k, v) -> (out, lse)`` in the problem's kind of
    array, for q, k, v of the problem's shapes, dtype and device (the problem's mask, if any, is
    kept); everything that depends only on those is done here, once."""
    pb = problem
    B, H, Nq, D, Nk = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim, pb.seqlen_k
    template = _without_operands(pb)
    check_launch(launch.name, (launch.threads, launch.shared_bytes), (kern.threads, kern.smem_bytes))
    grid, head = launch.grid, (*schedule, H // pb.heads_kv, Nq, Nk)
    tail = (np.float32(pb.scale * LOG2E), *_dropout_args(drop), np.int64(band[0]),
            np.int64(band[1]))
    plans: dict = {}
    repeat = Repeat(template, config)

    def run(q, k, v, layout_known=False):
        ptrs = repeat.pointers((q, k, v), layout_known)
        if ptrs is not None:            # -- the operands' layout of the recorded call: repeat it --
            out = repeat.like(q)                    # [B, H, Nq, D], as q
            lse = repeat.empty(q, (B, H, Nq), repeat.float32)
            repeat.launches[0](stream_handle(q), *ptrs, out.data_ptr(), lse.data_ptr())
            return out, lse
        call = Call(template, q=q)
        qi, ki, vi = (call.input(x, words=words, aligned=True) for x in (q, k, v))
        out = call.output((B, H, Nq, D), words=words)
        lse = call.output((B, H, Nq), float32=True)
        args = (qi, ki, vi, out.arg, lse.arg, *head, *call.mask(), *tail)
        relaunch(plans, (qi, ki, vi), kern, grid, launch.threads, call.stream, args,
                 sharedmem=launch.shared_bytes, fast=config.fast_launch)
        repeat.record((q, k, v), (qi, ki, vi),
                      lambda: [pointer_launch(kern, grid, launch.threads, launch.shared_bytes, args,
                                              range(5))])
        return out.value(), lse.value()
    return run


def check_launch(name: str, planned, compiled) -> None:
    """Raise if kernel ``name`` was compiled for other ``(threads, shared bytes)`` than its plan
    says (``planned``): a kernel and its plan out of step is a bug, never the caller's."""
    if tuple(planned) != tuple(compiled):
        raise RuntimeError(f"kernel {name}: compiled for {compiled[0]} threads and {compiled[1]} "
                           f"bytes of shared memory, its plan says {planned[0]} and {planned[1]}")


def _without_operands(problem):
    """``problem`` without q, k and v (a template a prepared forward keeps; its mask stays)."""
    import dataclasses
    return dataclasses.replace(problem, q=None, k=None, v=None)


def prepare_tensor_core_backward(problem, config, dq_kernel, dq_launch, kv_schedule, dkdv_kernel,
                                 kv_launch, q_schedule, drop, words,
                                 band=(-UNBOUNDED, UNBOUNDED), dq_acc=None):
    """Prepare a tensor-core backward (the mma and tf32 families share its two kernels'
    arguments) for ``problem``: the dQ kernel (which also writes delta) with the ``"kv"``
    schedule, then the dK/dV kernel with the ``"q"`` schedule, each launched as its plan says:
    ``dq_launch`` / ``kv_launch`` = (grid, threads, dynamic shared bytes) of
    `sim.plans.tensor_core_bwd.launch_of` (checked against the compiled kernel's own threads and
    dynamic shared memory); ``band``: the sliding window's (lo, hi), read only by windowed
    kernels. Returns ``run(q, k, v, out, lse, dout) -> (dq, dk, dv)`` in the problem's kind of
    array and dtype, for operands of its shapes, dtype and device (canonical ``[B, H, N, d]``,
    lse ``[B, H, N]``; the problem's mask, if any, is kept).

    ``dq_acc``: what the dK/dV kernel's float32 dQ accumulator argument (after dV) is: None, it
    takes none; "unused", a one-element placeholder (a backward with its dQ kernel); or ``((prepass, launch), (convert, launch))``: dQ by atomics from the dK/dV
    kernel (``dq_kernel`` None): the pre-pass writes delta and zeroes the accumulator, the dK/dV
    kernel adds dS K into it, the conversion writes dQ = scale * accumulator."""
    atomic = not (dq_acc is None or dq_acc == "unused")
    pb = problem
    B, H, Nq, D, Hkv, Nk = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim, pb.heads_kv, pb.seqlen_k
    template = _without_operands(pb)
    tail = (np.float32(pb.scale * LOG2E), np.float32(pb.scale), *_dropout_args(drop),
            np.int64(band[0]), np.int64(band[1]))
    if atomic:
        (pre_kernel, pre_launch), (cvt_kernel, cvt_launch) = dq_acc
        launches = (("pre-pass", pre_kernel, pre_launch), ("dK/dV", dkdv_kernel, kv_launch),
                    ("dQ conversion", cvt_kernel, cvt_launch))
    else:
        launches = (("dQ", dq_kernel, dq_launch), ("dK/dV", dkdv_kernel, kv_launch))
    for name, kern, (_grid, threads, smem) in launches:
        check_launch(name, (threads, smem), (kern.threads, kern.smem_bytes))
    kv_grid, kv_threads, kv_smem = kv_launch
    sizes = (H // Hkv, Nq, Nk)
    scale, n_q = np.float32(pb.scale), np.int64(Nq)
    first_plans, kv_plans, cvt_plans = {}, {}, {}
    repeat = Repeat(template, config)

    def run(q, k, v, out, lse, dout):
        ptrs = repeat.pointers((q, k, v, out, lse, dout))
        if ptrs is not None:            # -- the operands' layout of the recorded call: repeat it --
            p_q, p_k, p_v, p_out, p_lse, p_dout = ptrs
            stream = stream_handle(q)
            dq, dk, dv = repeat.like(q), repeat.like(k), repeat.like(v)     # [B, H(kv), N, D]
            p_dq, p_dk, p_dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
            first, dkdv = repeat.launches[:2]
            # (work: delta, and the float32 dQ accumulator of the atomic structure, in one
            # allocation, kept until the launches are enqueued; torch's allocator orders its reuse)
            if atomic:
                work, (p_delta, p_acc) = repeat.scratch(q, B * H * Nq, B * H * Nq * D)
                first(stream, p_out, p_dout, p_delta, p_acc)
                dkdv(stream, p_q, p_k, p_v, p_dout, p_lse, p_delta, p_dk, p_dv, p_acc)
                repeat.launches[2](stream, p_acc, p_dq)
            else:
                work, (p_delta,) = repeat.scratch(q, B * H * Nq)
                first(stream, p_q, p_k, p_v, p_out, p_dout, p_lse, p_delta, p_dq)
                dkdv(stream, p_q, p_k, p_v, p_dout, p_lse, p_delta, p_dk, p_dv)
            return dq, dk, dv
        call = Call(template, q=q)
        qi, ki, vi, oi, doi = (call.input(x, words=words, aligned=True)
                               for x in (q, k, v, out, dout))
        li = call.input(lse)
        dq = call.output((B, H, Nq, D), words=words)
        dk = call.output((B, Hkv, Nk, D), words=words)
        dv = call.output((B, Hkv, Nk, D), words=words)
        delta = call.output((B, H, Nq), float32=True)
        consts = (*call.mask(), *tail)
        # each launch: (its plans, kernel, grid, threads, dynamic shared bytes, arguments, how
        # many leading arguments its plan is looked up by, how many are this call's arrays)
        if atomic:
            # -- delta and the zeroed accumulator, then dK/dV (and dQ += dS K), then dQ --
            acc = (call.output((B, H, Nq, D), float32=True).arg,)
            launches = [(first_plans, pre_kernel, pre_launch[0], pre_launch[1], 0,
                         (oi, doi, delta.arg, acc[0], n_q), 2, 4)]
        else:
            # -- dQ (and delta) first, then dK/dV, which reads delta --
            launches = [(first_plans, dq_kernel, *dq_launch,
                         (qi, ki, vi, oi, doi, li, delta.arg, dq.arg, *kv_schedule, *sizes, *consts),
                         6, 8)]
            acc = () if dq_acc is None else (device_const(
                "dq_acc placeholder", lambda: np.zeros((1, 1, 1, 1), np.float32)),)
        launches.append((kv_plans, dkdv_kernel, kv_grid, kv_threads, kv_smem,
                         (qi, ki, vi, doi, li, delta.arg, dk.arg, dv.arg, *acc, *q_schedule, *sizes,
                          *consts), 5, 9 if atomic else 8))
        if atomic:
            launches.append((cvt_plans, cvt_kernel, cvt_launch[0], cvt_launch[1], 0,
                             (acc[0], dq.arg, n_q, scale), 0, 2))
        for plans, kern, grid, threads, smem, args, looked_up_by, _arrays in launches:
            relaunch(plans, args[:looked_up_by], kern, grid, threads, call.stream, args,
                     sharedmem=smem, fast=config.fast_launch)
        repeat.record((q, k, v, out, lse, dout), (qi, ki, vi, oi, li, doi), lambda: [
            pointer_launch(kern, grid, threads, smem, args, range(arrays))
            for _plans, kern, grid, threads, smem, args, _by, arrays in launches])
        return dq.value(), dk.value(), dv.value()
    return run


def tensor_core_backward_refusal(problem, config, family, dtypes, head_dims, tiles):
    """Why a tensor-core backward (``family``, e.g. "the mma family") cannot run ``problem``,
    or None: `tensor_core_refusal`, tiles pinned by ``config`` (these backwards choose their
    own), or block-mask tiles ``tiles`` (None) that no kernel tile divides."""
    why = tensor_core_refusal(problem, family, dtypes, head_dims, window=True)
    if why:
        return why
    if config.block_q is not None or config.block_k is not None:
        return f"{family}'s backward chooses its own tiles (KernelConfig.block_q/block_k must be None)"
    if tiles is None:
        return (f"the block mask's tiles ({problem.block_q}, {problem.block_k}) must be "
                f"multiples of 16 for {family}'s backward")
    return None


def aligned_copy(t):
    """A contiguous copy of the torch tensor ``t`` in new memory, whose start the caching
    allocator aligns (``t.contiguous()`` would return a contiguous tensor unchanged, however
    its start is aligned)."""
    import torch
    return t.clone(memory_format=torch.contiguous_format)


# -- device constants ----------------------------------------------------------------------------
_CONSTS: dict = {}


def device_const(key, make):
    """Device copies of small host-built constants: ``make()`` returns a NumPy array or a tuple
    (whose NumPy arrays are copied, other items kept), built and copied once per (key, current
    device)."""
    key = (current_device_id(), key)
    hit = _CONSTS.get(key)
    if hit is None:
        from numba import cuda
        if len(_CONSTS) > 256:
            _CONSTS.clear()
        val = make()
        if isinstance(val, tuple):
            hit = tuple(cuda.to_device(x) if isinstance(x, np.ndarray) else x for x in val)
        else:
            hit = cuda.to_device(val)
        _CONSTS[key] = hit
    return hit


# -- one call ------------------------------------------------------------------------------------
class Call:
    """The host side of one kernel call on a validated `ioaware` problem (see the module
    docstring). ``stage_bfloat16``: bfloat16 operands are copied to float32 and float outputs
    computed in float32, cast back in `Output.value` (the CUDA-core kernels: Numba has no
    bfloat16 arrays). ``q``: this call's q when the problem is a template without tensors (a
    prepared forward, `prepare_tensor_core_forward`); its device and stream are the call's."""

    __slots__ = ("problem", "torch", "stream", "staged", "_torch", "q")

    def __init__(self, problem, stage_bfloat16=False, q=None):
        self.problem = problem
        self.q = problem.q if q is None else q        # the call's q: its device and stream
        self.torch = problem.kind == "torch"
        self._torch = None
        self.staged = False
        if self.torch:
            import torch
            self._torch = torch
            self.staged = stage_bfloat16 and problem.dtype == torch.bfloat16
            self.stream = launch_stream(self.q) if real_gpu() else 0
        else:
            self.stream = launch_stream() if real_gpu() else 0

    def input(self, x, words=False, aligned=False, word_bytes=2):
        """``x`` (an operand of the problem: q, k, v, out, dout, lse) as a kernel argument:
        ``words``: viewed as ``word_bytes``-byte integers (int16: the half-precision tensor-core
        kernels; int32, two elements each: the decoding kernel); ``aligned``: rows contiguous
        and 16-byte aligned (copied where they are not; what ``cp.async`` needs)."""
        if self.torch:
            torch = self._torch
            t = x.detach()
            if self.staged and t.dtype == torch.bfloat16:
                t = t.float()
            if aligned and (t.stride(-1) != 1 or t.data_ptr() % 16
                            or any(s * t.element_size() % 16 for s in t.stride()[:-1])):
                t = aligned_copy(t)
            return t.view(torch.int16 if word_bytes == 2 else torch.int32) if words else t
        from numba import cuda
        a = np.ascontiguousarray(x)
        return cuda.to_device(a.view(np.int16 if word_bytes == 2 else np.int32) if words else a)

    def mask(self):
        """The problem's boolean mask [1|B, 1|H, 1|Nq, Nk] as uint8 on the device with its
        broadcast flags: ``(mask, mask_b, mask_h, mask_q)`` (flag 1 = that dimension is not
        broadcast). Without a mask: a shared 1-element dummy and zero flags."""
        mask = self.problem.mask
        if mask is None:
            return device_const("no-mask", lambda: np.ones((1, 1, 1, 1), np.uint8)), 0, 0, 0
        shape = tuple(int(s) for s in mask.shape)
        if self.torch:
            maskd = mask.detach().to(self._torch.uint8).contiguous()   # launched in place
        else:
            from numba import cuda
            maskd = cuda.to_device(np.ascontiguousarray(mask, dtype=np.uint8))
        return maskd, int(shape[0] > 1), int(shape[1] > 1), int(shape[2] > 1)

    def output(self, shape, float32=False, words=False, zeros=False, like=None):
        """A new output array of ``shape``: float32, or the problem's dtype (float32 when
        staged; ``words``: passed to the kernel as int16). ``like``: a torch operand of this
        shape and dtype whose layout the output takes (`torch.empty_like`: its strides where it
        is dense, as a [B, N, H, d] tensor viewed as [B, H, N, d]; contiguous otherwise), for a
        kernel that writes through its output's strides. Returns an `Output`."""
        dtype = self.problem.dtype
        if self.torch:
            torch = self._torch
            dt = torch.float32 if (float32 or self.staged) else dtype
            if (like is not None and not zeros and like.dtype == dt
                    and tuple(like.shape) == tuple(shape)):
                t = torch.empty_like(like.detach())
                return Output(self, t, t.view(torch.int16) if words else t, float32)
            make = torch.zeros if zeros else torch.empty
            t = make(shape, dtype=dt, device=self.q.device)
            return Output(self, t, t.view(torch.int16) if words else t, float32)
        from numba import cuda
        dt = np.float32 if float32 else np.dtype(dtype)
        if zeros:
            d = cuda.to_device(np.zeros(shape, dt))
        else:
            d = cuda.device_array(shape, dtype=np.int16 if words else dt)
        return Output(self, d, d, float32, np.dtype(dt) if words else None)


class Output:
    """An output of a `Call`: ``arg`` is what the kernel takes, `value` what the caller gets."""

    __slots__ = ("call", "handle", "arg", "float32", "view_as")

    def __init__(self, call, handle, arg, float32, view_as=None):
        self.call, self.handle, self.arg, self.float32, self.view_as = (call, handle, arg,
                                                                        float32, view_as)

    def value(self, dtype=None):
        """The result in the caller's kind: a torch tensor (cast back to bfloat16 when staged,
        or to ``dtype``) or a NumPy array copied from the device."""
        call = self.call
        if call.torch:
            t = self.handle
            if dtype is not None:
                return t.to(dtype)
            if call.staged and not self.float32:
                return t.to(call._torch.bfloat16)
            return t
        a = self.handle.copy_to_host()
        return a.view(self.view_as) if self.view_as is not None else a


_PLAN_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def plan_workload(problem, pass_: str):
    """The `sim.workload.Workload` a family's plan (`sim.plans`) is built for, from a kernel
    problem. The launch shape (grid, threads, shared memory) depends only on the sizes, dtype
    and flags, which it always carries; what a workload cannot describe (a boolean mask or bias,
    a block mask, per-sequence cache lengths, bottom-right causal alignment with ``seqlen_q !=
    seqlen_k``) is left out of the plan's counts."""
    from sim.workload import Workload
    pb = problem
    bottom_right = pb.causal and pb.causal_alignment == "bottom_right" and pb.seqlen_q != pb.seqlen_k
    window = pb.window_size
    if window is not None and tuple(window) == (-1, -1):
        window = None
    sizes = dict(batch=pb.batch, heads=pb.heads_q, seq_len_q=pb.seqlen_q, head_dim=pb.head_dim,
                 dtype=_PLAN_DTYPES.get(pb.dtype_name, "fp32"), seq_len_k=pb.seqlen_k,
                 heads_kv=pb.heads_kv, dropout=pb.dropout_p > 0, pass_=pass_)
    try:
        return Workload(**sizes, causal=pb.causal and not bottom_right,
                        window_size=None if bottom_right else window)
    except ValueError:      # a band the workload cannot hold: the sizes alone
        return Workload(**sizes)


def family_plan(family: str, pass_: str, problem, **config):
    """`sim.plans.plan_for` of a kernel problem's workload (:func:`plan_workload`): the plan
    family ``family`` launches for its pass ``pass_`` with ``config`` (built once per workload
    and config)."""
    from sim.plans import plan_for
    return plan_for(family, pass_, plan_workload(problem, pass_), **config)
