"""One pack or many as one PackedImageDataset: indexing, batched gathers, workers, refusals."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import synthetic_records

from imgpack.errors import FormatError
from imgpack.format.index import read_index
from imgpack.format.write import write_json_atomic
from imgpack.packer.writer import PackWriter
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.options import DistributedOptions
from imgpack.shards import build_manifest, check_shards

CLASSES = ["a", "b", "c"]


def hwc(images):
    return images.permute(0, 2, 3, 1).numpy()


def write_pack(path: Path, pixels, labels, shard=None) -> Path:
    h, w = pixels.shape[1:3]
    with PackWriter(path, height=h, width=w, classes=CLASSES) as wr:
        for i, (px, lab) in enumerate(zip(pixels, labels)):
            wr.append(px, int(lab), f"{CLASSES[lab]}/{path.stem}-{i}.png")
        extra = None
        if shard is not None:
            extra = {"shard": {"index": shard[0], "count": shard[1], "source_files": shard[2]}}
        wr.finish(packer={"size": [w, h], "resize": "stretch", "filter": "bilinear"}, extra=extra)
    return path


def make_shards(folder: Path, sizes, h=8, w=6):
    """Packs of consecutive slices of distinct records; returns (paths, pixels, labels)."""
    total = sum(sizes)
    px = synthetic_records(total, h, w)
    labels = (np.arange(total) * 7) % 3
    paths, start = [], 0
    for i, n in enumerate(sizes):
        paths.append(
            write_pack(folder / f"s{i:02d}.bin", px[start : start + n], labels[start : start + n])
        )
        start += n
    return paths, px, labels.astype(np.int64)


def write_manifest(out: Path, paths) -> Path:
    indexes = [read_index(p) for p in paths]
    check_shards(indexes)
    write_json_atomic(out, build_manifest(out, indexes))
    return out


@pytest.fixture
def shards(tmp_path):
    # an empty shard in the middle and one at the end: boundaries must still be right
    return make_shards(tmp_path, [5, 0, 7, 1, 4, 0])


def test_a_list_or_a_manifest_is_one_dataset(shards, tmp_path):
    paths, px, labels = shards
    ds = PackedImageDataset(paths)
    assert type(ds) is PackedImageDataset  # one class, whatever the number of packs
    assert len(ds) == 17 and [ix.count for ix in ds.indexes] == [5, 0, 7, 1, 4, 0]
    assert ds.classes == CLASSES and ds.class_to_idx == {"a": 0, "b": 1, "c": 2}
    assert ds.shape == (8, 6, 3) and [str(ix.data_path) for ix in ds.indexes] == [
        str(p) for p in paths
    ]
    manifest = write_manifest(tmp_path / "all.manifest.json", paths)
    dm = PackedImageDataset(manifest)
    assert type(dm) is PackedImageDataset and dm.path == str(manifest)
    assert [ix.data_path.resolve() for ix in dm.indexes] == [p.resolve() for p in paths]
    assert "6 shards, 17 records" in repr(dm)
    for d in (ds, dm):
        for i in range(len(d)):  # global indexing equals concatenation
            img, lab = d[i]
            assert img.shape == (3, 8, 6) and img.dtype == torch.uint8
            np.testing.assert_array_equal(img.permute(1, 2, 0).numpy(), px[i])
            assert lab == labels[i]
        np.testing.assert_array_equal(d[-1][0].permute(1, 2, 0).numpy(), px[-1])
        assert d.targets == labels.tolist()
        np.testing.assert_array_equal(d.labels, labels)
        assert d.labels.dtype == np.int64 and not d.labels.flags.writeable
        x = px.reshape(-1, 3).astype(np.float64) / 255
        np.testing.assert_allclose(d.mean, x.mean(axis=0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(d.std, x.std(axis=0), rtol=0, atol=1e-12)
        assert d.source_path(5) == "c/s02-0.png"
    with pytest.raises(IndexError):
        ds[17]
    # a single pack still opens as a single pack
    assert type(PackedImageDataset(paths[0])) is PackedImageDataset


@pytest.mark.parametrize("many", [False, True])
def test_one_class_through_a_plain_dataloader_with_the_default_collate(shards, many):
    paths, px, labels = shards
    ds = PackedImageDataset(paths if many else paths[2])
    assert type(ds) is PackedImageDataset and len(ds) == (17 if many else 7)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    i = 0
    for images, labs in loader:
        assert images.dtype == torch.uint8 and labs.dtype == torch.int64
        for image, label in zip(images, labs):
            want_image, want_label = ds[i]
            assert torch.equal(image, want_image) and int(label) == want_label
            i += 1
    assert i == len(ds)
    start = 0 if many else 5
    np.testing.assert_array_equal(hwc(ds.gather(range(len(ds)))[0]), px[start : start + len(ds)])


def test_a_list_of_one_pack_is_that_pack(shards):
    paths, _, _ = shards
    one, listed = PackedImageDataset(paths[0]), PackedImageDataset([paths[0]])
    assert one.pack_id == listed.pack_id == one.indexes[0].pack_id and len(one) == 5
    assert repr(one) == repr(listed) and len(one.indexes) == 1


@pytest.mark.parametrize("hw", [(8, 6), (80, 72)])  # below and above the row-copy size
def test_batches_put_every_record_in_its_place(tmp_path, hw):
    paths, px, labels = make_shards(tmp_path, [5, 0, 7, 1, 4], *hw)
    ds = PackedImageDataset(paths)
    rng = np.random.default_rng(3)
    batches = [
        rng.permutation(17),  # every shard, scattered
        np.array([3, 16, 3, -17, 12, 0]),  # repeats and negatives
        np.arange(4, 14),  # sequential across boundaries: runs copied in place
        np.array([7, 8, 9]),  # one shard
        np.array([], dtype=np.int64),
    ]
    for idx in batches:
        samples = ds.__getitems__(idx)
        assert [int(s[1]) for s in samples] == labels[idx].tolist()
        for (image, _), i in zip(samples, idx):
            np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), px[i])
        t_images, t_labels = ds.gather(idx.tolist())
        assert t_images.shape == (len(idx), 3, *hw)
        assert t_images.is_contiguous(memory_format=torch.channels_last) or len(idx) == 0
        np.testing.assert_array_equal(t_images.permute(0, 2, 3, 1).numpy(), px[idx])
        np.testing.assert_array_equal(t_labels.numpy(), labels[idx])
    with pytest.raises(IndexError):
        ds.gather([0, 17])
    ds.close()
    np.testing.assert_array_equal(hwc(ds.gather([16])[0]), px[[16]])  # maps again after close


def mapped_bytes(paths) -> int:
    """The bytes of ``paths`` this process maps (/proc/self/maps; 0 where there is none)."""
    if not os.path.exists("/proc/self/maps"):
        return 0
    names = {os.path.realpath(p) for p in paths}
    with open("/proc/self/maps") as f:
        rows = [line.split() for line in f]
    spans = [r[0].split("-") for r in rows if len(r) >= 6 and r[5] in names]
    return sum(int(b, 16) - int(a, 16) for a, b in spans)


def test_pickles_small_and_maps_lazily(shards, tmp_path):
    paths, px, _ = shards
    ds = PackedImageDataset(write_manifest(tmp_path / "m.manifest.json", paths))
    ds[0]
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000 and px.tobytes()[:64] not in blob
    mapped = mapped_bytes(paths)
    copy = pickle.loads(blob)
    assert type(copy) is PackedImageDataset and len(copy) == 17
    assert mapped_bytes(paths) == mapped  # nothing mapped until used
    np.testing.assert_array_equal(hwc(copy.gather([16, 2])[0]), px[[16, 2]])
    assert [ix.count for ix in copy.indexes] == [ix.count for ix in ds.indexes]
    assert copy.mean == ds.mean and copy.std == ds.std


@pytest.mark.parametrize("mode", ["workers", "inprocess"])
def test_loader_returns_every_sample_once(shards, mode):
    paths, px, labels = shards
    ds = PackedImageDataset(paths)
    key = {px[i].tobytes(): i for i in range(len(px))}
    workers = 2 if mode == "workers" else None
    with make_loader(ds, 4, seed=1, num_workers=workers) as loader:
        assert loader.mode == mode and (mode != "workers" or loader.dataloader.num_workers == 2)
        seen = []
        for images, labs in loader:
            for img, lab in zip(images, labs):
                i = key[img.permute(1, 2, 0).numpy().tobytes()]
                assert lab == labels[i]
                seen.append(i)
    assert sorted(seen) == list(range(17))


def test_shard_local_ranks_cover_the_epoch(tmp_path):
    paths, px, _ = make_shards(tmp_path, [6, 6, 6, 6])
    ds = PackedImageDataset(paths)
    key = {px[i].tobytes(): i for i in range(len(px))}
    seen = []
    for rank in (0, 1):
        ranks = DistributedOptions(rank=rank, world_size=2, shard_local=True)
        loader = make_loader(ds, 3, seed=0, distributed=ranks)
        mine = [key[img.permute(1, 2, 0).numpy().tobytes()] for b, _ in loader for img in b]
        assert len(mine) == 12
        # two shards per rank, and each rank reads only its own home shards here
        assert len({i // 6 for i in mine}) == 2
        seen += mine
    assert sorted(seen) == list(range(24))


def test_disagreeing_packs_refused_with_the_pack_named(tmp_path):
    paths, _, _ = make_shards(tmp_path, [3, 3])
    odd = write_pack(tmp_path / "odd.bin", synthetic_records(2, 9, 6), np.array([0, 1]))
    with pytest.raises(FormatError, match=r"odd\.bin: records are 9x6"):
        PackedImageDataset([*paths, odd])
    with pytest.raises(FormatError, match=r"s01\.bin: holds the same records"):
        PackedImageDataset([paths[0], paths[1], paths[1]])
    with pytest.raises(FormatError, match="no packs given"):
        PackedImageDataset([])


def test_missing_shards_need_allow_partial(tmp_path):
    px = synthetic_records(6, 8, 6)
    lab = np.arange(6) % 3
    a = write_pack(tmp_path / "a.bin", px[:3], lab[:3], shard=(0, 2, 6))
    with pytest.raises(FormatError, match=r"shards 1 of 2 .* allow_partial=True"):
        PackedImageDataset([a])
    ds = PackedImageDataset([a], allow_partial=True)
    assert len(ds) == 3 and ds.warnings == ["partial dataset: shards 1 of 2 of the source missing"]


def test_many_packs_keep_image_folder_names(tmp_path):
    paths, px, labels = make_shards(tmp_path, [3, 4])
    ds = PackedImageDataset(paths, lambda im: im.flip(0), lambda t: -t)
    assert ds.samples[5] == (f"{CLASSES[labels[5]]}/s01-2.png", int(labels[5]))
    image, label = ds[5]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), px[5][:, :, ::-1])
    assert label == -labels[5] and len(ds.__getitems__([0, 6])) == 2
