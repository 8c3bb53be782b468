"""The error hierarchy, and which halves of imgpack may import which heavy packages."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import imgpack
from imgpack import errors

ROOT = Path(imgpack.__file__).parent

# errors about input someone handed us: generic `except ValueError` code must keep catching them
FILE_PROBLEMS = [
    "FormatError",
    "UnsupportedVersionError",
    "MissingFieldError",
    "InconsistentPackError",
    "UnsafePathError",
    "ChecksumError",
    "SourceError",
]


def _classes_defined_in_errors() -> set[str]:
    return {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and obj.__module__ == errors.__name__
    }


def test_all_lists_exactly_the_error_classes():
    assert set(errors.__all__) == _classes_defined_in_errors()
    assert len(errors.__all__) == len(set(errors.__all__))


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_is_an_imgpack_error_with_a_reason(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.ImgpackError)
    assert cls.__doc__ and cls.__doc__.strip()
    assert getattr(imgpack, name) is cls  # re-exported at the top level
    assert str(cls("x.json: a one-line message")) == "x.json: a one-line message"


@pytest.mark.parametrize("name", FILE_PROBLEMS)
def test_file_problems_are_value_errors(name):
    cls = getattr(errors, name)
    assert issubclass(cls, ValueError)
    with pytest.raises(ValueError):
        raise cls("bad file")


def test_format_errors_share_one_base():
    for name in ["UnsupportedVersionError", "MissingFieldError", "InconsistentPackError",
                 "UnsafePathError", "ChecksumError"]:  # fmt: skip
        assert issubclass(getattr(errors, name), errors.FormatError)
    assert not issubclass(errors.ImgpackError, ValueError)


# --- import hygiene, checked in fresh interpreters ------------------------------


def _modules(package: str, expected: list[str]) -> list[str]:
    """Modules the layout promises plus those already in the folder; absent ones are left out."""
    folder = ROOT / package.split(".", 1)[1]
    found = [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(folder)])]
    names = sorted({package, *expected, *found})
    return [n for n in names if importlib.util.find_spec(n) is not None]


# Each module is imported in turn; the first that pulls in a forbidden package is named.
# Packages that `pre` (e.g. torch) imports by itself cannot be blamed on us: see _static_imports.
_CHECK = """
import importlib, sys
for mod in {pre!r}:
    importlib.import_module(mod)
forbidden = [f for f in {forbidden!r} if f not in sys.modules]
for mod in {modules!r}:
    importlib.import_module(mod)
    bad = sorted(f for f in forbidden if f in sys.modules)
    if bad:
        sys.exit(f"{{mod}} imports {{', '.join(bad)}}")
"""


def _assert_clean(modules: list[str], forbidden: list[str], pre: tuple[str, ...] = ()) -> None:
    script = _CHECK.format(modules=modules, forbidden=forbidden, pre=list(pre))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]


FORMAT = _modules("imgpack.format", ["imgpack.format.index", "imgpack.format.write"])


def test_top_level_import_does_not_import_torch():
    _assert_clean(["imgpack", "imgpack.errors", *FORMAT], ["torch"])
    proc = subprocess.run(
        [sys.executable, "-c", "import imgpack, sys; imgpack.FormatError; "
         "assert 'torch' not in sys.modules and 'PIL' not in sys.modules"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_format_module_needs_only_numpy():
    _assert_clean(FORMAT, ["torch", "PIL", "click", "tqdm"])


def test_packer_never_imports_torch():
    modules = _modules("imgpack.packer", ["imgpack.packer.discover", "imgpack.packer.cli"])
    _assert_clean(modules, ["torch"])


READER = ["imgpack.reader.dataset", "imgpack.reader.loader", "imgpack.reader.gpu"]
READER_FORBIDDEN = ["PIL", "click", "tqdm", "imgpack.packer"]


def test_reader_never_imports_pillow_click_tqdm_or_the_packer():
    # torch itself imports tqdm (torch.hub), so that one is only caught by the source check below
    _assert_clean(_modules("imgpack.reader", READER), READER_FORBIDDEN, pre=("torch",))


def _static_imports(path: Path) -> set[str]:
    """Top-level package names a source file imports, at any depth (lazy imports included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"), [("reader", READER_FORBIDDEN), ("packer", ["torch"])]
)
def test_source_names_no_forbidden_package(package, forbidden):
    for path in sorted((ROOT / package).glob("*.py")):
        for name in _static_imports(path):
            assert not any(name == f or name.startswith(f + ".") for f in forbidden), (
                f"{package}/{path.name} imports {name}"
            )
