"""`RunHarness`: submissions arrive, are journalled, queued and graded while the agent works.

Steps: `recover` (replay the journal: re-enqueue what was received but not graded,
adopt verdicts written just before a crash), `submit` (store content-addressed,
journal, enqueue; `submit_async` from the event loop), the grading workers (a bounded pool), `ingest_inbox` (files
dropped by ``agentinfra submit`` or a watched directory), `serve` (all of it until
the budget ends or a finish marker arrives, then drain), `grade_again` (regrade and
re-measure: the same pool, executor and failure rule, the verdicts for the caller to file).

Journal writes and evaluation files from the event loop (agents' submissions, the
workers' ``grading_started`` and ``graded``, machine samples) are fsync'd in the
journal's bounded executor, never on the loop that all agents share.

The failure rule: an evaluation that raises (anything but the harness's own
`HarnessError`) is that submission's ``grader_error`` verdict; the run goes on.

Idempotent by content hash and grader version: a submission is graded at most
once per grader version; one killed mid-grading is graded again on resume (its
first grading never produced a verdict), so each ends with exactly one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentinfra.environments import Environment, Evaluation, Outcome, Submission
from agentinfra.errors import HarnessError
from agentinfra.harness._executors import EvaluationRequest, Executor, LocalExecutor
from agentinfra.harness._progress import ProgressTracker
from agentinfra.harness._rundir import RunDirectory
from agentinfra.harness._walltime import MachineSampler

__all__ = ["Receipt", "RunHarness", "RunState", "graded_score"]

MACHINE_SAMPLE_S = 5.0
"""How often a serving run journals the machine's activity (``machine_sample``). The device is an
environment's ``device`` attribute where it has one (NVML for cuda), else the CPU."""

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def graded_score(data: dict[str, Any]) -> float | None:
    """The score of a ``graded`` journal event (``speedup`` in journals written before the seam)."""
    value = data.get("score", data.get("speedup"))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Receipt:
    """What `RunHarness.submit` did with a submission."""

    sha256: str
    is_new: bool
    seq: int


@dataclass
class RunState:
    """State rebuilt from the journal."""

    received: dict[str, dict[str, Any]] = field(default_factory=dict)
    graded: dict[str, dict[str, Any]] = field(default_factory=dict)
    created_wall_s: float = 0.0
    finished: bool = False

    @classmethod
    def from_run(cls, run: RunDirectory, grader_version: str) -> RunState:
        state = cls(created_wall_s=run.info.created_at)
        for event in run.journal.events:
            sha = event.data.get("sha256")
            if event.type == "submission_received" and isinstance(sha, str):
                state.received.setdefault(sha, dict(event.data))
            elif event.type == "graded" and event.data.get("grader_version") == grader_version:
                state.graded[str(sha)] = dict(event.data)
            elif event.type == "run_finished":
                state.finished = True
        return state


