"""The protocol between imgpack and a dataset: who is a PackedSource, and what the others get."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import InProcessOptions
from imgpack.reader.protocol import PackedSource, RecordShape, SourceGeometry


class Listed(torch.utils.data.Dataset):
    """A foreign map-style dataset with torch's batched ``__getitems__``: it records calls."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        raise AssertionError("torch's fetcher asks __getitems__ first")

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [(torch.full((2,), float(i)), i) for i in indices]


def test_one_pack_and_many_are_packed_sources_with_shape_and_geometry(make_pack):
    a, _, _ = make_pack(count=3, name="a")
    b, _, _ = make_pack(count=4, name="b")
    for ds in (PackedImageDataset(a), PackedImageDataset([a, b])):
        assert all(isinstance(ds, p) for p in (PackedSource, RecordShape, SourceGeometry))
        assert ds.shard_sizes == ((3,) if len(ds) == 3 else (3, 4))
    for other in ([1, 2], torch.utils.data.TensorDataset(torch.arange(3)), Listed(3)):
        assert not any(isinstance(other, p) for p in (PackedSource, RecordShape, SourceGeometry))


@pytest.mark.parametrize("kw", [{}, {"num_workers": 0}, {"options": InProcessOptions()}])
def test_a_foreign_dataset_is_fetched_as_torch_fetches_it(kw):
    ds = Listed(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "sample by sample" warning
        loader = make_loader(ds, 4, shuffle=False, **kw)
    got = [(x[:, 0].tolist(), y.tolist()) for x, y in loader]
    assert got == [([0, 1, 2, 3], [0, 1, 2, 3]), ([4, 5, 6, 7], [4, 5, 6, 7]), ([8, 9], [8, 9])]
    if kw:  # in this process (with {}, worker processes made the calls on their copies)
        assert ds.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # one __getitems__ per batch


def test_many_packs_have_no_single_index_and_say_where_they_are(make_pack):
    a, _, _ = make_pack(count=3, name="a")
    b, _, _ = make_pack(count=4, name="b")
    ds = PackedImageDataset([a, b])
    with pytest.raises(AttributeError, match=r"2 packs has one index per shard: see ds\.indexes"):
        ds.index  # noqa: B018
    assert [ix.count for ix in ds.indexes] == [3, 4]
    loader = make_loader(ds, 2, seed=0)  # the loader never asks for ds.index
    assert loader.state_dict()["pack_id"] == ds.pack_id and len(ds.pack_id) == 32
    assert sum(len(y) for _, y in loader) == 7 and np.all(ds.labels >= 0)
