"""The yuv420 back-conversion compiled by numba: the ``cpu`` extra, through ``imgpack.jit``.

numpy converts a record in about ten passes over its pixels, each allocating, and threads
that run it barely scale (the GIL is taken back between passes). Compiled, a record is one
pass: each chroma row's offsets are computed once (the format's binary fixed point, handed
in by ``codec.yuv420_to_rgb``, so this module holds no coefficient of its own) as the bounds
and addend of a uint8 clip, ``min(max(Y, lo), hi) + o``, which the compiler vectorises; the
GIL is released for the whole record. It writes the same bytes as numpy on every input
(tests/test_codec.py checks all 2**24 (Y, Cb, Cr)). numba compiles it on first
use, a few seconds, and caches the machine code on disk for the next process.
"""

from __future__ import annotations

import numba
import numpy as np

from imgpack.jit import kernel

__all__ = ["yuv420_into"]

_inline = numba.njit(nogil=True, inline="always")


@_inline
def _bounds(cb, cr, fixed, lo, hi, add, tmp):
    """One chroma row's (lo, hi, o) per channel, each written twice (its two columns)."""
    n, shift = cb.shape[0], np.int32(fixed[9])
    for k in range(3):
        a, b, c = np.int32(fixed[3 * k]), np.int32(fixed[3 * k + 1]), np.int32(fixed[3 * k + 2])
        t, lo_k, hi_k, add_k = tmp, lo[k], hi[k], add[k]
        for j in range(n):  # every term fits int32 (codec.CHROMA_FIXED_POINT)
            t[j] = (a * np.int32(cb[j]) + b * np.int32(cr[j]) + c) >> shift
        for j in range(n):  # clip(Y + o, 0, 255) == min(max(Y, lo), hi) + o, mod 256
            o = t[j]
            u, z, s = np.uint8(max(-o, 0)), np.uint8(255 - max(o, 0)), np.uint8(o & 255)
            lo_k[2 * j], lo_k[2 * j + 1] = u, u
            hi_k[2 * j], hi_k[2 * j + 1] = z, z
            add_k[2 * j], add_k[2 * j + 1] = s, s


@_inline
def _plane_row(y, lo, hi, add, out):
    """One channel of one row into contiguous bytes."""
    for j in range(y.shape[0]):
        out[j] = np.uint8(min(max(y[j], lo[j]), hi[j]) + add[j])


@_inline
def _pixel_row(y, lo, hi, add, out, col, plane):
    """Every channel of one row, pixel by pixel, at any strides."""
    for j in range(y.shape[0]):
        for k in range(3):
            out[j * col + k * plane] = np.uint8(min(max(y[j], lo[k, j]), hi[k, j]) + add[k, j])


@kernel
def yuv420_into(stored, width, height, fixed, flat, row, col, plane):
    """A record's stored bytes (1-D uint8) -> its RGB in ``flat``.

    ``fixed``: int64 (10,), ``codec.CHROMA_FIXED_POINT`` flattened (a, b, c for R, G, B,
    then the shift; a channel adds ``(a Cb + b Cr + c) >> shift`` to Y). ``flat``: a 1-D
    uint8 view of the output's memory, pixel (i, j) channel k at ``i * row + j * col + k *
    plane`` (element strides, all positive).
    """
    cw, ch = (width + 1) // 2, (height + 1) // 2
    n, m = width * height, cw * ch
    lo = np.empty((3, 2 * cw), np.uint8)
    hi = np.empty((3, 2 * cw), np.uint8)
    add = np.empty((3, 2 * cw), np.uint8)
    tmp = np.empty(cw, np.int32)
    for ci in range(ch):
        at = n + ci * cw
        _bounds(stored[at : at + cw], stored[at + m : at + m + cw], fixed, lo, hi, add, tmp)
        for i in range(2 * ci, min(2 * ci + 2, height)):
            y = stored[i * width : (i + 1) * width]
            if col == 1:  # channel planes: each row contiguous
                for k in range(3):
                    s = i * row + k * plane
                    _plane_row(y, lo[k], hi[k], add[k], flat[s : s + width])
            elif col == 3 and plane == 1:  # interleaved RGB: constant strides vectorise
                _pixel_row(y, lo, hi, add, flat[i * row :], 3, 1)
            else:
                _pixel_row(y, lo, hi, add, flat[i * row :], col, plane)
