"""A pack in object storage reads as the same pack read locally: samples, batches, every
loader mode, resumption; records fetched in blocks, each once, into a cache that persists."""

# ruff: noqa: F811 - the fixtures of servers.py are imported, then asked for by name
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_pack
from servers import http, reads, s3, s3_fs, s3_server, small_blocks  # noqa: F401 - fixtures

from imgpack import DeviceTransform, PackedImageDataset, make_loader
from imgpack.reader.options import WorkerOptions


@pytest.fixture(scope="module")
def pack(tmp_path_factory, s3_fs):
    """(s3 URL of a 64-record 64x64 pack, its local .bin, pixels, labels): made once, read
    by each test into a cache folder of its own."""
    out, pixels, labels = write_pack(tmp_path_factory.mktemp("pack"), 64, 64, 64)
    bucket = "shared-pack"
    s3_fs.mkdir(bucket)
    for local in (out, out.with_suffix(".json")):
        s3_fs.put_file(str(local), f"{bucket}/{local.name}")
    return f"s3://{bucket}/{out.name}", out, pixels, labels


def batches(loader):
    return [(x.clone(), y.clone()) for x, y, *_ in loader]


def test_samples_and_batches_match_the_local_pack(pack, tmp_path, reads):
    url, out, pixels, labels = pack
    ds = PackedImageDataset(url, cache_dir=tmp_path / "c")  # AWS_ENDPOINT_URL: no code
    assert len(ds) == 64 and ds.classes == ["a", "b", "c"] and not reads  # metadata only
    image, label = ds[10]
    assert (image.permute(1, 2, 0).numpy() == pixels[10]).all() and label == labels[10]
    assert len(reads) == 1 and reads[0][1] - reads[0][0] == 3 * 12288  # one block, 3 records
    images, got = ds.gather([63, 0, 11, 10])
    assert (images.permute(0, 2, 3, 1).numpy() == pixels[[63, 0, 11, 10]]).all()
    assert got.tolist() == labels[[63, 0, 11, 10]].tolist()
    assert len(reads) == 3  # block 3 (records 9..11) was there already
    assert [s[1] for s in ds.__getitems__([5, 6])] == labels[[5, 6]].tolist()


@pytest.mark.parametrize("mode", ["inprocess", "workers", "transform", "resident"])
def test_every_loader_mode_gives_the_local_batches(pack, tmp_path, mode):
    url, out, *_ = pack
    remote = PackedImageDataset(url, cache_dir=tmp_path / "c")
    local = PackedImageDataset(out)
    kw = {"inprocess": {}, "workers": {"num_workers": 2, "options": WorkerOptions()}}.get(mode, {})
    if mode == "transform":
        kw = {"transform": DeviceTransform.eval(local, 32), "device": "cpu"}
    if mode == "resident":
        kw = {"resident": True, "device": "cpu"}
    want = batches(make_loader(local, 16, seed=3, **kw))
    got = batches(make_loader(remote, 16, seed=3, **kw))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(want, got))
    assert len(got) == 4


def test_the_cache_outlives_the_process_and_resumes(pack, tmp_path, reads):
    url, out, *_ = pack
    loader = make_loader(PackedImageDataset(url, cache_dir=tmp_path / "c"), 16, seed=1)
    it = iter(loader)
    first = next(it)[0].clone()
    state = loader.state_dict()
    fetched = len(reads)
    # a later run (a new dataset, as in another process) fetches only what it lacks
    again = make_loader(PackedImageDataset(url, cache_dir=tmp_path / "c"), 16, seed=1)
    again.load_state_dict(state)
    rest = batches(again)
    assert len(rest) == 3 and len(reads) - fetched <= 22 - 0
    whole = batches(make_loader(PackedImageDataset(out), 16, seed=1))
    assert torch.equal(first, whole[0][0]) and torch.equal(rest[0][0], whole[1][0])
    before = len(reads)
    batches(make_loader(PackedImageDataset(url, cache_dir=tmp_path / "c"), 16, seed=1))
    assert len(reads) == before  # everything is cached now: nothing fetched
    assert sorted(set(reads)) == sorted(reads)  # no block was fetched twice


