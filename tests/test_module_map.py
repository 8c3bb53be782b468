"""docs/contributing.md names every module of imgpack/ in its map, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_module_map_names_every_module_and_no_other():
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    named = set(re.findall(r"^(imgpack/\S+\.py)\s", text, flags=re.M))
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "imgpack").rglob("*.py")}
    assert not modules - named, f"not in docs/contributing.md's map: {sorted(modules - named)}"
    assert not named - modules, f"named in the map, not in imgpack/: {sorted(named - modules)}"
