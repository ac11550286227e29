"""A model on the desktop: tools for one action space, observations as images, submit/done/fail.

`DesktopAgent` holds one live desktop for one agent run (started, and the task's
setup run, on the first tool call; at most ``desktops`` at once per process).
Every action tool returns the new observation: a text part (screen and
screenshot sizes, how coordinates map, the action's error if it was refused, and
the accessibility table when the observation includes it) and the screenshot,
downscaled to ``screenshot_width`` (``image_url`` parts on the wire).

* ``computer`` (the computer-use action set): coordinates are in the screenshot's
  pixels and are scaled back to the screen.
* ``computer_13`` and ``pyautogui`` (OSWorld): coordinates are the screen's, as in
  OSWorld; ``pyautogui`` code runs on the run's track (``gui-only`` by default).
* ``submit`` grades the current state while the episode goes on: every process
  of the desktop is stopped (SIGSTOP, until none is new, and until each has
  stopped), the processes are recorded from host ``/proc``, the home is copied,
  they resume; the copy is a submission graded in isolation, like a kernel.
* ``done`` and ``fail`` end the episode freeze first (`_episode.finish`): every
  process stopped and recorded, those started after setup killed, the setup set
  thawed only for live postconfig steps, the desktop killed, the home
  snapshotted and submitted as the final submission (FAIL recorded as the last
  action, so it scores 1 only on an infeasible task). An action past its time
  limit ends the episode the same way, graded as it stands; so does an agent that
  stops without done or fail (`DesktopAgent.close`: prose replies, a budget
  reached), unless its run is cancelled. Every run ends in one final verdict.

Every action is journalled in ``<workspace>/episode/actions.jsonl`` (`ActionLog`,
a `Journal`: fsync'd, a torn last line dropped) once it has run, with a hash of
the accessibility table after it. After a crash (``kill -9``
included) the resumed run starts a fresh desktop, runs the task's setup and
replays the journalled actions in order, without asking the model; the loop's
unfinished call, if its action had already run, is not run again (the
agent hooks' count of completed action calls says which). If the accessibility table
after the replay differs from the journalled one, the run is marked: the next
observation says so, ``episode/replay_mismatch.json`` is written, and every later
verdict carries a ``resume_replay_mismatch`` finding. Code refused
on the ``gui-only`` track that reaches for files, processes or modules is an
attempt to bypass the GUI: it is recorded and the final verdict flags it.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import re
import stat
import tarfile
from pathlib import Path
from typing import Any, cast

from agentinfra._atomic import write_atomic
from agentinfra._journal import Event, Journal
from agentinfra.agent import ImagePart, TextPart, Tool, ToolResult
from agentinfra.environments import AgentHooks, AgentSetup, Finding, Submission
from agentinfra.environments.desktop._a11y import flatten_accessibility
from agentinfra.environments.desktop._actions import ActionError, plan
from agentinfra.environments.desktop._coordinates import (
    convention_for,
    describe,
    from_openai,
    image_size,
    to_screen,
)
from agentinfra.environments.desktop._episode import (
    EpisodeResult,
    finish,
    run_action_code,
    run_setup,
    snapshot_findings,
    snapshot_home,
)
from agentinfra.environments.desktop._options import DesktopAgentOptions
from agentinfra.environments.desktop._pool import take_pooled
from agentinfra.environments.desktop._session import DesktopConfig, DesktopSession
from agentinfra.environments.desktop._task import DesktopTask
from agentinfra.errors import TaskEnvironmentError, ToolError

__all__ = [
    "EPISODE_MEDIA_TYPE",
    "ActionLog",
    "DesktopAgent",
    "desktop_agent_setup",
    "executed_actions",
    "read_actions",
]

EPISODE_MEDIA_TYPE = "application/x-tar"
"""A desktop submission from an agent: ``episode.json`` and the home under ``home/``."""
_BYPASS = re.compile(
    r"\b(open|exec|eval|compile|__import__|os|subprocess|shutil|pathlib|sys|socket)\b"
)
_SLOTS: dict[int, asyncio.Semaphore] = {}
_ACTION_TOOLS = ("computer", "computer_13", "pyautogui")


class ActionLog(Journal):
    """An episode's action journal (``<workspace>/episode/actions.jsonl``), which resume replays.

    One ``action`` event per entry, fsync'd before the agent sees the action's
    result; a torn last line is dropped on read. Logs written before it was a
    journal (plain JSON lines) still read, and are rewritten as one when appended to.
    """

    error_class = TaskEnvironmentError
    FILE = "actions.jsonl"

    @classmethod
    def open_episode(cls, episode_dir: Path) -> ActionLog:
        """The episode's log, open for appending (a log from before the journal converted first)."""
        path = episode_dir / cls.FILE
        if path.is_file() and _is_plain_lines(path.read_bytes()):
            _convert_plain_lines(path)
        return cls.open(path)

    def record(self, entry: dict[str, Any]) -> None:
        """Appends one entry durably (``step`` and ``turn`` among its fields)."""
        self.append("action", entry)

    @staticmethod
    def entry(event: Event) -> dict[str, Any]:
        """An event as the entry `read_actions` returns: its fields and ``wall_s``."""
        return {**event.data, "wall_s": round(event.wall_s, 3)}


