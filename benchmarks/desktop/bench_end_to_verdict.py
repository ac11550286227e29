"""Time from an episode's end to its verdict, for source trees compared (issue 29's freeze-first end).

    .venv/bin/python benchmarks/desktop/bench_end_to_verdict.py --tree before=/path/a/src --tree after=src \
        [--task calc-total] [--repeats 3] [--out results/end_to_verdict.json]

Runs ``agentinfra desktop run TASK --actions <its scripted solution>`` with each tree
first on ``PYTHONPATH``, repeats interleaved. The episode's end is when its action
log is closed (``actions.jsonl``'s mtime: the last action was written); the verdict
is ``verdict.json``'s mtime. Also reports the verdict's own set-up, action and
grading timings, and the command's wall time. Run as root, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one(tree: str, task: Path, actions: Path, out: Path) -> dict[str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "agentinfra", "desktop", "run", str(task), "--actions", str(actions),
                           "--out", str(out), "--json"], env={**os.environ, "PYTHONPATH": tree},
                          capture_output=True, check=False)  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")
    verdict = json.loads(done.stdout)
    timings = verdict["details"]["timings_s"]
    end = (out / "actions.jsonl").stat().st_mtime
    graded = (out / "verdict.json").stat().st_mtime
    return {"score": verdict["score"], "end_to_verdict_s": graded - end, "grading_s": timings["grading"],
            "setup_s": timings["setup"], "first_observation_s": timings["first_observation"],
            "action_and_screenshot_median_s": statistics.median(timings["action_and_screenshot"] or [0.0]),
            "wall_s": wall}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="NAME=SRC_DIR")
    parser.add_argument("--task", default="calc-total")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    task = ROOT / "examples" / "desktop" / "tasks" / f"{args.task}.json"
    solution = json.loads(task.read_text())["solution"]
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        actions = Path(folder) / "actions.json"
        actions.write_text(json.dumps(solution))
        for repeat in range(args.repeats):
            for spec in args.tree:
                name, _, tree = spec.partition("=")
                result = one(
                    str(Path(tree).resolve()), task, actions, Path(folder) / f"{name}-{repeat}"
                )
                runs.setdefault(name, []).append(result)
                print(name, json.dumps(result), flush=True)
    summary = {name: {key: {"median": round(statistics.median(r[key] for r in rows), 3),
                            "max": round(max(r[key] for r in rows), 3)} for key in rows[0]}
               for name, rows in runs.items()}  # fmt: skip
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(
            json.dumps({"task": args.task, "runs": runs, "summary": summary}, indent=1)
        )


if __name__ == "__main__":
    main()
