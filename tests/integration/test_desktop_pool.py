"""The desktop pool on real desktops: episodes from it see nothing of the episode before, a broken
pooled desktop is never handed out, and the pool dies with the rollout service (also a killed one)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agentinfra._settings import load_settings
from agentinfra.environments import AgentHooks, Submission
from agentinfra.environments.desktop import (
    DesktopPool,
    DesktopSession,
    PoolStats,
    load_desktop_task,
)
from agentinfra.environments.desktop._agent import DesktopAgent
from agentinfra.environments.desktop._episode import run_episode
from agentinfra.environments.desktop._options import DesktopAgentOptions
from agentinfra.environments.desktop._pool import active_pool
from agentinfra.environments.desktop._session import check_prerequisites, uid_processes
from agentinfra.errors import TaskEnvironmentError
from agentinfra.rollouts import RolloutService, ServiceConfig, sweep_orphaned_jails

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "desktop" / "tasks" / "os-mkdir.json"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _desktop_available() -> None:
    try:
        check_prerequisites()
    except TaskEnvironmentError as exc:
        pytest.fail(str(exc))


_LEAVE_TRACES = textwrap.dedent("""
    import pathlib, subprocess, sys, time
    (pathlib.Path.home() / "Documents" / "leak-a.txt").write_text("secret of episode A")
    open("/tmp/leak-a", "w").write("x")
    subprocess.Popen(["setsid", "sleep", "600"])
    subprocess.Popen(["xterm", "-title", "leak-a-window"])
    subprocess.Popen([sys.executable, "-c", "import tkinter; r = tkinter.Tk(); r.withdraw(); "
                      "r.clipboard_clear(); r.clipboard_append('leak-a-clip'); r.mainloop()"])
    time.sleep(2)
""")
_PROBE = textwrap.dedent("""
    import json, os, pathlib, subprocess, sys
    home = pathlib.Path.home()
    clip = subprocess.run([sys.executable, "-c", "import tkinter; r = tkinter.Tk(); r.withdraw(); "
                           "print(r.clipboard_get())"], capture_output=True, text=True, timeout=20)
    probe = {
        "files": sorted(str(p.relative_to(home)) for p in home.rglob("*")),
        "tmp": sorted(os.listdir("/tmp")),
        "processes": sorted(open(f"/proc/{p}/cmdline").read() for p in os.listdir("/proc") if p.isdigit()),
        "windows": subprocess.run(["wmctrl", "-l"], capture_output=True, text=True).stdout,
        "clipboard": clip.stdout + clip.stderr,
    }
    (home / "probe.json").write_text(json.dumps(probe))
""")


def _gone(uid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while uid_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not uid_processes(uid)


def test_a_pooled_episode_sees_nothing_of_the_one_before(tmp_path: Path) -> None:
    """Episode A (`run_episode`) leaves traces everywhere and its probe sees them; episode B (the
    desktop agent, as the rollout service runs it) on the next pooled desktop sees none."""
    task = load_desktop_task(TASK)
    submitted: list[Submission] = []

    async def submit(submission: Submission) -> str:
        submitted.append(submission)
        return "submitted"

    async def results(_: float) -> str:
        return ""

    async def main() -> tuple[str, PoolStats]:
        async with DesktopPool(size=1) as pool:
            await pool.wait_ready()
            uids = [pool.ready_sessions()[0].uid]
            episode = await run_episode(task, [_LEAVE_TRACES, _PROBE, "DONE"], action_space="pyautogui",
                                        track="code", episode_dir=tmp_path / "a", mirror=None)  # fmt: skip
            assert episode.crashed is None, episode.crashed
            assert episode.setup_error is None, episode.setup_error
            assert _gone(uids[0])  # the episode's desktop is destroyed
            await pool.wait_ready()
            uids.append(pool.ready_sessions()[0].uid)
            options = {"action_space": "pyautogui", "track": "code", "observation": "both"}
            agent = DesktopAgent(task, None, tmp_path / "b", AgentHooks(submit=submit, results=results),
                                 DesktopAgentOptions.from_options(options))  # fmt: skip
            try:
                observed = str(await agent.act(_PROBE))
                await agent.end("DONE")
            finally:
                await agent.close()
            assert _gone(uids[1])
            return observed, pool.stats()

    observed, stats = asyncio.run(main())
    assert stats.handed_out == 2
    assert stats.misses == 0
    before = json.loads((tmp_path / "a" / "snapshot" / "probe.json").read_text())
    with tarfile.open(fileobj=io.BytesIO(submitted[-1].data)) as archive:
        member = archive.extractfile("home/probe.json")
        assert member is not None
        after = json.load(member)
    # The probe sees each trace where it is (A) ...
    assert "Documents/leak-a.txt" in before["files"]
    assert "leak-a" in before["tmp"]
    assert [p for p in before["processes"] if p.startswith("sleep")]
    assert "leak-a-window" in before["windows"]
    assert "leak-a-clip" in before["clipboard"]
    # ... and none of them on the next pooled desktop (B).
    assert not [f for f in after["files"] if "leak-a" in f], after["files"]
    assert "leak-a" not in after["tmp"]
    assert not [p for p in after["processes"] if "sleep" in p or "leak-a" in p], after["processes"]
    assert "leak-a" not in after["windows"]
    assert "leak-a-clip" not in after["clipboard"]
    assert "leak-a" not in observed  # the screenshot's accessibility table after B's action


def test_a_pooled_desktop_that_fails_its_health_check_is_replaced() -> None:
    async def main() -> None:
        async with DesktopPool(size=2) as pool:
            await pool.wait_ready()
            broken, healthy = pool.ready_sessions()
            xvfb = next(p for p in uid_processes(broken.uid) if p.comm == "Xvfb")
            os.kill(xvfb.pid, signal.SIGKILL)
            taken = await pool.take()
            assert taken is healthy
            assert pool.stats().replaced == 1
            png, _ = await taken.screenshot()
            assert png.startswith(b"\x89PNG")
            await taken.close()
            taken.remove()
            await pool.wait_ready()  # refilled: the broken one replaced, the taken one too
            stray_on = pool.ready_sessions()[0]
            stray = subprocess.Popen(["sleep", "60"], user=stray_on.uid, group=stray_on.uid)
            try:
                taken = await pool.take()
                assert taken is not None
                assert taken is not stray_on
                assert pool.stats().replaced == 2
                await taken.close()
                taken.remove()
            finally:
                stray.kill()
                stray.wait()
        assert _gone(broken.uid, 5.0)
        assert _gone(stray_on.uid, 5.0)

    asyncio.run(main())


_SERVICE = """
import asyncio, sys
from pathlib import Path
from agentinfra._settings import load_settings
from agentinfra.environments.desktop._pool import active_pool
from agentinfra.rollouts import RolloutService, ServiceConfig, sweep_orphaned_jails

