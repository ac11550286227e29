"""One problem's identity graded with default settings, and what each timed pair looked like.

    .venv/bin/python benchmarks/grader/identity_pairs.py PROBLEM.py [--repeats N]

For an identity that reads outside 0.9-1.1x: prints, per grading, each timed pair's
seconds per call on both sides, and the page faults each side's worker tree took in
each batch (warm-up included: what the timing's warm-up test reads), then the verdict.
It wraps the timing step's private methods (`_timing.TimingRun`) to read them; the
grading itself is unchanged.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from agentinfra._settings import load_settings
from agentinfra.environments.kernels import GradeOptions, KernelSettings, _timing, grade

FAULTS: dict[str, list[int]] = {"reference": [], "candidate": []}


def _counting(name: str, side: str) -> None:
    """Keeps each non-empty batch's page faults, as the timing itself measured them."""
    original = getattr(_timing.TimingRun, name)
    which = _timing.REFERENCE if side == "reference" else _timing.CANDIDATE

    def wrapped(self: Any, indices: list[int], *, staged: bool = False) -> Any:
        result = original(self, indices, staged=staged)
        if indices:
            FAULTS[side].append(self._batch_faults[which])
        return result

    setattr(_timing.TimingRun, name, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("problem", type=Path)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    _counting("_timed_batch_reference", "reference")
    _counting("_timed_batch_candidate", "candidate")
    run = _timing.TimingRun.run

    def report(self: Any) -> _timing.Measurements:
        measured = run(self)
        print(json.dumps({
            "warmup_pairs": measured.warmup_pairs, "per_batch": measured.per_batch,
            "reference_ms": [round(t * 1e3, 2) for t in measured.ref_times],
            "candidate_ms": [round(t * 1e3, 2) for t in measured.cand_times],
            "faults": FAULTS,
        }), flush=True)  # fmt: skip
        return measured

    _timing.TimingRun.run = report  # type: ignore[method-assign]
    settings = KernelSettings.from_config(load_settings().grader, timeout_s=args.timeout_s)
    options = GradeOptions.from_settings(settings, device="cpu")
    code = args.problem.read_bytes()
    for _ in range(args.repeats):
        FAULTS["reference"], FAULTS["candidate"] = [], []
        started = time.monotonic()
        verdict = grade(
            code, code + b"\n\nModelNew = Model\n", options, problem_name=args.problem.stem
        )
        print(json.dumps({
            "problem": args.problem.stem, "outcome": str(verdict.outcome), "speedup": verdict.speedup,
            "timed_calls": verdict.timed_calls, "seconds": round(time.monotonic() - started, 1),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
