"""The per-file baseline: ImageFolder labels, the eval transform, and the DataLoader template."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image
from workbench import baseline
from workbench.baseline import (
    PerFileImageDataset,
    baseline_loader,
    baseline_workers,
    resize_center_crop,
)

from imgpack.errors import InvalidArgumentError, SourceError


def thirds(width: int, height: int, *, vertical: bool) -> Image.Image:
    """Red, green and blue thirds along the longer side: the centre crop must be the green one."""
    a = np.zeros((height, width, 3), dtype=np.uint8)
    n = (height if vertical else width) // 3
    for c in range(3):
        if vertical:
            a[c * n : (c + 1) * n, :, c] = 255
        else:
            a[:, c * n : (c + 1) * n, c] = 255
    return Image.fromarray(a)


@pytest.mark.parametrize("vertical", [False, True])
def test_shorter_side_then_centre_crop(vertical):
    img = thirds(30, 90, vertical=True) if vertical else thirds(90, 30, vertical=False)
    out = np.asarray(resize_center_crop(img, 10))
    assert out.shape == (10, 10, 3)
    core = out[2:8, :, :] if vertical else out[:, 2:8, :]  # away from the blurred seams
    assert (core[..., 1] >= 250).all() and (core[..., [0, 2]] <= 5).all()


@pytest.mark.parametrize(
    ("size", "resized", "box"),
    [((64, 48), (42, 32), (5, 0, 37, 32)), ((48, 64), (32, 42), (0, 5, 32, 37)),
     ((33, 33), (32, 32), (0, 0, 32, 32)), ((10, 5), (64, 32), (16, 0, 48, 32))],
)  # fmt: skip
def test_torchvision_rounding(size, resized, box):
    """int(size * long / short) for the long side; crop offsets rounded like CenterCrop."""
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (*size[::-1], 3), np.uint8))
    want = img.resize(resized, Image.Resampling.BILINEAR).crop(box)
    assert np.array_equal(np.asarray(resize_center_crop(img, 32)), np.asarray(want))


def test_items_follow_the_image_folder_rule(image_folder):
    src = image_folder(classes=("cat", "dog"), per_class=3, width=64, height=48)
    (src / "dog" / "nested").mkdir()
    Image.new("L", (20, 40), 77).save(src / "dog" / "nested" / "grey.png")  # recursion, mode L
    (src / "dog" / "notes.txt").write_text("not an image")
    ds = PerFileImageDataset(src, size=16)
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    assert len(ds) == 7 and ds.targets == [0, 0, 0, 1, 1, 1, 1]
    for i in range(len(ds)):
        x, label = ds[i]
        assert x.shape == (3, 16, 16) and x.dtype == torch.uint8 and label == ds.targets[i]
    grey = ds[[rel for rel, _ in ds.samples].index("dog/nested/grey.png")][0]
    assert (grey == 77).all()  # converted to RGB: three equal channels
    with Image.open(src / "cat" / "000.jpg") as img:
        want = np.asarray(resize_center_crop(img.convert("RGB"), 16))
    assert np.array_equal(ds[0][0].permute(1, 2, 0).numpy(), want)


def test_bad_inputs_are_named(tmp_path, image_folder):
    with pytest.raises(SourceError):
        PerFileImageDataset(tmp_path / "missing")
    src = image_folder(per_class=1)
    with pytest.raises(InvalidArgumentError, match="size must be a positive"):
        PerFileImageDataset(src, size=0)
    (src / "cat" / "000.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    ds = PerFileImageDataset(src, size=8)
    with pytest.raises(SourceError, match=r"000\.jpg: cannot decode"):
        ds[0]
    with pytest.raises(InvalidArgumentError, match="batch_size 5 is larger than the dataset"):
        baseline_loader(ds, 5)
    with pytest.raises(InvalidArgumentError, match="batch_size must be a positive int"):
        baseline_loader(ds, 0)


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (64, 4)])
def test_worker_count_is_half_the_cores_capped_at_four(monkeypatch, cores, workers):
    monkeypatch.setattr(baseline, "usable_cores", lambda: cores)
    assert baseline_workers() == workers


class WhoLoaded(PerFileImageDataset):
    """Adds the id of the worker that decoded each item, to prove workers did the work."""

    def __getitem__(self, i):
        x, label = super().__getitem__(i)
        info = torch.utils.data.get_worker_info()
        return x, label, -1 if info is None else info.id


def test_loader_template_runs_with_real_workers(image_folder):
    ds = WhoLoaded(image_folder(per_class=3, width=40, height=30), size=12)
    loader = baseline_loader(ds, 2)
    assert loader.num_workers == baseline_workers() >= 1
    assert (loader.prefetch_factor, loader.persistent_workers, loader.drop_last) == (4, True, True)
    assert loader.pin_memory == torch.cuda.is_available()
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    for _ in range(2):  # two epochs through the same persistent workers
        labels, workers = Counter(), set()
        for x, y, who in loader:
            assert x.shape == (2, 3, 12, 12) and x.dtype == torch.uint8
            labels.update(y.tolist())
            workers.update(who.tolist())
        assert labels == Counter(ds.targets)
        assert -1 not in workers
    del loader
