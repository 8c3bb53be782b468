"""DeviceTransform and the Move stage, checked on device "cpu"; the CUDA path runs only where CUDA
exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader.dataset import PackedImageDataset
from imgpack.reader.device import Move
from imgpack.reader.read import Batch, pinned
from imgpack.reader.transform import DeviceTransform

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _batch(b=6, h=9, w=11, seed=0) -> torch.Tensor:
    """uint8 (B, 3, H, W) in channels_last memory, like PackedImageDataset batches."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, h, w, 3), dtype=torch.uint8, generator=g).permute(0, 3, 1, 2)


def _reference(images: torch.Tensor) -> torch.Tensor:
    """(x/255 - mean)/std in float64, written the obvious way."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (images.double() / 255 - mean) / std


def to_device(batch, device):
    """``(images, *rest)`` as the loader's ``Move`` stage hands it on to ``device``."""
    images, *rest = batch
    request = Batch(np.arange(len(images)), (1, 1), images=images, rest=tuple(rest))
    return Move(torch.device(device))(request).output()


def test_normalisation_matches_a_float64_reference():
    images = _batch()
    out = DeviceTransform(MEAN, STD)(images)
    assert out.dtype == torch.float32 and out.shape == images.shape
    assert out.is_contiguous(memory_format=torch.channels_last)
    err = (out.double() - _reference(images)).abs().max().item()
    assert err < 2e-6  # float32 rounding of values in about [-2.2, 2.7]
    out64 = DeviceTransform(MEAN, STD, dtype=torch.float64)(images)
    torch.testing.assert_close(out64, _reference(images), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize(
    "dtype,tol",
    [(torch.float16, 2.0**-11 + 1e-6), (torch.bfloat16, 2.0**-8 + 1e-6), (torch.float32, 2e-6)],
)
def test_output_dtypes(dtype, tol):
    images = _batch(seed=3)
    out = DeviceTransform(MEAN, STD, dtype=dtype)(images)
    assert out.dtype == dtype
    ref = _reference(images)
    # one rounding to the output dtype at the end: relative error within half an ulp
    assert ((out.double() - ref).abs() / ref.abs().clamp_min(1)).max().item() < tol


def test_contiguous_format_on_request():
    out = DeviceTransform(MEAN, STD, channels_last=False)(_batch())
    assert out.is_contiguous()
    torch.testing.assert_close(out.double(), _reference(_batch()), rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    "crop,flip", [((5, 7), False), ((5, 7), True), (None, True), ((9, 11), True)]
)
def test_each_sample_is_its_own_crop_and_flip(crop, flip):
    images = _batch(b=16, h=9, w=11, seed=7)
    t = DeviceTransform(MEAN, STD, crop=crop, flip=flip, generator=torch.Generator().manual_seed(5))
    out = t(images)
    ch, cw = crop or (9, 11)
    assert out.shape == (16, 3, ch, cw)
    p = t.last_params
    ref = _reference(images)
    for b in range(16):
        top, left = int(p["top"][b]), int(p["left"][b])
        want = ref[b, :, top : top + ch, left : left + cw]
        if p["flip"][b]:
            want = want.flip(-1)
        torch.testing.assert_close(out[b].double(), want, rtol=0, atol=2e-6)
    if flip:
        assert 0 < int(p["flip"].sum()) < 16  # both outcomes drawn, per sample
    else:
        assert not p["flip"].any()
    if crop == (5, 7):
        assert len(set(zip(p["top"].tolist(), p["left"].tolist()))) > 1


def test_seeded_generator_is_reproducible():
    images = _batch(b=8)
    runs = [
        DeviceTransform(
            MEAN, STD, crop=(4, 4), flip=True, generator=torch.Generator().manual_seed(1)
        )(images)
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])


def test_no_augmentation_draws_nothing():
    t = DeviceTransform(MEAN, STD)
    t(_batch())
    assert t.last_params is None


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidArgumentError, match="std > 0"):
        DeviceTransform(MEAN, (0.2, 0.0, 0.2))
    with pytest.raises(InvalidArgumentError, match="floating dtype"):
        DeviceTransform(MEAN, STD, dtype=torch.int32)
    with pytest.raises(InvalidArgumentError, match="crop should be"):
        DeviceTransform(MEAN, STD, crop=(0, 4))
    with pytest.raises(InvalidArgumentError, match="larger than the 9x11 images"):
        DeviceTransform(MEAN, STD, crop=(10, 4))(_batch())
    with pytest.raises(InvalidArgumentError, match="uint8"):
        DeviceTransform(MEAN, STD)(_batch().float())
    with pytest.raises(
        InvalidArgumentError, match=r"\(B, 3, H, W\) tensor, found torch.uint8 \(2, 4"
    ):
        DeviceTransform(MEAN, STD)(torch.zeros(2, 4, 5, 5, dtype=torch.uint8))


