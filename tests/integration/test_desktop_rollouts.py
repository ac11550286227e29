"""Desktop rollouts: every one ends in one trusted verdict, and a real model's tokens are the engine's.

The scripted model (`ScriptedModelServer`, real HTTP) and the real desktop, loop and grader:
a model that only writes prose, and one that does the task's solution but never calls
done, each get their episode frozen and graded as it stands when the agent stops; a
cancelled rollout is not graded, and its desktop is killed and its home removed.

With real vLLM serving SmolLM2-135M-Instruct behind the recording proxy of
``test_rollout_tokens``, ``agentinfra rollouts run --env desktop`` with the
accessibility-table observation gives trajectories whose every call carries the engine's
ids, whose segments and masks are right by construction, and which each end in one
final verdict.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import sandboxed_processes
from test_rollout_tokens import RecordingProxy, _forward, check_segments_by_construction, vllm

from agentinfra._settings import load_settings
from agentinfra.agent import EndpointLimiter, ScriptedModelServer
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._agent import ActionLog
from agentinfra.environments.desktop._policy import DesktopPolicy, solution_moves
from agentinfra.rollouts import GroupRequest, new_group, run_rollout

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "desktop" / "tasks"
MODEL = "scripted-desktop"
ENV = {**os.environ, "OPENAI_API_KEY": "test-key", "PYTHONUNBUFFERED": "1"}
REAL_TASKS = ("os-mkdir", "os-write-file")
"""The real-model episodes (G=2 each): terminal tasks, whose setup is quick."""

pytestmark = pytest.mark.slow
__all__ = ["vllm"]  # the module-scoped vLLM fixture, shared with test_rollout_tokens


@pytest.fixture(autouse=True)
def no_desktop_outlives_its_rollout() -> Iterator[None]:
    before = sandboxed_processes()
    yield
    deadline = time.monotonic() + 10
    left = sandboxed_processes() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = sandboxed_processes() - before
    assert left == set()


def final_verdicts(runs: Path, run_id: str) -> list[dict[str, Any]]:
    """The verdicts of run ``run_id``'s final submissions (the episode's end), from its evaluations."""
    (run,) = [p for p in runs.rglob(run_id) if (p / "run.json").is_file()]
    verdicts = [json.loads(p.read_text()) for p in sorted((run / "evaluations").rglob("*.json"))]
    return [v for v in verdicts if v.get("details", {}).get("final")]


def rollouts_run(
    base_url: str, model: str, out: Path, tasks: list[str], *extra: str
) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "agentinfra", "rollouts", "run", "--env", "desktop",
         *[a for t in tasks for a in ("--tasks", str(TASKS / f"{t}.json"))], "--model", model,
         "--base-url", base_url, "--runs-dir", str(out.parent / "runs"), "--out", str(out), *extra],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=ENV, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_model_that_never_ends_the_episode_gets_one_verdict(tmp_path: Path) -> None:
    """Prose only: the untouched desktop is graded (0). The solution without done: graded (1)."""
    mkdir = load_desktop_task(TASKS / "os-mkdir.json")
    assert mkdir.solution() is not None
    moves = solution_moves(mkdir.solution())
    assert moves[-1].tool == "done"
    assert moves[1].args == {"action_type": "WAIT"}
    # a WAIT first: the setup's xterm may not have its window yet at the first observation (CI once
    # typed the mkdir into no window: the same accessibility hash before and after, no directory)
    plan = [moves[1], *moves[:-1]]
    policy = DesktopPolicy({mkdir.instruction: plan})  # os-write-file: no plan, prose only
    with ScriptedModelServer(policy, models=[MODEL]) as server:
        trajectories = rollouts_run(
            server.base_url, MODEL, tmp_path / "out.jsonl", ["os-mkdir", "os-write-file"],
            "--group-size", "1", "--max-turns", "10", "--env-option", "action_space=computer_13",
            "--env-option", "observation=a11y",
        )  # fmt: skip
    by_task = {t["task"]: t for t in trajectories}
    assert sorted(by_task) == ["os-mkdir.json", "os-write-file.json"]
    for task, score in (("os-mkdir.json", 1.0), ("os-write-file.json", 0.0)):
        trajectory = by_task[task]
        assert trajectory["infra_failure"] is None, trajectory["infra_failure"]
        (final,) = final_verdicts(tmp_path / "runs", trajectory["run_id"])
        assert final["score"] == score, (task, final)
        assert final["outcome"] == ("passed" if score else "failed")
        assert final["details"]["last_action"] is None
        assert "episode_not_ended" in [f["check"] for f in final["findings"]]
        assert trajectory["reward"] == score
        assert [r["score"] for r in trajectory["turn_rewards"]] == [score]
    assert by_task["os-write-file.json"]["stop_reason"] == "no_action"
    assert policy.violations == []


def test_a_cancelled_rollout_is_not_graded_and_its_desktop_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentinfra.agent import Reply
    from agentinfra.environments.desktop import _agent
    from agentinfra.environments.desktop._session import DesktopSession, uid_processes

    sessions: list[DesktopSession] = []
    alive: set[tuple[int, int]] = set()

    class Recorded(DesktopSession):  # this test's desktops, whatever else runs on the machine
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            sessions.append(self)

    monkeypatch.setattr(_agent, "DesktopSession", Recorded)
    mkdir = load_desktop_task(TASKS / "os-mkdir.json")
    assert mkdir.solution() is not None
    policy = DesktopPolicy({mkdir.instruction: solution_moves(mkdir.solution())})

    def one_action_then_slow(body: dict[str, Any]) -> Reply:
        if any(m["role"] == "assistant" for m in body["messages"]):
            return Reply(content="(cancelled before this arrives)", delay_s=60)
        return policy(body)

    async def cancel_once_acting(base_url: str) -> dict[str, Any]:
        request = GroupRequest(environment="desktop", task=str(TASKS / "os-mkdir.json"), group_size=1,
                               model=MODEL, base_url=base_url, max_turns=10,
                               options={"action_space": "computer_13", "observation": "a11y"})  # fmt: skip
        group = new_group(request)
        (rollout_id,) = group.rollout_ids
        task = asyncio.create_task(run_rollout(
            tmp_path / "runs", group, rollout_id, settings=load_settings(), api_key="test-key",
            limiter=EndpointLimiter(), cancel_reason=lambda: "stale policy",
        ))  # fmt: skip
        actions = (
            tmp_path / "runs" / rollout_id / "agent" / "workspace" / "episode" / ActionLog.FILE
        )
        deadline = time.monotonic() + 120
        while len(_lines(actions)) < 2 and time.monotonic() < deadline:  # setup, then the action
            await asyncio.sleep(0.1)
        assert len(_lines(actions)) >= 2, "the rollout never acted"
        (session,) = sessions
        await asyncio.sleep(1)
        alive.update(p.key for p in uid_processes(session.uid))
        assert alive  # the desktop runs while the model thinks
        task.cancel()
        return await task

    with ScriptedModelServer(one_action_then_slow, models=[MODEL]) as server:
        trajectory = asyncio.run(cancel_once_acting(server.base_url))
    assert trajectory["infra_failure"] == {"kind": "cancelled", "message": "stale policy"}
    assert final_verdicts(tmp_path / "runs", trajectory["run_id"]) == []  # not graded
    (session,) = sessions
    assert session.closed
    assert [p for p in uid_processes(session.uid) if p.key in alive] == []  # the desktop was killed
    assert not session.workspace.exists()  # and its home removed


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def match_engine_calls(trajectories: list[dict[str, Any]], engine: list[dict[str, Any]]) -> int:
    """Pairs every recorded call of ``trajectories`` (the G rollouts of one task, whose prompts the
    proxy cannot tell apart) with one engine response that has exactly its ids, logprobs and finish,
    each response used once and none left over; returns the number of calls."""
    left = list(engine)
    for trajectory in trajectories:
        assert trajectory["tokens"] == "exact"
        for call in trajectory["calls"]:
            same = [e for e in left if (e["prompt_ids"], e["completion_ids"], e["logprobs"], e["finish_reason"])
                    == (call["prompt_ids"], call["completion_ids"], call["completion_logprobs"],
                        call["finish_reason"])]  # fmt: skip
            assert same, (
                f"call {call['turn']} of {trajectory['run_id']} is not what the engine returned"
            )
            left.remove(same[0])
            assert same[0]["request"]["return_token_ids"] is True
        check_segments_by_construction(trajectory)
    assert left == [], f"{len(left)} engine responses are in no trajectory"
    return len(engine)


@pytest.mark.vllm
def test_real_model_desktop_rollouts_are_token_exact(vllm: str, tmp_path: Path) -> None:
    from agentinfra.engines import SMOLLM2_NAME

    with RecordingProxy(vllm) as proxy:
        trajectories = rollouts_run(
            proxy.base_url, SMOLLM2_NAME, tmp_path / "out.jsonl", list(REAL_TASKS), "--group-size", "2",
            "--max-turns", "3", "--nudges", "2", "--max-output-tokens", "48", "--context-tokens", "8192",
            "--concurrency", "4", "--env-option", "observation=a11y", "--env-option", "a11y_tokens=1500",
        )  # fmt: skip
        assert len(trajectories) == 2 * len(REAL_TASKS)
        calls = 0
        for task in REAL_TASKS:
            group = [t for t in trajectories if t["task"] == f"{task}.json"]
            assert len(group) == 2
            assert len({t["group_id"] for t in group}) == 1
            calls += match_engine_calls(
                group, proxy.engine_calls(group[0]["messages"][1]["content"])
            )
    for trajectory in trajectories:
        assert trajectory["infra_failure"] is None, trajectory["infra_failure"]
        (final,) = final_verdicts(tmp_path / "runs", trajectory["run_id"])
        assert trajectory["reward"] == (final["score"] if final["outcome"] == "passed" else 0.0)
    print(f"desktop token exactness: {len(trajectories)} rollouts, {calls} calls equal to the engine's; "
          f"segments per rollout {[len(t['segments']) for t in trajectories]}")  # fmt: skip


class ForcingProxy:
    """A loopback HTTP/1.1 proxy that constrains every chat completion (vLLM's structured outputs,
    a one-string ``choice``) to the Hermes text of one ``computer`` call with the screenshot action,
    so that a random-weight model still acts and its context gets screenshots. The engine still
    samples every token (under the constraint) and its tool parser still reads the call: the
    ids are the engine's."""

    CALL = '<tool_call>\n{"name": "computer", "arguments": {"action": "screenshot"}}\n</tool_call>'

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.forced = 0
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _rewrite(self, body: bytes) -> bytes:
        request = json.loads(body)
        if "tools" not in request:  # the token probe
            return body
        request["structured_outputs"] = {"choice": [self.CALL]}
        self.forced += 1
        return json.dumps(request).encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ", 2)
                headers = {k.lower(): v for k, _, v in (h.partition(": ") for h in head[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if path.endswith("/chat/completions"):
                    body = self._rewrite(body)
                request = urllib.request.Request(self.upstream + path.removeprefix("/v1"), data=body or None,
                                                 headers={"content-type": "application/json"}, method=method)  # fmt: skip
                status, kind, content = await asyncio.to_thread(_forward, request)
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {len(content)}"
                             "\r\n\r\n".encode() + content)  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """A random-weight LLaVA built offline (`scripts/build_tiny_vlm.py`), served by vLLM."""
    from agentinfra.engines import VllmServer, smollm2_dir, vllm_python

    tokenizer = smollm2_dir(check=False)
    if not tokenizer.is_dir():
        pytest.skip(f"{tokenizer} missing: run `make smollm2` (its tokenizer is the VLM's)")
    folder = tmp_path_factory.mktemp("vlm")
    built = subprocess.run([str(vllm_python()), str(ROOT / "scripts/build_tiny_vlm.py"), str(folder / "model"),
                            "--tokenizer-from", str(tokenizer)], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    model = folder / "model"
    info = json.loads((model / "agentinfra-model.json").read_text())
    extra = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template",
             str(model / "chat_template.jinja"), "--limit-mm-per-prompt", '{"image": 8}')  # fmt: skip
    with VllmServer(model, log=folder / "vllm.log", served_name="tiny-vlm", tools=None, extra_args=extra,
                    max_num_batched_tokens=8192) as server:  # fmt: skip
        yield server.base_url, info


@pytest.mark.vllm
def test_a_screenshot_episode_through_a_random_weight_vlm(
    tiny_vlm: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    base_url, info = tiny_vlm
    image_id = info["image_token_id"]
    with RecordingProxy(base_url) as recording:
        forcing = ForcingProxy(recording.base_url)
        (trajectory,) = rollouts_run(
            forcing.base_url, "tiny-vlm", tmp_path / "out.jsonl", ["os-mkdir"], "--group-size", "1",
            "--max-turns", "3", "--max-output-tokens", "64", "--context-tokens", "8192", "--tokens",
            "--env-option", "observation=screenshot", "--env-option", "screenshot_width=320",
        )  # fmt: skip
        engine = recording.engine_calls(trajectory["messages"][1]["content"])
    assert trajectory["infra_failure"] is None, trajectory["infra_failure"]
    assert forcing.forced == len(trajectory["calls"]) == 3
    assert match_engine_calls([trajectory], engine) == 3
    sent_images = [sum(1 for m in c["request"]["messages"] if isinstance(m.get("content"), list)
                       for p in m["content"] if p.get("type") == "image_url") for c in engine]  # fmt: skip
    assert sent_images == [0, 1, 2]  # a screenshot after each forced action
    for call, images in zip(trajectory["calls"], sent_images, strict=True):
        assert call["prompt_ids"].count(image_id) == images * info["image_tokens_per_image"]
        assert image_id not in call["completion_ids"]
    placeholders = 0
    for segment in trajectory["segments"]:
        at = [i for i, token in enumerate(segment["token_ids"]) if token == image_id]
        assert all(segment["loss_mask"][i] == 0 for i in at)
        assert all(segment["logprobs"][i] is None for i in at)
        placeholders += len(at)
    assert placeholders >= 2 * info["image_tokens_per_image"]
    (final,) = final_verdicts(tmp_path / "runs", trajectory["run_id"])
    assert final["score"] == 0.0  # a screenshot makes no folder
    print(
        f"tiny VLM: {len(trajectory['calls'])} calls equal to the engine's, images {sent_images}, "
        f"{placeholders} placeholder tokens in segments (mask 0), breaks "
        f"{[s['break_reason'] for s in trajectory['segments'][1:]]}"
    )
