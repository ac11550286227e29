"""Grading a desktop episode in isolation, and the task audit.

Threat model
============
The agent controls everything inside its desktop: on the ``code`` track it runs
any code as the desktop user; on the ``gui-only`` track only pyautogui input
calls reach the desktop, but through them it can drive a terminal. Its goal may
be a score it did not earn.

Covered:

* **Checks run on a frozen snapshot, outside the sandbox.** After the actions
  and the task's ``postconfig``, every process of the episode is killed (its
  pid namespace dies with the jail's pid 1; the uid is swept), then the home is
  copied: regular files and directories only, no link followed, read-only. A
  background process left behind cannot change the snapshot: none is alive.
* **Getters and metrics run in a grading jail**: another reserved uid, no
  network, the snapshot read-only at ``/home/user``, the expected files at
  ``/expected``, the grader's own Python and the system's binaries with
  ``PATH=/usr/bin:/bin``. ``vm_command_line`` commands run there, without a
  shell profile (``bash --noprofile --norc``) and without the home's programs on
  the PATH: an ``echo`` in ``.bashrc`` or a stub program named like the one a
  check runs answers nothing. Parsing an adversarial file (xlsx, docx, pptx,
  pdf) happens in that jail, not in the trusted process.
* **Gold never enters the sandbox.** The task JSON, the mirror and the expected
  files are never mounted in the desktop's jail; downloads are copied in through
  the controller. ``cloud_file`` reads the mirror directly (each grading copies
  what it needs into its own expected folder), so a file the agent plants in a
  cache is never read as "expected".
* **gui-only track**: code other than pyautogui input calls and ``time.sleep``
  with literal arguments is refused before it reaches the desktop (so the graded
  file cannot be written by code); each refusal is a finding and in the log.
* **FAIL**: scores 1 only on an infeasible task and only as the last action; on a
  feasible task it scores 0 (OSWorld's rule). The audit runs a FAIL-only and a
  do-nothing episode per task, so a task that a lazy agent passes is flagged.

Not covered:

* The ``accessibility_tree`` getter reads the live desktop (before the freeze),
  through the controller the agent shares a uid with; on the ``code`` track the
  agent could forge it. Findings say so when a task uses it.
* Observations (screenshots, trees) come from inside the desktop and are the
  agent's own view; nothing is graded from them.
* A GUI-driven terminal is a GUI: on the ``gui-only`` track an agent can still
  type a shell command into xterm. The track limits action *code*, not what the
  applications on the desktop can do.
* Side channels between concurrent episodes on one machine (CPU, memory
  pressure) and kernel exploits against the namespaces.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentinfra.environments import Finding, Outcome
from agentinfra.environments.desktop._episode import EpisodeResult
from agentinfra.environments.desktop._task import DesktopTask, mirror_path
from agentinfra.errors import TaskEnvironmentError, UidExhaustedError
from agentinfra.sandbox import (
    JailLimits,
    JailSpec,
    kill_uid,
    python_runtime_paths,
    reserve_uid,
    system_library_paths,
)

__all__ = ["GRADER_DISTRIBUTIONS", "GRADER_VERSION", "DesktopVerdict", "grade_episode"]

GRADER_VERSION = "desktop-1"
VERDICT_SCHEMA_VERSION = 1
GRADER_DISTRIBUTIONS = (
    "openpyxl",
    "python-docx",
    "python-pptx",
    "rapidfuzz",
    "pypdf",
    "lxml",
    "pillow",
)
"""What the grading jail imports (and their declared dependencies)."""
_EVALUATE = Path(__file__).resolve().parent / "_evaluate.py"
_GRADING_TIMEOUT_S = 120


@dataclass(slots=True)
class DesktopVerdict:
    """One graded episode."""

    task_id: str
    outcome: Outcome
    score: float
    steps: int
    track: str
    action_space: str
    episode_dir: str
    findings: list[Finding] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": VERDICT_SCHEMA_VERSION,
            "task_id": self.task_id,
            "outcome": self.outcome.value,
            "score": self.score,
            "steps": self.steps,
            "track": self.track,
            "action_space": self.action_space,
            "findings": [f.model_dump() for f in self.findings],
            "episode_dir": self.episode_dir,
            "provenance": self.provenance,
            "details": self.details,
        }


def _getter(
    spec: dict[str, Any] | None, expected_dir: Path, mirror: Path | None, a11y: str | None
) -> dict[str, Any] | None:
    """A getter spec resolved to what the grading jail reads: a file, a value or a command."""
    if spec is None:
        return None
    kind = spec["type"]
    if kind == "vm_file":
        paths = spec["path"]
        return {"kind": "file", "path": paths}
    if kind == "cloud_file":
        urls = spec["path"] if isinstance(spec["path"], list) else [spec["path"]]
        given = spec.get("dest")
        dests: list[Any] = given if isinstance(given, list) else [given] * len(urls)
        inside = []
        for index, (url, dest) in enumerate(zip(urls, dests, strict=True)):
            if mirror is None:
                raise TaskEnvironmentError(f"expected file {url} needs a mirror (--mirror DIR)")
            source = mirror_path(mirror, str(url))
            if not source.is_file():
                raise TaskEnvironmentError(f"expected file {url} is not in the mirror {mirror}")
            name = f"{index}_{Path(str(dest or source.name)).name}"
            shutil.copyfile(source, expected_dir / name)
            (expected_dir / name).chmod(0o444)
            inside.append(f"/expected/{name}")
        return {"kind": "file", "path": inside if isinstance(spec["path"], list) else inside[0]}
    if kind == "rule":
        return {"kind": "value", "value": spec.get("rules")}
    if kind == "rule_relativeTime":
        return {"kind": "value", "value": _relative_time(spec.get("rules") or {})}
    if kind == "vm_command_line":
        return {"kind": "command", "command": spec["command"], "shell": bool(spec.get("shell"))}
    if kind == "accessibility_tree":
        return {"kind": "value", "value": a11y}
    raise TaskEnvironmentError(f"getter {kind!r} is not implemented")


def _relative_time(rules: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's rule_relativeTime: ``relativeTime.from`` (today, yesterday, tomorrow) formatted with ``expected``."""
    relative = rules.get("relativeTime") or {}
    offsets = {"today": 0, "yesterday": -1, "tomorrow": 1}
    origin = relative.get("from", "today")
    if origin not in offsets:
        raise TaskEnvironmentError(
            f"rule_relativeTime from {origin!r} is not implemented (today, yesterday, tomorrow)"
        )
    day = dt.date.today() + dt.timedelta(days=offsets[origin])
    expected = rules.get("expected") or {}
    return {
        **rules,
        "expected": {k: day.strftime(v) if isinstance(v, str) else v for k, v in expected.items()},
    }


