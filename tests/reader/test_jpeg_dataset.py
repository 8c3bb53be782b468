"""A jpeg pack read as a stranger would: ds[i], gather, make_loader, and a plain
torch DataLoader with the default collate, its records compared with Pillow's decode of the
bytes in the file."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import photo_like, write_image
from packs_v3 import BOUND, SIZES, write_v3
from PIL import Image
from torch.utils.data import DataLoader

from imgpack.format.index import read_index
from imgpack.packer.pack import pack_folder
from imgpack.packer.writer import PackWriter
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import InProcessOptions


def stored(out: Path) -> list[bytes]:
    """Every record's bytes, read from the .bin with the format module alone."""
    index = read_index(out)
    raw = np.fromfile(index.data_path, dtype=np.uint8)[index.data_offset :]
    cuts = index.record_offsets
    return [raw[a:b].tobytes() for a, b in zip(cuts[:-1], cuts[1:])]


def pillow(data: bytes, channels: int = 3) -> np.ndarray:
    image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB" if channels == 3 else "L"))
    return image if image.ndim == 3 else image[..., None]


@pytest.fixture
def fit_pack(tmp_path):
    out, _, labels = write_v3(tmp_path / "fit.bin", codec="jpeg")
    return out, labels


@pytest.fixture
def crop_pack(tmp_path):
    """A center-crop jpeg pack from JPEG files: every record 24x24, as a stranger packs it."""
    src = tmp_path / "src"
    for i in range(10):
        write_image(src / "ab"[i % 2] / f"{i}.jpg", 40 + 3 * i, 30 + i, seed=i)
    out = tmp_path / "crop.bin"
    pack_folder(src, out, size=(24, 24), resize="center-crop", codec="jpeg", progress=False)
    return out


def test_ds_i_is_pillows_decode_of_the_stored_bytes(fit_pack):
    out, labels = fit_pack
    ds = PackedImageDataset(out)
    assert ds.codec == "jpeg"
    data = stored(out)
    for i, (w, h) in enumerate(SIZES):
        image, label = ds[i]
        assert image.dtype == torch.uint8 and tuple(image.shape) == (3, h, w)
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), pillow(data[i]))
        assert label == labels[i]


def test_an_index_out_of_range_or_not_an_integer_is_refused_as_torch_does(fit_pack):
    ds = PackedImageDataset(fit_pack[0])
    n = len(ds)
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match=f"^index {bad} is out of range for a pack of {n} "):
            ds[bad]
    with pytest.raises(TypeError, match="^dataset indices must be integers, not float$"):
        ds[2.0]


def test_getitems_decodes_in_threads_the_same_samples(fit_pack):
    ds = PackedImageDataset(fit_pack[0])
    order = [7, 1, 4, 4, 0, -1]
    for (a, la), (b, lb) in zip(ds.__getitems__(order), [ds[i] for i in order]):
        assert torch.equal(a, b) and la == lb


def test_gather_pads_each_decoded_record_and_overwrites_a_reused_buffer(fit_pack):
    out, labels = fit_pack
    ds = PackedImageDataset(out)
    idx = np.array([3, 0, 7, 4, 1, 6, 2, 5])
    images, got_labels = ds.gather(idx)
    h, w = BOUND
    assert tuple(images.shape) == (8, 3, h, w)
    assert images.is_contiguous(memory_format=torch.channels_last)
    for row, i in enumerate(idx):
        rw, rh = SIZES[i]
        assert torch.equal(images[row, :, :rh, :rw], ds[int(i)][0])
        assert not images[row, :, rh:].any() and not images[row, :, :, rw:].any()
    assert got_labels.tolist() == labels[idx].tolist()
    seen = []

    def keep(images, records):  # T(images, records): the records of each batch
        seen.append(records.clone())
        return images

    loader = make_loader(ds, 3, seed=4, transform=keep)
    for _epoch in range(3):  # the loader's buffers come back, full of an older batch
        for images, got in loader:
            assert torch.equal(images, ds.gather(seen[-1])[0])
            assert got.tolist() == labels[seen[-1].numpy()].tolist()