def test_from_dataset_uses_the_index_stats(make_pack):
    path, pixels, _ = make_pack(count=8)
    ds = PackedImageDataset(path)
    images, _ = ds.gather(range(8))
    out = DeviceTransform.from_dataset(ds, dtype=torch.float64)(images)
    # the pack's own stats: normalised pixels have mean 0 and std 1 per channel
    flat = out.permute(1, 0, 2, 3).reshape(3, -1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(3, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(
        flat.std(1, correction=0), torch.ones(3, dtype=torch.float64), atol=1e-9, rtol=0
    )


def test_to_device_cpu_returns_the_same_tensors():
    batch = (_batch(), torch.arange(6))
    images, labels = to_device(batch, "cpu")
    assert images is batch[0] and labels is batch[1]
    images, _ = to_device(batch, torch.device("cpu"))
    assert images is batch[0]


def test_to_device_keeps_the_containers_and_what_is_not_a_tensor():
    batch = (_batch(), {"y": torch.arange(6), "name": "a"}, [torch.arange(2)])
    moved = to_device(batch, "cpu")
    assert isinstance(moved[2], list) and moved[1]["name"] == "a" and moved[0] is batch[0]


@cuda
def test_cuda_transfer_and_transform_match_cpu():
    images, labels = pinned((_batch(b=32, h=24, w=20), torch.arange(32)))
    assert images.is_pinned() and labels.is_pinned()
    dev_images, dev_labels = to_device((images, labels), "cuda")
    assert dev_images.is_cuda and dev_images.is_contiguous(memory_format=torch.channels_last)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        kw = dict(crop=(16, 16), flip=True, dtype=dtype)
        on_gpu = DeviceTransform(MEAN, STD, generator=torch.Generator().manual_seed(2), **kw)
        on_cpu = DeviceTransform(MEAN, STD, generator=torch.Generator().manual_seed(2), **kw)
        got = on_gpu(dev_images)
        torch.cuda.synchronize()
        assert got.is_cuda and got.dtype == dtype
        torch.testing.assert_close(got.cpu().double(), on_cpu(images).double(), rtol=0, atol=2e-2)
    assert torch.equal(dev_labels.cpu(), labels)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_device_path_resident_on_a_cpu_agrees_with_the_cpu_crops(tmp_path, monkeypatch, mode):
    """What a CUDA device runs for a resident yuv420 pack (``ResidentRecords`` gathers the
    yuv canvas, ``ToRgb`` converts it, ``ApplyDraw`` makes the batched crops), here on the
    CPU: its crops agree with the CPU path's (each record read and cropped by the loader's
    threads) within one level at the 99th percentile, before normalising."""
    from conftest import write_image
    from test_augment import to_levels

    from imgpack.packer.pack import pack_folder
    from imgpack.reader import loader
    from imgpack.reader.loader import make_loader

    for k, (w, h) in enumerate([(90, 60), (50, 88), (64, 64), (37, 71), (120, 33), (75, 75)]):
        write_image(tmp_path / "src" / "ab"[k % 2] / f"{k}.png", w, h, seed=k)
    pack_folder(tmp_path / "src", tmp_path / "p.bin", size=(40, 40), resize="fit",
                codec="yuv420", progress=False)  # fmt: skip
    ds = PackedImageDataset(tmp_path / "p.bin")

    def levels(**kw):
        t = getattr(DeviceTransform, mode)(ds, size=24)
        got = make_loader(ds, 3, shuffle=False, seed=0, transform=t, device="cpu", **kw)
        return np.concatenate([to_levels(x, ds.mean, ds.std) for x, _ in got]), got

    cpu, _ = levels()
    monkeypatch.setitem(loader.STAGES, ("yuv420", "resident crops"),
                        loader.STAGES[("yuv420", "resident")])  # fmt: skip
    device, held = levels(resident=True)
    assert all(name in str(held) for name in ("ResidentRecords", "ToRgb", "ApplyDraw"))
    gap = np.abs(device - cpu)
    assert np.percentile(gap, 99) <= 1.0 and gap.max() <= 3