class RunHarness:
    """Grades a run's submissions as they arrive, in a bounded pool."""

    def __init__(self, run: RunDirectory, environment: Environment, *, eval_workers: int = 2,
                 on_graded: Callable[[str, dict[str, Any]], None] | None = None,
                 executor: Executor | None = None) -> None:  # fmt: skip
        if eval_workers < 1:
            raise HarnessError(f"eval_workers={eval_workers} must be >= 1 (--eval-workers)")
        if environment.name != run.spec.environment:
            raise HarnessError(
                f"run {run.path} is a {run.spec.environment!r} run; it cannot be graded by {environment.name!r}"
            )
        self.run = run
        self.environment = environment
        self.executor = executor or LocalExecutor(environment)
        self.eval_workers = eval_workers
        self.state = RunState.from_run(run, environment.grader_version)
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.in_flight: set[str] = set()
        self.on_graded = on_graded
        self.progress: ProgressTracker | None = None
        """Told when each grading starts and ends (replay-run's progress line)."""
        self._queued: set[str] = set()
        self._store_lock = threading.Lock()

    # -- time ----------------------------------------------------------------------

    def run_time_s(self) -> float:
        """Seconds since the run was created (wall clock)."""
        return time.time() - self.state.created_wall_s

    def budget_left_s(self) -> float:
        return self.run.spec.budget.wall_hours * 3600 - self.run_time_s()

    # -- steps -----------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Re-enqueues submissions without a verdict; returns their hashes in arrival order."""
        pending: list[str] = []
        version = self.environment.grader_version
        for sha, _ in sorted(self.state.received.items(), key=lambda item: item[1].get("seq", 0)):
            if sha in self.state.graded:
                continue
            verdict = self.run.read_evaluation(sha, version)
            if verdict is not None:
                self._journal_graded(sha, verdict)
                continue
            pending.append(sha)
            self._enqueue(sha)
        if pending:
            self.run.journal.append("run_resumed", {"requeued": pending})
        return pending

    def _enqueue(self, sha: str) -> None:
        if sha not in self._queued:
            self._queued.add(sha)
            self.queue.put_nowait(sha)

    def submit(self, submission: Submission, *, source: str, turn: int | None = None,
               submitted_at_s: float | None = None, note: str = "") -> Receipt:  # fmt: skip
        """Stores, journals (durably) and enqueues one submission."""
        receipt = self._store(submission, source, turn, submitted_at_s, note)
        if receipt.is_new:
            self._enqueue(receipt.sha256)
        return receipt

    async def submit_async(self, submission: Submission, *, source: str, turn: int | None = None,
                           submitted_at_s: float | None = None, note: str = "") -> Receipt:  # fmt: skip
        """`submit` for a caller on the event loop: storing it and the journal's fsync run
        in the journal's bounded executor, so other agents on the loop are not held up."""
        receipt = await self._off_loop(self._store, submission, source, turn, submitted_at_s, note)
        if receipt.is_new:
            self._enqueue(receipt.sha256)
        return receipt

    async def _off_loop(self, function: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(
            self.run.journal.executor, function, *args
        )

    def _store(self, submission: Submission, source: str, turn: int | None,
               submitted_at_s: float | None, note: str) -> Receipt:  # fmt: skip
        """Stores and journals one submission (any thread; one at a time), not yet queued."""
        with self._store_lock:
            at = self.run_time_s() if submitted_at_s is None else submitted_at_s
            stored = self.run.store_submission(
                submission, {"turn": turn, "source": source, "submitted_at_s": at}
            )
            if stored.sha256 in self.state.received:
                event = self.run.journal.append(
                    "duplicate_submission",
                    {"sha256": stored.sha256, "source": source, "turn": turn, "submitted_at_s": at},
                )
                return Receipt(stored.sha256, False, event.seq)
            payload = {
                "sha256": stored.sha256,
                "source": source,
                "turn": turn,
                "submitted_at_s": at,
                "bytes": len(submission.data),
                "name": submission.name,
                "note": note,
            }
            event = self.run.journal.append("submission_received", payload)
            self.state.received[stored.sha256] = {**payload, "seq": event.seq}
            return Receipt(stored.sha256, True, event.seq)

    async def evaluate(self, sha: str) -> Evaluation:
        """One evaluation of stored submission ``sha`` through the executor, under the failure rule.

        Raises:
            HarnessError: the harness itself failed (a journal or the run directory);
                any other failure is returned as a ``grader_error`` evaluation.
        """
        try:
            # Hidden seeds: fresh from the OS for every grading, never derived from the run's seed.
            request = EvaluationRequest.of(self.environment, self.run.read_submission(sha))
            return await self.executor.evaluate(request)
        except HarnessError:
            raise
        except Exception as exc:  # a grader failure must not stop the run: it is a verdict
            logger.exception("grading %s failed", sha[:12])
            return self._grader_error(exc)

    def _grader_error(self, exc: Exception) -> Evaluation:
        return Evaluation(
            environment=self.environment.name, outcome=Outcome.GRADER_ERROR, correct=False,
            score_unit=self.environment.score.unit, error=f"{type(exc).__name__}: {exc}",
        )  # fmt: skip

    async def _grade_one(self, sha: str) -> None:
        version = self.environment.grader_version
        if sha in self.state.graded:
            return
        self.in_flight.add(sha)
        try:
            await self.run.journal.append_async(
                "grading_started",
                {"sha256": sha, "grader_version": version, "workers": self.eval_workers},
            )
            if self.progress is not None:
                self.progress.begin(sha)
            evaluation = await self.evaluate(sha)
            await self._file(sha, evaluation)
            if self.progress is not None:
                self.progress.finish(sha)
        finally:
            self.in_flight.discard(sha)

    async def _file(self, sha: str, evaluation: Evaluation) -> None:
        """Writes the evaluation and journals ``graded``, both off the event loop, in that order."""
        await self._off_loop(
            self.run.write_evaluation, sha, self.environment.grader_version, evaluation
        )
        data = self._graded_event(sha, evaluation)
        await self.run.journal.append_async("graded", data)
        self._graded(sha, data, evaluation)

    def _journal_graded(self, sha: str, evaluation: Evaluation) -> None:
        data = self._graded_event(sha, evaluation)
        self.run.journal.append("graded", data)
        self._graded(sha, data, evaluation)

    def _graded_event(self, sha: str, evaluation: Evaluation) -> dict[str, Any]:
        return {
            "sha256": sha,
            "grader_version": self.environment.grader_version,
            "outcome": evaluation.outcome.value,
            "correct": evaluation.correct,
            "score": evaluation.score,
            "score_unit": evaluation.score_unit,
        }

    def _graded(self, sha: str, data: dict[str, Any], evaluation: Evaluation) -> None:
        self.state.graded[sha] = data
        if self.on_graded is not None:
            self.on_graded(sha, self.environment.agent_view(evaluation))

    async def _worker(self) -> None:
        while True:
            sha = await self.queue.get()
            try:
                await self._grade_one(sha)
            except HarnessError:
                raise
            except Exception as exc:  # filing the verdict failed: the failure rule still holds
                logger.exception("grading %s failed", sha[:12])
                await self._file(sha, self._grader_error(exc))
            finally:
                self.queue.task_done()

    async def grade_again(
        self, shas: Sequence[str], *, tracker: ProgressTracker | None = None
    ) -> dict[str, Evaluation]:
        """Evaluates ``shas`` once more with the queue's pool of ``eval_workers`` and its failure rule.

        A crashing evaluation is that submission's ``grader_error``; the others are
        evaluated all the same. Nothing is stored or journalled here: the caller
        (regrade, re-measure) files the evaluations, returned by hash.
        """
        pending: asyncio.Queue[str] = asyncio.Queue()
        for sha in shas:
            pending.put_nowait(sha)
        results: dict[str, Evaluation] = {}

        async def worker() -> None:
            while not pending.empty():
                sha = pending.get_nowait()
                if tracker is not None:
                    tracker.begin(sha)
                results[sha] = await self.evaluate(sha)
                if tracker is not None:
                    tracker.finish(sha)

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(min(self.eval_workers, len(shas))):
                    group.create_task(worker())
        except* Exception as failed:  # the harness's own failure, as itself (not in a group)
            raise failed.exceptions[0] from None
        return results

    def ingest_inbox(self) -> bool:
        """Submits every file in the inbox (oldest first); True when a finish marker is there."""
        entries, finish = self.run.layout.inbox_entries()
        for entry in entries:
            submission = Submission(entry.path.read_bytes(), name=entry.name)
            self.submit(submission, source=f"inbox:{entry.name}", turn=entry.turn)
            entry.path.unlink()
        return finish

    async def serve(self, *, watch: Path | None = None, poll_s: float = 0.2, stop: asyncio.Event | None = None,
                    tick: Callable[[], None] | None = None) -> None:  # fmt: skip
        """Grades until the budget ends, a finish marker arrives or ``stop`` is set; then drains."""
        seen_in_watch: set[str] = set()
        workers = [asyncio.create_task(self._worker()) for _ in range(self.eval_workers)]
        sampler = asyncio.create_task(self._sample_machine())
        try:
            while True:
                finish = self.ingest_inbox()
                if watch is not None and watch.is_dir():
                    for path in sorted(watch.iterdir()):
                        if (
                            path.is_file()
                            and path.name not in seen_in_watch
                            and not path.name.startswith(".")
                        ):
                            seen_in_watch.add(path.name)
                            self.submit(
                                Submission(path.read_bytes(), name=path.name),
                                source=f"watch:{path.name}",
                            )
                if tick is not None:
                    tick()
                if finish or (stop is not None and stop.is_set()) or self.budget_left_s() <= 0:
                    break
                for task in workers:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                await asyncio.sleep(poll_s)
            await self.queue.join()
            reason = (
                "finish_marker"
                if finish
                else "stopped"
                if stop is not None and stop.is_set()
                else "budget"
            )
            self.run.journal.append(
                "run_finished", {"reason": reason, "graded": len(self.state.graded)}
            )
            with contextlib.suppress(FileNotFoundError):
                self.run.layout.finish_marker.unlink()
        finally:
            for task in [*workers, sampler]:
                task.cancel()
            await asyncio.gather(*workers, sampler, return_exceptions=True)

    async def _sample_machine(self) -> None:
        """Journals the machine's activity every ``MACHINE_SAMPLE_S`` while the run serves (`MachineSampler`)."""
        device = str(getattr(self.environment, "device", "") or "cpu")
        sampler = MachineSampler("cuda" if device.startswith("cuda") else "cpu")
        while True:
            await self._off_loop(sampler.journal_to, self.run.journal.append)
            await asyncio.sleep(MACHINE_SAMPLE_S)

    async def drain(self) -> None:
        """Grades everything queued with the worker pool, then returns."""
        workers = [asyncio.create_task(self._worker()) for _ in range(self.eval_workers)]
        try:
            await self.queue.join()
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
