"""Kernels built once per process, compiled once per machine: the on-disk cache of cubins.

A kernel configuration is built by a module's builder (``_build_kernel(head_dim, block_q, ...)``)
through `built`, which keeps one dispatcher per (builder, arguments) in the process and stamps it
with ``build_key``: the builder's module and name and its arguments. The first launch of a
stamped kernel with a given argument signature (`kernels.host.launch`) asks this module for a
compiled image before it asks Numba to compile: an `Entry` (the linked cubin, its entry point's
name and the argument types its launch marshals) stored under a key that hashes everything the
machine code depends on:

* the kernel sources: every ``kernels/*.py`` and the modules outside ``kernels/`` whose
  functions the kernels call or whose constants they bake in (`CODE_DEPENDENCIES`),
* the build key and the argument signature (each array's dtype, rank and layout, each scalar's
  type),
* the compute capability, and the versions of Numba, numba-cuda and NVVM.

Change any of them and the key changes: a stale image is never found, only left behind. Files
are written whole (to a temporary name, then renamed), so concurrent processes share a
directory safely; an unreadable file is a miss and is rewritten.

The cache is off until a directory is set (`set_directory`): the kernels read no environment.
``ioaware`` sets it on first use (``IOAWARE_CACHE_DIR``, else the user's cache directory; see
`ioaware.set_kernel_cache_dir`). Each compile and each load is logged on the ``ioaware.kernels``
logger (INFO: compiles, with their seconds; DEBUG: loads).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import tempfile
from pathlib import Path

__all__ = ["built", "set_directory", "directory", "entry_key", "Entry", "load", "store",
           "source_fingerprint", "CODE_DEPENDENCIES", "FORMAT"]

#: Bumped when the stored format changes.
FORMAT = 1
#: Modules outside ``kernels/`` that the kernel modules import: whose code the kernels compile
#: in (device helpers, constants, tile rules) or that choose their launches (`sim.profiles`:
#: the decoding launcher's GPU profile); their sources are part of every key.
CODE_DEPENDENCIES = ("ioaware.block_info", "ioaware.dropout", "ioaware.launch_order",
                     "sim.tiles", "sim.decode", "sim.plans.tensor_core_fwd", "sim.workload",
                     "sim.plans.tensor_core_bwd", "sim.plans.simt", "sim.plans",
                     "sim.plans.wgmma_bwd", "sim.plans.wgmma_fwd", "sim.profiles")

log = logging.getLogger("ioaware.kernels")

_BUILT: dict = {}
_DIRECTORY: Path | None = None


def built(builder, *args):
    """``builder(*args)`` (a kernel dispatcher with its launch attributes), built once per
    process and stamped with ``build_key`` = (module, builder name, args): the identity of its
    code in the on-disk cache. ``args`` must have a stable ``repr`` (ints, bools, strings,
    frozen dataclasses)."""
    ident = (builder.__module__, builder.__qualname__, args)
    kern = _BUILT.get(ident)
    if kern is None:
        kern = builder(*args)
        kern.build_key = ident
        _BUILT[ident] = kern
    return kern


def set_directory(path) -> None:
    """Store compiled kernels under ``path`` (an absolute path, created when first written);
    None turns the cache off."""
    global _DIRECTORY
    _DIRECTORY = None if path is None else Path(path)


def directory() -> Path | None:
    """The cache directory, or None when the cache is off."""
    return _DIRECTORY


@functools.lru_cache(maxsize=None)
def source_fingerprint() -> str:
    """SHA-256 of the kernels' code: every ``kernels/*.py`` and the `CODE_DEPENDENCIES`."""
    import importlib
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py"))
    files += [Path(importlib.import_module(m).__file__).resolve() for m in CODE_DEPENDENCIES]
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _toolchain() -> tuple:
    """The versions that decide the machine code besides the sources."""
    import numba
    try:
        from numba.cuda.cudadrv.nvvm import NVVM
        nvvm = tuple(NVVM().get_version())
    except Exception:       # no NVVM (the simulator): nothing is compiled anyway
        nvvm = None
    try:
        from importlib.metadata import version
        numba_cuda = version("numba-cuda")
    except Exception:
        numba_cuda = None
    return (numba.__version__, numba_cuda, nvvm)


def entry_key(build_key, signature, cc) -> str:
    """The file name (hex) of one compiled kernel: its ``build_key``, argument ``signature``
    (`kernels.host.signature_key` without the dispatcher) and compute capability ``cc``."""
    text = repr((FORMAT, source_fingerprint(), _toolchain(), tuple(cc), build_key, signature))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Entry:
    """One compiled kernel: the linked ``cubin``, the ``entry_name`` of its kernel function,
    the Numba ``argument_types`` it was compiled for (how its launch marshals arguments) and a
    readable ``label`` (builder and arguments)."""
    cubin: bytes
    entry_name: str
    argument_types: tuple
    label: str = ""


def _path(key: str) -> Path | None:
    return None if _DIRECTORY is None else _DIRECTORY / f"{key}.kernel"


def load(key: str) -> Entry | None:
    """The stored entry of ``key``, or None (no cache, no file, or an unreadable file)."""
    path = _path(key)
    if path is None or not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
        if not isinstance(entry, Entry):
            raise TypeError(type(entry).__name__)
    except Exception as exc:                      # a torn or foreign file: a miss
        log.warning("ignoring unreadable compiled kernel %s (%s)", path, exc)
        return None
    log.debug("loaded %s from %s", entry.label, path)
    return entry


def store(key: str, entry: Entry) -> None:
    """Write ``entry`` under ``key`` (whole or not at all); a read-only or full disk only
    logs a warning."""
    path = _path(key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".kernel")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("could not write compiled kernel to %s (%s)", path, exc)
