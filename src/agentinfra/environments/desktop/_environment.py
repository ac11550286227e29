"""The desktop behind the environment seam, scripted episodes, and the task audit."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentinfra import __version__
from agentinfra.environments import (
    AgentHooks,
    AgentSetup,
    EnvironmentDefinition,
    Evaluation,
    Finding,
    Outcome,
    ScoreSpec,
    Submission,
    Task,
)
from agentinfra.environments.desktop._actions import ACTION_SPACES, TRACKS
from agentinfra.environments.desktop._agent import EPISODE_MEDIA_TYPE, desktop_agent_setup
from agentinfra.environments.desktop._anomalies import desktop_anomalies
from agentinfra.environments.desktop._episode import EpisodeResult, run_episode
from agentinfra.environments.desktop._grading import GRADER_VERSION, DesktopVerdict, grade_episode
from agentinfra.environments.desktop._options import (
    DesktopAgentOptions,
    DesktopSettings,
    desktop_settings,
)
from agentinfra.environments.desktop._session import DesktopConfig
from agentinfra.environments.desktop._task import DesktopTask, load_desktop_task, support
from agentinfra.errors import ConfigError, TaskEnvironmentError

__all__ = [
    "ENVIRONMENT",
    "SCORE",
    "AuditRow",
    "DesktopEnvironment",
    "audit_task",
    "default_mirror",
    "load_actions",
    "run_scripted",
]

SCORE = ScoreSpec(unit="success", thresholds=(1.0,), scale="linear")
_MAX_TASK_BYTES = 1 << 20


def default_mirror(task_path: Path, configured: Path | None = None) -> Path | None:
    """``configured`` (a run's `DesktopSettings.mirror`, the CLI's ``AGENTINFRA_DESKTOP_MIRROR``),
    else a ``mirror/`` folder beside the task's folder, if there is one."""
    if configured is not None:
        return configured
    candidate = Path(task_path).resolve().parent.parent / "mirror"
    return candidate if candidate.is_dir() else None


def load_actions(document: Any, *, source: str = "actions") -> tuple[str, list[Any]]:
    """``{"action_space", "actions"}`` checked; returns both. Raises `ConfigError` naming what is wrong."""
    if not isinstance(document, dict) or "actions" not in document:
        raise ConfigError(f'{source} must be an object with "action_space" and "actions"')
    space = document.get("action_space", "computer_13")
    if space not in ACTION_SPACES:
        raise ConfigError(
            f"{source}: unknown action_space {space!r}; use one of {', '.join(ACTION_SPACES)}"
        )
    actions = document["actions"]
    if not isinstance(actions, list):
        raise ConfigError(f'{source}: "actions" must be a list')
    return str(space), actions


def run_scripted(
    task: DesktopTask,
    action_space: str,
    actions: list[Any],
    *,
    mirror: Path | None,
    track: str = "gui-only",
    episode_dir: Path,
    config: DesktopConfig | None = None,
    accessibility: bool = True,
) -> DesktopVerdict:
    """One episode from a scripted action list, graded; an unsupported task is ``invalid`` with the reason."""
    if track not in TRACKS:
        raise ConfigError(f"unknown track {track!r}; use one of {', '.join(TRACKS)} (--track)")
    supported = support(task, mirror)
    if not supported.supported:
        return DesktopVerdict(task_id=task.id, outcome=Outcome.INVALID, score=0.0, steps=0, track=track,
                              action_space=action_space, episode_dir=str(episode_dir),
                              findings=[Finding(check="unsupported", severity="warn", message=supported.reason)])  # fmt: skip
    needs_tree = any(s and s["type"] == "accessibility_tree" for s in task.specs("result"))
    started = time.monotonic()
    episode = asyncio.run(run_episode(task, actions, action_space=action_space, track=track, episode_dir=episode_dir,
                                      mirror=mirror, config=config, accessibility=accessibility,
                                      needs_accessibility_tree=needs_tree))  # fmt: skip
    graded = time.monotonic()
    config = config or DesktopConfig()
    verdict = grade_episode(task, episode, mirror, provenance={
        "agentinfra_version": __version__, "sandbox": "namespaces+uid",
        "screen": f"{config.width}x{config.height}",
        "actions_sha256": hashlib.sha256(json.dumps(actions, sort_keys=True).encode()).hexdigest(),
    })  # fmt: skip
    verdict.details["timings_s"] = {
        "setup": round(episode.setup_s, 3), "first_observation": round(episode.first_observation_s, 3),
        "episode": round(graded - started, 3), "grading": round(time.monotonic() - graded, 3),
        "action_and_screenshot": [round(v, 4) for v in episode.timings.get("action_and_screenshot_s", [])],
    }  # fmt: skip
    (episode_dir / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=2))
    return verdict


