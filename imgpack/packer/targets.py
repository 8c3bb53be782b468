"""Per-record target vectors handed to ``pack_folder``: checked once, in pack order.

``targets`` maps a source file's path relative to SRC (as discovery spells it,
"/"-separated) to K numbers; every file packed needs one, all of one length K.
Paths the mapping names but the pack does not hold (other shards, other splits)
are ignored. The vectors are stored as float32 (the ``targets`` record field).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from imgpack.errors import SourceError

__all__ = ["targets_for", "targets_digest"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def targets_for(
    files: list[tuple[str, int]], targets: Mapping[str, Sequence[float]] | None
) -> list[tuple[float, ...]] | None:
    """Each file's target vector, in pack order, as K floats; SourceError names a bad one."""
    if targets is None:
        return None
    out, k = [], None
    for rel, _ in files:
        t = targets.get(rel)
        if t is None:
            raise SourceError(f"{rel}: no target vector given (every file packed needs one)")
        try:
            values = tuple(float(v) for v in t)
        except (TypeError, ValueError):
            raise SourceError(f"{rel}: target vector {t!r} is not a sequence of numbers") from None
        k = len(values) if k is None else k
        if len(values) != k or not values:
            raise SourceError(
                f"{rel}: target vector has {len(values)} values, the first file's has {k}"
            )
        if not all(abs(v) <= _FLOAT32_MAX for v in values):  # False for NaN too
            raise SourceError(f"{rel}: target vector {t!r:.60} is not finite as float32")
        out.append(values)
    return out


def targets_digest(targets: list[tuple[float, ...]] | None) -> str | None:
    """What the run's recipe pins about the target vectors: their float32 bytes."""
    if targets is None:
        return None
    return hashlib.sha256(np.asarray(targets, dtype="<f4").tobytes()).hexdigest()
