"""Property-based damage to real packs: every parser opens and reads, or refuses as documented.

The packs are made once per session by the real packer (tests/fuzz_corpus.py, with the
oracles in tests/fuzz_targets.py); the damage is drawn by Hypothesis from the mutations of
tests/fuzz_mutate.py. Each example runs in this process, under a time limit, so a hang fails
it and a crash would stop the suite. Derandomized: CI sees the same examples every run;
``FUZZ_EXAMPLES=20000 pytest tests/test_fuzz.py`` is a long run (100 examples a test by
default).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import fuzz_mutate as mutate
import fuzz_targets as ft
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgpack.errors import FormatError
from imgpack.format.index import read_index
from imgpack.reader.dataset import PackedImageDataset

TESTS = Path(__file__).resolve().parent
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "100")),
    derandomize=True,
    deadline=timedelta(seconds=3),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SUCCESS = {"index": ("opened",), "manifest": ("opened",), "index-fit": ("opened",),
           "index-yuv": ("opened",), "index-jpeg": ("opened",),
           "journal": ("resumed:identical", "resumed:journal-trusted")}  # fmt: skip


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return ft.make_corpus(tmp_path_factory.mktemp("fuzz-corpus"))


@pytest.fixture(scope="session")
def case(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-case") / "case"


def outcome_of(corpus, case, target, mutations) -> str:
    """Raises on a failure (another exception, a Violation, a Hang); else the outcome."""
    outcome = ft.run_case(corpus, target, mutations, case, seconds=10)
    assert outcome in SUCCESS[target] or outcome.startswith(("refused:", "known:")), outcome
    return outcome


@pytest.mark.parametrize("target", ft.TARGETS)
def test_the_pristine_files_open(corpus, case, target):
    assert outcome_of(corpus, case, target, []) == SUCCESS[target][0]


@pytest.fixture(scope="session")
def damage(corpus):
    """Each target's strategy of mutations, made once (not once per example)."""
    return {t: mutate.strategy(corpus.targets[t].roles) for t in ft.TARGETS}


@FUZZ
@given(data=st.data())
def test_damaged_index_opens_and_reads_or_is_refused(corpus, case, damage, data):
    outcome_of(corpus, case, "index", data.draw(damage["index"]))


@FUZZ
@given(data=st.data())
def test_damaged_v3_packs_of_records_of_their_own_size_open_or_are_refused(
    corpus, case, damage, data
):
    """Version 3: raw records of different sizes, yuv420 and jpeg ones (``--resize fit``)."""
    target = data.draw(st.sampled_from(["index-fit", "index-yuv", "index-jpeg"]))
    outcome_of(corpus, case, target, data.draw(damage[target]))


@FUZZ
@given(data=st.data())
def test_damaged_manifest_or_shards_open_and_read_or_are_refused(corpus, case, damage, data):
    outcome_of(corpus, case, "manifest", data.draw(damage["manifest"]))


@FUZZ
@given(data=st.data())
def test_damaged_journal_or_partial_resume_or_are_refused(corpus, case, damage, data):
    outcome_of(corpus, case, "journal", data.draw(damage["journal"]))


# --- the fuzzer itself -------------------------------------------------------------------


def _changed(ix, **header):
    """``ix`` as if its header (and index) said ``header``."""
    return dataclasses.replace(ix, header={**ix.header, **header})


def test_the_oracle_catches_a_record_outside_its_pixels(corpus, case):
    """An index that claimed one record more than its pixels hold must not pass as read."""
    ft.run_case(corpus, "index", [], case)
    ix = read_index(case / "p.bin")
    ds = PackedImageDataset(case / "p.bin")
    with pytest.raises(ft.Violation, match=f"record {ix.count} at .* outside"):
        ft.read_every_record(ds, [_changed(ix, count=ix.count + 1)])
    with pytest.raises(ft.Violation, match="record 0 is not the bytes"):
        ft.read_every_record(ds, [_changed(ix, data_offset=ix.data_offset + 3)])
    ft.read_every_record(ds, [ix])


def test_a_hang_is_a_failure_not_a_wait(corpus, case, monkeypatch):
    monkeypatch.setattr(
        ft, "CHECKS", {**ft.CHECKS, "index": lambda c, p: [0 for _ in iter(int, 1)]}
    )
    with pytest.raises(ft.Hang):
        ft.run_case(corpus, "index", [], case, seconds=0.2)


