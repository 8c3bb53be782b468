"""The reader's kernels compiled by numba: the ``cpu`` extra, through ``imgpack.jit``.

``normalise_rows``: the CPU normalise of a batch of crops (``transform.normalise``) in one
pass, uint8 in, float32 out, each value ``float32(x) * scale + shift`` rounded after the
product and after the sum, as torch's copy, ``mul_`` and ``add_`` round: the same bits
(tests/reader/test_normalise.py). torch's three passes each split over its intra-op
threads, which on a CPU whose cores are busy reading the next batch cost two to four times
this single pass with the GIL released.
"""

from __future__ import annotations

import numpy as np

from imgpack.jit import kernel

__all__ = ["normalise_rows"]


@kernel
def normalise_rows(src, scale, shift, out):
    """uint8 (R, N) ``src`` -> float32 (R, N) ``out``: ``src * scale + shift``, ``scale`` and
    ``shift`` float32 (N,) rows (each channel's constant repeated along the row)."""
    for i in range(src.shape[0]):
        s, o = src[i], out[i]
        for j in range(s.shape[0]):
            o[j] = np.float32(s[j]) * scale[j] + shift[j]
