"""Grading a desktop episode in isolation, and the task audit.

Threat model
============
The agent controls everything inside its desktop: on the ``code`` track it runs
any code as the desktop user (and can patch the in-jail controller); on the
``gui-only`` track only pyautogui input calls reach the desktop, but through them
it can drive a terminal. Its goal may be a score it did not earn. Three parties
take part, each in its own jail with its own uid: the desktop (the agent), the
probe (whatever a check executes: anything the agent could have written), and
the grading jail (the code that sees the gold).

Covered:

* **The freeze comes first.** When the episode ends (DONE, FAIL, the budget, a
  crash, an action past its time limit), every process of the desktop's uid is
  stopped (SIGSTOP) before anything else; the supervisor records the facts the
  grader needs (the process list) from the host's ``/proc``, not through the
  controller; every process started after setup is killed; only the setup's own
  applications are resumed, for the postconfig steps that must act on them (save,
  close a window). Then the jail dies (its pid namespace with its pid 1; the uid
  is swept) and the home is copied. No process of the agent is alive when
  postconfig runs, when the copy is made, or when the checks run.
* **Downloads never touch the live home.** A postconfig ``download`` (a checker,
  the gold) is written from the mirror into the frozen snapshot, in the grader's
  space, following no symbolic link at any component; whatever the agent left at
  that path is replaced by the mirror's bytes; a relative path is under the home
  (the controller's and the probe's working folder), and a ``chmod`` step of
  what was downloaded (OSWorld's ``chmod +x eval.sh``) sets the snapshot's
  recorded modes. A task whose live postconfig step follows a download is
  unsupported (its effect would depend on the download). A downloaded shell
  checker that a check runs is read (never run here) for what it needs: live
  state or paths the probe does not have make the task unsupported.
* **The snapshot keeps what matters and says what it drops.** Symbolic links are
  kept as links (never followed, by the copy or by the grader: a file getter
  whose real path leaves the home reads as no file); permission bits are recorded
  in the manifest and restored in the probe's copy, while contents stay readable
  to the grader; sparse files stay sparse; the walk has a depth bound and no
  recursion limit. A budget overrun or a chain past the depth bound is a blocking
  finding (score 0), never a silent drop: a file cannot be hidden by crowding it
  out.
* **What a check executes runs in the probe jail** (`_probe.py`): its own uid, a
  fresh pid namespace per command (it can neither see nor ptrace the grader, nor
  prepare the next command), no network, a private writable copy of the snapshot
  at ``/home/user`` made afresh per command, the desktop's system view
  (``/usr``, ``/etc/alternatives``, fonts; so ``awk``, ``which``, ``vi`` and the
  gsettings schemas resolve as in the desktop, and ``gsettings`` reads the
  episode's dconf database from the copy), the recorded facts read-only, and
  never ``/expected``, the mirror or the task. Interpreters start isolated:
  Python as ``python -I`` (no user site, no ``.pth``/``usercustomize`` from the
  home, no ``PYTHON*`` variables, no script folder on ``sys.path``), bash without
  profiles, in a clean environment (``SHELL``, ``HOME``, ``USER``, ``PATH`` as in
  the desktop, less its virtual environment). Only stdout comes back, at most
  1 MiB and 30 s per command (90 s in all); a command cut short counts as no
  output and is a finding. A postconfig ``execute``/``command`` step whose
  ``stdout`` a ``cache_file`` getter reads is such a check too, not a live step:
  it runs here after the other postconfig steps (they must come first), and its
  output reaches the metric as a file of its own, as OSWorld's cache holds it.
* **The grading jail executes nothing from the home**: another reserved uid, no
  network, the snapshot read-only at ``/home/user``, the expected files at
  ``/expected``, the grader's own Python and libraries, no ``PATH``. Commands'
  outputs arrive as values. Parsing an adversarial file (xlsx, docx, pptx, pdf)
  happens there, not in the trusted process.
* **Gold never enters the desktop or the probe.** The task JSON, the mirror and
  the expected files are never mounted in either; ``cloud_file`` reads the
  mirror directly (each grading copies what it needs into its own expected
  folder), so a file the agent plants in a cache is never read as "expected".
* **Always one verdict.** A postconfig step that fails is ``failed`` with a
  ``postconfig_failed`` finding naming the step; a failed task setup is
  ``grader_error`` with a ``task_setup`` finding blaming the task; an action past
  its time limit is a finding and the episode is graded as it stands; every
  episode finding is copied into the verdict and any blocking one makes it
  ``failed`` with score 0.
* **gui-only track**: code other than pyautogui input calls and ``time.sleep``
  with literal arguments is refused before it reaches the desktop (so the graded
  file cannot be written by code); each refusal is a finding and in the log.
* **FAIL is the last action or it is nothing**: it scores 1 only on an
  infeasible task and only as the last action; actions after it are refused with
  a finding and the episode does not count as having answered FAIL; on a feasible
  task FAIL scores 0 (OSWorld's rule). The audit runs a FAIL-only and a
  do-nothing episode per task, so a task that a lazy agent passes is flagged.
* **Honest loading**: a check that needs a fact of the live desktop the episode
  does not give the probe (the process list, installed packages, the display,
  paths outside the home such as ``/`` or ``/tmp``) makes the task unsupported
  with the reason, rather than answered by the probe's own empty world.

Not covered:

* The ``accessibility_tree`` getter reads the live desktop (after the freeze,
  with the setup's applications alone thawed), through the controller; on the
  ``code`` track the agent could have changed what those applications report.
  Findings say so when a task uses it.
* The setup's applications run again during live postconfig steps: on the
  ``code`` track the agent may have taken one over (ptrace: this host has no
  Yama, so any dumpable process of the uid can be traced; the controller is
  non-dumpable) or configured it (a LibreOffice macro on save).
* A mid-episode ``submit`` stops every process while it copies the home, but an
  io_uring write the agent queued before may still land during the copy (the
  end of an episode is safe: the jail is killed before the copy).
* What a check executes is still the agent's world: a ``bash ~/eval.sh`` whose
  script the agent wrote (and no postconfig replaces) answers what the agent
  likes. The probe keeps it from the gold and the grader, not from its own home;
  a task should check files or run a checker that postconfig downloads.
* The recorded process list is not yet read by any check (``ps`` checks are
  unsupported); installed packages are not recorded.
* Observations (screenshots, trees) come from inside the desktop and are the
  agent's own view; nothing is graded from them.
* A GUI-driven terminal is a GUI: on the ``gui-only`` track an agent can still
  type a shell command into xterm. The track limits action *code*, not what the
  applications on the desktop can do.
* Side channels between concurrent episodes on one machine (CPU, memory
  pressure) and kernel exploits against the namespaces (no seccomp filter).
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
from agentinfra.environments.desktop._evaluate import CHROME_GETTERS
from agentinfra.environments.desktop._probe import ProbeCommand, ProbeOutput, run_probe, safe_child
from agentinfra.environments.desktop._task import (
    DesktopTask,
    app_config_path,
    chmod_mode,
    getter_files,
    home_path,
    mirror_file,
    mirror_hint,
    setup_checkers,
    snapshot_chmods,
)
from agentinfra.errors import TaskEnvironmentError, UidExhaustedError
from agentinfra.sandbox import (
    JailLimits,
    JailSpec,
    kill_uid,
    python_runtime_paths,
    reserve_uid,
    system_library_paths,
)

__all__ = [
    "GRADER_DISTRIBUTIONS",
    "GRADER_VERSION",
    "DesktopVerdict",
    "apply_snapshot_downloads",
    "grade_episode",
]

GRADER_VERSION = "desktop-2"
VERDICT_SCHEMA_VERSION = 1
GRADER_DISTRIBUTIONS = (
    "openpyxl",
    "python-docx",
    "python-pptx",
    "rapidfuzz",
    "pypdf",
    "lxml",
    "pillow",
    "numpy",
)
"""What the grading jail imports (and their declared dependencies)."""
_EVALUATE = Path(__file__).resolve().parent / "_evaluate.py"
_GRADING_TIMEOUT_S = 120
HOME_PREFIX = "/home/user/"


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


def _getter(spec: dict[str, Any] | None, expected_dir: Path, mirror: Path | None, a11y: str | None,
            probes: list[ProbeCommand], task: DesktopTask) -> dict[str, Any] | None:  # fmt: skip
    """A getter spec resolved to what the grading jail reads: a file or a value. A command is added
    to ``probes`` and stands as ``{"kind": "probe", "index"}`` until its output is known."""
    if spec is None:
        return None
    kind, task_id = spec["type"], task.id
    if kind == "vm_file":
        files, single = getter_files(spec)
        paths = [path for path, _ in files]
        return {"kind": "file", "path": paths[0] if single else paths}
    if kind in ("gimp_config_file", "vlc_config"):  # OSWorld's fixed places in the home
        return {"kind": "file", "path": app_config_path(spec)}
    if kind in CHROME_GETTERS:  # read from the profile's files in the jail
        return {"kind": "chrome", "getter": kind}
    if kind == "cloud_file":
        # All the getter's files in a folder of their own, by their dest names, as OSWorld's
        # cache holds them: a metric may read one beside the one it is given (sheet_print's CSV).
        folder = expected_dir / str(len(list(expected_dir.iterdir())))
        folder.mkdir()
        given, single = getter_files(spec)
        inside: dict[tuple[str, str | None], str] = {}
        for url, dest in getter_files(spec, every=True)[0]:
            source = mirror_file(mirror, url, task_id=task_id, dest=dest, cloud=True)
            if source is None:
                hint = mirror_hint(mirror, url, task_id=task_id, dest=dest, cloud=True)
                raise TaskEnvironmentError(f"expected file {hint}")
            name = Path(str(dest)).name if dest else source.name
            shutil.copyfile(source, folder / name)
            (folder / name).chmod(0o444)
            inside[(url, dest)] = f"/expected/{folder.name}/{name}"
        folder.chmod(0o555)
        paths = [inside[pair] for pair in given]
        return {"kind": "file", "path": paths[0] if single else paths}
    if kind == "rule":
        return {"kind": "value", "value": spec.get("rules")}
    if kind == "rule_relativeTime":
        return {"kind": "value", "value": _relative_time(spec.get("rules") or {})}
    if kind == "vm_command_line":
        index = len(probes)
        probes.append(ProbeCommand(spec["command"], bool(spec.get("shell"))))
        return {"kind": "probe", "index": index}
    if kind == "cache_file":  # a postconfig step's stdout, as OSWorld writes it to its cache
        name = str(spec.get("path"))
        steps = task.output_steps()
        if name not in steps:
            raise TaskEnvironmentError(
                f"cache_file reads {name!r}, which no postconfig step writes"
            )
        params = steps[name][1].get("parameters") or {}
        index = len(probes)
        probes.append(ProbeCommand(params["command"], bool(params.get("shell"))))
        return {"kind": "probe", "index": index, "file": name}
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


def _probed(value: dict[str, Any] | None, outputs: list[ProbeOutput],
            expected_dir: Path) -> dict[str, Any] | None:  # fmt: skip
    """A probe placeholder replaced by its command's output (None when it was cut short); for
    ``cache_file``, a file of it, in a folder of its own beside the expected files (the agent's
    output, so no getter of an expected file reads that folder)."""
    if value is None or value["kind"] != "probe":
        return value
    output = outputs[value["index"]]
    if "file" not in value or output.error:
        return {"kind": "value", "value": None if output.error else output.stdout}
    folder = expected_dir / f"output-{value['index']}"
    folder.mkdir()
    (folder / value["file"]).write_text(output.stdout, encoding="utf-8")
    (folder / value["file"]).chmod(0o444)
    folder.chmod(0o555)
    return {"kind": "file", "path": f"/expected/{folder.name}/{value['file']}"}


def _run_checks(task: DesktopTask, episode: EpisodeResult, mirror: Path | None,
                modes: dict[str, int]) -> tuple[dict[str, Any], list[ProbeOutput]]:  # fmt: skip
    assert episode.snapshot is not None
    workspace = Path(tempfile.mkdtemp(prefix="agentinfra-grading-"))
    expected_dir = workspace / "expected"
    expected_dir.mkdir()
    try:
        probes: list[ProbeCommand] = []
        a11y = episode.accessibility_xml
        results = [_getter(s, expected_dir, mirror, a11y, probes, task)
                   for s in task.specs("result")]  # fmt: skip
        expected = [_getter(s, expected_dir, mirror, a11y, probes, task)
                    for s in task.specs("expected")]  # fmt: skip
        outputs = run_probe(probes, episode.snapshot, modes=modes, facts=episode.facts)
        request = {
            "funcs": task.funcs,
            "results": [_probed(r, outputs, expected_dir) for r in results],
            "expected": [_probed(e, outputs, expected_dir) for e in expected],
            "options": [s or {} for s in task.specs("options")],
        }
        os.chmod(workspace, 0o711)
        os.chmod(expected_dir, 0o555)
        return _grading_jail(task, episode.snapshot, expected_dir, request), outputs
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _grading_jail(task: DesktopTask, snapshot: Path, expected_dir: Path,
                  request: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Runs the metrics on ``request`` in the grading jail: files and values in, scores out."""
    try:
        uid, lock = reserve_uid()
    except UidExhaustedError as exc:
        raise TaskEnvironmentError(f"{exc}; grade fewer episodes at once") from exc
    try:
        for directory, folders, files in os.walk(snapshot):
            for name in [*folders, *files]:  # the grading uid reads with the snapshot's bits
                os.lchown(os.path.join(directory, name), uid, uid)
        os.lchown(snapshot, uid, uid)
        spec = JailSpec(
            argv=(sys.executable, "-I", "/tmp/work/evaluate.py"),
            env={"PATH": "/nonexistent", "HOME": "/tmp/work", "LANG": "C.UTF-8",
                 "PYTHONDONTWRITEBYTECODE": "1"},
            uid=uid,
            ro_paths=python_runtime_paths(GRADER_DISTRIBUTIONS) + system_library_paths(),
            binds=((str(snapshot), "/home/user"), (str(expected_dir), "/expected")),
            copy_in=((str(_EVALUATE), "evaluate.py"),),
            limits=JailLimits(
                memory_limit_bytes=4 << 30, max_processes=64, cpu_limit_s=_GRADING_TIMEOUT_S
            ),
        )  # fmt: skip
        try:
            done = subprocess.run(spec.command("namespaces+uid"), input=json.dumps(request).encode(),
                                  capture_output=True, timeout=_GRADING_TIMEOUT_S, check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise TaskEnvironmentError(f"grading checks ran past {_GRADING_TIMEOUT_S} s") from exc
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
    return dict(reply)


def apply_snapshot_downloads(task: DesktopTask, snapshot: Path, mirror: Path | None,
                             modes: dict[str, int]) -> list[Finding]:  # fmt: skip
    """Writes the mirror's file for every postconfig ``download`` into ``snapshot`` (the grader's copy).

    Downloads never run on the live home (the agent could replace what they bring
    before a check runs it); here, after the freeze, the mirror's bytes win over
    whatever the agent left at that path. No link is followed: a path whose
    component is a link, or that leaves ``/home/user``, is refused. ``modes`` (the
    manifest's permission bits, for the probe) records the written files as 0o644
    and their folders as at least 0o700, then what a ``chmod`` step of those files
    sets (`snapshot_chmods`); a relative path is under the home. A shell checker the
    setup downloaded and a check runs is written again first (`setup_checkers`).
    Returns one ``postconfig_failed`` block finding per refused or failed step (none
    when all applied).
    """
    findings: list[Finding] = []
    for url, path, mode in setup_checkers(task):  # the setup's checker, as the mirror holds it
        try:
            _download_into(snapshot, url, path, mirror, modes, task.id)
        except (TaskEnvironmentError, OSError) as exc:
            findings.append(Finding(
                check="postconfig_failed", severity="block",
                message=f"the setup's checker {path}, written again over the agent's copy: {exc}"[:1000],
            ))  # fmt: skip
            continue
        if mode is not None:
            _chmod_recorded(modes, mode, home_path(path))
    chmods = snapshot_chmods(task)
    for index, step in enumerate(task.postconfig):
        if (
            index in chmods
        ):  # OSWorld's ``chmod +x eval.sh``: the recorded mode of what was downloaded
            mode, paths = chmods[index]
            for path in paths:
                _chmod_recorded(modes, mode, path)
            continue
        if step.get("type") != "download":
            continue
        for item in (step.get("parameters") or {}).get("files") or []:
            url, path = str(item.get("url", "")), str(item.get("path", ""))
            try:
                _download_into(snapshot, url, path, mirror, modes, task.id)
            except (TaskEnvironmentError, OSError) as exc:
                findings.append(Finding(
                    check="postconfig_failed", severity="block",
                    message=f"postconfig step {index} (download) to {path}: {exc}"[:1000],
                ))  # fmt: skip
    return findings


def _chmod_recorded(modes: dict[str, int], mode: str, path: str) -> None:
    """``chmod MODE`` of the home path ``path`` applied to the snapshot's recorded modes (a file
    written there: a download that failed has no mode to change)."""
    relative = path[len(HOME_PREFIX) :]
    changed = chmod_mode(mode, modes[relative]) if relative in modes else None
    if changed is not None:
        modes[relative] = changed


def _download_into(snapshot: Path, url: str, path: str, mirror: Path | None,
                   modes: dict[str, int], task_id: str) -> None:  # fmt: skip
    source = mirror_file(mirror, url, task_id=task_id, dest=path)
    if source is None:
        raise TaskEnvironmentError(mirror_hint(mirror, url, task_id=task_id, dest=path))
    path = home_path(path)
    if not path.startswith(HOME_PREFIX):
        raise TaskEnvironmentError(f"{path} is outside {HOME_PREFIX}, the only place snapshotted")
    relative = path[len(HOME_PREFIX) :]
    target = safe_child(snapshot, relative)
    parents = Path(relative).parents
    for parent in reversed(list(parents)[:-1]):  # the folders on the way, outermost first
        folder = snapshot / parent
        if not folder.exists():
            folder.mkdir(mode=0o755)
            modes[str(parent)] = 0o755
        elif not folder.is_dir():
            raise TaskEnvironmentError(f"{HOME_PREFIX}{parent} is not a folder")
        else:
            modes[str(parent)] = int(modes.get(str(parent), 0o755)) | 0o700
    if target.is_dir():
        raise TaskEnvironmentError(f"{path} is a folder")
    if target.exists():
        target.unlink()  # a new file: never written through another name (a hard link) for the old one
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with (
        open(os.open(target, flags, 0o644), "wb") as handle,
        source.open("rb") as reading,
    ):
        shutil.copyfileobj(reading, handle)
        os.fchmod(handle.fileno(), 0o644)
    modes[relative] = 0o644


def _combine(task: DesktopTask, scores: list[float]) -> float:
    """The checks' scores as OSWorld combines them: ``or`` the best; ``and`` 0 when any check
    scores 0, else their mean (a task half done by doing nothing is not half rewarded)."""
    if task.evaluator.get("conj", "and") == "or":
        return max(scores)
    if any(score == 0.0 for score in scores):
        return 0.0
    return sum(scores) / len(scores)


def grade_episode(task: DesktopTask, episode: EpisodeResult, mirror: Path | None, *,
                  provenance: dict[str, Any] | None = None) -> DesktopVerdict:  # fmt: skip
    """Scores ``episode`` by ``task``'s evaluator, OSWorld's way, on the frozen snapshot.

    Always one verdict: the episode's own findings are copied in, and any of
    severity "block" (a failed postconfig step, a snapshot over budget or too
    deep) makes it ``failed`` with score 0 without running the checks; a failed
    task setup is ``grader_error`` blaming the task.
    """
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
    verdict.findings.extend(episode.findings)
    if episode.setup_error:
        verdict.outcome = Outcome.GRADER_ERROR
        verdict.findings.append(Finding(
            check="task_setup", severity="block",
            message=f"the task's setup failed, so the task (not the agent) is at fault: {episode.setup_error}"[:2000],
        ))  # fmt: skip
        return verdict
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
    elif not _blocked(verdict) and _score_checks(task, episode, mirror, verdict) is None:
        return verdict  # the grader failed: grader_error, said in a finding
    if _blocked(verdict):
        verdict.score = 0.0
    verdict.outcome = Outcome.PASSED if verdict.score >= 1.0 else Outcome.FAILED
    verdict.details["last_action"] = episode.last_action
    verdict.details["setup_s"] = round(episode.setup_s, 3)
    return verdict


def _blocked(verdict: DesktopVerdict) -> bool:
    return any(f.severity == "block" for f in verdict.findings)


def _score_checks(task: DesktopTask, episode: EpisodeResult, mirror: Path | None,
                  verdict: DesktopVerdict) -> float | None:  # fmt: skip
    """Applies the postconfig downloads, runs the probe and the metrics, and sets the score.

    None (and the verdict made ``grader_error``) when the grader itself failed.
    """
    assert episode.snapshot is not None
    modes = {str(k): int(v) for k, v in (episode.snapshot_manifest.get("modes") or {}).items()}
    verdict.findings.extend(apply_snapshot_downloads(task, episode.snapshot, mirror, modes))
    if _blocked(verdict):
        return 0.0
    try:
        reply, outputs = _run_checks(task, episode, mirror, modes)
    except TaskEnvironmentError as exc:
        verdict.outcome = Outcome.GRADER_ERROR
        verdict.findings.append(Finding(check="grader", severity="block", message=str(exc)[:2000]))
        return None
    for output in outputs:
        if output.error:
            verdict.findings.append(Finding(check="probe", severity="warn",
                                            message=f"a check's command {output.error}; it counts as no output"))  # fmt: skip
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
    return verdict.score