@dataclass(frozen=True, slots=True)
class AuditRow:
    task_id: str
    path: str
    do_nothing_score: float | None
    fail_score: float | None
    solution_score: float | None
    flagged: bool
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "path": self.path, "do_nothing_score": self.do_nothing_score,
                "fail_score": self.fail_score, "solution_score": self.solution_score,
                "flagged": self.flagged, "reasons": list(self.reasons)}  # fmt: skip


def audit_task(
    task: DesktopTask, mirror: Path | None, workdir: Path, *, config: DesktopConfig | None = None
) -> AuditRow:
    """Three checks: do-nothing scores 0; FAIL-only scores 1 only if infeasible; the scripted solution scores 1.

    The do-nothing and FAIL-only episodes leave the desktop in the same state (FAIL
    does nothing to it), so one episode ending in FAIL is graded both ways.
    """
    reasons: list[str] = []
    supported = support(task, mirror)
    if not supported.supported:
        return AuditRow(
            task.id, str(task.path), None, None, None, True, (f"unsupported: {supported.reason}",)
        )
    idle = asyncio.run(run_episode(task, ["FAIL"], action_space="computer_13", track="gui-only",
                                   episode_dir=workdir / "idle", mirror=mirror, config=config, accessibility=False))  # fmt: skip
    fail_score = grade_episode(task, idle, mirror).score
    idle.last_action = None
    do_nothing = grade_episode(task, idle, mirror)
    solution = task.solution()
    solution_score: float | None = None
    if solution is None:
        reasons.append('no scripted solution ("solution": {"action_space", "actions"})')
    else:
        space, actions = load_actions(solution, source=f"task {task.id} solution")
        solved = run_scripted(task, space, actions, mirror=mirror, track=str(solution.get("track", "gui-only")),
                              episode_dir=workdir / "solution", config=config, accessibility=False)  # fmt: skip
        solution_score = solved.score
        if solved.score < 1.0:
            reasons.append(f"scripted solution scores {solved.score:g} ({solved.outcome.value})")
    if do_nothing.outcome is Outcome.GRADER_ERROR:
        reasons.append(
            f"grader error: {do_nothing.findings[-1].message if do_nothing.findings else ''}"
        )
    if do_nothing.score > 0:
        reasons.append(f"a do-nothing episode scores {do_nothing.score:g}")
    if task.infeasible and fail_score != 1.0:
        reasons.append(f"FAIL on this infeasible task scores {fail_score:g}")
    if not task.infeasible and fail_score > 0:
        reasons.append(f"FAIL on this feasible task scores {fail_score:g}")
    return AuditRow(
        task.id,
        str(task.path),
        do_nothing.score,
        fail_score,
        solution_score,
        bool(reasons),
        tuple(reasons),
    )


