"""`.ci/run`: a fresh virtual environment, then exactly `bash scripts/test.sh` inside it, whose
status is CI's; a run that collects no tests (pytest's exit 5) fails and says so.

The repository here is a stand-in: the real `.ci/run` beside a `scripts/test.sh` that reports
what it ran in and exits as told (the real one installs torch and the suite: minutes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_TEST_SH = """#!/usr/bin/env bash
python -c "import sys; print(sys.prefix)" > "$REPORT/prefix"
if python -c "import imgpack" 2>/dev/null; then echo yes > "$REPORT/imgpack"; fi
exit "$STATUS"
"""


@pytest.mark.parametrize("status", [0, 5])
def test_ci_runs_the_readme_command_in_a_fresh_venv_and_passes_on_its_status(tmp_path, status):
    repo, report = tmp_path / "repo", tmp_path / "report"
    (repo / ".ci").mkdir(parents=True)
    (repo / "scripts").mkdir()
    report.mkdir()
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    (repo / "scripts" / "test.sh").write_text(FAKE_TEST_SH)
    env = {**os.environ, "REPORT": str(report), "STATUS": str(status)}
    env.update(CI_PYTHON=sys.executable, PYTHONPATH=str(ROOT))  # PYTHONPATH must not leak in
    out = subprocess.run(
        ["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == status, out.stderr
    prefix = Path((report / "prefix").read_text().strip())
    assert prefix.name == "venv" and prefix != Path(sys.prefix)  # its own, new environment
    assert not prefix.exists()  # and removed afterwards
    assert not (report / "imgpack").exists()  # nothing of this interpreter's packages
    if status == 5:
        assert "ci: FAILED: pytest collected no tests (exit 5)" in out.stderr
