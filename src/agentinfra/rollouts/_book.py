"""The service's bookkeeping, sans I/O: which rollouts are queued, running or done, and which gradings exist.

`RolloutBook` admits whole groups or none: a group is admitted only if its G
rollouts fit under ``max_pending`` (queued + running), else the caller answers 429
with the book's `retry_after_s` (an estimate from the rollouts finished so far).
The backlog is therefore bounded by ``max_pending``, never by the callers' patience.

`GradeLedger` makes ``POST /v1/grade`` idempotent: one grading per key (the hash of
environment, task and submission bytes); a second request for a key being graded
waits for the first, a third after it is done gets the stored answer; at most
``max_in_flight`` distinct gradings run at once (the next is refused with 429).

Both are single-owner (the service's event loop), synchronous and unit-tested with
exact assertions.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Admission", "GradeClaim", "GradeLedger", "RolloutBook", "RolloutState"]


class RolloutState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    """Ended with a trajectory (an infra failure or a cancel is labelled in it)."""


@dataclass(frozen=True, slots=True)
class Admission:
    is_accepted: bool
    retry_after_s: int = 0
    """When refused: seconds after which a retry may fit (the 429's ``Retry-After``)."""


@dataclass(slots=True)
class _Entry:
    group_id: str
    state: RolloutState = RolloutState.QUEUED
    label: str | None = None
    """Finished: ``ok``, ``cancelled`` or the infra failure's kind."""
    started_s: float | None = None


@dataclass
class RolloutBook:
    """Rollouts by state, bounded: at most ``max_pending`` queued or running."""

    max_pending: int
    concurrency: int
    entries: dict[str, _Entry] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    _queue: deque[str] = field(default_factory=deque)
    _durations_s: deque[float] = field(default_factory=lambda: deque(maxlen=64))

    def __post_init__(self) -> None:
        if self.max_pending < 1 or self.concurrency < 1:
            raise ValueError(
                f"max_pending={self.max_pending} and concurrency={self.concurrency} must be >= 1"
            )

    @property
    def pending(self) -> int:
        return sum(1 for e in self.entries.values() if e.state is not RolloutState.FINISHED)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def admit(self, group_id: str, rollout_ids: Iterable[str], *, force: bool = False) -> Admission:
        """Adds a group's rollouts to the queue if all fit (``force``: a journalled group on restart)."""
        ids = list(rollout_ids)
        if group_id in self.groups:
            raise ValueError(f"group {group_id} was admitted already")
        if not force and self.pending + len(ids) > self.max_pending:
            return Admission(False, self.retry_after_s(self.pending + len(ids) - self.max_pending))
        self.groups[group_id] = ids
        for rid in ids:
            self.entries[rid] = _Entry(group_id)
            self._queue.append(rid)
        return Admission(True)

    def withdraw(self, group_id: str) -> None:
        """Forgets a group admitted a moment ago whose acceptance could not be made durable."""
        for rid in self.groups.pop(group_id, []):
            self.entries.pop(rid, None)
        self._queue = deque(rid for rid in self._queue if rid in self.entries)

    def retry_after_s(self, overflow: int) -> int:
        """Seconds until about ``overflow`` rollouts have finished, at the pace seen so far (at least 1)."""
        mean_s = sum(self._durations_s) / len(self._durations_s) if self._durations_s else 5.0
        return max(1, math.ceil(mean_s * math.ceil(overflow / self.concurrency)))

    def next_queued(self) -> str | None:
        """The oldest queued rollout (now running), or None."""
        while self._queue:
            rid = self._queue.popleft()
            entry = self.entries[rid]
            if entry.state is RolloutState.QUEUED:
                entry.state = RolloutState.RUNNING
                return rid
        return None

    def started(self, rid: str, now_s: float) -> None:
        self.entries[rid].started_s = now_s

    def finish(self, rid: str, label: str, now_s: float | None = None) -> None:
        """Marks ``rid`` finished with ``label``; a running rollout's duration feeds `retry_after_s`."""
        entry = self.entries[rid]
        if entry.state is RolloutState.FINISHED:
            return
        if entry.started_s is not None and now_s is not None:
            self._durations_s.append(max(0.0, now_s - entry.started_s))
        entry.state = RolloutState.FINISHED
        entry.label = label

    def state_of(self, rid: str) -> RolloutState | None:
        entry = self.entries.get(rid)
        return None if entry is None else entry.state

    def counts(self) -> dict[str, int]:
        """Rollouts by state; finished ones by label (``finished_ok``, ``finished_cancelled`` ...)."""
        counts: dict[str, int] = {"queued": 0, "running": 0}
        for entry in self.entries.values():
            key = entry.state.value
            if entry.state is RolloutState.FINISHED:
                key = f"finished_{entry.label}"
            counts[key] = counts.get(key, 0) + 1
        return counts


@dataclass(frozen=True, slots=True)
class GradeClaim:
    kind: Literal["done", "wait", "new", "full"]
    answer: dict[str, Any] | None = None


@dataclass
class GradeLedger:
    """One grading per key; answers kept (``max_answers`` most recent) for the repeats."""

    max_in_flight: int
    max_answers: int = 10_000
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    gradings: int = 0
    """How many gradings were started (repeats excluded)."""

    def claim(self, key: str) -> GradeClaim:
        """``done`` (with the answer), ``wait`` (another request grades it), ``new`` (grade it), ``full`` (429)."""
        if key in self.answers:
            return GradeClaim("done", self.answers[key])
        if key in self.in_flight:
            return GradeClaim("wait")
        if len(self.in_flight) >= self.max_in_flight:
            return GradeClaim("full")
        self.in_flight.add(key)
        self.gradings += 1
        return GradeClaim("new")

    def settle(self, key: str, answer: dict[str, Any] | None) -> None:
        """The grading of ``key`` ended: its answer is kept (None: it failed, a repeat grades again)."""
        self.in_flight.discard(key)
        if answer is None:
            return
        self.answers[key] = answer
        while len(self.answers) > self.max_answers:
            self.answers.pop(next(iter(self.answers)))