def audit(
    paths: list[Path], mirror: Path | None, *, workers: int = 2, config: DesktopConfig | None = None
) -> list[AuditRow]:
    """`audit_task` on every task, ``workers`` desktops at once, in the order given.

    A file that is not a task (unknown setup type or func, not JSON) is a flagged
    row with the reason; the other tasks are audited as usual.
    """

    def one(index: int, path: Path) -> AuditRow:
        try:
            task = load_desktop_task(path)
        except TaskEnvironmentError as exc:
            return AuditRow(path.stem, str(path), None, None, None, True, (f"refused: {exc}",))
        return audit_task(
            task, mirror or default_mirror(task.path), Path(folder) / f"{index:03d}", config=config
        )

    with (
        tempfile.TemporaryDirectory(prefix="agentinfra-audit-") as folder,
        ThreadPoolExecutor(max(1, workers)) as pool,
    ):
        futures = [pool.submit(one, i, Path(p)) for i, p in enumerate(paths)]
        return [f.result() for f in futures]


def load_desktop_task_bytes(path: Path) -> Task:
    """A task file as a seam `Task` (the JSON bytes; checked by `load_desktop_task`)."""
    if not Path(path).is_file():
        raise ConfigError(f"task {path} does not exist or is not a file (--task)")
    data = Path(path).read_bytes()
    if len(data) > _MAX_TASK_BYTES:
        raise ConfigError(
            f"task {path} has {len(data)} bytes; a task file may have at most {_MAX_TASK_BYTES}"
        )
    load_desktop_task(Path(path))
    return Task(name=Path(path).name, data=data, source=str(Path(path).resolve()))


class DesktopEnvironment:
    """One OSWorld-format task. A submission is an actions document (``application/json``):
    ``{"action_space", "actions", "track"}``; evaluating it plays a fresh episode and grades it."""

    name = "desktop"
    grader_version = GRADER_VERSION
    score = SCORE

    def __init__(self, task: Task, settings: DesktopSettings) -> None:
        self.task = task
        self.settings = settings
        source = Path(task.source) if task.source else Path(task.name)
        self._desktop_task = DesktopTask(json.loads(task.data), source)
        self.mirror = default_mirror(
            source, None if settings.mirror is None else Path(settings.mirror)
        )

    async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
        if submission.media_type == EPISODE_MEDIA_TYPE:
            verdict = await asyncio.to_thread(
                grade_episode_archive, self._desktop_task, submission.data, self.mirror
            )
            return evaluation_of(verdict)
        if submission.media_type != "application/json":
            raise TaskEnvironmentError(
                "a desktop submission is an actions document (application/json) or an agent's episode "
                f"({EPISODE_MEDIA_TYPE}), not {submission.media_type}"
            )
        try:
            document = json.loads(submission.data)
        except ValueError as exc:
            raise TaskEnvironmentError(f"desktop submission is not JSON: {exc}") from exc
        space, actions = load_actions(document, source="submission")
        track = str(document.get("track", "gui-only"))
        with tempfile.TemporaryDirectory(prefix="agentinfra-episode-") as folder:
            verdict = await asyncio.to_thread(run_scripted, self._desktop_task, space, actions, mirror=self.mirror,
                                              track=track, episode_dir=Path(folder), accessibility=False)  # fmt: skip
        return evaluation_of(verdict)

    def agent_view(self, evaluation: Evaluation) -> dict[str, Any]:
        return {"outcome": evaluation.outcome.value, "score": evaluation.score,
                "findings": [{"check": f.check, "message": f.message} for f in evaluation.findings]}  # fmt: skip

    def agent_setup(self, workspace: Path, hooks: AgentHooks) -> AgentSetup:
        return desktop_agent_setup(self._desktop_task, self.mirror, workspace, hooks)


