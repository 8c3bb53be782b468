"""pack-images merge: real sharded packs of a folder merge into the whole, refusals exit 1."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from imgpack.errors import FormatError, OutputExistsError, PackError
from imgpack.format.index import read_index
from imgpack.packer.cli import main
from imgpack.packer.merge import merge_packs
from imgpack.packer.pack import pack_folder
from imgpack.shards import open_shards

runner = CliRunner()


def run(*args):
    return runner.invoke(main, [str(a) for a in args], prog_name="pack-images")


def pixels(path):
    ix = read_index(path)
    raw = np.fromfile(ix.data_path, dtype=np.uint8)
    return ix.section_array("pixels", raw).reshape(ix.count, *ix.shape), ix


@pytest.fixture
def packed(image_folder, tmp_path):
    """One folder (3 classes x 4 JPEGs) packed whole and as 3 shards, all 16x12."""
    src = image_folder(classes=("ant", "bee", "cow"), per_class=4, width=40, height=30)
    opts = {"size": (16, 12), "workers": 1, "progress": False}
    whole = tmp_path / "whole.bin"
    pack_folder(src, whole, **opts)
    (tmp_path / "shards").mkdir()
    shards = [tmp_path / "shards" / f"part-{i:05d}.bin" for i in range(3)]
    for i, out in enumerate(shards):
        pack_folder(src, out, num_shards=3, shard_index=i, **opts)
    return whole, shards


def test_merged_shards_are_the_whole_pack(packed, tmp_path):
    whole, shards = packed
    out = tmp_path / "all.manifest.json"
    manifest, warnings = merge_packs(out, shards)
    raw = json.loads(out.read_text())
    assert manifest == raw and raw["count"] == 12 and len(raw["shards"]) == 3 and warnings == []
    assert [s["path"] for s in raw["shards"]] == [f"shards/part-{i:05d}.bin" for i in range(3)]
    assert raw["packer"] == {"size": [16, 12], "resize": "center-crop", "filter": "bilinear"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
    want, wix = pixels(whole)
    got = np.concatenate([pixels(p)[0] for p in shards])
    np.testing.assert_array_equal(got, want)  # merged order = the whole pack's order
    st = raw["stats"]
    for key in ("pixels", "sum", "sum_sq"):
        assert st[key] == wix.raw["stats"][key]
    np.testing.assert_allclose(st["mean"], wix.mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(st["std"], wix.std, rtol=0, atol=1e-12)
    assert raw["classes"] == ["ant", "bee", "cow"]
    assert [ix.count for ix in open_shards(out)] == [4, 4, 4]


def test_cli_merge_and_its_refusals(packed, tmp_path):
    whole, shards = packed
    out = tmp_path / "all.manifest.json"
    result = run("merge", out, *shards)
    assert result.exit_code == 0, result.output
    assert "merged 3 shards (12 records, 12x16, 3 classes) into all.manifest.json" in result.stderr
    again = run("merge", out, *shards)
    assert again.exit_code == 1 and "use --force" in again.stderr
    assert run("merge", out, *shards, "--force", "-q").exit_code == 0

    partial = run("merge", tmp_path / "p.manifest.json", shards[0], shards[2])
    assert partial.exit_code == 1
    line = partial.stderr.strip()
    assert line.startswith("pack-images: error: ") and "\n" not in line
    assert (
        "shards 1 of 3 of source 'src' missing (merge every shard, or pass --allow-partial)" in line
    )

    allowed = run("merge", tmp_path / "p.manifest.json", shards[0], shards[2], "--allow-partial")
    assert allowed.exit_code == 0
    assert "pack-images: warning: partial dataset: shards 1 of 3" in allowed.stderr
    assert json.loads((tmp_path / "p.manifest.json").read_text())["partial"] is True

    twice = run("merge", tmp_path / "t.manifest.json", *shards, shards[1])
    assert twice.exit_code == 1 and "part-00001.bin: holds the same records as" in twice.stderr
    overlap = run("merge", tmp_path / "o.manifest.json", whole, shards[0])
    assert (
        overlap.exit_code == 1
        and "whole.bin: holds files 0..12 of source 'src', overlapping" in overlap.stderr
    )
    assert run("merge", out).exit_code == 2  # no shards: a usage error


def test_refused_outputs(packed, tmp_path):
    _, shards = packed
    index = shards[0].with_suffix(".json")
    before = index.read_bytes()
    with pytest.raises(OutputExistsError, match="part-00000.json: exists and is not a manifest"):
        merge_packs(index, shards, force=True)  # a shard's own index
    with pytest.raises(OutputExistsError, match="not a manifest"):
        merge_packs(tmp_path / "whole.json", shards, force=True)  # another pack's index
    assert index.read_bytes() == before
    with pytest.raises(PackError, match="NAME.json"):
        merge_packs(tmp_path / "all.bin", shards)
    with pytest.raises(PackError, match="output folder does not exist"):
        merge_packs(tmp_path / "nope" / "all.manifest.json", shards)


def test_disagreeing_shard_named(packed, image_folder, tmp_path):
    _, shards = packed
    src = image_folder(classes=("ant", "bee", "cow"), per_class=4, width=40, height=30)
    other = tmp_path / "other.bin"
    pack_folder(src, other, size=(16, 12), filter="lanczos", workers=1, progress=False,
                num_shards=3, shard_index=1)  # fmt: skip
    with pytest.raises(FormatError, match=r"other\.bin: packer filter is 'lanczos'"):
        merge_packs(tmp_path / "x.manifest.json", [shards[0], other, shards[2]])
    assert not (tmp_path / "x.manifest.json").exists()


@pytest.fixture
def interleaved(image_folder, tmp_path):
    """The same folder (3 classes x 4) as 3 interleaved shards: files i, i+3, i+6, i+9."""
    src = image_folder(classes=("ant", "bee", "cow"), per_class=4, width=40, height=30)
    (tmp_path / "il").mkdir()
    shards = [tmp_path / "il" / f"part-{i:05d}.bin" for i in range(3)]
    for i, out in enumerate(shards):
        pack_folder(src, out, size=(16, 12), workers=1, progress=False, num_shards=3,
                    shard_index=i, shard_by="interleaved")  # fmt: skip
    return shards


def test_merged_interleaved_shards_are_the_whole_pack_in_shard_order(packed, interleaved, tmp_path):
    whole, _ = packed
    out = tmp_path / "il.manifest.json"
    result = run("merge", out, *interleaved)
    assert result.exit_code == 0, result.output
    raw = json.loads(out.read_text())
    assert raw["count"] == 12 and raw["partial"] is False
    assert [s["shard"]["by"] for s in raw["shards"]] == ["interleaved"] * 3
    want, wix = pixels(whole)
    got = np.concatenate([pixels(p)[0] for p in interleaved])
    # global order = the shards' concatenation, which is not the source order
    order = [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]
    np.testing.assert_array_equal(got, want[order])
    for key in ("pixels", "sum", "sum_sq"):
        assert raw["stats"][key] == wix.raw["stats"][key]
    for p in interleaved:  # every shard holds every class
        assert sorted(set(read_index(p).read_section("labels").tolist())) == [0, 1, 2]
    assert [ix.count for ix in open_shards(out)] == [4, 4, 4]


def test_shard_local_ranks_see_every_class_only_with_interleaved_shards(packed, interleaved):
    from imgpack import PackedImageDataset, make_loader
    from imgpack.reader.options import DistributedOptions

    _, contiguous = packed
    for shards, classes_per_rank in ((interleaved, 3), (contiguous, 1)):
        ds = PackedImageDataset(shards)
        for rank in range(3):
            ranks = DistributedOptions(rank=rank, world_size=3, shard_local=True)
            loader = make_loader(ds, 2, seed=0, distributed=ranks)
            labels = {int(v) for _, lab in loader for v in lab}
            assert len(labels) == classes_per_rank, (shards[0].parent.name, rank, labels)


def test_interleaved_merge_refusals(packed, interleaved, image_folder, tmp_path):
    whole, contiguous = packed
    mixed = run("merge", tmp_path / "m.manifest.json", contiguous[0], contiguous[1], interleaved[2])
    assert mixed.exit_code == 1
    assert (
        "il/part-00002.bin: holds shard 2 of 3 --shard-by interleaved of source 'src', cut "
        "another way than files 0..4 in " in mixed.stderr
    ) and "(merge each shard once, cut with one --shard-by;" in mixed.stderr

    missing = run("merge", tmp_path / "p.manifest.json", interleaved[0], interleaved[2])
    assert missing.exit_code == 1
    assert "shards 1 of 3 of source 'src' missing (merge every shard, or pass --allow-partial)" in (
        missing.stderr
    )
    allowed = run(
        "merge", tmp_path / "p.manifest.json", interleaved[0], interleaved[2], "--allow-partial"
    )
    assert allowed.exit_code == 0
    assert "pack-images: warning: partial dataset: shards 1 of 3" in allowed.stderr
    assert json.loads((tmp_path / "p.manifest.json").read_text())["partial"] is True

    with pytest.raises(
        FormatError, match=r"whole\.bin: holds files 0\.\.12 .* cut another way than"
    ):
        merge_packs(tmp_path / "w.manifest.json", [*interleaved, whole])

    src = image_folder(classes=("ant", "bee", "cow"), per_class=4, width=40, height=30)
    half = tmp_path / "half-0.bin"
    pack_folder(src, half, size=(16, 12), workers=1, progress=False, num_shards=2,
                shard_index=0, shard_by="interleaved")  # fmt: skip
    with pytest.raises(
        FormatError, match=r"00001\.bin: holds shard 1 of 3 .* of 2 .*one --num-shards"
    ):
        merge_packs(tmp_path / "h.manifest.json", [interleaved[1], half])
    assert not any(tmp_path.glob("[mwh].manifest.json"))
