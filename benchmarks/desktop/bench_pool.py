"""The desktop pool: first observation warm vs cold, and scripted throughput with the pool at 0, 2, 4.

    .venv/bin/python benchmarks/desktop/bench_pool.py [--episodes 10] [--pools 0,2,4] [--smoke]
        [--out benchmarks/desktop/results/pool.json]

1. First observation: from asking for a desktop to the first observation, as `run_episode`
   takes it, for two tasks: ``bare`` (os-mkdir with no setup steps: the desktop's own
   figure; screenshot and accessibility tree) and ``calc-total`` (its setup downloads a
   sheet and opens it in LibreOffice, as every shipped task opens an application;
   screenshot only, as RESULTS.md's first table measured it: Calc's tree walk alone is
   about 1.8 s). An episode that crashes is listed in ``failures``, not timed. Cold:
   `--episodes` episodes with no pool; warm: as many with a pool of 1, each after the
   pool is full again (a warm handout, not an exhausted pool). p50 and p95 of each.
2. Throughput: the scripted solutions of the shipped terminal tasks (``os-*``), played and
   graded with 2 desktops at once, with the pool at each of ``--pools``: executed actions
   per minute of wall time, set-up and grading included; every episode's score is checked.

Prints one JSON object (parameters, git revision, Python, machine) and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentinfra.environments.desktop import (
    DesktopPool,
    default_mirror,
    grade_episode,
    load_actions,
    load_desktop_task,
)
from agentinfra.environments.desktop._episode import run_episode
from agentinfra.environments.desktop._task import DesktopTask

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "desktop" / "tasks"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bare_task(folder: Path) -> DesktopTask:
    """os-mkdir without its setup (no terminal opened): the first observation is the desktop's own."""
    document = json.loads((TASKS / "os-mkdir.json").read_text())
    document["config"] = []
    path = folder / "bare.json"
    path.write_text(json.dumps(document))
    return load_desktop_task(path)


async def first_observations(
    task: DesktopTask, episodes: int, pooled: bool, folder: Path, *, accessibility: bool
) -> tuple[list[float], list[str]]:
    """The first-observation times of ``episodes`` episodes, and the failures (an episode that crashed)."""
    pool = DesktopPool(size=1 if pooled else 0)
    times: list[float] = []
    failures: list[str] = []
    async with pool:
        for index in range(episodes):
            if pooled:
                await pool.wait_ready(timeout_s=300)
            result = await run_episode(task, ["DONE"], action_space="computer_13", track="gui-only",
                                       episode_dir=folder / f"{task.id}-{pooled}-{index}",
                                       mirror=default_mirror(task.path), accessibility=accessibility)  # fmt: skip
            if result.crashed or result.setup_error:
                failures.append(f"episode {index}: {result.crashed or result.setup_error}")
            else:
                times.append(result.first_observation_s)
    if pooled and pool.stats().handed_out != episodes:
        failures.append(
            f"only {pool.stats().handed_out} of {episodes} episodes got a pooled desktop"
        )
    return times, failures


async def throughput(pool_size: int, task_ids: list[str], folder: Path) -> dict[str, Any]:
    slots = asyncio.Semaphore(2)
    actions_done = 0
    scores: dict[str, float] = {}

    async def one(task_id: str) -> None:
        nonlocal actions_done
        task = load_desktop_task(TASKS / f"{task_id}.json")
        solution = task.solution()
        assert solution is not None
        space, actions = load_actions(solution)
        mirror = default_mirror(task.path)
        async with slots:
            episode = await run_episode(task, actions, action_space=space, track=str(solution.get("track", "gui-only")),
                                        episode_dir=folder / f"{pool_size}-{task_id}", mirror=mirror,
                                        accessibility=False)  # fmt: skip
            verdict = await asyncio.to_thread(grade_episode, task, episode, mirror)
        scores[task_id] = verdict.score
        actions_done += sum(1 for a in actions if a not in ("DONE", "FAIL"))

    async with DesktopPool(size=pool_size) as pool:
        if pool_size:
            await pool.wait_ready(timeout_s=300)
        started = time.monotonic()
        await asyncio.gather(*(one(t) for t in task_ids))
        wall = time.monotonic() - started
        stats = pool.stats()
    return {"pool": pool_size, "episodes": len(task_ids), "actions": actions_done, "wall_s": round(wall, 2),
            "actions_per_minute": round(actions_done / wall * 60, 1), "pooled_handouts": stats.handed_out,
            "cold_starts": stats.misses if pool_size else len(task_ids),
            "mean_score": round(statistics.mean(scores.values()), 3)}  # fmt: skip


def machine() -> dict[str, Any]:
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    return {"git": revision, "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "machine": platform.machine(), "load_avg_start": os.getloadavg()}  # fmt: skip


async def main(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"bench": "desktop_pool", **machine(), "episodes": args.episodes}
    with tempfile.TemporaryDirectory(prefix="agentinfra-bench-pool-") as temporary:
        folder = Path(temporary)
        for name, task, accessibility in (
            ("bare", bare_task(folder), True),
            ("calc-total", load_desktop_task(TASKS / "calc-total.json"), False),
        ):
            for label, pooled in (("cold", False), ("warm", True)):
                times, failures = await first_observations(task, args.episodes, pooled, folder,
                                                           accessibility=accessibility)  # fmt: skip
                report[f"first_observation_{name}_{label}_s"] = {
                    "p50": round(statistics.median(times), 3) if times else None,
                    "p95": round(percentile(times, 0.95), 3) if times else None,
                    "all": [round(t, 3) for t in times], "failures": failures}  # fmt: skip
        task_ids = sorted(p.stem for p in TASKS.glob("os-*.json"))[: 2 if args.smoke else None]
        report["throughput"] = [await throughput(size, task_ids, folder) for size in args.pools]
    report["load_avg_end"] = os.getloadavg()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--pools", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2, 4])
    parser.add_argument(
        "--smoke", action="store_true", help="2 episodes each, 2 tasks, pools 0 and 2"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "desktop" / "results" / "pool.json"
    )
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.pools = 2, [0, 2]
    result = asyncio.run(main(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
