"""What the grading jail costs: building a minimal root per worker, and a worker's start.

    python benchmarks/grader/bench_jail.py [--smoke] [--repeats N]

Three timings, each the median of ``--repeats`` runs, from ``Popen`` to exit or
to the first answer:

- ``python -I -c pass`` as a plain child, and the same inside the worker's jail
  (`agentinfra.environments.kernels._workers.worker_jail`: unshare, the minimal
  root with the torch/numpy/xxhash runtime bound in, pivot_root, privilege drop).
  The difference is what building the jail adds per worker.
- a grading worker started to its ``hello`` frame and through ``load`` of a tiny
  problem (imports torch): unconfined (``-m``, as the ``rlimits-only`` mode runs
  it) against jailed.

Prints one JSON line per timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentinfra.environments.kernels._workers import SandboxLimits, WorkerProcess, worker_jail
from agentinfra.sandbox import _spec, probe_sandbox_mode

PROBLEM = """
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x + 1
def get_inputs():
    return [torch.ones(4)]
def get_init_inputs():
    return []
"""


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdin=subprocess.DEVNULL, capture_output=True)
    return time.perf_counter() - start


def worker_start(
    folder: Path, problem: Path, limits: SandboxLimits, mode: str
) -> tuple[float, float]:
    _spec._PROBED["mode"] = mode  # type: ignore[assignment]
    start = time.perf_counter()
    workdir = folder / f"worker-{time.monotonic_ns()}"
    workdir.mkdir()
    worker = WorkerProcess.start(
        workdir=workdir, role="candidate", limits=limits, program=problem, uid=259_999
    )
    try:
        worker.receive(timeout_s=60)
        hello = time.perf_counter() - start
        reply = worker.request(
            {"op": "load", "role": "reference", "path": worker.program_path(problem), "threads": 1,
             "seed": 1, "device": "cpu"}, timeout_s=60,
        )  # fmt: skip
        assert reply.header.get("ok"), reply.header
        return hello, time.perf_counter() - start
    finally:
        worker.kill()
        _spec._PROBED.clear()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    repeats = 2 if args.smoke else args.repeats
    mode = probe_sandbox_mode()
    if mode not in ("namespaces+uid", "userns"):
        sys.exit(f"bench_jail: needs namespaces; this machine's sandbox mode is {mode}")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    limits = SandboxLimits(
        memory_limit_bytes=4 << 30, max_processes=64, cpu_limit_s=60, threads=1, cpus=cpus
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        problem = folder / "problem.py"
        problem.write_text(PROBLEM)
        jail = worker_jail(
            argv_tail=(),
            env=env,
            uid=259_998,
            program=problem,
            limits=limits,
            cpus=cpus,
            device="cpu",
        )
        jailed_pass = [*jail.command(mode)[: -len(jail.argv)], sys.executable, "-I", "-c", "pass"]
        timed(jailed_pass, env)  # warm the page cache
        rows = {
            "python -I -c pass, plain": [
                timed([sys.executable, "-I", "-c", "pass"], env) for _ in range(repeats)
            ],
            "python -I -c pass, jailed": [timed(jailed_pass, env) for _ in range(repeats)],
        }
        for label, worker_mode in (
            ("worker, unconfined", "rlimits-only"),
            ("worker, jailed", mode),
        ):
            samples = [worker_start(folder, problem, limits, worker_mode) for _ in range(repeats)]
            rows[f"{label}: start to hello"] = [s[0] for s in samples]
            rows[f"{label}: start to loaded (torch imported)"] = [s[1] for s in samples]
    meta = {"python": platform.python_version(), "machine": platform.machine(), "sandbox": mode,
            "runtime_paths": len(jail.ro_paths), "repeats": repeats}  # fmt: skip
    for label, samples in rows.items():
        print(json.dumps({"timing": label, "median_ms": round(statistics.median(samples) * 1000, 1),
                          "min_ms": round(min(samples) * 1000, 1), "max_ms": round(max(samples) * 1000, 1), **meta}))  # fmt: skip
    plain, jailed = (
        statistics.median(rows["python -I -c pass, plain"]),
        statistics.median(rows["python -I -c pass, jailed"]),
    )
    print(
        json.dumps(
            {
                "timing": "jail build (jailed - plain)",
                "median_ms": round((jailed - plain) * 1000, 1),
                **meta,
            }
        )
    )


if __name__ == "__main__":
    main()
