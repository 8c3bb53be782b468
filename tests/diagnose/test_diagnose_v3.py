"""tune and the meter on format version 3 packs: records of many sizes, yuv420."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from packs_v3 import write_v3

from imgpack import DeviceTransform, PackedImageDataset, make_loader, watch
from imgpack.packer.cli import main

SIZES = [(20, 16), (13, 16), (20, 7), (7, 5), (9, 11), (20, 3)] * 4


@pytest.mark.parametrize("codec", ["raw", "yuv420"])
def test_tune_measures_a_pack_of_many_sizes_and_says_what_the_call_needs(tmp_path, codec):
    pack, _, _ = write_v3(tmp_path / "p.bin", codec, sizes=SIZES)
    args = ["tune", str(pack), "--batch-size", "4", "--budget-s", "1", "--repeats", "1",
            "--workers", "0", "--prefetch", "2"]  # fmt: skip
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "failed" not in out.output and "recommended: make_loader(ds, 4, " in out.output
    assert "the call needs transform=DeviceTransform.train(ds, 224)" in out.output
    assert ("yuv420: measured with the conversion to RGB on the CPU" in out.output) == (
        codec == "yuv420"
    )


def test_the_meter_counts_the_images_of_a_yuv420_pack_of_many_sizes(tmp_path):
    ds = PackedImageDataset(write_v3(tmp_path / "p.bin", "yuv420", sizes=SIZES)[0])
    loader = make_loader(ds, 5, transform=DeviceTransform.train(ds, 8), device="cpu")
    lines = []
    watched = watch(loader, log=lines.append, progress=False)
    shapes = [tuple(x.shape) for x, _ in watched]
    assert shapes == [(5, 3, 8, 8)] * 4 + [(4, 3, 8, 8)]
    summary = watched.summary()
    # the first batch is timed apart (start-up), the rest counted image by image
    assert summary.first_batch_images == 5 and summary.batches == 4
    assert summary.images == len(SIZES) - 5
