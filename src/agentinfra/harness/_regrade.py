"""Grading submissions again: `regrade` (every submission, a new or stricter grader) and
`remeasure_best` (the best-so-far submissions, against the winner's curse).

New verdicts are stored beside the old ones (``evaluations/<sha>/<grader>@<label>.json``)
and journalled; nothing is overwritten.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agentinfra.harness._environment import Environment
from agentinfra.harness._metrics import best_so_far
from agentinfra.harness._report import load_records
from agentinfra.harness._rundir import RunDirectory

__all__ = ["Change", "regrade", "remeasure_best"]


@dataclass(frozen=True, slots=True)
class Change:
    """One submission's verdict before and after a regrade."""

    seq: int
    sha256: str
    old_outcome: str | None
    new_outcome: str
    old_speedup: float | None
    new_speedup: float | None

    @property
    def is_changed(self) -> bool:
        return self.old_outcome != self.new_outcome


def _primary(run: RunDirectory, sha: str) -> dict[str, Any] | None:
    """The newest first-pass verdict of ``sha`` under any grader version."""
    folder = run.path / "evaluations" / sha
    files = [p for p in folder.glob("*.json") if "@" not in p.name] if folder.is_dir() else []
    if not files:
        return None
    newest = max(files, key=lambda p: p.stat().st_mtime)
    return run.read_evaluation(sha, newest.stem)


async def _evaluate_all(
    environment: Environment, run: RunDirectory, shas: list[str], workers: int
) -> dict[str, dict[str, Any]]:
    limit = asyncio.Semaphore(workers)
    results: dict[str, dict[str, Any]] = {}

    async def one(sha: str) -> None:
        async with limit:
            results[sha] = await environment.evaluate(run.submission_path(sha))

    await asyncio.gather(*(one(sha) for sha in shas))
    return results


async def regrade(run: RunDirectory, environment: Environment, *, workers: int = 2) -> list[Change]:
    """Grades every submission again and stores the new verdicts beside the old."""
    number = 1 + sum(1 for e in run.journal.events if e.type == "regrade_started")
    label = f"regrade-{number}"
    run.journal.append(
        "regrade_started", {"label": label, "grader_version": environment.grader_version}
    )
    received = [e for e in run.journal.events if e.type == "submission_received"]
    shas = [str(e.data["sha256"]) for e in received]
    old = {sha: _primary(run, sha) for sha in shas}
    new = await _evaluate_all(environment, run, shas, workers)
    changes: list[Change] = []
    for seq, sha in enumerate(shas, start=1):
        verdict = new[sha]
        run.write_evaluation(sha, environment.grader_version, verdict, label)
        before = old[sha] or {}
        change = Change(
            seq,
            sha,
            before.get("outcome"),
            str(verdict.get("outcome")),
            before.get("speedup"),
            verdict.get("speedup"),
        )
        run.journal.append("regraded", {"sha256": sha, "label": label, "old_outcome": change.old_outcome,
                                        "new_outcome": change.new_outcome, "speedup": change.new_speedup})  # fmt: skip
        changes.append(change)
    run.journal.append(
        "regrade_finished", {"label": label, "changed": sum(c.is_changed for c in changes)}
    )
    return changes


async def remeasure_best(
    run: RunDirectory, environment: Environment, *, workers: int = 2
) -> list[str]:
    """Grades every submission that was ever best-so-far (raw or filtered) once more."""
    records = load_records(run, environment.grader_version)
    shas: list[str] = []
    for filtered in (False, True):
        for point in best_so_far(records, filtered=filtered):
            sha = point["sha256"]
            if (
                sha not in shas
                and run.read_evaluation(sha, environment.grader_version, "remeasure") is None
            ):
                shas.append(sha)
    results = await _evaluate_all(environment, run, shas, workers)
    for sha in shas:
        run.write_evaluation(sha, environment.grader_version, results[sha], "remeasure")
        run.journal.append(
            "remeasured",
            {
                "sha256": sha,
                "outcome": results[sha].get("outcome"),
                "speedup": results[sha].get("speedup"),
            },
        )
    return shas
