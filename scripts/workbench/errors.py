"""The bench's own errors: a benchmark or the GPU proof cannot run as asked.

They are not imgpack's: the installed package never raises them. Both subclass
``ImgpackError`` so that every script's ``except ImgpackError`` reports them the same
way as the library's refusals, as one line and a non-zero exit.
"""

from __future__ import annotations

from imgpack.errors import ImgpackError

__all__ = ["BenchError", "ProofError"]


class BenchError(ImgpackError):
    """A benchmark cannot run as asked (a work folder it did not make, bad sizes or counts)."""


class ProofError(ImgpackError):
    """The GPU proof cannot run as asked (no CUDA device, an output path that is a file)."""