def test_a_limit_below_the_pack_reads_block_order_within_the_limit(pack, tmp_path, reads):
    from imgpack.remote.cache import allocated

    url, out, pixels, labels = pack
    limit = 64 * 12288 // 2  # half the pack
    ds = PackedImageDataset(url, cache_dir=tmp_path / "c", cache_limit=f"{limit}B")
    loader = make_loader(ds, 8, seed=2)
    assert loader.order.order == "block"
    for epoch in range(2):
        reads.clear()
        seen = []
        for images, got in loader:
            assert allocated(tmp_path / "c") <= limit
            seen.extend(got.tolist())
            assert images.shape == (8, 3, 64, 64)
        assert sorted(seen) == sorted(labels.tolist())
        fetched = sum(b - a for a, b in reads)
        assert fetched <= 1.1 * pixels.nbytes, (epoch, fetched)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_smallest_limit_accepted_serves_a_default_loader(pack, tmp_path, workers):
    """The least cache_limit the dataset takes (its error names it) carries a default loader
    of 32-record batches, more than the limit holds, to the local pack's batches."""
    url, out, *_ = pack
    with pytest.raises(ValueError, match=r"too small; this pack needs at least \d+") as e:
        PackedImageDataset(url, cache_dir=tmp_path / "c", cache_limit=1000)
    least = int(str(e.value).split("at least ")[1].split()[0])
    assert least < 32 * 12288
    remote = PackedImageDataset(url, cache_dir=tmp_path / "c", cache_limit=least)
    kw = {"num_workers": workers} if workers else {}

    def epoch(ds, seed):  # every (label, pixels) served, in any order
        got = batches(make_loader(ds, 32, seed=seed, **kw))
        return sorted((int(y), x.numpy().tobytes()) for xs, ys in got for x, y in zip(xs, ys))

    assert epoch(remote, 0) == epoch(PackedImageDataset(out), 0)


def test_ranks_read_disjoint_parts_of_a_remote_pack(pack, tmp_path):
    from imgpack.reader.options import DistributedOptions

    url, out, _, labels = pack
    seen = []
    for rank in range(2):
        ds = PackedImageDataset(url, cache_dir=tmp_path / "c")
        dist = DistributedOptions(rank=rank, world_size=2)
        for _, got in make_loader(ds, 8, seed=4, distributed=dist):
            seen.extend(got.tolist())
    assert sorted(seen) == sorted(labels.tolist())


def test_a_manifest_and_a_list_of_packs_at_urls(make_pack, http, tmp_path):
    from click.testing import CliRunner

    from imgpack.packer.cli import main

    a, pa, _ = make_pack(count=20, height=64, width=64, name="a")
    b, pb, _ = make_pack(count=30, height=64, width=64, name="b")
    merged = CliRunner().invoke(main, ["merge", str(tmp_path / "all.json"), str(a), str(b)])
    assert merged.exit_code == 0, merged.output
    want = np.concatenate([pa, pb])
    for source in (f"{http.url}/all.json", [f"{http.url}/a.bin", f"{http.url}/b.bin"]):
        ds = PackedImageDataset(source, cache_dir=tmp_path / "c")
        images, _ = ds.gather(np.arange(50)[::-1])
        assert (images.permute(0, 2, 3, 1).numpy() == want[::-1]).all()


def test_an_edited_manifest_at_a_url_is_refused_by_its_own_name(make_pack, http, tmp_path):
    """The message names the manifest the user gave, not its copy in the cache folder."""
    import json

    from click.testing import CliRunner

    from imgpack.errors import FormatError
    from imgpack.packer.cli import main

    a, _, _ = make_pack(count=20, height=64, width=64, name="a")
    out = tmp_path / "all.json"
    assert CliRunner().invoke(main, ["merge", str(out), str(a)]).exit_code == 0
    out.write_text(json.dumps({**json.loads(out.read_text()), "count": 21}))
    with pytest.raises(FormatError, match=r"^all\.json: count is 21, its shards make 20"):
        PackedImageDataset(f"{http.url}/all.json", cache_dir=tmp_path / "c")


def test_tune_measures_a_pack_at_a_url_through_the_default_cache(
    pack, tmp_path, reads, monkeypatch
):
    """``pack-images tune URL`` opens the pack as the dataset does (the default cache folder,
    no limit); ``--cold`` drops the cache file's pages, not its blocks: a second run fetches
    nothing."""
    from click.testing import CliRunner

    from imgpack.packer.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    url = pack[0]
    args = ["tune", url, "--cold", "--batch-size", "16", "--budget-s", "1", "--repeats", "1",
            "--workers", "0", "--prefetch", "2"]  # fmt: skip
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "recommended: make_loader(ds, 16, " in out.output
    assert reads and any((tmp_path / "xdg" / "imgpack").rglob("*.bin"))
    fetched = len(reads)
    assert CliRunner().invoke(main, args).exit_code == 0 and len(reads) == fetched


def test_a_cut_manifest_at_a_url_is_one_line(http, tmp_path):
    from imgpack.errors import FormatError

    (tmp_path / "all.json").write_text('{"format": "imgpack-manifest", "shards": [')
    with pytest.raises(FormatError, match=r"^all\.json: invalid JSON at line 1"):
        PackedImageDataset(f"{http.url}/all.json", cache_dir=tmp_path / "c")
