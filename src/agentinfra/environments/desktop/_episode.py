"""One episode: set the desktop up as the task says, play the actions, run postconfig, freeze, snapshot.

The episode directory gets ``step-000.png``/``.xml`` (the first observation) and
one screenshot and accessibility tree per action after it, ``actions.jsonl``
(each action, what it became, its error if refused, timings), and
``snapshot/`` (the frozen home the grader reads). Setup and postconfig steps run
inside the desktop, as the desktop user, through its controller: the host never
writes into the home the agent controls. Episodes are coroutines on the event
loop (the session's requests wait on its pipes there); the home's copy runs in a
worker thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentinfra.environments import Finding
from agentinfra.environments.desktop._a11y import flatten_accessibility
from agentinfra.environments.desktop._actions import ActionError, plan
from agentinfra.environments.desktop._session import ControllerError, DesktopConfig, DesktopSession
from agentinfra.environments.desktop._task import DesktopTask, mirror_path, placeholders
from agentinfra.errors import TaskEnvironmentError

__all__ = ["EpisodeResult", "Observation", "run_episode", "run_setup_step", "snapshot_home"]

SNAPSHOT_LIMIT_BYTES = 1 << 30
_OFFICE = {
    ".xlsx",
    ".xls",
    ".ods",
    ".csv",
    ".docx",
    ".doc",
    ".odt",
    ".rtf",
    ".pptx",
    ".ppt",
    ".odp",
}


@dataclass(frozen=True, slots=True)
class Observation:
    png: bytes
    pointer: tuple[int, int]
    accessibility_xml: str | None


@dataclass(slots=True)
class EpisodeResult:
    """What happened in one episode (the grader adds the score)."""

    task_id: str
    action_space: str
    track: str
    episode_dir: Path
    snapshot: Path | None = None
    steps: int = 0
    last_action: str | None = None
    refused: list[str] = field(default_factory=list)
    accessibility_xml: str | None = None
    setup_s: float = 0.0
    first_observation_s: float = 0.0
    crashed: str | None = None
    timings: dict[str, list[float]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    setup_error: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    snapshot_manifest: dict[str, Any] = field(default_factory=dict)


async def run_setup_step(
    session: DesktopSession, step: dict[str, Any], mirror: Path | None
) -> None:
    """Runs one setup/postconfig step; raises `TaskEnvironmentError` when it cannot."""
    kind, params = step["type"], dict(step.get("parameters") or {})
    width, height = session.config.width, session.config.height

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return placeholders(value, width, height)
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    if kind == "download":
        for item in params.get("files") or []:
            url, path = str(item["url"]), str(fill(item["path"]))
            if mirror is None:
                raise TaskEnvironmentError(f"download of {url} needs a mirror (--mirror DIR)")
            source = mirror_path(mirror, url)
            if not source.is_file():
                raise TaskEnvironmentError(
                    f"{url} is not in the mirror {mirror} (expected {source.name})"
                )
            reply = await session.write_file(path, source.read_bytes())
            if not reply.get("ok"):
                raise TaskEnvironmentError(f"download to {path} failed: {reply.get('error')}")
    elif kind == "launch":
        await session.request(
            "launch", command=fill(params["command"]), shell=bool(params.get("shell")), wait_s=15
        )
    elif kind == "open":
        path = str(fill(params["path"]))
        suffix = Path(path).suffix.lower()
        command = (
            ["soffice", "--norestore", "--nologo", path]
            if suffix in _OFFICE
            else ["mousepad", path]
        )
        await session.request("launch", command=command, wait_s=20, timeout_s=40)
    elif kind in ("execute", "command"):
        await session.request("execute", command=fill(params["command"]), shell=bool(params.get("shell")),
                        timeout=float(params.get("timeout", 60)), timeout_s=float(params.get("timeout", 60)) + 10)  # fmt: skip
    elif kind == "sleep":
        await asyncio.sleep(min(float(params.get("seconds", 1)), 60.0))
    elif kind in ("activate_window", "close_window"):
        await session.request("window", action="activate" if kind == "activate_window" else "close",
                        name=str(params["window_name"]), strict=bool(params.get("strict")),
                        by_class=bool(params.get("by_class")))  # fmt: skip
    else:
        raise TaskEnvironmentError(f"setup step {kind!r} is not supported here")


async def observe(session: DesktopSession, *, accessibility: bool) -> Observation:
    png, pointer = await session.screenshot()
    xml = None
    if accessibility:
        reply = await session.request("accessibility", max_nodes=5000)
        xml = str(reply["xml"]) if reply.get("ok") else None
    return Observation(png, pointer, xml)


def _save(directory: Path, index: int, observation: Observation) -> None:
    (directory / f"step-{index:03d}.png").write_bytes(observation.png)
    if observation.accessibility_xml is not None:
        (directory / f"step-{index:03d}.xml").write_text(observation.accessibility_xml)
        (directory / f"step-{index:03d}.a11y.tsv").write_text(
            flatten_accessibility(observation.accessibility_xml)
        )


async def run_episode(
    task: DesktopTask,
    actions: list[Any],
    *,
    action_space: str,
    track: str,
    episode_dir: Path,
    mirror: Path | None,
    config: DesktopConfig | None = None,
    accessibility: bool = True,
    needs_accessibility_tree: bool = False,
) -> EpisodeResult:
    """Plays ``actions`` on a fresh desktop set up for ``task`` and leaves the frozen home in ``episode_dir``."""
    episode_dir.mkdir(parents=True, exist_ok=True)
    result = EpisodeResult(task.id, action_space, track, episode_dir)
    log = (episode_dir / "actions.jsonl").open("w")
    started = time.monotonic()
    async with DesktopSession(config) as session:
        try:
            await session.start()
            for setup in task.config:
                await run_setup_step(session, setup, mirror)
            result.setup_s = time.monotonic() - started
            _save(episode_dir, 0, await observe(session, accessibility=accessibility))
            result.first_observation_s = time.monotonic() - started
            width, height = session.config.width, session.config.height
            for index, action in enumerate(actions, start=1):
                result.steps = index
                begun = time.monotonic()
                entry: dict[str, Any] = {"step": index, "action": action}
                try:
                    step = plan(action, action_space, track, width, height)
                except ActionError as exc:
                    entry["error"] = str(exc)
                    result.refused.append(f"step {index}: {exc}")
                    step = None
                if step is not None:
                    if step.end:
                        result.last_action = step.end
                        entry["end"] = step.end
                        log.write(json.dumps(entry) + "\n")
                        break
                    result.last_action = None
                    if step.code:
                        entry["code"] = step.code
                        reply = await session.request("code", code=step.code)
                        if not reply.get("ok") or reply.get("error"):
                            entry["error"] = str(reply.get("error"))[:2000]
                    if step.wait_s:
                        await asyncio.sleep(step.wait_s)
                acted = time.monotonic()
                observation = await observe(session, accessibility=accessibility)
                _save(episode_dir, index, observation)
                entry["act_s"] = round(acted - begun, 4)
                entry["observe_s"] = round(time.monotonic() - acted, 4)
                result.timings.setdefault("action_and_screenshot_s", []).append(
                    acted - begun + session.last_screenshot_s
                )
                log.write(json.dumps(entry) + "\n")
            for step_spec in task.postconfig:
                await run_setup_step(session, step_spec, mirror)
            if needs_accessibility_tree:
                reply = await session.request("accessibility", max_nodes=5000)
                result.accessibility_xml = str(reply["xml"]) if reply.get("ok") else None
        except ControllerError as exc:
            result.crashed = str(exc)
        finally:
            log.close()
            # The freeze: every process of the episode is gone before the copy.
            await session.close()
            result.snapshot = await asyncio.to_thread(
                snapshot_home, session.home, episode_dir / "snapshot"
            )
    return result


def snapshot_home(home: Path, target: Path) -> Path:
    """Copies ``home`` to ``target``: directories and regular files only, no links followed.

    Permission bits are kept (a check may read a file's mode); set-id bits are
    dropped. The grader binds the copy read-only and owns it while it reads.

    Called after the episode's processes are all dead, so nothing changes the
    home during the copy. Symbolic links, sockets and devices are left out (a link
    could point the grader at a file outside the home); so is anything past
    `SNAPSHOT_LIMIT_BYTES`.
    """
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    total = 0
    for directory, folders, files in os.walk(home, followlinks=False):
        relative = Path(directory).relative_to(home)
        for name in folders:
            if not os.path.islink(os.path.join(directory, name)):
                (target / relative / name).mkdir(mode=0o755)
        for name in files:
            source = os.path.join(directory, name)
            info = os.lstat(source)
            if not stat.S_ISREG(info.st_mode) or total + info.st_size > SNAPSHOT_LIMIT_BYTES:
                continue
            total += info.st_size
            destination = target / relative / name
            with (
                open(source, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as src,
                open(destination, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst)
            os.utime(destination, ns=(info.st_atime_ns, info.st_mtime_ns))
            destination.chmod(info.st_mode & 0o777)
    for directory, _, _ in os.walk(home):
        relative = Path(directory).relative_to(home)
        if (target / relative).is_dir():
            os.chmod(target / relative, os.lstat(directory).st_mode & 0o777)
    return target