def test_a_grayscale_jpeg_pack(tmp_path):
    out = tmp_path / "gray.bin"
    records = [photo_like(w, h, seed=k)[..., :1] for k, (w, h) in enumerate(SIZES)]
    with PackWriter(out, height=16, width=20, classes=["a"], channels=1, codec="jpeg") as wr:
        for k, rec in enumerate(records):
            wr.append(rec, 0, f"a/{k}.png")
        wr.finish(packer={"size": [20, 16], "resize": "fit", "filter": "bilinear"})
    ds = PackedImageDataset(out)
    data = stored(out)
    images, _ = ds.gather(np.arange(len(ds)))
    assert tuple(images.shape) == (len(SIZES), 1, 16, 20)
    for i, (w, h) in enumerate(SIZES):
        np.testing.assert_array_equal(ds[i][0].permute(1, 2, 0).numpy(), pillow(data[i], 1))
        assert torch.equal(images[i, :, :h, :w], ds[i][0])


def test_many_jpeg_packs_are_one_dataset(tmp_path):
    a, _, _ = write_v3(tmp_path / "a.bin", codec="jpeg", seed=0)
    b, _, _ = write_v3(tmp_path / "b.bin", codec="jpeg", seed=50)
    ds, parts = PackedImageDataset([a, b]), [PackedImageDataset(a), PackedImageDataset(b)]
    n = len(SIZES)
    idx = np.array([n + 1, 0, n + 7, 3, n])
    images, _ = ds.gather(idx)
    for row, i in enumerate(idx.tolist()):
        part, k = parts[i // n], i % n
        w, h = SIZES[k]
        assert torch.equal(images[row, :, :h, :w], part[k][0])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_with_the_default_collate(crop_pack, workers):
    ds = PackedImageDataset(crop_pack)
    data = stored(crop_pack)
    kw = {"num_workers": workers, "persistent_workers": False} if workers else {}
    loader = DataLoader(ds, batch_size=4, shuffle=False, **kw)
    kept = list(loader)  # batches kept in a list: each its own memory
    snapshot = [x.clone() for x, _ in kept]
    assert [tuple(x.shape) for x in snapshot] == [(4, 3, 24, 24), (4, 3, 24, 24), (2, 3, 24, 24)]
    images = torch.cat(snapshot)
    labels = torch.cat([y for _, y in kept])
    for i in range(len(ds)):
        np.testing.assert_array_equal(images[i].permute(1, 2, 0).numpy(), pillow(data[i]))
    assert labels.tolist() == ds.labels.tolist()
    for _ in DataLoader(ds, batch_size=3, shuffle=True, **kw):
        pass  # another pass writes nowhere near the kept batches
    assert all(torch.equal(x, s) for (x, _), s in zip(kept, snapshot))


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "loader-thread"])
def test_make_loader_batches_kept_in_a_list_stay_intact(crop_pack, threaded, monkeypatch):
    ds = PackedImageDataset(crop_pack)
    loader = make_loader(ds, 3, seed=1, options=InProcessOptions(prefetch=2 if threaded else 0))
    kept = [b for _ in range(3) for b in loader]  # three epochs, every batch kept
    snapshot = [(x.clone(), y.clone()) for x, y in kept]
    for _ in range(2):
        for _ in loader:
            pass
    for (x, y), (x0, y0) in zip(kept, snapshot):
        assert torch.equal(x, x0) and torch.equal(y, y0)
        assert torch.equal(x, ds.gather(rows_of(ds, x))[0])  # whole records, none torn


def rows_of(ds, images):
    """The records a batch holds, found by their pixels (each record is distinct)."""
    every, _ = ds.gather(np.arange(len(ds)))
    return [int(next(i for i in range(len(ds)) if torch.equal(every[i], im))) for im in images]