_DRAW_ELSEWHERE = """
import json, random, sys
import fuzz_mutate as mutate
roles = dict(reversed(json.loads(sys.argv[1]).items()))  # another order: it must not matter
print(json.dumps([str(m) for m in mutate.random_mutations(random.Random("7/3"), roles)]))
"""


def test_mutations_replay_from_their_seed_alone_in_another_process(corpus):
    """What a seed draws depends on nothing else: not the global random state, not the
    order of the roles, not the process (its hash seed), so a reported case replays; and
    other seeds draw other mutations."""
    roles = corpus.targets["index"].roles
    state = random.getstate()
    try:
        random.seed(1)
        here = mutate.random_mutations(random.Random("7/3"), roles)
        random.seed(2)
        assert mutate.random_mutations(random.Random("7/3"), roles) == here
    finally:
        random.setstate(state)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", _DRAW_ELSEWHERE, json.dumps(roles)],
            env={**env, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [str(m) for m in here], hash_seed
    drawn = {tuple(mutate.random_mutations(random.Random(f"7/{k}"), roles)) for k in range(20)}
    assert len(drawn) == 20


def test_the_same_mutations_damage_the_same_bytes_and_each_kind_changes_the_file(corpus, case):
    t = corpus.targets["index"]
    pristine = {role: (t.folder / name).read_bytes() for role, (name, _) in t.files.items()}
    muts = mutate.random_mutations(random.Random("7/3"), t.roles)
    damaged = []
    state = random.getstate()
    try:
        for k in range(3):  # whatever the global random state
            random.seed(k)
            ft.prepare_case(corpus, "index", muts, case)
            damaged.append({r: (case / name).read_bytes() for r, (name, _) in t.files.items()})
    finally:
        random.setstate(state)
    assert damaged[0] == damaged[1] == damaged[2] != pristine
    for kind in mutate.BYTE_KINDS + mutate.JSON_KINDS:
        for role in ("index", "bin") if kind in mutate.BYTE_KINDS else ("index",):
            for where, value in ((0, 0), (12345, 678910), (2**31, 2**32 - 1)):
                ft.prepare_case(corpus, "index", [mutate.Mutation(role, kind, where, value)], case)
                name, _ = t.files[role]
                assert (case / name).read_bytes() != pristine[role], (kind, role, where, value)


def test_journal_line_kinds_keep_lines_whole(corpus, case):
    t = corpus.targets["journal"]
    name, _ = t.files["journal"]
    lines = (t.folder / name).read_bytes().splitlines()
    for kind, where in (("drop", 1), ("dup", 2), ("swap", 3), ("retype", 4)):
        ft.prepare_case(corpus, "journal", [mutate.Mutation("journal", kind, where, 1)], case)
        got = (case / name).read_bytes()
        assert got.endswith(b"\n") and got.splitlines() != lines
        if kind == "drop":
            assert len(got.splitlines()) == len(lines) - 1 and set(got.splitlines()) < set(lines)
        elif kind != "retype":
            assert sorted(set(got.splitlines())) == sorted(set(lines))


def test_an_index_nested_too_deep_is_a_format_error(tmp_path):
    (tmp_path / "p.json").write_text('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(FormatError, match=r"p\.json: .*nested too deep"):
        read_index(tmp_path / "p.json")


# --- what the fuzzer found, kept as plain regression tests -----------------------------------


def edit_json(path, change):
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def test_a_shard_name_too_long_for_the_filesystem_is_a_manifest_error(corpus, case):
    ft.prepare_case(corpus, "manifest", [], case)
    edit_json(case / "m.manifest.json", lambda r: r["shards"][0].update(path="x" * 300))
    with pytest.raises(FormatError, match=r"m\.manifest\.json: shard x+: .*File name too long"):
        PackedImageDataset(case / "m.manifest.json")


@pytest.mark.parametrize("source", [{"a": 1}, ["src"], 7])
def test_a_shard_whose_source_is_not_a_name_is_refused(corpus, case, source):
    """Once a TypeError (unhashable) while grouping slices by source."""
    ft.prepare_case(corpus, "manifest", [], case)
    edit_json(case / "s0.json", lambda r: r["packer"].update(source=source))
    with pytest.raises(FormatError, match=r"s0\.bin: packer\.source is .*, expected the source"):
        PackedImageDataset(case / "m.manifest.json")
    with pytest.raises(FormatError, match=r"packer\.source is"):
        PackedImageDataset([case / "s0.bin", case / "s1.bin"])
