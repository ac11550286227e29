"""Grading cost and the run-to-run spread of measured speedups.

    python benchmarks/grader/bench_grade.py [--smoke] [--repeats N]

For each (problem, submission) pair: the wall time of one full grading, and the
speedup measured in ``--repeats`` independent gradings of the same submission
(median, min, max, and the largest deviation of one run's speedup from the
median of all runs). Prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentinfra.environments.kernels import GradeOptions, grade
from agentinfra.sandbox import probe_sandbox_mode

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [
    ("01_matmul_relu", "01_matmul_relu_addmm"),
    ("02_softmax", "02_softmax_manual"),
    ("03_layernorm", "03_layernorm_manual"),
    ("05_conv2d", "05_conv2d_functional"),
    ("06_attention", "06_attention_sdpa"),
    ("10_slow_rowwise_softmax", "10_fast_softmax"),
    ("11_slow_cumsum", "11_fast_cumsum"),
    ("12_log_sum_positive", "12_log_sum"),
    ("13_relu_scale", "13_relu_scale_inplace"),
]


def revision() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    pairs = PAIRS[-1:] if args.smoke else PAIRS
    repeats = 2 if args.smoke else args.repeats
    env = {
        "git": revision(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "sandbox": probe_sandbox_mode(),
    }
    for problem, submission in pairs:
        walls: list[float] = []
        speedups: list[float] = []
        for _ in range(repeats):
            start = time.perf_counter()
            verdict = grade(
                (ROOT / "examples/kernels/problems" / f"{problem}.py").read_bytes(),
                (ROOT / "examples/kernels/submissions" / f"{submission}.py").read_bytes(),
                GradeOptions(),
                problem_name=f"{problem}.py",
            )
            walls.append(time.perf_counter() - start)
            if verdict.speedup is None:
                raise SystemExit(f"{submission}: {verdict.outcome.value}: {verdict.error}")
            speedups.append(verdict.speedup)
        middle = statistics.median(speedups)
        record = {
            "bench": "grade", "problem": problem, "submission": submission, "repeats": repeats,
            "wall_s_median": round(statistics.median(walls), 2), "wall_s_max": round(max(walls), 2),
            "speedup_median": round(middle, 3), "speedup_min": round(min(speedups), 3), "speedup_max": round(max(speedups), 3),
            "max_deviation_from_median": round(max(abs(s / middle - 1) for s in speedups), 4),
            "speedups": [round(s, 4) for s in speedups], **env,
        }  # fmt: skip
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
