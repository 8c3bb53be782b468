"""What the packer checks before it writes: room on the disk, and each record it is handed.

``check_free_space`` refuses a pack that cannot fit before it starts; ``PackWriter``
checks each record's size, geometry and target vector, raising a one-line error
naming the record's source path before any byte of it is written.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from imgpack.errors import InvalidArgumentError, PackError, SourceError
from imgpack.format.fields import RecordGeometry
from imgpack.packer.inspect import human_bytes

__all__ = ["check_free_space", "check_size", "check_geometry", "check_target"]


def check_free_space(folder: str | os.PathLike, needed: int, *, what: str = "pack") -> None:
    """Refuse to start a write that cannot fit, instead of failing at 97%."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        need, have = human_bytes(needed), human_bytes(free)
        if need == have:  # too close to tell apart at 3 digits
            need, have = f"{needed:,} bytes", f"{free:,} bytes"
        raise PackError(f"{folder}: the {what} needs {need} but only {have} is free")


def check_size(relpath: str, size: Any, width: int, height: int) -> tuple[int, int]:
    """(width, height) of a record: whole numbers within the bound ``width`` x ``height``."""
    try:
        w, h = (int(v) for v in size)
        ok = all(int(v) == v for v in size)
    except (TypeError, ValueError):
        ok = False
    if not ok or not (1 <= w <= width and 1 <= h <= height):
        raise InvalidArgumentError(
            f"{relpath}: record size {size!r} is not (width, height) within the bound "
            f"{width}x{height}"
        )
    return w, h


def check_geometry(relpath: str, geometry: RecordGeometry | None) -> None:
    """None, or ((width, height), source box, content box) with a positive size."""
    if geometry is None:
        return
    try:
        size, sbox, cbox = geometry
        ok = (
            len(size) == 2
            and all(not isinstance(v, bool) and v == int(v) and 0 < v < 2**32 for v in size)
            and len(sbox) == 4
            and len(cbox) == 4
            and all(isinstance(float(v), float) for v in (*sbox, *cbox))
        )
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(
            f"{relpath}: geometry {geometry!r} is not ((width, height), source box, "
            f"content box) with a positive size and boxes of 4 numbers"
        )


def check_target(relpath: str, target: Sequence[float] | None, k: int) -> None:
    """K numbers when the pack holds K per record; None when it holds none (K = 0)."""
    if target is not None:
        try:
            np.asarray(target, dtype=np.float32)
        except (TypeError, ValueError):
            raise SourceError(f"{relpath}: target vector {target!r} is not numbers") from None
    if (target is None) != (k == 0) or (target is not None and len(target) != k):
        got = "none" if target is None else f"{len(target)} values"
        raise SourceError(f"{relpath}: target vector has {got}, the pack holds {k} per record")
