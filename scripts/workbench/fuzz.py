"""The long fuzz run: ``python scripts/fuzz.py --cases 100000`` (see docs/reliability.md).

Case k of a run with seed S damages target ``TARGETS[k % len(TARGETS)]`` with the mutations a
``random.Random(f"{S}/{k}")`` draws, so ``--seed S --case K`` replays exactly one
case, with its traceback. No shrinking here: the Hypothesis tests in
``tests/test_fuzz.py`` draw the same mutations and shrink them.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from workbench.fuzz_targets import TARGETS, make_corpus, run_case
from workbench.mutate import Mutation, random_mutations

__all__ = ["Failure", "FuzzReport", "case_mutations", "fuzz", "main"]


@dataclass(frozen=True)
class Failure:
    """One case that neither succeeded nor was refused with an ImgpackError."""

    case: int
    target: str
    mutations: tuple[Mutation, ...]
    error: str

    def reproducer(self, seed: int) -> str:
        return f"python scripts/fuzz.py --seed {seed} --case {self.case}"


@dataclass
class FuzzReport:
    seed: int
    cases: int = 0
    seconds: float = 0.0
    outcomes: collections.Counter = field(default_factory=collections.Counter)  # (target, outcome)
    kinds: collections.Counter = field(default_factory=collections.Counter)  # (role, kind)
    failures: list[Failure] = field(default_factory=list)

    def lines(self) -> list[str]:
        rate = self.cases / self.seconds if self.seconds else 0.0
        out = [f"{self.cases} cases in {self.seconds:.0f} s ({rate:.0f}/s), seed {self.seed}, "
               f"{len(self.failures)} failures"]  # fmt: skip
        for target in TARGETS:
            rows = sorted((n, o) for (t, o), n in self.outcomes.items() if t == target)
            out.append(f"  {target}: {sum(n for n, _ in rows)} cases")
            out.extend(f"    {n:>8}  {o}" for n, o in reversed(rows))
        out.append("  mutations drawn:")
        out.extend(f"    {n:>8}  {r} {k}" for (r, k), n in sorted(self.kinds.items()))
        for f in self.failures[:20]:
            muts = ", ".join(map(str, f.mutations))
            out.append(f"FAILED case {f.case} ({f.target}): {f.error}\n  mutations: [{muts}]"
                       f"\n  reproduce: {f.reproducer(self.seed)}")  # fmt: skip
        return out

    def to_json(self) -> dict:
        return {
            "seed": self.seed,
            "cases": self.cases,
            "seconds": round(self.seconds, 1),
            "outcomes": {f"{t} {o}": n for (t, o), n in sorted(self.outcomes.items())},
            "failures": [{"case": f.case, "target": f.target, "error": f.error,
                          "mutations": [str(m) for m in f.mutations]} for f in self.failures],
            "python": platform.python_version(),
            "machine": platform.platform(),
        }  # fmt: skip


def case_mutations(seed: int, case: int, roles: dict[str, str]) -> list[Mutation]:
    """The mutations of case ``case`` in a run seeded ``seed`` (stable across runs)."""
    return random_mutations(random.Random(f"{seed}/{case}"), roles)


def fuzz(
    cases: int,
    *,
    seed: int = 0,
    first: int = 0,
    seconds: float | None = None,
    limit: float = 10.0,
    progress=None,
) -> FuzzReport:
    """Run cases ``first .. first+cases-1`` (or until ``seconds`` have passed)."""
    report = FuzzReport(seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="imgpack-fuzz-") as tmp:
        corpus = make_corpus(Path(tmp) / "corpus")
        for k in range(first, first + cases):
            target = TARGETS[k % len(TARGETS)]
            muts = case_mutations(seed, k, corpus.targets[target].roles)
            report.kinds.update((m.role, m.kind) for m in muts)
            try:
                outcome = run_case(corpus, target, muts, Path(tmp) / "case", limit)
            except Exception as e:  # everything that is not a refusal is what we look for
                outcome = "FAILED"
                report.failures.append(Failure(k, target, tuple(muts), _short(e)))
            report.outcomes[(target, outcome)] += 1
            report.cases += 1
            if progress and report.cases % 5000 == 0:
                progress(f"{report.cases} cases, {len(report.failures)} failures")
            if seconds is not None and time.perf_counter() - t0 > seconds:
                break
    report.seconds = time.perf_counter() - t0
    return report


def _short(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return f"{type(e).__name__}: {str(e)[:200]}{where}"


def replay(seed: int, case: int) -> int:
    """Run one case and show its mutations and outcome (or traceback)."""
    with tempfile.TemporaryDirectory(prefix="imgpack-fuzz-") as tmp:
        corpus = make_corpus(Path(tmp) / "corpus")
        target = TARGETS[case % len(TARGETS)]
        muts = case_mutations(seed, case, corpus.targets[target].roles)
        print(f"case {case} ({target}): {', '.join(map(str, muts))}")
        try:
            print(run_case(corpus, target, muts, Path(tmp) / "case"))
        except Exception:
            traceback.print_exc()
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz the index, manifest and journal readers.")
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="first case number")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--case", type=int, default=None, help="replay this one case")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts here")
    args = parser.parse_args(argv)
    if args.case is not None:
        return replay(args.seed, args.case)
    report = fuzz(args.cases, seed=args.seed, first=args.first, seconds=args.seconds,
                  progress=lambda s: print(s, file=sys.stderr, flush=True))  # fmt: skip
    print("\n".join(report.lines()))
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 1 if report.failures else 0
