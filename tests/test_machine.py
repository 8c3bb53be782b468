"""mem_available sees a memory cgroup's limit, as a container's /proc/meminfo does not."""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import pytest

from imgpack import machine

GIB = 1 << 30


@pytest.fixture
def system(tmp_path, monkeypatch):
    """A folder that stands for /proc and /sys while the test runs: machine reads its files
    (``open``, ``os.path.exists``) from there."""
    real_open, real_exists = builtins.open, os.path.exists

    def here(path):
        path = os.fspath(path)
        return str(tmp_path) + path if path.startswith(("/proc/", "/sys/")) else path

    monkeypatch.setattr(machine, "open", lambda path, *a, **kw: real_open(here(path), *a, **kw),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(os.path, "exists", lambda path: real_exists(here(path)))
    _write(tmp_path / "proc", meminfo=f"MemTotal: {128 << 20} kB\nMemAvailable: {64 << 20} kB\n")
    return tmp_path


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)


def test_cgroup_v2_and_no_limit(system):
    _write(system / "proc" / "self", cgroup="0::/pod/a\n")
    root = system / "sys" / "fs" / "cgroup"
    _write(root, cgroup__controllers="cpu memory")
    _write(root / "pod" / "a", memory__max=str(2 * GIB), memory__current=str(GIB),
           memory__stat=f"anon 1\nfile {1 << 29}\n")  # fmt: skip
    assert machine.mem_available() == 2 * GIB - (1 << 29)
    (root / "pod" / "a" / "memory.max").write_text("max\n")
    assert machine.mem_available() == 64 * GIB  # no limit: MemAvailable


def test_mem_available_is_the_smaller(system):
    _write(system / "proc" / "self", cgroup="0::/\n")
    root = system / "sys" / "fs" / "cgroup"
    _write(root, cgroup__controllers="memory", memory__max=str(80 * GIB), memory__current="0")
    assert machine.mem_available() == 64 * GIB  # the cgroup has more room than the machine
    (root / "memory.max").write_text(str(GIB))
    assert machine.mem_available() == GIB
    (system / "proc" / "meminfo").unlink()
    assert machine.mem_available() == GIB
    (system / "proc" / "self" / "cgroup").unlink()
    assert machine.mem_available() is None  # neither is known
