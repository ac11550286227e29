"""Scripted agents over every shipped desktop task, through the real loop, desktop and grader.

    .venv/bin/python benchmarks/desktop/bench_agents.py [--desktops 2] [--out results/agents.json]

A scripted OpenAI-compatible server plays each task's scripted solution through
the tool of its action space (the model's side costs nothing), so the figures
are the infrastructure's: success rate (must equal the scripted solutions'
rate: 1.0 on the shipped tasks), steps per minute excluding model time, the
bytes of images sent per step, the anomalies flagged on these honest runs (false
flags: should be 0), and the resume overhead: what `agentinfra resume` spends
restoring a desktop after a crash (a fresh desktop plus every journalled action
replayed), measured on the `--resume-tasks` longest episodes against a fresh
desktop's start.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentinfra.agent import EndpointLimiter, LoopConfig, ScriptedModelServer
from agentinfra.environments import AgentHooks
from agentinfra.environments.desktop import (
    DesktopAgentOptions,
    DesktopTask,
    default_mirror,
    load_desktop_task,
)
from agentinfra.environments.desktop._agent import DesktopAgent, executed_actions, read_actions
from agentinfra.environments.desktop._policy import DesktopPolicy, solution_moves
from agentinfra.harness import RunDirectory, agent_run_spec, run_agents, summarize

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "desktop" / "tasks"


async def _nothing(*_: object) -> str:
    return ""


def _start_time(
    task: DesktopTask, journal: list[str], folder: Path, options: dict[str, object]
) -> float:
    """Seconds from nothing to a desktop ready for the next action, replaying ``journal`` as resume does."""
    workspace = folder / "workspace"
    (workspace / "episode").mkdir(parents=True)
    (workspace / "episode" / "actions.jsonl").write_text("".join(line + "\n" for line in journal))
    hooks = AgentHooks(submit=_nothing, results=_nothing, options=options)
    agent = DesktopAgent(
        task, default_mirror(task.path), workspace, hooks, DesktopAgentOptions.from_options(options)
    )

    async def go() -> float:
        started = time.monotonic()
        await agent._desktop()
        elapsed = time.monotonic() - started
        await agent.close()
        return elapsed

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--desktops", type=int, default=2)
    parser.add_argument("--resume-tasks", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "agents.json"
    )
    args = parser.parse_args()
    tasks = [load_desktop_task(p) for p in sorted(TASKS.glob("*.json"))]
    plans = {}
    for task in tasks:
        solution = task.solution()
        assert solution is not None
        plans[task.instruction] = solution_moves(solution)
    policy = DesktopPolicy(plans)
    with (
        tempfile.TemporaryDirectory() as folder,
        ScriptedModelServer(policy, models=["scripted"]) as server,
    ):
        config = LoopConfig(
            model="scripted", base_url=server.base_url, max_turns=40, keep_images=3, stream=False
        )
        runs = []
        for task in tasks:
            solution = task.solution()
            assert solution is not None
            options = {"action_space": solution["action_space"], "track": solution.get("track", "gui-only"),
                       "desktops": args.desktops, "observation": "screenshot"}  # fmt: skip
            spec = agent_run_spec(
                task.id, task.path, config, {}, environment="desktop", options=options
            )
            runs.append(
                RunDirectory.create(Path(folder) / task.id, spec, grader_version="desktop-1")
            )
        started = time.monotonic()
        states = asyncio.run(run_agents(runs, api_key="test-key", concurrency=len(runs),
                                        limiter=EndpointLimiter(max_in_flight=len(runs))))  # fmt: skip
        wall = time.monotonic() - started
        passed, steps = 0, 0
        journals: dict[str, list[str]] = {}
        for run in runs:
            finals = [json.loads(p.read_text()) for p in (run.path / "evaluations").rglob("*.json")]
            passed += any(f["outcome"] == "passed" for f in finals)
            entries = read_actions(run.path / "agent" / "workspace" / "episode")
            executed = executed_actions(entries)
            steps += len(executed)
            setup = [e for e in entries if e.get("setup")]
            journals[run.spec.run_id] = [json.dumps(e) for e in setup + executed]
            run.close()
        flagged = [a for row in summarize([r.path for r in runs])["runs"] for a in row["anomalies"]]
        resume = []
        by_id = {t.id: t for t in tasks}
        for task_id in sorted(journals, key=lambda k: -len(journals[k]))[: args.resume_tasks]:
            task = by_id[task_id]
            solution = task.solution() or {}
            options = {"action_space": solution["action_space"], "track": solution.get("track", "gui-only"),
                       "observation": "screenshot"}  # fmt: skip
            fresh = _start_time(task, [], Path(folder) / f"fresh-{task_id}", options)
            replayed = _start_time(
                task, journals[task_id], Path(folder) / f"replay-{task_id}", options
            )
            actions = len(journals[task_id]) - 1
            resume.append({"task": task_id, "actions": actions, "fresh_start_s": round(fresh, 2),
                           "resume_start_s": round(replayed, 2), "overhead_s": round(replayed - fresh, 2),
                           "overhead_per_action_s": round((replayed - fresh) / max(actions, 1), 3)})  # fmt: skip
        image_bytes = [len(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))
                       for r in server.requests for m in r["messages"][-1:] if isinstance(m.get("content"), list)
                       for p in m["content"] if p.get("type") == "image_url"]  # fmt: skip
    report = {
        "tasks": len(tasks), "desktops": args.desktops, "success_rate": passed / len(tasks),
        "stopped_normally": sum(1 for s in states if not s.error), "wall_s": round(wall, 1), "steps": steps,
        "steps_per_minute": round(steps / (wall / 60), 1),
        "image_bytes_per_step": {"median": statistics.median(image_bytes), "max": max(image_bytes)},
        "violations": policy.violations, "anomalies_on_honest_runs": flagged, "resume": resume,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
