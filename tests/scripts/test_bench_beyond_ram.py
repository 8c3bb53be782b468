"""The beyond-RAM bench's pieces: the big pack is the small pack's records repeated, and
one case's child reads it and reports its numbers (no timing is asserted)."""

from __future__ import annotations

import numpy as np
from workbench.beyond_ram import make_packs, run_case

from imgpack import PackedImageDataset
from imgpack.format.index import read_index


def test_big_pack_repeats_the_small_packs_records_and_a_child_reads_it(tmp_path):
    small, big = make_packs(tmp_path, 0.002, photos=6, side=96)
    a, b = read_index(small), read_index(big)
    assert a.codec == b.codec == "jpeg" and b.count > a.count
    i = a.count + 2  # the third record again
    np.testing.assert_array_equal(PackedImageDataset(big)[i][0], PackedImageDataset(small)[2][0])
    row = run_case(big, batches=2, batch=4, cgroup=None, cold=True)
    assert row["images"] == 8 and row["images_per_s"] > 0 and row["pack"] == "big.bin"
