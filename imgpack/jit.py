"""imgpack's optional compiled code (the ``cpu`` extra), where it runs; else None.

Two libraries: numba compiles imgpack's kernels (``kernel``), and OpenCV resamples the
CPU's enlarged crops (``imgpack.reader.warp``). Each such module imports its library at
its top, so importing it fails where the library is missing; ``compiled(name, switch)``
imports it once and hands it out, or None, and the caller falls back to its numpy or torch
path, which keeps the same contract. ``switch=0`` in the environment (``IMGPACK_NUMBA``,
``IMGPACK_OPENCV``; read at each call, so a test or a user can switch) turns the module off.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from types import ModuleType

__all__ = ["compiled", "kernel"]

_MODULES: dict[str, ModuleType | None] = {}
_LOCK = threading.Lock()


def compiled(name: str, switch: str = "IMGPACK_NUMBA") -> ModuleType | None:
    """The module ``name`` (e.g. ``"imgpack.format.compiled"``), or None where its library
    is missing, numba's compiler is disabled, it fails to import, or ``switch=0``."""
    if os.environ.get(switch, "1") == "0":
        return None
    if name not in _MODULES:
        with _LOCK:
            if name not in _MODULES:
                _MODULES[name] = _load(name)
    return _MODULES[name]


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:  # no library (or numba's compiler disabled): the fallback, as documented
        return None
    except Exception as exc:  # a library that cannot run here must not stop a read
        warnings.warn(f"{name} failed to load ({exc}); imgpack runs it in numpy or torch",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
        return None


def kernel(fn):
    """``fn`` compiled by numba, releasing the GIL, its machine code cached on disk for the
    next process (where numba may write a cache: else compiled in each process). For kernel
    modules only (they import numba); ImportError where numba's compiler is disabled
    (``NUMBA_DISABLE_JIT=1``), whose kernels would run as Python, 100x slower."""
    import numba

    if numba.config.DISABLE_JIT:
        raise ImportError("numba's compiler is disabled (NUMBA_DISABLE_JIT)")
    try:
        return numba.njit(nogil=True, cache=True)(fn)
    except RuntimeError:  # no directory numba may write its cache in
        return numba.njit(nogil=True)(fn)