def _is_plain_lines(raw: bytes) -> bool:
    """Whether ``raw`` is an action log from before the journal (its first line has no ``v``)."""
    try:
        first = json.loads(raw.split(b"\n", 1)[0])
    except ValueError:
        return False
    return isinstance(first, dict) and "v" not in first


def _plain_entries(raw: bytes) -> list[dict[str, Any]]:
    """The entries of a log from before the journal; a torn line ends it."""
    entries = []
    for line in raw.decode(errors="replace").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            break
    return entries


def _convert_plain_lines(path: Path) -> None:
    """Rewrites a log from before the journal as journal events (``wall_s`` kept), atomically."""
    events = []
    for seq, entry in enumerate(_plain_entries(path.read_bytes())):
        fields = {k: v for k, v in entry.items() if k != "wall_s"}
        events.append(Event(seq, float(entry.get("wall_s") or 0.0), 0.0, "action", fields))
    try:
        write_atomic(path, b"".join(event.to_line() for event in events))
    except OSError as exc:
        raise TaskEnvironmentError(
            f"cannot convert the action log {path}: {exc.strerror or exc}; free disk space and resume"
        ) from None


def read_actions(episode_dir: Path) -> list[dict[str, Any]]:
    """The episode's action journal (``actions.jsonl``), read only; a torn last line is not journalled."""
    path = episode_dir / ActionLog.FILE
    if not path.is_file():
        return []
    raw = path.read_bytes()
    if _is_plain_lines(raw):
        return _plain_entries(raw)
    return [ActionLog.entry(event) for event in ActionLog.read(path)]


def _is_cancelling() -> bool:
    """Whether the running task is being cancelled (a cancelled rollout: its episode is not graded)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def executed_actions(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The journal's actions that reached the desktop (not refused ones, setup, DONE or FAIL)."""
    return [e for e in entries if "code" in e or "wait_s" in e]


