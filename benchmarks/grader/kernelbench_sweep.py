"""KernelBench's own problems through the grader: the identity submission of every problem that fits.

    .venv/bin/python benchmarks/grader/kernelbench_sweep.py KERNELBENCH_DIR [--levels 1,2] [--max-input-mib N]
        [--device cpu|cuda] [--limit N] [--out results/kernelbench_sweep.json]

``KERNELBENCH_DIR`` is a user's checkout of KernelBench (the repository, or its
``KernelBench`` folder holding ``level1``, ``level2``, ...); none of its files are
in this repository. For each problem of the chosen levels: its inputs are sized
on torch's meta device (nothing allocated; a problem whose sizing fails is still
graded), problems over ``--max-input-mib`` are skipped and listed, and the
others are graded with the identity submission built on the fly (the problem's
own code plus ``ModelNew = Model``: what a user tries first).

Each verdict is classed:
- ``passed``;
- ``problem``: not passed, with a finding that blames the problem (``problem``:
  too large, random even in eval mode) — an honest refusal;
- ``false_failure``: ``failed``, ``hack_flagged``, ``crashed``, ``timeout`` or
  ``invalid`` for the identity: the grader blamed a correct candidate;
- ``opaque_error``: ``grader_error`` with no finding that explains it.

Goals: 0 false failures, 0 opaque errors. Prints a Markdown table and the
totals (median time per grading); writes everything as JSON to ``--out``.
``AGENTINFRA_GRADER_*`` settings apply as in ``agentinfra grade``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentinfra._settings import load_settings
from agentinfra.environments.kernels import GradeOptions, KernelSettings, Verdict, grade


def problems(root: Path, levels: list[int]) -> list[Path]:
    base = root / "KernelBench" if (root / "KernelBench").is_dir() else root
    found: list[Path] = []
    for level in levels:
        folder = base / f"level{level}"
        if not folder.is_dir():
            raise SystemExit(
                f"no {folder}: KERNELBENCH_DIR must hold level{level}/ (or KernelBench/level{level}/)"
            )
        found += sorted(
            folder.glob("*.py"), key=lambda p: (int(re.match(r"\d*", p.stem)[0] or 0), p.stem)
        )  # type: ignore[index]
    return found


def input_bytes(path: Path) -> int | None:
    """The bytes of one input set, from ``get_inputs()`` on the meta device (None when that fails)."""
    import torch

    spec = importlib.util.spec_from_file_location(f"kb_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        return None
    torch.distributions.Distribution.set_default_validate_args(False)  # its checks read values
    with contextlib.suppress(Exception), torch.device("meta"):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        inputs = module.get_inputs()
        return sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    return None


def classify(verdict: Verdict) -> str:
    if verdict.outcome == "passed":
        return "passed"
    if any(f.check == "problem" for f in verdict.findings):
        return "problem"
    if verdict.outcome == "grader_error":
        return "opaque_error"
    return "false_failure"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernelbench", type=Path)
    parser.add_argument("--levels", default="1,2")
    parser.add_argument("--max-input-mib", type=float, default=None)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="The candidate's budget per grading."
    )
    parser.add_argument("--limit", type=int, default=None, help="Grade at most this many problems.")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "kernelbench_sweep.json"
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    # AGENTINFRA_GRADER_* apply, as in `agentinfra grade` (AGENTINFRA_GRADER_MEMORY: the candidate's limit)
    settings = KernelSettings.from_config(load_settings().grader, timeout_s=args.timeout_s)
    options = GradeOptions.from_settings(settings, device=args.device)
    with tempfile.TemporaryDirectory(prefix="kernelbench-sweep-") as tmp:
        for problem in problems(args.kernelbench, levels):
            if args.limit is not None and len(rows) >= args.limit:
                break
            name = f"{problem.parent.name}/{problem.name}"
            size = input_bytes(problem)
            if (
                args.max_input_mib is not None
                and size is not None
                and size > args.max_input_mib * (1 << 20)
            ):
                skipped.append({"problem": name, "input_mib": round(size / (1 << 20), 1)})
                continue
            submission = Path(tmp) / f"{problem.parent.name}_{problem.stem}_identity.py"
            submission.write_text(problem.read_text() + "\n\nModelNew = Model\n")
            started = time.monotonic()
            verdict = grade(
                problem.read_bytes(), submission.read_bytes(), options, problem_name=name
            )
            elapsed = time.monotonic() - started
            row = {
                "problem": name, "input_mib": None if size is None else round(size / (1 << 20), 2),
                "outcome": str(verdict.outcome), "class": classify(verdict), "seconds": round(elapsed, 1),
                "speedup": None if verdict.speedup is None else round(verdict.speedup, 3),
                "timed_calls": verdict.timed_calls, "baseline_ms": verdict.baseline_ms,
                "findings": sorted({f.check for f in verdict.findings}), "error": (verdict.error or "")[:300],
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    counts = {
        c: sum(1 for r in rows if r["class"] == c)
        for c in ("passed", "problem", "false_failure", "opaque_error")
    }
    summary = {"graded": len(rows), "skipped_over_max_input": len(skipped), **counts,
               "median_seconds": round(statistics.median(r["seconds"] for r in rows), 1) if rows else None,
               "device": args.device, "levels": levels}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"summary": summary, "rows": rows, "skipped": skipped}, indent=1) + "\n"
    )
    print("\n| problem | input MiB | outcome | class | time s | speedup | timed calls | findings |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['problem']} | {r['input_mib']} | {r['outcome']} | {r['class']} | {r['seconds']} | "
              f"{r['speedup']} | {r['timed_calls']} | {', '.join(r['findings'])} |")  # fmt: skip
    print("\n" + json.dumps(summary))
    return 1 if counts["false_failure"] or counts["opaque_error"] else 0


if __name__ == "__main__":
    sys.exit(main())
