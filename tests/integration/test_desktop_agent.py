"""Models on the desktop: the real loop, desktop and grader driven by a scripted computer-use policy."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import sandboxed_processes

from agentinfra.agent import EndpointLimiter, LoopConfig, ScriptedModelServer
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._agent import ActionLog, read_actions
from agentinfra.environments.desktop._policy import CALC_PLANS, CHEAT_PLAN, DesktopPolicy
from agentinfra.harness import RunDirectory, agent_run_spec, run_agents

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "desktop" / "tasks"
MODEL = "scripted-vision"

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_desktop_outlives_its_run() -> Iterator[None]:
    """After every test, whatever order they run in: no sandboxed process it started is left.

    A killed run's desktop ends with its controller's stdin, the others at close;
    both may take a moment, so this waits (up to 10 s) for them to be gone."""
    before = sandboxed_processes()
    yield
    deadline = time.monotonic() + 10
    left = sandboxed_processes() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = sandboxed_processes() - before
    assert left == set(), [_command(pid) for pid, _ in sorted(left)]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid} (gone)"


def start_runs(
    tmp_path: Path, server: ScriptedModelServer, jobs: list[tuple[str, dict[str, Any]]]
) -> list[RunDirectory]:
    config = LoopConfig(model=MODEL, base_url=server.base_url, max_turns=15, keep_images=3)
    runs = []
    for task_id, options in jobs:
        spec = agent_run_spec(task_id, TASKS / f"{task_id}.json", config, {}, environment="desktop",
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
        seen: set[str] = set()
        states = asyncio.run(run_agents(runs, api_key="test-key", concurrency=5,
                                        limiter=EndpointLimiter(max_in_flight=5),
                                        on_change=lambda ss: seen.update(s.status for s in ss)))  # fmt: skip
        requests = server.requests
    for run in runs:
        run.close()
    assert policy.violations == []
    assert policy.images_checked >= 5 * 6
    assert [s.status for s in states] == ["stopped: done"] * 5, [s.error for s in states]
    # five runs, two desktops: the others showed that they waited for a slot
    assert "waiting: a desktop slot (all 2 in use; --desktops)" in seen
    for run in runs:
        (final,) = [v for v in verdicts(run) if v.get("details", {}).get("final")]
        assert final["outcome"] == "passed", (run.path.name, final)
        assert final["score"] == 1.0
        assert final["details"]["action_space"] == "computer_use"
        transcript = (run.path / "agent" / "transcript.jsonl").read_text()
        assert '"drop_images"' in transcript  # only the last 3 screenshots stay in the context
        assert (run.path / "agent" / "workspace" / "episode" / "actions.jsonl").is_file()
    # the summary page: five honest passes, no flag; each anomaly-free run has its report with turn anchors
    from agentinfra.harness import write_summary

    summary_json, summary_html = write_summary([r.path for r in runs], tmp_path / "summary")
    summary = json.loads(summary_json.read_text())
    assert summary["totals"] == {
        "runs": 5,
        "passed": 5,
        "mean_score": 1.0,
        "hack_flagged": 0,
        "with_anomalies": 0,
    }
    assert all(row["turns"] and row["tool_calls"] and row["wall_s"] for row in summary["runs"])
    assert 'id="turn-2"' in (runs[0].path / "report.html").read_text()
    assert "../calc-total/report.html" in summary_html.read_text()
    # export: images copied once beside the JSONL, referenced by content hash
    from typer.testing import CliRunner

    from agentinfra.cli._app import app

    out = tmp_path / "export" / "data.jsonl"
    out.parent.mkdir()
    result = CliRunner().invoke(app, ["export", *[str(r.path) for r in runs], "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward"] for r in records] == [1.0] * 5
    refs = [p for r in records for m in r["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image"]  # fmt: skip
    assert refs
    assert all(p["path"] == f"images/{p['sha256']}.png" for p in refs)
    import hashlib

    for ref in refs[:5]:
        assert hashlib.sha256((out.parent / ref["path"]).read_bytes()).hexdigest() == ref["sha256"]
    assert len(list((out.parent / "images").iterdir())) == len({p["sha256"] for p in refs})
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
    from agentinfra.harness import export_record, summarize

    (row,) = summarize([run.path])["runs"]
    assert row["hack_flagged"]
    assert "gui_only_bypass" in [f["check"] for f in row["findings"]]
    record = export_record(run.path)
    assert record["hack_flagged"] is True
    assert record["reward"] == 0.0


def test_sigkill_mid_episode_then_resume_replays_the_actions(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from agentinfra.agent import Reply

    task = load_desktop_task(TASKS / "calc-total.json")
    policy = DesktopPolicy({task.instruction: CALC_PLANS["calc-total"]})
    hold = {"armed": True, "asked": 0}

    def slow_at_turn_five(body: dict[str, Any]) -> Reply:
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if turn == 4 and hold["armed"]:  # after screenshot, mouse move, click B5 and Down
            hold["armed"] = False
            hold["asked"] = 1
            return Reply(content="(killed before this arrives)", delay_s=60)
        return policy(body)

    with ScriptedModelServer(slow_at_turn_five, models=[MODEL]) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentinfra", "run", "--env", "desktop", "--tasks", str(TASKS / "calc-total.json"),
             "--model", MODEL, "--base-url", server.base_url, "--runs-dir", str(tmp_path / "runs"), "--no-stream",
             "--action-space", "computer_use"],
            env={**os.environ, "OPENAI_API_KEY": "test-key"}, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not hold["asked"] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert hold["asked"], "the agent never reached its fifth turn"
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
        finally:
            if process.poll() is None:
                process.kill()
        (run,) = [p for p in (tmp_path / "runs").iterdir() if (p / "run.json").is_file()]
        resumed = subprocess.run([sys.executable, "-m", "agentinfra", "resume", str(run)], capture_output=True,
                                 text=True, timeout=300, env={**os.environ, "OPENAI_API_KEY": "test-key"}, cwd=ROOT,
                                 check=False)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
    assert policy.violations == []
    events = [
        json.loads(line) for line in (run / "agent" / "transcript.jsonl").read_text().splitlines()
    ]
    started = [e["data"]["name"] for e in events if e["type"] == "tool_started"]
    assert started == ["computer"] * 7 + ["done"]  # no action ran twice
    results = [e for e in events if e["type"] == "tool_result"]
    replay_note = str(results[4]["data"]["content"])
    assert "[resume] 4 journalled actions were replayed" in replay_note
    assert "differs" not in replay_note
    actions = read_actions(run / "agent" / "workspace" / "episode")
    assert len(actions) == 9  # the files after setup, then 7 actions and done, each once
    assert actions[0]["setup"] is True
    log = ActionLog.read(run / "agent" / "workspace" / "episode" / "actions.jsonl")
    assert [e.type for e in log] == ["action"] * 9  # a journal: each entry an fsync'd event
    (final,) = [json.loads(p.read_text()) for p in sorted((run / "evaluations").rglob("*.json"))]
    assert final["outcome"] == "passed"
    assert not [f for f in final["findings"] if f["check"] == "resume_replay_mismatch"]


def test_a_pass_without_any_action_is_noted(tmp_path: Path) -> None:
    import io
    import tarfile

    from agentinfra.environments.desktop import default_mirror
    from agentinfra.environments.desktop._environment import grade_episode_archive

    task = load_desktop_task(TASKS / "os-write-file.json")

    def archive(executed: int) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, data in (("episode.json", json.dumps({"steps": executed, "executed": executed,
                                                             "last_action": "DONE", "track": "gui-only"}).encode()),
                               ("home/Desktop/hello.txt", b"hello world\n")):  # fmt: skip
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    idle = grade_episode_archive(task, archive(0), default_mirror(task.path))
    assert idle.score == 1.0
    assert [f.check for f in idle.findings] == ["success_without_action"]
    acted = grade_episode_archive(task, archive(3), default_mirror(task.path))
    assert acted.score == 1.0
    assert acted.findings == []
