"""Stress: N gradings of one honest file started together, with the same seed (as agent-visible checks are).

    .venv/bin/python benchmarks/grader/bench_concurrent.py [--gradings 4] [--rounds 3] [--problem 02_softmax]

Each round starts ``--gradings`` threads that call `grade` at the same moment
(a barrier) with ``GradeOptions(seed=0)``; every verdict must be ``passed``. A
crash here is the bug issue 14 found first (concurrent checks drew the same
candidate uid and one grading's cleanup killed another's candidate). One JSON
line per round, then a summary; exits 1 when any grading did not pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from agentinfra.environments.kernels import GradeOptions, Verdict, grade

ROOT = Path(__file__).resolve().parents[2]
SUBMISSIONS = {"02_softmax": "02_softmax_manual", "11_slow_cumsum": "11_fast_cumsum",
               "01_matmul_relu": "01_matmul_relu_addmm"}  # fmt: skip


def one_round(problem: str, count: int) -> list[Verdict]:
    barrier = threading.Barrier(count)
    verdicts: list[Verdict] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        verdict = grade(
            (ROOT / "examples/kernels/problems" / f"{problem}.py").read_bytes(),
            (ROOT / "examples/kernels/submissions" / f"{SUBMISSIONS[problem]}.py").read_bytes(),
            GradeOptions(seed=0, timing_pairs=6),
            problem_name=f"{problem}.py",
        )
        with lock:
            verdicts.append(verdict)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gradings", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--problem", default="02_softmax", choices=sorted(SUBMISSIONS))
    args = parser.parse_args()
    outcomes: Counter[str] = Counter()
    for index in range(args.rounds):
        started = time.perf_counter()
        verdicts = one_round(args.problem, args.gradings)
        counts = Counter(v.outcome.value for v in verdicts)
        outcomes.update(counts)
        errors = [v.error[:200] for v in verdicts if v.error]
        print(json.dumps({"round": index, "outcomes": dict(counts), "wall_s": round(time.perf_counter() - started, 2),
                          "errors": errors}), flush=True)  # fmt: skip
    total = sum(outcomes.values())
    print(
        json.dumps(
            {"gradings": total, "passed": outcomes.get("passed", 0), "outcomes": dict(outcomes)}
        )
    )
    sys.exit(0 if outcomes.get("passed", 0) == total else 1)


if __name__ == "__main__":
    main()
