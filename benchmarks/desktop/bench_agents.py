"""Scripted agents over every shipped desktop task, through the real loop, desktop and grader.

    .venv/bin/python benchmarks/desktop/bench_agents.py [--desktops 2] [--out results/agents.json]

A scripted OpenAI-compatible server plays each task's scripted solution through
the tool of its action space (the model's side costs nothing), so the figures
are the infrastructure's: success rate (must equal the scripted solutions'
rate: 1.0 on the shipped tasks), steps per minute excluding model time, and the
bytes of images sent per step.
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
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._policy import DesktopPolicy, solution_moves
from agentinfra.harness import GraderSettings, RunDirectory, agent_run_spec, run_agents

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "desktop" / "tasks"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--desktops", type=int, default=2)
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
                task.id, task.path, config, GraderSettings(), environment="desktop", options=options
            )
            runs.append(
                RunDirectory.create(Path(folder) / task.id, spec, grader_version="desktop-1")
            )
        started = time.monotonic()
        states = asyncio.run(run_agents(runs, api_key="test-key", concurrency=len(runs),
                                        limiter=EndpointLimiter(max_in_flight=len(runs))))  # fmt: skip
        wall = time.monotonic() - started
        passed, steps = 0, 0
        for run in runs:
            finals = [json.loads(p.read_text()) for p in (run.path / "evaluations").rglob("*.json")]
            passed += any(f["outcome"] == "passed" for f in finals)
            steps += sum(
                1 for _ in (run.path / "agent" / "workspace" / "episode" / "actions.jsonl").open()
            )
            run.close()
        image_bytes = [len(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))
                       for r in server.requests for m in r["messages"][-1:] if isinstance(m.get("content"), list)
                       for p in m["content"] if p.get("type") == "image_url"]  # fmt: skip
    report = {
        "tasks": len(tasks), "desktops": args.desktops, "success_rate": passed / len(tasks),
        "stopped_normally": sum(1 for s in states if not s.error), "wall_s": round(wall, 1), "steps": steps,
        "steps_per_minute": round(steps / (wall / 60), 1),
        "image_bytes_per_step": {"median": statistics.median(image_bytes), "max": max(image_bytes)},
        "violations": policy.violations,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
