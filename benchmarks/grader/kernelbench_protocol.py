"""A faithful emulation of KernelBench's own grading protocol on the CPU, beside `agentinfra grade`.

    .venv/bin/python benchmarks/grader/kernelbench_protocol.py [--repeats 3] [--out results/kernelbench_protocol.json]

**This is an emulation, not KernelBench's code** (none of it is in this repository).
It follows the protocol of KernelBench's ``eval_kernel_against_ref`` with the
settings its harnesses use (5 correctness trials, 100 timed trials, 3 warm-up
calls, fp32 tolerance 1e-2), on the CPU, with one torch thread like our grader:

1. a fresh Python process (KernelBench evaluates each kernel in a new process);
2. the problem's and the submission's sources are executed in that one process;
3. both models are built under the same seed from ``get_init_inputs()``;
4. correctness: 5 trials, each with its own seed, ``get_inputs()`` once, both
   models called on the same tensors, ``torch.allclose(atol=1e-2, rtol=1e-2)``;
5. timing, inside that process with its own clock: 3 warm-up calls, then 100
   calls of the candidate on one input set, each timed; the same for the
   reference (KernelBench times its baseline the same way, separately); the
   speedup is the ratio of the means.

What it does not do, and our grader does: sandboxing, secret seeds and input
variants, fresh inputs per timed call, output commitments and audits, timing
from outside the candidate's process. The time per grading is the whole
subprocess wall time. Each (problem, honest submission) pair is graded
``--repeats`` times both ways; medians and the ratio are printed and saved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentinfra.environments.kernels import GradeOptions, grade

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

EMULATION = r"""
import json, sys, time, types
import torch

torch.set_num_threads(1)
problem_src, submission_src = open(sys.argv[1]).read(), open(sys.argv[2]).read()
ref, new = types.ModuleType("reference"), types.ModuleType("custom")
exec(compile(problem_src, sys.argv[1], "exec"), ref.__dict__)
exec(compile(submission_src, sys.argv[2], "exec"), new.__dict__)
started = time.perf_counter()
torch.manual_seed(42)
init = ref.get_init_inputs()
with torch.no_grad():
    torch.manual_seed(42)
    original = ref.Model(*init)
    torch.manual_seed(42)
    custom = new.ModelNew(*init)
    generator = torch.Generator().manual_seed(42)
    seeds = [int(torch.randint(0, 2**32 - 1, (1,), generator=generator)) for _ in range(5)]
    correct = True
    for seed in seeds:
        torch.manual_seed(seed)
        inputs = ref.get_inputs()
        torch.manual_seed(seed)
        expected = original(*inputs)
        torch.manual_seed(seed)
        got = custom(*inputs)
        correct = correct and got.shape == expected.shape and bool(torch.allclose(got, expected, atol=1e-2, rtol=1e-2))

    def timed(model, inputs):
        for _ in range(3):
            model(*inputs)
        times = []
        for _ in range(100):
            start = time.perf_counter()
            model(*inputs)
            times.append(time.perf_counter() - start)
        return sum(times) / len(times)

    torch.manual_seed(42)
    inputs = ref.get_inputs()
    candidate_s = timed(custom, inputs)
    baseline_s = timed(original, inputs)
print(json.dumps({"correct": correct, "speedup": baseline_s / candidate_s, "in_process_s": time.perf_counter() - started}))
"""


def emulate(problem: Path, submission: Path) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", EMULATION, str(problem), str(submission)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "kernelbench_protocol.json"
    )
    args = parser.parse_args()
    rows = []
    for problem_name, submission_name in PAIRS:
        problem = ROOT / "examples/kernels/problems" / f"{problem_name}.py"
        submission = ROOT / "examples/kernels/submissions" / f"{submission_name}.py"
        theirs, ours = [], []
        for _ in range(args.repeats):
            theirs.append(emulate(problem, submission))
            started = time.perf_counter()
            verdict = grade(
                problem.read_bytes(),
                submission.read_bytes(),
                GradeOptions(),
                problem_name=problem.name,
            )
            ours.append({"wall_s": time.perf_counter() - started, "speedup": verdict.speedup,
                         "outcome": str(verdict.outcome)})  # fmt: skip
        row = {
            "problem": problem_name, "submission": submission_name,
            "kernelbench_s": round(statistics.median(r["wall_s"] for r in theirs), 2),
            "kernelbench_in_process_s": round(statistics.median(r["in_process_s"] for r in theirs), 2),
            "kernelbench_speedup": round(statistics.median(r["speedup"] for r in theirs), 3),
            "kernelbench_correct": all(r["correct"] for r in theirs),
            "agentinfra_s": round(statistics.median(r["wall_s"] for r in ours), 2),
            "agentinfra_speedup": round(statistics.median(r["speedup"] or 0.0 for r in ours), 3),
            "agentinfra_outcomes": sorted({r["outcome"] for r in ours}),
        }  # fmt: skip
        row["ratio"] = round(row["agentinfra_s"] / row["kernelbench_s"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| problem | KernelBench protocol s | agentinfra s | ratio | speedup (KB / ours) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['problem']} | {r['kernelbench_s']} | {r['agentinfra_s']} | {r['ratio']}x | "
              f"{r['kernelbench_speedup']} / {r['agentinfra_speedup']} |")  # fmt: skip


if __name__ == "__main__":
    main()
