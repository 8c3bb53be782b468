"""Record fields as the reader exposes them: geometry, targets, channels, the pack identity."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import synthetic_records
from torch.utils.data import DataLoader

from imgpack.errors import FormatError, PackChangedError
from imgpack.format.fields import RecordGeometry
from imgpack.format.index import read_index
from imgpack.format.layout import pack_paths
from imgpack.packer.writer import PackWriter
from imgpack.reader.dataset import PackedImageDataset


def _write(out: Path, count=4, *, channels=3, k=0, seed=0, h=4, w=6) -> tuple[Path, dict]:
    """A pack with known geometry (and target vectors when ``k``); returns what went in."""
    rng = np.random.default_rng(seed)
    pixels = synthetic_records(count, h, w) + seed
    if channels == 1:
        pixels = pixels[..., :1]
    sizes = rng.integers(1, 5000, (count, 2))
    sboxes = rng.uniform(0, 100, (count, 4)).astype(np.float32)
    cboxes = rng.uniform(0, 4, (count, 4)).astype(np.float32)
    targets = rng.normal(size=(count, k)).astype(np.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    with PackWriter(
        out, height=h, width=w, classes=["a", "b"], channels=channels, target_dim=k
    ) as wr:
        for i in range(count):
            geo = RecordGeometry(tuple(sizes[i]), tuple(sboxes[i]), tuple(cboxes[i]))
            wr.append(
                pixels[i], i % 2, f"x/{i}.png", geometry=geo, target=targets[i] if k else None
            )
        wr.finish(packer={"size": [w, h], "resize": "stretch", "filter": "bilinear"})
    return out, {"pixels": pixels, "sizes": sizes, "sboxes": sboxes, "cboxes": cboxes, "t": targets}


def test_single_pack_exposes_every_record_array(tmp_path):
    path, want = _write(tmp_path / "p.bin", k=3)
    ds = PackedImageDataset(path)
    assert ds.source_sizes.dtype == np.int64 and ds.source_sizes.shape == (4, 2)
    np.testing.assert_array_equal(ds.source_sizes, want["sizes"])
    assert ds.source_boxes.dtype == ds.content_boxes.dtype == np.float32
    np.testing.assert_array_equal(ds.source_boxes, want["sboxes"])
    np.testing.assert_array_equal(ds.content_boxes, want["cboxes"])
    assert ds.target_vectors.dtype == np.float32 and ds.target_vectors.shape == (4, 3)
    np.testing.assert_array_equal(ds.target_vectors, want["t"])
    assert ds.channels == 3 and ds.pack_id == read_index(path).pack_id
    assert len(ds.pack_id) == 32
    for a in (ds.source_sizes, ds.source_boxes, ds.target_vectors):
        assert not a.flags.writeable
    assert ds.source_boxes is ds.source_boxes  # read once


def test_a_pack_without_geometry_reads_each_record_as_its_whole_source(make_pack):
    path, _, labels = make_pack(count=2, height=2, width=3)  # written without geometry
    ds = PackedImageDataset(path)
    assert len(ds.pack_id) == 32 and ds.target_vectors is None and ds.shape[2] == 3
    assert ds.source_sizes.tolist() == [[3, 2], [3, 2]]
    assert ds.source_boxes.tolist() == ds.content_boxes.tolist() == [[0, 0, 3, 2]] * 2
    img, label = ds[1]
    assert img.shape == (3, 2, 3) and label == labels[1]


def test_one_channel_pack_reads_as_b_1_h_w(tmp_path):
    path, want = _write(tmp_path / "g.bin", channels=1)
    ds = PackedImageDataset(path)
    assert ds.shape == (4, 6, 1) and len(ds.mean) == len(ds.std) == 1
    img, _ = ds[2]
    assert img.shape == (1, 4, 6) and img.dtype == torch.uint8
    np.testing.assert_array_equal(img.permute(1, 2, 0).numpy(), want["pixels"][2])
    images, _ = ds.gather([3, 0])
    assert images.shape == (2, 1, 4, 6)
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), want["pixels"][[3, 0]])


def test_multi_pack_concatenates_in_dataset_order(tmp_path):
    a, wa = _write(tmp_path / "a.bin", 3, k=2, seed=1)
    b, wb = _write(tmp_path / "b.bin", 5, k=2, seed=2)
    ds = PackedImageDataset([b, a])
    assert len(ds) == 8 and ds.shape[2] == 3
    np.testing.assert_array_equal(ds.source_sizes, np.concatenate([wb["sizes"], wa["sizes"]]))
    np.testing.assert_array_equal(ds.content_boxes, np.concatenate([wb["cboxes"], wa["cboxes"]]))
    np.testing.assert_array_equal(ds.target_vectors, np.concatenate([wb["t"], wa["t"]]))
    ids = (read_index(b).pack_id, read_index(a).pack_id)
    assert [ix.pack_id for ix in ds.indexes] == list(ids) and len(ds.pack_id) == 32
    assert PackedImageDataset([a, b]).pack_id != ds.pack_id  # another order, another dataset


def test_shards_must_agree_on_channels_and_target_length(tmp_path):
    a, _ = _write(tmp_path / "a.bin", k=2, seed=1)
    k3, _ = _write(tmp_path / "k3.bin", k=3, seed=2)
    none, _ = _write(tmp_path / "none.bin", seed=3)
    gray, _ = _write(tmp_path / "gray.bin", channels=1, k=2, seed=4)
    with pytest.raises(FormatError, match=r"k3\.bin: 3 target values per record, .*a\.bin"):
        PackedImageDataset([a, k3])
    with pytest.raises(FormatError, match=r"none\.bin: no target values per record"):
        PackedImageDataset([a, none])
    with pytest.raises(FormatError, match=r"gray\.bin: records have 1 channels, in"):
        PackedImageDataset([a, gray])


def _replace_with_other_pack(path: Path, tmp: Path) -> None:
    """Swap both files for another pack of exactly the same size and shape (new inodes)."""
    other, _ = _write(tmp / "other" / path.name, seed=9)
    assert other.stat().st_size == path.stat().st_size
    for src in pack_paths(other):
        os.replace(src, path.with_suffix(src.suffix))


def _first_sample_in_a_worker(ds) -> None:
    # batch_size=None: per-sample fetch, default conversion; one real worker process
    loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
    batches, error = iter(loader), None
    try:
        next(batches)
    except Exception as e:  # noqa: BLE001 - raised again below, once the worker is stopped
        # Its traceback holds the iterator in a reference cycle; freed by the garbage
        # collector later, after the queues' finalizers stopped their feeder threads, the
        # iterator would wait out torch's 5 s join (in whichever test runs then). Without it,
        # the iterator goes at ``del`` and stops its worker now.
        error = e.with_traceback(None)
    del batches
    if error is not None:
        raise error


@pytest.mark.parametrize("sent", ["forked", "pickled"])
def test_a_pack_replaced_after_open_is_refused_in_a_worker(tmp_path, sent):
    path, _ = _write(tmp_path / "p.bin")
    ds = PackedImageDataset(path)  # index read; nothing mapped yet
    _replace_with_other_pack(path, tmp_path)
    # pickled: the dataset as a spawned worker gets it (without its interpreter's torch import)
    sent_ds = pickle.loads(pickle.dumps(ds)) if sent == "pickled" else ds
    with pytest.raises(PackChangedError) as err:
        _first_sample_in_a_worker(sent_ds)
    assert "p.bin: the pack changed on disk since it was opened" in str(err.value)
    with pytest.raises(PackChangedError, match=r"^p\.bin: the pack changed on disk"):
        ds[0]  # lazy first access in this process too
    with pytest.raises(PackChangedError):
        ds.source_boxes  # noqa: B018 - arrays read later are checked as well
    assert PackedImageDataset(path)[0][0].shape == (3, 4, 6)  # reopening is the fix


def test_a_pack_rewritten_in_place_is_refused_by_a_forked_worker(tmp_path):
    path, _ = _write(tmp_path / "p.bin")
    ds = PackedImageDataset(path)
    ds[0]  # mapped in this process; a forked worker inherits the mapping
    with open(path, "r+b") as f:  # same inode, other pack id: an in-place rewrite
        f.seek(44)
        f.write(bytes(16))
    with pytest.raises(PackChangedError, match="p.bin: the pack changed on disk"):
        _first_sample_in_a_worker(ds)


def test_device_transform_normalises_one_channel_batches(tmp_path):
    from imgpack.errors import InvalidArgumentError
    from imgpack.reader.transform import DeviceTransform

    path, want = _write(tmp_path / "g.bin", channels=1)
    ds = PackedImageDataset(path)
    t = DeviceTransform.from_dataset(ds)
    images = ds.gather([0, 1])[0]
    out = t(images)
    assert out.shape == (2, 1, 4, 6) and out.dtype == torch.float32
    ref = (want["pixels"][:2].astype(np.float64) / 255 - ds.mean[0]) / ds.std[0]
    np.testing.assert_allclose(out.permute(0, 2, 3, 1).numpy(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(
        InvalidArgumentError,
        match=r"expected a uint8 \(B, 1, H, W\) tensor, found torch.uint8 \(2, 3, 4, 6\)",
    ):
        t(torch.zeros(2, 3, 4, 6, dtype=torch.uint8))
    with pytest.raises(InvalidArgumentError, match="1 or 3 numbers each"):
        DeviceTransform((0.5, 0.5), (0.2, 0.2))


def test_make_loader_yields_one_channel_batches(tmp_path):
    from imgpack.reader.loader import make_loader

    path, want = _write(tmp_path / "g.bin", 6, channels=1)
    ds = PackedImageDataset(path)
    seen = []
    for images, _ in make_loader(ds, batch_size=4, shuffle=False):
        assert images.dtype == torch.uint8 and images.shape[1:] == (1, 4, 6)
        seen.append(images.permute(0, 2, 3, 1).numpy().copy())
    np.testing.assert_array_equal(np.concatenate(seen), want["pixels"])


def test_a_manifest_dataset_exposes_the_shards_arrays(tmp_path):
    from imgpack.packer.merge import merge_packs

    a, wa = _write(tmp_path / "a.bin", 3, k=2, seed=1)
    b, wb = _write(tmp_path / "b.bin", 2, k=2, seed=2)
    merge_packs(tmp_path / "m.manifest.json", [a, b])
    ds = PackedImageDataset(tmp_path / "m.manifest.json")
    np.testing.assert_array_equal(ds.source_boxes, np.concatenate([wa["sboxes"], wb["sboxes"]]))
    np.testing.assert_array_equal(ds.target_vectors, np.concatenate([wa["t"], wb["t"]]))
    assert [ix.pack_id for ix in ds.indexes] == [read_index(a).pack_id, read_index(b).pack_id]