class DesktopAgent:
    """One agent's desktop and its tools."""

    def __init__(self, task: DesktopTask, mirror: Path | None, workspace: Path, hooks: AgentHooks,
                 options: DesktopAgentOptions) -> None:  # fmt: skip
        self.task = task
        self.mirror = mirror
        self.hooks = hooks
        self.options = options
        self.workspace = workspace
        self.episode_dir = workspace / "episode"
        self.episode_dir.mkdir(parents=True, exist_ok=True)
        self.session: DesktopSession | None = None
        self._actions: ActionLog | None = None
        self.steps = 0
        self.refused: list[str] = []
        self.bypass_attempts: list[str] = []
        self.ended = False
        self._slot: asyncio.Semaphore | None = None
        self._skip_next = 0
        self.executed = 0
        self.replay_note = ""
        self.replay_mismatch = (self.episode_dir / "replay_mismatch.json").exists()
        self.setup_error: str | None = None
        self.findings: list[Finding] = []

    # -- life ----------------------------------------------------------------------
    async def _desktop(self) -> DesktopSession:
        if self.ended:
            raise ToolError("the episode has ended (done or fail was called)")
        if self.session is None:
            slots = _SLOTS.setdefault(
                self.options.desktops, asyncio.Semaphore(self.options.desktops)
            )
            if slots.locked():
                self.hooks.waiting(
                    f"a desktop slot (all {self.options.desktops} in use; --desktops)"
                )
            try:
                await slots.acquire()
            finally:
                self.hooks.waiting(None)
            self._slot = slots
            config = DesktopConfig(width=self.options.width, height=self.options.height)
            session = await take_pooled(config) or DesktopSession(config)
            self.session = session
            await self._start(session)
        return self.session

    async def _start(self, session: DesktopSession) -> None:
        if not session.is_started:  # a pooled desktop comes started
            await session.start()
        self.setup_error = await run_setup(session, self.task, self.mirror)
        # The accessibility bus starts now, in the setup set, when the end reads the tree.
        if self._needs_tree():
            await self._tree(session)
        # Before the first action (or the replay) nothing of the agent runs: this is the setup set.
        await asyncio.to_thread(session.record_setup)
        log = await asyncio.to_thread(self._action_log)  # opening may convert an old log
        journalled = [ActionLog.entry(event) for event in log.events]
        if not journalled:
            files = await asyncio.to_thread(self._file_states, session)
            await asyncio.to_thread(self._log, {"setup": True, "files": files})
        await self._replay(session, executed_actions(journalled))

    def _file_states(self, session: DesktopSession) -> dict[str, str | None]:
        """The graded files as they are now: SHA-256 of each regular file, None where there is none.

        Read from the host side of the home (no link followed, nothing outside the
        home); these hashes feed the anomaly checks, never the model.
        """
        states: dict[str, str | None] = {}
        home = session.home.resolve()
        for path in self.task.graded_files():
            relative = path.removeprefix("/home/user/")
            states[path] = None
            target = home / relative
            try:
                if not target.resolve().is_relative_to(home):
                    continue
                fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    continue
                states[path] = hashlib.file_digest(handle, "sha256").hexdigest()
        return states

    async def _replay(self, session: DesktopSession, entries: list[dict[str, Any]]) -> None:
        """After a crash: the journalled actions again, in order, on the fresh desktop."""
        if not entries:
            return
        for entry in entries:
            if entry.get("code"):
                await run_action_code(session, entry["code"])
            if entry.get("wait_s"):
                await asyncio.sleep(float(entry["wait_s"]))
            await asyncio.sleep(0.2)
        self.steps = max(int(e.get("step", 0)) for e in entries)
        self._skip_next = max(0, len(entries) - self.hooks.completed_tool_calls(_ACTION_TOOLS))
        expected = entries[-1].get("a11y_sha")
        now = await self._a11y_sha(session)
        if expected and now != expected:
            self.replay_mismatch = True
            (self.episode_dir / "replay_mismatch.json").write_text(json.dumps(
                {"replayed_actions": len(entries), "journalled_a11y_sha": expected, "replayed_a11y_sha": now}))  # fmt: skip
            self.replay_note = (f"[resume] {len(entries)} journalled actions were replayed on a fresh desktop, "
                                "but its state differs from the journal; this run is marked")  # fmt: skip
        else:
            self.replay_note = (
                f"[resume] {len(entries)} journalled actions were replayed on a fresh desktop"
            )

    async def _tree(self, session: DesktopSession) -> str:
        reply = await session.request("accessibility", max_nodes=5000)
        return str(reply.get("xml", "")) if reply.get("ok") else ""

    async def _a11y_sha(self, session: DesktopSession, xml: str | None = None) -> str:
        """A hash of the accessibility table's roles, names and texts (no positions)."""
        table = flatten_accessibility(
            await self._tree(session) if xml is None else xml, max_tokens=50_000
        )
        rows = [tuple(r.split("\t")[:3]) for r in table.splitlines()[1:]]
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()

    async def close(self) -> None:
        """The agent has stopped: end the episode if it did not, then kill the desktop and remove its home.

        Called by the harness while the run's harness still grades. An agent that
        stopped without done or fail (prose replies, reminders spent, a budget
        reached) has its episode ended here the way ``done`` ends it, freeze first,
        and its state submitted graded as it stands (no last action): every run has
        one final verdict. A cancelled run (the calling task is being cancelled) is
        not graded; its desktop is killed all the same.
        """
        try:
            if not self.ended and not _is_cancelling():
                await self._end_unfinished()
        finally:
            await asyncio.shield(self._release())

    async def _end_unfinished(self) -> None:
        """Freezes, snapshots and submits an episode the agent left without done or fail."""
        started = self.session is not None
        self.findings.append(Finding(check="episode_not_ended", severity="warn",
                                     message="the agent stopped without calling done or fail; the final state "
                                             "was frozen and graded as it stands"
                                             + ("" if started else " (the agent never acted: the desktop was "
                                                                   "started and set up for this)")))  # fmt: skip
        session = await self._desktop()  # the agent never acted: the task's setup state is graded
        self.ended = True
        data = await self._finish(session, None)
        await self.hooks.submit(
            Submission(data, name="final-stopped.tar", media_type=EPISODE_MEDIA_TYPE)
        )

    async def _release(self) -> None:
        """Kills the desktop, removes its workspace, frees its slot and closes the action log."""
        session, self.session = self.session, None
        try:
            if session is not None:
                await session.close()
        finally:
            if session is not None:
                await asyncio.to_thread(session.remove)
            if self._slot is not None:
                self._slot.release()
                self._slot = None
            actions, self._actions = self._actions, None
            if actions is not None:
                actions.close()

    # -- observation -----------------------------------------------------------------
    async def _observe(
        self,
        session: DesktopSession,
        note: str,
        xml: str | None = None,
        *,
        zoom: list[int] | None = None,
    ) -> ToolResult:
        png, pointer = await session.screenshot()
        if self.options.observation in ("a11y", "both") and xml is None:
            xml = await self._tree(session)
        return await asyncio.to_thread(self._render, png, pointer, note, xml, zoom)

    def _render(
        self,
        png: bytes,
        pointer: tuple[int, int],
        note: str,
        xml: str | None,
        zoom: list[int] | None = None,
    ) -> ToolResult:
        """The observation's parts: the screenshot downscaled (CPU work: run in a thread), the table.
        ``zoom`` (screen pixels x1, y1, x2, y2, Claude's zoom): that region alone, at the
        screenshot's width."""
        from PIL import Image

        image = Image.open(io.BytesIO(png))
        if zoom is not None:
            crop = image.convert("RGB").crop((zoom[0], zoom[1], zoom[2], zoom[3]))
            wide = self.options.screenshot_width
            size = (wide, round(crop.height * wide / crop.width))
            buffer = io.BytesIO()
            crop.resize(size, Image.Resampling.LANCZOS).save(buffer, format="PNG")
            text = (f"{note}\n" if note else "") + (
                f"zoomed: screen region {zoom[0]},{zoom[1]} to {zoom[2]},{zoom[3]} shown at "
                f"{size[0]}x{size[1]}; pointer at screen {pointer[0]},{pointer[1]}; coordinates "
                "still refer to the full screenshot"
            )
            zoomed: list[TextPart | ImagePart] = [TextPart(text)]
            if self.options.observation in ("screenshot", "both"):
                zoomed.append(ImagePart(buffer.getvalue()))
            return zoomed
        width, height = self._image_size(image.width, image.height)
        if (width, height) != (image.width, image.height):
            buffer = io.BytesIO()
            image.convert("RGB").resize((width, height), Image.Resampling.LANCZOS).save(
                buffer, format="PNG"
            )
            png = buffer.getvalue()
        scale = self.options.width / width
        lines = [note] if note else []
        mapping = (describe(self._convention, (width, height)) if self.options.action_space == "computer_use"
                   else "actions take screen coordinates (multiply screenshot pixels by the scale)")  # fmt: skip
        lines.append(f"screen {self.options.width}x{self.options.height}; screenshot {width}x{height} "
                     f"(scale {scale:.4g}); pointer at screen {pointer[0]},{pointer[1]}; {mapping}")  # fmt: skip
        if self.options.observation in ("a11y", "both"):
            lines.append(
                "accessibility tree (screen coordinates):\n"
                + flatten_accessibility(xml or "", max_tokens=self.options.a11y_tokens)
            )
        parts: list[TextPart | ImagePart] = [TextPart("\n".join(lines))]
        if self.options.observation in ("screenshot", "both"):
            parts.append(ImagePart(png))
        return parts

    # -- actions ---------------------------------------------------------------------
    @property
    def _convention(self) -> str:
        return convention_for(self.options.coordinates)

    def _image_size(self, screen_width: int, screen_height: int) -> tuple[int, int]:
        """The size screenshots are sent at: downscaled to ``screenshot_width``, then as the
        model's convention resizes them (`_coordinates.image_size`)."""
        width = self.options.screenshot_width
        return image_size(self._convention, width, round(screen_height * width / screen_width))

    def _scaled(self, action: dict[str, Any]) -> dict[str, Any]:
        """A computer-use action with its points mapped from the model's convention to the screen."""
        screen = (self.options.width, self.options.height)
        image = self._image_size(*screen)
        scaled = dict(action)
        for key in ("coordinate", "start_coordinate"):
            value = scaled.get(key)
            if (
                isinstance(value, list)
                and len(value) == 2
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            ):
                scaled[key] = list(
                    to_screen(self._convention, value[0], value[1], image=image, screen=screen)
                )
        region = scaled.get("region")
        if (
            isinstance(region, list)
            and len(region) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in region)
        ):
            first = to_screen(self._convention, region[0], region[1], image=image, screen=screen)
            last = to_screen(self._convention, region[2], region[3], image=image, screen=screen)
            scaled["region"] = [*first, *last]
        return scaled

    async def act_batch(self, actions: Any) -> ToolResult:
        """OpenAI's batched computer actions (``actions: [{"type": ...}]``), run in order; one
        observation back, after the last. All are checked before any runs."""
        if not isinstance(actions, list) or not 1 <= len(actions) <= 32:
            raise ToolError("actions must be a list of 1 to 32 OpenAI computer actions")
        try:
            translated = [from_openai(a) for a in actions]
        except ValueError as exc:
            raise ToolError(f"{exc}; none of the batch ran") from None
        result: ToolResult = []
        for index, action in enumerate(translated):
            try:
                result = await self.act(action)
            except ToolError as exc:
                raise ToolError(
                    f"action {index + 1} of {len(translated)}: {exc} (the ones before it ran)"
                ) from None
        return result

    def _action_log(self) -> ActionLog:
        if self._actions is None:
            self._actions = ActionLog.open_episode(self.episode_dir)
        return self._actions

    def _log(self, entry: dict[str, Any]) -> None:
        """Journals one entry durably; called off the event loop (the fsync blocks)."""
        self._action_log().record({"step": self.steps, "turn": self.hooks.turn(), **entry})

    async def act(self, action: Any) -> ToolResult:
        session = await self._desktop()
        self.steps += 1
        if self.options.action_space == "computer_use" and isinstance(action, dict):
            action = self._scaled(action)
        try:
            step = plan(
                action,
                self.options.action_space,
                self.options.track,
                self.options.width,
                self.options.height,
            )
        except ActionError as exc:
            self.refused.append(f"step {self.steps}: {exc}")
            if (
                self.options.track == "gui-only"
                and isinstance(action, str)
                and "gui-only" in str(exc)
                and _BYPASS.search(action)
            ):
                self.bypass_attempts.append(f"step {self.steps}: {action[:300]}")
            await asyncio.to_thread(self._log, {"action": action, "error": str(exc)})
            raise ToolError(str(exc)) from None
        note = ""
        if step.end:
            raise ToolError(f"use the {step.end.lower()} tool to end the episode")
        if self._skip_next:  # its action ran before the crash and was replayed: not again
            self._skip_next -= 1
            return await self._observe(session, self.replay_note)
        self.executed += 1
        if step.code:
            reply = await run_action_code(session, step.code)
            if reply.get("time_limit"):
                return [
                    TextPart(await self._time_limit(action, step.code, str(reply.get("error"))))
                ]
            if not reply.get("ok") or reply.get("error"):
                note = f"the action raised: {reply.get('error')}"
        if step.wait_s:
            await asyncio.sleep(step.wait_s)
        xml = await self._tree(session)
        a11y_sha = await self._a11y_sha(session, xml)
        files = await asyncio.to_thread(self._file_states, session)
        await asyncio.to_thread(self._log, {"action": action, "code": step.code, "wait_s": step.wait_s,
                                "a11y_sha": a11y_sha, "files": files, **({"error": note} if note else {})})  # fmt: skip
        note = "\n".join(n for n in (self.replay_note, note) if n)
        self.replay_note = ""
        zoom = (
            action.get("region")
            if isinstance(action, dict) and action.get("action") == "zoom"
            else None
        )
        return await self._observe(session, note, xml, zoom=zoom)

    async def _time_limit(self, action: Any, code: str, error: str) -> str:
        """An action ran past its time limit: the episode ends there, frozen and graded as it stands."""
        self.findings.append(Finding(check="action_time_limit", severity="warn",
                                     message=f"step {self.steps}: {error}; the episode ended there and is "
                                             "graded as it stands"))  # fmt: skip
        await asyncio.to_thread(self._log, {"action": action, "code": code, "error": error})
        receipt = await self.end(None)
        return f"{error}; the episode has ended and its state was graded: {receipt}"

    # -- submissions ---------------------------------------------------------------------
    def _episode_json(self, last_action: str | None, a11y: str | None,
                      episode: EpisodeResult | None = None) -> dict[str, Any]:  # fmt: skip
        findings = [*self.findings, *(episode.findings if episode else [])]
        return {"task_id": self.task.id, "action_space": self.options.action_space, "track": self.options.track,
                "steps": self.steps, "last_action": last_action, "refused": self.refused,
                "bypass_attempts": self.bypass_attempts, "accessibility_xml": a11y,
                "replay_mismatch": self.replay_mismatch, "executed": self.executed,
                "findings": [f.model_dump() for f in findings], "setup_error": self.setup_error,
                "facts": episode.facts if episode else {},
                "snapshot_manifest": episode.snapshot_manifest if episode else {}}  # fmt: skip

    def _pack(self, home: Path, episode: dict[str, Any]) -> bytes:
        """``episode.json`` and the home under ``home/``; links travel in the manifest, not as tar links
        (tarfile's ``data`` filter refuses one that points outside, which an agent's link may)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            data = json.dumps(episode).encode()
            info = tarfile.TarInfo("episode.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            tar.add(home, arcname="home", recursive=True,
                    filter=lambda member: None if member.issym() or member.islnk() else member)  # fmt: skip
        return buffer.getvalue()

    def _needs_tree(self) -> bool:
        return any(s and s["type"] == "accessibility_tree" for s in self.task.specs("result"))

    async def _snapshot_live(self, session: DesktopSession) -> bytes:
        """The home as it is now: every process of the desktop stopped (and recorded) while it is copied.

        No postconfig runs (the episode goes on); the processes resume after the copy.
        """
        a11y = None
        if self._needs_tree():
            reply = await session.request("accessibility", max_nodes=5000)
            a11y = str(reply["xml"]) if reply.get("ok") else None
        episode = EpisodeResult(
            self.task.id, self.options.action_space, self.options.track, self.episode_dir
        )
        try:
            frozen = await asyncio.to_thread(session.freeze)
            if frozen is None:
                raise ToolError(
                    "the desktop's processes kept forking; it could not be frozen for submit"
                )
            episode.facts = {"processes": [p.to_json() for p in frozen]}
            snapshot = await asyncio.to_thread(
                snapshot_home, session.home, self.episode_dir / "submit-snapshot"
            )
        finally:
            await asyncio.to_thread(session.thaw_all)
        episode.snapshot_manifest = snapshot.manifest
        episode.findings = snapshot_findings(snapshot.manifest)
        return await asyncio.to_thread(
            self._pack, snapshot.path, self._episode_json(None, a11y, episode)
        )

    async def _finish(self, session: DesktopSession, last_action: str | None) -> bytes:
        episode = EpisodeResult(self.task.id, self.options.action_space, self.options.track, self.episode_dir,
                                steps=self.steps, last_action=last_action, setup_error=self.setup_error)  # fmt: skip
        target = await finish(session, self.task, episode, self.mirror,
                              needs_accessibility_tree=self._needs_tree(),
                              snapshot_dir=self.episode_dir / "final-snapshot")  # fmt: skip
        if episode.crashed:  # the home could not be copied: grade an empty one, and say why
            target.mkdir(parents=True, exist_ok=True)
            self.findings.append(
                Finding(check="desktop", severity="block", message=episode.crashed[:2000])
            )
        info = {
            **self._episode_json(last_action, episode.accessibility_xml, episode),
            "final": True,
        }
        return await asyncio.to_thread(self._pack, target, info)

    async def submit(self) -> str:
        session = await self._desktop()
        data = await self._snapshot_live(session)
        return await self.hooks.submit(
            Submission(data, name=f"state-step-{self.steps}.tar", media_type=EPISODE_MEDIA_TYPE)
        )

    async def end(self, last_action: str | None) -> str:
        """Ends the episode with DONE or FAIL (None: an action past its time limit ended it)."""
        session = await self._desktop()
        self.ended = True
        if last_action is not None:
            await asyncio.to_thread(self._log, {"action": last_action})
        data = await self._finish(session, last_action)
        name = f"final-{last_action.lower()}.tar" if last_action else "final-time-limit.tar"
        receipt = await self.hooks.submit(
            Submission(data, name=name, media_type=EPISODE_MEDIA_TYPE)
        )
        await self.close()
        return f"episode ended with {last_action}; {receipt}"


_COMPUTER_USE = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["key", "type", "mouse_move", "left_click", "right_click", "middle_click",
                                              "double_click", "triple_click", "left_click_drag", "scroll", "wait",
                                              "screenshot", "zoom"]},
        "coordinate": {"type": "array", "items": {"type": "number"}, "description": "[x, y] in screenshot pixels"},
        "start_coordinate": {"type": "array", "items": {"type": "number"}},
        "text": {"type": "string", "description": "text to type, or keys such as ctrl+s"},
        "scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
        "scroll_amount": {"type": "integer"},
        "duration": {"type": "number"},
        "region": {"type": "array", "items": {"type": "number"},
                   "description": "zoom: [x1, y1, x2, y2], the region to see closer"},
    },
    "required": ["action"],
}  # fmt: skip
_OPENAI_BATCH = {
    "type": "object",
    "properties": {"actions": {"type": "array", "items": {"type": "object"}, "description": (
        "OpenAI computer actions run in order, one screenshot back: click{x,y,button}, double_click{x,y}, "
        "drag{path:[{x,y}...]}, move{x,y}, scroll{x,y,scroll_x,scroll_y}, keypress{keys:[...]}, type{text}, "
        "wait, screenshot; points in screenshot pixels")}},
    "required": ["actions"],
}  # fmt: skip
_POINT = {
    "screenshot": "[x, y] in screenshot pixels",
    "smart_resize": "[x, y] in pixels of the screenshot as sent",
    "grid999": "[x, y] on a 1000x1000 grid over the screen, 0..999",
    "fraction": "[x, y] as fractions of the screen's width and height, 0..1",
}


def _computer_use_schema(convention: str, coordinates: str) -> dict[str, Any]:
    """The computer tool's parameters, its points described in the model's convention; for
    ``coordinates=openai``, OpenAI's batched actions."""
    if coordinates == "openai":
        return _OPENAI_BATCH
    if convention == "screenshot":
        return _COMPUTER_USE
    properties: dict[str, Any] = dict(cast(dict[str, Any], _COMPUTER_USE["properties"]))
    for key in ("coordinate", "start_coordinate"):
        properties[key] = {**properties[key], "description": _POINT[convention]}
    return {**_COMPUTER_USE, "properties": properties}