async def main():
    config = ServiceConfig(state_dir=Path(sys.argv[1]), port=0, desktop_pool=1, check_endpoint=False)
    service = RolloutService(config, load_settings(), api_key_of=lambda _: "")
    await service.start()
    pool = active_pool()
    await pool.wait_ready()
    print(pool.ready_sessions()[0].uid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_the_pool_dies_with_the_service_killed_or_stopped(tmp_path: Path) -> None:
    killed = subprocess.Popen([sys.executable, "-c", _SERVICE, str(tmp_path)], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    try:
        assert killed.stdout is not None
        old_uid = int(killed.stdout.readline())
        assert uid_processes(old_uid)
    finally:
        killed.kill()
        killed.wait()
        if killed.stdout is not None:
            killed.stdout.close()
    assert _gone(old_uid)  # the controller reads the end of its pipe and the jail ends with it

    async def restart() -> list[int]:
        config = ServiceConfig(state_dir=tmp_path, port=0, desktop_pool=2, check_endpoint=False)
        service = RolloutService(config, load_settings(), api_key_of=lambda _: "")
        await service.start()
        pool = active_pool()
        assert pool is not None
        await pool.wait_ready()
        orphan, kept = pool.ready_sessions()
        # A desktop that outlived its service: its uid's lock is free, its processes run.
        os.close(orphan._lock)
        orphan._lock = -1
        assert orphan.uid in sweep_orphaned_jails()
        assert _gone(orphan.uid, 2.0)
        assert kept.uid not in sweep_orphaned_jails()  # a live pool's desktop is not an orphan
        await service.close()
        assert active_pool() is None
        return [orphan.uid, kept.uid]

    for uid in asyncio.run(restart()):
        assert _gone(uid, 5.0)


def test_a_start_cancelled_mid_launch_leaves_no_jail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a pool while it starts a desktop cancels the start; the launch thread runs on regardless,
    so the start waits for it and `close` then kills what it made."""
    launching = threading.Event()
    launch = DesktopSession._launch

    def slow_launch(self: DesktopSession) -> None:
        launching.set()
        time.sleep(0.5)
        launch(self)

    monkeypatch.setattr(DesktopSession, "_launch", slow_launch)

    async def main() -> DesktopSession:
        session = DesktopSession()
        start = asyncio.create_task(session.start())
        while not launching.is_set():
            await asyncio.sleep(0.005)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        await session.close()
        return session

    session = asyncio.run(main())
    try:
        assert session.channel is not None
        assert session.channel.poll() is not None  # the jail was made, and killed
        assert _gone(session.uid)  # polled, not a fixed 1 s sleep: under load the kill takes longer
    finally:
        if session.channel is not None and session.channel.poll() is None:
            session.channel.kill(grace_s=1.0)
        session.remove()
