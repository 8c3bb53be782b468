"""The package's version has one home, ``imgpack.__version__``: pyproject reads it from there
and it is the CHANGELOG's latest release."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import imgpack

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_takes_the_version_from_the_package():
    pyproject = pytest.importorskip("setuptools.config.pyprojecttoml")
    config = pyproject.read_configuration(ROOT / "pyproject.toml")  # as a build resolves it
    assert config["project"]["version"] == imgpack.__version__


def test_the_version_is_the_changelogs_latest_release():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, re.M)
    assert released and released[0] == imgpack.__version__
