"""Models on the desktop: the real loop, desktop and grader driven by a scripted computer-use policy."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import EndpointLimiter, LoopConfig, ScriptedModelServer
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._policy import CALC_PLANS, CHEAT_PLAN, DesktopPolicy
from agentinfra.harness import GraderSettings, RunDirectory, agent_run_spec, run_agents

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "desktop" / "tasks"
MODEL = "scripted-vision"

pytestmark = pytest.mark.slow


def start_runs(
    tmp_path: Path, server: ScriptedModelServer, jobs: list[tuple[str, dict[str, Any]]]
) -> list[RunDirectory]:
    config = LoopConfig(model=MODEL, base_url=server.base_url, max_turns=15, keep_images=3)
    runs = []
    for task_id, options in jobs:
        spec = agent_run_spec(task_id, TASKS / f"{task_id}.json", config, GraderSettings(), environment="desktop",
                              options=options)  # fmt: skip
        runs.append(RunDirectory.create(tmp_path / task_id, spec, grader_version="desktop-1"))
    return runs


def verdicts(run: RunDirectory) -> list[dict[str, Any]]:
    found = []
    for path in sorted((run.path / "evaluations").rglob("*.json")):
        found.append(json.loads(path.read_text()))
    return found


def test_scripted_model_solves_five_calc_tasks_through_the_loop(tmp_path: Path) -> None:
    plans = {
        load_desktop_task(TASKS / f"{t}.json").instruction: plan for t, plan in CALC_PLANS.items()
    }
    policy = DesktopPolicy(plans)
    with ScriptedModelServer(policy, models=[MODEL]) as server:
        runs = start_runs(
            tmp_path,
            server,
            [(t, {"action_space": "computer_use", "desktops": 2}) for t in CALC_PLANS],
        )
        states = asyncio.run(run_agents(runs, api_key="test-key", concurrency=5,
                                        limiter=EndpointLimiter(max_in_flight=5)))  # fmt: skip
        requests = server.requests
    for run in runs:
        run.close()
    assert policy.violations == []
    assert policy.images_checked >= 5 * 6
    assert [s.status for s in states] == ["stopped: done"] * 5, [s.error for s in states]
    for run in runs:
        (final,) = [v for v in verdicts(run) if v.get("details", {}).get("final")]
        assert final["outcome"] == "passed", (run.path.name, final)
        assert final["score"] == 1.0
        assert final["details"]["action_space"] == "computer_use"
        transcript = (run.path / "agent" / "transcript.jsonl").read_text()
        assert '"drop_images"' in transcript  # only the last 3 screenshots stay in the context
        assert (run.path / "agent" / "workspace" / "episode" / "actions.jsonl").is_file()
    # the model saw at most 3 screenshots per request, each an image_url part
    assert max(sum(1 for m in r["messages"] if isinstance(m.get("content"), list)
                   for p in m["content"] if p.get("type") == "image_url") for r in requests) == 3  # fmt: skip
    assert [t["function"]["name"] for t in requests[0]["tools"]] == [
        "computer",
        "submit",
        "done",
        "fail",
    ]


def test_gui_only_cheat_is_refused_and_flagged(tmp_path: Path) -> None:
    policy = DesktopPolicy(
        {load_desktop_task(TASKS / "os-write-file.json").instruction: CHEAT_PLAN}
    )
    with ScriptedModelServer(policy, models=[MODEL]) as server:
        (run,) = start_runs(tmp_path, server, [("os-write-file", {"action_space": "pyautogui",
                                                                   "observation": "screenshot"})])  # fmt: skip
        (state,) = asyncio.run(
            run_agents([run], api_key="test-key", concurrency=1, limiter=EndpointLimiter())
        )
        requests = server.requests
    run.close()
    assert state.status == "stopped: done"
    (final,) = verdicts(run)
    assert final["outcome"] == "hack_flagged"
    assert [f["check"] for f in final["findings"]][-1] == "gui_only_bypass"
    refused = [
        m
        for m in requests[-1]["messages"]
        if m.get("role") == "tool" and "gui-only track" in str(m["content"])
    ]
    assert refused  # the refusal went back to the model as the tool's error
