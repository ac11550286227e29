"""One episode: set the desktop up as the task says, play the actions, freeze, postconfig, snapshot.

The episode directory gets ``step-000.png``/``.xml`` (the first observation) and
one screenshot and accessibility tree per action after it, ``actions.jsonl``
(each action, what it became, its error if refused, timings), and
``snapshot/`` (the frozen home the grader reads). Setup and postconfig steps run
inside the desktop, as the desktop user, through its controller: the host never
writes into the home the agent controls. Episodes are coroutines on the event
loop (the session's requests wait on its pipes there); the home's copy runs in a
worker thread.

The end, whatever ended it (DONE, FAIL, the actions exhausted, an action past its
time limit, a crash), is `finish`: every process of the desktop is stopped at
once (SIGSTOP), the processes alive are recorded from the host's ``/proc`` (the
episode's ``facts``), every process started after setup is killed, and only when
the task has live postconfig steps (or reads the accessibility tree) is the setup
set thawed to run them; then the jail is killed and the home copied
(`snapshot_home`). Postconfig ``download`` steps never touch the live home: the
grader applies them to the snapshot.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentinfra.environments import Finding
from agentinfra.environments.desktop._a11y import flatten_accessibility
from agentinfra.environments.desktop._actions import ActionError, plan
from agentinfra.environments.desktop._pool import take_pooled
from agentinfra.environments.desktop._session import (
    ControllerError,
    DesktopConfig,
    DesktopSession,
    remove_tree,
)
from agentinfra.environments.desktop._task import (
    DesktopTask,
    _command_words,
    mirror_file,
    mirror_hint,
    placeholders,
    snapshot_chmods,
)
from agentinfra.errors import TaskEnvironmentError

__all__ = [
    "EpisodeResult",
    "Observation",
    "Snapshot",
    "finish",
    "live_postconfig",
    "run_action_code",
    "run_episode",
    "run_setup_step",
    "snapshot_findings",
    "snapshot_home",
]

SNAPSHOT_LIMIT_BYTES = 1 << 30
"""The most bytes (apparent file sizes) the snapshot copies; past it, a block finding. Sparse files are
copied sparse, so holes cost no disk, but they count: a reader of the copy may read them."""
SNAPSHOT_MAX_ENTRIES = 200_000
"""The most files, folders and links the snapshot copies; past it, a block finding."""
SNAPSHOT_MAX_DEPTH = 256
"""The deepest folder the snapshot enters (the home is depth 0); deeper, a block finding."""
_LEFT_OUT_LISTED = 1000
"""How many left-out entries the manifest names (``left_out_total`` counts them all)."""
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
    """What the episode itself found (``postconfig_failed``, ``snapshot_over_budget``,
    ``snapshot_too_deep``, ``action_after_fail``, ``action_time_limit``); the grader copies them."""
    setup_error: str | None = None
    """A task setup step failed (the task's fault): the grader gives ``grader_error`` without checks."""
    facts: dict[str, Any] = field(default_factory=dict)
    """Recorded at the freeze by the host from its ``/proc``: ``{"processes": [{pid, comm, cmdline}]}``."""
    snapshot_manifest: dict[str, Any] = field(default_factory=dict)
    """`snapshot_home`'s record: real ``modes``, ``symlinks``, ``left_out``, ``bytes``."""


class StepFailedError(TaskEnvironmentError):
    """A setup or postconfig step ran and failed (a non-zero exit, a program that would not start)."""


LIVE_POSTCONFIG = frozenset(
    {"execute", "command", "launch", "open", "sleep", "activate_window", "close_window"}
)
"""Postconfig steps that act on the live desktop, after the freeze; ``download`` applies to the snapshot."""


_WINDOWLESS = frozenset({"socat", "pkill", "killall", "kill", "sleep"})
"""Programs OSWorld's tasks launch that open no window: a launch of one does not wait for one."""


def live_postconfig(task: DesktopTask) -> list[tuple[int, dict[str, Any]]]:
    """The task's postconfig steps that run on the desktop (with their index): all but downloads, the
    ``chmod`` of what they brought (`snapshot_chmods`: applied to the snapshot with them) and the
    steps whose output ``cache_file`` reads (checks: they run in the probe, `_grading`)."""
    checks = {index for index, _ in task.output_steps().values()} | set(snapshot_chmods(task))
    return [(i, s) for i, s in enumerate(task.postconfig)
            if s and s.get("type") != "download" and i not in checks]  # fmt: skip


async def run_setup_step(
    session: DesktopSession, step: dict[str, Any], mirror: Path | None, *, task_id: str
) -> None:
    """Runs one setup/postconfig step; raises `StepFailedError` when it ran and failed, `ControllerError` when
    the desktop did not answer, `TaskEnvironmentError` when it cannot run here."""
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
            source = mirror_file(mirror, url, task_id=task_id, dest=str(item["path"]))
            if source is None:
                raise TaskEnvironmentError(
                    mirror_hint(mirror, url, task_id=task_id, dest=str(item["path"]))
                )
            reply = await session.write_file(path, source.read_bytes())
            if not reply.get("ok"):
                raise StepFailedError(f"download to {path} failed: {reply.get('error')}")
    elif kind == "launch":
        command, shell = fill(params["command"]), bool(params.get("shell"))
        words = _command_words(command, shell)
        windowless = bool(words) and words[0] in _WINDOWLESS
        reply = await session.request(
            "launch", command=command, shell=shell, wait_s=0 if windowless else 15
        )
        if not reply.get("ok"):
            raise StepFailedError(f"{params['command']!r} did not start: {reply.get('error')}")
    elif kind == "open":
        path = str(fill(params["path"]))
        suffix = Path(path).suffix.lower()
        command = (
            ["soffice", "--norestore", "--nologo", path]
            if suffix in _OFFICE
            else ["mousepad", path]
        )
        reply = await session.request(
            "launch", command=command, wait_s=20, timeout_s=40, title=Path(path).name
        )
        if not reply.get("ok"):
            raise StepFailedError(f"{command[0]} did not start for {path}: {reply.get('error')}")
    elif kind in ("execute", "command"):
        reply = await session.request("execute", command=fill(params["command"]), shell=bool(params.get("shell")),
                        timeout=float(params.get("timeout", 60)), timeout_s=float(params.get("timeout", 60)) + 10)  # fmt: skip
        if not reply.get("ok"):
            raise StepFailedError(f"{params['command']!r} could not run: {reply.get('error')}")
        if reply.get("returncode") != 0:
            said = str(reply.get("error") or reply.get("output") or "").strip()[-500:]
            raise StepFailedError(f"{params['command']!r} exited with {reply.get('returncode')}"
                             + (f": {said}" if said else ""))  # fmt: skip
    elif kind == "sleep":
        await asyncio.sleep(min(float(params.get("seconds", 1)), 60.0))
    elif kind in ("activate_window", "close_window"):
        reply = await session.request("window", action="activate" if kind == "activate_window" else "close",
                                      name=str(params["window_name"]), strict=bool(params.get("strict")),
                                      by_class=bool(params.get("by_class")))  # fmt: skip
        if not reply.get("ok"):
            raise StepFailedError(f"wmctrl could not run: {reply.get('error')}")
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


async def run_action_code(session: DesktopSession, code: str) -> dict[str, Any]:
    """Runs one action's code on the desktop (a child of the controller), within the action time limit."""
    limit = session.config.action_time_limit_s
    return await session.request("code", code=code, time_limit=limit, timeout_s=limit + 30)


async def run_setup(session: DesktopSession, task: DesktopTask, mirror: Path | None) -> str | None:
    """Runs the task's setup steps in order; the first failure's description (the task's fault), else None."""
    for index, step in enumerate(task.config):
        try:
            await run_setup_step(session, step, mirror, task_id=task.id)
        except ControllerError:
            raise  # the desktop, not the task: the episode crashed
        except TaskEnvironmentError as exc:  # a step that failed, or that cannot run here
            return f"setup step {index} ({step.get('type')}) failed: {exc}"
    return None


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
    """Plays ``actions`` on a fresh desktop set up for ``task`` and leaves the frozen home in ``episode_dir``.

    Whatever happens in the desktop, the result has a snapshot (or ``crashed``
    saying why not): a controller that stops answering is ``crashed``, a failed
    setup step ``setup_error``, a failed live postconfig step a finding.
    """
    episode_dir.mkdir(parents=True, exist_ok=True)
    result = EpisodeResult(task.id, action_space, track, episode_dir)
    started = time.monotonic()
    pooled = await take_pooled(config)  # a started desktop from the warm pool, if one runs
    async with pooled or DesktopSession(config) as session:
        with (episode_dir / "actions.jsonl").open("w") as log:
            try:
                if not session.is_started:
                    await session.start()
                result.setup_error = await run_setup(session, task, mirror)
                result.setup_s = time.monotonic() - started
                if result.setup_error is None:
                    _save(episode_dir, 0, await observe(session, accessibility=accessibility))
                    # Before the first action nothing of the agent runs: this is the setup set.
                    await asyncio.to_thread(session.record_setup)
                    result.first_observation_s = time.monotonic() - started
                    await _play(session, actions, result, log, accessibility=accessibility)
            except ControllerError as exc:
                result.crashed = str(exc)
        await finish(session, task, result, mirror, needs_accessibility_tree=needs_accessibility_tree,
                     snapshot_dir=episode_dir / "snapshot")  # fmt: skip
    return result


async def _play(
    session: DesktopSession,
    actions: list[Any],
    result: EpisodeResult,
    log: Any,
    *,
    accessibility: bool,
) -> None:
    """Plays the actions until the first DONE/FAIL, the list's end, or an action past its time limit."""
    width, height = session.config.width, session.config.height
    for index, action in enumerate(actions, start=1):
        result.steps = index
        begun = time.monotonic()
        entry: dict[str, Any] = {"step": index, "action": action}
        try:
            step = plan(action, result.action_space, result.track, width, height)
        except ActionError as exc:
            entry["error"] = str(exc)
            result.refused.append(f"step {index}: {exc}")
            step = None
        if step is not None:
            if step.end:
                result.last_action = step.end
                entry["end"] = step.end
                log.write(json.dumps(entry) + "\n")
                _after_end(actions[index:], index, step.end, result, log)
                return
            result.last_action = None
            if step.code:
                entry["code"] = step.code
                reply = await run_action_code(session, step.code)
                if not reply.get("ok") or reply.get("error"):
                    entry["error"] = str(reply.get("error"))[:2000]
                if reply.get("time_limit"):
                    result.findings.append(Finding(
                        check="action_time_limit", severity="warn",
                        message=f"step {index}: {reply.get('error')}; the episode ended there and is graded "
                                "as it stands",
                    ))  # fmt: skip
                    log.write(json.dumps(entry) + "\n")
                    return
            if step.wait_s:
                await asyncio.sleep(step.wait_s)
        acted = time.monotonic()
        observation = await observe(session, accessibility=accessibility)
        _save(result.episode_dir, index, observation)
        entry["act_s"] = round(acted - begun, 4)
        entry["observe_s"] = round(time.monotonic() - acted, 4)
        result.timings.setdefault("action_and_screenshot_s", []).append(
            acted - begun + session.last_screenshot_s
        )
        log.write(json.dumps(entry) + "\n")


def _after_end(rest: list[Any], ended_at: int, end: str, result: EpisodeResult, log: Any) -> None:
    """Actions after DONE are not played; after FAIL they are refused and FAIL stops counting as the answer
    (OSWorld scores FAIL only as the last action)."""
    for offset, action in enumerate(rest, start=1):
        log.write(json.dumps({"step": ended_at + offset, "action": action,
                              "error": f"not played: the episode ended with {end} at step {ended_at}"}) + "\n")  # fmt: skip
    if rest and end == "FAIL":
        result.last_action = None
        result.findings.append(Finding(
            check="action_after_fail", severity="warn",
            message=f"{len(rest)} action(s) came after FAIL at step {ended_at}; they were refused, and FAIL is "
                    "not the episode's answer (it counts only as the last action)",
        ))  # fmt: skip


async def finish(
    session: DesktopSession,
    task: DesktopTask,
    result: EpisodeResult,
    mirror: Path | None,
    *,
    needs_accessibility_tree: bool,
    snapshot_dir: Path,
) -> Path:
    """The end of an episode, freeze first; fills ``result``'s facts, findings and snapshot; returns it.

    1. every process of the desktop stopped (SIGSTOP, until none is new);
    2. the processes recorded from host ``/proc`` (``result.facts``);
    3. when there are live postconfig steps or the task reads the accessibility
       tree (and setup succeeded and the desktop did not crash): every process
       started after setup killed, the setup set alone thawed, the steps run in
       order (the first that fails is a ``postconfig_failed`` block finding), the tree read;
    4. the jail killed, then the home copied (`snapshot_home`).
    """
    frozen = await asyncio.to_thread(session.freeze) if session.uid >= 0 else []
    if frozen is None:
        result.facts = {"processes": [], "incomplete": "processes kept forking through the freeze"}
    else:
        result.facts = {"processes": [p.to_json() for p in frozen]}
    live = live_postconfig(task)
    if (live or needs_accessibility_tree) and result.setup_error is None:
        if result.crashed is not None or frozen is None or session.channel is None:
            why = result.crashed or "processes kept forking through the freeze"
            if live:
                result.findings.append(Finding(
                    check="postconfig_failed", severity="block",
                    message=f"postconfig steps {[i for i, _ in live]} were not run: {why[:300]}",
                ))  # fmt: skip
        else:
            await asyncio.to_thread(session.kill_after_setup)
            result.facts["postconfig_thaw"] = session.thaw_setup()
            await _postconfig(session, live, result, mirror, task.id)
            if needs_accessibility_tree:
                try:
                    reply = await session.request("accessibility", max_nodes=5000)
                    result.accessibility_xml = str(reply["xml"]) if reply.get("ok") else None
                except ControllerError:
                    result.accessibility_xml = None
    await session.close()  # every process of the episode is gone before the copy
    try:
        snapshot = await asyncio.to_thread(snapshot_home, session.home, snapshot_dir)
    except OSError as exc:
        result.crashed = f"the home could not be copied: {exc}"
        return snapshot_dir
    result.snapshot = snapshot.path
    result.snapshot_manifest = snapshot.manifest
    result.findings.extend(snapshot_findings(snapshot.manifest))
    return snapshot.path


async def _postconfig(
    session: DesktopSession,
    live: list[tuple[int, dict[str, Any]]],
    result: EpisodeResult,
    mirror: Path | None,
    task_id: str,
) -> None:
    for index, step in live:
        try:
            await run_setup_step(session, step, mirror, task_id=task_id)
        except TaskEnvironmentError as exc:  # a failed step, a controller that is gone
            result.findings.append(Finding(
                check="postconfig_failed", severity="block",
                message=f"postconfig step {index} ({step.get('type')}) failed: {str(exc)[:500]}",
            ))  # fmt: skip
            return


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A copied home and its manifest (see `snapshot_home`)."""

    path: Path
    manifest: dict[str, Any]


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def snapshot_home(home: Path, target: Path) -> Snapshot:
    """Copies ``home`` to ``target`` and says what the copy holds and what it left out.

    Called after every process of the episode is dead, so nothing changes the
    home during the copy. The walk has no recursion (one pair of directory fds at
    a time, moving up through ``..``, so paths past ``PATH_MAX`` are fine) and
    follows no link:

    * folders are made 0o755 and files 0o644 in the copy, readable to any
      grading uid; the real permission bits (set-id included) are in the
      manifest's ``modes``, keyed by the path relative to the home (``.`` for it);
    * symbolic links are copied as links, their targets verbatim (``symlinks``);
    * regular files are copied sparse (``SEEK_DATA``/``SEEK_HOLE``), their times kept;
    * sockets, pipes and devices are left out (``left_out``, with the reason), and so
      is everything past `SNAPSHOT_MAX_DEPTH`, `SNAPSHOT_LIMIT_BYTES` of data or
      `SNAPSHOT_MAX_ENTRIES`; `snapshot_findings` turns the last three into block findings.

    Returns the copy's path and the manifest ``{"modes", "symlinks", "left_out",
    "left_out_total", "bytes", "data_bytes", "entries", "too_deep", "over_budget"}``.
    """
    remove_tree(target)
    target.mkdir(parents=True)
    manifest: dict[str, Any] = {"modes": {}, "symlinks": {}, "left_out": [], "left_out_total": 0,
                                "bytes": 0, "data_bytes": 0, "entries": 0, "too_deep": False, "over_budget": False}  # fmt: skip
    source = os.open(home, _DIRECTORY)
    copy = os.open(target, _DIRECTORY)
    try:
        info = os.fstat(source)
        manifest["modes"]["."] = stat.S_IMODE(info.st_mode)
        _walk(source, copy, manifest)
        os.fchmod(copy, 0o755)
        os.utime(copy, ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(source)
        os.close(copy)
    return Snapshot(target, manifest)


def _leave_out(manifest: dict[str, Any], path: str, reason: str) -> None:
    manifest["left_out_total"] += 1
    if len(manifest["left_out"]) < _LEFT_OUT_LISTED:
        manifest["left_out"].append({"path": path, "reason": reason})


def _walk(top_source: int, top_copy: int, manifest: dict[str, Any]) -> None:
    """Copies the tree under the open folder ``top_source`` into ``top_copy`` (both left open)."""
    _walk_from(os.dup(top_source), os.dup(top_copy), manifest)


def _walk_from(source: int, copy: int, manifest: dict[str, Any]) -> None:
    # One frame per folder entered: its relative path and the entries still to do. ``source`` and
    # ``copy`` are this function's own fds (dups): it closes them, and those it opens, as it moves.
    frames: list[tuple[str, list[str]]] = [("", sorted(os.listdir(source)))]
    fds = [source, copy]
    try:
        _loop(frames, fds, manifest)
    finally:
        for fd in fds:
            os.close(fd)


def _loop(frames: list[tuple[str, list[str]]], fds: list[int], manifest: dict[str, Any]) -> None:
    """The walk proper; ``fds`` holds the current folder's two fds (kept current for the caller to close)."""
    source, copy = fds
    while frames:
        relative, pending = frames[-1]
        if not pending:
            frames.pop()
            if frames:  # back up to the parent folder, the copy's times set on the way
                info = os.fstat(source)
                os.fchmod(copy, 0o755)
                os.utime(copy, ns=(info.st_atime_ns, info.st_mtime_ns))
                source = fds[0] = _up(source)
                copy = fds[1] = _up(copy)
            continue
        name = pending.pop()
        path = f"{relative}/{name}" if relative else name
        try:
            info = os.stat(name, dir_fd=source, follow_symlinks=False)
        except OSError as exc:
            _leave_out(manifest, path, f"unreadable: {exc.strerror}")
            continue
        if manifest["entries"] >= SNAPSHOT_MAX_ENTRIES:
            manifest["over_budget"] = True
            _leave_out(manifest, path, f"past the snapshot's {SNAPSHOT_MAX_ENTRIES} entries")
            continue
        kind = stat.S_IFMT(info.st_mode)
        if kind == stat.S_IFLNK:
            manifest["entries"] += 1
            link = os.readlink(name, dir_fd=source)
            os.symlink(link, name, dir_fd=copy)
            manifest["symlinks"][path] = link
        elif kind == stat.S_IFREG:
            # Apparent sizes count: whoever reads the copy (the grader, an archive) may read holes.
            if manifest["bytes"] + info.st_size > SNAPSHOT_LIMIT_BYTES:
                manifest["over_budget"] = True
                _leave_out(manifest, path, f"{info.st_size} bytes past the snapshot's budget of "
                                           f"{SNAPSHOT_LIMIT_BYTES} bytes")  # fmt: skip
                continue
            manifest["entries"] += 1
            manifest["data_bytes"] += _copy_file(name, source, copy, info)
            manifest["bytes"] += info.st_size
            manifest["modes"][path] = stat.S_IMODE(info.st_mode)
        elif kind == stat.S_IFDIR:
            depth = len(frames)
            if depth > SNAPSHOT_MAX_DEPTH:
                manifest["too_deep"] = True
                _leave_out(manifest, path, f"deeper than {SNAPSHOT_MAX_DEPTH} folders")
                continue
            manifest["entries"] += 1
            manifest["modes"][path] = stat.S_IMODE(info.st_mode)
            os.mkdir(name, 0o755, dir_fd=copy)
            inner_source = os.open(name, _DIRECTORY, dir_fd=source)
            try:
                inner_copy = os.open(name, _DIRECTORY, dir_fd=copy)
            except OSError:
                os.close(inner_source)
                raise
            os.close(source)
            fds[0] = source = inner_source
            os.close(copy)
            fds[1] = copy = inner_copy
            frames.append((path, sorted(os.listdir(source))))
        else:
            what = {stat.S_IFSOCK: "a socket", stat.S_IFIFO: "a pipe", stat.S_IFCHR: "a device",
                    stat.S_IFBLK: "a device"}.get(kind, "not a file")  # fmt: skip
            _leave_out(manifest, path, f"{what}: not copied")


