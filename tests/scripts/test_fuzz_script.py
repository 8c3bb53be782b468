"""scripts/fuzz.py: counts by outcome, and a failure printed with the command that replays it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workbench import fuzz
from workbench.fuzz_targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_counts_every_case_by_target_and_outcome():
    n = 5 * len(TARGETS)
    report = fuzz.fuzz(n, seed=5)
    assert report.cases == n and not report.failures
    for target in TARGETS:
        assert sum(k for (t, _), k in report.outcomes.items() if t == target) == 5
    assert all(
        o.startswith(("opened", "refused:", "resumed:", "known:")) for _, o in report.outcomes
    )
    assert sum(report.kinds.values()) >= n
    text = "\n".join(report.lines())
    assert f"{n} cases in" in text and "seed 5, 0 failures" in text and "journal: 5 cases" in text


def test_a_case_replays_from_its_seed_and_number_in_a_new_process(monkeypatch):
    """The reproducer a failure prints (``scripts/fuzz.py --seed S --case N``) runs case N of
    run S again, in another process (another hash seed): the same target and mutations.
    Another case or seed draws other mutations."""
    used = []

    def record(corpus, target, muts, case, limit=10.0):
        used.append((target, muts))
        return "opened"

    monkeypatch.setattr(fuzz, "run_case", record)
    fuzz.fuzz(1, seed=3, first=17)
    ((target, muts),) = used
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz.py"), "--seed", "3", "--case", "17"],
        env={**os.environ, "PYTHONHASHSEED": "5"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.splitlines()[0] == f"case 17 ({target}): {', '.join(map(str, muts))}", (
        out.stdout + out.stderr
    )
    roles = {"index": "json", "bin": "bin"}
    drawn = {tuple(fuzz.case_mutations(s, c, roles)) for s in (3, 4) for c in (17, 18, 19)}
    assert len(drawn) == 6


def test_a_failure_is_reported_with_its_reproducer(monkeypatch, capsys):
    real = fuzz.run_case

    def flaky(corpus, target, muts, case, limit=10.0):
        if target == "manifest":
            raise KeyError("boom")
        return real(corpus, target, muts, case, limit)

    monkeypatch.setattr(fuzz, "run_case", flaky)
    case = len(TARGETS) + TARGETS.index("manifest")  # the one manifest case of 3..3+N
    report = fuzz.fuzz(len(TARGETS), seed=9, first=3)
    assert [f.case for f in report.failures] == [case]
    assert report.failures[0].error.startswith("KeyError: 'boom' at test_fuzz_script.py:")
    text = "\n".join(report.lines())
    assert f"FAILED case {case} (manifest)" in text
    assert f"reproduce: python scripts/fuzz.py --seed 9 --case {case}" in text
    assert fuzz.main(["--seed", "9", "--case", str(case)]) == 1
    assert "KeyError: 'boom'" in capsys.readouterr().err


def test_main_prints_counts_and_writes_json(tmp_path, capsys):
    out = tmp_path / "counts.json"
    assert fuzz.main(["--cases", "6", "--seed", "1", "--json", str(out)]) == 0
    assert "6 cases in" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["cases"] == 6 and saved["failures"] == [] and sum(saved["outcomes"].values()) == 6
