"""The CPU batch's normalise: bit for bit the device's arithmetic, channels_last."""

from __future__ import annotations

import pytest
import torch

from imgpack.reader.transform import DeviceTransform


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("channels", [1, 3])
def test_the_cpu_lookup_equals_the_devices_product_and_sum(dtype, channels):
    """On a CPU uint8 pixels look their results up; a float batch (what a GPU computes) takes
    the product and the sum: every one of the 256 values gives the same bits."""
    mean, std = [0.485, 0.456, 0.406][:channels], [0.229, 0.224, 0.225][:channels]
    pixels = torch.randint(0, 256, (4, channels, 9, 8), dtype=torch.uint8)
    pixels[:, 0].reshape(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    t = DeviceTransform(mean, std, dtype=dtype)
    got = t(pixels)
    assert got.dtype == dtype and got.shape == (4, channels, 9, 8)
    assert got.is_contiguous(memory_format=torch.channels_last)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    scale = torch.tensor([1 / (255 * s) for s in std], dtype=work)[None, :, None, None]
    shift = torch.tensor([-m / s for m, s in zip(mean, std)], dtype=work)[None, :, None, None]
    assert torch.equal(got, (pixels.to(work) * scale + shift).to(dtype))
    plain = DeviceTransform(mean, std, dtype=dtype, channels_last=False)(pixels)
    assert plain.is_contiguous() and torch.equal(plain, got)
