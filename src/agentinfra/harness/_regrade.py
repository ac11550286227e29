"""Grading submissions again: `regrade` (every submission, a new or stricter grader) and
`remeasure_best` (the best-so-far submissions, against the winner's curse).

Both go through the run's grading queue (`RunHarness.grade_again`): its pool of
eval workers, its executor and its failure rule, so an evaluation that crashes is
that submission's ``grader_error`` and the others are graded all the same.
New verdicts are stored beside the old ones (``evaluations/<sha>/<grader>@<label>.json``)
and journalled; nothing is overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentinfra.environments import Environment
from agentinfra.harness._executors import Executor
from agentinfra.harness._metrics import best_so_far
from agentinfra.harness._progress import OnProgress, ProgressTracker
from agentinfra.harness._queue import RunHarness
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
    old_score: float | None
    new_score: float | None

    @property
    def is_changed(self) -> bool:
        return self.old_outcome != self.new_outcome


async def regrade(run: RunDirectory, environment: Environment, *, workers: int = 2,
                  executor: Executor | None = None, on_progress: OnProgress | None = None) -> list[Change]:  # fmt: skip
    """Grades every submission again and stores the new verdicts beside the old."""
    number = 1 + sum(1 for e in run.journal.events if e.type == "regrade_started")
    label = f"regrade-{number}"
    run.journal.append(
        "regrade_started", {"label": label, "grader_version": environment.grader_version}
    )
    received = [e for e in run.journal.events if e.type == "submission_received"]
    shas = [str(e.data["sha256"]) for e in received]
    old = {sha: run.primary_evaluation(sha) for sha in shas}
    tracker = ProgressTracker("regrade", len(shas), on_progress)
    harness = RunHarness(run, environment, eval_workers=workers, executor=executor)
    new = await harness.grade_again(shas, tracker=tracker)
    changes: list[Change] = []
    for seq, sha in enumerate(shas, start=1):
        evaluation = new[sha]
        run.write_evaluation(sha, environment.grader_version, evaluation, label)
        before = old[sha]
        change = Change(
            seq, sha, before.outcome.value if before else None, evaluation.outcome.value,
            before.score if before else None, evaluation.score,
        )  # fmt: skip
        run.journal.append("regraded", {"sha256": sha, "label": label, "old_outcome": change.old_outcome,
                                        "new_outcome": change.new_outcome, "score": change.new_score})  # fmt: skip
        changes.append(change)
    run.journal.append(
        "regrade_finished", {"label": label, "changed": sum(c.is_changed for c in changes)}
    )
    return changes


async def remeasure_best(
    run: RunDirectory, environment: Environment, *, workers: int = 2,
    executor: Executor | None = None, on_progress: OnProgress | None = None,
) -> list[str]:  # fmt: skip
    """Grades every submission that was ever best-so-far (raw or filtered) once more.

    Does nothing for an environment whose score is not re-measured (`ScoreSpec.remeasure_best`).
    """
    if not environment.score.remeasure_best:
        return []
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
    tracker = ProgressTracker("re-measure", len(shas), on_progress)
    harness = RunHarness(run, environment, eval_workers=workers, executor=executor)
    results = await harness.grade_again(shas, tracker=tracker)
    for sha in shas:
        run.write_evaluation(sha, environment.grader_version, results[sha], "remeasure")
        run.journal.append(
            "remeasured",
            {"sha256": sha, "outcome": results[sha].outcome.value, "score": results[sha].score},
        )
    return shas