def _run_checks(task: DesktopTask, episode: EpisodeResult, mirror: Path | None) -> dict[str, Any]:
    assert episode.snapshot is not None
    workspace = Path(tempfile.mkdtemp(prefix="agentinfra-grading-"))
    expected_dir = workspace / "expected"
    expected_dir.mkdir()
    try:
        request = {
            "funcs": task.funcs,
            "results": [
                _getter(s, expected_dir, mirror, episode.accessibility_xml)
                for s in task.specs("result")
            ],
            "expected": [
                _getter(s, expected_dir, mirror, episode.accessibility_xml)
                for s in task.specs("expected")
            ],
            "options": [s or {} for s in task.specs("options")],
        }
        os.chmod(workspace, 0o711)
        os.chmod(expected_dir, 0o555)
        try:
            uid, lock = reserve_uid()
        except UidExhaustedError as exc:
            raise TaskEnvironmentError(f"{exc}; grade fewer episodes at once") from exc
        try:
            for path in [episode.snapshot, *episode.snapshot.rglob("*")]:
                os.lchown(
                    path, uid, uid
                )  # the grading uid reads with the episode's permission bits
            spec = JailSpec(
                argv=(sys.executable, "-I", "/tmp/work/evaluate.py"),
                env={
                    "PATH": "/usr/bin:/bin",
                    "HOME": "/tmp/work",
                    "LANG": "C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE": "1",
                },
                uid=uid,
                ro_paths=python_runtime_paths(GRADER_DISTRIBUTIONS)
                + system_library_paths()
                + ("/usr/bin", "/bin"),
                binds=((str(episode.snapshot), "/home/user"), (str(expected_dir), "/expected")),
                copy_in=((str(_EVALUATE), "evaluate.py"),),
                limits=JailLimits(
                    memory_limit_bytes=4 << 30, max_processes=64, cpu_limit_s=_GRADING_TIMEOUT_S
                ),
            )
            try:
                done = subprocess.run(spec.command("namespaces+uid"), input=json.dumps(request).encode(),
                                      capture_output=True, timeout=_GRADING_TIMEOUT_S, check=False)  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                raise TaskEnvironmentError(
                    f"grading checks ran past {_GRADING_TIMEOUT_S} s"
                ) from exc
            finally:
                kill_uid(uid)
        finally:
            os.close(lock)
        if done.returncode != 0:
            raise TaskEnvironmentError(
                f"grading checks failed (exit {done.returncode}): {done.stderr.decode(errors='replace')[-1500:]}"
            )
        reply = json.loads(done.stdout)
        if not isinstance(reply, dict) or len(reply.get("scores", [])) != len(task.funcs):
            raise TaskEnvironmentError("grading checks returned a malformed reply")
        return reply
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _combine(task: DesktopTask, scores: list[float]) -> float:
    if task.evaluator.get("conj", "and") == "or":
        return max(scores)
    return sum(scores) / len(scores)


