"""The per-record arrays of ``PackedImageDataset``, and its reads of one record's bytes
and source path, as one base class beside its reading code.

Each array is read once on first use, from every pack in dataset order, and is read-only
(``records.Columns``); none is pickled to workers, which read them again on first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from imgpack.reader import records
from imgpack.reader.indices import _batch_indices, _index
from imgpack.reader.mapping import PackMapping

__all__ = ["RecordArrays"]


class RecordArrays:
    """Record sizes and stored lengths, the geometry fields (version 2), target vectors and
    labels of the records of ``_packs``, ImageFolder's ``targets``/``samples``, and each
    record's stored bytes (``encoded``) and source file (``source_path``)."""

    _packs: Sequence[PackMapping]
    _starts: np.ndarray
    _columns: records.Columns
    path: str

    @property
    def record_sizes(self) -> np.ndarray:
        """int64 (N, 2): (width, height) of each record as stored (all (W, H) before v3)."""
        return self._columns.record_sizes()

    @property
    def record_lengths(self) -> np.ndarray:
        """int64 (N,): bytes of each record as stored (a jpeg record's own length)."""
        return self._columns.record_lengths()

    @property
    def source_sizes(self) -> np.ndarray:
        """int64 (N, 2): (width, height) of each record's source image after EXIF rotation."""
        return self._columns.geometry()[0]

    @property
    def source_boxes(self) -> np.ndarray:
        """float32 (N, 4): (left, top, right, bottom) in source pixels that each record shows."""
        return self._columns.geometry()[1]

    @property
    def content_boxes(self) -> np.ndarray:
        """float32 (N, 4): (left, top, right, bottom) in record pixels where that part lies."""
        return self._columns.geometry()[2]

    @property
    def target_vectors(self) -> np.ndarray | None:
        """float32 (N, K): each record's target vector; None when the packs have none."""
        return self._columns.target_vectors()

    @property
    def labels(self) -> np.ndarray:
        """Every label as one read-only int64 array (read from the files, not the mappings)."""
        return self._columns.labels()

    @property
    def targets(self) -> list[int]:
        """Every label as a list of ints, as ImageFolder has it (``labels`` is the numpy form).

        Built on first use, from one shared int object per class, so it costs one
        pointer per record; it is not pickled to workers.
        """
        return self._columns.targets()

    @property
    def samples(self) -> records.SourceSamples:
        """(source path, label) per record, read on access (ImageFolder's ``samples``)."""
        return records.SourceSamples(self._packs, self._starts, self.labels, self.path)

    imgs = samples  # ImageFolder's older name for the same list

    def encoded(self, indices: Any) -> np.ndarray | list[np.ndarray]:
        """Each record's stored bytes (a jpeg stream), zero-copy uint8 views of the mapping:
        what a decoder elsewhere (a GPU's) takes. A sequence of indices gives a list; one
        integer, as ``ds[i]`` takes, gives that record's array alone (the dimension drops,
        as in numpy indexing)."""
        if np.ndim(indices) == 0:
            j = _index(indices, len(self))
            return records.encoded(self._packs, self._starts, np.array([j], dtype=np.intp))[0]
        return records.encoded(self._packs, self._starts, _batch_indices(indices, len(self)))

    def source_path(self, i: Any) -> str:
        """Record ``i``'s source file, relative to the folder that was packed."""
        return records.source_path(self._packs, self._starts, _index(i, len(self)))
