"""Everything the grader keeps across gradings of one process, in one place.

- `TRUSTED`: caches filled only from the reference worker (the problem's own code,
  never a submission), for as long as the process lives: the machine's peaks per
  device and thread count, and per problem hash the reference's self-check, one
  call's time and its memory peaks. A candidate cannot write to them; a changed problem has another hash.
- CPU claims (`claim_cpus`, `release_cpus`): which cores live gradings are pinned to.
- The garbage-collector pause (`gc_paused`) shared by concurrent timing loops.
- Worker uids (`reserve_worker_uid`), reserved machine-wide by `agentinfra.sandbox`.

Each structure is guarded by its own lock: gradings run concurrently on threads
(`grade_async`, ``--eval-workers``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from agentinfra.errors import TaskEnvironmentError, UidExhaustedError
from agentinfra.sandbox import reserve_uid

__all__ = [
    "TRUSTED",
    "TrustedCaches",
    "claim_cpus",
    "gc_paused",
    "release_cpus",
    "reserve_worker_uid",
]


@dataclass(slots=True)
class TrustedCaches:
    """Measurements of the reference worker, reused by later gradings of this process."""

    peaks: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    """(device, threads) -> the machine's peak FLOP/s and bytes/s."""
    self_check: dict[tuple[str, str], str | None] = field(default_factory=dict)
    """(problem sha256, device) -> None for a reference that agrees with itself, else the random
    modules' names (graded in eval mode): the self-check runs once per problem per process."""
    call_s: dict[tuple[str, str, int], float] = field(default_factory=dict)
    """(problem sha256, device, threads) -> one reference call's seconds, from its self-check."""
    memory: dict[tuple[str, str, int], tuple[int | None, int | None]] = field(default_factory=dict)
    """(problem sha256, device, threads) -> the reference's peak address space and resident memory
    after its self-check (`_sizing.memory_plan`), the largest measured in this process."""


TRUSTED = TrustedCaches()

_CPU_USERS: dict[int, int] = {}
"""CPU -> gradings of this process pinned to it now."""
_CPU_LOCK = threading.Lock()


def claim_cpus(threads: int) -> tuple[int, ...]:
    """The ``threads`` CPUs with the fewest live gradings of this process (lowest numbers first).

    Concurrent gradings (``--eval-workers``) get different cores where the machine has
    them, so one grading's timed batches never share a core with another's work;
    one grading at a time still runs on the first CPUs, as before.
    """
    with _CPU_LOCK:
        allowed = sorted(os.sched_getaffinity(0))
        chosen = tuple(
            sorted(sorted(allowed, key=lambda cpu: (_CPU_USERS.get(cpu, 0), cpu))[:threads])
        )
        for cpu in chosen:
            _CPU_USERS[cpu] = _CPU_USERS.get(cpu, 0) + 1
    return chosen


def release_cpus(cpus: tuple[int, ...]) -> None:
    """Gives back what `claim_cpus` returned."""
    with _CPU_LOCK:
        for cpu in cpus:
            _CPU_USERS[cpu] -= 1


@dataclass(slots=True)
class _GcPause:
    pauses: int = 0
    """Gradings of this process inside their timing loop now."""
    was_enabled: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)


_GC = _GcPause()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while any grading of this process times batches.

    The supervisor's clock times each batch, and the audits between pairs allocate enough
    objects to start a collection, which then ran inside the next timed batch: up to about
    6 ms on a 13 ms batch (02_softmax), always on whichever side went first after an audit.
    Collection resumes when the last timing loop ends (as it was, if it was off before).
    """
    with _GC.lock:
        if _GC.pauses == 0:
            _GC.was_enabled = gc.isenabled()
            gc.disable()
        _GC.pauses += 1
    try:
        yield
    finally:
        with _GC.lock:
            _GC.pauses -= 1
            if _GC.pauses == 0 and _GC.was_enabled:
                gc.enable()


def reserve_worker_uid() -> tuple[int, int]:
    """A worker uid reserved for a grading's life, and the descriptor holding the reservation
    (`agentinfra.sandbox.reserve_uid`): close it after the uid's processes are gone."""
    try:
        return reserve_uid()
    except UidExhaustedError as exc:
        raise TaskEnvironmentError(f"{exc}; lower --eval-workers") from exc
