"""The architecture, checked by what it promises, not by where code lives: no import cycles,
the packer (and the CLI) without torch, the format with numpy and the standard library only,
no module that imports another's private name, no benchmark figures in code, and what
importing each entry point loads.

Every module under imgpack/ is parsed with ``ast``; an import counts wherever it is
written: module level, class body, inside a function, or under ``if TYPE_CHECKING:``.
Cycles are looked for among all of them: an import moved into a function or under
TYPE_CHECKING hides a circle from Python, not from the reader of the code. The banned
imports ignore TYPE_CHECKING blocks, which never run. A subprocess then checks what
importing the entry points really loads, optional extras included.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
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
    """(imported module, module_level) for every import; those under ``if TYPE_CHECKING:``
    only with ``type_checking=True`` (they are written, but never run)."""

    def __init__(self, here: str, is_package: bool, type_checking: bool = False) -> None:
        self.here, self.is_package, self.depth, self.found = here, is_package, 0, []
        self.type_checking = type_checking

    def _in_function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _in_function

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING" and not self.type_checking:
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


@functools.cache  # each module parsed once for every check below
def _tree(name: str) -> ast.Module:
    path = MODULES[name]
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imports(name: str, *, type_checking: bool = False) -> list[tuple[str, bool]]:
    visitor = _Imports(name, MODULES[name].name == "__init__.py", type_checking)
    visitor.visit(_tree(name))
    return visitor.found


def _matches(imported: str, banned: str) -> bool:
    return imported == banned or imported.startswith(banned + ".")


PACKER = [m for m in MODULES if m.startswith(("imgpack.packer", "imgpack.format"))]
PACKER += [m for m in ("imgpack.manifest", "imgpack.shards", "imgpack.validate") if m in MODULES]
PACKER += ["imgpack.errors"]
READER = [m for m in MODULES if m.startswith("imgpack.reader")]
# the format is read by both halves and by other tools: numpy and the standard library only
FORMAT = [m for m in MODULES if m.startswith("imgpack.format")]


def test_the_parser_sees_the_imports_it_should():
    """Guards the checks below against passing because nothing was found."""
    assert "imgpack.packer.cli" in MODULES and len(READER) > 1 and len(FORMAT) > 1
    assert any(("torch", True) in imports(m) for m in READER)
    assert ("click", True) in imports("imgpack.packer.cli")
    assert ("tqdm.auto", False) in imports("imgpack.diagnose.meter")  # a function-level one
    assert any(i.startswith("imgpack.format") for m in READER for i, _ in imports(m))
    assert all(m in MODULES for m in PACKER + READER)


def _import_graph() -> dict[str, list[str]]:
    """module -> the imgpack modules it imports anywhere (TYPE_CHECKING included)."""
    graph = {}
    for m in MODULES:
        found = {i for i, _ in imports(m, type_checking=True) if i in MODULES}
        graph[m] = sorted(found - {m})
    return graph


def test_every_kind_of_import_is_an_edge():
    """Guards the cycle check: function-level and TYPE_CHECKING imports count."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from imgpack import errors\n"
        "def f():\n    from imgpack import console\n"
    )
    visitor = _Imports("imgpack.probe", False, type_checking=True)
    visitor.visit(ast.parse(source))
    assert {("imgpack.errors", True), ("imgpack.console", False)} <= set(visitor.found)
    hidden = _Imports("imgpack.probe", False)
    hidden.visit(ast.parse(source))
    assert ("imgpack.errors", True) not in hidden.found


def _cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One circle of imports in ``graph`` (its modules in order, the first repeated last)."""
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
    cycle = _cycle(_import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_circle_one_import_would_close():
    """Guards the check above: the real graph, plus one import back (errors -> a module that
    imports errors), must be reported, and as that circle."""
    graph = _import_graph()
    importer = next(m for m, deps in sorted(graph.items()) if "imgpack.errors" in deps)
    closed = {**graph, "imgpack.errors": [*graph["imgpack.errors"], importer]}
    cycle = _cycle(closed)
    assert cycle is not None and cycle[0] == cycle[-1], cycle
    assert {"imgpack.errors", importer} <= set(cycle)
    assert all(b in closed[a] for a, b in zip(cycle, cycle[1:])), cycle  # real edges only


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(module: str) -> list[str]:
    """``from imgpack.x import _name`` anywhere in ``module``: a private name of another module."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    is_package = MODULES[module].name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            home = _resolve(node, module, is_package)
            if home.startswith("imgpack"):
                found += [f"{home}.{a.name}" for a in node.names if _private(a.name)]
    return found


