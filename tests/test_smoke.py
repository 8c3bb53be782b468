"""The shared fixture writes a pack that the format module reads back exactly."""

import numpy as np

from imgpack.format.index import read_index


def test_fixture_pack_round_trips(make_pack):
    path, pixels, labels = make_pack(count=4)
    index = read_index(path)
    assert index.count == 4
    assert index.shape == (8, 6, 3)
    np.testing.assert_array_equal(index.read_section("labels"), labels)
    raw = np.fromfile(path, dtype=np.uint8, offset=index.data_offset, count=pixels.size)
    np.testing.assert_array_equal(raw.reshape(pixels.shape), pixels)
