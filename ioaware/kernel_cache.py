"""Where compiled kernels are kept between processes (`kernels.compile_cache` stores them).

A kernel configuration compiles once per machine: its cubin is written under the cache
directory and later processes load it instead of compiling (seconds become milliseconds).
The directory is, in order:

1. the one given to `set_kernel_cache_dir` (None turns the cache off);
2. ``IOAWARE_CACHE_DIR`` from the environment (empty: off);
3. ``$XDG_CACHE_HOME/ioaware/kernels``, else ``~/.cache/ioaware/kernels``.

It is applied when ``ioaware`` first runs a kernel (`kernels`), or at once when kernels are
already in use. ``python -m ioaware cache`` shows it, ``--clear`` empties it, and
``python -m ioaware precompile`` fills it with the common configurations. Compiles are logged
on the ``ioaware.kernels`` logger at INFO.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["set_kernel_cache_dir", "kernel_cache_dir", "default_kernel_cache_dir", "ENV_VAR"]

#: The environment variable that names the directory ("" turns the cache off).
ENV_VAR = "IOAWARE_CACHE_DIR"

_UNSET = object()
_explicit = _UNSET


def default_kernel_cache_dir() -> Path | None:
    """The directory the environment gives (see the module docstring), None when turned off."""
    value = os.environ.get(ENV_VAR)
    if value is not None:
        return Path(value).expanduser().resolve() if value.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base).expanduser().resolve() / "ioaware" / "kernels"


def kernel_cache_dir() -> Path | None:
    """The directory compiled kernels go to, None when the cache is off."""
    return default_kernel_cache_dir() if _explicit is _UNSET else _explicit


def set_kernel_cache_dir(path) -> None:
    """Keep compiled kernels under ``path`` (a str or Path; None: do not cache them on disk)."""
    global _explicit
    _explicit = None if path is None else Path(path).expanduser().resolve()
    if "kernels.compile_cache" in sys.modules:
        _apply()


def _apply() -> None:
    from kernels import compile_cache
    compile_cache.set_directory(kernel_cache_dir())


def kernels():
    """The `kernels` package, its compiled-kernel cache directory set (once per process)."""
    global _package
    if _package is None:
        import kernels as package
        _apply()
        _package = package
    return _package


_package = None