_COMPUTER_13 = {
    "type": "object",
    "properties": {
        "action_type": {"type": "string", "enum": ["MOVE_TO", "CLICK", "MOUSE_DOWN", "MOUSE_UP", "RIGHT_CLICK",
                                                   "DOUBLE_CLICK", "DRAG_TO", "SCROLL", "TYPING", "PRESS", "KEY_DOWN",
                                                   "KEY_UP", "HOTKEY", "WAIT"]},
        "parameters": {"type": "object", "description": "x, y, button, num_clicks, dx, dy, text, key or keys"},
    },
    "required": ["action_type"],
}  # fmt: skip
SYSTEM_PROMPT = (
    "You operate a Linux desktop (LibreOffice, a text editor, a terminal) through its screen. Each action returns "
    "a new screenshot and, when enabled, the accessibility tree as a table with screen coordinates. Work through "
    "the GUI. Call submit to have the current state graded while you continue, done when the task is complete, and "
    "fail if the task cannot be done. Files are graded as saved on disk."
)


def desktop_agent_setup(
    task: DesktopTask, mirror: Path | None, workspace: Path, hooks: AgentHooks
) -> AgentSetup:
    options = DesktopAgentOptions.from_options(dict(hooks.options))
    agent = DesktopAgent(task, mirror, workspace, hooks, options)

    async def computer(args: dict[str, Any]) -> ToolResult:
        if "actions" in args and "action" not in args:  # OpenAI's GA tool: several actions per call
            return await agent.act_batch(args["actions"])
        return await agent.act(args)

    async def computer_13(args: dict[str, Any]) -> ToolResult:
        return await agent.act(args if args.get("action_type") != "WAIT" else "WAIT")

    async def pyautogui(args: dict[str, Any]) -> ToolResult:
        code = args.get("code")
        if not isinstance(code, str):
            raise ToolError("pyautogui needs code: a string of Python")
        return await agent.act(code)

    async def submit(_: dict[str, Any]) -> ToolResult:
        return await agent.submit()

    async def done(_: dict[str, Any]) -> ToolResult:
        return await agent.end("DONE")

    async def fail(_: dict[str, Any]) -> ToolResult:
        return await agent.end("FAIL")

    action_tool = {
        "computer_use": Tool("computer", "Act on the desktop (computer-use actions); returns the new observation.",
                             _computer_use_schema(convention_for(options.coordinates), options.coordinates), computer),
        "computer_13": Tool("computer_13", "One OSWorld computer_13 action; returns the new observation.", _COMPUTER_13,
                            computer_13),
        "pyautogui": Tool("pyautogui", f"Run pyautogui code on the desktop ({options.track} track); returns the new "
                          "observation.", {"type": "object", "properties": {"code": {"type": "string"}},
                                           "required": ["code"]}, pyautogui),
    }[options.action_space]  # fmt: skip
    empty = {"type": "object", "properties": {}, "required": []}
    tools = [
        action_tool,
        Tool("submit", "Grade the current state in isolation while the episode goes on.", empty, submit),
        Tool("done", "The task is complete: end the episode; its final state is graded.", empty, done, ends_run=True),
        Tool("fail", "The task cannot be done: end the episode with FAIL.", empty, fail, ends_run=True),
    ]  # fmt: skip
    first = {"computer_use": 'computer with {"action": "screenshot"}', "computer_13": 'computer_13 with {"action_type": "WAIT"}',
             "pyautogui": 'pyautogui with {"code": "pyautogui.position()"}'}[options.action_space]  # fmt: skip
    prompt = (f"Task: {task.instruction}\n\nThe desktop starts when you first act; call {first} to see it. "
              f"Action space: {options.action_space}; track: {options.track}.")  # fmt: skip
    return AgentSetup(
        tools=tools, system_prompt=SYSTEM_PROMPT, task_prompt=prompt, close=agent.close
    )
