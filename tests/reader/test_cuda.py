"""Batches stay the user's on CUDA too: pinned host batches copied asynchronously on any
stream, and device batches delivered on a side stream, kept, broken off, and reused.

Skipped without CUDA; run by hand on a GPU machine: ``pytest -m cuda tests/reader``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.loader import make_loader
from imgpack.reader.order import EpochOrder

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

N, H, W, B = 96, 32, 24, 8


@pytest.fixture
def pack(make_pack):
    path, pixels, labels = make_pack(count=N, height=H, width=W)
    return PackedImageDataset(path), pixels, labels


def expected(seed: int, epoch: int, k: int) -> np.ndarray:
    return EpochOrder(N, batch_size=B, seed=seed).indices(epoch)[k * B : (k + 1) * B]


def hwc(x: torch.Tensor) -> np.ndarray:
    return x.permute(0, 2, 3, 1).cpu().numpy()


@pytest.mark.parametrize("workers", [None, 2])
def test_pinned_batches_copied_on_any_stream_stay_intact(pack, workers):
    ds, pixels, _ = pack
    assert next(iter(make_loader(ds, B, seed=3, num_workers=workers)))[0].is_pinned()
    loader = make_loader(ds, B, seed=3, num_workers=workers)
    devices = [torch.device(f"cuda:{d}") for d in range(torch.cuda.device_count())]
    copies = []
    for k, (x, y) in enumerate(loader):
        dev = devices[k % len(devices)]
        with torch.cuda.device(dev):
            side = torch.cuda.Stream(dev)
            with torch.cuda.stream(side):  # the async copy outlives our reference to x
                copies.append((k, x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)))
        del x, y  # dropped at once: the host allocator must wait for the copy
    for _ in loader:  # break, then a whole new pass reusing the pinned blocks
        break
    list(loader)
    torch.cuda.synchronize()
    for k, x, _ in copies:
        np.testing.assert_array_equal(hwc(x), pixels[expected(3, 0, k)])


def transform(images: torch.Tensor, records: torch.Tensor) -> torch.Tensor:
    return images.float().mul_(2)  # real work on the side stream


@pytest.mark.parametrize("workers", [None, 2])
def test_device_batches_kept_broken_off_and_resumed(pack, workers):
    ds, pixels, labels = pack
    loader = make_loader(ds, B, seed=5, device="cuda", transform=transform, num_workers=workers)
    kept = list(loader)  # every batch of epoch 0, held at once
    for x, _ in loader:  # epoch 1: break after one batch
        first = x
        break
    rest = list(loader)  # the rest of epoch 1
    last = rest[-1][0]
    torch.cuda.synchronize()
    for k, (x, y) in enumerate(kept):
        assert x.is_cuda and x.dtype == torch.float32
        np.testing.assert_array_equal(hwc(x), pixels[expected(5, 0, k)] * 2.0)
        assert y.cpu().tolist() == labels[expected(5, 0, k)].tolist()
    np.testing.assert_array_equal(hwc(first), pixels[expected(5, 1, 0)] * 2.0)
    np.testing.assert_array_equal(hwc(last), pixels[expected(5, 1, N // B - 1)] * 2.0)
    assert len(rest) == N // B - 1


@pytest.mark.parametrize("workers", [None, 2])
def test_a_yuv420_pack_crosses_as_yuv_and_becomes_rgb_on_the_device(tmp_path, workers):
    from packs_v3 import BOUND, write_v3

    from imgpack.reader.device import canvas_to_rgb
    from imgpack.reader.transform import DeviceTransform

    ds = PackedImageDataset(write_v3(tmp_path / "p.bin", "yuv420")[0])
    seen = []

    def plain(images, records):
        seen.append((images.is_cuda, records.clone()))
        return images

    batches = list(make_loader(ds, 3, seed=2, device="cuda", transform=plain, num_workers=workers))
    for (x, _), (on_device, records) in zip(batches, seen):
        assert on_device and x.is_cuda
        cpu = canvas_to_rgb(ds.gather(records)[0], BOUND, sizes=ds.record_sizes[records])
        assert torch.equal(x.cpu(), cpu)  # exact integers: the same bytes on both devices
    for mode in ("train", "eval"):
        kw = {"generator": torch.Generator().manual_seed(4)} if mode == "train" else {}
        t = getattr(DeviceTransform, mode)(ds, size=12, **kw)
        images, _ = ds.gather(np.arange(len(ds)))
        rgb = canvas_to_rgb(images, BOUND, sizes=ds.record_sizes)
        want = t(rgb, np.arange(len(ds)))
        if mode == "train":
            t.generator.manual_seed(4)
        got = t(rgb.cuda(), np.arange(len(ds)))
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-3)


@pytest.mark.parametrize("workers", [None, 2])
def test_a_jpeg_pack_decoded_at_its_crops_scales_is_applied_on_the_device(tmp_path, workers):
    """Crops drawn on the CPU, records decoded at their scales, the draw applied on CUDA: the
    same batches as on the CPU (to float rounding: TF32 may be on for the matmuls)."""
    from packs_v3 import write_v3

    from imgpack.reader.transform import DeviceTransform

    sizes = [(64, 48), (40, 64), (64, 64), (17, 9), (64, 33), (50, 50)]
    ds = PackedImageDataset(write_v3(tmp_path / "j.bin", "jpeg", sizes, (64, 64))[0])
    runs = []
    for device in ("cpu", "cuda"):
        t = DeviceTransform.train(ds, size=8, generator=torch.Generator().manual_seed(1))
        loader = make_loader(ds, 3, seed=2, device=device, transform=t, num_workers=workers)
        runs.append([x for _ in range(3) for x, _ in loader])
    for cpu, cuda in zip(*runs):
        assert cuda.is_cuda
        torch.testing.assert_close(cuda.cpu(), cpu, rtol=0, atol=2e-2)
