"""Recorded long-horizon runs: replay a recording through the real harness and grader.

A recording is ``recording.json`` beside its submission files::

    {"schema_version": 1, "run_id": "...", "environment": "kernels",
     "task": "<task path, relative to the recording>", "hours": 12,
     "submissions": [{"t_hours": 0.4, "turn": 3, "file": "submissions/01.py", "note": "..."}]}

Replay is time-compressed (submissions carry their recorded run time) and the
grading is real. A recording without ``environment`` is read as one of kernels
(`_migrations`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentinfra.environments import Submission
from agentinfra.errors import HarnessError
from agentinfra.harness import _migrations
from agentinfra.harness._executors import Executor, open_environment
from agentinfra.harness._progress import OnProgress, ProgressTracker
from agentinfra.harness._queue import RunHarness
from agentinfra.harness._rundir import RunDirectory
from agentinfra.harness._spec import Budget, RunSpec

__all__ = ["load_recording", "replay_recording"]


def load_recording(path: Path) -> dict[str, Any]:
    """Reads and checks a recording; ``environment`` is always there (`_migrations`).

    Raises:
        HarnessError: unreadable, another schema version, or a listed file is missing.
    """
    file = path / "recording.json" if path.is_dir() else path
    try:
        data: dict[str, Any] = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise HarnessError(f"cannot read recording {file}: {exc}") from None
    if data.get("schema_version") != 1:
        raise HarnessError(
            f"recording {file} has schema version {data.get('schema_version')!r}; this agentinfra reads 1"
        )
    for item in data.get("submissions", []):
        if not (file.parent / item["file"]).is_file():
            raise HarnessError(f"recording {file} lists {item['file']}, which does not exist")
    data["environment"] = _migrations.recording_environment(data)
    data["_base"] = str(file.parent)
    return data


async def replay_recording(
    recording: Path, out: Path, *, eval_workers: int = 2,
    settings: Mapping[str, Any] | None = None,
    executor: Executor | None = None, on_progress: OnProgress | None = None,
) -> RunDirectory:  # fmt: skip
    """Creates a run at ``out`` and feeds it the recorded submissions; returns the open run.

    ``settings`` are the recording's environment's, as JSON (None: its settings model's defaults).
    """
    data = load_recording(recording)
    base = Path(data["_base"])
    task = (base / data["task"]).resolve()
    spec = RunSpec(
        run_id=str(data.get("run_id", out.name)), environment=str(data["environment"]),
        task=str(task), agent={"recorded": True, "model": data.get("model", "recorded")},
        budget=Budget(wall_hours=float(data.get("hours", 12))), settings=dict(settings or {}),
    )  # fmt: skip
    environment = open_environment(spec)
    run = RunDirectory.create(out, spec, grader_version=environment.grader_version)
    harness = RunHarness(run, environment, eval_workers=eval_workers, executor=executor)
    for item in data["submissions"]:
        file = base / item["file"]
        harness.submit(Submission(file.read_bytes(), name=file.name), source=f"recording:{item['file']}",
                       turn=item.get("turn"), submitted_at_s=float(item["t_hours"]) * 3600,
                       note=str(item.get("note", "")))  # fmt: skip
    harness.progress = ProgressTracker("replay", harness.queue.qsize(), on_progress)
    await harness.drain()
    run.journal.append(
        "run_finished", {"reason": "recording_replayed", "graded": len(harness.state.graded)}
    )
    return run
