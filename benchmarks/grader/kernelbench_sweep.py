"""KernelBench's own problems through the grader: the identity submission of every problem.

    .venv/bin/python benchmarks/grader/kernelbench_sweep.py KERNELBENCH_DIR [--levels 1,2,3,4]
        [--workers 2] [--device cpu|cuda] [--max-input-mib N] [--limit N] [--fresh]
        [--out results/kernelbench_sweep.json]

``KERNELBENCH_DIR`` is a user's checkout of KernelBench (the repository, or its
``KernelBench`` folder holding ``level1``, ``level2``, ...); none of its files are
in this repository. Each problem is graded with the identity submission built on
the fly (the problem's own code plus ``ModelNew = Model``: what a user tries
first), ``--workers`` at a time (each grading on its own core), and one progress
line is printed as each finishes.

Resumable: every finished problem is appended to ``OUT`` with ``.jsonl`` in place of
its suffix (a first line holds the settings). Run the same command again after an
interruption and the problems done are kept, not graded again; ``--fresh`` starts
over. A progress file written with other settings is refused, naming them.

Each problem is classed:
- ``passed``;
- ``problem``: not passed, with a finding that blames the problem (too large for
  this machine, random even in eval mode): an honest refusal;
- ``unsupported``: not graded, with the reason, found without running the file:
  a problem that imports what the grader's worker jail does not hold (level 4's
  ``transformers``) or builds a pretrained model from the Hugging Face Hub (its
  config and weights; none is downloaded at run time, and the local cache is
  only read, to say what it holds);
- ``skipped``: its inputs are over ``--max-input-mib``;
- ``false_failure``: ``failed``, ``hack_flagged``, ``crashed``, ``timeout`` or
  ``invalid`` for the identity: the grader blamed a correct candidate;
- ``opaque_error``: ``grader_error`` with no finding that explains it.

Goals: 0 false failures, 0 opaque errors, every passing identity within 0.9-1.1x.
At the end: a Markdown table (problem, input size, outcome, speedup of the identity,
seconds, why) and the totals (median seconds per graded problem, this run's wall
time), and everything as JSON in ``OUT``. ``AGENTINFRA_GRADER_*`` settings apply
as in ``agentinfra grade``.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import importlib.util
import json
import re
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentinfra._settings import load_settings
from agentinfra.environments.kernels import GradeOptions, KernelSettings, Verdict, grade
from agentinfra.environments.kernels._workers import WORKER_DISTRIBUTIONS
from agentinfra.sandbox import python_runtime_paths

CLASSES = ("passed", "problem", "unsupported", "skipped", "false_failure", "opaque_error")
PROGRESS_VERSION = 1


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


def jail_modules() -> frozenset[str]:
    """Top-level modules a worker can import: the standard library and what its jail holds."""
    held = {Path(p).name.removesuffix(".py") for p in python_runtime_paths(WORKER_DISTRIBUTIONS)}
    return frozenset(held | set(sys.stdlib_module_names))


def unsupported_reason(path: Path, importable: frozenset[str]) -> str | None:
    """Why the grader cannot grade ``path`` as it is, from its source alone (never run), or None."""
    tree = ast.parse(path.read_bytes())
    imported = sorted(
        {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
         for alias in node.names}
        | {node.module.split(".")[0] for node in ast.walk(tree)
           if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    )  # fmt: skip
    missing = [
        name if importlib.util.find_spec(name) else f"{name} (not installed here either)"
        for name in imported
        if name not in importable
    ]
    reasons = []
    hub = hub_models(tree)
    if hub:
        reasons.append(
            f"it builds the pretrained Hugging Face model {', '.join(hub)} ({hub_cache(hub)})"
        )
    if missing:
        reasons.append(
            f"it imports {', '.join(missing)}, which the grader's worker jail does not hold "
            f"(the standard library and {', '.join(WORKER_DISTRIBUTIONS)} with their dependencies)"
        )
    return "; ".join(reasons) or None


def hub_models(tree: ast.Module) -> list[str]:
    """The model ids a problem passes to ``from_pretrained`` (a literal, or a module-level name)."""
    names = {
        target.id: node.value.value
        for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str) for target in node.targets if isinstance(target, ast.Name)
    }  # fmt: skip
    found: set[str] = set()
    unresolved = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "from_pretrained":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in names:
                found.add(names[arg.id])
            else:
                unresolved = True
    return sorted(found) or (["(named at run time)"] if unresolved else [])


def hub_cache(models: list[str]) -> str:
    """What this machine's Hugging Face cache holds of ``models`` (read only; nothing is fetched)."""
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        return "its config and weights come from the Hub; huggingface_hub is not installed here"
    held = []
    for model in (m for m in models if not m.startswith("(")):
        config = isinstance(try_to_load_from_cache(model, "config.json"), str)
        weights = any(
            isinstance(try_to_load_from_cache(model, name), str)
            for name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
        )
        held.append(f"{model}: config {'cached' if config else 'not cached'}, weights "
                    f"{'cached' if weights else 'not cached'}")  # fmt: skip
    return (
        f"config and weights from the Hub, never downloaded at run time; in {constants.HF_HUB_CACHE}: "
        + "; ".join(held)
    )


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


