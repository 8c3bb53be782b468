"""The architecture, checked: no import cycles, the packer without torch, the reader without
Pillow (but for its CPU crop, lazily), the format with numpy only, every name imported from
its home, and no module that probes a dataset with ``getattr``/``hasattr`` (the protocol is
``imgpack.reader.protocol``). Modules are cut where their concept splits, not at a line
count, so no length is checked.

Every module under imgpack/ is parsed with ``ast``; an import counts wherever it is
written: module level, class body, inside a function, or under ``if TYPE_CHECKING:``.
Cycles are looked for among all of them: an import moved into a function or under
TYPE_CHECKING hides a circle from Python, not from the reader of the code. The banned
imports ignore TYPE_CHECKING blocks, which never run. A subprocess then checks what
importing the two entry points really loads.
"""

from __future__ import annotations

import ast
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


def _tree(name: str) -> ast.Module:
    path = MODULES[name]
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imports(name: str, *, type_checking: bool = False) -> list[tuple[str, bool]]:
    visitor = _Imports(name, MODULES[name].name == "__init__.py", type_checking)
    visitor.visit(_tree(name))
    return visitor.found


def _top(name: str) -> str:
    return name.split(".")[0]


def _matches(imported: str, banned: str) -> bool:
    return imported == banned or imported.startswith(banned + ".")


PACKER = [m for m in MODULES if m.startswith(("imgpack.packer", "imgpack.format"))]
PACKER += ["imgpack.manifest", "imgpack.shards", "imgpack.validate", "imgpack.errors"]
PACKER += ["imgpack.console"]
READER = [m for m in MODULES if m.startswith("imgpack.reader")]
# The reader decodes JPEG records with simplejpeg (libjpeg-turbo, the GIL released for the
# whole decode, 2x Pillow per core here), an imaging import it may have (Pillow it may not),
# and only in imgpack.reader.jpeg: one home for CPU decoding. The packer's JPEG module may
# ask the same decoder whether a source it would store as it came decodes strictly; nothing
# else imports it (the format reads no pixels).
JPEG_HOME = "imgpack.reader.jpeg"
SIMPLEJPEG = {JPEG_HOME, "imgpack.packer.jpeg"}
# The reader's one exception to "no Pillow": the CPU crop resamples shrunk fractional boxes
# with Pillow itself (imgpack.reader.resample says why), importing it only inside its
# functions, so that importing the reader still never loads it.
PILLOW_HOME = "imgpack.reader.resample"

# pyarrow (the optional parquet extra) is read by the Parquet source alone: the reader, and
# every other pack, never load it
PYARROW = {"imgpack.packer.sources.parquet", "imgpack.packer.sources.parquet_schema"}
# OpenCV resamples enlarged CPU crops in one module, imported on the first such crop
OPENCV_HOME = "imgpack.reader.resample"
# the format is read by both halves and by other tools: numpy and the standard library only
FORMAT = [m for m in MODULES if m.startswith("imgpack.format")]
FORMAT += ["imgpack.validate", "imgpack.errors"]


def test_the_parser_sees_the_imports_it_should():
    """Guards the checks below against passing because nothing was found."""
    assert {"imgpack.packer.cli", "imgpack.reader.dataset", "imgpack.validate"} <= set(MODULES)
    assert ("torch", True) in imports("imgpack.reader.dataset")
    assert ("click", True) in imports("imgpack.packer.cli")
    assert ("imgpack.format.index", True) in imports("imgpack.manifest")
    assert ("tqdm.auto", False) in imports("imgpack.diagnose.meter")  # a function-level one
    assert ("simplejpeg", True) in imports(JPEG_HOME)
    assert ("pyarrow.parquet", False) in imports("imgpack.packer.sources.parquet")
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
    """Guards the check above: the real graph, plus one import back (errors -> the index
    reader, which imports errors), must be reported, and as that circle."""
    graph = _import_graph()
    assert "imgpack.errors" in graph["imgpack.format.index"]
    closed = {**graph, "imgpack.errors": [*graph["imgpack.errors"], "imgpack.format.index"]}
    cycle = _cycle(closed)
    assert cycle is not None and cycle[0] == cycle[-1], cycle
    assert {"imgpack.errors", "imgpack.format.index"} <= set(cycle)
    assert all(b in closed[a] for a, b in zip(cycle, cycle[1:])), cycle  # real edges only


def _defined(name: str) -> set[str]:
    """Names a module binds itself at top level (def, class, assignment), not by importing."""
    found: set[str] = set()
    stack = list(_tree(name).body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):  # e.g. try: import fcntl / except: fcntl = None
            stack.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return found


# imgpack/__init__.py is the public facade: its __all__ names what its __getattr__ imports
_FACADES = {"imgpack"}


