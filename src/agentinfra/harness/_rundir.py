"""The run directory, and its whole layout: every path of a run is named here.

    RUN/run.json                               RunInfo (spec, versions, machine)
    RUN/journal.jsonl                          the journal (`_journal`)
    RUN/lock                                   flock'd by the live run process; holds its pid
    RUN/submissions/<sha256>/submission<.ext>  content-addressed, immutable (.py for kernels)
    RUN/submissions/<sha256>/meta.json         name, media type, file, turn, source, run time of first arrival
    RUN/evaluations/<sha256>/<grader>.json     one evaluation per submission per grader version
    RUN/evaluations/<sha256>/<grader>@<label>.json   regrades and re-measurements, beside it
    RUN/inbox/                                 files dropped by `agentinfra submit` (atomic rename)
    RUN/inbox/FINISH                           asks the live run to drain and stop
    RUN/agent/transcript.jsonl                 the agent's journal (`agentinfra run`)
    RUN/agent/images/<sha256>.png              images of tool results, stored once
    RUN/agent/workspace/                       the agent's private files

`RunLayout` is the paths alone (for processes that do not hold the run, such as
``agentinfra submit``); `RunDirectory` is an open, locked run. Every file is
written to a temporary name and renamed, so a crash never leaves a half-written
file visible. Opening validates ``run.json``; a directory held by a live
process (the lock) is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import agentinfra
from agentinfra._atomic import write_atomic
from agentinfra._pidlock import try_lock
from agentinfra.environments import Evaluation, Submission
from agentinfra.errors import HarnessError
from agentinfra.harness._journal import Journal
from agentinfra.harness._migrations import read_evaluation
from agentinfra.harness._spec import RunInfo, RunSpec

__all__ = [
    "FINISH_MARKER",
    "InboxEntry",
    "RunDirectory",
    "RunLayout",
    "StoredSubmission",
    "atomic_write",
]

_MAX_SUBMISSION_BYTES = 4 << 20
FINISH_MARKER = "FINISH"
_LEGACY_SUBMISSION_FILE = "submission.py"


def atomic_write(path: Path, data: bytes) -> None:
    """`write_atomic`, with a failure reported as a `HarnessError`."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise HarnessError(
            f"cannot write {path}: {exc.strerror}; free disk space and resume the run"
        ) from None


def _versions(environment: str, grader_version: str) -> dict[str, str]:
    try:  # the installed distribution's version: importing torch here took ~1 s of the loop's GIL
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "absent"
    return {
        "agentinfra": agentinfra.__version__,
        "environment": environment,
        "grader": grader_version,
        "torch": torch_version,
        "python": platform.python_version(),
    }


