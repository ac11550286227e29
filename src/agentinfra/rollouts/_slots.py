"""`GradingSlots`: the cores that gradings of this process may occupy at once, shared by all its rollouts.

A kernels grading pins its worker processes to ``threads`` cores (`KernelSettings.threads`,
AGENTINFRA_GRADER_THREADS; the grader's CPU claims) and times them there; two gradings on
one core, or more gradings than cores, make honest kernels look implausibly slow or busy
(measured: 6 of 16 honest submissions hack-flagged with 8 gradings at once on 2 cores).
So every grading of a rollouts process (`agentinfra rollouts run`'s rollouts, the
service's rollouts and its ``POST /v1/grade``) first takes its cores here, and waits,
first come first served, while they are taken. A grading costs its settings' ``threads``
(1 for an environment whose settings name none), at most the whole pool.

The pool holds, by default, the CPUs this process may run on (`os.sched_getaffinity`) less
one, at least one: the rollouts' own work (the event loop, the agents' tools, HTTP) needs a
core too, and on a timed core it reads as a slow or busy kernel. Measured on 2 cores with
8 rollouts at once (other sessions loading the machine): 8 gradings at once flagged 7 of 32
honest kernels, 2 at once 3 of 64, 1 at once 0 of 32. ``--grading-slots N`` sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator

from pydantic import BaseModel

from agentinfra.errors import ConfigError

__all__ = ["GradingSlots", "grading_cost", "machine_slots"]


def machine_slots() -> int:
    """The default pool: the CPUs this process may run on, less one for its own work; at least 1."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def grading_cost(settings: BaseModel) -> int:
    """Cores one grading under ``settings`` occupies: its ``threads`` where it names them, else 1."""
    threads = getattr(settings, "threads", 1)
    return threads if isinstance(threads, int) and threads >= 1 else 1


class GradingSlots:
    """A first-come-first-served pool of ``slots`` cores for the gradings of one process (one event loop)."""

    def __init__(self, slots: int | None = None) -> None:
        if slots is None:
            slots = machine_slots()
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ConfigError(
                f"--grading-slots {slots!r} must be a whole number >= 1 (cores gradings may use at once)"
            )
        self.slots = slots
        self.free = slots
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """Gradings waiting for cores now."""
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def hold(self, cost: int = 1) -> AsyncIterator[None]:
        """Holds ``cost`` cores (at most the pool) while the body runs; waits in turn for them."""
        cost = min(max(cost, 1), self.slots)
        if self._waiters or self.free < cost:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (cost, future)
            self._waiters.append(entry)
            try:
                await future
            except BaseException:
                if future.done() and not future.cancelled():  # granted as it was cancelled
                    self._release(cost)
                else:
                    with contextlib.suppress(ValueError):  # `_wake` may have dropped it already
                        self._waiters.remove(entry)
                    self._wake()
                raise
        else:
            self.free -= cost
        try:
            yield
        finally:
            self._release(cost)

    def _release(self, cost: int) -> None:
        self.free += cost
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            cost, future = self._waiters.popleft()
            if future.done():
                continue
            self.free -= cost
            future.set_result(None)
