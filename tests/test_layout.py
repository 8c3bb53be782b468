"""The architecture, checked: no import cycles, the packer without torch, the reader without Pillow.

Every module under imgpack/ is parsed with ``ast``; an import counts wherever it is
written (module level, class body or inside a function) except under ``if
TYPE_CHECKING:``, which never runs. Cycles are looked for among module-level imports
only (a function-level import is the usual way to break one). A subprocess then checks
what importing the two entry points really loads.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "imgpack"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Imports(ast.NodeVisitor):
    """(imported module, module_level) for every import that can run."""

    def __init__(self, here: str, is_package: bool) -> None:
        self.here, self.is_package, self.depth, self.found = here, is_package, 0, []

    def _in_function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _in_function

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.extend((alias.name, self.depth == 0) for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(node, self.here, self.is_package)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self.found.append((sub if sub in MODULES else base, self.depth == 0))


def imports(name: str) -> list[tuple[str, bool]]:
    path = MODULES[name]
    visitor = _Imports(name, path.name == "__init__.py")
    visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return visitor.found


def _top(name: str) -> str:
    return name.split(".")[0]


def _matches(imported: str, banned: str) -> bool:
    return imported == banned or imported.startswith(banned + ".")


PACKER = [m for m in MODULES if m.startswith(("imgpack.packer", "imgpack.format"))]
PACKER += ["imgpack.manifest", "imgpack.shards", "imgpack.validate", "imgpack.errors"]
PACKER += ["imgpack.console"]
READER = [m for m in MODULES if m.startswith("imgpack.reader")]


def test_the_parser_sees_the_imports_it_should():
    """Guards the checks below against passing because nothing was found."""
    assert {"imgpack.packer.cli", "imgpack.reader.dataset", "imgpack.validate"} <= set(MODULES)
    assert ("torch", True) in imports("imgpack.reader.dataset")
    assert ("click", True) in imports("imgpack.packer.cli")
    assert ("imgpack.format.index", True) in imports("imgpack.manifest")
    assert ("tqdm.auto", False) in imports("imgpack.diagnose.meter")  # a function-level one
    assert ("imgpack.reader.multi", False) in imports("imgpack.reader.dataset")
    assert all(m in MODULES for m in PACKER + READER)


def _cycle() -> list[str] | None:
    graph = {m: sorted({i for i, top in imports(m) if top and i in MODULES} - {m}) for m in MODULES}
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in graph:
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_between_imgpack_modules():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize(
    ("modules", "banned"),
    [
        (PACKER, ("torch",)),
        (READER, ("PIL", "click", "tqdm", "imgpack.packer")),
        (list(MODULES), ("workbench",)),
    ],
    ids=["packer-without-torch", "reader-without-pillow-click-tqdm-packer", "no-workbench"],
)
def test_banned_imports_anywhere_in_a_module(modules, banned):
    bad = [
        f"{m} imports {i}" + ("" if top else " (in a function)")
        for m in modules
        for i, top in imports(m)
        if any(_matches(i, b) for b in banned)
    ]
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize(
    ("module", "banned", "first"),
    [
        ("imgpack.packer.cli", ("torch",), ""),
        # torch itself loads tqdm (torch.hub): only what imgpack adds on top of torch counts
        ("imgpack.reader.dataset", ("PIL", "click", "tqdm", "imgpack.packer"), "torch"),
    ],
)
def test_what_importing_an_entry_point_loads(module, banned, first):
    code = (
        f"import json, sys\n{'import ' + first if first else ''}\nbefore = set(sys.modules)\n"
        f"import {module}\n"
        f"print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    new = json.loads(out.stdout)
    assert module in new  # the import really ran in this interpreter
    loaded = [m for m in new if any(_matches(m, b) for b in banned)]
    assert not loaded, f"import {module} loads {', '.join(loaded)}"