def why(verdict: Verdict) -> str:
    """One line: the error, else the findings' checks (a passing identity usually has none)."""
    if verdict.error:
        return " ".join(verdict.error.split())[:300]
    return ", ".join(sorted({f.check for f in verdict.findings}))


class Sweep:
    """One sweep: its settings, its progress file, and the gradings still to do."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.levels = [int(x) for x in args.levels.split(",") if x.strip()]
        # AGENTINFRA_GRADER_* apply, as in `agentinfra grade`
        settings = KernelSettings.from_config(load_settings().grader, timeout_s=args.timeout_s)
        self.options = GradeOptions.from_settings(settings, device=args.device)
        self.settings = {
            "device": self.options.device, "threads": self.options.threads,
            "memory_limit_bytes": self.options.memory_limit_bytes, "timeout_s": self.options.timeout_s,
            "max_input_mib": args.max_input_mib,
        }  # fmt: skip
        self.progress = args.out.with_suffix(".jsonl")
        self.rows: dict[str, dict[str, Any]] = {}
        self.importable = jail_modules()
        self._lock = threading.Lock()
        self._finished = 0
        self._total = 0

    def resume(self) -> int:
        """The rows of an earlier run with the same settings (``--fresh``: none); how many."""
        if self.args.fresh or not self.progress.is_file():
            self._start_progress()
            return 0
        lines = self.progress.read_text().splitlines()
        header = json.loads(lines[0]) if lines else {}
        if header.get("settings") != self.settings or header.get("version") != PROGRESS_VERSION:
            raise SystemExit(
                f"{self.progress} was written with other settings ({header.get('settings')}, not "
                f"{self.settings}): pass --fresh to start over, or --out to write elsewhere"
            )
        for line in lines[1:]:
            with contextlib.suppress(ValueError, KeyError):  # a line cut short by the interruption
                row = json.loads(line)
                self.rows[row["problem"]] = row
        return len(self.rows)

    def _start_progress(self) -> None:
        self.progress.parent.mkdir(parents=True, exist_ok=True)
        header = {"version": PROGRESS_VERSION, "settings": self.settings}
        self.progress.write_text(json.dumps(header) + "\n")

    def todo(self) -> list[Path]:
        found = problems(self.args.kernelbench, self.levels)
        left = [p for p in found if self.name(p) not in self.rows]
        return left[: self.args.limit] if self.args.limit is not None else left

    @staticmethod
    def name(problem: Path) -> str:
        return f"{problem.parent.name}/{problem.name}"

    def run(self) -> float:
        """Grades what is left, ``--workers`` at a time; the wall time it took."""
        todo = self.todo()
        self._total = len(todo)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.workers) as pool:
            list(pool.map(self.one, todo))  # each row is recorded as it finishes
        return time.monotonic() - started

    def one(self, problem: Path) -> dict[str, Any]:
        """One problem's row: unsupported, skipped, or its identity's verdict."""
        row: dict[str, Any] = {"problem": self.name(problem), "input_mib": None, "outcome": None,
                               "class": None, "speedup": None, "seconds": None, "why": ""}  # fmt: skip
        reason = unsupported_reason(problem, self.importable)
        if reason is not None:
            row.update({"class": "unsupported", "why": reason})
            return self.record(row)
        size = input_bytes(problem)
        row["input_mib"] = None if size is None else round(size / (1 << 20), 2)
        limit = self.args.max_input_mib
        if limit is not None and size is not None and size > limit * (1 << 20):
            row.update({"class": "skipped", "why": f"inputs over --max-input-mib {limit}"})
            return self.record(row)
        submission = problem.read_bytes() + b"\n\nModelNew = Model\n"
        started = time.monotonic()
        try:
            verdict = grade(
                problem.read_bytes(), submission, self.options, problem_name=row["problem"]
            )
        except (
            Exception
        ) as exc:  # the grader itself failed (not a verdict): recorded, the sweep goes on
            row.update({"outcome": "error", "class": "opaque_error", "why": f"{type(exc).__name__}: {exc}"[:300],
                        "seconds": round(time.monotonic() - started, 1)})  # fmt: skip
            return self.record(row)
        row.update({
            "outcome": str(verdict.outcome), "class": classify(verdict),
            "speedup": None if verdict.speedup is None else round(verdict.speedup, 3),
            "seconds": round(time.monotonic() - started, 1), "timed_calls": verdict.timed_calls,
            "baseline_ms": verdict.baseline_ms, "why": why(verdict),
        })  # fmt: skip
        return self.record(row)

    def record(self, row: dict[str, Any]) -> dict[str, Any]:
        """Keeps ``row``, appends it to the progress file and prints its progress line."""
        with self._lock:
            self.rows[row["problem"]] = row
            with self.progress.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            self._finished += 1
            speed = "" if row["speedup"] is None else f" {row['speedup']:.3f}x"
            seconds = "" if row["seconds"] is None else f" {row['seconds']} s"
            print(f"[{self._finished}/{self._total}] {row['problem']}: {row['class']}{speed}{seconds}"
                  + (f" ({row['why'][:120]})" if row["class"] != "passed" else ""), flush=True)  # fmt: skip
        return row

    def summary(self, wall_s: float, resumed: int) -> dict[str, Any]:
        rows = list(self.rows.values())
        graded = [r["seconds"] for r in rows if r["seconds"] is not None]
        speedups = [
            r["speedup"] for r in rows if r["class"] == "passed" and r["speedup"] is not None
        ]
        return {
            "problems": len(rows), **{c: sum(1 for r in rows if r["class"] == c) for c in CLASSES},
            "median_seconds": round(statistics.median(graded), 1) if graded else None,
            "graded_seconds": round(sum(graded), 1), "wall_s_this_run": round(wall_s, 1),
            "resumed_rows": resumed, "workers": self.args.workers,
            "identity_outside_0.9_1.1": sorted(
                r["problem"] for r in rows if r["class"] == "passed" and not 0.9 <= (r["speedup"] or 0) <= 1.1
            ),
            "speedup_range": [min(speedups), max(speedups)] if speedups else None,
            "levels": self.levels, **self.settings,
        }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> Iterator[str]:
    yield "| problem | input MiB | outcome | speedup | time s | why |"
    yield "|---|---:|---|---:|---:|---|"
    for r in rows:
        outcome = r["outcome"] or r["class"]
        yield (f"| {r['problem']} | {r['input_mib'] if r['input_mib'] is not None else '-'} | {outcome} | "
               f"{r['speedup'] if r['speedup'] is not None else '-'} | "
               f"{r['seconds'] if r['seconds'] is not None else '-'} | {r['why'][:200]} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("kernelbench", type=Path)
    parser.add_argument("--levels", default="1,2,3,4")
    parser.add_argument("--workers", type=int, default=1, help="Gradings at a time.")
    parser.add_argument("--max-input-mib", type=float, default=None)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="The candidate's budget per grading."
    )
    parser.add_argument("--limit", type=int, default=None, help="Grade at most this many problems.")
    parser.add_argument(
        "--fresh", action="store_true", help="Start over (ignore the progress file)."
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "kernelbench_sweep.json"
    )
    args = parser.parse_args()
    if args.workers < 1:
        raise SystemExit(f"--workers {args.workers}: at least 1")
    sweep = Sweep(args)
    resumed = sweep.resume()
    if resumed:
        print(f"resuming: {resumed} problems done earlier ({sweep.progress})", flush=True)
    wall_s = sweep.run()
    order = {sweep.name(p): i for i, p in enumerate(problems(args.kernelbench, sweep.levels))}
    rows = sorted(sweep.rows.values(), key=lambda r: order.get(r["problem"], len(order)))
    summary = sweep.summary(wall_s, resumed)
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    print("\n" + "\n".join(table(rows)))
    print("\n" + json.dumps(summary))
    return 1 if summary["false_failure"] or summary["opaque_error"] else 0


if __name__ == "__main__":
    sys.exit(main())
