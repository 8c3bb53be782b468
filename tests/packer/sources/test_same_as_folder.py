"""Packing a tar or Parquet source gives what packing the same images unpacked gives: the
same records byte for byte, the same labels and statistics, with every option; one pack
from any worker count; shards that merge back into the whole."""

from __future__ import annotations

import numpy as np
import pytest
from make_sources import encoded, shard, write_folder, write_parquet

from imgpack.format.index import read_index
from imgpack.packer.merge import merge_packs
from imgpack.packer.pack import pack_folder
from imgpack.reader.dataset import PackedImageDataset

CLASSES = ["c0", "c1", "c2"]


@pytest.fixture
def three_ways(tmp_path):
    """12 images (JPEG, one PNG, one too large to keep as it came) as a class folder, as 2
    tar shards and as 2 Parquet files, all in the folder's pack order."""
    rows = [(f"s{k:04d}", k % 3, encoded(k)) for k in range(12)]
    rows[4] = (rows[4][0], rows[4][1], encoded(4, fmt="PNG"))
    rows[7] = (rows[7][0], rows[7][1], encoded(7, 64, 48))
    rows.sort(key=lambda r: (r[1], r[0]))  # class, then name: the folder's order
    folder = write_folder(tmp_path / "folder", rows, CLASSES)
    for s, part in enumerate((rows[:5], rows[5:])):  # PNG members are named .jpg in the
        shard(tmp_path / "tar" / f"train-{s:06d}.tar", part)  # folder too: fine for Pillow
        write_parquet(tmp_path / "pq" / f"train-{s:05d}-of-00002.parquet", part, names=CLASSES)
    listed = tmp_path / "classes.txt"
    listed.write_text("\n".join(CLASSES) + "\n")
    return {
        "folder": (folder, {}),
        "tar": (str(tmp_path / "tar" / "train-{000000..000001}.tar"), {"classes_from": listed}),
        "parquet": (str(tmp_path / "pq" / "*.parquet"), {}),
    }


def stored(out):
    """What may not depend on where the images came from: every byte of every record, the
    labels, checksums, record sizes, statistics and what was kept as it came."""
    index = read_index(out)
    raw = np.fromfile(index.data_path, dtype=np.uint8)
    data = raw[index.data_offset : index.data_offset + int(index.record_offsets[-1])]
    return {
        "records": data.tobytes(),
        "labels": index.section_array("labels", raw).tolist(),
        "checksums": index.section_array("checksums", raw).tolist(),
        "sizes": np.asarray(index.record_sizes).tolist(),
        "classes": index.classes,
        "stats": index.raw["stats"],
        "jpeg": index.raw.get("jpeg"),
    }


@pytest.mark.parametrize(
    "options",
    [
        {"size": (16, 12)},
        {"size": (20, 20), "resize": "pad", "channels": 1},
        {"size": (12, 12), "codec": "yuv420", "crop_ratio": 0.875},
        {"size": (40, 40), "resize": "fit", "codec": "jpeg"},  # 40x30 JPEGs kept as they came
    ],
    ids=["raw", "pad-grey", "yuv420", "jpeg-as-is"],
)
def test_the_same_records_as_the_unpacked_folder(three_ways, tmp_path, options):
    packs = {}
    for kind, (src, extra) in three_ways.items():
        out = tmp_path / f"{kind}.bin"
        pack_folder(src, out, workers=2, progress=False, **options, **extra)
        packs[kind] = stored(out)
    assert packs["tar"] == packs["folder"]
    assert packs["parquet"] == packs["folder"]
    if options.get("codec") == "jpeg":
        assert packs["folder"]["jpeg"]["stored_as_is"] == 10  # not the PNG, not the 64x48


def test_one_pack_whatever_the_worker_count_or_the_run(three_ways, tmp_path):
    for kind, (src, extra) in three_ways.items():
        outs = []
        for workers in (1, 3):
            out = tmp_path / f"w{workers}" / f"{kind}.bin"
            out.parent.mkdir(exist_ok=True)
            pack_folder(src, out, size=(16, 12), workers=workers, **extra)
            outs.append((out.read_bytes(), out.with_suffix(".json").read_bytes()))
        assert outs[0] == outs[1], kind


@pytest.mark.parametrize("shard_by", ["contiguous", "interleaved"])
def test_shards_of_the_source_order_merge_into_the_whole(three_ways, tmp_path, shard_by):
    for kind in ("tar", "parquet"):
        src, extra = three_ways[kind]
        whole = tmp_path / f"{kind}-whole.bin"
        pack_folder(src, whole, size=(16, 12), workers=1, **extra)
        parts = []
        for i in range(3):  # one worker: what shards hold does not depend on it (above)
            out = tmp_path / f"{kind}-{shard_by}-{i}.bin"
            pack_folder(src, out, size=(16, 12), workers=1, num_shards=3, shard_index=i,
                        shard_by=shard_by, **extra)  # fmt: skip
            parts.append(out)
        manifest = tmp_path / f"{kind}-{shard_by}.manifest.json"
        merge_packs(manifest, parts)
        full, merged = PackedImageDataset(whole), PackedImageDataset(manifest)
        assert sorted(merged.samples) == sorted(full.samples) and len(merged) == 12
        if shard_by == "contiguous":
            assert list(merged.samples) == list(full.samples)
        by_name = dict(zip((n for n, _ in full.samples), range(len(full))))
        for k, (name, label) in enumerate(merged.samples):
            image, target = merged[k]
            want, want_label = full[by_name[name]]
            assert target == label == want_label and bool((image == want).all())