def test_no_module_imports_another_modules_private_name():
    bad = [f"{m}: {name}" for m in MODULES for name in _private_imports(m)]
    assert not bad, "private names imported: " + "; ".join(bad)


def test_a_private_import_is_seen(tmp_path, monkeypatch):
    """The check above can fail: a module that imports a private name is named."""
    fake = tmp_path / "fake.py"
    fake.write_text("from imgpack.reader.loader import _pin\n", encoding="utf-8")
    monkeypatch.setitem(MODULES, "imgpack.fake", fake)
    assert _private_imports("imgpack.fake") == ["imgpack.reader.loader._pin"]


@pytest.mark.parametrize(
    ("modules", "banned"),
    [
        (PACKER, ("torch",)),
        (READER, ("click", "tqdm", "imgpack.packer")),
        (FORMAT, ("torch", "PIL", "click", "tqdm", "imgpack.packer", "imgpack.reader")),
    ],
    ids=["packer-without-torch", "reader-without-click-tqdm-packer", "format-with-numpy-only"],
)
def test_banned_imports_anywhere_in_a_module(modules, banned):
    bad = [
        f"{m} imports {i}" + ("" if top else " (in a function)")
        for m in modules
        for i, top in imports(m)
        if any(_matches(i, b) for b in banned)
    ]
    assert not bad, "; ".join(bad)


# fsspec: a local pack never loads the remote extra (imgpack.remote imports it for URLs only)
READER_BANS = ("PIL", "click", "tqdm", "imgpack.packer", "cv2", "numba", "pyarrow", "fsspec")


@pytest.mark.parametrize(
    ("statement", "banned", "first"),
    [
        ("import imgpack", ("torch", "imgpack.reader", "imgpack.packer"), ""),  # the lazy facade
        ("import imgpack.packer.cli", ("torch", "pyarrow", "cv2", "numba", "fsspec"), ""),
        # the reader through the facade, wherever its names live; torch itself loads tqdm
        # (torch.hub): only what imgpack adds on top of torch counts
        ("from imgpack import PackedImageDataset, make_loader, DeviceTransform", READER_BANS,
         "torch"),
    ],
    ids=["facade", "cli", "reader"],
)  # fmt: skip
def test_what_importing_an_entry_point_loads(statement, banned, first):
    code = (
        f"import json, sys\n{'import ' + first if first else ''}\nbefore = set(sys.modules)\n"
        f"{statement}\n"
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
    assert "imgpack" in new  # the import really ran in this interpreter
    loaded = [m for m in new if any(_matches(m, b) for b in banned)]
    assert not loaded, f"{statement} loads {', '.join(loaded)}"


# A measured rate in a module's text: a number with a unit of throughput or time per item.
_FIGURE = re.compile(
    r"\b\d[\d,.]*\s*(?:images/s|img/s|records/s|[KMG]B/s|µs (?:per|a)|ms per)", re.IGNORECASE
)


def test_no_benchmark_figures_in_code():
    """Figures from benchmarks live in docs/benchmarks.md, dated, beside the machine that gave
    them; in a docstring or a comment they go stale without anyone seeing."""
    assert _FIGURE.search("decodes 1,500 images/s on one core") and not _FIGURE.search("GB/s")
    found = [
        f"{name}: {m.group(0)}"
        for name, path in MODULES.items()
        for m in _FIGURE.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not found, "; ".join(found)


_TRACKER = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.IGNORECASE)


def test_no_module_cites_the_tracker():
    """A module says why in its own words: an issue number means nothing to a reader of the
    code, and the tracker's items are closed and renumbered long after the code stays."""
    assert _TRACKER.search("as issue #3 asked") and not _TRACKER.search("an issue with it")
    scripts = {p.name: p for p in (ROOT / "scripts").glob("*.py")}
    found = [
        f"{name}: {m.group(0)}"
        for name, path in {**MODULES, **scripts}.items()
        for m in _TRACKER.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not found, "; ".join(found)
