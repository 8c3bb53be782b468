"""The open-time benchmark builds a valid pack and reports both timings."""

from workbench.bench_open import make_tiny_pack, time_open

from imgpack.reader.dataset import PackedImageDataset


def test_tiny_pack_is_valid_and_timed(tmp_path):
    pack = make_tiny_pack(tmp_path / "t.bin", 2500, classes=10)
    ds = PackedImageDataset(pack)
    assert len(ds) == 2500 and len(ds.classes) == 10
    assert ds.targets[:12] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert ds.source_path(2499) == "n00000009/n00000009_0002499.JPEG"
    result = time_open(pack, repeats=1)
    assert result["records"] == 2500
    assert result["read_index_s"] > 0 and result["dataset_open_s"] > 0
