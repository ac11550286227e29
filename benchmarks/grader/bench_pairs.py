"""Raw timed pairs of repeated gradings: what a grading's speedup is made of.

    python benchmarks/grader/bench_pairs.py [--repeats 8] [--self] PROBLEM:SUBMISSION ...

Grades each honest submission (``examples/kernels/submissions``; with ``--self``, the
problem's own reference as its submission, ``ModelNew = Model``, whose true speedup
is 1.0) ``--repeats`` times and prints one JSON line per grading: its speedup and
every timed pair's per-call seconds for the reference and the candidate, in the
order timed (pairs alternate who goes first: even pairs the reference). Then, per
problem, the spread of the grading speedups under a few estimators computed from
the same pairs, which is how decision 0013 chose the per-pair median.
It reads the pairs through a private hook of the grader (`_Grading.finish_timing`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentinfra.environments.kernels import GradeOptions, _grader, grade

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kernels"

Estimator = Callable[[list[float], list[float]], float]


def _pairs(ref: list[float], cand: list[float]) -> float:
    return statistics.median(r / c for r, c in zip(ref, cand, strict=True))


def _two_pairs_summed(ref: list[float], cand: list[float]) -> float:
    return statistics.median(
        (ref[i] + ref[i + 1]) / (cand[i] + cand[i + 1]) for i in range(0, len(ref) - 1, 2)
    )


def _medians(ref: list[float], cand: list[float]) -> float:
    return statistics.median(ref) / statistics.median(cand)


ESTIMATORS: dict[str, Estimator] = {
    "per-pair median (the grader's)": _pairs,
    "two pairs summed": _two_pairs_summed,
    "ratio of medians": _medians,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "pairs", nargs="+", help="PROBLEM:SUBMISSION, e.g. 02_softmax:02_softmax_manual"
    )
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument(
        "--self", action="store_true", help="grade each problem's reference against itself"
    )
    args = parser.parse_args()
    captured: dict[str, list[float]] = {}
    finish = _grader._Grading.finish_timing

    def capture(self: Any, measured: Any, *rest: Any) -> None:
        captured.update(ref=list(measured.ref_times), cand=list(measured.cand_times))
        finish(self, measured, *rest)

    _grader._Grading.finish_timing = capture  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as scratch:
        for pair in args.pairs:
            problem, _, submission = pair.partition(":")
            problem_path = EXAMPLES / "problems" / f"{problem}.py"
            if args.self:
                submission_path = Path(scratch) / f"{problem}_self.py"
                submission_path.write_text(problem_path.read_text() + "\nModelNew = Model\n")
            else:
                submission_path = EXAMPLES / "submissions" / f"{submission}.py"
            gradings = []
            for _ in range(args.repeats):
                captured.clear()
                verdict = grade(problem_path.read_bytes(), submission_path.read_bytes(), GradeOptions(),
                                problem_name=problem_path.name)  # fmt: skip
                if verdict.speedup is None or not captured:
                    raise SystemExit(f"{pair}: {verdict.outcome.value}: {verdict.error}")
                gradings.append(dict(captured))
                line = {"problem": problem, "submission": submission_path.stem,
                        "speedup": round(verdict.speedup, 4), **captured}  # fmt: skip
                sys.stdout.write(json.dumps(line) + "\n")
            summary: dict[str, Any] = {"problem": problem, "gradings": len(gradings)}
            for name, estimate in ESTIMATORS.items():
                values = [estimate(g["ref"], g["cand"]) for g in gradings]
                middle = statistics.median(values)
                summary[name] = {
                    "median": round(middle, 4),
                    "max_deviation": round(max(abs(v / middle - 1) for v in values), 4),
                    "sd_log": round(statistics.pstdev(math.log(v) for v in values), 4),
                }
            sys.stdout.write(json.dumps(summary) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
