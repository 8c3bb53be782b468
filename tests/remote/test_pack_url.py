"""``pack-images SRC s3://...``: packed locally, uploaded data first and index last, read
back from the bucket as the same pack; tar shards at URLs are sources too."""

# ruff: noqa: F811 - the fixtures of servers.py are imported, then asked for by name
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from servers import http, reads, s3, s3_fs, s3_server, small_blocks  # noqa: F401 - fixtures

from imgpack import PackedImageDataset, make_loader
from imgpack.packer.cli import main
from imgpack.remote.store import Store


def shard(path: Path, first: int, count: int) -> None:
    """A WebDataset tar: key.png and key.cls per sample."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for k in range(first, first + count):
            png = io.BytesIO()
            Image.fromarray(np.full((20, 30, 3), 10 * k, np.uint8)).save(png, "PNG")
            for name, data in (
                (f"s{k:04d}.png", png.getvalue()),
                (f"s{k:04d}.cls", b"%d" % (k % 2)),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_pack_to_a_bucket_uploads_the_index_last(image_folder, s3, tmp_path, monkeypatch):
    src = image_folder()
    uploads = []
    write = Store.write
    monkeypatch.setattr(
        Store, "write", lambda self, local: (uploads.append(self.url), write(self, local))
    )
    url = f"s3://{s3.bucket}/train.bin"
    result = CliRunner().invoke(main, ["pack", str(src), url, "--size", "16", "-q"])
    assert result.exit_code == 0, result.output
    assert uploads == [url, url.replace(".bin", ".json")]
    assert (
        CliRunner()
        .invoke(main, [str(src), str(tmp_path / "local.bin"), "--size", "16", "-q"])
        .exit_code
        == 0
    )
    remote = make_loader(PackedImageDataset(url, cache_dir=tmp_path / "c"), 4, shuffle=False)
    local = make_loader(PackedImageDataset(tmp_path / "local.bin"), 4, shuffle=False)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(remote, local))


def test_tar_shards_at_a_url_are_sources(http, tmp_path):
    shard(tmp_path / "shards" / "train-000.tar", 0, 3)
    shard(tmp_path / "shards" / "train-001.tar", 3, 3)
    src = f"{http.url}/shards/train-{{000..001}}.tar"
    work = tmp_path / "work"
    result = CliRunner().invoke(
        main, ["pack", src, str(tmp_path / "out.bin"), "--size", "16", "--work", str(work), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert len(PackedImageDataset(tmp_path / "out.bin")) == 6
    assert sorted(p.name for p in (work / "sources").rglob("*.tar")) == [
        "train-000.tar",
        "train-001.tar",
    ]


def test_an_unreachable_output_is_one_line(image_folder, tmp_path):
    result = CliRunner().invoke(
        main, ["pack", str(image_folder()), "http://127.0.0.1:9/x.bin", "--size", "16", "-q"]
    )
    assert result.exit_code != 0 and "x.bin" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_sources_at_a_url_without_work_leave_no_copy_behind(http, tmp_path, monkeypatch):
    import tempfile

    shard(tmp_path / "shards" / "train-000.tar", 0, 3)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    src, out = f"{http.url}/shards/train-000.tar", tmp_path / "out.bin"
    result = CliRunner().invoke(main, ["pack", src, str(out), "--size", "16", "-q"])
    assert result.exit_code == 0, result.output
    assert len(PackedImageDataset(out)) == 3 and list((tmp_path / "tmp").iterdir()) == []


def test_a_retried_pack_to_a_bucket_continues_then_finds_it_complete(
    image_folder, s3, tmp_path, monkeypatch
):
    """A pipeline that reruns the same command, with no --work: the rerun after a Ctrl-C
    continues the pack, the rerun after success uploads nothing, another command is
    refused in one line, and --force packs again."""
    import tempfile

    from conftest import interrupt_after

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    uploads = []
    write = Store.write
    monkeypatch.setattr(
        Store, "write", lambda self, local: (uploads.append(self.url), write(self, local))
    )
    src, url = str(image_folder()), f"s3://{s3.bucket}/retried.bin"

    def pack(*more: str):
        return CliRunner().invoke(main, ["pack", src, url, "--size", "16", "--workers", "1", *more])

    restore = interrupt_after(monkeypatch, 3)
    assert pack().exit_code == 130 and uploads == []
    restore()
    again = pack()
    assert again.exit_code == 0, again.output
    assert "resuming: 2 of" in again.output and len(uploads) == 2
    assert list((tmp_path / "tmp").iterdir()) == []  # the command's folder, gone once published
    done = pack()
    assert done.exit_code == 0 and "already complete" in done.output, done.output
    assert len(uploads) == 2
    other = pack("--size", "24")
    assert other.exit_code != 0 and len(uploads) == 2
    assert (
        other.output.strip()
        .splitlines()[-1]
        .endswith(
            f"{url}: already exists; use --force to overwrite it "
            "(it was packed from another source or with other settings)"
        )
    )
    assert pack("--size", "24", "--force").exit_code == 0 and len(uploads) == 4
    assert PackedImageDataset(url, cache_dir=tmp_path / "c").shape[:2] == (24, 24)


@pytest.mark.parametrize("bad", ["a shard that is no tar", "a missing file of the range"])
def test_a_failed_pack_from_a_url_keeps_its_folder_for_the_rerun(bad, http, tmp_path, monkeypatch):
    """Without --work the folder is the command's own: a failure keeps what it fetched, the
    same command finds it again (fetching a shard again where the URL's has changed) and
    removes it once it succeeds."""
    import tempfile

    shard(tmp_path / "shards" / "train-000.tar", 0, 3)
    (tmp_path / "shards" / "train-001.tar").write_bytes(b"no tar " * 200)
    src = f"{http.url}/shards/train-001.tar"
    if bad == "a missing file of the range":
        src = f"{http.url}/shards/train-{{000..002}}.tar"
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    out = tmp_path / "out.bin"
    result = CliRunner().invoke(main, ["pack", src, str(out), "--size", "16", "-q"])
    assert result.exit_code == 1, result.output
    said = result.output.strip().splitlines()[-1]
    assert said.startswith("pack-images: error: ")
    if bad == "a shard that is no tar":  # the URL the user gave, not the copy in the folder
        assert said.startswith(f"pack-images: error: {src}: "), said
    (kept,) = (tmp_path / "tmp").iterdir()
    shard(tmp_path / "shards" / "train-001.tar", 3, 3)  # the source mended
    shard(tmp_path / "shards" / "train-002.tar", 6, 3)
    result = CliRunner().invoke(main, ["pack", src, str(out), "--size", "16", "-q"])
    assert result.exit_code == 0, result.output
    assert len(PackedImageDataset(out)) == (3 if bad == "a shard that is no tar" else 9)
    assert not kept.exists()


def test_a_pattern_at_a_url_that_matches_nothing_says_so(s3, tmp_path):
    url = f"s3://{s3.bucket}/shards/train-*.tar"
    result = CliRunner().invoke(main, ["pack", url, str(tmp_path / "o.bin"), "--size", "16"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"pack-images: error: {url}: no file matches this pattern"
    )


def test_a_source_fetched_again_asks_the_store_once(s3, tmp_path, monkeypatch):
    """A copy of the same size and date is not fetched again: one question (``info``)."""
    shard(tmp_path / "train-000.tar", 0, 2)
    store, local = Store(s3(tmp_path / "train-000.tar")), tmp_path / "copy.tar"
    store.download(local)
    assert local.read_bytes() == (tmp_path / "train-000.tar").read_bytes()
    fs, asked = store.filesystem()[0], []
    for name in ("info", "modified", "get_file"):
        real = getattr(fs, name)
        monkeypatch.setattr(
            fs, name, lambda *a, _n=name, _r=real, **k: (asked.append(_n), _r(*a, **k))[1]
        )
    store.download(local)
    assert asked == ["info"]


def test_sources_of_one_name_in_two_folders_at_urls_are_both_packed(http, tmp_path):
    """Copies are named by their URL's path, not their file name alone: the second never
    replaces the first."""
    shard(tmp_path / "a" / "train-000.tar", 0, 3)
    shard(tmp_path / "b" / "train-000.tar", 3, 3)
    urls = [f"{http.url}/{d}/train-000.tar" for d in ("a", "b")]
    out = tmp_path / "out.bin"
    result = CliRunner().invoke(main, ["pack", *urls, str(out), "--size", "16", "-q"])
    assert result.exit_code == 0, result.output
    ds = PackedImageDataset(out)
    assert [int(ds[i][0][0, 0, 0]) for i in range(len(ds))] == [0, 10, 20, 30, 40, 50]
    # named and ordered as the same shards in local folders a/ and b/ are
    assert [ds.source_path(i).split(":")[0] for i in (0, 3)] == [
        "a/train-000.tar",
        "b/train-000.tar",
    ]


@pytest.mark.parametrize("dated", [True, False])
def test_the_same_command_from_a_url_over_http_twice_is_complete(dated, http, tmp_path):
    """A retrying pipeline: the copies are dated by the server's Last-Modified (or, where it
    sends none, by their bytes), so the rerun finds the sources as packed, and a source
    changed at the URL is seen as changed."""
    http.dated = dated
    shard(tmp_path / "shards" / "train-000.tar", 0, 3)
    args = ["pack", f"{http.url}/shards/train-000.tar", str(tmp_path / "out.bin"), "--size", "16"]
    assert CliRunner().invoke(main, args).exit_code == 0
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "already complete" in again.output, again.output
    shard(tmp_path / "shards" / "train-000.tar", 1, 3)  # the same size, other pixels
    os.utime(tmp_path / "shards" / "train-000.tar", (1e9, 1e9))
    changed = CliRunner().invoke(main, args)
    assert changed.exit_code != 0 and "other contents" in changed.output, changed.output


def test_a_damaged_shard_at_a_url_is_named_by_its_url(http, tmp_path):
    """What the packer says of a source by its name in the pack (the file name, for shards
    fetched from URLs) names the URL the user gave: a cut shard, a bad image under
    --on-error fail."""
    shard(tmp_path / "cut.tar", 0, 3)
    (tmp_path / "cut.tar").write_bytes((tmp_path / "cut.tar").read_bytes()[:1500])
    shard(tmp_path / "bad.tar", 0, 3)
    (tmp_path / "bad.tar").write_bytes(
        (tmp_path / "bad.tar").read_bytes().replace(b"\x89PNG", b"\x00PNG")
    )
    shard(tmp_path / "a" / "bad.tar", 0, 3)  # a good shard of the bad one's name
    cut, bad, good = (f"{http.url}/{name}" for name in ("cut.tar", "bad.tar", "a/bad.tar"))
    for given, url, more in (
        ([cut], cut, []),
        ([bad], bad, ["--on-error", "fail"]),
        ([good, bad], bad, ["--on-error", "fail"]),  # the second of one name: in a folder
    ):
        out = str(tmp_path / "out.bin")
        result = CliRunner().invoke(main, ["pack", *given, out, "--size", "16", "-q", *more])
        assert result.exit_code == 1, result.output
        said = result.output.strip().splitlines()[-1]
        assert said.startswith(f"pack-images: error: {url}:"), said


def test_a_url_source_given_twice_is_packed_once(http, tmp_path):
    """As a local source given twice: its samples once; a range naming it again says so."""
    shard(tmp_path / "train-000.tar", 0, 3)
    url, out = f"{http.url}/train-000.tar", tmp_path / "out.bin"
    result = CliRunner().invoke(
        main, ["pack", url, f"{http.url}/train-{{000..000}}.tar", url, str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("fetched 1 source file(s)") == 2, result.output
    assert "fetched 0" not in result.output
    assert len(PackedImageDataset(out)) == 3


def test_what_is_published_at_the_output_url(http, tmp_path):
    """A rerun compares itself with the index at the URL: none there, or one line where
    what is there is no index."""
    from imgpack.remote import RemoteError
    from imgpack.remote.mirror import published

    assert published(f"{http.url}/none.bin") is None
    for text in ("{not json", "[1, 2]"):
        (tmp_path / "x.json").write_text(text)
        with pytest.raises(RemoteError, match=r"x\.json: already exists and is no imgpack index"):
            published(f"{http.url}/x.bin")
    (tmp_path / "x.json").write_text('{"format": "imgpack"}')
    assert published(f"{http.url}/x.bin") == {"format": "imgpack"}
