"""The README and the docs stay true: every Python block compiles, the main ones run, every
public name is documented and every documented name public, and no page sends a user into the
reader's internals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import imgpack
from imgpack import PackedImageDataset, make_loader
from imgpack.packer.cli import main as pack_images

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
READING = ROOT / "docs" / "reading.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(page: Path = README) -> list[str]:
    """Every ```python block of a markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)


def block_with(marker: str, page: Path = README) -> str:
    found = [b for b in python_blocks(page) if marker in b]
    assert len(found) == 1, f"{page.name}: expected one python block containing {marker!r}"
    return found[0]


def run_cli(*args: str) -> None:
    done = CliRunner().invoke(pack_images, [*args, "--quiet"] if args[0] != "merge" else args)
    assert done.exit_code == 0, done.output


@pytest.fixture
def packs(image_folder, tmp_path: Path) -> tuple[Path, Path]:
    """train.bin and val.bin (stretched, training classes), as the README packs them, but tiny."""
    src = image_folder(per_class=4, width=40, height=30)
    train, val = tmp_path / "train.bin", tmp_path / "val.bin"
    opts = ["--size", "32", "--resize", "stretch", "--filter", "lanczos", "--workers", "1"]
    run_cli(str(src), str(train), *opts)
    run_cli(str(src), str(val), *opts, "--classes-from", str(train))
    return train, val


# (page, i, block) for every python block of every page: one case per block, so a page
# without any has no case (rather than one that runs nothing)
BLOCKS = [(page, i, block) for page in PAGES for i, block in enumerate(python_blocks(page))]


def test_every_python_fence_is_found_as_a_block():
    """Guards the cases below: a fence the extractor misses would be a block never compiled."""
    for page in PAGES:
        fences = len(re.findall(r"^```python$", page.read_text(encoding="utf-8"), re.M))
        assert len(python_blocks(page)) == fences, page.name
    assert {p.name for p, _, _ in BLOCKS} >= {"README.md", "format.md", "reading.md"}


@pytest.mark.parametrize("page, i, block", BLOCKS, ids=[f"{p.name}-{i}" for p, i, _ in BLOCKS])
def test_every_python_block_compiles(page, i, block):
    compile(block, f"{page.name} python block {i}", "exec")


def substitute(block: str, train: Path, val: Path) -> str:
    return (
        block.replace('"cuda"', '"cpu"')
        .replace('"train.bin"', repr(str(train)))
        .replace('"val.bin"', repr(str(val)))
        .replace('"train.manifest.json"', repr(str(train.with_suffix(".manifest.json"))))
        .replace("num_workers=8", "num_workers=0")
    )


def test_train_from_a_pack_runs(packs, capsys):
    """The README's training block, run as a reader would paste it (only the paths changed)."""
    train, val = packs
    ns: dict = {}
    exec(compile(substitute(block_with("DeviceTransform.train"), train, val), "README", "exec"), ns)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
    assert [x.split(":")[0] for x in lines] == [f"epoch {e}" for e in range(4)]
    accuracy = [float(x.rsplit(" ", 1)[1]) for x in lines]
    assert all(0.0 <= a <= 1.0 for a in accuracy)
    images, labels = ns["images"], ns["labels"]  # the last training batch: the second size
    assert images.shape == (8, 3, 192, 192) and images.dtype == torch.bfloat16
    assert labels.dtype == torch.int64 and labels.shape == (8,)
    assert ns["T"].size == 192 and torch.isfinite(ns["loss"]).item()


@pytest.mark.filterwarnings("ignore:PackedImageDataset has a per-sample transform")
def test_imagefolder_migration_runs(packs):
    train, _ = packs
    calls: list[tuple[torch.dtype, torch.Size]] = []

    def T(image):
        calls.append((image.dtype, image.shape))
        return image

    ns = {
        "torch": torch,
        "PackedImageDataset": PackedImageDataset,
        "make_loader": make_loader,
        "T": T,
    }
    code = compile(substitute(block_with("ImageFolder"), train, train), "README", "exec")
    exec(code, ns)  # make_loader warns (once per process) that T makes it go sample by sample
    ds = ns["ds"]
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    assert ds.samples[0] == ("cat/000.jpg", 0) and ds.targets == [0] * 4 + [1] * 4
    images, labels = next(iter(ns["loader"]))
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,)
    image, label = ds[5]  # T ran in the loader's workers; here, it runs once
    assert image.dtype == torch.uint8 and label == 1
    assert calls == [(torch.uint8, torch.Size([3, 32, 32]))]


def test_reading_md_dataset_block_runs(packs):
    train, val = packs
    run_cli("merge", str(train.with_suffix(".manifest.json")), str(train))
    ns = {"PackedImageDataset": PackedImageDataset}
    block = block_with("classes_from=", READING)
    exec(compile(substitute(block, train, val), "docs/reading.md", "exec"), ns)
    ds = ns["ds"]  # the last line: the manifest, read as one dataset
    assert len(ds) == 8 and ds.classes == ["cat", "dog"] and ds.path.endswith(".manifest.json")


# --- the public surface, and the docs' links into it -------------------------------------------

DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
# What import imgpack gives is listed at the top of reading.md, in its first bullets.


def documented_names() -> set[str]:
    intro = READING.read_text(encoding="utf-8").split("\n## ")[0]
    bullets = [line for line in intro.splitlines() if line.startswith(("* ", "  "))]
    return set(re.findall(r"`(\w+)`", "\n".join(bullets)))


def test_every_public_name_is_documented_and_every_documented_name_is_public():
    public = {n for n in imgpack.__all__ if n != "__version__"}
    errors = {n for n in public if isinstance(getattr(imgpack, n), type)}
    errors = {n for n in errors if issubclass(getattr(imgpack, n), Exception)}
    text = " ".join(p.read_text(encoding="utf-8") for p in DOCS)
    undocumented = {n for n in public - errors if f"`{n}" not in text}
    undocumented |= {n for n in errors if f"`{n}`" not in READING.read_text(encoding="utf-8")}
    assert not undocumented, f"public, documented nowhere: {sorted(undocumented)}"
    listed = documented_names()
    assert {"PackedImageDataset", "make_loader", "watch", "WorkerOptions"} <= listed
    assert not listed - public, f"documented as public, not public: {listed - public}"
    imported = set()
    for page in DOCS:
        for names in re.findall(r"^from imgpack import (.+)$", page.read_text("utf-8"), re.M):
            imported |= {n.strip() for n in names.split(",")}
    assert imported <= public, f"imported from imgpack in the docs, not public: {imported - public}"


def test_no_page_sends_a_user_into_the_readers_internals():
    found = [
        f"{p.name}: {m}"
        for p in DOCS
        for m in re.findall(r"imgpack\.reader\.[\w.]+", p.read_text(encoding="utf-8"))
    ]
    assert not found, found


def test_docs_hold_pages_only():
    """Results go to out/ (scripts/common.py), never into docs/."""
    others = [p.name for p in (ROOT / "docs").iterdir() if p.suffix != ".md"]
    assert not others, others
