"""Gradings per minute through the run harness (`RunHarness`, ``--eval-workers``), on the shipped problems.

    .venv/bin/python benchmarks/grader/bench_throughput.py [--eval-workers 2] [--copies 4] [--label NAME]

For each shipped (problem, honest submission) pair of `kernelbench_protocol.PAIRS`,
a fresh run is created in a temporary directory and ``--copies`` versions of the
honest submission (each with its own trailing comment, so each is a separate
submission to grade) are submitted at once; the harness grades them with
``--eval-workers`` gradings at a time under the default grader settings (the
full protocol). Wall time is from the first submission to the last verdict,
summed over the problems, the first grading of the process (fork server start)
included. One JSON line per problem, then the total, appended to
``results/throughput.jsonl``. To measure another revision, run this file with
``PYTHONPATH=<that checkout>/src``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import agentinfra
from agentinfra.environments import Submission
from agentinfra.harness import Budget, RunDirectory, RunHarness, RunSpec, open_environment

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def pairs() -> list[tuple[str, str]]:
    from kernelbench_protocol import PAIRS  # type: ignore[import-not-found]

    return list(PAIRS)


async def grade_copies(
    problem: Path, submission: Path, copies: int, workers: int, base: Path
) -> dict[str, object]:
    spec = RunSpec(run_id=problem.stem, environment="kernels", task=str(problem), agent={"bench": True},
                   budget=Budget(wall_hours=1))  # fmt: skip
    environment = open_environment(spec)
    run = RunDirectory.create(base / problem.stem, spec, grader_version=environment.grader_version)
    harness = RunHarness(run, environment, eval_workers=workers)
    source = submission.read_bytes()
    started = time.perf_counter()
    for index in range(copies):
        harness.submit(
            Submission(source + f"\n# copy {index}\n".encode(), name=submission.name),
            source="bench",
        )
    await harness.drain()
    wall_s = time.perf_counter() - started
    graded = list(harness.state.graded.values())
    scores = [g.get("score") for g in graded if isinstance(g.get("score"), float)]
    return {"problem": problem.stem, "gradings": len(graded), "wall_s": round(wall_s, 2),
            "outcomes": sorted({str(g.get("outcome")) for g in graded}),
            "speedup_median": round(statistics.median(scores), 3) if scores else None}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-workers", type=int, default=2)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--problems", default="", help="comma-separated problem names (default: all)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "throughput.jsonl")
    args = parser.parse_args()
    # the checkout whose agentinfra was imported (another one under PYTHONPATH), not this file's
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(agentinfra.__file__).parent, check=False).stdout.strip()  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="agentinfra-throughput-") as folder:
        chosen = [p for p in pairs() if not args.problems or p[0] in args.problems.split(",")]
        for problem_name, submission_name in chosen:
            row = asyncio.run(grade_copies(
                ROOT / "examples/kernels/problems" / f"{problem_name}.py",
                ROOT / "examples/kernels/submissions" / f"{submission_name}.py",
                args.copies, args.eval_workers, Path(folder),
            ))  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    gradings = sum(int(r["gradings"]) for r in rows)  # type: ignore[call-overload]
    wall = sum(float(r["wall_s"]) for r in rows)  # type: ignore[arg-type]
    total = {"label": args.label, "revision": revision, "eval_workers": args.eval_workers,
             "gradings": gradings, "wall_s": round(wall, 1), "gradings_per_min": round(60 * gradings / wall, 2),
             "problems": rows}  # fmt: skip
    print(json.dumps({k: v for k, v in total.items() if k != "problems"}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as handle:
        handle.write(json.dumps(total) + "\n")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(HERE))
    main()
