"""The OpenEnv server (`agentinfra.trainers.openenv`) driven by OpenEnv's own client, both from ``.venv/openenv``.

One server subprocess on loopback, two concurrent WebSocket sessions on kernels tasks:
an honest kernel is graded in the grader's jails and earns a positive reward, a cheat
earns 0 and the hack flag; a third session past ``--max-sessions`` is refused with a
message naming the knob; a task outside the task folder is refused; closed sessions leave
no workspace, and stopping the server leaves none of its processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from services import free_port

ROOT = Path(__file__).resolve().parents[2]
OPENENV_PY = ROOT / ".venv" / "openenv" / "bin" / "python"
PROBLEMS = ROOT / "examples" / "kernels" / "problems"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not OPENENV_PY.exists(), reason=f"{OPENENV_PY} missing: run `make openenv-venv`"
    ),
]

# Runs in .venv/openenv: OpenEnv's EnvClient, typed for the server (KernelEnvClient).
CLIENT = r"""
import asyncio, json, sys, time
from agentinfra.trainers.openenv import KernelAction, KernelEnvClient

URL, HONEST, CHEAT = sys.argv[1], open(sys.argv[2]).read(), open(sys.argv[3]).read()

async def episode(task, code, opened):
    async with KernelEnvClient(base_url=URL, message_timeout_s=400) as env:
        first = await env.reset(task=task)
        opened.set()
        started = time.monotonic()
        result = await env.step(KernelAction(code=code, final=True))
        state = await env.state()
        return {"problem": first.observation.problem, "steps_left": first.observation.steps_left,
                "reward": result.reward, "done": result.done, "outcome": result.observation.outcome,
                "correct": result.observation.correct, "speedup": result.observation.speedup,
                "message": result.observation.message, "state": state.model_dump(),
                "started": started, "ended": time.monotonic()}

async def refused(**reset):
    try:
        async with KernelEnvClient(base_url=URL) as env:
            await env.reset(**reset)
    except Exception as exc:
        return str(exc)
    return None

async def capacity_refusal():
    # OpenEnv's client may see only the close that follows the refusal (its send races it), so
    # the refusal is read off the socket as the server sends it.
    from websockets.asyncio.client import connect
    async with connect(URL.replace("http://", "ws://") + "/ws") as ws:
        return json.loads(await ws.recv())["data"]["message"]

async def main():
    opened = [asyncio.Event(), asyncio.Event()]
    honest = asyncio.create_task(episode("11_slow_cumsum.py", HONEST, opened[0]))
    cheat = asyncio.create_task(episode("10_slow_rowwise_softmax.py", CHEAT, opened[1]))
    await asyncio.gather(*(e.wait() for e in opened))
    third = await capacity_refusal()
    results = await asyncio.gather(honest, cheat)
    escape = await refused(task="../problems/11_slow_cumsum.py")
    print(json.dumps({"honest": results[0], "cheat": results[1], "third": third, "escape": escape}))