def _names_from_elsewhere(name: str) -> list[tuple[str, str, str]]:
    """(module, name, what) for each name the module takes from, or lists in ``__all__``
    for, a module that does not define it: a re-export. Star imports count too."""
    found, tree = [], _tree(name)
    aliases = {}  # a local name -> the imgpack module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(node, name, MODULES[name].name == "__init__.py")
            for alias in node.names:
                if alias.name == "*":
                    found.append((name, "*", f"from {base} import *"))
                elif f"{base}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif base in MODULES and alias.name not in _defined(base):
                    found.append((name, alias.name, f"from {base}, which does not define it"))
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in MODULES})
    for node in ast.walk(tree):  # decode.decode_record, settings.FILTERS, ...
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module and not node.attr.startswith("__") and node.attr not in _defined(module):
                found.append((name, node.attr, f"as {node.value.id}.{node.attr}, not {module}'s"))
    if name in _FACADES:
        return found
    for node in tree.body:
        names = {getattr(t, "id", "") for t in getattr(node, "targets", [])}
        if isinstance(node, ast.Assign) and "__all__" in names:
            own = _defined(name)
            found += [
                (name, n, "in __all__, defined elsewhere")
                for n in ast.literal_eval(node.value)
                if n not in own
            ]
    return found


def test_every_name_is_imported_from_the_module_that_defines_it():
    found = [f for m in MODULES for f in _names_from_elsewhere(m)]
    bad = [f"{m}: {n} {what}" for m, n, what in found]
    assert not bad, "re-exported: " + "; ".join(bad)


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
        ([m for m in READER if m != PILLOW_HOME], ("PIL", "click", "tqdm", "imgpack.packer")),
        ([PILLOW_HOME], ("click", "tqdm", "imgpack.packer")),
        ([m for m in MODULES if m not in SIMPLEJPEG], ("simplejpeg",)),
        (FORMAT, ("torch", "PIL", "click", "tqdm", "imgpack.packer", "imgpack.reader")),
        (list(MODULES), ("workbench",)),
        ([m for m in MODULES if m not in PYARROW], ("pyarrow",)),
        ([m for m in MODULES if m != OPENCV_HOME], ("cv2",)),
    ],
    ids=[
        "packer-without-torch",
        "reader-without-pillow-click-tqdm-packer",
        "resample-without-click-tqdm-packer",
        "simplejpeg-only-in-the-jpeg-modules",
        "format-with-numpy-only",
        "no-workbench",
        "pyarrow-only-in-the-parquet-source",
        "opencv-only-in-the-resample-module",
    ],
)
def test_banned_imports_anywhere_in_a_module(modules, banned):
    bad = [
        f"{m} imports {i}" + ("" if top else " (in a function)")
        for m in modules
        for i, top in imports(m)
        if any(_matches(i, b) for b in banned)
    ]
    assert not bad, "; ".join(bad)


def test_the_pillow_exception_imports_it_in_functions_only():
    found = [(i, top) for i, top in imports(PILLOW_HOME) if _matches(i, "PIL")]
    assert found and not any(top for _, top in found)


@pytest.mark.parametrize(
    ("module", "banned", "first"),
    [
        ("imgpack.packer.cli", ("torch",), ""),
        # torch itself loads tqdm (torch.hub): only what imgpack adds on top of torch counts
        (
            "imgpack.reader.dataset",
            ("PIL", "click", "tqdm", "imgpack.packer", "cv2", "numba"),
            "torch",
        ),
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


# A probe of a dataset: the first argument names one (ds, dataset, self._ds, x.dataset, ...).
_DATASET = re.compile(r"(self\.)?_?(ds|dataset)|.+\.(_ds|_?dataset)")


def _probes(source: str) -> list[str]:
    """``getattr``/``hasattr`` calls on a dataset in ``source``, as written."""
    return [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and node.args
        and _DATASET.fullmatch(ast.unparse(node.args[0]))
    ]


def test_no_module_probes_a_dataset_with_getattr_or_hasattr():
    """What imgpack needs of a dataset is the protocol (``imgpack.reader.protocol``), asked
    once with ``isinstance``; a probe lets a missing member pass silently."""
    found = "getattr(ds, 'a', None); hasattr(dataset, 'b'); getattr(self._ds, 'c')\n"
    found += "getattr(self.dataset, 'd', 1); hasattr(self.loader.dataset, 'e')"
    assert len(_probes(found)) == 5 and not _probes("getattr(mmap, 'MADV_X'); hasattr(os, 'f')")
    bad = [
        f"{m}: {call}"
        for m, path in MODULES.items()
        for call in _probes(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "; ".join(bad)
