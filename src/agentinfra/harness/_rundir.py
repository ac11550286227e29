"""The run directory: ``run.json``, ``journal.jsonl``, ``submissions/``, ``evaluations/``, ``inbox/``.

    RUN/run.json                               RunInfo (spec, versions, machine)
    RUN/journal.jsonl                          the journal (`_journal`)
    RUN/lock                                   flock'd by the live run process; holds its pid
    RUN/submissions/<sha256>/submission.py     content-addressed, immutable
    RUN/submissions/<sha256>/meta.json         turn, source, run time of first arrival
    RUN/evaluations/<sha256>/<grader>.json     one verdict per submission per grader version
    RUN/evaluations/<sha256>/<grader>@<label>.json   regrades and re-measurements, beside it
    RUN/inbox/                                 files dropped by `agentinfra submit` (atomic rename)

Every file is written to a temporary name and renamed, so a crash never leaves a
half-written file visible. Opening validates ``run.json``; a directory held by a
live process (the lock) is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import agentinfra
from agentinfra._pidlock import try_lock
from agentinfra.errors import HarnessError
from agentinfra.harness._journal import Journal
from agentinfra.harness._spec import RunInfo, RunSpec

__all__ = ["RunDirectory", "StoredSubmission", "atomic_write"]

_MAX_SUBMISSION_BYTES = 4 << 20


def atomic_write(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` via a temporary file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise HarnessError(
            f"cannot write {path}: {exc.strerror}; free disk space and resume the run"
        ) from None


def _versions() -> dict[str, str]:
    from agentinfra.environments.kernels import GRADER_VERSION

    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "absent"
    return {
        "agentinfra": agentinfra.__version__,
        "grader": GRADER_VERSION,
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


class RunDirectory:
    """An open, locked run directory."""

    def __init__(self, path: Path, info: RunInfo, journal: Journal, lock_fd: int) -> None:
        self.path = path
        self.info = info
        self.journal = journal
        self._lock_fd = lock_fd

    @property
    def spec(self) -> RunSpec:
        return self.info.spec

    @classmethod
    def create(cls, path: Path, spec: RunSpec) -> RunDirectory:
        """Creates a new run directory and opens it.

        Raises:
            HarnessError: ``path`` exists and is not empty.
        """
        if path.exists() and any(path.iterdir()):
            raise HarnessError(
                f"{path} already exists and is not empty; choose a new run directory or `agentinfra resume {path}`"
            )
        for sub in ("submissions", "evaluations", "inbox"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        info = RunInfo(spec=spec, created_at=time.time(), versions=_versions(), machine=_machine())
        atomic_write(path / "run.json", info.model_dump_json(indent=1).encode())
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
            journal = Journal.open(path / "journal.jsonl")
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(path, info, journal, lock_fd)

    @staticmethod
    def read_info(path: Path) -> RunInfo:
        """Reads and validates ``run.json`` without locking."""
        target = path / "run.json"
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
        held = try_lock(path / "lock")
        if isinstance(held, str):
            raise HarnessError(
                f"run {path} is held by another live process (pid {held}); stop it or wait for it to finish"
            )
        return held

    def close(self) -> None:
        self.journal.close()
        os.close(self._lock_fd)

    # -- submissions and evaluations --------------------------------------------

    def store_submission(self, data: bytes, meta: dict[str, Any]) -> StoredSubmission:
        """Stores ``data`` content-addressed; an existing submission is left untouched."""
        if len(data) > _MAX_SUBMISSION_BYTES:
            raise HarnessError(
                f"submission of {len(data)} bytes exceeds the {_MAX_SUBMISSION_BYTES}-byte limit"
            )
        sha = hashlib.sha256(data).hexdigest()
        folder = self.path / "submissions" / sha
        target = folder / "submission.py"
        if target.exists():
            return StoredSubmission(sha, target, False)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / "meta.json", json.dumps(meta, sort_keys=True).encode())
        atomic_write(target, data)
        return StoredSubmission(sha, target, True)

    def submission_path(self, sha: str) -> Path:
        return self.path / "submissions" / sha / "submission.py"

    def evaluation_path(self, sha: str, grader_version: str, label: str = "") -> Path:
        return (
            self.path / "evaluations" / sha / f"{grader_version}{'@' + label if label else ''}.json"
        )

    def write_evaluation(
        self, sha: str, grader_version: str, verdict: dict[str, Any], label: str = ""
    ) -> Path:
        path = self.evaluation_path(sha, grader_version, label)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(verdict, indent=1, sort_keys=True).encode())
        return path

    def read_evaluation(
        self, sha: str, grader_version: str, label: str = ""
    ) -> dict[str, Any] | None:
        path = self.evaluation_path(sha, grader_version, label)
        if not path.is_file():
            return None
        try:
            data: dict[str, Any] = json.loads(path.read_bytes())
        except ValueError:
            return None
        return data
