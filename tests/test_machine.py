"""mem_available sees a memory cgroup's limit, as a container's /proc/meminfo does not."""

from __future__ import annotations

from pathlib import Path

from imgpack import machine


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)


def test_cgroup_v1_limit_less_what_cannot_be_dropped(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("9:pids:/\n4:memory:/job/7\n0::/\n")
    _write(
        tmp_path / "sys" / "memory" / "job" / "7",
        memory__limit_in_bytes=str(1 << 30),
        memory__usage_in_bytes=str(700 << 20),
        memory__stat=f"cache {600 << 20}\ntotal_cache {500 << 20}\n",
    )
    # 1 GiB limit; 700 MiB used of which 500 MiB is page cache: 824 MiB of room
    assert machine._cgroup_room(str(proc), str(tmp_path / "sys")) == (1 << 30) - (200 << 20)


def test_cgroup_v2_and_no_limit(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pod/a\n")
    root = tmp_path / "sys"
    _write(root, cgroup__controllers="cpu memory")
    _write(root / "pod" / "a", memory__max=str(2 << 30), memory__current=str(1 << 30),
           memory__stat=f"anon 1\nfile {1 << 29}\n")  # fmt: skip
    assert machine._cgroup_room(str(proc), str(root)) == (2 << 30) - (1 << 29)
    (root / "pod" / "a" / "memory.max").write_text("max\n")
    assert machine._cgroup_room(str(proc), str(root)) is None


def test_mem_available_is_the_smaller(monkeypatch):
    monkeypatch.setattr(machine, "_number", lambda path, key: 64 << 20)  # KiB
    monkeypatch.setattr(machine, "_cgroup_room", lambda: 1 << 30)
    assert machine.mem_available() == 1 << 30
    monkeypatch.setattr(machine, "_cgroup_room", lambda: None)
    assert machine.mem_available() == 64 << 30
    monkeypatch.setattr(machine, "_number", lambda path, key: None)
    assert machine.mem_available() is None
