"""No honest kernel flagged: every shipped honest submission and every problem's own
reference (``ModelNew = Model``), graded ``--repeats`` times each with the full protocol.

    python benchmarks/grader/bench_false_flags.py [--repeats 5] [--only 13_relu_scale] [--smoke]

Every grading must end ``passed``: a ``hack_flagged`` (or any other outcome) on
honest code is a false verdict. Prints one JSON line per grading and a summary
line: outcomes, the findings of every grading that did not pass, and the
``threads_processes`` measurement (cores over the timed calls) of every grading.
Exit status 1 when any grading did not pass.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kvcache"))
from _common import environment

from agentinfra.environments.kernels import GradeOptions, grade
from agentinfra.sandbox import probe_sandbox_mode

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "examples" / "kernels" / "problems"
SUBMISSIONS = ROOT / "examples" / "kernels" / "submissions"


def cases(folder: Path) -> list[tuple[str, Path, Path]]:
    """(label, problem, submission): each honest submission, then each problem's reference as its own submission."""
    found: list[tuple[str, Path, Path]] = []
    for submission in sorted(SUBMISSIONS.glob("*.py")):
        problem = next(PROBLEMS.glob(f"{submission.name[:2]}_*.py"))
        found.append((f"{problem.stem} <- {submission.stem}", problem, submission))
    for problem in sorted(PROBLEMS.glob("*.py")):
        itself = folder / f"{problem.stem}_reference.py"
        itself.write_text(problem.read_text() + "\n\nModelNew = Model\n")
        found.append((f"{problem.stem} <- reference", problem, itself))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="Only problems whose name contains this.")
    parser.add_argument("--smoke", action="store_true", help="One fast case, twice, quick timing.")
    args = parser.parse_args()
    options = GradeOptions(timing_pairs=6) if args.smoke else GradeOptions()
    repeats = 2 if args.smoke else args.repeats
    only = "13_relu_scale" if args.smoke else args.only
    outcomes: collections.Counter[str] = collections.Counter()
    bad: list[dict[str, object]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="false-flags-") as folder:
        selected = [c for c in cases(Path(folder)) if only in c[0]]
        if args.smoke:
            selected = selected[:1]
        for label, problem, submission in selected:
            for attempt in range(repeats):
                verdict = grade(
                    problem.read_bytes(),
                    submission.read_bytes(),
                    options,
                    problem_name=problem.name,
                )
                outcomes[verdict.outcome.value] += 1
                cores = [f for f in verdict.findings if f.check == "threads_processes"]
                line = {
                    "case": label, "attempt": attempt, "outcome": verdict.outcome.value,
                    "speedup": verdict.speedup, "cores": [f.evidence for f in cores],
                    "findings": [f"{f.check}/{f.severity}: {f.message}" for f in verdict.findings],
                }  # fmt: skip
                print(json.dumps(line), flush=True)
                if verdict.outcome.value != "passed":
                    bad.append(line)
    print(json.dumps({
        "bench": "false_flags", "cases": len(selected), "repeats": repeats, "gradings": sum(outcomes.values()),
        "outcomes": dict(outcomes), "not_passed": bad, "seconds": round(time.perf_counter() - started, 1),
        "timing_pairs": options.timing_pairs, "sandbox": probe_sandbox_mode(), **environment(),
    }))  # fmt: skip
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