asyncio.run(main())
"""


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_healthy(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"server exited {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"server not healthy in 60 s:\n{log.read_text()[-3000:]}")


def test_two_concurrent_openenv_sessions_grade_an_honest_kernel_and_flag_a_cheat(
    tmp_path: Path,
) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("11_slow_cumsum.py", "10_slow_rowwise_softmax.py"):
        shutil.copy(PROBLEMS / name, tasks / name)
    workspaces = tmp_path / "sessions"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(OPENENV_PY), "-m", "agentinfra.trainers.openenv", "--tasks", str(tasks),
             "--port", str(port), "--max-sessions", "2", "--max-steps", "3", "--root", str(workspaces)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_healthy(url, server, log)
        started = time.monotonic()
        client = subprocess.run(
            [str(OPENENV_PY), "-c", CLIENT, url,
             str(ROOT / "examples/kernels/submissions/11_fast_cumsum.py"),
             str(ROOT / "tests/fixtures/kernels/cheats/call_counting.py")],
            env=env, capture_output=True, text=True, timeout=500,
        )  # fmt: skip
        sessions_s = time.monotonic() - started
        assert client.returncode == 0, client.stderr[-3000:] + log.read_text()[-3000:]
        result = json.loads(client.stdout.strip().splitlines()[-1])
        children = _descendants(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            pytest.fail(f"server did not stop in 60 s on SIGTERM:\n{log.read_text()[-3000:]}")
    honest, cheat = result["honest"], result["cheat"]
    print(f"openenv sessions: {sessions_s:.1f} s; server log {log}; client's result:")
    print(json.dumps(result, indent=1))  # shown when an assertion below fails
    assert "class Model" in honest["problem"]
    assert honest["steps_left"] == 3
    assert (honest["outcome"], honest["correct"], honest["done"]) == ("passed", True, True)
    assert honest["reward"] == honest["speedup"]
    assert honest["reward"] > 1.0
    assert (cheat["outcome"], cheat["reward"], cheat["done"]) == ("hack_flagged", 0.0, True)
    # what the agent sees of the grading: no findings, evidence, seeds or timings
    assert re.fullmatch(
        r"submission [0-9a-f]{12}: outcome=hack_flagged correct=(True|False) speedup=\S+; episode over",
        cheat["message"],
    ), cheat["message"]
    assert cheat["state"]["done"] is True
    assert cheat["state"]["step_count"] == 1
    # both sessions were open at once, their gradings in flight together
    assert max(honest["started"], cheat["started"]) < min(honest["ended"], cheat["ended"])
    assert result["third"] is not None
    assert "at capacity: 2/2" in result["third"]
    assert "--max-sessions" in result["third"]
    assert result["escape"] is not None
    assert "is not a file in" in result["escape"]
    assert "--tasks" in result["escape"]
    assert list(workspaces.iterdir()) == []  # every closed session removed its workspace
    assert server.returncode == 0, log.read_text()[-3000:]
    assert children  # the grader's fork server and workers ran under the server...
    assert not [pid for pid in children if _alive(pid)]  # ...and none outlived it


DESKTOP_PY = ROOT / ".venv" / "desktop" / "bin" / "python"

# Runs in .venv/openenv: one desktop episode through OpenEnv's client, typed for tool sessions.
DESKTOP_CLIENT = r"""
import asyncio, base64, json, sys
from agentinfra.trainers.openenv import ToolAction, ToolEnvClient

MOVES = [("computer", {"action": "screenshot"}), ("computer", {"action": "key", "text": "ctrl+a"}),
         ("computer", {"action": "type", "text": "nothing left to do\n"}),
         ("computer", {"action": "key", "text": "ctrl+s"}), ("computer", {"action": "wait", "duration": 2}),
         ("done", {})]

async def main():
    async with ToolEnvClient(base_url=sys.argv[1], message_timeout_s=400) as env:
        first = await env.reset(task="editor-replace.json")
        steps = []
        for tool, arguments in MOVES:
            result = await env.step(ToolAction(tool=tool, arguments=arguments))
            pngs = [base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in result.observation.images]
            steps.append({"reward": result.reward, "done": result.done, "pngs": pngs, "text": result.observation.text})
    print(json.dumps({"prompt": first.observation.text,
                      "tools": [t["function"]["name"] for t in first.observation.tools], "steps": steps}))

asyncio.run(main())
"""


@pytest.mark.skipif(
    not DESKTOP_PY.exists(), reason=f"{DESKTOP_PY} missing: run `make desktop-venv`"
)
@pytest.mark.skipif(os.geteuid() != 0, reason="the desktop's jails need root")
def test_a_desktop_episode_over_openenv_is_rewarded_only_at_its_end(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "AGENTINFRA_DESKTOP_PYTHON": str(DESKTOP_PY),
    }
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(OPENENV_PY), "-m", "agentinfra.trainers.openenv", "--env", "desktop",
             "--tasks", str(ROOT / "examples/desktop/tasks"), "--port", str(port),
             "--root", str(tmp_path / "sessions")],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_healthy(url, server, log)
        client = subprocess.run([str(OPENENV_PY), "-c", DESKTOP_CLIENT, url], env=env,
                                capture_output=True, text=True, timeout=500)  # fmt: skip
        assert client.returncode == 0, client.stderr[-3000:] + log.read_text()[-3000:]
        result = json.loads(client.stdout.strip().splitlines()[-1])
        children = _descendants(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    print(json.dumps(result, indent=1))
    assert "nothing left to do" in result["prompt"]
    assert result["tools"] == ["computer", "submit", "done", "fail"]
    *acting, last = result["steps"]
    assert [(s["reward"], s["done"], s["pngs"]) for s in acting] == [(0.0, False, [True])] * 5
    assert (last["reward"], last["done"]) == (1.0, True)
    assert "outcome=passed" in last["text"]
    assert list((tmp_path / "sessions").iterdir()) == []
    assert server.returncode == 0, log.read_text()[-3000:]
    assert not [pid for pid in children if _alive(pid)]
