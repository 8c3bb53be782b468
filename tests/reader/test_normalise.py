"""The CPU batch's normalise: bit for bit what ``DeviceTransform`` computes, channels_last."""

from __future__ import annotations

import pytest
import torch

from imgpack.errors import InvalidArgumentError
from imgpack.reader.transform import DeviceTransform, normalise


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("channels", [1, 3])
def test_equals_the_device_transforms_normalise(dtype, channels):
    mean, std = [0.485, 0.456, 0.406][:channels], [0.229, 0.224, 0.225][:channels]
    pixels = torch.randint(0, 256, (4, 9, 7, channels), dtype=torch.uint8)
    pixels[0, :, :, 0].view(-1)[:63] = torch.arange(63)  # values 0 to 251, and 255
    pixels[1, :, :, 0].view(-1)[:63] = torch.arange(63, 126)
    pixels[2, :, :, 0].view(-1)[:63] = torch.arange(126, 189)
    pixels[3, :, :, 0].view(-1)[:63] = torch.arange(189, 252)
    pixels[3, 8, 6, 0] = 255
    t = DeviceTransform(mean, std, dtype=dtype)
    want = t(pixels.permute(0, 3, 1, 2))
    scale = [1 / (255 * s) for s in std]
    shift = [-m / s for m, s in zip(mean, std)]
    got = normalise(pixels, scale, shift, dtype)
    assert got.dtype == dtype and got.shape == (4, channels, 9, 7)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, want)


def test_one_constant_for_every_channel():
    pixels = torch.arange(24, dtype=torch.uint8).view(1, 2, 4, 3)
    got = normalise(pixels, [2.0], [-1.0], torch.float32)
    assert torch.equal(got, (pixels.permute(0, 3, 1, 2).float() * 2 - 1))


@pytest.mark.parametrize(
    ("pixels", "scale", "dtype", "message"),
    [
        (torch.zeros(1, 2, 2, 3), [1.0] * 3, torch.float32, "uint8 \\(B, H, W, C\\) tensor"),
        (torch.zeros(2, 2, 3, dtype=torch.uint8), [1.0] * 3, torch.float32, "found torch.uint8"),
        (torch.zeros(1, 2, 2, 3, dtype=torch.uint8), [1.0] * 2, torch.float32, "1 or 3 numbers"),
        (torch.zeros(1, 2, 2, 3, dtype=torch.uint8), [1.0] * 3, torch.int32, "floating dtype"),
    ],
)
def test_bad_arguments_are_refused(pixels, scale, dtype, message):
    with pytest.raises(InvalidArgumentError, match=message):
        normalise(pixels, scale, [0.0] * len(scale), dtype)


def test_into_a_given_buffer_the_same_numbers():
    pixels = torch.randint(0, 256, (3, 5, 6, 3), dtype=torch.uint8)
    scale, shift = [0.01, 0.02, 0.03], [-1.0, -2.0, -3.0]
    out = torch.full((3, 5, 6, 3), 7.0)
    got = normalise(pixels, scale, shift, torch.float32, out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, normalise(pixels, scale, shift, torch.float32))


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (torch.zeros(3, 5, 6, 3, dtype=torch.float64), "out should be a contiguous torch.float32"),
        (
            torch.zeros(3, 5, 6, 2),
            r"\(3, 5, 6, 3\) tensor on cpu, found torch.float32 \(3, 5, 6, 2",
        ),
        (torch.zeros(3, 6, 5, 3).transpose(1, 2), "out should be a contiguous"),
        (torch.zeros(3, 5, 6, 3).numpy(), "found ndarray"),
    ],
)
def test_a_wrong_buffer_is_refused(out, message):
    pixels = torch.zeros(3, 5, 6, 3, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match=message):
        normalise(pixels, [1.0] * 3, [0.0] * 3, torch.float32, out)
