"""PackedImageDataset: exact samples, batches, buffers, pickling, workers, damaged packs."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate, get_worker_info

from imgpack.errors import FormatError, InvalidArgumentError
from imgpack.format.index import read_index
from imgpack.packer.writer import PackWriter
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.mapping import lock_path
from imgpack.reader.options import InProcessOptions


def _hwc(images: torch.Tensor) -> np.ndarray:
    return images.permute(0, 2, 3, 1).numpy()


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- samples ------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".bin", ".json"])
def test_every_sample_equals_what_was_written(make_pack, suffix):
    path, pixels, labels = make_pack(count=23, height=8, width=6)
    ds = PackedImageDataset(path.with_suffix(suffix))
    assert len(ds) == 23 and ds.shape == (8, 6, 3)
    assert ds.classes == ["a", "b", "c"] and ds.class_to_idx == {"a": 0, "b": 1, "c": 2}
    for i in range(len(ds)):
        image, label = ds[i]
        assert image.dtype == torch.uint8 and image.shape == (3, 8, 6)
        assert type(label) is int and label == labels[i]
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), pixels[i])
    assert ds.source_path(4) == "b/4.png" and ds.source_path(-1) == "b/22.png"


def test_indices_negative_numpy_and_out_of_range(make_pack):
    path, pixels, labels = make_pack(count=5)
    ds = PackedImageDataset(path)
    np.testing.assert_array_equal(ds[-1][0].permute(1, 2, 0).numpy(), pixels[4])
    assert ds[-5][1] == labels[0]
    assert ds[np.int64(3)][1] == labels[3] and ds[np.uint8(2)][1] == labels[2]
    assert ds[torch.tensor(1)][1] == labels[1]
    for bad in (5, -6, 10**12):
        with pytest.raises(IndexError, match="out of range for a pack of 5 records"):
            ds[bad]
    with pytest.raises(TypeError, match="integers"):
        ds[1.0]
    with pytest.raises(IndexError):
        ds.__getitems__([0, 5])
    with pytest.raises(IndexError):
        ds.gather(np.array([-6]))
    assert [label for _, label in ds] == labels.tolist()  # the sequence protocol stops cleanly


def test_item_is_a_view_and_writing_it_never_touches_the_file(make_pack):
    path, pixels, _ = make_pack(count=4)
    before = _sha(path)
    ds = PackedImageDataset(path)
    a, _ = ds[2]
    b, _ = ds[2]
    assert a.data_ptr() == b.data_ptr()  # both view the mapped record: no copy
    assert a.stride() == (1, 6 * 3, 3)  # a permuted HWC view
    a.fill_(7)  # copy-on-write: this process's private page changes, the file does not
    assert _sha(path) == before
    np.testing.assert_array_equal(
        PackedImageDataset(path)[2][0].permute(1, 2, 0).numpy(), pixels[2]
    )


def test_getitems_is_a_list_of_the_same_samples(make_pack):
    path, pixels, labels = make_pack(count=17, height=5, width=7)
    ds = PackedImageDataset(path)
    for idx in ([3, 0, 16, 3, -1], np.array([9, 2, 2], dtype=np.int32), torch.tensor([5, 1]), [7]):
        samples = ds.__getitems__(idx)
        items = [ds[int(i)] for i in np.asarray(idx)]
        assert isinstance(samples, list) and len(samples) == len(items)
        for (image, label), (im, lb) in zip(samples, items):
            assert torch.equal(image, im) and type(label) is int and label == lb
            assert image.data_ptr() == im.data_ptr()  # views of the mapping, no copy
        images, got = default_collate(samples)  # what torch's fetcher does with it
        assert torch.equal(images.permute(0, 2, 3, 1), torch.from_numpy(pixels[np.asarray(idx)]))
        assert got.tolist() == labels[np.asarray(idx)].tolist()
    assert ds.__getitems__([]) == []


def test_gather_is_one_channels_last_batch(make_pack):
    path, pixels, labels = make_pack(count=17, height=5, width=7)
    ds = PackedImageDataset(path)
    images, got = ds.gather([3, 0, 16, 3, -1])
    assert images.dtype == torch.uint8 and got.dtype == torch.int64
    assert images.shape == (5, 3, 5, 7)
    assert images.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(_hwc(images), pixels[[3, 0, 16, 3, 16]])
    assert got.tolist() == labels[[3, 0, 16, 3, 16]].tolist()
    images, got = ds.gather([])
    assert images.shape == (0, 3, 5, 7) and got.shape == (0,)


def test_targets_is_a_list_of_ints_and_labels_the_numpy_form(make_pack):
    path, _, labels = make_pack(count=9)
    ds = PackedImageDataset(path)
    assert isinstance(ds.targets, list) and all(type(t) is int for t in ds.targets)
    assert ds.targets == labels.tolist() and ds.targets[4] == labels[4]
    assert isinstance(ds.labels, np.ndarray) and ds.labels.dtype == np.int64
    np.testing.assert_array_equal(ds.labels, labels)
    with pytest.raises(ValueError):
        ds.labels[0] = 1


def test_unlabelled_pack_gives_minus_one(make_pack):
    path, _, _ = make_pack(count=3, classes=())
    ds = PackedImageDataset(path)
    assert ds.classes == [] and ds[1][1] == -1 and ds.gather([0, 2])[1].tolist() == [-1, -1]


def test_mean_std_come_from_the_index(make_pack):
    path, pixels, _ = make_pack(count=6)
    ds = PackedImageDataset(path)
    flat = pixels.reshape(-1, 3).astype(np.float64) / 255
    np.testing.assert_allclose(ds.mean, flat.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(ds.std, flat.std(axis=0), rtol=1e-9)


def test_pack_of_real_jpegs(image_folder, tmp_path):
    src = image_folder(classes=("cat", "dog", "eel"), per_class=4, width=40, height=30)
    files = sorted(p for p in src.rglob("*.jpg"))
    classes = sorted(p.name for p in src.iterdir())
    decoded = [np.asarray(Image.open(p).convert("RGB")) for p in files]
    out = tmp_path / "photos.bin"
    with PackWriter(out, height=30, width=40, classes=classes) as w:
        for p, arr in zip(files, decoded):
            w.append(arr, classes.index(p.parent.name), p.relative_to(src).as_posix())
        w.finish(packer={"size": [40, 30], "resize": "stretch", "filter": "bilinear"})
    ds = PackedImageDataset(out)
    assert len(ds) == 12 and ds.classes == ["cat", "dog", "eel"]
    images, labels = ds.gather(range(len(ds)))
    for i, p in enumerate(files):
        np.testing.assert_array_equal(_hwc(images)[i], decoded[i])
        assert labels[i] == classes.index(p.parent.name)
        assert ds.source_path(i) == p.relative_to(src).as_posix()


# --- madvise hints, prefault, pickling, cleanup -------------------------------------------


@pytest.mark.parametrize("advice", [None, "random", "sequential", "normal"])
@pytest.mark.parametrize("prefault", [None, True, False])
def test_hints_change_nothing_but_speed(make_pack, advice, prefault):
    path, pixels, labels = make_pack(count=7)
    ds = PackedImageDataset(path, advice=advice, prefault=prefault)
    loader = make_loader(ds, 3, shuffle=False, options=InProcessOptions(hints=True))
    images, got = (torch.cat(parts) for parts in zip(*loader))  # read-ahead announced per batch
    np.testing.assert_array_equal(_hwc(images), pixels)
    assert got.tolist() == labels.tolist()
    np.testing.assert_array_equal(_hwc(ds.gather(range(7))[0]), pixels)
    for thread in threading.enumerate():
        if thread.name == "imgpack-warm":
            thread.join(10)
    px = ds.indexes[0].sections["pixels"]
    done = lock_path(ds.indexes[0].data_path, px.offset, px.nbytes)  # the node's warm record
    if prefault is False:
        assert not os.path.exists(done)  # never warmed
    if prefault is True:
        with open(done) as f:
            assert f.read() == "done\n"


def test_bad_hints_are_refused(make_pack):
    path, _, _ = make_pack(count=2)
    with pytest.raises(InvalidArgumentError, match="advice 'willneed' is not one of"):
        PackedImageDataset(path, advice="willneed")
    with pytest.raises(InvalidArgumentError, match="prefault should be"):
        PackedImageDataset(path, prefault="yes")


def mappings(path) -> list[str]:
    """The addresses where this process maps ``path`` (one per mmap: its file offset 0)."""
    name = str(os.path.realpath(path))
    with open("/proc/self/maps") as f:
        rows = [line.split() for line in f]
    return [r[0] for r in rows if len(r) >= 6 and r[5] == name and int(r[2], 16) == 0]


needs_proc_maps = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="counts mappings in /proc/self/maps"
)


@needs_proc_maps
def test_pickle_carries_the_index_not_the_mapping(make_pack):
    path, pixels, _ = make_pack(count=40, height=32, width=32)
    ds = PackedImageDataset(path)
    ds[0]  # map it in this process
    assert len(mappings(path)) == 1
    blob = pickle.dumps(ds)
    assert len(blob) < path.with_suffix(".json").stat().st_size + 4096 < pixels.nbytes
    assert pixels[0].tobytes()[:64] not in blob
    clone = pickle.loads(blob)
    assert len(mappings(path)) == 1  # the clone maps lazily, on first access
    np.testing.assert_array_equal(_hwc(clone.gather([39, 0])[0]), pixels[[39, 0]])
    clone.gather([5])
    assert len(mappings(path)) == 2 and clone.classes == ds.classes  # once, not per read


@needs_proc_maps
def test_close_and_reopen(make_pack):
    path, pixels, _ = make_pack(count=3)
    with PackedImageDataset(path) as ds:
        ds[0]
        assert len(mappings(path)) == 1
    assert mappings(path) == []  # unmapped
    with PackedImageDataset(path) as ds:
        kept, _ = ds[1]
    np.testing.assert_array_equal(kept.permute(1, 2, 0).numpy(), pixels[1])  # still alive
    np.testing.assert_array_equal(ds[2][0].permute(1, 2, 0).numpy(), pixels[2])  # maps again


# --- real worker processes ------------------------------------------------------------------


def collate_with_origin(batch):
    """Runs in the worker: the batch plus where this process maps the pack."""
    return (*default_collate(batch), mappings(get_worker_info().dataset.path), os.getpid())


@needs_proc_maps
@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_workers_return_every_sample_once(make_pack, persistent):
    """Forked workers (a spawned one, which maps its own, is test_loader's spawn test: it
    would cost an interpreter and a torch import here again)."""
    path, pixels, labels = make_pack(count=37, height=6, width=5)
    ds = PackedImageDataset(path)
    ds[0]  # mapped in the parent: forked workers must reuse it
    parent_maps = mappings(path)
    perm = np.random.default_rng(1).permutation(len(ds))
    batches = [perm[i : i + 5].tolist() for i in range(0, len(ds), 5)]
    loader = DataLoader(
        ds,
        batch_sampler=batches,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=persistent,
        collate_fn=collate_with_origin,
    )
    workers = set()
    for _epoch in range(2):
        seen = []
        delivered = list(loader)
        assert len(delivered) == len(batches)
        for idx, (images, got, maps, pid) in zip(batches, delivered):
            np.testing.assert_array_equal(_hwc(images), pixels[idx])
            np.testing.assert_array_equal(got.numpy(), labels[idx])
            assert maps == parent_maps  # the inherited one: never one per worker or per item
            seen += idx
            workers.add(pid)
        assert sorted(seen) == list(range(len(ds)))
    assert os.getpid() not in workers
    assert len(workers) == (2 if persistent else 4)


def test_dataloader_batch_size_with_default_fetch(make_pack):
    path, pixels, labels = make_pack(count=11)
    ds = PackedImageDataset(path)
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    images = torch.cat([b[0] for b in loader])
    np.testing.assert_array_equal(_hwc(images), pixels)
    single = DataLoader(ds, batch_size=None, num_workers=1)  # per-item path, no collation
    assert [int(lb) for _, lb in single] == labels.tolist()


# --- damaged packs fail at construction ----------------------------------------------------


def _edit_json(path, **changes):
    jp = path.with_suffix(".json")
    raw = json.loads(jp.read_text())
    raw.update(changes)
    jp.write_text(json.dumps(raw))


def _truncate_bin(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)


def _cut_json(path):
    jp = path.with_suffix(".json")
    text = jp.read_text()
    jp.write_text(text[: len(text) // 2])


def _patch_label(path):
    ix = read_index(path)
    with open(path, "r+b") as f:
        f.seek(ix.sections["labels"].offset + 4 * 5)
        f.write(np.array([3], "<i4").tobytes())


DAMAGE = {
    "truncated bin": (_truncate_bin, FormatError, r"truncated"),
    "cut json": (_cut_json, FormatError, r"invalid JSON"),
    "invalid json": (
        lambda p: p.with_suffix(".json").write_text("{'format': 1}"),
        FormatError,
        r"invalid JSON at line 1",
    ),
    "unknown version": (
        lambda p: _edit_json(p, format_version=99),
        FormatError,
        r"format_version 99 is not supported",
    ),
    "count vs size": (
        lambda p: _edit_json(p, count=11),
        FormatError,
        r"11 records need",
    ),
    "shape vs size": (
        lambda p: _edit_json(p, shape=[9, 6, 3]),
        FormatError,
        r"header height is 8, index says 9",  # version 3: the bound, in the header too
    ),
    "file size vs index": (
        lambda p: _edit_json(p, data_file_bytes=read_index(p).data_file_bytes + 64),
        FormatError,
        r"data_file_bytes",
    ),
    "escaping data_file": (
        lambda p: _edit_json(p, data_file="../pack.bin"),
        FormatError,
        r"expected a file name in the index's own folder",
    ),
    "absolute data_file": (
        lambda p: _edit_json(p, data_file=str(p.resolve())),
        FormatError,
        r"expected a file name in the index's own folder",
    ),
    "label out of range": (
        _patch_label,
        FormatError,
        r"record 5 has label 3, expected 0\.\.2",
    ),
    "fewer classes than labels": (
        lambda p: _edit_json(p, classes=["a", "b"]),
        FormatError,
        r"has label 2, expected 0\.\.1",
    ),
    "missing bin": (lambda p: p.unlink(), FormatError, r"not found"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_pack_fails_at_construction(make_pack, damage):
    path, _, _ = make_pack(count=10)
    spoil, error, message = DAMAGE[damage]
    spoil(path)
    with pytest.raises(error, match=message) as info:
        PackedImageDataset(path)
    assert isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("path", [3, None, ["a.bin", 4]])
def test_a_path_of_another_type_is_a_one_line_error(path):
    """A stranger's typo (an int, None, a list with a number) gets the one-line error of a
    bad argument, not a TypeError from deep inside."""
    with pytest.raises(InvalidArgumentError, match=r"path should be a pack .* found") as info:
        PackedImageDataset(path)
    assert "\n" not in str(info.value)


def test_file_changed_after_open_is_refused_not_a_crash(make_pack):
    path, _, _ = make_pack(count=10)
    ds = PackedImageDataset(path)
    _truncate_bin(path)  # a mapping past the end would SIGBUS on access
    with pytest.raises(FormatError, match="changed on disk"):
        ds[0]


# --- ImageFolder's names --------------------------------------------------------------------


def halve(image):
    """A module-level transform, so that spawned workers can unpickle it."""
    return image.float() / 2


def test_samples_are_lazy_source_path_label_pairs(make_pack):
    path, _, labels = make_pack(count=7)
    ds = PackedImageDataset(path)
    assert len(ds.samples) == 7 and ds.samples[4] == ("b/4.png", int(labels[4]))
    assert ds.samples[-1] == ("a/6.png", 0)
    assert ds.samples[1:3] == [("b/1.png", 1), ("c/2.png", 2)]
    assert [p for p, _ in ds.samples] == [ds.source_path(i) for i in range(7)]
    assert ("c/5.png", 2) in ds.samples
    with pytest.raises(IndexError):
        ds.samples[7]


@pytest.mark.parametrize("sent", ["forked", "pickled"])
def test_transform_and_target_transform_as_in_image_folder(make_pack, sent):
    path, pixels, labels = make_pack(count=9)
    ds = PackedImageDataset(path, halve, str)
    image, label = ds[3]
    assert image.dtype == torch.float32 and label == str(labels[3])
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), pixels[3] / 2)
    if sent == "pickled":  # what a spawned worker gets, without a new interpreter's torch import
        ds = pickle.loads(pickle.dumps(ds))
    loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork")
    images, got = next(iter(loader))  # the transforms travel to the worker with the dataset
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), pixels[:4] / 2)
    assert list(got) == [str(v) for v in labels[:4]]


class Cutout:
    """An in-place transform, as many hand-written augmentations are: zero a random patch."""

    def __init__(self):
        self.seen = []

    def __call__(self, image):
        self.seen.append(image.clone())
        y, x = torch.randint(0, 4, (2,)).tolist()
        image[:, y : y + 3, x : x + 3] = 0
        return image


def test_an_in_place_transform_never_changes_the_records_of_later_epochs(make_pack):
    path, pixels, _ = make_pack(count=6)
    cutout = Cutout()
    ds = PackedImageDataset(path, transform=cutout)
    loader = DataLoader(ds, batch_size=3, num_workers=0)
    for _epoch in range(3):
        for _ in loader:
            pass
    for k, image in enumerate(cutout.seen):  # every epoch's transform got the record itself
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), pixels[k % 6])
    raw, _ = ds[2]
    ds.transform = None
    np.testing.assert_array_equal(ds[2][0].permute(1, 2, 0).numpy(), pixels[2])
    assert raw.dtype == torch.uint8