def grade_episode(task: DesktopTask, episode: EpisodeResult, mirror: Path | None, *,
                  provenance: dict[str, Any] | None = None) -> DesktopVerdict:  # fmt: skip
    """Scores ``episode`` by ``task``'s evaluator, OSWorld's way, on the frozen snapshot."""
    verdict = DesktopVerdict(
        task_id=task.id, outcome=Outcome.FAILED, score=0.0, steps=episode.steps, track=episode.track,
        action_space=episode.action_space, episode_dir=str(episode.episode_dir),
        provenance={"grader_version": GRADER_VERSION, "task_sha256": hashlib.sha256(task.path.read_bytes()).hexdigest(),
                    "task_path": str(task.path), "mirror": str(mirror) if mirror else None, **(provenance or {})},
    )  # fmt: skip
    for refusal in episode.refused:
        verdict.findings.append(
            Finding(check="action_refused", severity="warn", message=refusal[:500])
        )
    if episode.crashed:
        verdict.outcome = Outcome.CRASHED
        verdict.findings.append(
            Finding(check="desktop", severity="warn", message=episode.crashed[:2000])
        )
        return verdict
    if (
        "accessibility_tree" in [s["type"] for s in task.specs("result") if s]
        and episode.track == "code"
    ):
        verdict.findings.append(Finding(
            check="accessibility_tree_trust", severity="warn",
            message="this task reads the live accessibility tree, which code-track actions could forge",
        ))  # fmt: skip
    if task.infeasible:
        verdict.score = 1.0 if episode.last_action == "FAIL" else 0.0
    elif episode.last_action == "FAIL":
        verdict.score = 0.0
        verdict.findings.append(Finding(check="fail_on_feasible", severity="warn",
                                        message="the episode ended with FAIL on a feasible task: score 0"))  # fmt: skip
    else:
        try:
            reply = _run_checks(task, episode, mirror)
        except TaskEnvironmentError as exc:
            verdict.outcome = Outcome.GRADER_ERROR
            verdict.findings.append(
                Finding(check="grader", severity="block", message=str(exc)[:2000])
            )
            return verdict
        scores = [float(s) for s in reply["scores"]]
        verdict.details["metric_scores"] = (
            dict(zip(task.funcs, scores, strict=False))
            if len(set(task.funcs)) == len(task.funcs)
            else scores
        )
        for error in reply.get("errors", []):
            if error:
                verdict.findings.append(
                    Finding(check="metric_error", severity="warn", message=str(error)[:1000])
                )
        verdict.score = _combine(task, scores)
    verdict.outcome = Outcome.PASSED if verdict.score >= 1.0 else Outcome.FAILED
    verdict.details["last_action"] = episode.last_action
    verdict.details["setup_s"] = round(episode.setup_s, 3)
    return verdict
