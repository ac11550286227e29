"""The episode's end on a real desktop: freeze first, one verdict whatever the episode did.

Our own small tasks in OSWorld's format, written by each test; the grader is the real one.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from agentinfra.environments import Outcome
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._episode import EpisodeResult, run_episode
from agentinfra.environments.desktop._grading import grade_episode
from agentinfra.environments.desktop._session import DesktopConfig, check_prerequisites
from agentinfra.errors import TaskEnvironmentError

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / "examples" / "desktop" / "mirror"
HELLO = "https://files.agentinfra.example/desktop/hello.txt"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _desktop_available() -> None:
    try:
        check_prerequisites()
    except TaskEnvironmentError as exc:
        pytest.fail(str(exc))


def _task(tmp_path: Path, *, config: list[Any] | None = None, postconfig: list[Any] | None = None,
          infeasible: bool = False) -> Any:  # fmt: skip
    evaluator: dict[str, Any] = (
        {"func": "infeasible"}
        if infeasible
        else {
            "func": "compare_text_file",
            "result": {
                "type": "vm_file",
                "path": "/home/user/Desktop/hello.txt",
                "dest": "hello.txt",
            },
            "expected": {"type": "cloud_file", "path": HELLO, "dest": "hello.txt"},
        }
    )
    if postconfig:
        evaluator["postconfig"] = postconfig
    document = {"id": f"freeze-{tmp_path.name}"[:60], "snapshot": "os", "source": "agentinfra-test",
                "instruction": "Create ~/Desktop/hello.txt containing: hello world",
                "config": config or [], "evaluator": evaluator}  # fmt: skip
    path = tmp_path / "task.json"
    path.write_text(json.dumps(document))
    return load_desktop_task(path)


def _play(task: Any, actions: list[Any], tmp_path: Path, *, track: str = "code",
          space: str = "pyautogui", config: DesktopConfig | None = None) -> tuple[EpisodeResult, Any]:  # fmt: skip
    episode = asyncio.run(run_episode(task, actions, action_space=space, track=track,
                                      episode_dir=tmp_path / "episode", mirror=MIRROR, config=config,
                                      accessibility=False))  # fmt: skip
    return episode, grade_episode(task, episode, MIRROR)


_LATE_WRITES = (
    "import subprocess, threading, time, ctypes, os\n"
    # a process that writes the answer 2 s after DONE, while postconfig runs
    "subprocess.Popen(['sh', '-c', 'sleep 2; echo hello world > ~/Desktop/hello.txt'], start_new_session=True)\n"
    # a thread left behind where the action ran (it used to be the controller, which postconfig thaws)
    "def late():\n"
    "    time.sleep(2)\n"
    "    open('/home/user/Desktop/hello.txt', 'w').write('hello world\\n')\n"
    "threading.Thread(target=late).start()\n"
    # the controller (pid 1) cannot be ptraced by the agent's code
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "result = libc.ptrace(16, 1, 0, 0)\n"
    "open('/home/user/ptrace.txt', 'w').write(f'{result} {ctypes.get_errno()}')\n"
)


def test_a_write_after_done_is_not_graded_while_postconfig_runs(tmp_path: Path) -> None:
    task = _task(tmp_path, postconfig=[{"type": "sleep", "parameters": {"seconds": 3}},
                                       {"type": "execute", "parameters": {"command": ["true"]}}])  # fmt: skip
    started = time.monotonic()
    episode, verdict = _play(task, [_LATE_WRITES, "DONE"], tmp_path)
    assert episode.crashed is None
    assert [f.check for f in episode.findings] == []
    assert verdict.outcome is Outcome.FAILED
    assert verdict.score == 0.0
    snapshot = tmp_path / "episode" / "snapshot"
    assert not (snapshot / "Desktop" / "hello.txt").exists()
    result, errno = (snapshot / "ptrace.txt").read_text().split()
    assert (result, errno) == ("-1", "1")  # EPERM: the controller is not dumpable
    # the facts: the processes alive at the freeze, read from the host's /proc
    processes = episode.facts["processes"]
    assert any(p["cmdline"][:2] == ["sh", "-c"] for p in processes)
    assert any(p["comm"] == "Xvfb" for p in processes)
    assert all(set(p) == {"pid", "comm", "cmdline"} for p in processes)
    time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))
    assert not (snapshot / "Desktop" / "hello.txt").exists()


def test_a_command_typed_into_a_setup_terminal_does_not_run_during_postconfig(
    tmp_path: Path,
) -> None:
    # gui-only: the agent types into the xterm the setup opened; its shell (a setup process) would run
    # the echo once the killed `sleep` is gone and postconfig thaws it: shells stay stopped
    xterm = {"type": "launch", "parameters": {"command": ["xterm", "-geometry", "100x30+50+50"]}}
    task = _task(tmp_path, config=[xterm, {"type": "sleep", "parameters": {"seconds": 1}}],
                 postconfig=[{"type": "sleep", "parameters": {"seconds": 2}}])  # fmt: skip
    typed = {"action_type": "TYPING",
             "parameters": {"text": "sleep 2; echo hello world > ~/Desktop/hello.txt\n"}}  # fmt: skip
    episode, verdict = _play(task, [typed, "DONE"], tmp_path, track="gui-only", space="computer_13")
    assert episode.findings == []
    assert verdict.score == 0.0
    assert not (tmp_path / "episode" / "snapshot" / "Desktop" / "hello.txt").exists()
    thaw = episode.facts["postconfig_thaw"]
    assert thaw["left_stopped"]  # the shell
    assert thaw["thawed"]  # the controller, Xvfb, xterm...
    # the same typing, waited for, does write it (what stopped it was the freeze)
    episode, verdict = _play(task, [typed, "WAIT", "WAIT", "DONE"], tmp_path / "waited", track="gui-only",
                             space="computer_13")  # fmt: skip
    assert verdict.score == 1.0


def test_a_long_sleep_on_gui_only_is_a_time_limit_finding_with_a_verdict(tmp_path: Path) -> None:
    task = _task(tmp_path)
    started = time.monotonic()
    episode, verdict = _play(task, ["time.sleep(3600)", "pyautogui.press('a')", "DONE"], tmp_path,
                             track="gui-only", config=DesktopConfig(action_time_limit_s=3))  # fmt: skip
    assert time.monotonic() - started < 60
    assert episode.crashed is None
    assert [f.check for f in episode.findings] == ["action_time_limit"]
    assert episode.steps == 1  # the episode ended there
    assert episode.last_action is None
    assert verdict.outcome is Outcome.FAILED  # graded as it stands, not crashed
    assert episode.snapshot is not None
    assert episode.snapshot.is_dir()


def test_actions_after_fail_are_refused_and_fail_does_not_count(tmp_path: Path) -> None:
    task = _task(tmp_path, infeasible=True)
    episode, verdict = _play(task, ["FAIL", "WAIT", {"action_type": "PRESS", "parameters": {"key": "a"}}],
                             tmp_path, space="computer_13")  # fmt: skip
    assert [f.check for f in episode.findings] == ["action_after_fail"]
    assert episode.last_action is None
    assert verdict.score == 0.0
    log = [
        json.loads(line)
        for line in (tmp_path / "episode" / "actions.jsonl").read_text().splitlines()
    ]
    assert [e.get("end") for e in log] == ["FAIL", None, None]
    assert all("not played" in e["error"] for e in log[1:])
    # FAIL as the last action still answers an infeasible task
    episode, verdict = _play(task, ["FAIL"], tmp_path / "last", space="computer_13")
    assert episode.findings == []
    assert verdict.score == 1.0


def test_a_failing_postconfig_step_is_a_finding_and_the_episode_is_graded(tmp_path: Path) -> None:
    task = _task(tmp_path, postconfig=[{"type": "execute", "parameters": {"command": ["sh", "-c", "exit 3"]}},
                                       {"type": "execute", "parameters": {"command": ["true"]}}])  # fmt: skip
    code = "open('/home/user/Desktop/hello.txt', 'w').write('hello world\\n')"
    episode, verdict = _play(task, [code, "DONE"], tmp_path)
    assert [(f.check, f.severity) for f in episode.findings] == [("postconfig_failed", "block")]
    assert "postconfig step 0 (execute)" in episode.findings[0].message
    assert "exited with 3" in episode.findings[0].message
    assert episode.snapshot is not None
    assert (episode.snapshot / "Desktop" / "hello.txt").read_text() == "hello world\n"
    assert verdict.outcome in (
        Outcome.PASSED,
        Outcome.FAILED,
    )  # one verdict (the grader blocks the pass)


def test_a_failing_setup_step_is_reported_with_what_failed(tmp_path: Path) -> None:
    task = _task(tmp_path, config=[{"type": "execute", "parameters": {
        "command": "echo password | sudo -S touch /tmp/x", "shell": True}}])  # fmt: skip
    episode, _ = _play(task, ["DONE"], tmp_path)
    assert episode.setup_error is not None
    assert episode.setup_error.startswith("setup step 0 (execute) failed:")
    assert "sudo" in episode.setup_error
    assert episode.steps == 0  # no action ran on a desktop whose setup failed
    assert episode.snapshot is not None


def test_the_agent_path_freezes_first_at_submit_and_at_done(tmp_path: Path) -> None:
    asyncio.run(_agent_path(tmp_path))


async def _agent_path(tmp_path: Path) -> None:
    import io
    import tarfile

    from agentinfra.environments import AgentHooks, Submission
    from agentinfra.environments.desktop._agent import DesktopAgent
    from agentinfra.environments.desktop._environment import grade_episode_archive
    from agentinfra.environments.desktop._options import DesktopAgentOptions

    task = _task(tmp_path, postconfig=[{"type": "sleep", "parameters": {"seconds": 6}}])
    late_writes = _LATE_WRITES.replace("sleep 2", "sleep 4").replace(
        "time.sleep(2)", "time.sleep(4)"
    )
    submitted: list[Submission] = []

    async def submit(submission: Submission) -> str:
        submitted.append(submission)
        return f"submission {len(submitted)}"

    async def results(_: float) -> str:
        return ""

    options = {"action_space": "pyautogui", "track": "code", "observation": "screenshot"}
    hooks = AgentHooks(submit=submit, results=results, options=options)
    agent = DesktopAgent(
        task, MIRROR, tmp_path / "run", hooks, DesktopAgentOptions.from_options(options)
    )
    try:
        await agent.act(late_writes)
        await agent.submit()  # mid-episode: frozen while copied, then the episode goes on
        await agent.end("DONE")  # before the writers' 4 s; postconfig then sleeps 6 s
    finally:
        await agent.close()

    def episode_json(submission: Submission) -> dict[str, Any]:
        with tarfile.open(fileobj=io.BytesIO(submission.data)) as archive:
            member = archive.extractfile("episode.json")
            assert member is not None
            return dict(json.load(member))

    middle, final = (episode_json(s) for s in submitted)
    assert any(p["cmdline"][:2] == ["sh", "-c"] for p in middle["facts"]["processes"])
    assert final["facts"]["processes"]
    assert final["last_action"] == "DONE"
    for submission in submitted:  # neither the shell nor the thread wrote into a graded state
        verdict = grade_episode_archive(task, submission.data, MIRROR)
        assert verdict.score == 0.0
        assert verdict.outcome is Outcome.FAILED


def test_a_link_to_the_expected_file_does_not_pass(tmp_path: Path) -> None:
    task = _task(tmp_path)
    code = "import os\nos.symlink('/expected/0_hello.txt', '/home/user/Desktop/hello.txt')"
    episode, verdict = _play(task, [code, "DONE"], tmp_path)
    assert episode.snapshot_manifest["symlinks"] == {"Desktop/hello.txt": "/expected/0_hello.txt"}
    assert verdict.score == 0.0


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_freeze_kill_and_thaw_by_uid_pid_and_start_time(tmp_path: Path) -> None:
    """The freeze's mechanics on plain processes of a spare uid (no desktop): who stops, dies, resumes."""
    import subprocess

    from agentinfra.environments.desktop._session import DesktopSession
    from agentinfra.sandbox import kill_uid, reserve_uid

    uid, lock = reserve_uid()
    session = DesktopSession()
    session.uid = uid
    started: list[subprocess.Popen[bytes]] = []
    try:

        def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
            process = subprocess.Popen(argv, user=uid, group=uid, cwd="/", start_new_session=True)
            started.append(process)
            return process

        shell = spawn(["sh", "-c", "sleep 30; echo late"])
        program = spawn(["sleep", "30"])
        time.sleep(0.3)
        session.record_setup()
        later = spawn(["sleep", "31"])
        time.sleep(0.3)
        frozen = session.freeze()
        assert frozen is not None
        pids = {p.pid for p in frozen}
        assert {shell.pid, program.pid, later.pid} <= pids
        assert all(_state(pid) == "T" for pid in pids)
        assert (
            session.kill_after_setup() == 1
        )  # `later` (the shell's `sleep 30` is from before the record)
        assert later.wait(timeout=5) == -9
        thaw = session.thaw_setup()
        assert thaw["left_stopped"] == [shell.pid]  # a shell would run what comes next
        assert program.pid in thaw["thawed"]
        assert later.pid not in thaw["thawed"]
        time.sleep(0.2)
        assert _state(program.pid) == "S"
        assert _state(shell.pid) == "T"
    finally:
        kill_uid(uid)
        for process in started:
            process.wait(timeout=5)  # our children: reaped here, or kill_uid counts their zombies
        deadline = time.monotonic() + 5
        while kill_uid(uid) and time.monotonic() < deadline:
            time.sleep(0.01)
        import os

        os.close(lock)
        session.remove()