def grade_episode_archive(task: DesktopTask, data: bytes, mirror: Path | None) -> DesktopVerdict:
    """Grades an agent's episode archive (``episode.json`` + ``home/``), made by `DesktopAgent`.

    The archive is unpacked with tarfile's ``data`` filter (no links out, no
    devices, no absolute paths, no set-id bits). Code refused on the gui-only
    track that reached for files or processes flags the verdict.
    """
    with tempfile.TemporaryDirectory(prefix="agentinfra-episode-") as folder:
        root = Path(folder)
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
                archive.extractall(root, filter="data")
            info = json.loads((root / "episode.json").read_text())
        except (tarfile.TarError, OSError, ValueError) as exc:
            raise TaskEnvironmentError(f"desktop episode archive is unreadable: {exc}") from exc
        home = root / "home"
        home.mkdir(exist_ok=True)
        manifest = info.get("snapshot_manifest") or {}
        _restore_links(home, manifest.get("symlinks") or {})
        episode = EpisodeResult(task.id, str(info.get("action_space")), str(info.get("track")), root,
                                snapshot=home, steps=int(info.get("steps", 0)), last_action=info.get("last_action"),
                                refused=[str(r) for r in info.get("refused", [])][:50],
                                accessibility_xml=info.get("accessibility_xml"),
                                findings=[Finding.model_validate(f) for f in info.get("findings") or []][:50],
                                setup_error=info.get("setup_error"), facts=info.get("facts") or {},
                                snapshot_manifest=manifest)  # fmt: skip
        verdict = grade_episode(task, episode, mirror, provenance={"agentinfra_version": __version__,
                                                                   "sandbox": "namespaces+uid"})  # fmt: skip
        attempts = [str(a) for a in info.get("bypass_attempts", [])]
        if attempts:
            verdict.findings.append(Finding(
                check="gui_only_bypass", severity="block",
                message=f"{len(attempts)} action(s) on the gui-only track tried code that reaches files or processes",
                evidence="\n".join(attempts[:5])[:2000],
            ))  # fmt: skip
            verdict.outcome = Outcome.HACK_FLAGGED
        if info.get("replay_mismatch"):
            verdict.findings.append(Finding(
                check="resume_replay_mismatch", severity="warn",
                message="after a crash the replayed actions gave a different desktop state than the journal",
            ))  # fmt: skip
        if verdict.outcome is Outcome.PASSED and int(info.get("executed", 1)) == 0:
            verdict.findings.append(Finding(
                check="success_without_action", severity="warn",
                message="the task passed without any action reaching the desktop: it may pass by itself "
                        "(`agentinfra desktop audit` checks its do-nothing baseline)",
            ))  # fmt: skip
        verdict.details["final"] = info.get("final") is True or info.get("last_action") is not None
        return verdict


def _restore_links(home: Path, links: dict[str, Any]) -> None:
    """Makes the snapshot's symbolic links again in an unpacked home (the archive carries them in its
    manifest): targets verbatim, never followed; a link whose folder is missing or is itself a link
    is skipped (the manifest came with the archive and is checked like it)."""
    for relative, target in list(links.items())[:100_000]:
        parts = str(relative).split("/")
        if not isinstance(target, str) or any(p in ("", ".", "..") for p in parts):
            continue
        folder = home
        for part in parts[:-1]:
            folder = folder / part
            if folder.is_symlink() or not folder.is_dir():
                break
        else:
            with contextlib.suppress(OSError):
                os.symlink(target, folder / parts[-1])


def evaluation_of(verdict: DesktopVerdict) -> Evaluation:
    return Evaluation(
        environment="desktop", outcome=verdict.outcome, correct=verdict.score >= 1.0, score=verdict.score,
        score_unit=SCORE.unit, findings=list(verdict.findings), provenance=verdict.provenance,
        details={"task_id": verdict.task_id, "steps": verdict.steps, "track": verdict.track,
                 "action_space": verdict.action_space, **verdict.details},
    )  # fmt: skip


ENVIRONMENT = EnvironmentDefinition(
    name="desktop",
    description="OSWorld-format tasks on a real X desktop in a jail; the score is OSWorld's (0..1)",
    grader_version=GRADER_VERSION,
    score=SCORE,
    load_task=load_desktop_task_bytes,
    settings=DesktopSettings,
    create=DesktopEnvironment,
    settings_from=desktop_settings,
    agent_options=DesktopAgentOptions,
    find_anomalies=desktop_anomalies,
)