def _machine() -> dict[str, str]:
    return {
        "node": platform.node(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpus": str(os.cpu_count()),
    }


@dataclass(frozen=True, slots=True)
class StoredSubmission:
    """A submission as stored in the run directory."""

    sha256: str
    path: Path
    is_new: bool


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A file dropped into the inbox: its path, the submitter's name for it and the turn."""

    path: Path
    name: str
    turn: int | None


def _suffix(name: str) -> str:
    suffix = Path(name).suffix
    return suffix if suffix and len(suffix) <= 10 and suffix[1:].isalnum() else ""


@dataclass(frozen=True, slots=True)
class RunLayout:
    """Every path of a run directory, and the two writes any process may make: inbox and finish."""

    root: Path

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def finish_marker(self) -> Path:
        return self.inbox / FINISH_MARKER

    @property
    def agent_dir(self) -> Path:
        return self.root / "agent"

    @property
    def transcript(self) -> Path:
        return self.agent_dir / "transcript.jsonl"

    @property
    def workspace(self) -> Path:
        return self.agent_dir / "workspace"

    @property
    def images(self) -> Path:
        return self.agent_dir / "images"

    def submission_dir(self, sha: str) -> Path:
        return self.root / "submissions" / sha

    def evaluation_path(self, sha: str, grader_version: str, label: str = "") -> Path:
        name = f"{grader_version}{'@' + label if label else ''}.json"
        return self.root / "evaluations" / sha / name

    def drop(self, data: bytes, name: str, turn: int | None = None) -> Path:
        """Puts a submission in the inbox (atomic rename): arrival order, turn, original name."""
        target = (
            self.inbox / f"{time.time_ns():020d}__{'' if turn is None else turn}__{Path(name).name}"
        )
        atomic_write(target, data)
        return target

    def request_finish(self) -> None:
        """Asks the live run to grade what it has and stop."""
        atomic_write(self.finish_marker, str(time.time()).encode())

    def inbox_entries(self) -> tuple[list[InboxEntry], bool]:
        """The dropped files, oldest first, and whether a finish marker is there."""
        entries: list[InboxEntry] = []
        finish = False
        for path in sorted(self.inbox.iterdir()) if self.inbox.is_dir() else []:
            if path.name == FINISH_MARKER:
                finish = True
            elif not path.name.startswith(".") and path.is_file():
                parts = path.name.split("__", 2)
                turn: int | None = None
                with contextlib.suppress(ValueError, IndexError):
                    turn = int(parts[1])
                entries.append(InboxEntry(path, parts[-1], turn))
        return entries, finish


class RunDirectory:
    """An open, locked run directory."""

    def __init__(self, path: Path, info: RunInfo, journal: Journal, lock_fd: int) -> None:
        self.path = path
        self.layout = RunLayout(path)
        self.info = info
        self.journal = journal
        self._lock_fd = lock_fd

    @property
    def spec(self) -> RunSpec:
        return self.info.spec

    @classmethod
    def create(cls, path: Path, spec: RunSpec, *, grader_version: str) -> RunDirectory:
        """Creates a new run directory and opens it; ``grader_version`` is the environment's.

        Raises:
            HarnessError: ``path`` exists and is not empty.
        """
        if path.exists() and any(path.iterdir()):
            raise HarnessError(
                f"{path} already exists and is not empty; choose a new run directory or `agentinfra resume {path}`"
            )
        for sub in ("submissions", "evaluations", "inbox"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        versions = _versions(spec.environment, grader_version)
        info = RunInfo(spec=spec, created_at=time.time(), versions=versions, machine=_machine())
        atomic_write(RunLayout(path).run_json, info.model_dump_json(indent=1).encode())
        run = cls.open(path)
        run.journal.append("run_created", {"run_id": spec.run_id, "versions": info.versions})
        return run

    @classmethod
    def open(cls, path: Path) -> RunDirectory:
        """Opens and locks an existing run directory.

        Raises:
            HarnessError: not a run directory, a corrupt or foreign ``run.json``, a
                journal from a newer schema, or another live process holds the run.
        """
        info = cls.read_info(path)
        lock_fd = cls._lock(path)
        try:
            journal = Journal.open(RunLayout(path).journal)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(path, info, journal, lock_fd)

    @staticmethod
    def read_info(path: Path) -> RunInfo:
        """Reads and validates ``run.json`` without locking."""
        target = RunLayout(path).run_json
        if not target.is_file():
            raise HarnessError(f"{path} is not a run directory (no run.json)")
        try:
            data: Any = json.loads(target.read_bytes())
        except (OSError, ValueError):
            raise HarnessError(f"{target} is not valid JSON") from None
        if (
            isinstance(data, dict)
            and isinstance(data.get("schema_version"), int)
            and data["schema_version"] > 1
        ):
            raise HarnessError(
                f"{target} has schema version {data['schema_version']}; this agentinfra reads 1"
            )
        try:
            return RunInfo.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise HarnessError(
                f"{target} is not an agentinfra run.json ({where}: {first['msg']})"
            ) from None

    @staticmethod
    def _lock(path: Path) -> int:
        held = try_lock(RunLayout(path).lock)
        if isinstance(held, str):
            raise HarnessError(
                f"run {path} is held by another live process (pid {held}); stop it or wait for it to finish"
            )
        return held

    def close(self) -> None:
        self.journal.close()
        os.close(self._lock_fd)

    # -- submissions and evaluations --------------------------------------------

    def store_submission(self, submission: Submission, meta: dict[str, Any]) -> StoredSubmission:
        """Stores ``submission`` content-addressed; an existing submission is left untouched."""
        data = submission.data
        if len(data) > _MAX_SUBMISSION_BYTES:
            raise HarnessError(
                f"submission of {len(data)} bytes exceeds the {_MAX_SUBMISSION_BYTES}-byte limit"
            )
        sha = hashlib.sha256(data).hexdigest()
        folder = self.layout.submission_dir(sha)
        existing = self._submission_file(sha, self._submission_meta(sha))
        if existing is not None:
            return StoredSubmission(sha, existing, False)
        target = folder / f"submission{_suffix(submission.name)}"
        folder.mkdir(parents=True, exist_ok=True)
        full = {
            "name": submission.name,
            "media_type": submission.media_type,
            "file": target.name,
            **meta,
        }
        atomic_write(folder / "meta.json", json.dumps(full, sort_keys=True).encode())
        atomic_write(target, data)
        return StoredSubmission(sha, target, True)

    def _submission_file(self, sha: str, meta: dict[str, Any]) -> Path | None:
        path = self.layout.submission_dir(sha) / str(meta.get("file", _LEGACY_SUBMISSION_FILE))
        return path if path.is_file() else None

    def _submission_meta(self, sha: str) -> dict[str, Any]:
        try:
            meta: dict[str, Any] = json.loads(
                (self.layout.submission_dir(sha) / "meta.json").read_bytes()
            )
        except (OSError, ValueError):
            return {}
        return meta

    def read_submission(self, sha: str) -> Submission:
        """The stored submission ``sha``, with the name and media type it arrived with.

        Raises:
            HarnessError: it is not stored, or its bytes no longer match the hash.
        """
        meta = self._submission_meta(sha)
        path = self._submission_file(sha, meta)
        if path is None:
            raise HarnessError(f"run {self.path} has no submission {sha[:12]}")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            raise HarnessError(
                f"{path} no longer matches its hash {sha[:12]}; the run directory was modified"
            )
        return Submission(data, name=str(meta.get("name", path.name)),
                          media_type=str(meta.get("media_type", "text/x-python")), meta=meta)  # fmt: skip

    def submission_text(self, sha: str) -> str:
        """The submission decoded as text (for diffs in reports); empty when it is not stored."""
        path = self._submission_file(sha, self._submission_meta(sha))
        return path.read_text(errors="replace") if path is not None else ""

    def write_evaluation(
        self, sha: str, grader_version: str, evaluation: Evaluation, label: str = ""
    ) -> Path:
        path = self.layout.evaluation_path(sha, grader_version, label)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(evaluation.to_json(), indent=1, sort_keys=True).encode())
        return path

    def read_evaluation(self, sha: str, grader_version: str, label: str = "") -> Evaluation | None:
        """The stored evaluation, or None when there is none or it cannot be read."""
        path = self.layout.evaluation_path(sha, grader_version, label)
        if not path.is_file():
            return None
        try:
            return read_evaluation(json.loads(path.read_bytes()), environment=self.spec.environment)
        except (ValueError, ValidationError):
            return None

    def primary_evaluation(self, sha: str) -> Evaluation | None:
        """The first-pass evaluation of ``sha`` under the grader version that graded it last (the journal says which)."""
        versions = [
            str(e.data.get("grader_version")) for e in self.journal.events
            if e.type == "graded" and e.data.get("sha256") == sha
        ]  # fmt: skip
        for version in reversed(versions):
            evaluation = self.read_evaluation(sha, version)
            if evaluation is not None:
                return evaluation
        return None
