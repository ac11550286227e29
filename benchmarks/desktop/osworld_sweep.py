"""OSWorld's own tasks, from a user's checkout and cache, graded here (issue 32).

    .venv/bin/python benchmarks/desktop/osworld_sweep.py OSWORLD_DIR --cache CACHE_DIR \
        [--tasks OSWORLD_DIR/evaluation_examples/test_all.json] [--desktops 2] \
        [--only-supported] [--out results/osworld_sweep.jsonl]

For every task the list names, one row (JSON lines, resumable: rows already in ``--out``
are kept and not run again):

* ``supported``, or the ``reason`` it is not (`support`, nothing started);
* for a supported task, one real episode on a desktop that ends at once with FAIL (setup,
  freeze, live postconfig such as OSWorld's save, snapshot), graded two ways as
  `audit_task` does: ``fail_score`` (must be 1 only on an infeasible task) and
  ``do_nothing`` (the same desktop, FAIL not counted; must be 0 on a feasible task);
* ``oracle``: for a task whose every check compares one result file (``vm_file``) with one
  expected file (``cloud_file``), the expected file is written over the result in that
  episode's frozen snapshot and the snapshot graded again; it must score 1. This grades the
  gold as the application would have left it only when the application saves it unchanged;
  a task whose expected file is the original (its check asks for a change relative to it)
  scores 0 here by design, and is named by its row.

Flags (``flags``): a do-nothing pass, a FAIL mismatch, an oracle below 1, a grader error.
A summary line per outcome is printed at the end. Run as root (the desktop's jails).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentinfra.environments.desktop._episode import run_episode
from agentinfra.environments.desktop._grading import grade_episode
from agentinfra.environments.desktop._task import (
    getter_files,
    load_desktop_task,
    mirror_file,
    selected_task_files,
    support,
)
from agentinfra.errors import TaskEnvironmentError

HOME = "/home/user/"


def oracle_pairs(task: Any, cache: Path) -> list[tuple[str, Path]] | None:
    """(result path in the home, the cache's expected file) for every file of every check, or None
    when a check is not result files against as many expected files. A ``multi`` getter's files
    pair by position, given or not: a metric may read one beside the one it is given (sheet_print
    reads the CSV LibreOffice printed beside the book)."""
    pairs: list[tuple[str, Path]] = []
    for result, expected in zip(task.specs("result"), task.specs("expected"), strict=True):
        if (
            not result
            or not expected
            or result.get("type") != "vm_file"
            or expected.get("type") != "cloud_file"
        ):
            return None
        results, golds = getter_files(result, every=True)[0], getter_files(expected, every=True)[0]
        if len(results) != len(golds):
            return None
        for (path, _), (url, dest) in zip(results, golds, strict=True):
            gold = mirror_file(cache, url, task_id=task.id, dest=dest, cloud=True)
            if gold is None or not path.startswith(HOME):
                return None
            pairs.append((path, gold))
    return pairs or None


def sweep_one(path: Path, cache: Path, workdir: Path) -> dict[str, Any]:
    started = time.monotonic()
    row: dict[str, Any] = {"task": path.stem, "domain": path.parent.name}
    try:
        task = load_desktop_task(path)
    except TaskEnvironmentError as exc:
        return {**row, "supported": False, "reason": f"refused: {exc}", "flags": []}
    verdict = support(task, cache)
    row.update(supported=verdict.supported, reason=verdict.reason, infeasible=task.infeasible,
               funcs=task.funcs)  # fmt: skip
    if not verdict.supported:
        return {**row, "flags": []}
    flags: list[str] = []
    episode = asyncio.run(run_episode(task, ["FAIL"], action_space="computer_13", track="gui-only",
                                      episode_dir=workdir / "episode", mirror=cache, accessibility=False))  # fmt: skip
    failed = grade_episode(task, episode, cache)
    episode.last_action = None
    idle = grade_episode(task, episode, cache)
    row.update(fail_score=failed.score, do_nothing=idle.score, do_nothing_outcome=idle.outcome.value,
               do_nothing_findings=[f"{f.check}: {f.message}"[:300] for f in idle.findings])  # fmt: skip
    if idle.outcome.value == "grader_error":
        flags.append("grader_error")
    if idle.score > 0 and not task.infeasible:
        flags.append("do_nothing_passes")
    if (failed.score == 1.0) != task.infeasible:
        flags.append("fail_mismatch")
    pairs = oracle_pairs(task, cache) if episode.snapshot is not None else None
    if pairs:
        assert episode.snapshot is not None
        for home_path, gold in pairs:
            target = episode.snapshot / home_path[len(HOME) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.is_dir():
                target.unlink() if target.is_symlink() else shutil.rmtree(target)
            shutil.copyfile(gold, target)
        oracle = grade_episode(task, episode, cache)
        row.update(oracle=oracle.score, oracle_outcome=oracle.outcome.value,
                   oracle_errors=[f"{f.check}: {f.message}"[:300] for f in oracle.findings])  # fmt: skip
        if oracle.score < 1.0:
            flags.append("oracle_below_1")
    row.update(flags=flags, seconds=round(time.monotonic() - started, 1))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "osworld", type=Path, help="an OSWorld checkout (evaluation_examples/ inside)"
    )
    parser.add_argument(
        "--cache", type=Path, required=True, help="OSWorld's cache directory (a folder per task)"
    )
    parser.add_argument(
        "--tasks", type=Path, help="task list (default: evaluation_examples/test_all.json)"
    )
    parser.add_argument("--desktops", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/osworld_sweep.jsonl"))
    args = parser.parse_args()
    selection = args.tasks or args.osworld / "evaluation_examples" / "test_all.json"
    files = selected_task_files(args.osworld, selection)
    done: dict[str, dict[str, Any]] = {}
    if args.out.is_file():
        for line in args.out.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["task"]] = row
    todo = [f for f in files if f.stem not in done]
    print(f"{len(files)} tasks, {len(done)} already in {args.out}, {len(todo)} to run", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentinfra-osworld-") as folder, args.out.open("a") as out, \
            ThreadPoolExecutor(max(1, args.desktops)) as pool:  # fmt: skip
        futures = {f: pool.submit(sweep_one, f, args.cache, Path(folder) / f.stem) for f in todo}
        for index, (file, future) in enumerate(futures.items(), start=1):
            try:
                row = future.result()
            except Exception as exc:  # a crash of the sweep itself: recorded, the sweep goes on
                row = {"task": file.stem, "domain": file.parent.name, "supported": None,
                       "reason": f"sweep error: {type(exc).__name__}: {exc}"[:500], "flags": ["sweep_error"]}  # fmt: skip
            done[row["task"]] = row
            out.write(json.dumps(row) + "\n")
            out.flush()
            state = (
                "unsupported"
                if not row.get("supported")
                else (
                    f"nothing {row.get('do_nothing')} fail {row.get('fail_score')} oracle {row.get('oracle', '-')}"
                )
            )
            print(f"[{index}/{len(todo)}] {row['domain']}/{row['task']}: {state} {' '.join(row['flags'])}",
                  flush=True)  # fmt: skip
    rows = [done[f.stem] for f in files if f.stem in done]
    supported = [r for r in rows if r.get("supported")]
    feasible = [r for r in supported if not r.get("infeasible")]
    oracled = [r for r in supported if "oracle" in r]
    print(json.dumps({
        "tasks": len(rows), "supported": len(supported),
        "do_nothing_zero_on_feasible": f"{sum(r.get('do_nothing') == 0 for r in feasible)}/{len(feasible)}",
        "fail_right": f"{sum('fail_mismatch' not in r['flags'] for r in supported)}/{len(supported)}",
        "oracle_one": f"{sum(r['oracle'] == 1.0 for r in oracled)}/{len(oracled)}",
        "flagged": sorted(f"{r['domain']}/{r['task']}: {','.join(r['flags'])}" for r in supported if r["flags"]),
    }, indent=1))  # fmt: skip
    sys.exit(0)


if __name__ == "__main__":
    main()
