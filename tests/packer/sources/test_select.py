"""SRC... to one source: brace ranges, globs, sorted order, the kind, every refusal one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from make_sources import encoded, samples, shard, write_parquet

from imgpack.errors import InvalidArgumentError, SourceError
from imgpack.packer.cli import main
from imgpack.packer.sources.folder import FolderSource
from imgpack.packer.sources.select import expand_braces, open_source, resolve_sources
from imgpack.packer.sources.tar import TarSource


def test_brace_ranges_expand_as_webdataset_and_bash_do():
    assert expand_braces("train-{000000..000002}.tar") == [
        "train-000000.tar", "train-000001.tar", "train-000002.tar"]  # fmt: skip
    assert expand_braces("s{8..11}") == ["s8", "s9", "s10", "s11"]
    assert expand_braces("s{3..1}") == ["s3", "s2", "s1"]
    assert expand_braces("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    assert expand_braces("x{}y{z}.tar") == ["x{}y{z}.tar"]  # neither a range nor a list
    with pytest.raises(InvalidArgumentError, match="names too many files"):
        expand_braces("s{0..99999999999}")


def test_sources_are_sorted_and_named_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("b-2.tar", "b-10.tar", "a-1.tar", "odd[1].tar"):
        (tmp_path / name).write_bytes(b"")
    found = resolve_sources(["b-*.tar", "a-1.tar", str(tmp_path / "b-2.tar"), "odd[1].tar"])
    assert found == [str(tmp_path / n) for n in ("a-1.tar", "b-10.tar", "b-2.tar", "odd[1].tar")]
    assert resolve_sources(["b-{2,10}.tar"]) == [
        str(tmp_path / "b-10.tar"),
        str(tmp_path / "b-2.tar"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["t-{0..3}.tar"], "t-2.tar: no such file (named by t-{0..3}.tar; missing: 2 of its 4 "
         "files)"),
        (["u-{0..1}.tar"], "u-{0..1}.tar: no file matches this pattern"),
        (["v-*.tar"], "v-*.tar: no file matches this pattern"),
        (["gone.tar"], "gone.tar: no such file or folder"),
    ],
)  # fmt: skip
def test_a_pattern_or_range_that_misses_is_one_line_naming_it(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    for name in ("t-0.tar", "t-1.tar"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SourceError) as err:
        open_source(args)
    assert str(err.value) == message


@pytest.mark.parametrize("pattern", ["t*/train-{0..9}.tar", "tars/train-{0..9}*.tar"])
def test_a_range_inside_a_glob_needs_every_name_it_makes(tmp_path, monkeypatch, pattern):
    monkeypatch.chdir(tmp_path)
    for k in range(4):
        shard(tmp_path / "tars" / f"train-{k}.tar", samples(1))
    with pytest.raises(SourceError) as err:
        open_source([pattern])
    missing = pattern.replace("{0..9}", "4")
    assert str(err.value) == (
        f"{missing}: no such file (named by {pattern}; missing: 6 of its 10 files)"
    )
    assert len(resolve_sources([pattern.replace("9", "3")])) == 4


def test_the_kind_comes_from_the_extension_and_is_one_per_pack(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shard(tmp_path / "a.tar", samples(1))
    write_parquet(tmp_path / "b.parquet", samples(1))
    (tmp_path / "folder").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "c.tar.gz").write_bytes(b"")
    (tmp_path / "d.zip").write_bytes(b"")
    assert isinstance(open_source(["a.tar"]), TarSource)
    assert isinstance(open_source("folder"), FolderSource)
    refusals = {
        ("b.parquet", "a.tar"): "b.parquet: a Parquet file, while a.tar is a tar shard; pack one",
        ("a.tar", "folder"): "folder: a folder, while a.tar is a tar shard; pack one folder, or",
        ("folder", "other"): "other: a folder, while folder is a folder; pack one folder, or .tar",
        ("c.tar.gz",): "c.tar.gz: a compressed tar; shards are read in place, so they must be "
        "plain .tar (decompress the shard, e.g. gunzip, first",
        ("d.zip",): "d.zip: not a source pack-images reads (a folder, WebDataset .tar shards",
    }
    for args, message in refusals.items():
        with pytest.raises(SourceError, match=message.replace("(", r"\(").replace(".", r"\.")):
            open_source(list(args))


def test_options_of_another_kind_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shard(tmp_path / "a.tar", samples(1))
    (tmp_path / "folder").mkdir()
    (tmp_path / "labels.csv").write_text("path,label\n")
    for kw, message in [
        (
            {"image_column": "x"},
            "--image-column is for Parquet files, and the source is tar shards",
        ),
        ({"label_key": "y"}, "--label-key is for tar shards, and the source is a folder"),
        ({"labels": "labels.csv"}, "--labels labels.csv lists files under a folder; tar sources"),
    ]:
        src = "folder" if "label_key" in kw else "a.tar"
        with pytest.raises(InvalidArgumentError, match=message):
            open_source(src, **kw)
    (tmp_path / "list.txt").write_text("a\n")
    with pytest.raises(InvalidArgumentError, match="--classes-from numbers labels"):
        open_source("a.tar", labels="none", classes_from="list.txt")
    with pytest.raises(InvalidArgumentError, match="--classes-from numbers labels"):
        open_source("folder", labels="none", classes_from="no-such-list.txt")  # read no file
    write_parquet(tmp_path / "b.parquet", samples(1))
    for src, kw in [("a.tar", {"label_key": "y"}), ("b.parquet", {"label_column": "nope"})]:
        flag = "--label-key y" if "label_key" in kw else "--label-column nope"
        with pytest.raises(InvalidArgumentError) as err:
            open_source(src, labels="none", **kw)
        assert str(err.value) == (
            f"{flag} says where the labels are, and --labels none packs none; drop one of them"
        )
    open_source("b.parquet", labels="none", label_column="none")  # says the same twice


def test_every_refusal_on_the_command_line_is_one_line_and_exit_1(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shard(tmp_path / "train-000000.tar", samples(2))
    (tmp_path / "bad.tar").write_bytes(encoded(1))
    write_parquet(tmp_path / "x.parquet", samples(1))
    runner = CliRunner()
    cases = {
        ("train-{000000..000001}.tar",): "train-000001.tar: no such file (named by",
        ("train-*.tar", "x.parquet"): "x.parquet: a Parquet file, while train-000000.tar is a",
        ("nothing-*.tar",): "nothing-*.tar: no file matches this pattern",
        ("bad.tar",): "bad.tar: not a readable tar file (",
        ("train-000000.tar", "--image-column", "img"): "--image-column is for Parquet files",
        ("train-000000.tar", "--labels", "none", "--label-key", "y"): "--label-key y says",
        ("x.parquet", "--labels", "none", "--label-column", "nope"): "--label-column nope says",
        ("train-000000.tar", "--labels", "none", "--classes-from", "c.txt"): "--classes-from",
    }
    for args, fragment in cases.items():
        result = runner.invoke(main, [*args, "out.bin"])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1, (args, result.output)
        assert lines[0].startswith("pack-images: error: ") and fragment in lines[0], lines
        assert not (tmp_path / "out.bin").exists()
    ok = runner.invoke(main, ["train-{000000..000000}.tar", "out.bin", "--size", "8", "-q"])
    assert ok.exit_code == 0, ok.output


def test_a_folder_of_shards_given_as_src_says_to_name_them(tmp_path):
    from imgpack.packer.pack import pack_folder

    for k in range(2):
        shard(tmp_path / "shards" / f"s-{k}.tar", samples(1))
    for labels in ("folders", "none"):
        with pytest.raises(SourceError) as err:
            pack_folder(tmp_path / "shards", tmp_path / "p.bin", labels=labels)
        assert str(err.value).endswith(
            f"; it holds 2 .tar files: to pack them, name them, e.g. with a glob: "
            f"'{tmp_path / 'shards'}/*.tar'"
        )


@pytest.mark.parametrize("kind", ["folder", "tar", "parquet"])
def test_every_kind_lists_once_whatever_asks(tmp_path, kind):
    from imgpack.packer.sources.source import Source, span

    if kind == "folder":
        (tmp_path / "src" / "a").mkdir(parents=True)
        (tmp_path / "src" / "a" / "x.jpg").write_bytes(encoded(1))
        src = tmp_path / "src"
    elif kind == "tar":
        src = [shard(tmp_path / f"s-{k}.tar", samples(2)) for k in range(2)]
    else:
        src = [write_parquet(tmp_path / f"s-{k}.parquet", samples(2)) for k in range(2)]
    source = open_source(src)
    calls = []
    made = type(source).make_listing
    source.make_listing = lambda: calls.append(1) or made(source)
    assert Source in type(source).__mro__  # listing() is written once, there
    source.listing(), source.identity(), source.describe(), list(source.feed([0]))
    assert calls == [1] and source.listing() is source.listing()
    if kind != "folder":
        noun = "tar shards" if kind == "tar" else "Parquet files"
        assert source.describe()["source"] == f"s-0.{kind} .. s-1.{kind} (2 {noun})"
    assert span("a", "z", 1, "files") == "a" and span("a", "z", 3, "n") == "a .. z (3 n)"