def _up(fd: int) -> int:
    """The parent folder of the open folder ``fd`` (an fd of it; ``fd`` is closed)."""
    parent = os.open("..", _DIRECTORY, dir_fd=fd)
    os.close(fd)
    return parent


def _copy_file(name: str, source: int, copy: int, info: os.stat_result) -> int:
    """Copies one regular file sparse, mode 0o644, times kept; returns the data bytes copied."""
    copied = 0
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=source)
    try:
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o644, dir_fd=copy)  # fmt: skip
        try:
            size = os.fstat(src).st_size
            offset = 0
            while offset < size:
                try:
                    data = os.lseek(src, offset, os.SEEK_DATA)
                except OSError:  # ENXIO: only a hole is left
                    break
                hole = os.lseek(src, data, os.SEEK_HOLE)
                copied += _copy_range(src, dst, data, hole - data)
                offset = hole
            os.ftruncate(dst, size)
            os.fchmod(dst, 0o644)
            os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return copied


def _copy_range(src: int, dst: int, offset: int, count: int) -> int:
    done = 0
    while done < count:
        try:
            moved = os.copy_file_range(src, dst, count - done, offset + done, offset + done)
        except OSError:
            moved = 0
        if moved == 0:  # not supported here, or end of file: plain reads
            os.lseek(src, offset + done, os.SEEK_SET)
            os.lseek(dst, offset + done, os.SEEK_SET)
            chunk = os.read(src, min(1 << 20, count - done))
            if not chunk:
                break
            os.write(dst, chunk)
            moved = len(chunk)
        done += moved
    return done


def snapshot_findings(manifest: dict[str, Any]) -> list[Finding]:
    """Block findings for what the snapshot left out that a check might have needed."""
    findings = []
    if manifest.get("over_budget"):
        named = [e["path"] for e in manifest["left_out"] if "past the snapshot" in e["reason"]]
        findings.append(Finding(
            check="snapshot_over_budget", severity="block",
            message=f"the home exceeds the snapshot's budget ({SNAPSHOT_LIMIT_BYTES} bytes, "
                    f"{SNAPSHOT_MAX_ENTRIES} entries); left out: {', '.join(named[:10])[:1500]}"
                    + (f" and {len(named) - 10} more" if len(named) > 10 else ""),
        ))  # fmt: skip
    if manifest.get("too_deep"):
        named = [e["path"] for e in manifest["left_out"] if "deeper than" in e["reason"]]
        findings.append(Finding(
            check="snapshot_too_deep", severity="block",
            message=f"folders deeper than {SNAPSHOT_MAX_DEPTH} levels were left out of the snapshot: "
                    f"{', '.join(p[:200] for p in named[:5])}",
        ))  # fmt: skip
    return findings
